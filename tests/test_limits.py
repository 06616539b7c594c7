"""``[butler.limits]`` as configuration, and what a run's budget admits and counts."""

from __future__ import annotations

import asyncio
import re

import pytest

from spawnkit.budgets.budget import RunBudget, UnrecordedSpend, admit
from spawnkit.config.limits import Limits
from spawnkit.errors import BudgetRefused, InvalidArgument, RosterError
from spawnkit.result import Usage


def test_butler_limits_are_read_and_kept_with_the_runtime(make_butler) -> None:
    butler = make_butler(
        extra="""
        [butler.limits]
        max_cost_usd = 0.5
        max_tokens = 20000
        count_cache_reads = true
        max_turns = 7
        timeout_s = 30
        """
    )
    assert butler.limits == Limits(max_cost_usd=0.5, max_tokens=20000, count_cache_reads=True)
    assert (butler.runtime.max_turns, butler.runtime.timeout_s) == (7, 30.0)
    # A flag or option is laid over them; what it leaves unset stays the butler's.
    flagged = butler.with_limits(Limits(max_tokens=100, timeout_s=5))
    assert flagged.limits == Limits(max_cost_usd=0.5, max_tokens=100, count_cache_reads=True)
    assert (flagged.runtime.max_turns, flagged.runtime.timeout_s) == (7, 5.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[butler.limits]\nmax_tokens = 0\n", "[butler.limits.max_tokens]: must be at least 1"),
        ("[butler.limits]\nmax_cost_usd = -1\n", "[butler.limits.max_cost_usd]: must be positive"),
        ("[butler.limits]\nmax_dollars = 1\n", "[butler.limits.max_dollars]: unknown key"),
        (
            "[butler.runtime]\ntimeout_s = 9\n[butler.limits]\ntimeout_s = 5\n",
            "also set as butler.runtime.timeout_s",
        ),
    ],
)
def test_bad_limits_name_the_key(make_butler, extra: str, message: str) -> None:
    with pytest.raises(RosterError, match=re.escape(message)):
        make_butler(extra=extra)


def test_limits_given_to_a_run_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="max_tokens must be positive, not 0"):
        Limits(max_tokens=0).validate()


def test_tokens_count_input_and_output_and_cache_reads_only_when_asked() -> None:
    usage = Usage(input_tokens=100, output_tokens=20, cache_read_tokens=1000, cache_write_tokens=5)
    plain = admit(Limits(max_tokens=200), None, runtime="codex", api_key=False)
    assert plain.observe(usage) is None and plain.tokens == 125
    counted = admit(
        Limits(max_tokens=200, count_cache_reads=True), None, runtime="codex", api_key=False
    )
    hit = counted.observe(usage)
    assert hit is not None and (hit.name, hit.limit, hit.reached) == ("max_tokens", 200, 1125)
    assert counted.observe(usage) is None, "a limit is reported once"
    report = counted.report()
    assert (report.stopped_by, report.tokens, report.cache_read_tokens) == (
        "max_tokens",
        1125,
        1000,
    )


def test_subscription_logins_take_token_budgets_but_refuse_dollar_budgets() -> None:
    assert admit(Limits(max_tokens=10), "claude-sonnet-4-5", runtime="claude-code", api_key=False)
    with pytest.raises(BudgetRefused, match=r"subscription login \(no API key\)"):
        admit(Limits(max_cost_usd=1), "claude-sonnet-4-5", runtime="claude-code", api_key=False)


def test_a_model_without_price_needs_a_token_budget_for_a_dollar_one() -> None:
    with pytest.raises(BudgetRefused, match="the codex CLI's default model has no price"):
        admit(Limits(max_cost_usd=1), None, runtime="codex", api_key=True)
    budget = admit(Limits(max_cost_usd=1, max_tokens=50), "mystery", runtime="codex", api_key=True)
    assert budget.price is None and "max_cost_usd not enforced" in (budget.note or "")
    assert budget.observe(Usage(input_tokens=60)) is not None, "the token budget applies"


def test_unknown_models_of_a_known_family_are_priced_and_flagged() -> None:
    exact = admit(Limits(max_cost_usd=1), "claude-sonnet-4-5", runtime="claude-code", api_key=True)
    family = admit(Limits(max_cost_usd=1), "claude-sonnet-9", runtime="claude-code", api_key=True)
    assert exact.price is not None and not exact.cost_estimated
    assert family.price is not None and family.cost_estimated and family.report().cost_estimated
    family.observe(Usage(input_tokens=1_000_000))
    assert family.cost_usd is not None and family.cost_usd > 0


def _spending(cost_in_tokens: int) -> tuple[RunBudget, float]:
    budget = admit(Limits(daily_cost_usd=1), "claude-sonnet-4-5", runtime="claude-code",
                   api_key=True)  # fmt: skip
    budget.observe(Usage(input_tokens=cost_in_tokens))
    assert budget.cost_usd
    return budget, budget.cost_usd


async def test_a_record_landing_while_the_store_is_read_is_counted_once() -> None:
    # The race a queued run's start check lost: the store was read before the run ahead of
    # it was recorded, and that run left the unrecorded spend before the read came back.
    loop = asyncio.get_running_loop()
    ahead, cost = _spending(2000)
    spend = UnrecordedSpend()
    spend.add("ahead", ahead)
    store = [0.0]  # the records' sum
    reads: list[float] = []

    def read() -> float:
        seen = store[0]
        if not reads:  # the run ahead is recorded while this read is under way
            store[0] = cost
            asyncio.run_coroutine_threadsafe(_settle(spend, "ahead"), loop).result()
        reads.append(seen)
        return seen

    assert await spend.with_store(read) == pytest.approx(cost)
    assert reads == [0.0, cost], "read again after a record landed"
    # Without a record landing, one read: the store's sum and what is not in it yet.
    spend.add("running", _spending(1000)[0])
    assert await spend.with_store(read) == pytest.approx(cost + cost / 2)
    assert len(reads) == 3


async def test_records_landing_during_every_read_count_twice_rather_than_not_at_all() -> None:
    loop = asyncio.get_running_loop()
    spend = UnrecordedSpend()
    runs = [_spending(1000 * (i + 1)) for i in range(UnrecordedSpend.READS)]
    for i, (budget, _) in enumerate(runs):
        spend.add(str(i), budget)
    store = [0.0]
    reads = 0

    def read() -> float:  # each read sees the record that lands during it
        nonlocal reads
        store[0] += runs[reads][1]
        asyncio.run_coroutine_threadsafe(_settle(spend, str(reads)), loop).result()
        reads += 1
        return store[0]

    costs = [cost for _, cost in runs]
    # Given up after the last read: the run recorded during it counts twice.
    assert await spend.with_store(read) == pytest.approx(sum(costs) + costs[-1])
    assert reads == UnrecordedSpend.READS


async def _settle(spend: UnrecordedSpend, session_id: str) -> None:
    spend.settle(session_id)
