"""--checkpoint-timeout has a bound (a week), refused above and shown in --help."""

from __future__ import annotations

import math

import pytest

from tests.trainer.helpers import run_trainer
from trainer.config import MAX_CHECKPOINT_TIMEOUT_S, TrainConfig
from trainer.errors import (
    EXIT_USAGE,
    ConfigError,
)


@pytest.mark.parametrize("value", [math.inf, math.nan, MAX_CHECKPOINT_TIMEOUT_S + 1, 1e300])
def test_checkpoint_timeout_out_of_bounds_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="--checkpoint-timeout must be positive and at most"):
        TrainConfig(checkpoint_dir=tmp_path, checkpoint_timeout=value)
    TrainConfig(checkpoint_dir=tmp_path, checkpoint_timeout=MAX_CHECKPOINT_TIMEOUT_S)


def test_cli_refuses_an_infinite_checkpoint_timeout_and_shows_the_bound(tmp_path):
    proc = run_trainer("--checkpoint-dir", str(tmp_path), "--checkpoint-timeout", "inf")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "--checkpoint-timeout must be positive and at most" in proc.stderr
    help_text = " ".join(run_trainer("--help").stdout.split())
    assert f"At most {MAX_CHECKPOINT_TIMEOUT_S}" in help_text
