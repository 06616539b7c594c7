"""The shell steps before a run's CLI (join its cgroup, open the seccomp filter) are done by
the one process that then becomes the CLI: one ``sh`` for every step, or Claude Code's
wrapper script itself, and an argument is data, never code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spawnkit import _process
from spawnkit.containment.prelude import SH, ShellStep, script_lines, shell_prefix

# Prints its own pid, then what it reads on fd 7.
REPORT = [sys.executable, "-c", "import os; print(os.getpid()); print(os.read(7, 100).decode())"]


def steps(tmp_path: Path, opened: Path) -> list[ShellStep]:
    """Two steps: write the shell's pid into a file, open ``opened`` on fd 7."""
    return [
        ShellStep("echo $$ > {}", str(tmp_path / "pid of the step")),
        ShellStep("command exec 7<{} || exit 126", str(opened)),
    ]


def test_one_shell_does_every_step_then_becomes_the_command(tmp_path: Path) -> None:
    opened = tmp_path / "filter"
    opened.write_text("the filter")
    argv = [*shell_prefix(steps(tmp_path, opened)), *REPORT]
    assert argv.count(SH) == 1, "one shell, whatever the number of steps"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    pid, read = proc.stdout.split("\n")[:2]
    assert (tmp_path / "pid of the step").read_text().strip() == pid, "no process between"
    assert read == "the filter"


def test_a_step_that_fails_stops_the_start(tmp_path: Path) -> None:
    argv = [*shell_prefix(steps(tmp_path, tmp_path / "missing")), *REPORT]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 126
    assert proc.stdout == "", "the command never ran without its fd"


def test_an_argument_is_never_code(tmp_path: Path) -> None:
    odd = tmp_path / "a b $(touch PWNED) `touch PWNED2` 'q\" ;"
    odd.write_text("odd")
    for argv in (
        [*shell_prefix(steps(tmp_path, odd)), *REPORT],
        ["bash", "-c", "\n".join([*script_lines(steps(tmp_path, odd)), 'exec "$@"']), "x",
         *REPORT],
    ):  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[1] == "odd"
        assert not list(tmp_path.glob("PWNED*"))


def test_no_steps_no_shell() -> None:
    assert shell_prefix([]) == []


def test_the_claude_wrapper_does_the_steps_itself(tmp_path: Path) -> None:
    """The wrapper (bash, which execs the CLI through env) runs the steps: the CLI reads the
    fd they opened, and no shell of the steps stands between (the CLI's parent is not one)."""
    opened = tmp_path / "filter"
    opened.write_text("through the wrapper")
    cli = tmp_path / "cli"
    cli.write_text(
        f"#!{sys.executable}\nimport os\n"
        "print(os.read(7, 100).decode())\n"
        "print(open(f'/proc/{os.getppid()}/comm').read().strip())\n"
    )
    cli.chmod(0o700)
    wrapper = _process.write_env_filter(tmp_path, (), script_lines(steps(tmp_path, opened)))
    env = _process.filtered_env({"PATH": os.environ["PATH"]}, cli, tmp_path / "cli.pid")
    # A parent of its own, so that the CLI's parent is whoever started it (not pid 1).
    parent = [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])"]
    proc = subprocess.run(
        [*parent, str(wrapper)], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    read, parents_name = proc.stdout.split("\n")[:2]
    assert read == "through the wrapper"
    assert parents_name.startswith("python"), "the wrapper became the CLI: no shell between"
    assert (tmp_path / "pid of the step").read_text().strip() == (
        tmp_path / "cli.pid"
    ).read_text().strip()
