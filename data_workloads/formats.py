"""The columnar formats teams keep their training input in: Parquet and MosaicML's MDS.

The same seeded records as the other formats (:func:`data_workloads.dataset.encode`), each a
row of four columns: ``image`` (the stored payload, bytes), ``key`` (the record's index,
eight digits), ``label`` (int64) and ``meta`` (the record's JSON header: label, shape,
codec, the CRC32 of the image), so every reader decodes and verifies a record the same way.

- ``parquet``: files ``part-NNNNNN.parquet`` of ``shard_size`` decoded bytes, written with
  ``pyarrow`` in row groups of ``row_group_size`` decoded bytes, uncompressed (the images
  are the payload as stored: a compressed codec is the records' own ``zlib``) and without
  dictionary encoding (every value differs).
- ``mds``: written by ``mosaicml-streaming``'s ``MDSWriter``, local shards of about
  ``shard_size`` bytes (``shard.NNNNN.mds``) and its ``index.json``, no remote. A shard is
  a ``uint32`` sample count, ``count + 1`` ``uint32`` offsets, the writer's JSON config,
  then the samples; a sample is a ``uint32`` size for each variable-size column (``image``,
  ``key``, ``meta``: the columns in sorted order), then the columns' bytes in that order
  (``label`` as eight bytes).

Both libraries are optional (the ``formats`` extra): a run that needs one that is not
installed is refused with exit 2 before anything is generated or read.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import struct
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from data_workloads.errors import ConfigError

COLUMNS = ("image", "key", "label", "meta")
MDS_COLUMNS = {"image": "bytes", "key": "str", "label": "int", "meta": "str"}
MDS_INDEX = "index.json"
MDS_SHARD_SUFFIX = ".mds"
MDS_PREFIX = struct.Struct("<3I")
"""The sizes of a sample's variable-size columns, in sorted order: image, key, meta."""
MDS_LABEL_BYTES = 8
KEY_BYTES = 8
MDS_SLACK = 4096
"""What an MDS shard may hold beyond ``shard_size``: its header and the writer's config, so
that a shard of one record's size still holds that record."""


def _missing(library: str, what: str) -> ConfigError:
    return ConfigError(
        f"{what} needs the {library} library, which is not installed: "
        'pip install "checkpoint-storage-bench[formats]"'
    )


