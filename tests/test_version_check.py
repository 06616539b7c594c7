"""Reading a CLI's version: minimal environment, never blocking the loop, bounded, cached.

Fake CLIs (small shell scripts) stand in where the real ones cannot misbehave on demand:
one that hangs while a child of its holds its output, one that answers and counts how
often it was asked. The real CLIs are checked by ``spawnkit doctor`` (tests/test_contract.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from spawnkit.runtimes import version
from spawnkit.runtimes.claude_code import ClaudeCodeAdapter
from spawnkit.runtimes.gemini import GeminiAdapter

HANGING = """#!/bin/sh
env > "{out}/env.txt"
sleep 300 &
echo $! > "{out}/child.pid"
echo $$ > "{out}/cli.pid"
sleep 300
"""

ANSWERING = """#!/bin/sh
echo asked >> "{out}/asked.txt"
env > "{out}/env.txt"
echo "9.9.9 (Fake CLI)"
"""


def fake_cli(tmp_path: Path, script: str) -> Path:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    path = tmp_path / "fake-cli"
    path.write_text(script.format(out=out))
    path.chmod(0o755)
    return path


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def gone_dir(path: str) -> bool:
    return not Path(path).exists()


def env_of(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


async def test_a_hanging_version_check_is_bounded_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = fake_cli(tmp_path, HANGING)
    monkeypatch.setenv("SPAWNKIT_CLAUDE_CLI", str(cli))
    monkeypatch.setenv("SPAWNKIT_TEST_SECRET", "must-not-leak")
    monkeypatch.setattr(version, "VERSION_TIMEOUT_S", 1.0)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    clock = time.monotonic()
    try:
        answer = await ClaudeCodeAdapter().binary_version()
    finally:
        ticker.cancel()
    waited = time.monotonic() - clock
    assert answer is None
    assert waited >= 1.0, "it waited for the CLI up to the timeout"
    assert ticks >= 3, "the event loop kept running while the CLI hung"
    out = tmp_path / "out"
    assert gone(int((out / "cli.pid").read_text())), "the CLI outlived the check"
    assert gone(int((out / "child.pid").read_text())), "the CLI's child outlived the check"
    env = env_of(out / "env.txt")
    assert "SPAWNKIT_TEST_SECRET" not in env, "the parent's environment reached the CLI"
    assert env["PATH"] == os.environ["PATH"]
    assert env["HOME"] != os.environ["HOME"] and gone_dir(env["HOME"])
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "PWD", "SHLVL", "_", "OLDPWD"}, env

    (out / "env.txt").unlink()
    assert await ClaudeCodeAdapter().binary_version() is None
    assert not (out / "env.txt").exists(), "asked once per binary, not again"


async def test_the_version_is_asked_once_per_binary(tmp_path: Path, monkeypatch) -> None:
    cli = fake_cli(tmp_path, ANSWERING)
    monkeypatch.setenv("SPAWNKIT_GEMINI_CLI", str(cli))
    answers = await asyncio.gather(*(GeminiAdapter().binary_version() for _ in range(3)))
    assert answers == ["9.9.9 (Fake CLI)"] * 3
    assert await GeminiAdapter().binary_version() == "9.9.9 (Fake CLI)"
    asked = tmp_path / "out" / "asked.txt"
    assert asked.read_text().splitlines() == ["asked"], "concurrent callers shared one check"
    assert env_of(tmp_path / "out" / "env.txt")["GEMINI_CLI_NO_RELAUNCH"] == "true"
    cli.write_text(cli.read_text() + "# upgraded\n")  # another binary at the same path
    assert await GeminiAdapter().binary_version() == "9.9.9 (Fake CLI)"
    assert asked.read_text().splitlines() == ["asked", "asked"]
