"""Checkpoint formats: byte-exact round trips, checksums, O_DIRECT fallback, async failures."""

from __future__ import annotations

import errno
import json
import os
import zlib
from pathlib import Path

import pytest
import torch

from tests.trainer.helpers import run_trainer, tiny_config
from trainer.ckpt import checksum, store
from trainer.ckpt.checkpointer import Checkpointer, CheckpointRecord
from trainer.ckpt.formats import (
    RawFormat,
    TorchFormat,
    WriteOptions,
    flatten,
    load_verified,
    make_format,
    unflatten,
)
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import (
    IO_BUFFERED_FALLBACK,
    IO_DIRECT,
    AlignedBuffer,
    ChunkWriter,
    read_image,
    stream_names,
    stripe,
    stripe_sizes,
    write_file,
)
from trainer.errors import CheckpointCorruptError, ConfigError, StorageFullError
from trainer.train import train


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
    view, (crcs,), mode = read_image(
        fs, [tmp_path / "a"], len(data), AlignedBuffer(), direct=True, chunk_bytes=4096
    )
    assert crcs == written.checksums and bytes(view) == bytes(data)


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
    assert len(written.checksums) == 4
    raw = bytearray((tmp_path / "f").read_bytes())
    raw[4096 * 2 + 17] ^= 1
    (tmp_path / "f").write_bytes(raw)
    _, (crcs,), _ = read_image(
        LocalFS(), [tmp_path / "f"], len(raw), AlignedBuffer(), direct=False, chunk_bytes=4096
    )
    assert [a == b for a, b in zip(crcs, written.checksums, strict=True)] == [
        True,
        True,
        False,
        True,
    ]


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


# ------------------------------------------------------------ overlap, streams, checksums


def big_state() -> dict:
    """Tensors larger than the tests' 4 KiB chunks, so copies cross chunk boundaries."""
    gen = torch.Generator().manual_seed(3)
    return {
        **rich_state(),
        "big": {
            "a": torch.randn(3000, generator=gen),  # 12000 bytes: spans 3-4 chunks
            "b": torch.randn(40, 50, generator=gen).to(torch.bfloat16).t(),  # non-contiguous
            "c": torch.arange(5000, dtype=torch.int16),
        },
    }


SMALL_CHUNKS = 4096


def save_one(directory: Path, fmt: str, state, **options) -> tuple[Path, CheckpointRecord]:
    asynchronous = options.pop("asynchronous", False)
    ckpt = Checkpointer(
        directory,
        make_format(fmt),
        LocalFS(),
        durable=True,
        keep=5,
        asynchronous=asynchronous,
        options=WriteOptions(**options),
    )
    ckpt.save(7, lambda: state)
    (record,) = ckpt.finish()
    return Path(record.path), record


def load_back(path: Path, fmt: str):
    manifest, data = store.read_verified(LocalFS(), path, AlignedBuffer())
    return manifest, load_verified(make_format(fmt), path, manifest, data)


@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "strict"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_raw_round_trip_with_and_without_overlap(tmp_path, overlap, streams, asynchronous):
    state = big_state()
    path, record = save_one(
        tmp_path,
        "raw",
        state,
        overlap=overlap,
        io_streams=streams,
        chunk_bytes=SMALL_CHUNKS,
        asynchronous=asynchronous,
    )
    assert record.overlapped is overlap
    assert record.io_streams == streams
    manifest, loaded = load_back(path, "raw")
    assert_same(state, loaded)
    assert len(manifest["files"]) == streams and manifest["layout"] == "striped"
    assert manifest["checksum"] == "crc32"
    # Whatever the schedule, the files hold exactly the image staging makes.
    image = bytes(RawFormat().stage(state).data)
    _, data = store.read_verified(LocalFS(), path, AlignedBuffer())
    assert bytes(data) == image


def test_overlapped_copy_hands_over_only_final_bytes():
    """Each ``sink(upto)`` promise holds: bytes below ``upto`` already equal the final image."""
    state = big_state()
    final = bytes(RawFormat().stage(state).data)
    fmt = RawFormat()
    plan = fmt.plan(state)
    for _, _, off, nbytes in plan.entries:  # garbage where tensor bytes go
        fmt.buffer.tensor[plan.head_area + off : plan.head_area + off + nbytes].fill_(0xAB)
    seen: list[int] = []

    def sink(upto, event):
        assert event is None  # CPU tensors: nothing to wait for
        assert bytes(fmt.buffer.view(upto)) == final[:upto]
        seen.append(upto)

    fmt.copy(plan, sink=sink, chunk_bytes=SMALL_CHUNKS)
    assert seen == sorted(seen) and seen[-1] == len(final)
    assert len(set(seen)) > len(final) // SMALL_CHUNKS // 2  # handed over piece by piece


