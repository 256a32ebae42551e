"""fio sweep: judge a storage profile on the volume itself, before training.

``python -m fio_sweep`` (see :mod:`fio_sweep`) runs the cases of a YAML spec
(:mod:`fio_sweep.spec`) with fio on the mounted claim (:mod:`fio_sweep.runner`), reads
fio's JSON (:mod:`checkpoint_storage_bench.fio`) and logs one Polyaxon run (:mod:`fio_sweep.commands`).
"""
