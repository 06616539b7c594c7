"""``_process.open_stdio``: a child spawnkit talks to over its stdio (an ACP agent).

Real processes: a shell child that answers lines, puts a sleeper in the background and
writes a line longer than the bound; the block's end leaves none of them running.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from spawnkit._process import open_stdio

SCRIPT = r"""
sleep 300 &
echo "$!" > "$1"
read -r line
echo "got $line"
head -c 5000 /dev/zero | tr '\0' x; echo
echo after
echo "said on stderr" >&2
read -r _
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_lines_bounded_and_nothing_left(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper"
    async with open_stdio(
        ["bash", "-c", SCRIPT, "script", str(pidfile)], env={"PATH": os.environ["PATH"]},
        cwd=tmp_path, on_stderr=lambda line, _: None, max_line=1000,
    ) as child:  # fmt: skip
        await child.write(b"hello\n")
        assert await child.read_line() == ("got hello", False)
        long_line, truncated = await child.read_line() or ("", False)
        assert truncated and len(long_line) == 1000
        assert await child.read_line() == ("after", False), "the rest of the long line is dropped"
        sleeper = int(pidfile.read_text())
        assert alive(sleeper)
    assert not alive(sleeper), "the child's group ends with the block"
    assert child.returncode is not None


async def test_a_cancelled_block_ends_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper"

    async def talk() -> None:
        async with open_stdio(
            ["bash", "-c", SCRIPT, "script", str(pidfile)], env={"PATH": os.environ["PATH"]},
            cwd=tmp_path, on_stderr=lambda line, _: None,
        ) as child:  # fmt: skip
            await child.read_line()  # waits: the script reads first

    task = asyncio.create_task(talk())
    async with asyncio.timeout(30):
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not alive(int(pidfile.read_text()))


async def test_a_block_cancelled_while_its_child_starts_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after the child exists and before its start returned (asyncio still
    connecting its pipes, which a loaded machine makes slow): its group is ended all the
    same, and the cancellation comes out (asyncio alone would kill the child only, then
    wait for pipes its background process holds: a hang and a process left)."""
    pidfile = tmp_path / "sleeper"
    real = asyncio.create_subprocess_exec
    started = asyncio.Event()

    async def slow_start(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)
        started.set()
        await asyncio.sleep(1.0)  # the pipes' connection, slowed down
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_start)

    async def talk() -> None:
        async with open_stdio(
            ["bash", "-c", SCRIPT, "script", str(pidfile)], env={"PATH": os.environ["PATH"]},
            cwd=tmp_path, on_stderr=lambda line, _: None,
        ):  # fmt: skip
            raise AssertionError("never reached: cancelled while starting")

    task = asyncio.create_task(talk())
    async with asyncio.timeout(30):
        await started.wait()
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.02)
    task.cancel()
    async with asyncio.timeout(30):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not alive(int(pidfile.read_text())), "the background process went with its group"


async def test_exited_reports_the_code_and_waits_for_stderr(tmp_path: Path) -> None:
    said: list[str] = []
    async with open_stdio(
        ["bash", "-c", "echo bye >&2; exit 3"], env={"PATH": os.environ["PATH"]},
        cwd=tmp_path, on_stderr=lambda line, _: said.append(line),
    ) as child:  # fmt: skip
        assert await child.read_line() is None
        assert await child.exited(10) == 3
        assert said == ["bye"]