def test_chunk_writer_writes_chunks_as_they_become_ready(tmp_path):
    data = memoryview(bytearray(os.urandom(10 * 4096)))
    writer = ChunkWriter(LocalFS(), [tmp_path / "f"], data, direct=False, chunk_bytes=4096)
    writer.ready(3 * 4096 + 100)  # three whole chunks are final, the fourth is not
    assert len(writer._futures) == 3
    (written,) = writer.finish()
    os.close(written.fd)
    assert (tmp_path / "f").read_bytes() == bytes(data)
    assert written.checksums == [zlib.crc32(data[i : i + 4096]) for i in range(0, len(data), 4096)]


def test_stripe_layout():
    assert [(s.file, s.file_offset, s.image_offset, s.nbytes) for s in stripe(10, 4, 2)] == [
        (0, 0, 0, 4),
        (1, 0, 4, 4),
        (0, 4, 8, 2),
    ]
    assert stripe_sizes(10, 4, 2) == [6, 4]
    assert stripe_sizes(10, 4, 4) == [4, 4, 2, 0]
    assert stream_names("state.ckpt", 1) == ["state.ckpt"]
    assert stream_names("state.ckpt", 2) == ["state.ckpt.00-of-02", "state.ckpt.01-of-02"]


def test_striped_damage_is_found_in_the_right_file(tmp_path):
    path, _ = save_one(tmp_path, "raw", big_state(), io_streams=3, chunk_bytes=SMALL_CHUNKS)
    victim = path / "state.ckpt.01-of-03"
    raw = bytearray(victim.read_bytes())
    raw[SMALL_CHUNKS + 5] ^= 1  # the second chunk of the second file
    victim.write_bytes(raw)
    with pytest.raises(CheckpointCorruptError, match="chunk 1 of state.ckpt.01-of-03"):
        store.read_verified(LocalFS(), path, AlignedBuffer())


