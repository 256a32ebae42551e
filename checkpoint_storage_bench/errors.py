"""One error base for every CLI of the bundle, in the manner of click's ``ClickException``.

Each error class carries the exit code its CLI returns for it; click maps it to the exit in
one place (``main()`` in standalone mode prints :meth:`BenchError.show` and exits with
``exit_code``), so no CLI writes its own ``except X: echo; sys.exit()``. The exit codes of
every CLI are listed once, in each CLI's ``--help`` epilog and in docs/contracts.md.
"""

from __future__ import annotations

from typing import IO, Any

import click

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2


class BenchError(click.ClickException):
    """Base of every error a part reports to its user: a one-line message and an exit code.

    Attributes:
        exit_code: What the CLI exits with (class attribute; an instance may override it).
        prog: The program name printed before the message (set once per part).
    """

    exit_code = EXIT_UNEXPECTED
    prog = "checkpoint-storage-bench"

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{self.prog}: error: {self.format_message()}", err=True, file=file)


class BadInput(BenchError):
    """An argument or a file we were given cannot be used (exit 2, like click's usage errors)."""

    exit_code = EXIT_USAGE


def exit_codes_help(codes: dict[int, str]) -> str:
    """The ``Exit codes:`` epilog of a CLI's ``--help``, from one table.

    >>> print(exit_codes_help({0: "ok", 3: "refused"}))
    \b
    Exit codes:
      0  ok
      3  refused
    """
    # Codes like "128+N" widen the column for every line.
    width = max(3, *(len(str(code)) + 2 for code in codes))
    lines = [f"  {code!s:<{width}}{text}" for code, text in sorted(codes.items(), key=_exit_order)]
    return "\b\nExit codes:\n" + "\n".join(lines)


def _exit_order(item: tuple[int | str, str]) -> tuple[int, str]:
    code = item[0]
    return (code, "") if isinstance(code, int) else (10_000, code)
