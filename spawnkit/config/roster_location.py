"""Where a roster is: the one the user named, or the first found in the usual places.

A command that needs a roster looks, in order, at ``--roster``, ``$SPAWNKIT_ROSTER``,
``./roster`` and ``$SPAWNKIT_HOME/roster``. A place the user named (the option or the
variable) is the only one tried: a typo there must fail, not quietly pick up another
roster. When nothing is found, :class:`RosterNotFound` lists every place looked at and
how to make a roster (``spawnkit init``).

:func:`example_roster` finds the example roster that ships with spawnkit (the wheel's
copy, or the checkout's ``roster/`` for an editable install), which ``spawnkit demo``
and ``spawnkit init`` use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..home import home_path

ROSTER_ENV = "SPAWNKIT_ROSTER"
EXAMPLE_MARKER = Path("health") / "butler.toml"


class RosterNotFound(ConfigError):
    """No roster directory where spawnkit looked; ``looked`` says where, in order."""

    def __init__(self, looked: Sequence[tuple[str, Path]]) -> None:
        self.looked = tuple(looked)
        places = ", ".join(f"{label} ({path})" for label, path in self.looked)
        super().__init__(
            f"no roster found; looked in {places}. Create one with `spawnkit init` "
            f"(or `spawnkit init DIR`), or point --roster or ${ROSTER_ENV} at one"
        )


def roster_candidates(
    explicit: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[tuple[str, Path]]:
    """The places to look, in order, each with how the user would name it."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return [("--roster", explicit.expanduser())]
    if env.get(ROSTER_ENV):
        return [(f"${ROSTER_ENV}", Path(env[ROSTER_ENV]).expanduser())]
    return [("./roster", Path.cwd() / "roster"), ("$SPAWNKIT_HOME/roster", home_path() / "roster")]


def find_roster(explicit: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The roster directory to use; raises :class:`RosterNotFound` listing where it looked."""
    candidates = roster_candidates(explicit, environ)
    for _, path in candidates:
        if path.is_dir():
            return path
    raise RosterNotFound(candidates)


def example_roster() -> Path:
    """The roster that ships with spawnkit: the wheel's copy, else the checkout's.

    An editable install has no packaged copy: its examples are the ``roster/`` beside
    the ``spawnkit/`` package in the source checkout.
    """
    package = Path(__file__).resolve().parent.parent
    candidates = (package / "_examples" / "roster", package.parent / "roster")
    for roster in candidates:
        if (roster / EXAMPLE_MARKER).is_file():
            return roster
    raise ConfigError(
        f"spawnkit's example roster is missing (looked in {candidates[0]} and "
        f"{candidates[1]}): reinstall spawnkit"
    )
