"""A local Polyaxon sandbox: the CE server (haupt) on one machine plus a small local agent.

``python -m sandbox start`` runs the server and the agent, ``python -m sandbox demo`` runs the
whole storage-profile pipeline against them, ``python -m sandbox stop`` ends both.
"""
