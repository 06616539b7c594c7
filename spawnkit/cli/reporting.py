"""How a command ends: its exit code, and the last lines it leaves on stderr.

User mistakes and every other error the library raises on purpose (an unknown butler,
bad TOML, an unknown runtime, a missing variable or CLI, an empty prompt, a damaged or
read-only store) print one line and exit 2, never a traceback; a run that was accepted
and failed exits 1. Ctrl-C, SIGTERM and SIGHUP (``kill PID``, a closed terminal) cancel
the run alike: it is recorded as cancelled, its CLI's process group is terminated and its
workspace removed; ``spawnkit run`` then exits 130 for Ctrl-C and 128 + the signal's
number for the others (143 for SIGTERM, 129 for SIGHUP), and ``spawnkit serve`` stops
cleanly (exit 0) on any of the three.
"""

from __future__ import annotations

import contextlib
import sys

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def one_line(message: str) -> str:
    """An error message as one line (an agent's stderr tail may span several)."""
    return " | ".join(line.strip() for line in message.strip().splitlines() if line.strip())


def say(line: str) -> None:
    """A last line on stderr, which may be a terminal that is gone (SIGHUP)."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)
