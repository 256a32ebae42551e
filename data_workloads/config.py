"""The settings of each workload, in one place: one dataclass per subcommand.

Each field is typed (a ``Literal`` is a closed set of choices), documented by the string
right below it, and validated in ``__post_init__``. The click options of
``python -m data_workloads scan|materialize|workspace`` are generated from them
(:func:`checkpoint_storage_bench.config_cli.config_options`), and the bundle test compares
the component's inputs with these defaults and choices.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from checkpoint_storage_bench.claim_dir import ensure_writable_dir
from checkpoint_storage_bench.config_cli import cli, flag
from checkpoint_storage_bench.contract import DATA_FORMATS, DATA_LOADERS, LOADER_FORMATS
from checkpoint_storage_bench.units import parse_size
from data_workloads.errors import ConfigError, DataDirError
from data_workloads.scratch import remove_stale

DatasetFormat = Literal["webdataset", "files", "parquet", "mds"]
assert get_args(DatasetFormat) == DATA_FORMATS
Loader = Literal["ours", "webdataset", "streaming", "arrow", "torch"]
assert get_args(Loader) == DATA_LOADERS
Codec = Literal["none", "zlib"]

MIN_RECORD_BYTES = 3 * 8 * 8
MAX_WORKERS = 64
MAX_ITEM_BYTES = 1024**3
"""The most bytes of one record or one notebook: each is made in memory whole (and an
image or a notebook of more is not one a workload reads)."""
MAX_FILES = 1_000_000
MAX_MDS_SHARD_BYTES = 2**32 - 2**20
"""An MDS shard's offsets are 32-bit: a shard, its header included, stays below 4 GiB."""

_SIZE = cli(click_type=str, metavar="SIZE")


