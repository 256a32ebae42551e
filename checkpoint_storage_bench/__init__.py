"""The shared base of the bundle's parts: what several parts need, importing none of them.

- :mod:`~checkpoint_storage_bench.contract`: the names the parts share (docs/contracts.md in code).
- :mod:`~checkpoint_storage_bench.errors`: one error base; each error carries its exit code.
- :mod:`~checkpoint_storage_bench.retry`: one retry loop (delays as data, ``Retry-After``,
  one deadline).
- :mod:`~checkpoint_storage_bench.tracking`: Polyaxon tracking, online in a run, offline otherwise.
- :mod:`~checkpoint_storage_bench.units`: byte sizes and Kubernetes quantities.
- :mod:`~checkpoint_storage_bench.processes`: stopping a process group.
"""
