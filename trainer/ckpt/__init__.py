"""Checkpoint formats, I/O, commit protocol and the stage-timed checkpointer."""
