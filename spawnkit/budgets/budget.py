"""A run's budget: its :class:`~spawnkit.config.limits.Limits` held against its usage as it arrives.

:func:`admit` decides, before a trigger is accepted, whether its limits can be enforced at
all, and refuses it (:class:`~spawnkit.errors.BudgetRefused`) with the reason when not:

- a dollar budget on a subscription login (no API key in the run's environment) has no
  dollar meaning; token budgets work there;
- a dollar budget on a model with no price at all (not in the pricing table, and no model
  of its family is) cannot be enforced unless a token budget is set too, which then
  applies alone (the record says so);
- a model priced from another of its family (``claude-opus-5`` as the newest opus) is
  priced and flagged (``cost_estimated``).

The model is the one the run will name: the butler's, else the runtime's own default where
spawnkit knows it (Gemini's, or Codex's replay slug). :func:`list_price` prices a finished
run the same way, so a run whose budget was accepted is also priced in its record.

:class:`RunBudget` is then fed every usage total of the run (from the runtime's live usage
events, or from the run's :mod:`~spawnkit.budgets.metering` relay) and says when a limit is
reached, once; the spawner stops the run there. :meth:`RunBudget.report` is what the
run's record keeps.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..config.limits import Limits
from ..errors import BudgetRefused
from ..result import BudgetReport, Usage

if TYPE_CHECKING:  # the pricing table imports numpy; loaded only for a dollar budget
    from ..config.pricing import ModelPrice, PricingTable


@functools.cache
def _pricing() -> PricingTable:
    from ..config.pricing import default_pricing

    return default_pricing()


@dataclass(frozen=True)
class LimitHit:
    """The limit a run reached: its name, its value and the figure the run got to."""

    name: str
    limit: float
    reached: float

    def message(self) -> str:
        if self.name == "daily_cost_usd":
            return (
                f"stopped at ${self.reached:.4f} spent today: the butler reached "
                f"daily_cost_usd = ${self.limit:g}"
            )
        if self.name == "max_cost_usd":
            return f"stopped at ${self.reached:.4f}: the run reached max_cost_usd = ${self.limit:g}"
        if self.name == "timeout_s":
            return f"timed out after {self.limit:g} s (timeout_s)"
        return (
            f"stopped at {self.reached:,.0f} tokens: the run reached "
            f"{self.name} = {self.limit:,.0f}"
        )


# How Claude Code's and Gemini's stops begin: nothing said beyond the limit itself.
_SAID_BY_EVERY_RUNTIME = "reached the max_turns limit"


def max_turns_message(detail: str | None, limit: int, config_file: object = None) -> str:
    """A ``max_turns`` stop: the limit, what the runtime added, and how to raise it."""
    said = (detail or "").rstrip(". ")
    why = "" if not said or said.startswith(_SAID_BY_EVERY_RUNTIME) else f" ({said})"
    where = f" in {config_file}" if config_file else " in the butler's butler.toml"
    return (
        f"stopped at max_turns = {limit}{why}. To allow more: --max-turns N on "
        f"`spawnkit run` or `%%spawn`, or max_turns = N under [butler.runtime]{where}"
    )


@dataclass
class RunBudget:
    """One run's limits, its usage so far, and the limit it reached (if any)."""

    limits: Limits
    model: str | None = None
    price: ModelPrice | None = None
    cost_estimated: bool = False
    note: str | None = None
    usage: Usage = field(default_factory=Usage)
    hit: LimitHit | None = None
    # What the butler had spent today when the run started (with daily_cost_usd).
    spent_today: float | None = None

    @property
    def tokens(self) -> int:
        """Tokens counted towards ``max_tokens``: input (cache writes too) and output."""
        u = self.usage
        counted = u.input_tokens + u.output_tokens + u.cache_write_tokens
        return counted + (u.cache_read_tokens if self.limits.count_cache_reads else 0)

    @property
    def cost_usd(self) -> float | None:
        if self.price is None:
            return None
        u = self.usage
        cost = self.price.cost(
            u.input_tokens, u.output_tokens, u.cache_write_tokens, 0, u.cache_read_tokens
        )
        return float(cost)

    def observe(self, usage: Usage) -> LimitHit | None:
        """Take the run's usage so far; the limit it reaches, the first time it does."""
        self.usage = usage
        if self.hit is not None:
            return None
        limits = self.limits
        if limits.max_tokens is not None and self.tokens >= limits.max_tokens:
            self.hit = LimitHit("max_tokens", limits.max_tokens, self.tokens)
        elif (
            limits.max_cost_usd is not None
            and (cost := self.cost_usd) is not None
            and cost >= limits.max_cost_usd
        ):
            self.hit = LimitHit("max_cost_usd", limits.max_cost_usd, cost)
        elif (
            limits.daily_cost_usd is not None
            and self.spent_today is not None
            and (cost := self.cost_usd) is not None
            and self.spent_today + cost >= limits.daily_cost_usd
        ):
            self.hit = LimitHit("daily_cost_usd", limits.daily_cost_usd, self.spent_today + cost)
        return self.hit

    def check_daily(self, butler: str, spent: float) -> None:
        """Take what the butler spent today; BudgetRefused if its daily budget is spent."""
        daily = self.limits.daily_cost_usd
        if daily is None:
            return
        self.spent_today = spent
        if spent >= daily:
            raise BudgetRefused(
                f"butler {butler!r} has spent ${spent:.4f} today (UTC) of its "
                f"daily_cost_usd = ${daily:g}; it takes runs again after midnight UTC"
            )

    def timed_out(self, seconds: float, elapsed: float) -> LimitHit:
        self.hit = LimitHit("timeout_s", seconds, round(elapsed, 3))
        return self.hit

    def report(self) -> BudgetReport:
        given = {
            "max_cost_usd": self.limits.max_cost_usd,
            "max_tokens": self.limits.max_tokens,
            "max_turns": self.limits.max_turns,
            "timeout_s": self.limits.timeout_s,
            "daily_cost_usd": self.limits.daily_cost_usd,
        }
        hit = self.hit
        cost = self.cost_usd
        return BudgetReport(
            limits={name: float(value) for name, value in given.items() if value is not None},
            tokens=self.tokens,
            cache_read_tokens=self.usage.cache_read_tokens,
            cost_usd=round(cost, 6) if cost is not None else None,
            priced_model=self.model if self.price is not None else None,
            cost_estimated=self.cost_estimated,
            stopped_by=hit.name if hit else None,
            limit=hit.limit if hit else None,
            reached=hit.reached if hit else None,
            note=self.note,
        )


