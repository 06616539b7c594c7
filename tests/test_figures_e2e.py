"""Live figures and prices on the real CLIs against the replay server.

Codex reports usage once, when its whole prompt is done, and names no model; Gemini
reports usage in its final ``result``. Their runs are metered by the relay, so tokens and
model turns arrive after each model call; the model is named at the start. A finished run
is priced the same way on every runtime (the runtime's own cost, else the list price of
the model it named), and ``spawnkit run``, ``spawnkit sessions`` and history agree.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from spawnkit import history
from spawnkit.budgets.budget import list_price
from spawnkit.config.limits import Limits
from spawnkit.events import Finished, RunEvent, ToolCallFinished, UsageUpdate
from spawnkit.notebook.hub import with_runtime
from spawnkit.notebook.session_table import session_row
from spawnkit.notebook.view_state import ViewState
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService

from .conftest import REPO
from .test_cli import spawnkit

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]

MODELS = {"codex": "replay-gpt-5", "gemini": "gemini-2.5-flash"}
THREE_TURNS = """
[[turn]]
text = "One."
tool = "mcp__*__state_set"
input = { key = "a", value = "one" }
usage = { input_tokens = 1000, output_tokens = 100, cache_read_input_tokens = 500 }
[[turn]]
text = "Two."
tool = "mcp__*__state_set"
input = { key = "b", value = "two" }
usage = { input_tokens = 1200, output_tokens = 50, cache_read_input_tokens = 600 }
[[turn]]
text = "Done."
usage = { input_tokens = 1300, output_tokens = 30, cache_read_input_tokens = 700 }
"""


def _service(butler, runtime: str, store, script: str) -> ButlerService:  # type: ignore[no-untyped-def]
    scenario = Scenario.from_dict(tomllib.loads(script), source="<test>")
    return ButlerService(with_runtime(butler, runtime), store=store, replay=scenario)


@pytest.mark.parametrize("runtime", ["codex", "gemini"])
async def test_tokens_model_and_turns_arrive_during_the_run(make_butler, store, runtime) -> None:
    events: list[RunEvent] = []
    view = ViewState()
    headers: list[str] = []

    def sink(event: RunEvent) -> None:
        events.append(event)
        view.apply(event)
        if not isinstance(event, Finished):
            headers.append(view.status.line())

    async with _service(make_butler(), runtime, store, THREE_TURNS) as svc:
        result = await svc.trigger("do the steps", on_event=sink)
    assert result.success, result.error

    updates = [e for e in events if isinstance(e, UsageUpdate)]
    assert any(u.model == MODELS[runtime] for u in updates), "the model is named"
    # Tokens after the first model call, before the second tool call finished.
    second_done = next(
        i for i, e in enumerate(events)
        if isinstance(e, ToolCallFinished) and e.call.input.get("key") == "b"
    )  # fmt: skip
    early = [e for e in events[:second_done] if isinstance(e, UsageUpdate) and e.turns]
    assert early and early[0].usage.output_tokens == 100 and early[0].turns == 1
    assert any(u.turns == 3 for u in updates)

    assert result.num_turns == 3, "model calls, not Codex's one prompt-long turn"
    assert result.model == MODELS[runtime]
    assert result.cost_usd == list_price(MODELS[runtime], result.usage) and result.cost_usd
    record = store.get_session(result.session_id or "")
    assert record is not None and record.num_turns == 3 and record.cost_usd == result.cost_usd

    assert any("1,000 in / 100 out tokens" in h and "turn 1/" in h for h in headers), headers
    assert not any("0 in / 0 out" in h for h in headers), "no zeros before the figures"
    assert view.status.model == MODELS[runtime]
    assert any(f"turn 3/{view.status.max_turns}" == f for f in view.status.figures())


@pytest.mark.parametrize("runtime", ["claude-code", "codex", "gemini"])
async def test_max_turns_stop_names_the_limit_and_how_to_raise_it(
    make_butler, store, runtime
) -> None:
    view = ViewState()
    async with _service(make_butler(), runtime, store, THREE_TURNS) as svc:
        result = await svc.trigger("loop", max_turns=1, on_event=view.apply)
    assert result.error_kind == "max_turns", result.error
    assert "--max-turns" in (result.error or "") and "%%spawn" in (result.error or "")
    assert "max_turns = N under [butler.runtime] in " in (result.error or "")
    assert "butler.toml" in (result.error or "")
    assert result.num_turns is not None and result.num_turns <= 1
    assert not any(re.match(r"turn (\d+)/1$", f) and f != "turn 1/1" for f in view.status.figures())


def _run_cost(runtime: str, home: Path) -> str:
    done = spawnkit(
        "run", "--roster", "roster", "--butler", "health", "--runtime", runtime,
        "--replay", "roster/health/scenarios/demo.toml", "I weighed 72 kg",
        SPAWNKIT_HOME=str(home), NO_COLOR="1",
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = done.stdout.strip().splitlines()[-1]
    found = re.search(r"· (\$\d+\.\d{4}) · session ([0-9a-f-]+)", summary)
    assert found, summary
    return f"{found.group(1)} {found.group(2)[:8]}"


def test_a_replay_run_is_priced_alike_in_run_sessions_and_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every runtime's replay run has a price, and the same one wherever it is shown."""
    home = tmp_path / "home"
    printed = {rt: _run_cost(rt, home) for rt in ("claude-code", "codex", "gemini")}
    listing = spawnkit("sessions", SPAWNKIT_HOME=str(home)).stdout
    monkeypatch.setenv("SPAWNKIT_HOME", str(home))
    frame = history.sessions().set_index("session_id")
    for runtime, shown in printed.items():
        cost, session = shown.split()
        row = next(line for line in listing.splitlines() if session in line)
        assert cost in row and f" {runtime} " in row, (runtime, row)
        (full_id,) = [i for i in frame.index if i.startswith(session)]
        assert f"${frame.loc[full_id, 'cost_usd']:.4f}" == cost, runtime
        assert frame.loc[full_id, "runtime"] == runtime


@pytest.mark.parametrize("runtime", ["codex", "gemini"])
async def test_a_dollar_budget_is_accepted_for_the_model_the_run_will_name(
    make_butler, store, runtime
) -> None:
    """No model in butler.toml: the run names Codex's replay slug or Gemini's default, and
    prices its tokens at it; the pre-check accepts the same price (it refused before)."""
    async with _service(make_butler(), runtime, store, THREE_TURNS) as svc:
        result = await svc.trigger("do the steps", limits=Limits(max_cost_usd=5))
    assert result.success, result.error
    assert result.budget is not None and result.budget.priced_model == MODELS[runtime]
    assert result.budget.cost_usd == result.cost_usd == list_price(MODELS[runtime], result.usage)
    record = store.get_session(result.session_id or "")
    assert record is not None
    assert session_row(record)["cost"] == f"${result.cost_usd:.4f}", "the dashboard's row"
