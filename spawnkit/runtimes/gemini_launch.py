"""The Gemini CLI started as the process it relaunches itself into: one node a run, not two.

``gemini`` (``bundle/gemini.js``) begins by relaunching itself. It loads part of its bundle,
then spawns a second node on the same script with ``--max-old-space-size`` at half the
machine's memory and ``GEMINI_CLI_NO_RELAUNCH=true``, and waits for it. That first node
costs about 0.8 CPU-s and as much wall time on every run, and does nothing a headless run
uses: its loop restarts the TUI after ``/auth`` or an update, and its IPC carries admin
settings into that restart. A headless run starts the second node directly: the same node,
flag, script and environment. (Gemini adds the flag only when it raises node's own heap
limit, which it does on any machine with more than a few GB; here it is always given.)

The TUI (``spawnkit chat``) keeps the relaunch, and with it the restarts. Where ``gemini``
is not a node script (another packaging) or node is not on the run's PATH, it is run as it
is, relaunch included.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

# Set in the process the relaunch starts; a headless run's CLI gets it too.
NO_RELAUNCH = {"GEMINI_CLI_NO_RELAUNCH": "true"}


@functools.lru_cache(maxsize=16)
def direct_command(cli: Path, path: str | None) -> tuple[str, ...] | None:
    """``node --max-old-space-size=N SCRIPT`` for the CLI ``cli``, node found on ``path``
    (the run's PATH); None where the CLI is not a node script or there is no node."""
    script = cli.resolve()
    if script.suffix not in (".js", ".mjs"):
        return None
    node = shutil.which("node", path=path)
    if node is None:
        return None
    return (str(Path(node).resolve()), f"--max-old-space-size={half_memory_mb()}", str(script))


def half_memory_mb() -> int:
    """What Gemini asks node for: half the machine's memory, in MiB (``os.totalmem()``)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // (1024 * 1024) // 2