def admit(limits: Limits, model: str | None, *, runtime: str, api_key: bool) -> RunBudget:
    """The budget of a run with ``limits``, or BudgetRefused saying why it cannot be kept.

    ``api_key`` says whether the run authenticates with an API key (else a subscription
    login, where usage has no dollar price).
    """
    limits.validate()
    budget = RunBudget(limits, model)
    dollars = limits.dollar_limits
    if not dollars:
        return budget
    given = " and ".join(f"{name} = {getattr(limits, name):g}" for name in dollars)
    if not api_key:
        raise BudgetRefused(
            f"{given} cannot apply: this {runtime} run uses a subscription login (no API "
            "key), whose usage has no dollar price; set max_tokens instead"
        )
    price, estimated = _pricing().resolve(model)
    if price is None:
        named = f"model {model!r}" if model else f"the {runtime} CLI's default model"
        if limits.max_tokens is None:
            raise BudgetRefused(
                f"{given} cannot be enforced: {named} has no price in spawnkit's pricing "
                "table; set max_tokens too (a token budget), or name a priced model"
            )
        budget.note = (
            f"{' and '.join(dollars)} not enforced: {named} has no price; max_tokens applies alone"
        )
        return budget
    budget.price, budget.cost_estimated = price, estimated
    if estimated:
        budget.note = f"{model} is not in the pricing table: priced as a model of its family"
    return budget


def list_price(model: str | None, usage: Usage) -> float | None:
    """What ``usage`` costs at ``model``'s list price, estimated from its family as
    :func:`admit` does; None for a model with no price."""
    if not model:
        return None
    price = _list_price(model)
    if price is None:
        return None
    cost = price.cost(
        usage.input_tokens, usage.output_tokens, usage.cache_write_tokens, 0,
        usage.cache_read_tokens,
    )  # fmt: skip
    return round(float(cost), 6)


@functools.lru_cache(maxsize=64)
def _list_price(model: str) -> ModelPrice | None:
    """A model's price, resolved once (a batch prices every usage event of its runs)."""
    return _pricing().resolve(model)[0]


def day_start(now: datetime | None = None) -> datetime:
    """Midnight UTC of today: where a daily budget's day begins."""
    now = now or datetime.now(UTC)
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


class UnrecordedSpend:
    """What a spawner's runs have spent that their records do not hold yet.

    The butler's spend today is the store's sum of records plus this. A run moves from here
    to the store when its record is complete (:meth:`settle`); a read of the store that a
    record lands during may or may not hold it, so :meth:`with_store` reads again then.
    """

    READS = 3  # a record landing during each of them: the last read's total may count it twice

    def __init__(self) -> None:
        self._budgets: dict[str, RunBudget] = {}
        self._settled = 0  # how many runs moved to their records: a change means "read again"

    def add(self, session_id: str, budget: RunBudget) -> None:
        """From now on the run's spend counts, until its record holds it."""
        self._budgets[session_id] = budget

    def settle(self, session_id: str) -> None:
        """The run's record holds its spend now."""
        if self._budgets.pop(session_id, None) is not None:
            self._settled += 1

    def total(self, but: RunBudget | None = None) -> float:
        """The runs' spend so far (all but ``but``'s)."""
        return sum(b.cost_usd or 0.0 for b in self._budgets.values() if b is not but)

    async def with_store(self, read: Callable[[], float], but: RunBudget | None = None) -> float:
        """The day's spend: ``read()`` (the store's sum, run in a thread) plus :meth:`total`.

        A run whose record lands while the store is read leaves here meanwhile: counted then
        neither in the read nor here, its spend would be lost and a run let in over the day's
        budget. So the store is read again until no run settled during a read; after
        :data:`READS` such reads, a run settled during the last counts twice (a refusal a
        little early rather than a day overspent)."""
        for _ in range(self.READS):
            settled, before = self._settled, self.total(but)
            spent = await asyncio.to_thread(read)
            if settled == self._settled:
                return spent + self.total(but)
        return spent + before
