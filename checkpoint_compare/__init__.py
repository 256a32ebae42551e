"""Verdict step: does a storage profile improve the whole training run, and is it worth it?

Modules, in the order the data flows:
``records`` (the plain data model) → ``loading`` (offline run dirs, summary JSONs, the
Polyaxon API) → ``stats`` (per-profile figures, comparability, the noise-aware verdict) →
``cost`` (pricing file and costs) → ``render`` (terminal table, JSON, op outputs) and
``html`` (the self-contained report with plots). ``cli`` ties them together.
"""
