"""fio sweep: judge a storage profile on the volume itself, before training.

``python -m trainer.fio_sweep`` (see :mod:`trainer.fio_sweep`) runs the cases of a YAML spec
(:mod:`trainer.fio.spec`) with fio on the mounted claim (:mod:`trainer.fio.runner`), reads
fio's JSON (:mod:`trainer.fio.parse`) and logs one Polyaxon run (:mod:`trainer.fio.sweep`).
"""
