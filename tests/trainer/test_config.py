"""TrainConfig is the one source of the trainer's options: the CLI is generated from it."""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, dataclass, fields

import click
import pytest
import torch
from click.testing import CliRunner

from checkpoint_storage_bench.config_cli import config_options, field_docs, flag
from checkpoint_storage_bench.errors import BenchError
from checkpoint_storage_bench.retry import Backoff
from trainer import cli
from trainer.ckpt import formats
from trainer.ckpt.upload import Uploader
from trainer.config import FORMATS, TrainConfig
from trainer.errors import EXIT_CODES, ConfigError, TrainerError, UploadError


def options() -> dict[str, click.Option]:
    return {p.name: p for p in cli.main.params if isinstance(p, click.Option) and p.name != "help"}


def test_every_field_is_an_option_with_its_docstring_as_help():
    opts, docs = options(), field_docs(TrainConfig)
    assert list(opts) == [f.name for f in fields(TrainConfig)]
    for f in fields(TrainConfig):
        assert docs[f.name], f.name
        assert opts[f.name].help == docs[f.name]
        assert opts[f.name].required == (f.default is MISSING)
        if f.default is not MISSING:
            assert opts[f.name].default == f.default, f.name


def test_choices_come_from_the_literal_types():
    hints = typing.get_type_hints(TrainConfig)
    opts = options()
    for name in ("device", "format", "durability"):
        assert typing.get_origin(hints[name]) is typing.Literal
        assert tuple(opts[name].type.choices) == typing.get_args(hints[name])


def test_a_field_without_a_docstring_is_refused():
    @dataclass
    class Undocumented:
        documented: int = 1
        """Has help."""

        bare: int = 2

    with pytest.raises(TypeError, match="Undocumented.bare has no docstring"):
        config_options(Undocumented)(lambda **kw: None)


def test_help_lists_every_option_and_the_exit_codes():
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    for f in fields(TrainConfig):
        assert flag(f.name) in result.output or f.name == "async_checkpoint", f.name
    assert "--async / --sync" in result.output
    assert "[env var: STORAGE_PROFILE" in result.output
    assert "Exit codes:" in result.output
    for code, text in EXIT_CODES.items():
        assert f"{code} {' '.join(text.split())}" in " ".join(result.output.split()), code


def test_every_error_has_a_listed_exit_code():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    errors = list(subclasses(TrainerError))
    assert errors and all(issubclass(e, BenchError) for e in errors)
    assert {e.exit_code for e in errors} <= set(EXIT_CODES)
    assert TrainerError.prog == "trainer"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps must be positive"),
        (["--lr", "nan"], "--lr must be a positive number"),
        (["--keep", "0"], "--keep must be at least 1"),
        (["--model-size", "1k"], "--model-size must be at least 124800 bytes at --seq-len 64"),
        (["--model-size", "64KiB"], "--model-size must be at least 124800 bytes at --seq-len 64"),
        (["--batch-size", str(2**70)], f"--batch-size {2**70} x --seq-len 64 tokens a step"),
        (["--seq-len", str(2**70)], f"--batch-size 8 x --seq-len {2**70} tokens a step"),
        (["--seed", str(2**64)], "--seed must be between"),
        (["--seed", str(-(2**63) - 1)], "--seed must be between"),
    ],
)
def test_a_config_error_exits_2_with_the_programs_name(tmp_path, args, message):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    result = CliRunner().invoke(cli.main, ["--checkpoint-dir", str(ckpt_dir), *args])
    assert result.exit_code == 2, result.output
    assert f"trainer: error: {message}" in result.output
    assert list(ckpt_dir.iterdir()) == []


def test_config_validates_without_the_cli(tmp_path):
    with pytest.raises(ConfigError, match="unknown --format 'zip'"):
        TrainConfig(checkpoint_dir=tmp_path, format="zip")
    cfg = TrainConfig(checkpoint_dir=str(tmp_path), model_size="1MiB", summary_json="s.json")
    assert cfg.model_size == 2**20
    assert cfg.record()["summary_json"] == "s.json"


class Refusing:
    """A store that refuses every write as a missing bucket would."""

    calls = 0

    def makedirs(self, path, exist_ok=False):
        Refusing.calls += 1
        raise FileNotFoundError(f"bucket of {path} does not exist")


