"""``python -m trainer``: parse → :class:`TrainConfig` → :func:`trainer.commands.run_job`.

The options are generated from :class:`TrainConfig`'s fields (type, default, docstring), so
the config is the one place a setting is declared. Errors are
:class:`trainer.errors.TrainerError`, which click maps to their exit codes
(:data:`trainer.errors.EXIT_CODES`, listed in ``--help``).
"""

from __future__ import annotations

import logging
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import click

from checkpoint_storage_bench.errors import exit_codes_help
from trainer.config import TrainConfig, field_docs, flag
from trainer.errors import EXIT_CODES
from trainer.preflight import check_before_training

F = TypeVar("F", bound=Callable[..., Any])


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """The click type of a field's annotation, and whether None is allowed."""
    args = typing.get_args(annotation)
    optional = (
        typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args
    )
    if optional:
        (annotation,) = [a for a in args if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return click.Choice(typing.get_args(annotation)), optional
    if annotation is Path:
        return click.Path(path_type=Path), optional
    if annotation in (int, float, str, bool):
        return annotation, optional
    raise TypeError(f"no click type for {annotation!r}: give the field cli(click_type=...)")


def option_for(f: Field, annotation: Any, doc: str) -> Callable[[F], F]:
    """The click option of one config field."""
    extra = f.metadata.get("cli", {})
    click_type = extra.get("type") or _click_type(annotation)[0]
    kwargs: dict[str, Any] = {"help": doc}
    if f.default is MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = f.default
        kwargs["show_default"] = f.default is not None
    if click_type is bool:
        decl = extra.get("flag") or f"{flag(f.name)}/--no-{f.name.replace('_', '-')}"
    else:
        decl = extra.get("flag") or flag(f.name)
        kwargs["type"] = click_type
    if extra.get("envvar"):
        kwargs.update(envvar=extra["envvar"], show_envvar=True)
    if extra.get("metavar"):
        kwargs["metavar"] = extra["metavar"]
    if extra.get("flag_value") is not None:
        # An option whose value may be left out: click then takes flag_value.
        kwargs.update(is_flag=False, flag_value=extra["flag_value"])
    return click.option(decl, f.name, **kwargs)


def config_options(cls: type) -> Callable[[F], F]:
    """Decorate a click command with one option per field of the dataclass ``cls``.

    Raises:
        TypeError: A field has no docstring (every option has help text) or a type click
            cannot take without ``cli(click_type=...)``.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)

    def decorate(fn: F) -> F:
        for f in reversed(fields(cls)):
            if not docs.get(f.name):
                raise TypeError(f"{cls.__name__}.{f.name} has no docstring (its --help text)")
            fn = option_for(f, hints[f.name], docs[f.name])(fn)
        return fn

    return decorate


@click.command(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=exit_codes_help(EXIT_CODES),
)
@config_options(TrainConfig)
def main(**settings: Any) -> None:
    """Train a small transformer and time every checkpoint stage on the mounted volume."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = TrainConfig(**settings)
    check_before_training(cfg, lambda line: click.echo(line, err=True))  # before torch, tracking
    from trainer.commands import run_job  # torch is slow to import: not for --help

    run_job(cfg)
