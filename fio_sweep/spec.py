"""Sweep specs: YAML files listing fio cases, with a matrix form that expands into several.

A spec looks like::

    defaults: {ioengine: libaio, direct: true, runtime: 60}
    overhead_case: seqwrite_1m        # the case repeated on --reference-dir
    cases:
      - {name: seqwrite_1m, rw: write, bs: 1M, size: 4G, end_fsync: true}
      - name: ckpt_{bs}_qd{iodepth}   # one case per combination
        rw: write
        matrix: {bs: [1M, 8M], iodepth: [1, 16]}

Every value is validated here, so the fio command line is built from known-good values only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from checkpoint_storage_bench.contract import output_key
from checkpoint_storage_bench.units import format_bytes, parse_size
from fio_sweep.errors import SpecError

READ_WRITE = ("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw")
ENGINES = ("libaio", "io_uring", "psync", "sync", "pvsync", "pvsync2", "posixaio", "mmap")
SYNC_ENGINES = ("psync", "sync", "pvsync", "pvsync2", "mmap")
FALLOCATE = ("none", "native", "posix", "keep")
MAX_BLOCK = 256 * 1024**2
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Each top-level key and the YAML type it must have (a list where a name is expected
# would otherwise surface later as a TypeError, far from the spec).
_SPEC_TYPES: dict[str, tuple[type, str]] = {
    "description": (str, "a string"),
    "defaults": (dict, "a mapping"),
    "overhead_case": (str, "a case name"),
    "cases": (list, "a non-empty list"),
}
SHIPPED_DIR = "specs"
DEFAULT_SPEC = "default"


@dataclass(frozen=True)
class Case:
    """One fio job. Sizes are bytes; ``size`` is per job, as in fio (numjobs files)."""

    name: str
    rw: str
    bs: int = 1024**2
    size: int = 1024**3
    iodepth: int = 1
    numjobs: int = 1
    direct: bool = True
    ioengine: str = "libaio"
    runtime: int = 60
    time_based: bool = False
    end_fsync: bool = False
    ramp_time: int = 0
    rwmixread: int | None = None
    fallocate: str | None = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"case {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SpecError(
                f"case name {self.name!r} must be 1-64 letters, digits, '_', '.' or '-'"
            )
        _choice(where, "rw", self.rw, READ_WRITE)
        _choice(where, "ioengine", self.ioengine, ENGINES)
        if self.fallocate is not None:
            _choice(where, "fallocate", self.fallocate, FALLOCATE)
        _int(where, "bs", self.bs, 1, MAX_BLOCK)
        _int(where, "size", self.size, 1, None)
        _int(where, "iodepth", self.iodepth, 1, 4096)
        _int(where, "numjobs", self.numjobs, 1, 256)
        _int(where, "runtime", self.runtime, 1, 7 * 24 * 3600)
        _int(where, "ramp_time", self.ramp_time, 0, 3600)
        if self.rwmixread is not None:
            _int(where, "rwmixread", self.rwmixread, 0, 100)
        for key in ("direct", "time_based", "end_fsync"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"{where}: {key} must be true or false")
        if not isinstance(self.description, str):
            raise SpecError(f"{where}: description must be a string, got {self.description!r}")
        if self.size < self.bs:
            raise SpecError(
                f"{where}: size {format_bytes(self.size)} is smaller than bs "
                f"{format_bytes(self.bs)}"
            )
        if self.direct and self.bs % 512:
            raise SpecError(f"{where}: direct=1 needs bs to be a multiple of 512 bytes")

    @property
    def bytes_needed(self) -> int:
        """Space the case's files take: fio makes one file of ``size`` per job."""
        return self.size * self.numjobs

    @property
    def output_key(self) -> str:
        """The case name as it appears in Polyaxon output names (``.`` and ``-`` → ``_``)."""
        return output_key(self.name)

    def scaled(self, size_scale: float = 1.0, runtime: int | None = None) -> Case:
        """A copy with the size scaled (whole blocks, at least one) and the runtime replaced."""
        size = max(self.bs, int(self.size * size_scale) // self.bs * self.bs)
        return dataclasses.replace(self, size=size, runtime=runtime or self.runtime)

    def fio_args(self) -> list[str]:
        """This case's fio options; the caller adds the target, output format and engine."""
        args = [
            f"--name={self.name}",
            f"--rw={self.rw}",
            f"--bs={self.bs}",
            f"--size={self.size}",
            f"--iodepth={self.iodepth}",
            f"--numjobs={self.numjobs}",
            f"--direct={int(self.direct)}",
            f"--ioengine={self.ioengine}",
            f"--runtime={self.runtime}",
            f"--ramp_time={self.ramp_time}",
        ]
        if self.time_based:
            args.append("--time_based=1")
        if self.end_fsync:
            args.append("--end_fsync=1")
        if self.rwmixread is not None:
            args.append(f"--rwmixread={self.rwmixread}")
        if self.fallocate is not None:
            args.append(f"--fallocate={self.fallocate}")
        return args

    def to_dict(self) -> dict[str, Any]:
        """The case's settings for the summary JSON."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "description"}


CASE_KEYS = {f.name for f in dataclasses.fields(Case)}
_SIZE_KEYS = {"bs", "size"}
_BOOL_KEYS = {"direct", "time_based", "end_fsync"}


@dataclass(frozen=True)
class Spec:
    """A loaded sweep: its source, the expanded cases and the overhead-check case."""

    source: str
    cases: tuple[Case, ...]
    overhead_case: str

    def __post_init__(self) -> None:
        if not self.cases:
            raise SpecError(f"{self.source}: no cases")
        seen: dict[str, str] = {}
        for case in self.cases:
            if case.output_key in seen:
                raise SpecError(
                    f"{self.source}: cases {seen[case.output_key]!r} and {case.name!r} have "
                    f"the same output name {case.output_key!r}"
                )
            seen[case.output_key] = case.name
        if self.overhead_case not in {c.name for c in self.cases}:
            raise SpecError(f"{self.source}: overhead_case {self.overhead_case!r} is not a case")

    def case(self, name: str) -> Case:
        return next(c for c in self.cases if c.name == name)

    def scaled(self, size_scale: float = 1.0, runtime: int | None = None) -> Spec:
        cases = tuple(c.scaled(size_scale, runtime) for c in self.cases)
        return dataclasses.replace(self, cases=cases)

    def with_case(self, case: Case) -> Spec:
        """The spec with one more case at the end (refused if its name is taken)."""
        return dataclasses.replace(self, cases=(*self.cases, case))


WRITERS_CASE = "ckptwriters"
WRITERS_TOTAL = 2 * 1024**3
WRITERS_BS = 8 * 1024**2
MAX_WRITERS = 256


def writers_case(writers: int) -> Case:
    """N writers like N ranks each writing its own shard of one checkpoint.

    ``numjobs=N`` processes, one new file each (fio's default for clones), O_DIRECT,
    8 MiB writes with four in flight per writer (as the trainer's writer does), fsynced at
    the end; 2 GiB in all, split evenly (``size`` is per job), before ``--size-scale``.

    Raises:
        SpecError: ``writers`` is not between 1 and 256.
    """
    if isinstance(writers, bool) or not isinstance(writers, int) or not 1 <= writers <= MAX_WRITERS:
        raise SpecError(f"--writers must be between 1 and {MAX_WRITERS}, got {writers!r}")
    per_writer = max(WRITERS_BS, WRITERS_TOTAL // writers // WRITERS_BS * WRITERS_BS)
    return Case(
        name=WRITERS_CASE,
        rw="write",
        bs=WRITERS_BS,
        size=per_writer,
        iodepth=4,
        numjobs=writers,
        direct=True,
        end_fsync=True,
        fallocate="none",
        description=f"{writers} parallel checkpoint writers, one file each",
    )


def shipped_specs() -> dict[str, Path]:
    """The specs shipped in ``fio_sweep/specs``, by name (file name without .yaml)."""
    folder = resources.files("fio_sweep") / SHIPPED_DIR
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def load_spec(spec: str | Path | None = None) -> Spec:
    """Load a spec from a YAML path, or a shipped spec by name (default: ``default``).

    Raises:
        SpecError: The file is missing, not YAML, or any case is invalid.
    """
    shipped = shipped_specs()
    text = str(spec) if spec is not None else DEFAULT_SPEC
    path = shipped[text] if text in shipped else Path(text)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        names = ", ".join(sorted(shipped))
        raise SpecError(f"cannot read spec {text}: {exc.strerror} (shipped: {names})") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"spec {path} is not valid YAML: {exc}") from exc
    return parse_spec(raw, source=str(path))


def parse_spec(raw: Any, source: str = "<spec>") -> Spec:
    """Validate a spec's parsed YAML and expand its matrix cases."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a spec is a mapping with a 'cases' list")
    _no_unknown(source, raw, set(_SPEC_TYPES))
    for key, (kind, what) in _SPEC_TYPES.items():
        value = raw.get(key)
        if value is not None and not isinstance(value, kind):
            raise SpecError(f"{source}: {key!r} must be {what}, got {value!r}")
    defaults = raw.get("defaults") or {}
    _no_unknown(f"{source}: defaults", defaults, CASE_KEYS - {"name"})
    cases_raw = raw.get("cases")
    if not cases_raw:
        raise SpecError(f"{source}: 'cases' must be a non-empty list")
    cases: list[Case] = []
    for i, item in enumerate(cases_raw):
        if not isinstance(item, dict):
            raise SpecError(f"{source}: case #{i + 1} must be a mapping")
        for expanded in expand_matrix({**defaults, **item}, where=f"{source}: case #{i + 1}"):
            cases.append(case_from_mapping(expanded, where=f"{source}: case #{i + 1}"))
    overhead = raw.get("overhead_case", cases[0].name)
    return Spec(source=source, cases=tuple(cases), overhead_case=overhead)


def expand_matrix(item: dict[str, Any], where: str = "case") -> list[dict[str, Any]]:
    """Expand ``matrix: {key: [values]}`` into one mapping per combination.

    The name may hold ``{key}`` placeholders; without them ``_<key><value>`` is appended per
    matrix key. Values appear lower-case in names (``1M`` → ``1m``).
    """
    matrix = item.get("matrix")
    if matrix is None:
        return [{k: v for k, v in item.items() if k != "matrix"}]
    if not isinstance(matrix, dict) or not matrix:
        raise SpecError(f"{where}: 'matrix' must map option names to lists of values")
    _no_unknown(f"{where}: matrix", matrix, CASE_KEYS - {"name", "description"})
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: matrix {key!r} must be a non-empty list")
    base = {k: v for k, v in item.items() if k != "matrix"}
    name = str(base.get("name", ""))
    if "{" not in name:
        name += "".join(f"_{key}{{{key}}}" for key in matrix)
    expanded = []
    for combo in itertools.product(*matrix.values()):
        values = dict(zip(matrix, combo, strict=True))
        labels = {k: str(v).lower() for k, v in values.items()}
        try:
            case_name = name.format_map(labels)
        except (KeyError, ValueError, IndexError, AttributeError, TypeError) as exc:
            # Only plain {key} placeholders fit; {bs.x} or {bs[x]} fail on the value itself.
            raise SpecError(f"{where}: name template {name!r} does not fit the matrix") from exc
        expanded.append({**base, **values, "name": case_name})
    return expanded


def case_from_mapping(item: dict[str, Any], where: str = "case") -> Case:
    """Build a case from YAML values, turning sizes like ``4k`` into bytes."""
    name = item.get("name")
    where = f"case {name!r}" if name else where
    _no_unknown(where, item, CASE_KEYS)
    if "rw" not in item or not name:
        raise SpecError(f"{where}: 'name' and 'rw' are required")
    values: dict[str, Any] = {}
    for key, value in item.items():
        if key in _SIZE_KEYS:
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise SpecError(f"{where}: {key} must be a size like 4k or 1G, got {value!r}")
            if str(value).strip().startswith("-"):
                raise SpecError(f"{where}: {key} must not be negative, got {value!r}")
            try:
                value = parse_size(value)
            except ValueError as exc:
                raise SpecError(f"{where}: {key}: {exc}") from exc
        elif key in _BOOL_KEYS and value in (0, 1) and not isinstance(value, bool):
            value = bool(value)  # fio's own spelling: direct=1
        values[key] = value
    return Case(**values)


def _no_unknown(where: str, mapping: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(map(str, mapping)) - allowed)
    if unknown:
        raise SpecError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
        )


def _choice(where: str, key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"{where}: {key} must be one of {', '.join(allowed)}, got {value!r}")


def _int(where: str, key: str, value: Any, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: {key} must be a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise SpecError(f"{where}: {key} must be {bound}, got {value}")


def check_scale(size_scale: float, runtime: int | None) -> None:
    """Validate the CLI's --size-scale and --runtime."""
    if not math.isfinite(size_scale) or size_scale <= 0:
        raise SpecError(f"--size-scale must be a positive number, got {size_scale}")
    if runtime is not None and runtime < 1:
        raise SpecError(f"--runtime must be at least 1 second, got {runtime}")