def test_striped_manifest_must_match_the_stripe(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path, _ = save_one(tmp_path / "a", "raw", big_state(), io_streams=2, chunk_bytes=SMALL_CHUNKS)
    (path / "state.ckpt.01-of-02").unlink()
    with pytest.raises(CheckpointCorruptError, match="state.ckpt.01-of-02 is missing"):
        store.read_verified(LocalFS(), path, AlignedBuffer())
    # Sizes that cannot come from striping one image (file 0 never holds less than file 1).
    path, _ = save_one(tmp_path / "b", "raw", big_state(), io_streams=2, chunk_bytes=SMALL_CHUNKS)
    first = path / "state.ckpt.00-of-02"
    os.truncate(first, first.stat().st_size - 2 * SMALL_CHUNKS)
    manifest = json.loads((path / store.MANIFEST).read_text())
    manifest["files"][0]["bytes"] -= 2 * SMALL_CHUNKS
    manifest["files"][0]["crc32"] = manifest["files"][0]["crc32"][:-2]
    (path / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointCorruptError, match="do not form a stripe"):
        store.read_verified(LocalFS(), path, AlignedBuffer())


def test_isal_crc32_equals_zlib():
    data = memoryview(os.urandom(1 << 20))
    assert checksum.get("crc32")(data) == zlib.crc32(data)
    assert checksum.implementation("crc32") in ("isal", "zlib")


def test_unknown_checksum_algorithm_is_refused(tmp_path):
    path, _ = save_one(tmp_path, "raw", rich_state())
    manifest = json.loads((path / store.MANIFEST).read_text())
    manifest["checksum"] = "md4"
    (path / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointCorruptError, match="unknown checksum algorithm 'md4'"):
        store.read_verified(LocalFS(), path, AlignedBuffer())
    with pytest.raises(ValueError, match="unknown checksum"):
        WriteOptions(checksum="md4")


def test_a_manifest_without_its_checksum_field_is_incomplete(tmp_path):
    """Every manifest names its checksum algorithm: one without is never read as CRC32."""
    path, _ = save_one(tmp_path, "raw", rich_state())
    manifest = json.loads((path / store.MANIFEST).read_text())
    del manifest["checksum"]
    (path / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointCorruptError, match="has no field 'checksum'"):
        store.read_verified(LocalFS(), path, AlignedBuffer())


@pytest.mark.parametrize("field", ["layout", "run_id"])
def test_a_manifest_without_a_field_every_writer_writes_is_incomplete(tmp_path, field):
    """No field has a default: one without ``layout`` is never read as a striped image,
    one without ``run_id`` never as a checkpoint of no run."""
    path, _ = save_one(tmp_path, "raw", rich_state())
    manifest = json.loads((path / store.MANIFEST).read_text())
    del manifest[field]
    (path / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointCorruptError, match=f"has no field '{field}'"):
        store.read_verified(LocalFS(), path, AlignedBuffer())
    assert store.checkpoint_run(store.CheckpointRef(7, path)) == (False, None)
    assert field in store.REQUIRED_FIELDS


@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_library_formats_round_trip(tmp_path, fmt, streams, asynchronous):
    state = big_state()
    path, record = save_one(tmp_path, fmt, state, io_streams=streams, asynchronous=asynchronous)
    manifest, loaded = load_back(path, fmt)
    assert manifest["format"] == fmt and manifest["layout"] == "files"
    assert_same(state, loaded)
    assert record.checksum_s is not None and record.overlapped is False
    if fmt == "safetensors":
        assert len(manifest["files"]) == streams
    else:  # one data file per writer thread, plus DCP's .metadata
        assert len(manifest["files"]) == streams + 1


@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
def test_library_format_damage_is_found(tmp_path, fmt):
    path, _ = save_one(tmp_path, fmt, big_state())
    name = max(store.read_manifest(path)["files"], key=lambda e: e["bytes"])["name"]
    raw = bytearray((path / name).read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (path / name).write_bytes(raw)
    with pytest.raises(CheckpointCorruptError, match=f"checksum mismatch in chunk 0 of {name}"):
        store.read_verified(LocalFS(), path, AlignedBuffer())


def test_safetensors_snapshot_does_not_follow_later_changes(tmp_path):
    """In async mode the library formats copy the state before training may change it."""
    state = {"w": torch.zeros(1000)}
    ckpt = Checkpointer(
        tmp_path, make_format("safetensors"), LocalFS(), durable=True, keep=2, asynchronous=True
    )
    ckpt.save(1, lambda: state)
    state["w"].add_(1)  # the training loop moves on
    (record,) = ckpt.finish()
    _, loaded = load_back(Path(record.path), "safetensors")
    assert torch.equal(loaded["w"], torch.zeros(1000))


def test_layout_must_match_the_format(tmp_path):
    path, _ = save_one(tmp_path, "raw", rich_state())
    manifest, data = store.read_verified(LocalFS(), path, AlignedBuffer())
    with pytest.raises(CheckpointCorruptError, match="layout 'striped' is not what format 'dcp'"):
        load_verified(make_format("dcp"), path, manifest, data)


@pytest.mark.parametrize("fs", [NoDirectAtOpen(), NoDirectAtWrite()], ids=["at-open", "at-write"])
def test_overlapped_striped_write_falls_back_without_o_direct(tmp_path, fs):
    state = big_state()
    ckpt = Checkpointer(
        tmp_path,
        RawFormat(),
        fs,
        durable=True,
        keep=2,
        options=WriteOptions(io_streams=2, chunk_bytes=SMALL_CHUNKS),
    )
    ckpt.save(1, lambda: state)
    (record,) = ckpt.finish()
    assert record.io_mode == IO_BUFFERED_FALLBACK and record.overlapped
    assert_same(state, load_back(Path(record.path), "raw")[1])


def test_failed_overlapped_write_leaves_nothing(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    ckpt = Checkpointer(
        ckpt_dir,
        RawFormat(),
        FailingWrites(),
        durable=True,
        keep=2,
        options=WriteOptions(io_streams=2, chunk_bytes=SMALL_CHUNKS),
    )
    with pytest.raises(StorageFullError):
        ckpt.save(1, big_state)
        ckpt.finish()
    assert list(ckpt_dir.iterdir()) == []


@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
def test_training_resumes_from_library_formats(tmp_path, fmt):
    train(tiny_config(tmp_path, steps=4, format=fmt, io_streams=2), say=lambda s: None)
    said: list[str] = []
    summary = train(
        tiny_config(tmp_path, steps=6, format=fmt, io_streams=2, resume="always"), say=said.append
    )
    assert summary.resumed_from == 4, said
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [6, 4]


def test_config_rejects_bad_io_streams(tmp_path):
    with pytest.raises(ConfigError, match="--io-streams must be positive"):
        tiny_config(tmp_path, io_streams=0)


def test_cli_takes_io_streams_and_no_overlap(tmp_path):
    out = tmp_path / "summary.json"
    proc = run_trainer(
        "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "2", "--checkpoint-every", "2",
        "--model-size", "256KiB", "--batch-size", "2", "--seq-len", "16", "--device", "cpu",
        "--io-streams", "2", "--no-overlap", "--no-track", "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (record,) = json.loads(out.read_text())["checkpoints"]
    assert record["io_streams"] == 2 and record["overlapped"] is False
    assert record["checksum"] == "crc32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_staging_overlaps_through_the_pinned_buffer(tmp_path):
    state = {
        k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in big_state()["big"].items()
    }
    fmt = RawFormat(pin=True)
    ckpt = Checkpointer(
        tmp_path,
        fmt,
        LocalFS(),
        durable=True,
        keep=2,
        device=torch.device("cuda"),
        options=WriteOptions(chunk_bytes=SMALL_CHUNKS),
    )
    ckpt.save(1, lambda: state)
    (record,) = ckpt.finish()
    assert record.overlapped
    assert_same({k: v.cpu() for k, v in state.items()}, load_back(Path(record.path), "raw")[1])
