"""What the shell that starts a run's CLI does just before it ``exec``s the command line.

An unsandboxed run's CLI joins its cgroup (:mod:`spawnkit.containment.run_group`);
bubblewrap reads its seccomp filter from fd 9 (:mod:`spawnkit.containment.sandbox`) and
writes its namespace's init to fd 8 (:mod:`spawnkit.containment.pid_namespace`): each is a
shell step done by the process that then becomes bwrap (or the CLI). They used to be a
shell each (``sh`` to join, ``bash -p`` to open the filter, ``env`` to drop the ``SHLVL``
bash exports): three programs started before every sandboxed run, 2.5 ms of CPU and 4 ms
of wall together. Now
one ``sh`` does every step (:func:`shell_prefix`), and Claude Code's wrapper script, a shell
already, does them itself (:func:`script_lines`), so they cost no program at all there.

A step's argument (a path) is never spliced into code: ``sh`` gets it as a positional
parameter, the wrapper as a single-quoted word.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

SH = shutil.which("sh", path="/bin:/usr/bin") or "/bin/sh"
# $0 of the one shell (what `ps` and its error messages name).
SHELL_NAME = "spawnkit-start"


@dataclass(frozen=True)
class ShellStep:
    """One step: ``code`` with ``{}`` where its one argument goes, quoted."""

    code: str
    arg: str


def shell_prefix(steps: Sequence[ShellStep]) -> list[str]:
    """What goes before a command line for one ``sh`` to do ``steps``, then ``exec`` it."""
    if not steps:
        return []
    code = "; ".join(step.code.format(f'"${n}"') for n, step in enumerate(steps, 1))
    script = f'{code}; shift {len(steps)}; exec "$@"'
    return [SH, "-c", script, SHELL_NAME, *(step.arg for step in steps)]


def script_lines(steps: Sequence[ShellStep]) -> list[str]:
    """``steps`` as lines of a shell script (sh or bash)."""
    return [step.code.format(shlex.quote(step.arg)) for step in steps]
