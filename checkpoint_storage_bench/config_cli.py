"""A click command's options generated from a settings dataclass.

A part declares its settings once, as a dataclass whose fields are typed (a ``Literal`` is a
closed set of choices) and documented by the string right below each field. The options of
its CLI come from there: name, type, default, help text. One mechanism for every part (the
trainer's ``TrainConfig``, the data workloads' configs), inherited fields included (a
subcommand's settings may extend a common base).
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def cli(
    *,
    flag: str | tuple[str, ...] | None = None,
    envvar: str | None = None,
    metavar: str | None = None,
    click_type: Any = None,
    flag_value: Any = None,
    multiple: bool = False,
    option: bool = True,
    show_envvar: bool = True,
    help_values: Callable[[], dict[str, Any]] | None = None,
    argument: bool = False,
) -> dict[str, Any]:
    """Field metadata for the generated click option, where the field alone does not say it.

    Args:
        flag: The option's declaration when it is not ``--<field-name>``: one spelling, or
            several (``("-n", "--namespace")``). A ``bool`` field declared without a
            ``/--off`` spelling is an on-switch (``--force``).
        envvar: An environment variable that supplies the value.
        metavar: What ``--help`` shows for the value.
        click_type: The click type when the field's own type is not what the user types.
        flag_value: The value of the option given without one.
        multiple: The option may be repeated; the field (a tuple) gets every value given.
        option: False for a setting the program fills in (a retry schedule, a seam for
            tests): no command-line option.
        show_envvar: False where the help text already names ``envvar`` itself.
        help_values: Values for the ``{name}`` fields of the docstring, for a help text that
            quotes what is declared elsewhere (a default that depends on another option, the
            names of shipped files).
        argument: The field is a positional argument, not an option (with ``multiple``:
            any number of them, ``[NAME]...``). click shows no help text for an argument:
            the command's docstring names it.
    """
    return {
        "cli": {
            "flag": flag,
            "envvar": envvar,
            "metavar": metavar,
            "type": click_type,
            "flag_value": flag_value,
            "multiple": multiple,
            "option": option,
            "show_envvar": show_envvar,
            "help_values": help_values,
            "argument": argument,
        }
    }


def is_option(f: Field) -> bool:
    """Whether the field is a command-line option (:func:`cli` ``option=False``: it is not)."""
    return f.metadata.get("cli", {}).get("option", True)


def flag(name: str) -> str:
    """The command-line spelling of a field: ``num_workers`` → ``--num-workers``."""
    return "--" + name.replace("_", "-")


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right below it), as one line of text,
    base classes included (a subclass's own docstring wins).

    Python keeps no such attribute docstrings at run time, so they are read from the class
    source, as documentation tools do.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not hasattr(klass, "__dataclass_fields__"):
            continue
        (node,) = ast.parse(textwrap.dedent(inspect.getsource(klass))).body
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def _click_type(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        (annotation,) = [a for a in args if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return click.Choice(typing.get_args(annotation))
    if annotation is Path:
        return click.Path(path_type=Path)
    if annotation in (int, float, str, bool):
        return annotation
    raise TypeError(f"no click type for {annotation!r}: give the field cli(click_type=...)")


def option_for(f: Field, annotation: Any, doc: str) -> Callable[[F], F]:
    """The click option (or positional argument) of one dataclass field."""
    extra = f.metadata.get("cli", {})
    click_type = extra.get("type") or _click_type(annotation)
    if extra.get("argument"):
        return _argument_for(f, click_type, extra)
    if extra.get("help_values"):
        doc = doc.format(**extra["help_values"]())
    kwargs: dict[str, Any] = {"help": doc}
    if f.default is MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = f.default
        kwargs["show_default"] = f.default is not None
    given = extra.get("flag")
    decls = (given,) if isinstance(given, str) else tuple(given or ())
    if click_type is bool:
        decls = decls or (f"{flag(f.name)}/--no-{f.name.replace('_', '-')}",)
        if not any("/" in d for d in decls):
            kwargs["is_flag"] = True
    else:
        decls = decls or (flag(f.name),)
        kwargs["type"] = click_type
    if extra.get("envvar"):
        kwargs.update(envvar=extra["envvar"], show_envvar=extra.get("show_envvar", True))
    if extra.get("metavar"):
        kwargs["metavar"] = extra["metavar"]
    if extra.get("flag_value") is not None:
        kwargs.update(is_flag=False, flag_value=extra["flag_value"])
    if extra.get("multiple"):
        kwargs.update(multiple=True, show_default=False)
    return click.option(*decls, f.name, **kwargs)


def _argument_for(f: Field, click_type: Any, extra: dict[str, Any]) -> Callable[[F], F]:
    kwargs: dict[str, Any] = {"type": click_type, "required": f.default is MISSING}
    if extra.get("multiple"):
        kwargs["nargs"] = -1
    elif f.default is not MISSING:
        kwargs["default"] = f.default
    if extra.get("metavar"):
        kwargs["metavar"] = extra["metavar"]
    return click.argument(f.name, **kwargs)


class FiniteFloat(click.ParamType):
    """A float that is finite and within bounds: click's FloatRange lets ``nan`` through
    (every comparison with NaN is false) and ``inf`` through an open upper bound.

    >>> FiniteFloat(0, 1).convert("0.5", None, None)
    0.5
    """

    name = "float"

    def __init__(self, low: float = 0.0, high: float = math.inf, high_open: bool = False):
        self.low, self.high, self.high_open = low, high, high_open

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):  # noqa: ANN201
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        above = number >= self.high if self.high_open else number > self.high
        if not math.isfinite(number) or number < self.low or above:
            bound = f"{self.low:g} ≤ x {'<' if self.high_open else '≤'} {self.high:g}"
            self.fail(f"{value!r} is not a finite number with {bound}", param, ctx)
        return number


def config_options(cls: type) -> Callable[[F], F]:
    """Decorate a click command with one option per field of the dataclass ``cls``.

    Raises:
        TypeError: A field has no docstring (every option has help text) or a type click
            cannot take without ``cli(click_type=...)``.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)

    def decorate(fn: F) -> F:
        for f in reversed([f for f in fields(cls) if is_option(f)]):
            if not docs.get(f.name):
                raise TypeError(f"{cls.__name__}.{f.name} has no docstring (its --help text)")
            fn = option_for(f, hints[f.name], docs[f.name])(fn)
        return fn

    return decorate


