"""A small decoder-only transformer and a deterministic synthetic token dataset.

The model's size is chosen from a byte budget so checkpoints range from a few MiB (tests)
to several GiB (a real GPU node) with the same code. The dataset is a seeded Markov chain
over a byte vocabulary: learnable (the loss falls), free of downloads, and a pure function
of ``(seed, step)`` so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.shape import HEAD_DIM, VOCAB, ModelShape, shape_for_bytes

__all__ = ["HEAD_DIM", "VOCAB", "ModelShape", "SyntheticTokens", "TinyGPT", "shape_for_bytes"]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style language model over bytes."""

    def __init__(self, shape: ModelShape, seq_len: int) -> None:
        super().__init__()
        d = shape.d_model
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        self.blocks = nn.ModuleList(Block(d, shape.n_heads) for _ in range(shape.n_layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class SyntheticTokens:
    """Batches from a seeded sparse Markov chain; ``batch(step)`` is deterministic."""

    def __init__(self, seed: int, batch_size: int, seq_len: int, branching: int = 4) -> None:
        self.seed, self.batch_size, self.seq_len = seed, batch_size, seq_len
        gen = torch.Generator().manual_seed(seed)
        # Each token has `branching` likely successors: enough structure to learn quickly.
        self.successors = torch.randint(0, VOCAB, (VOCAB, branching), generator=gen)

    def batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(_batch_seed(self.seed, step))
        tokens = torch.empty(self.batch_size, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB, (self.batch_size,), generator=gen)
        choice = torch.randint(0, self.successors.shape[1], tokens.shape, generator=gen)
        for i in range(1, self.seq_len + 1):
            tokens[:, i] = self.successors[tokens[:, i - 1], choice[:, i]]
        return tokens


def _batch_seed(seed: int, step: int) -> int:
    """The generator seed of one batch: ``seed * 1_000_003 + step``, wrapped modulo 2**64
    when it leaves the range torch's generators take (so every seed that fitted before
    gives the same batches, and a large one, a nanosecond timestamp, still works).

    >>> _batch_seed(7, 2)
    7000023
    >>> 0 <= _batch_seed(2**64 - 1, 1) < 2**64
    True
    """
    value = seed * 1_000_003 + step
    return value if -(2**63) <= value < 2**64 else value % 2**64
