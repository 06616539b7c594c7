"""The magics in an IPython test shell: loading, settings and argument errors.

Runs through real kernels (outputs, widgets, interrupts) are in test_notebook_kernel.py.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

import spawnkit.notebook.loop as loop_module
from spawnkit.notebook import runner

from .conftest import REPO

DEMO = REPO / "roster" / "health" / "scenarios" / "demo.toml"


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    shell = globalipapp.get_ipython()  # the one test shell, whoever started it first
    assert shell is not None
    yield shell
    # Loading hooks SIGTERM and SIGHUP; later tests in this process expect them back.
    if "spawnkit" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "spawnkit")


def spawn_magics(ip: Any) -> list[Any]:
    return [c for c in ip.configurables if type(c).__name__ == "SpawnMagics"]


def test_loading_only_registers_magics(ip: Any) -> None:
    threads = set(threading.enumerate())  # threads of earlier tests may end meanwhile
    filters = list(warnings.filters)
    policy = asyncio.get_event_loop_policy()
    shared_before = loop_module._shared
    ip.run_line_magic("load_ext", "spawnkit")
    assert {"spawn", "ask"} <= set(ip.magics_manager.magics["cell"])
    for name in (
        "spawn_sessions",
        "spawn_debug",
        "spawn_status",
        "spawn_cancel",
        "spawn_drain",
        "spawn_dashboard",
    ):
        assert name in ip.magics_manager.magics["line"]
    started = set(threading.enumerate()) - threads
    assert not started, f"no thread (no loop) is started by loading: {started}"
    assert warnings.filters == filters
    assert asyncio.get_event_loop_policy() is policy
    assert loop_module._shared is shared_before
    assert len(spawn_magics(ip)) == 1


def test_reload_and_unload_are_safe(ip: Any) -> None:
    ip.run_line_magic("load_ext", "spawnkit")
    ip.run_line_magic("reload_ext", "spawnkit")
    ip.run_line_magic("reload_ext", "spawnkit")
    assert len(spawn_magics(ip)) == 1
    ip.run_line_magic("unload_ext", "spawnkit")
    assert "spawn" not in ip.magics_manager.magics["cell"]
    assert spawn_magics(ip) == []
    ip.run_line_magic("load_ext", "spawnkit")
    assert "spawn" in ip.magics_manager.magics["cell"]


def test_loading_hooks_the_stop_signals_and_unloading_restores_them(ip: Any) -> None:
    ip.run_line_magic("unload_ext", "spawnkit")
    stop_signals = (signal.SIGTERM, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in stop_signals}
    ip.run_line_magic("load_ext", "spawnkit")
    ip.run_line_magic("reload_ext", "spawnkit")
    hooked = {signum: signal.getsignal(signum) for signum in stop_signals}
    assert all(callable(h) and h is not before[s] for s, h in hooked.items()), hooked
    ip.run_line_magic("unload_ext", "spawnkit")
    assert {signum: signal.getsignal(signum) for signum in stop_signals} == before
    ip.run_line_magic("load_ext", "spawnkit")


def test_settings_are_configurable_traitlets(ip: Any) -> None:
    ip.run_line_magic("load_ext", "spawnkit")
    ip.run_line_magic("config", 'SpawnMagics.default_runtime = "codex"')
    ip.run_line_magic("config", "SpawnMagics.max_turns = 3")
    (magics,) = spawn_magics(ip)
    assert (magics.default_runtime, magics.max_turns) == ("codex", 3)
    helps = {name: trait.help for name, trait in magics.traits(config=True).items()}
    assert set(helps) >= {"default_runtime", "roster", "max_turns", "render"}
    assert all(helps[name] for name in ("default_runtime", "roster", "max_turns", "render"))
    with pytest.raises(Exception, match="render"):
        magics.render = "fireworks"
    ip.run_line_magic("config", 'SpawnMagics.default_runtime = "claude-code"')
    ip.run_line_magic("config", "SpawnMagics.max_turns = None")


def test_help_lists_the_options(ip: Any) -> None:
    ip.run_line_magic("load_ext", "spawnkit")
    doc = ip.magics_manager.magics["cell"]["spawn"].__doc__
    options = "--butler --roster --max-turns --model --replay --background --out --context"
    for option in (*options.split(), "--interpolate", "--allow-failure", "--kernel-tools"):
        assert option in doc


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("gpt-cli", "hi", "unknown runtime 'gpt-cli'"),
        ("--butler nope", "hi", "unknown butler 'nope'"),
        ("--butler health --roster /nonexistent", "hi", "roster directory not found"),
        ("--replay /no/such/scenario.toml", "hi", "no scenario file"),
        ("--max-turns 0", "hi", "--max-turns must be at least 1"),
        ("--max-turns many", "hi", "invalid int value"),
        ("--timeout-s inf", "hi", "--timeout-s: must be a finite number above 0, not 'inf'"),
        ("--max-cost-usd nan", "hi", "--max-cost-usd: must be a finite number above 0, not 'nan'"),
        ("--timeout-s 0", "hi", "--timeout-s: must be a finite number above 0, not '0'"),
        ("--context undefined_name_xyz", "hi", "--context 'undefined_name_xyz' failed: NameError"),
        ("", "   \n", "needs a prompt"),
        ("--no-such-flag", "hi", "unrecognized arguments"),
        ("--continue --resume abc", "hi", "--continue goes on with the last run, --resume"),
        ("--butler nope --continue", "hi", "--continue: no earlier run of butler 'nope'"),
    ],
)
def test_bad_arguments_are_usage_errors(ip: Any, line: str, cell: str, message: str) -> None:
    ip.run_line_magic("load_ext", "spawnkit")
    ip.run_line_magic("cd", str(REPO))
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ip.run_cell_magic("spawn", line, cell)


def test_line_magic_errors(ip: Any) -> None:
    ip.run_line_magic("load_ext", "spawnkit")
    with pytest.raises(UsageError, match="usage: %spawn_cancel"):
        ip.run_line_magic("spawn_cancel", "")
    with pytest.raises(UsageError, match="no run in flight"):
        ip.run_line_magic("spawn_cancel", "abc")
    with pytest.raises(UsageError, match="usage: %spawn_drain"):
        ip.run_line_magic("spawn_drain", "soon")
    with pytest.raises(UsageError, match="must be a finite number above 0, not 'inf'"):
        ip.run_line_magic("spawn_drain", "inf")


@pytest.mark.e2e
def test_terminal_shell_runs_and_prints_text(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "spawnkit")
    ip.run_line_magic("cd", str(REPO))
    result = ip.run_cell_magic(
        "spawn", f"--butler health --replay {DEMO} --out demo_result", "I weighed 72.4 kg"
    )
    printed = capsys.readouterr().out
    assert result.success, result.error
    assert ip.user_ns["demo_result"] is result
    assert "⚙ health.state_set" in printed and "✓ success" in printed
    assert "⚙ Bash  $ date +%F" in printed
    assert printed.index("Reading the log first") < printed.index("⚙ health.state_get")
    assert "Recorded 72.4 kg" in result._repr_markdown_()
    sessions = ip.run_line_magic("spawn_sessions", "-n 5")
    from spawnkit import history

    assert list(sessions.columns) == list(history.sessions().columns), "the same schema"
    assert list(sessions["session_id"]) == [result.session_id]
    assert str(sessions["created_at"].dtype).startswith("datetime64")
    status = ip.run_line_magic("spawn_status", "")
    assert list(status["butler"]) == ["health"] and list(status["running"]) == [0]


def test_render_mode_follows_the_frontend() -> None:
    assert runner.in_kernel() is False, "the test shell is a terminal shell"


PACED = """
[[script]]
match = "refuse"
  [[script.turn]]
  error = { status = 429, type = "rate_limit_error", message = "Too many requests" }

