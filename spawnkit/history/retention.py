"""How long the CLIs keep their transcripts, so ``spawnkit doctor`` can warn before they go.

Claude Code deletes transcripts older than ``cleanupPeriodDays`` (30 by default) from its
config folder's ``settings.json``. A user who never set it loses a month-old history
without knowing; ``spawnkit history import`` keeps a copy in spawnkit's store.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CLAUDE_DEFAULT_CLEANUP_DAYS = 30


def _claude_config_dirs() -> list[Path]:
    raw = os.environ.get("CLAUDE_CONFIG_DIR")
    if raw:
        return [Path(p.strip()).expanduser() for p in raw.split(",") if p.strip()]
    return [Path.home() / ".claude"]


def claude_cleanup_warnings(config_dirs: list[Path] | None = None) -> list[str]:
    """One line per Claude config folder whose transcripts expire at the default age."""
    warnings = []
    for folder in config_dirs if config_dirs is not None else _claude_config_dirs():
        if not (folder / "projects").is_dir():
            continue  # no transcripts there: nothing to lose
        settings = folder / "settings.json"
        days = None
        try:
            value = json.loads(settings.read_text(encoding="utf-8")).get("cleanupPeriodDays")
            days = int(value) if isinstance(value, int | float) else None
        except (OSError, ValueError, AttributeError):
            days = None
        if days is None or days == CLAUDE_DEFAULT_CLEANUP_DAYS:
            warnings.append(
                f"Claude Code deletes transcripts in {folder} after "
                f"{CLAUDE_DEFAULT_CLEANUP_DAYS} days (cleanupPeriodDays is "
                f"{'the default' if days is None else days} in {settings}): set it higher, or "
                "run `spawnkit history import` regularly to keep a copy"
            )
    return warnings
