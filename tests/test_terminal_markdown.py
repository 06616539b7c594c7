"""``spawnkit run`` renders the answer's Markdown on a terminal and leaves it as written when
piped; its header names the model the runtime answers with."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from spawnkit.cli.console import Style, render_answer

from .conftest import REPO
from .test_cli import spawnkit

ANSWER = """# Your weight

Recorded **72 kg**, see `trend.py`.

- first point
- second point
  1. nested

```
readings: 3
```"""
SCENARIO = f'[[turn]]\ntext = """{ANSWER}"""\n'
BOLD, CODE = "\033[1m72 kg\033[22m", "\033[36mtrend.py\033[39m"


def test_markdown_for_a_terminal_and_as_written_otherwise() -> None:
    shown = render_answer(ANSWER, Style(enabled=True))
    assert BOLD in shown and CODE in shown
    assert "\033[1m\033[4mYour weight\033[24m\033[22m" in shown and "# " not in shown
    assert "\n  • first point\n" in shown and "\n    1. nested\n" in shown
    assert "  \033[36mreadings: 3\033[39m" in shown and "```" not in shown
    plain = render_answer(ANSWER, Style(enabled=False))
    assert plain == "\n".join(f"  {line}" for line in ANSWER.splitlines())
    # Code inside bold keeps the bold after it.
    nested = render_answer("**a `b` c**", Style(enabled=True))
    assert nested == "  \033[1ma \033[36mb\033[39m c\033[22m"


def _command(tmp_path: Path, runtime: str) -> list[str]:
    scenario = tmp_path / "answer.toml"
    scenario.write_text(SCENARIO)
    return [
        sys.executable, "-m", "spawnkit", "run", "--roster", str(REPO / "roster"),
        "--butler", "health", "--runtime", runtime, "--replay", str(scenario), "hello",
    ]  # fmt: skip


def _on_a_terminal(command: list[str], env: dict[str, str]) -> str:
    controller, terminal = pty.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    child = subprocess.Popen(
        command, stdin=terminal, stdout=terminal, stderr=terminal, cwd=REPO, env=env,
        start_new_session=True, preexec_fn=take_terminal,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline:
            if select.select([controller], [], [], 1)[0]:
                try:
                    seen += os.read(controller, 65536)
                except OSError:
                    break
        while select.select([controller], [], [], 0.2)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        assert child.wait(timeout=60) == 0, seen.decode(errors="replace")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(controller)
    return seen.decode(errors="replace")


@pytest.mark.e2e
def test_spawnkit_run_on_a_pty_renders_markdown_and_names_the_model(tmp_path: Path) -> None:
    env = {**os.environ, "SPAWNKIT_HOME": str(tmp_path / "home"), "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    seen = _on_a_terminal(_command(tmp_path, "claude-code"), env)
    assert BOLD in seen and CODE in seen and "• first point" in seen, seen
    assert "**72 kg**" not in seen and "```" not in seen
    header = next(line for line in seen.splitlines() if "▶ health · claude-code" in line)
    assert "· claude-" in header, header  # the model Claude Code named


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["claude-code", "codex"])
def test_spawnkit_run_piped_prints_the_markdown_as_written(tmp_path: Path, runtime: str) -> None:
    if runtime == "codex" and not (REPO / "node_modules" / ".bin" / "codex").exists():
        pytest.skip("the node CLIs are not installed (npm ci)")
    done = spawnkit(*_command(tmp_path, runtime)[3:], SPAWNKIT_HOME=str(tmp_path / "home"))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "\033[" not in done.stdout
    assert "  Recorded **72 kg**, see `trend.py`." in done.stdout
    header = done.stdout.splitlines()[0]
    model = "replay-gpt-5" if runtime == "codex" else "claude-"
    assert header.startswith(f"▶ health · {runtime} · {model}"), header