def pyarrow_modules(what: str) -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``.

    Raises:
        ConfigError: pyarrow is not installed (exit 2).
    """
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise _missing("pyarrow", what) from None
    return pyarrow, pyarrow.parquet


def streaming_modules(what: str) -> types.SimpleNamespace:
    """mosaicml-streaming's ``MDSWriter`` and ``StreamingDataset``.

    The package's ``__init__`` (and ``streaming.base``'s) imports every integration it has
    eagerly: ``transformers`` for its DataLoader subclass, ``torchvision`` for its vision
    datasets. Those are declared dependencies that would pull hundreds of MB and replace
    the pinned torch, and the local MDS writer and reader use neither, so the two package
    modules are entered without running their ``__init__`` and the library's own writer
    and dataset modules are imported from them (the pinned version's layout).

    Raises:
        ConfigError: mosaicml-streaming is not installed (exit 2).
    """
    if "streaming.base.dataset" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise _missing("mosaicml-streaming", what)
        root = Path(next(iter(spec.submodule_search_locations)))
        for name, path in (("streaming", root), ("streaming.base", root / "base")):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(path)]
                package.__file__ = str(path / "__init__.py")
                sys.modules[name] = package
    try:
        dataset = importlib.import_module("streaming.base.dataset")
        writer = importlib.import_module("streaming.base.format.mds.writer")
    except ImportError as exc:
        raise ConfigError(
            f"{what}: mosaicml-streaming does not import ({exc}); install the formats extra"
        ) from None
    return types.SimpleNamespace(
        MDSWriter=writer.MDSWriter, StreamingDataset=dataset.StreamingDataset
    )


def check_libraries(dataset_format: str, loader: str = "ours") -> None:
    """Refuse (exit 2), before anything is generated or read, a format or loader whose
    library is not installed.

    Raises:
        ConfigError: The library is missing.
    """
    if dataset_format == "parquet" or loader == "arrow":
        pyarrow_modules(f"--dataset-format {dataset_format} --loader {loader}")
    if dataset_format == "mds" or loader == "streaming":
        streaming_modules(f"--dataset-format {dataset_format} --loader {loader}")
    if loader == "webdataset" and importlib.util.find_spec("webdataset") is None:
        raise _missing("webdataset", "--loader webdataset")


Row = tuple[str, bytes, bytes, int]
"""(key, JSON header, payload, label) of a record."""


def write_parquet(
    out: Path, records: int, per_file: int, per_group: int, row: Callable[[int], Row]
) -> list[Path]:
    """Parquet files of ``per_file`` records each in ``out``, row groups of ``per_group``
    records, every file fsynced; returns them in order."""
    pa, pq = pyarrow_modules("--dataset-format parquet")
    schema = pa.schema(
        [("image", pa.binary()), ("key", pa.string()), ("label", pa.int64()), ("meta", pa.binary())]
    )
    files = []
    for first in range(0, records, per_file):
        path = out / f"part-{first // per_file:06d}.parquet"
        with path.open("wb") as f:
            with pq.ParquetWriter(
                f, schema, compression="NONE", use_dictionary=False, write_statistics=False
            ) as writer:
                last = min(first + per_file, records)
                for start in range(first, last, per_group):
                    rows = [row(i) for i in range(start, min(start + per_group, last))]
                    table = pa.table(
                        {
                            "image": [r[2] for r in rows],
                            "key": [r[0] for r in rows],
                            "label": [r[3] for r in rows],
                            "meta": [r[1] for r in rows],
                        },
                        schema=schema,
                    )
                    writer.write_table(table, row_group_size=len(rows))
            f.flush()
            os.fsync(f.fileno())
        files.append(path)
    return files


def write_mds(out: Path, records: int, shard_bytes: int, row: Callable[[int], Row]) -> list[Path]:
    """MDS shards of about ``shard_bytes`` (mosaicml-streaming's ``MDSWriter``) and their
    ``index.json`` in ``out``, every file fsynced; returns the shards in order, then the
    index."""
    lib = streaming_modules("--dataset-format mds")
    staging = out / "writer"  # the writer wants a directory of its own
    writer = lib.MDSWriter(
        out=str(staging), columns=MDS_COLUMNS, size_limit=shard_bytes + MDS_SLACK
    )
    for i in range(records):
        key, header, payload, label = row(i)
        writer.write({"image": payload, "key": key, "label": label, "meta": header.decode()})
    writer.finish()
    index = json.loads((staging / MDS_INDEX).read_text())
    names = [s["raw_data"]["basename"] for s in index["shards"]] + [MDS_INDEX]
    files = []
    for name in names:
        path = out / name
        os.rename(staging / name, path)
        with path.open("rb") as f:
            os.fsync(f.fileno())
        files.append(path)
    staging.rmdir()
    return files


def mds_counts(root: Path) -> list[int]:
    """The samples of each shard, from the dataset's ``index.json`` (verified with the
    rest of the dataset)."""
    index = json.loads((root / MDS_INDEX).read_text())
    return [int(s["samples"]) for s in index["shards"]]


def mds_offsets(head: bytes | bytearray | memoryview, samples: int, size: int) -> list[int]:
    """The ``samples + 1`` offsets of an MDS shard of ``size`` bytes from its first bytes.

    Raises:
        ValueError: The shard holds another number of samples, or its offsets do not
            fit the file (truncated or not an MDS shard).
    """
    if len(head) < 4 * (samples + 2):
        raise ValueError(f"a shard of {size} bytes cannot hold {samples} samples")
    (count,) = struct.unpack_from("<I", head)
    if count != samples:
        raise ValueError(f"the shard holds {count} samples, its index {samples}")
    offsets = list(struct.unpack_from(f"<{samples + 1}I", head, 4))
    if offsets[-1] != size or any(b < a for a, b in zip(offsets, offsets[1:], strict=False)):
        raise ValueError(f"the shard's offsets end at {offsets[-1]}, the file at {size} bytes")
    return offsets


def mds_sample(data: bytes | bytearray | memoryview) -> Row:
    """(key, header, payload, label) of one encoded MDS sample (payload: a view of ``data``).

    Raises:
        ValueError: Its column sizes do not add up to its length.
    """
    image, key, meta = MDS_PREFIX.unpack_from(data)
    at = MDS_PREFIX.size
    if at + image + key + MDS_LABEL_BYTES + meta != len(data):
        raise ValueError(f"a sample of {len(data)} bytes with columns of {image}, {key}, {meta}")
    view = memoryview(data)
    payload = view[at : at + image]
    at += image
    name = bytes(view[at : at + key]).decode()
    at += key
    (label,) = struct.unpack_from("<q", view, at)
    header = bytes(view[at + MDS_LABEL_BYTES :])
    return name, header, payload, label  # type: ignore[return-value]


def iter_mds_shard(blob: bytearray, samples: int) -> Iterator[Row]:
    """Every sample of a whole MDS shard read into ``blob``."""
    offsets = mds_offsets(blob, samples, len(blob))
    for begin, end in zip(offsets, offsets[1:], strict=False):
        yield mds_sample(memoryview(blob)[begin:end])


def iter_parquet_file(blob: bytearray) -> Iterator[Row]:
    """Every row of a whole Parquet file read into ``blob``."""
    pa, pq = pyarrow_modules("--dataset-format parquet")
    table = pq.read_table(pa.BufferReader(blob), columns=list(COLUMNS), use_threads=False)
    for image, key, label, meta in zip(
        *(table.column(c).to_pylist() for c in COLUMNS), strict=True
    ):
        yield key, meta, image, label
