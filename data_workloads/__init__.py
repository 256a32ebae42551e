"""Data workloads on a claim: scan a dataset as a training input pipeline does, materialize
a preprocessed cache, save a notebook workspace (``python -m data_workloads``)."""
