"""A local Polyaxon sandbox: the CE server (haupt) on one machine and a runtime that executes
its runs: a small local agent, or with ``--on-node`` Polyaxon's own agent on the local node
(:mod:`sandbox.runtime`).

``python -m sandbox start`` runs the server and the runtime's agent, ``python -m sandbox demo``
runs the whole storage-profile pipeline against them, ``python -m sandbox stop`` ends them.
"""