[[script]]
  [[script.turn]]
  text = "Done."
  usage = { input_tokens = 100000, output_tokens = 1000 }
"""


@pytest.mark.e2e
def test_spawn_status_shows_queue_waits_cool_downs_and_the_daily_budget(
    ip: Any, make_butler: Any, tmp_path: Any
) -> None:
    butler = make_butler(
        name="paced",
        extra='[butler.runtime]\nmodel = "claude-sonnet-4-5"\n'
        "[butler.limits]\ndaily_cost_usd = 5\n"
        "[butler.retry]\nmax_attempts = 2\nbackoff_s = 1\nmax_backoff_s = 4\n",
    )
    scenario = tmp_path / "paced.toml"
    scenario.write_text(PACED)
    ip.run_line_magic("load_ext", "spawnkit")
    flags = f"--butler paced --roster {butler.roster_dir} --replay {scenario}"
    done = ip.run_cell_magic("spawn", flags, "do it")
    assert done.success and done.cost_usd, done.error
    refused = ip.run_cell_magic("spawn", f"{flags} --allow-failure", "refuse it")
    assert refused.error_kind == "rate_limit" and "gave up after 2 attempts" in refused.error
    status = ip.run_line_magic("spawn_status", "")
    row = status[status["butler"] == "paced"].iloc[0]
    # The second refusal set a cool-down of 2 to 3 s, still in effect.
    assert 0.5 < row["cooldown_s"] <= 3.0
    assert row["cooldown_waits"] == 1, "the retry waited on the first refusal's cool-down"
    assert row["daily_cost_usd"] == 5.0
    assert row["spent_today_usd"] == pytest.approx(done.cost_usd)
    # Two runs started: one at once, one after no wait beyond its slot.
    assert 0 <= row["wait_p50_s"] <= row["wait_p90_s"] < 5
    assert list(status.columns)[-6:] == [
        "wait_p50_s", "wait_p90_s", "cooldown_s", "cooldown_waits", "spent_today_usd",
        "daily_cost_usd",
    ]  # fmt: skip
