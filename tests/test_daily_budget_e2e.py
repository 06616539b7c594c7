"""A butler's daily budget, kept in the store: across processes, at admission and at start.

Runs of the real Claude Code CLI on the replay model, with known usage per turn, so each
turn's price is known; one process spends, another sharing the store is refused.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from spawnkit.errors import BudgetRefused
from spawnkit.history.pricing import default_pricing
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import processes_with_env

MODEL = "claude-sonnet-4-5"
TURN = "usage = { input_tokens = 1000, output_tokens = 100 }"
TWO_TURNS = f"""
[[turn]]
text = "Looking."
tool = "mcp__*__state_list"
input = {{}}
{TURN}
[[turn]]
text = "Done."
{TURN}
"""
pytestmark = pytest.mark.e2e


def turn_cost() -> float:
    price, _ = default_pricing().resolve(MODEL)
    assert price is not None
    return float(price.cost(1000, 100, 0, 0, 0))


def daily_butler(make_butler, daily: float):  # type: ignore[no-untyped-def]
    return make_butler(
        extra=f'[butler.runtime]\nmodel = "{MODEL}"\n[butler.limits]\ndaily_cost_usd = {daily}\n'
    )


def spend_in_another_process(roster: Path, db: Path, script: str, triggers: int) -> str:
    code = textwrap.dedent(
        f"""
        import asyncio, sys, tomllib
        from spawnkit.replay import Scenario
        from spawnkit.config.roster import load_roster
        from spawnkit.serve.service import ButlerService
        from spawnkit.store import SessionStore

        async def main():
            butler = load_roster({str(roster)!r})["health"]
            scenario = Scenario.from_dict(tomllib.loads({script!r}))
            with SessionStore({str(db)!r}) as store:
                async with ButlerService(butler, store=store, replay=scenario) as svc:
                    for _ in range({triggers}):
                        result = await svc.trigger("spend")
                        print(result.status, result.cost_usd, flush=True)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def test_a_spent_daily_budget_refuses_a_trigger_from_another_process(
    make_butler, tmp_path: Path
) -> None:
    cost = 2 * turn_cost()  # one run of the two turns
    butler = daily_butler(make_butler, round(cost * 1.5, 6))
    db = tmp_path / "shared.db"
    printed = spend_in_another_process(butler.roster_dir, db, TWO_TURNS, triggers=2)
    first, second = printed.split("\n")[:2]
    assert first.startswith("success"), "the first run was within the day's budget"
    assert second.startswith("budget"), "the second run was stopped on reaching it"

    with SessionStore(db) as store:
        spent_runs = store.list_sessions()
        assert {r.status for r in spent_runs} == {"success", "budget"}
        stopped = next(r for r in spent_runs if r.status == "budget")
        assert stopped.budget is not None and stopped.budget.stopped_by == "daily_cost_usd"
        assert stopped.cost_usd is not None and stopped.cost_usd > 0
        scenario = Scenario.from_dict(tomllib.loads(TWO_TURNS))
        async with ButlerService(butler, store=store, replay=scenario) as svc:
            with pytest.raises(BudgetRefused, match=r"has spent \$0\.\d+ today .*daily_cost_usd"):
                await svc.trigger("one more")
        assert len(store.list_sessions()) == 2, "refused at admission: nothing recorded"


async def test_a_queued_trigger_is_refused_when_the_budget_ran_out_meanwhile(
    make_butler, store: SessionStore
) -> None:
    # The first run's two turns cost more than the day allows: it is stopped at its
    # second turn, and the run queued behind it is refused when its turn comes.
    butler = daily_butler(make_butler, round(turn_cost() * 1.5, 6))
    scenario = Scenario.from_dict(tomllib.loads(TWO_TURNS))
    async with ButlerService(butler, store=store, replay=scenario) as svc:
        first = asyncio.create_task(svc.trigger("spend it"))
        await asyncio.sleep(0)
        second = asyncio.create_task(svc.trigger("queued behind"))
        spent, refused = await asyncio.gather(first, second)
    assert spent.status == "budget" and spent.budget is not None
    assert spent.budget.stopped_by == "daily_cost_usd"
    assert refused.status == "budget" and refused.error_kind == "daily_budget"
    assert "daily_cost_usd" in (refused.error or "") and refused.tool_calls == []
    record = store.get_session(refused.session_id or "")
    assert record is not None and record.status == "budget" and record.started_at is None
    assert processes_with_env("SPAWNKIT_SESSION_ID", spent.session_id or "") == []
