"""The verdict: does a storage profile improve the whole training run, and is it worth it?

Modules, in the order the data flows:
``cli`` (arguments) → ``config`` (what to do, validated) → ``command`` (does it):
``sources`` (offline run dirs, summary JSONs, the Polyaxon API) give ``records`` (the plain
data model) → ``grouping`` (runs per profile) → ``comparability`` (may they be compared?) →
``figures`` (a training run's figures) → ``comparison`` (its whole run against the
baseline's, noise-aware) → ``cost`` (pricing file and costs) → ``verdict`` (the one engine:
one verdict for every workload, driven by its row of ``table``) → the reports, one renderer
each for every workload: ``report_tables`` (sections shared by the renderers),
``report_text`` (terminal), ``report_markdown``, ``report_json``, ``report_html``
(self-contained, with plots). ``errors`` holds the errors
and the one table of exit codes.
"""
