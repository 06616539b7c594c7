"""CPU seconds of this process and every process it starts, counted through a cgroup.

``getrusage(RUSAGE_CHILDREN)`` sees only the children a process reaps: not the workers of
a server that outlives them, not a sandbox's processes (a pid namespace's are not reaped
through us), not a daemon reparented away. A cgroup counts them all. Used by the history
benchmarks and by the test suite's CPU log (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class CpuCounter:
    """CPU seconds of this process and every process it starts, wherever they are reaped.

    spawnkit's parse workers are children of its parse server, which outlives a load, so
    ``RUSAGE_CHILDREN`` never sees them; a cgroup does. This process moves into a fresh one
    (v1 ``cpuacct`` or v2) for the run if it may; else :meth:`seconds` is None.
    """

    def __init__(self, name: str = "spawnkit-history-bench") -> None:
        self.group: Path | None = None
        self.parent: Path | None = None
        self.usage = Path()
        for parent, usage in ((Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage"),
                              (Path("/sys/fs/cgroup"), "cpu.stat")):  # fmt: skip
            group = parent / f"{name}-{os.getpid()}"
            try:
                group.mkdir()
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                with contextlib.suppress(OSError):
                    group.rmdir()
                continue
            self.group, self.parent, self.usage = group, parent, group / usage
            break

    def seconds(self) -> float | None:
        if self.group is None:
            return None
        text = self.usage.read_text()
        if self.usage.name == "cpuacct.usage":
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6

    def close(self) -> None:
        if self.group is not None and self.parent is not None:
            with contextlib.suppress(OSError):
                (self.parent / "cgroup.procs").write_text(str(os.getpid()))
                self.group.rmdir()
