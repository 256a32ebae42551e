"""The generated dataset: deterministic, reused, verified before it is measured, and never
anything but itself written or deleted."""

from __future__ import annotations

import io
import json
import tarfile
import zlib
from pathlib import Path

import pytest

from data_workloads import dataset as ds
from data_workloads.errors import (
    DataDirError,
    DatasetCorruptError,
    DatasetMismatchError,
    DatasetMissingError,
)


def spec(fmt: str = "webdataset", **kw: int | str) -> ds.DatasetSpec:
    values = {"seed": 0, "dataset_size": 256 * 1024, "record_size": 4096, "shard_size": 65536}
    return ds.DatasetSpec(format=fmt, **{**values, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_generated_once_then_reused_with_the_same_bytes(data_dir: Path, fmt: str) -> None:
    data_dir.mkdir()
    first = ds.open_dataset(data_dir, spec(fmt))
    assert first.generated and first.records == spec(fmt).records == 67
    manifest = (first.root / ds.MANIFEST).read_bytes()
    again = ds.open_dataset(data_dir, spec(fmt), allow_generate=False)
    assert not again.generated and again.files == first.files and again.bytes == first.bytes
    assert (again.root / ds.MANIFEST).read_bytes() == manifest
    # Nothing but the dataset itself in the data dir: no leftovers of the generation.
    assert [p.name for p in data_dir.iterdir()] == [fmt]


def test_same_seed_same_records_other_seed_other_records() -> None:
    assert ds.encode(spec(), 7) == ds.encode(spec(), 7)
    assert ds.encode(spec(), 7) != ds.encode(spec(seed=1), 7)
    assert ds.encode(spec(), 7) != ds.encode(spec(), 8)


@pytest.mark.parametrize("codec", ds.CODECS)
def test_records_decode_to_their_generated_image_and_label(codec: str) -> None:
    header, payload = ds.encode(spec(codec=codec), 3)
    image, label = ds.decode(header, bytearray(payload))
    want_label, raw = ds.record(spec(), 3)
    assert image.shape == (3, spec().side, spec().side) and label == want_label
    assert bytes(image.flatten().tolist()) == raw
    # zlib really compresses (inflating has work to do); none stores the image's bytes.
    assert (len(payload) < len(raw)) if codec == "zlib" else (payload == raw)


def test_an_uncompressed_record_is_a_tensor_over_the_bytes_read() -> None:
    header, payload = ds.encode(spec(), 3)
    buf = bytearray(payload)
    image, _ = ds.decode(header, memoryview(buf))
    buf[0] ^= 0xFF  # the tensor is the buffer: no copy was made
    assert int(image.flatten()[0]) == buf[0]
    # A read-only payload is copied: a tensor may be written to.
    image, _ = ds.decode(header, payload)
    image.flatten()[0] = 0
    assert payload == ds.encode(spec(), 3)[1]


@pytest.mark.parametrize("codec", ds.CODECS)
def test_a_damaged_record_fails_its_crc32(codec: str) -> None:
    header, payload = ds.encode(spec(codec=codec), 3)
    if codec == "zlib":  # a damaged image under an intact stream: recompress it
        raw = bytearray(ds.record(spec(), 3)[1])
        raw[100] ^= 1
        payload = zlib.compress(bytes(raw))
    else:
        payload = payload[:100] + bytes([payload[100] ^ 1]) + payload[101:]
    with pytest.raises(ValueError, match="CRC32"):
        ds.decode(header, bytearray(payload))
    with pytest.raises(ValueError, match="lacks 'crc32'"):  # a header without its checksum
        ds.decode(b'{"label": 1, "shape": [3, 36, 36], "codec": "none"}', bytearray(payload))
    with pytest.raises(ValueError, match="payload of 10 bytes"):
        ds.decode(header, bytearray(10) if codec == "none" else zlib.compress(bytes(10)))


def test_webdataset_shards_are_tar_files_of_key_json_and_payload(data_dir: Path) -> None:
    data_dir.mkdir()
    data = ds.open_dataset(data_dir, spec())
    assert len(data.files) == 5  # 67 records of 3888 bytes, 16 per 64 KiB shard
    with tarfile.open(data.files[0]) as tar:
        names = tar.getnames()
    assert names[:4] == ["00000000.json", "00000000.u8", "00000001.json", "00000001.u8"]
    with data.files[-1].open("rb") as f:
        samples = list(ds.iter_tar_samples(f))
    assert [key for key, _, _ in samples] == [f"{i:08d}" for i in range(64, 67)]
    # The streaming reader reads what tarfile reads, member for member.
    with tarfile.open(data.files[-1]) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    assert [(f"{k}.json", h) for k, h, _ in samples] == members[0::2]
    assert [(f"{k}.u8", bytes(p)) for k, _, p in samples] == members[1::2]


def test_compressed_shards_name_their_codec_and_are_smaller(data_dir: Path) -> None:
    (data_dir / "zlib").mkdir(parents=True)
    (data_dir / "none").mkdir()
    packed = ds.open_dataset(data_dir / "zlib", spec(codec="zlib"))
    plain = ds.open_dataset(data_dir / "none", spec())
    with tarfile.open(packed.files[0]) as tar:
        assert tar.getnames()[:2] == ["00000000.json", "00000000.u8.zlib"]
    assert packed.bytes < plain.bytes  # tar blocks and headers: not half


def test_the_reader_refuses_a_damaged_or_truncated_shard(data_dir: Path) -> None:
    data_dir.mkdir()
    blob = ds.open_dataset(data_dir, spec()).files[0].read_bytes()
    damaged = bytearray(blob)
    damaged[512 + 3] ^= 0xFF  # inside the first payload: the tar header stays intact
    damaged[0] ^= 0xFF  # the first header's name: its checksum no longer matches
    with pytest.raises(ValueError, match="checksum"):
        list(ds.iter_tar_samples(io.BytesIO(bytes(damaged))))
    # Members: header block, JSON (one block), header block, payload (3888 bytes, 8 blocks).
    for cut, why in [
        (1536 + 100, "member '00000000.u8' is truncated"),
        (1024 + 100, "ends inside a header"),
        (1536 + 8 * 512, "without its end-of-archive block"),
    ]:
        with pytest.raises(ValueError, match=why):
            list(ds.iter_tar_samples(io.BytesIO(blob[:cut])))


def test_missing_dataset_without_generate(data_dir: Path) -> None:
    data_dir.mkdir()
    with pytest.raises(DatasetMissingError, match="no webdataset dataset"):
        ds.open_dataset(data_dir, spec(), allow_generate=False)
    assert list(data_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("other", "named"),
    [
        ({"seed": 1}, "seed=0"),
        ({"dataset_size": 128 * 1024}, "dataset_size="),
        ({"record_size": 2048}, "record_size="),
        ({"codec": "zlib"}, "codec="),
    ],
)
def test_a_dataset_of_another_seed_or_size_is_refused(data_dir: Path, other, named) -> None:
    data_dir.mkdir()
    ds.open_dataset(data_dir, spec())
    before = sorted(p.stat().st_mtime_ns for p in (data_dir / "webdataset").iterdir())
    with pytest.raises(DatasetMismatchError, match=named):
        ds.open_dataset(data_dir, spec(**other))
    # Refused, not regenerated: the dataset there is left as it was.
    assert sorted(p.stat().st_mtime_ns for p in (data_dir / "webdataset").iterdir()) == before


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_a_truncated_file_is_found_before_anything_is_measured(data_dir: Path, fmt) -> None:
    data_dir.mkdir()
    data = ds.open_dataset(data_dir, spec(fmt))
    victim = data.files[len(data.files) // 2]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(DatasetCorruptError, match="truncated"):
        ds.open_dataset(data_dir, spec(fmt))


def test_an_altered_file_fails_its_checksum(data_dir: Path) -> None:
    data_dir.mkdir()
    data = ds.open_dataset(data_dir, spec("files"))
    blob = bytearray(data.files[3].read_bytes())
    blob[-1] ^= 0xFF
    data.files[3].write_bytes(bytes(blob))
    with pytest.raises(DatasetCorruptError, match="CRC32"):
        ds.open_dataset(data_dir, spec("files"))


def test_a_missing_file_is_named(data_dir: Path) -> None:
    data_dir.mkdir()
    data = ds.open_dataset(data_dir, spec())
    data.files[0].unlink()
    with pytest.raises(DatasetCorruptError, match="missing"):
        ds.open_dataset(data_dir, spec())


def test_someone_elses_files_are_left_alone(data_dir: Path) -> None:
    (data_dir / "webdataset").mkdir(parents=True)
    theirs = data_dir / "webdataset" / "train-000.tar"
    theirs.write_bytes(b"not ours")
    with pytest.raises(DataDirError, match="not a dataset generated here"):
        ds.open_dataset(data_dir, spec())
    assert theirs.read_bytes() == b"not ours"
    assert sorted(p.name for p in (data_dir / "webdataset").iterdir()) == ["train-000.tar"]


def test_a_manifest_naming_a_file_outside_is_refused(data_dir: Path) -> None:
    data_dir.mkdir()
    data = ds.open_dataset(data_dir, spec())
    manifest = json.loads((data.root / ds.MANIFEST).read_text())
    manifest["files"][0]["path"] = "../../outside"
    (data.root / ds.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DatasetCorruptError, match="outside the dataset"):
        ds.open_dataset(data_dir, spec())


def test_a_failed_generation_leaves_nothing(data_dir: Path, monkeypatch) -> None:
    data_dir.mkdir()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ds, "crc32_file", full)
    with pytest.raises(Exception, match="no space left"):
        ds.open_dataset(data_dir, spec())
    assert list(data_dir.iterdir()) == []


def test_an_incomplete_sample_is_an_error() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ds.add_tar_member(tar, "00000000.json", b"{}")
    buf.seek(0)
    with pytest.raises(ValueError, match="incomplete samples: 00000000"):
        list(ds.iter_tar_samples(buf))


class CountedReads(io.BytesIO):
    """A stream that records the size of every read asked of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def readinto(self, buf) -> int:  # type: ignore[override]
        self.asked.append(len(buf))
        return super().readinto(buf)


def test_the_stream_reads_whole_chunks_whatever_the_members() -> None:
    big = bytes(range(256)) * (10 * 1024)  # 2.5 MiB: spans three chunks
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        ds.add_tar_member(tar, "a.json", b"{}")
        ds.add_tar_member(tar, "a.u8", big)
        ds.add_tar_member(tar, "b.json", b"[1]")
        ds.add_tar_member(tar, "b.u8", b"xyz")
    source = CountedReads(buf.getvalue())
    stream = ds.TarStream(source.readinto)
    got = {}
    for name, size in stream.members():
        if name == "a.u8":  # into a buffer of its own, in two pieces
            into = memoryview(bytearray(size))
            stream.take(into[:1000])
            stream.take(into[1000:])
            got[name] = bytes(into)
        elif name != "b.json":  # b.json is not taken: skipped
            got[name] = bytes(stream.read())
    assert got == {"a.json": b"{}", "a.u8": big, "b.u8": b"xyz"}
    # Every read asks for a whole chunk (the loader's block size is the chunk's).
    assert source.asked == [ds.READ_CHUNK] * 3  # 2.5 MiB and some blocks
    with pytest.raises(ValueError, match="has 0 bytes left, not 1"):
        stream.take(bytearray(1))


@pytest.mark.parametrize("codec", ds.CODECS)
def test_a_files_record_is_read_and_decoded_into_its_place(data_dir: Path, codec: str) -> None:
    data_dir.mkdir()
    s = spec("files", codec=codec)
    data = ds.open_dataset(data_dir, s)
    shape = (3, s.side, s.side)
    image = memoryview(bytearray(s.record_bytes))
    scratch = bytearray(16)  # grown as needed
    label = ds.read_file_record_into(
        str(data.files[5]), data.sizes[5], image, shape, codec, scratch
    )
    assert (label, bytes(image)) == ds.record(s, 5)
    with pytest.raises(ValueError, match=r"read \d+ of its \d+ bytes"):  # shorter than verified
        ds.read_file_record_into(
            str(data.files[5]), data.sizes[5] + 1, image, shape, codec, scratch
        )


def test_decoding_into_a_batch_checks_shape_codec_and_crc32() -> None:
    header, payload = ds.encode(spec(), 3)
    shape = (3, spec().side, spec().side)
    image = memoryview(bytearray(payload))
    assert ds.decode_into(header, image, shape, "none") == ds.record(spec(), 3)[0]
    with pytest.raises(ValueError, match="shape"):
        ds.decode_into(header, image, (3, 8, 8), "none")
    with pytest.raises(ValueError, match="codec 'none' in a dataset of 'zlib'"):
        ds.decode_into(header, image, shape, "zlib", payload)
    image[7] ^= 1
    with pytest.raises(ValueError, match="CRC32"):
        ds.decode_into(header, image, shape, "none")
    zheader, packed = ds.encode(spec(codec="zlib"), 3)
    with pytest.raises(ValueError, match="payload of 10 bytes"):
        ds.decode_into(zheader, image, shape, "zlib", zlib.compress(bytes(10)))
    ds.decode_into(zheader, image, shape, "zlib", packed)  # inflated into the batch's bytes
    assert bytes(image) == payload


def big_spec(**kw: int | str) -> ds.DatasetSpec:
    """One shard of 16 records of 128 KiB: three 1 MiB reads."""
    mib2 = 2 * 1024**2
    return spec(dataset_size=mib2, record_size=128 * 1024, shard_size=mib2, **kw)


def test_a_placed_shard_is_read_in_whole_chunks_into_the_places_given(
    data_dir: Path, monkeypatch
) -> None:
    data_dir.mkdir()
    s = big_spec()
    data = ds.open_dataset(data_dir, s)
    (path,), (size,) = data.files, data.sizes
    asked: list[tuple[int, int]] = []
    real = ds.os.preadv

    def preadv(fd: int, buffers: list, offset: int) -> int:
        asked.append((offset, sum(len(b) for b in buffers)))
        return real(fd, buffers, offset)

    monkeypatch.setattr(ds.os, "preadv", preadv)
    places: dict[int, memoryview] = {}
    order: list[int] = []

    def place(j: int) -> memoryview:
        order.append(j)
        return places.setdefault(j, memoryview(bytearray(s.record_bytes)))

    reader = ds.PlacedShard(str(path), size, s.records, s.record_bytes)
    shape = (3, s.side, s.side)
    got = []
    for j, key, header in reader.read(place):
        assert key == f"{j:08d}"
        label = ds.decode_into(header, places[j], shape, "none")
        assert (label, bytes(places[j])) == ds.record(s, j)
        got.append(j)
    assert got == order == list(range(s.records)) == list(range(16))
    # The reads are the stream's: 1 MiB from offset 0 on, the last one the rest.
    chunk = ds.READ_CHUNK
    assert asked == [(o, min(chunk, size - o)) for o in range(0, size, chunk)] and len(asked) == 3


def test_a_placed_shard_refuses_what_the_generator_did_not_lay_out(data_dir: Path) -> None:
    data_dir.mkdir()
    s = big_spec()
    data = ds.open_dataset(data_dir, s)
    (path,), (size,) = data.files, data.sizes

    def read_all(samples: int, at: Path = path, size: int = size) -> None:
        reader = ds.PlacedShard(str(at), size, samples, s.record_bytes)
        for _ in reader.read(lambda j: memoryview(bytearray(s.record_bytes))):
            pass

    with pytest.raises(ValueError, match="more than the 15 samples"):
        read_all(15)
    with pytest.raises(ValueError, match="cannot hold 17 samples"):
        read_all(17)
    swapped = data_dir / "swapped.tar"  # the image member before its header member
    with tarfile.open(swapped, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(s.records):
            header, payload = ds.encode(s, i)
            ds.add_tar_member(tar, f"{i:08d}.u8", payload)
            ds.add_tar_member(tar, f"{i:08d}.json", header)
    assert swapped.stat().st_size == size  # the same bytes, otherwise laid out
    with pytest.raises(ValueError, match="sample 0 is not laid out as generated"):
        read_all(s.records, swapped)
    path.write_bytes(path.read_bytes()[: size // 2])
    with pytest.raises(ValueError, match="the shard is truncated"):
        read_all(s.records)
