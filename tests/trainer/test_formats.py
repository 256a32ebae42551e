"""Checkpoint formats: byte-exact round trips, checksums, O_DIRECT fallback, async failures."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from trainer.ckpt import store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import RawFormat, TorchFormat, flatten, make_format, unflatten
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import IO_BUFFERED_FALLBACK, IO_DIRECT, AlignedBuffer, read_file, write_file
from trainer.errors import CheckpointCorruptError, StorageFullError


def rich_state() -> dict:
    """Every shape of state a real resume needs, including the awkward ones."""
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(6, 10, generator=gen)
    return {
        "step": 42,
        "model": {
            "w.f32": base,
            "w.bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
            "w.f16": torch.randn(7, generator=gen).to(torch.float16),
            "w.f64": torch.randn(2, 2, generator=gen).double(),
            "transposed": base.t(),  # non-contiguous
            "strided": base[:, ::3],
            "empty": torch.empty(0, 4),
            "scalar": torch.tensor(3.5),
            "ints": torch.arange(11, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "bytes": torch.randint(0, 255, (13,), dtype=torch.uint8, generator=gen),
        },
        "optimizer": {
            "state": {
                0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, generator=gen)},
                1: {},
            },
            "param_groups": [
                {
                    "lr": 3e-4,
                    "betas": (0.9, 0.999),
                    "params": [0, 1],
                    "foreach": None,
                    "amsgrad": False,
                }
            ],
        },
        "config": {"name": "x", "nested": [1, 2.5, None, "s"]},
    }


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


def test_flatten_round_trip_keeps_types():
    tensors: list[torch.Tensor] = []
    state = rich_state()
    assert_same(state, unflatten(flatten(state, tensors), tensors))


def test_flatten_rejects_arbitrary_objects():
    with pytest.raises(TypeError, match="cannot checkpoint a PosixPath"):
        flatten({"p": Path("/x")}, [])


@pytest.mark.parametrize("fmt", ["raw", "torch"])
def test_file_round_trip_is_byte_exact(tmp_path, fmt):
    ckpt = Checkpointer(tmp_path, make_format(fmt), LocalFS(), durable=True, keep=5)
    state = rich_state()
    ckpt.save(42, lambda: state)
    (record,) = ckpt.finish()
    manifest, data = store.read_verified(LocalFS(), Path(record.path), AlignedBuffer())
    assert manifest["format"] == fmt and manifest["step"] == 42
    assert_same(state, make_format(fmt).load(data))


def test_raw_writes_the_same_bytes_for_the_same_state(tmp_path):
    fmt = RawFormat()
    first = bytes(fmt.stage(rich_state()).data)
    second = bytes(fmt.stage(rich_state()).data)
    assert first == second
    assert len(first) % 4096 == 0


def test_raw_reuses_its_staging_buffer():
    fmt = RawFormat()
    fmt.stage(rich_state())
    ptr = fmt.buffer.tensor.data_ptr()
    fmt.stage(rich_state())
    assert fmt.buffer.tensor.data_ptr() == ptr
    assert ptr % 4096 == 0


def test_raw_rejects_foreign_bytes():
    with pytest.raises(CheckpointCorruptError, match="not a raw checkpoint"):
        RawFormat().load(memoryview(b"PK\x03\x04" + bytes(60)))


def test_torch_format_rejects_garbage():
    with pytest.raises(CheckpointCorruptError, match="torch.load failed"):
        TorchFormat().load(memoryview(b"garbage" * 100))


class NoDirectAtOpen(LocalFS):
    """A file system that refuses O_DIRECT at open(), as tmpfs did before Linux 6.6."""

    def open_write(self, path, direct):
        if direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().open_write(path, direct)

    def open_read(self, path, direct):
        if direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().open_read(path, direct)


class NoDirectAtWrite(LocalFS):
    """Accepts O_DIRECT at open() but refuses the aligned write, as some network FSs do."""

    def __init__(self) -> None:
        self.direct_fds: set[int] = set()

    def open_write(self, path, direct):
        fd = super().open_write(path, direct)
        if direct:
            self.direct_fds.add(fd)
        return fd

    def pwrite(self, fd, data, offset):
        if fd in self.direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().pwrite(fd, data, offset)

    def close(self, fd):
        self.direct_fds.discard(fd)  # fd numbers are reused
        super().close(fd)


@pytest.mark.parametrize("fs", [NoDirectAtOpen(), NoDirectAtWrite()], ids=["at-open", "at-write"])
def test_buffered_fallback_without_o_direct(tmp_path, fs):
    data = RawFormat().stage(rich_state()).data
    written = write_file(fs, tmp_path / "a", data, direct=True, chunk_bytes=4096)
    os.close(written.fd)
    assert written.io_mode == IO_BUFFERED_FALLBACK
    assert (tmp_path / "a").read_bytes() == bytes(data)
    view, crcs, mode = read_file(
        fs, tmp_path / "a", len(data), AlignedBuffer(), direct=True, chunk_bytes=4096
    )
    assert crcs == written.crc32 and bytes(view) == bytes(data)


def test_checkpointer_reports_the_fallback(tmp_path):
    ckpt = Checkpointer(tmp_path, RawFormat(), NoDirectAtOpen(), durable=True, keep=2)
    ckpt.save(1, rich_state)
    (record,) = ckpt.finish()
    assert record.io_mode == IO_BUFFERED_FALLBACK
    assert store.read_manifest(Path(record.path))["io_mode"] == IO_BUFFERED_FALLBACK


def test_direct_io_where_the_disk_supports_it(tmp_path):
    data = RawFormat().stage(rich_state()).data
    written = write_file(LocalFS(), tmp_path / "a", data, direct=True)
    os.close(written.fd)
    # Whether this machine's disk takes O_DIRECT is its business; the bytes must match.
    assert written.io_mode in (IO_DIRECT, IO_BUFFERED_FALLBACK)
    assert (tmp_path / "a").read_bytes() == bytes(data)


def test_chunk_checksums_cover_every_byte(tmp_path):
    data = memoryview(bytearray(os.urandom(3 * 4096 + 4096)))
    written = write_file(LocalFS(), tmp_path / "f", data, direct=False, chunk_bytes=4096, threads=3)
    os.close(written.fd)
    assert len(written.crc32) == 4
    raw = bytearray((tmp_path / "f").read_bytes())
    raw[4096 * 2 + 17] ^= 1
    (tmp_path / "f").write_bytes(raw)
    _, crcs, _ = read_file(
        LocalFS(), tmp_path / "f", len(raw), AlignedBuffer(), direct=False, chunk_bytes=4096
    )
    assert [a == b for a, b in zip(crcs, written.crc32, strict=True)] == [True, True, False, True]


class FailingWrites(LocalFS):
    def pwrite(self, fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_async_background_failure_surfaces_and_leaves_nothing_that_looks_complete(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    ckpt = Checkpointer(
        ckpt_dir, RawFormat(), FailingWrites(), durable=True, keep=2, asynchronous=True
    )
    ckpt.save(1, rich_state)  # returns once staged
    with pytest.raises(StorageFullError):
        ckpt.finish()
    assert list(ckpt_dir.iterdir()) == []


def test_async_pause_is_only_the_staging(tmp_path):
    ckpt = Checkpointer(tmp_path, RawFormat(), LocalFS(), durable=True, keep=2, asynchronous=True)
    ckpt.save(1, rich_state)
    ckpt.save(2, rich_state)  # waits for the first: that wait is pause
    records = ckpt.finish()
    assert [r.step for r in records] == [1, 2]
    first, second = records
    assert first.pause_s <= first.total_s  # nothing to wait for: blocked only while staging
    for r in records:
        assert r.serialize_s <= r.pause_s
    # The second waited for the first; its own total starts after that wait.
    assert second.total_s >= second.serialize_s + second.write_s
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [2, 1]