OutputFormat = Literal["text", "json"]
OUTPUT_FORMATS: tuple[str, ...] = typing.get_args(OutputFormat)
"""What a command that shows a state prints: the readable block, or JSON for a program."""


@dataclass(kw_only=True)
class Output:
    """The setting of a command that prints a state: ``-o/--output text|json`` (the one
    meaning of "JSON" on our CLIs that print: ``--json PATH`` elsewhere always names a file
    to write). A command's settings take it as a base; :func:`output_option` adds it alone."""

    output: OutputFormat = field(default="text", metadata=cli(flag=("-o", "--output")))
    """What to print: the readable block, or JSON for a program."""

    @property
    def as_json(self) -> bool:
        """Print JSON for a program instead of the readable block."""
        return self.output == "json"


def output_option(fn: F) -> F:
    """:class:`Output`'s option for a command without a settings dataclass; the command gets
    ``as_json``.

    >>> @click.command()
    ... @output_option
    ... def show(as_json: bool) -> None:
    ...     click.echo("json" if as_json else "text")
    >>> from click.testing import CliRunner
    >>> [CliRunner().invoke(show, a).output for a in ([], ["-o", "json"])]
    ['text\\n', 'json\\n']
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, output: str, **kwargs: Any) -> Any:
        return fn(*args, as_json=Output(output=output).as_json, **kwargs)  # type: ignore[arg-type]

    return config_options(Output)(wrapper)  # type: ignore[return-value]
