"""The raw format loads every dtype it stages."""

from __future__ import annotations

import pytest
import torch

from trainer.ckpt.formats import RawFormat


def all_dtypes() -> list[torch.dtype]:
    return sorted(
        {v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=lambda d: str(d)
    )


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_raw_format_loads_every_dtype_it_stages(dtype):
    try:
        tensor = torch.zeros(5, dtype=dtype)
    except (RuntimeError, TypeError):
        pytest.skip(f"torch cannot create a {dtype} tensor")
    fmt = RawFormat()
    try:
        staged = fmt.stage({"t": tensor})
    except TypeError as exc:
        assert "cannot checkpoint" in str(exc)  # refused at staging: nothing is written
        return
    loaded = RawFormat().load(memoryview(bytes(staged.data)))["t"]
    assert loaded.dtype == dtype and loaded.shape == tensor.shape
    assert bytes(loaded.view(torch.uint8).numpy()) == bytes(tensor.view(torch.uint8).numpy())