@dataclass
class CommonConfig:
    """What every workload needs."""

    data_dir: Path
    """Directory on the mounted claim that holds the generated dataset and the workload's
    scratch files; nothing outside it is written or deleted. Created when missing, but its
    parent must exist: a missing parent means the claim is not mounted."""

    storage_profile: str = field(default="unlabelled", metadata=cli(envvar="STORAGE_PROFILE"))
    """Record label of the volume profile (the claim's VolumeAttributesClass); it does not
    change the volume."""

    summary_json: Path | None = None
    """Write the run's figures to this JSON file."""

    seed: int = 0
    """Seed of the generated data (and of the shuffle order)."""

    track: bool = True
    """Record the run with Polyaxon tracking (the current run inside Polyaxon, else an
    offline run)."""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.summary_json is not None:
            self.summary_json = Path(self.summary_json)
        if not self.storage_profile:
            raise ConfigError("--storage-profile must not be empty")
        if self.seed < 0:
            raise ConfigError(f"--seed must not be negative, got {self.seed}")

    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{flag(name)} must be positive, got {value}")

    def _size(self, name: str, minimum: int = 1, maximum: int | None = None) -> None:
        try:
            value = parse_size(getattr(self, name))
        except ValueError as exc:
            raise ConfigError(f"{flag(name)}: {exc}") from None
        if value < minimum:
            raise ConfigError(f"{flag(name)} must be at least {minimum} bytes, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{flag(name)} must be at most {maximum} bytes, got {value}")
        setattr(self, name, value)

    def check_data_dir(self) -> None:
        """Fail early, before anything is generated or measured, when the data directory is
        unusable; then remove the scratch that runs stopped without cleaning up left there
        (only what is provably abandoned: :mod:`data_workloads.scratch`)."""
        ensure_writable_dir(self.data_dir, "data dir", DataDirError)
        self._check_summary_json()
        for path in remove_stale(self.data_dir):
            logging.getLogger(__name__).warning("removed %s, left by a run that is gone", path)

    def _check_summary_json(self) -> None:
        """A summary path that can never be written is found before the measurement, not
        after it: an existing directory, or a path under a file."""
        path = self.summary_json
        if path is None:
            return
        if path.is_dir():
            raise ConfigError(f"--summary-json {path} is a directory; give a file's path")
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise ConfigError(f"--summary-json {path}: {parent} is not a directory")

    def record(self) -> dict[str, Any]:
        """The settings as plain JSON values (the run's inputs and the summary's config)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


@dataclass
class DatasetConfig(CommonConfig):
    """A workload that reads the generated dataset."""

    dataset_format: DatasetFormat = "webdataset"
    """webdataset: tar shards, each sample a .json header and a .u8 (or .u8.zlib) payload,
    read shard by shard; files: one file per record in a directory tree, read in random
    order; parquet: Parquet files (pyarrow) in row groups of --row-group-size; mds:
    MosaicML Streaming's MDS shards (its MDSWriter). parquet and mds need the formats
    extra."""

    codec: Codec = "none"
    """How a record's image is stored: none (its bytes: decoding is parsing the header,
    verifying the CRC32 and a tensor over the bytes read, cheap enough that the volume is
    measured, not the loader's CPU) or zlib (compressed: inflating is CPU work in every
    read, like decoding a JPEG; the dataset is smaller on the volume)."""

    dataset_size: int | str = field(default="64MiB", metadata=_SIZE)
    """Decoded bytes of the whole dataset (records x record size); on the volume it takes
    that plus the headers, or less with --codec zlib."""

    record_size: int | str = field(default="64KiB", metadata=_SIZE)
    """Decoded bytes of one record (a 3 x H x W uint8 image, H = W)."""

    shard_size: int | str = field(default="16MiB", metadata=_SIZE)
    """webdataset, parquet: decoded bytes per tar shard or Parquet file (whole records, at
    least one); mds: bytes per shard on the volume (the writer's size limit)."""

    row_group_size: int | str = field(default="1MiB", metadata=_SIZE)
    """parquet: decoded bytes per row group (whole records, at least one; at most a
    file's): what a reader reads and decodes at once."""

    generate: bool = True
    """Generate the dataset when the data dir has none (and reuse it afterwards); with
    --no-generate a missing dataset is an error (exit 4)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dataset_format not in DATA_FORMATS:
            raise ConfigError(
                f"unknown --dataset-format {self.dataset_format!r}; choose from "
                f"{', '.join(DATA_FORMATS)}"
            )
        if self.codec not in get_args(Codec):
            raise ConfigError(
                f"unknown --codec {self.codec!r}; choose from {', '.join(get_args(Codec))}"
            )
        self._size("record_size", MIN_RECORD_BYTES, MAX_ITEM_BYTES)
        self._size("dataset_size", self.record_size)
        self._size("shard_size", self.record_size)
        self._size("row_group_size", self.record_size)
        if self.dataset_format == "mds" and self.shard_size > MAX_MDS_SHARD_BYTES:
            raise ConfigError(
                f"--shard-size must be at most {MAX_MDS_SHARD_BYTES} bytes for mds (its "
                f"offsets are 32-bit), got {self.shard_size}"
            )


@dataclass
class ScanConfig(DatasetConfig):
    """Read the dataset as a training input pipeline does."""

    loader: Loader = "ours"
    """What reads the dataset: ours (every format: each worker reads records straight into
    batch slots in shared memory) or the library a team would use on its format:
    webdataset (the webdataset package, tar shards), streaming (MosaicML's
    StreamingDataset, mds), arrow (pyarrow's Parquet batches, as Hugging Face datasets
    streams Parquet), torch (a map-style torch Dataset, files). The same DataLoader
    settings, compute step and figures for each."""

    epochs: int = 2
    """Epochs over the whole dataset, each in a fresh shuffle order; the second one shows
    whether the page cache was kept out."""

    num_workers: int = 2
    """DataLoader worker processes (0: load in the main process)."""

    batch_size: int = 16
    """Records per batch."""

    prefetch_factor: int = 2
    """Batches each worker loads ahead."""

    shuffle_buffer: int = 64
    """webdataset: each worker shuffles its samples within windows of this many (the shards
    are shuffled too)."""

    compute_ms: float = 10.0
    """Emulated accelerator time per batch, in milliseconds (the training step the batch
    feeds); accelerator utilization is compute time / wall time. 0: measure the loader alone."""

    min_au: float = 0.9
    """Accelerator utilization that counts as enough (MLPerf Storage: 90 %)."""

    drop_cache: bool = True
    """posix_fadvise(DONTNEED) on every file of the dataset before each epoch, so that the
    figures come from the volume, not from the page cache."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loader not in DATA_LOADERS:
            raise ConfigError(
                f"unknown --loader {self.loader!r}; choose from {', '.join(DATA_LOADERS)}"
            )
        if self.dataset_format not in LOADER_FORMATS[self.loader]:
            readers = [n for n, fmts in LOADER_FORMATS.items() if self.dataset_format in fmts]
            raise ConfigError(
                f"--loader {self.loader} does not read --dataset-format {self.dataset_format}; "
                f"its loaders are {', '.join(readers)}"
            )
        self._positive("epochs", "batch_size", "prefetch_factor", "shuffle_buffer")
        if not 0 <= self.num_workers <= MAX_WORKERS:
            raise ConfigError(f"--num-workers must be 0 to {MAX_WORKERS}, got {self.num_workers}")
        if not (math.isfinite(self.compute_ms) and self.compute_ms >= 0):
            raise ConfigError(f"--compute-ms must be 0 or more, got {self.compute_ms}")
        if not 0 < self.min_au <= 1:
            raise ConfigError(f"--min-au must be in (0, 1], got {self.min_au}")


@dataclass
class MaterializeConfig(DatasetConfig):
    """Build a preprocessed cache from the dataset."""

    output_shard_size: int | str = field(default="16MiB", metadata=_SIZE)
    """Bytes of transformed records per output tar shard (each shard fsynced when full)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._size("output_shard_size", 1)


@dataclass
class WorkspaceConfig(CommonConfig):
    """A notebook workspace's saves."""

    files: int = 200
    """Notebook files in the workspace."""

    file_size: int | str = field(default="16KiB", metadata=_SIZE)
    """Bytes of one notebook file."""

    rounds: int = 3
    """Autosave rounds: each saves every file, lists the tree and reopens every file."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("files", "rounds")
        if self.files > MAX_FILES:
            raise ConfigError(f"--files must be at most {MAX_FILES}, got {self.files}")
        self._size("file_size", 1, MAX_ITEM_BYTES)
