"""Per-run limits on the real CLIs (Claude Code, Codex, Gemini) against the replay server.

Each scenario turn reports known usage, so the turn at which a token or dollar limit is
reached is known: the run must stop there (status ``budget``), keep what it did before,
never play the later turns, and leave nothing running.
"""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from spawnkit.config.limits import Limits
from spawnkit.config.roster import ButlerConfig
from spawnkit.errors import BudgetRefused
from spawnkit.history.pricing import default_pricing
from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import Scenario
from spawnkit.run import Spawner
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env, workspaces_of
from .test_cli import spawnkit

RUNTIMES = ["claude-code", "codex", "gemini"]
# A priced model per runtime. Codex defers MCP tools behind a search tool for the slugs
# it knows, so it gets a name it does not know that the table prices as gpt-5 (flagged).
MODELS = {"claude-code": "claude-sonnet-4-5", "codex": "replay-gpt-5", "gemini": "gemini-2.5-flash"}
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]

USAGE = "usage = { input_tokens = 1000, output_tokens = 100, cache_read_input_tokens = 500 }"
STEPS = f"""
[[turn]]
text = "Step one."
tool = "mcp__*__state_set"
input = {{ key = "a", value = "one" }}
{USAGE}
[[turn]]
text = "Step two."
tool = "mcp__*__state_set"
input = {{ key = "b", value = "two" }}
{USAGE}
[[turn]]
text = "Step three."
tool = "mcp__*__state_set"
input = {{ key = "c", value = "three" }}
{USAGE}
[[turn]]
text = "All done."
{USAGE}
"""


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def service(
    butler: ButlerConfig, runtime: str, store: SessionStore, script: str, **options: Any
) -> AsyncIterator[ButlerService]:
    scenario = Scenario.from_dict(tomllib.loads(script), source="<test>")
    async with ButlerService(
        with_runtime(butler, runtime), store=store, replay=scenario, model=MODELS[runtime],
        **options,
    ) as svc:  # fmt: skip
        yield svc


def assert_stopped_in_turn_two(store: SessionStore, result: Any, limit: str) -> None:
    assert result.status == "budget" and result.error_kind == "budget", result.error
    assert not result.success and limit in (result.error or "")
    assert store.state_get("health", "a") == "one", "the first turn's tool call ran"
    assert store.state_lookup("health", "c") == (False, None), "turn three never played"
    assert result.tool_calls and result.tool_calls[0].tool == "state_set"
    assert "Step one." in result.output, "the partial output is kept"
    record = store.get_session(result.session_id)
    assert record is not None and record.status == "budget"
    assert record.budget is not None and record.budget.stopped_by == limit
    assert record.budget.reached is not None and record.budget.limit is not None
    assert record.budget.reached >= record.budget.limit
    assert [c.tool for c in record.tool_calls] == [c.tool for c in result.tool_calls]
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id) == []
    assert workspaces_of("health") == []


async def test_max_tokens_stops_the_run_in_the_turn_that_reaches_it(
    make_butler, store, runtime
) -> None:
    # 1,100 tokens a turn (input + output; cache reads apart): turn two reaches 2,000.
    butler = make_butler(extra="[butler.limits]\nmax_tokens = 2000\n")
    async with service(butler, runtime, store, STEPS) as svc:
        result = await svc.trigger("do the steps")
    assert_stopped_in_turn_two(store, result, "max_tokens")
    record = store.get_session(result.session_id or "")
    assert record is not None and record.budget is not None
    assert 2000 <= record.budget.tokens <= 2200 and record.budget.limits["max_tokens"] == 2000
    assert record.budget.cache_read_tokens in (500, 1000), "counted apart"


async def test_max_cost_usd_stops_the_run_in_the_turn_that_reaches_it(
    make_butler, store, runtime
) -> None:
    price, estimated = default_pricing().resolve(MODELS[runtime])
    assert price is not None
    per_turn = float(price.cost(1000, 100, 0, 0, 500))
    async with service(make_butler(), runtime, store, STEPS) as svc:
        result = await svc.trigger(
            "do the steps", limits=Limits(max_cost_usd=round(per_turn * 1.5, 6))
        )
    assert_stopped_in_turn_two(store, result, "max_cost_usd")
    assert result.budget is not None and result.budget.cost_estimated is estimated
    assert result.budget.cost_usd is not None and result.budget.cost_usd > per_turn
    assert (runtime == "codex") == estimated, "an unknown model is priced by family, flagged"
    if estimated:
        assert "priced as a model of its family" in (result.budget.note or "")


async def test_a_run_under_its_limits_succeeds_with_its_spend(make_butler, store, runtime) -> None:
    butler = make_butler(extra="[butler.limits]\nmax_tokens = 100000\nmax_cost_usd = 5\n")
    async with service(butler, runtime, store, STEPS) as svc:
        result = await svc.trigger("do the steps")
    assert result.success and result.status == "success", result.error
    assert result.budget is not None and result.budget.stopped_by is None
    assert result.budget.tokens >= 4400 and result.cost_usd is not None and result.cost_usd > 0


async def test_timeout_of_a_hanging_cli(make_butler, store, runtime) -> None:
    # The model never answers: the CLI has started (its first event is out) and hangs.
    hang = '[[turn]]\ndelay_ms = 60000\ntext = "late"\n'
    butler = make_butler(extra="[butler.limits]\ntimeout_s = 5\n")
    async with service(butler, runtime, store, hang) as svc:
        began = time.monotonic()
        result = await svc.trigger("hang")
        took = time.monotonic() - began
    assert took < 7, f"recorded after {took:.1f} s"
    assert result.status == "timeout" and result.error_kind == "timeout", result.error
    record = store.get_session(result.session_id or "")
    assert record is not None and record.status == "timeout"
    assert record.budget is not None and record.budget.stopped_by == "timeout_s"
    assert record.budget.limit == 5 and (record.budget.reached or 0) >= 5
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []
    assert workspaces_of("health") == []


async def test_dollar_budgets_that_cannot_be_enforced_are_refused(
    make_butler, store, monkeypatch, tmp_path
) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    # No API key: a subscription login, where dollars mean nothing; tokens still do.
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / ".credentials.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    spawner = Spawner(make_butler(extra="[butler.limits]\nmax_cost_usd = 1\n"), store=store)
    with pytest.raises(BudgetRefused, match=r"subscription login .* set max_tokens"):
        await spawner.trigger("hello")
    # With a key, a model without any price needs a token budget besides.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    priced_nowhere = Spawner(
        make_butler(extra='[butler.runtime]\nmodel = "mystery-model"\n'), store=store
    )
    with pytest.raises(BudgetRefused, match=r"'mystery-model' has no price.*set max_tokens too"):
        await priced_nowhere.trigger("hello", limits=Limits(max_cost_usd=1))
    assert store.list_sessions() == [], "refused before anything was recorded"


def test_the_command_line_flags_set_the_limits(make_butler, tmp_path) -> None:
    butler = make_butler()
    scenario = tmp_path / "steps.toml"
    scenario.write_text(STEPS)
    common = ["run", "--roster", str(butler.roster_dir), "--butler", "health", "--json"]
    done = spawnkit(*common, "--replay", str(scenario), "--max-tokens", "2000", "do the steps")
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "budget" and result["budget"]["stopped_by"] == "max_tokens"
    assert result["budget"]["limits"]["max_tokens"] == 2000
    refused = spawnkit(*common, "--max-cost-usd", "0", "hello")
    assert refused.returncode == 2 and "--max-cost-usd: must be a finite number above 0" in (
        refused.stderr
    )
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
