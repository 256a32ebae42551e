"""The transformer's shape for a byte budget: pure arithmetic, no torch, so the settings can
be checked before torch is imported (:mod:`trainer.config`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

VOCAB = 256
HEAD_DIM = 32
MAX_LAYERS = 4


@dataclass(frozen=True)
class ModelShape:
    """Width and depth of the transformer."""

    d_model: int
    n_layers: int
    n_heads: int

    def param_count(self, seq_len: int) -> int:
        d, layers = self.d_model, self.n_layers
        per_layer = 12 * d * d + 13 * d  # attention 4d², MLP 8d², biases and norms
        return layers * per_layer + VOCAB * d + seq_len * d + 2 * d + d * VOCAB


SMALLEST = ModelShape(d_model=HEAD_DIM, n_layers=1, n_heads=1)
"""One layer of one head: below its size no model fits a budget."""


def smallest_model_bytes(seq_len: int) -> int:
    """The fp32 parameter bytes of the smallest model at ``seq_len`` (its position table
    grows with the sequence).

    >>> smallest_model_bytes(64)
    124800
    """
    return SMALLEST.param_count(seq_len) * 4


def shape_for_bytes(param_bytes: int, seq_len: int, n_layers: int = MAX_LAYERS) -> ModelShape:
    """The widest model (a multiple of HEAD_DIM) of ``n_layers`` whose fp32 parameters fit
    the budget; a budget too small for that many layers of the narrowest width gets fewer
    layers, so the model never outgrows the bytes asked for.

    The checkpoint is about three times ``param_bytes``: parameters plus AdamW's two moments.

    Raises:
        ValueError: Not even the smallest model fits (:func:`smallest_model_bytes`).

    >>> shape_for_bytes(2**20, 64)
    ModelShape(d_model=64, n_layers=4, n_heads=2)
    >>> shape_for_bytes(200_000, 64)
    ModelShape(d_model=32, n_layers=2, n_heads=1)
    """
    budget = max(param_bytes // 4, 1)
    for layers in range(n_layers, 0, -1):
        d = max(HEAD_DIM, int(math.sqrt(budget / (12 * layers))) // HEAD_DIM * HEAD_DIM)
        while d > HEAD_DIM and ModelShape(d, layers, d // HEAD_DIM).param_count(seq_len) > budget:
            d -= HEAD_DIM
        shape = ModelShape(d_model=d, n_layers=layers, n_heads=d // HEAD_DIM)
        if shape.param_count(seq_len) <= budget:
            return shape
    raise ValueError(
        f"{param_bytes} bytes is below the smallest model at sequence length {seq_len} "
        f"({smallest_model_bytes(seq_len)} bytes)"
    )
