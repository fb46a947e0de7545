"""What every command shares in how it answers: exit codes, the one error format, ``-o`` formats, a progress
display only on a terminal, and help texts without reStructuredText markup.

Exit codes follow kubectl and helm: 0 ok; 1 any error (invalid input, a failure at run time); 2 a usage error
(an unknown option, a missing argument, an option value the command line itself gets wrong), as argparse
answers. Errors go to stderr as one ``error: WHAT: WHY`` line per problem.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, TextIO

from prfaas_local.formats import STRUCTURED as STRUCTURED
from prfaas_local.formats import os_error as os_error
from prfaas_local.formats import render

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The command line itself is wrong in a way argparse cannot see (an option's value out of range). Exit 2."""


def fail(exc: Exception) -> int:
    """The error line for ``exc``, and its exit code: 2 for a :class:`UsageError`, else 1."""
    return error(str(exc), EXIT_USAGE if isinstance(exc, UsageError) else EXIT_ERROR)


def add_output_arg(p: argparse.ArgumentParser, human: str | None = "table", extra: tuple[str, ...] = ()) -> None:
    """``--output/-o``: ``human`` (the default, when the command has a human form), json, yaml, then ``extra``."""
    choices = (*((human,) if human else ()), *STRUCTURED, *extra)
    p.add_argument("--output", "-o", choices=choices, default=choices[0], help="output format: " + ", ".join(choices))


def emit(data: Any, fmt: str, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(render(data, fmt))


def error(message: str, code: int = EXIT_ERROR) -> int:
    """Print ``error: message`` on stderr (each line of a multi-problem message prefixed alike); return ``code``."""
    for line in str(message).splitlines() or [""]:
        if line.strip():
            print(f"error: {line.strip()}", file=sys.stderr)
    return code


def is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


_LITERAL = re.compile(r"``([^`]+)``")
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data):`~?\.?([^`]+)`")


def plain_text(text: str | None) -> str | None:
    """A docstring as a help text: reStructuredText's ````x```` and ``:func:`x``` become `x` (Markdown-like, as
    the CLI reference page renders it)."""
    if text is None:
        return None
    return _ROLE.sub(r"`\1`", _LITERAL.sub(r"`\1`", text))


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Rewrite the descriptions and help texts of ``parser`` and its subcommands with :func:`plain_text`."""
    parser.description = plain_text(parser.description)
    for action in parser._actions:
        action.help = plain_text(action.help) if isinstance(action.help, str) else action.help
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain_text(choice.help) if isinstance(choice.help, str) else choice.help
            for sub in action.choices.values():
                plain_help(sub)
