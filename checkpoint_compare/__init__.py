"""The verdict: does a storage profile improve the whole training run, and is it worth it?

Modules, in the order the data flows:
``cli`` (arguments) → ``config`` (what to do, validated) → ``command`` (does it):
``sources`` (offline run dirs, summary JSONs, the Polyaxon API) give ``records`` (the plain
data model) → ``grouping`` (runs per profile) → ``comparability`` (may they be compared?) →
``figures`` (per-profile figures) → ``comparison`` (a candidate against the baseline,
noise-aware) → ``cost`` (pricing file and costs) → ``verdict`` (the answer) → the reports:
``report_tables`` (sections shared by the renderers), ``report_text`` (terminal),
``report_json``, ``report_html`` (self-contained, with plots). ``errors`` holds the errors
and the one table of exit codes.
"""