def test_upload_retries_are_data_and_a_missing_bucket_is_not_retried(tmp_path):
    slept: list[float] = []
    uploader = Uploader(
        f"file://{tmp_path}/store", backoff=Backoff(delays=(0.25, 0.5)), sleep=slept.append
    )
    uploader.fs = Refusing()
    with pytest.raises(UploadError, match="does not exist"):
        uploader.upload(tmp_path, ["x"])
    assert Refusing.calls == 1 and slept == []

    class Flaky(Refusing):
        def makedirs(self, path, exist_ok=False):
            Refusing.calls += 1
            raise ConnectionError("reset by peer")

    Refusing.calls = 0
    uploader.fs = Flaky()
    with pytest.raises(UploadError, match="failed after 3 attempts: ConnectionError"):
        uploader.upload(tmp_path, ["x"])
    assert Refusing.calls == 3 and slept == [0.25, 0.5]


@pytest.mark.parametrize("module", ["trainer.provenance", "trainer.progress"])
def test_doctests(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


def test_cpu_count_honours_a_cgroup_limit(monkeypatch, tmp_path):
    from trainer import provenance

    real_read = provenance.Path.read_text

    def cgroup(limit: str):
        def read_text(self, *args, **kwargs):
            if str(self) == "/sys/fs/cgroup/cpu.max":
                return limit
            return real_read(self, *args, **kwargs)

        return read_text

    monkeypatch.setattr(provenance.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(provenance.Path, "read_text", cgroup("150000 100000\n"))
    assert provenance.cpu_count() == 2  # limits.cpu 1.5, rounded up
    monkeypatch.setattr(provenance.Path, "read_text", cgroup("max 100000\n"))
    assert provenance.cpu_count() == 16


def test_the_format_choices_are_the_formats_the_trainer_makes():
    # The config must not import torch (the choices come before it), so it names the
    # formats itself; they must be exactly the table the writer makes them from.
    assert FORMATS == formats.FORMATS
    for name in FORMATS:
        assert formats.make_format(name).name == name
    with pytest.raises(ValueError, match="unknown checkpoint format 'zip'"):
        formats.make_format("zip")


@pytest.mark.parametrize("seed", [18446744073709, 1_764_806_400_123_456_789, 2**64 - 1])
def test_large_seeds_make_batches(seed):
    from trainer.model import SyntheticTokens

    data = SyntheticTokens(seed, batch_size=2, seq_len=16)
    assert data.batch(3).shape == (2, 17)
    assert torch.equal(data.batch(3), SyntheticTokens(seed, 2, 16).batch(3))  # deterministic


def test_batches_of_seeds_that_fitted_are_unchanged():
    from trainer.model import SyntheticTokens

    gen = torch.Generator().manual_seed(5 * 1_000_003 + 7)
    first = torch.randint(0, 256, (2,), generator=gen)
    assert torch.equal(SyntheticTokens(5, 2, 16).batch(7)[:, 0], first)


@pytest.mark.parametrize("where", ["under-a-file", "a-directory"])
def test_an_unwritable_summary_path_is_refused_before_training(tmp_path, where):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    summary = tmp_path / ("a-file/summary.json" if where == "under-a-file" else "a-dir")
    result = CliRunner().invoke(
        cli.main, ["--checkpoint-dir", str(ckpt_dir), "--summary-json", str(summary)]
    )
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith(f"trainer: error: --summary-json {summary}")
    assert list(ckpt_dir.iterdir()) == []  # nothing trained
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no probe left
    assert list((tmp_path / "a-dir").iterdir()) == []


def test_a_summary_that_cannot_be_renamed_into_place_leaves_no_temp_file(tmp_path):
    from trainer.summary import write_json_atomic

    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)  # appeared after the check
    with pytest.raises(OSError):
        write_json_atomic(out / "summary.json", {"a": 1})
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    write_json_atomic(out / "other.json", {"a": 1})
    assert json.loads((out / "other.json").read_text()) == {"a": 1}


@pytest.mark.parametrize("size", ["122KiB", "128KiB", "256KiB", "300KiB", "1MiB", "3MiB"])
@pytest.mark.parametrize("seq_len", [16, 64])
def test_the_model_fits_the_size_asked_for(size, seq_len):
    from checkpoint_storage_bench.units import parse_size
    from trainer.model import TinyGPT, shape_for_bytes
    from trainer.shape import smallest_model_bytes

    budget = parse_size(size)
    if budget < smallest_model_bytes(seq_len):
        with pytest.raises(ConfigError, match="--model-size must be at least"):
            TrainConfig(checkpoint_dir="x", model_size=size, seq_len=seq_len)
        return
    model = TinyGPT(shape_for_bytes(budget, seq_len), seq_len)
    built = sum(p.numel() for p in model.parameters()) * 4
    assert built <= budget
    assert built > budget / 2  # not a token model either
