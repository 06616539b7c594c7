"""Whether a process still runs, and is the one that started when a record says.

A pid alone can be reused; a pid with its start time (``/proc/PID/stat``, in clock ticks
since boot) names one process. The sweep (:mod:`spawnkit.containment.sweep`) and the adapter
contract's status polls (:mod:`spawnkit.cli.contract`) both ask; this module is theirs, and
loads nothing beyond ``os`` (a ``check_status`` poll must start fast).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid``, to tell a process from a later one with its pid."""
    stat = _stat(pid)
    return stat[1] if stat else None


def live_start(pid: int) -> str | None:
    """The start time of ``pid`` unless it is gone or a zombie (dead, not yet reaped)."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[1]


def owner_alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not PROC.is_dir():
        return True  # no /proc to say more: trust the pid
    current = live_start(pid)
    return current is not None and (start is None or current == start)
