"""Checkpoint-storage trainer: a real training loop whose checkpoints are timed per stage."""

__version__ = "0.2.0"
