"""``spawnkit init``: a new roster, ready to run, made from the example that ships with spawnkit.

The new roster holds one butler (the example ``general`` butler: its ``butler.toml``,
its ``CLAUDE.md``, the ``word_count`` skill and a replay scenario) and the ``shared/``
prompt snippets every butler's system prompt includes. It is copied from the installed
package, so it runs offline right away (``spawnkit run --replay``) and is the user's to
change. Nothing is overwritten: a directory that already has content is refused.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .butler_config import SHARED_DIR
from .roster_location import example_roster

STARTER_BUTLER = "general"
STARTER_SCENARIO = Path("scenarios") / "assistant.toml"
STARTER_PROMPT = "count the words in: the cat sat on the mat"


@dataclass(frozen=True)
class NewRoster:
    """What :func:`init_roster` made."""

    directory: Path
    butler: str
    scenario: Path
    files: tuple[Path, ...]


def init_roster(directory: Path) -> NewRoster:
    """Create a roster in ``directory`` (made if missing; it must be empty if it exists)."""
    target = directory.expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{target} already exists and is not an empty folder: "
            "choose another with `spawnkit init DIR`"
        )
    source = example_roster()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name in (STARTER_BUTLER, SHARED_DIR):
            shutil.copytree(
                source / name, target / name, ignore=shutil.ignore_patterns("__pycache__")
            )
    except OSError as exc:
        raise ConfigError(f"cannot create the roster in {target}: {exc.strerror or exc}") from exc
    files = tuple(sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file()))
    return NewRoster(target, STARTER_BUTLER, target / STARTER_BUTLER / STARTER_SCENARIO, files)
