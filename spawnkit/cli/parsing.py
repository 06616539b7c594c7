"""What every command's arguments share: the parser that fails in one line, the help
texts of the common options, and the values an argument stands for (a prompt read from
stdin or a file, a row count, the roster ``--roster`` finds)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

from ..errors import SpawnkitError
from .reporting import EXIT_USAGE

# The most rows `-n` lists: a sane bound, far below what a database's LIMIT overflows at.
MAX_ROWS = 1_000_000

ROSTER_HELP = "roster directory (default: $SPAWNKIT_ROSTER, ./roster, then $SPAWNKIT_HOME/roster)"
STORE_HELP = (
    "the session store: a SQLite file or postgresql://user@host/db (default: $SPAWNKIT_STORE, "
    "[store] url in $SPAWNKIT_HOME/config.toml, then $SPAWNKIT_HOME/sessions.db)"
)
PROMPT_HELP = "the prompt; - reads it from stdin, @FILE from a file"

# What `add_subparsers()` returns: where each command group adds its commands.
Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


class Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, like every other error of the command line
    (its subcommands' parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"spawnkit: error: {message} (see {self.prog} --help)\n")


def row_count(text: str) -> int:
    """``-n``: a number of rows from 1 to :data:`MAX_ROWS`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_ROWS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_ROWS}, not {text}")
    return value


def read_prompt(value: str) -> str:
    """The prompt an argument stands for: ``-`` is stdin, ``@FILE`` a file's text.

    ``@@...`` is the literal text ``@...``. Any size works: the prompt never travels
    to an agent CLI as one command-line argument.
    """
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@@"):
        return value[1:]
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SpawnkitError(f"the prompt file {path} is not UTF-8 text") from None
        except OSError as exc:
            raise SpawnkitError(
                f"cannot read the prompt file {path}: {exc.strerror or exc}"
            ) from None
    return value


def find_and_load_roster(explicit: Path | None) -> Any:
    """The roster ``--roster`` names, else the one found where rosters are looked for."""
    from ..config.roster import load_roster
    from ..config.roster_location import find_roster

    return load_roster(find_roster(explicit))
