"""Batch runs: one butler over many prompts, the engine behind ``spawnkit.map``.

A :class:`Batch` takes its items (a prompt, and for side-by-side batches a runtime), a
runner per runtime (a :class:`~spawnkit.run.Spawner`, local or dispatching to a Dask
cluster: the batch cannot tell) and runs them on the running event loop:

* at most ``max_concurrent`` runs at once, dispatched in input order;
* a budget: once the cost so far (finished runs, plus what the runs in flight have
  reported) reaches ``max_cost_usd``, nothing more is dispatched; runs in flight finish
  and the rest are rows ``skipped: budget``;
* :meth:`Batch.stop` (an interrupted cell) dispatches nothing more and cancels the runs
  in flight, which are recorded ``cancelled``; :meth:`Batch.run` still returns a row per
  item, the finished ones intact;
* a :class:`Progress` snapshot after every change, for a progress bar. Its cost of the
  finished runs (the runtimes' own figures) only goes up; the runs in flight are shown
  apart, priced by spawnkit's table as they report usage, because the two prices need not
  agree: summed into one figure, it would drop whenever a run ended below its estimate.

Every item becomes exactly one :class:`BatchRow`; :func:`to_frame` makes them a
DataFrame in input order. A run refused before it was accepted is a row ``refused``
with the reason as its error; :func:`refusal_error` tells when every run was refused for
a reason of configuration (no key, no CLI: a batch that did nothing), and
:func:`refusal_summary` sums the refusals up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..budgets.budget import list_price
from ..errors import ConfigError, MissingApiKeyError, RuntimeNotFoundError, SpawnkitError
from ..events import EventSink, RunEvent, Started, UsageUpdate
from ..result import SpawnerResult
from .worktrees import Worktrees

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

SKIPPED_BUDGET = "skipped: budget"
SKIPPED_STOPPED = "skipped: stopped"
REFUSED = "refused"
# Refusals that every run of the batch would meet alike, whatever its prompt.
CONFIGURATION_REFUSALS = (ConfigError, MissingApiKeyError, RuntimeNotFoundError)

COLUMNS = [
    "prompt", "runtime", "status", "success", "result", "error", "session_id",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "cost_usd", "duration_s", "host", "tool_calls",
]  # fmt: skip


class Runner(Protocol):
    """What a batch needs of a spawner (``Spawner`` is one, local or on a cluster)."""

    async def trigger(
        self,
        prompt: str,
        trigger_source: str = ...,
        *,
        on_event: EventSink | None = ...,
        session_id: str | None = ...,
        workdir: Path | None = ...,
    ) -> SpawnerResult: ...

    async def cancel(self, session_id: str) -> bool: ...


@dataclass(frozen=True)
class BatchItem:
    """One run to make: ``position`` in the batch, ``key`` the input's index label."""

    position: int
    key: Hashable
    prompt: str
    runtime: str


@dataclass(frozen=True)
class BatchRow:
    """What became of one item: its result, or why it never ran."""

    item: BatchItem
    result: SpawnerResult | None = None
    skipped: str | None = None  # SKIPPED_BUDGET, SKIPPED_STOPPED, or REFUSED
    host: str | None = None
    diff: str | None = None
    refusal: SpawnkitError | None = None  # why the run was refused (skipped is REFUSED)

    @property
    def status(self) -> str:
        if self.result is not None:
            return self.result.status
        return self.skipped or "skipped"

    @property
    def error(self) -> str | None:
        if self.result is not None:
            return self.result.error
        return str(self.refusal) if self.refusal is not None else self.skipped

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        usage = r.usage if r is not None else None
        return {
            "prompt": self.item.prompt,
            "runtime": self.item.runtime,
            "status": self.status,
            "success": bool(r is not None and r.success),
            "result": r.output if r is not None else None,
            "error": self.error,
            "session_id": r.session_id if r is not None else None,
            "input_tokens": usage.input_tokens if usage else 0,
            "output_tokens": usage.output_tokens if usage else 0,
            "cache_read_tokens": usage.cache_read_tokens if usage else 0,
            "cache_write_tokens": usage.cache_write_tokens if usage else 0,
            "cost_usd": r.cost_usd if r is not None else None,
            "duration_s": r.duration_ms / 1000 if r is not None else None,
            "host": self.host,
            "tool_calls": len(r.tool_calls) if r is not None else 0,
        }


@dataclass(frozen=True)
class Progress:
    """How a batch stands: counts by state, what the finished runs cost (``cost_usd``, which
    only goes up) and what the runs in flight have used so far (``running_cost_usd``, an
    estimate by spawnkit's price table)."""

    total: int
    done: int = 0
    failed: int = 0
    running: int = 0
    skipped: int = 0
    cost_usd: float = 0.0
    budget_usd: float | None = None
    running_cost_usd: float = 0.0
    stopping: str | None = None  # "budget" or "stopped" once dispatching has ended

    @property
    def waiting(self) -> int:
        return self.total - self.done - self.failed - self.running - self.skipped

    @property
    def finished(self) -> bool:
        return self.running == 0 and self.waiting == 0

    def line(self) -> str:
        """``12/20 · 10 ok · 2 failed · 3 running · $0.0421 (+$0.0050 running)``."""
        parts = [
            f"{self.done + self.failed + self.skipped}/{self.total}",
            f"{self.done} ok",
            f"{self.failed} failed",
            f"{self.running} running",
        ]
        if self.skipped:
            parts.append(f"{self.skipped} skipped")
        cost = f"${self.cost_usd:.4f}"
        if self.running_cost_usd > 0:
            cost += f" (+${self.running_cost_usd:.4f} running)"
        if self.budget_usd is not None:
            cost += f" of ${self.budget_usd:.4f}"
        parts.append(cost)
        if self.stopping == "budget":
            parts.append("budget reached: no new runs")
        elif self.stopping == "stopped":
            parts.append("stopped")
        return " · ".join(parts)


@dataclass
class _InFlight:
    session_id: str
    runtime: str
    cost_usd: float = 0.0


@dataclass
class Batch:
    """Runs ``items`` through ``runners[item.runtime]``; see the module docstring."""

    items: Sequence[BatchItem]
    runners: dict[str, Runner]
    max_concurrent: int
    max_cost_usd: float | None = None
    on_progress: Callable[[Progress], None] | None = None
    on_event: EventSink | None = None
    worktrees: Worktrees | None = None
    host_of: Callable[[str], Awaitable[str | None]] | None = None
    # The batch's own state, not arguments.
    _rows: dict[int, BatchRow] = field(default_factory=dict, init=False, repr=False)
    _flight: dict[int, _InFlight] = field(default_factory=dict, init=False, repr=False)
    _spent: float = field(default=0.0, init=False, repr=False)
    _stopping: str | None = field(default=None, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise SpawnkitError("max_concurrent must be at least 1")
        if self.max_cost_usd is not None and self.max_cost_usd <= 0:
            raise SpawnkitError("max_cost_usd must be more than 0")
        missing = {item.runtime for item in self.items} - set(self.runners)
        if missing:
            raise SpawnkitError(f"no runner for runtime(s) {', '.join(sorted(missing))}")

    # -- state -----------------------------------------------------------------------

    @property
    def cost_so_far(self) -> float:
        return self._spent + sum(run.cost_usd for run in self._flight.values())

    def progress(self) -> Progress:
        rows = self._rows.values()
        return Progress(
            total=len(self.items),
            done=sum(1 for r in rows if r.result is not None and r.result.success),
            failed=sum(1 for r in rows if r.result is not None and not r.result.success),
            running=len(self._flight),
            skipped=sum(1 for r in rows if r.result is None),
            cost_usd=self._spent,
            budget_usd=self.max_cost_usd,
            running_cost_usd=sum(run.cost_usd for run in self._flight.values()),
            stopping=self._stopping,
        )

    def _report(self) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(self.progress())
            except Exception:  # a broken progress bar must not lose a batch
                logger.exception("spawnkit.map: the progress display failed")

    def _over_budget(self) -> bool:
        return self.max_cost_usd is not None and self.cost_so_far >= self.max_cost_usd

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Dispatch nothing more and cancel the runs in flight (call on the batch's loop)."""
        if self._stopping != "stopped":
            self._stopping = "stopped"
            self._wake.set()

    async def run(self) -> list[BatchRow]:
        """Run every item (or skip it); one row per item, in input order."""
        self._report()
        tasks: set[asyncio.Task[None]] = set()
        try:
            for item in self.items:
                while len(self._flight) >= self.max_concurrent and self._stopping is None:
                    self._wake.clear()
                    await self._wake.wait()
                if self._stopping is None and self._over_budget():
                    self._stopping = "budget"
                if self._stopping is not None:
                    break
                self._flight[item.position] = _InFlight(str(uuid.uuid4()), item.runtime)
                tasks.add(asyncio.create_task(self._one(item), name=f"spawnkit-map:{item.key}"))
                self._report()
            if self._stopping == "stopped":
                await self._cancel_in_flight()
            while tasks - {t for t in tasks if t.done()}:
                pending = {t for t in tasks if not t.done()}
                stop_wait = asyncio.ensure_future(self._wait_for_stop())
                await asyncio.wait({*pending, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                if self._stopping == "stopped":
                    await self._cancel_in_flight()
        except asyncio.CancelledError:
            # The caller itself was cancelled: stop, record, pass the cancel on.
            self.stop()
            await self._cancel_in_flight()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        await asyncio.gather(*tasks, return_exceptions=True)
        why = SKIPPED_BUDGET if self._stopping == "budget" else SKIPPED_STOPPED
        for item in self.items:
            self._rows.setdefault(item.position, BatchRow(item, skipped=why))
        self._report()
        return [self._rows[item.position] for item in self.items]

    async def _wait_for_stop(self) -> None:
        while self._stopping != "stopped":
            self._wake.clear()
            await self._wake.wait()

    async def _cancel_in_flight(self) -> None:
        await asyncio.gather(
            *(self.runners[f.runtime].cancel(f.session_id) for f in self._flight.values()),
            return_exceptions=True,
        )

    # -- one run ---------------------------------------------------------------------

    async def _one(self, item: BatchItem) -> None:
        flight = self._flight[item.position]
        workdir: Path | None = None
        # What a cancel of this task (the caller's, not a stop) leaves.
        row = BatchRow(item, result=_cancelled(flight.session_id))

        def observe(event: RunEvent) -> None:
            if isinstance(event, UsageUpdate):
                cost = event.cost_usd
                if cost is None:
                    cost = list_price(event.model, event.usage)
                if cost is not None:
                    flight.cost_usd = cost
                    self._report()
            elif isinstance(event, Started):
                self._report()
            if self.on_event is not None:
                self.on_event(event)

        try:
            if self.worktrees is not None:
                workdir = await asyncio.to_thread(self.worktrees.add, f"{item.position:05d}")
            if self._stopping == "stopped":  # stopped while its worktree was made
                row = BatchRow(item, skipped=SKIPPED_STOPPED)
                return
            result = await self.runners[item.runtime].trigger(
                item.prompt, "map",
                on_event=observe, session_id=flight.session_id, workdir=workdir,
            )  # fmt: skip
            if result.cost_usd is None:
                result = replace(result, cost_usd=list_price(result.model, result.usage))
            row = BatchRow(item, result=result)
            if self.host_of is not None and result.session_id:
                with contextlib.suppress(Exception):
                    row = replace(row, host=await self.host_of(result.session_id))
            if workdir is not None and self.worktrees is not None:
                row = replace(row, diff=await asyncio.to_thread(self.worktrees.diff, workdir))
        except SpawnkitError as exc:  # refused before it was accepted (no key, queue full, ...)
            row = BatchRow(item, skipped=REFUSED, refusal=exc)
        except Exception as exc:
            logger.exception("spawnkit.map: item %s failed outside its run", item.key)
            row = BatchRow(item, skipped=f"error: {type(exc).__name__}: {exc}")
        finally:
            if workdir is not None and self.worktrees is not None:
                await asyncio.to_thread(self.worktrees.remove, workdir)
            self._flight.pop(item.position, None)
            self._rows[item.position] = row
            if row.result is not None and row.result.cost_usd is not None:
                self._spent += row.result.cost_usd
            self._wake.set()
            self._report()


def refusal_error(rows: Sequence[BatchRow]) -> SpawnkitError | None:
    """The error to raise when every run was refused for a reason of configuration.

    Such a batch did nothing, and every run of it again would do nothing, so a frame of
    refusals would read as a result: the one reason (the error itself, of its own type), or
    a :class:`BatchRefused` naming each when the runtimes of a side-by-side batch differ.
    """
    refused = [row.refusal for row in rows if row.refusal is not None]
    if not refused or len(refused) < len(rows):
        return None
    if not all(isinstance(exc, CONFIGURATION_REFUSALS) for exc in refused):
        return None
    reasons = list(dict.fromkeys(str(exc) for exc in refused))
    if len(reasons) == 1:
        return refused[0]
    return BatchRefused(f"every run of the batch was refused: {'; '.join(reasons)}")


def refusal_summary(rows: Sequence[BatchRow]) -> str | None:
    """``3 of 10 runs were refused ...: <reason> (2 runs); <reason> (1 run)``, or None."""
    counts: dict[str, int] = {}
    for row in rows:
        if row.refusal is not None:
            counts[str(row.refusal)] = counts.get(str(row.refusal), 0) + 1
    if not counts:
        return None
    refused = sum(counts.values())
    why = "; ".join(f"{reason} ({n} run{'s' if n > 1 else ''})" for reason, n in counts.items())
    return f"{refused} of {len(rows)} runs were refused (status 'refused'): {why}"


class BatchRefused(ConfigError):
    """Every run of a batch was refused, for more than one reason of configuration."""


def _cancelled(session_id: str) -> SpawnerResult:
    return SpawnerResult(
        success=False, status="cancelled", error="cancelled", session_id=session_id
    )


def items_for(prompts: Sequence[tuple[Hashable, str]], runtimes: Sequence[str]) -> list[BatchItem]:
    """One item per prompt and runtime, prompt-major (every runtime of a prompt together)."""
    items: list[BatchItem] = []
    for key, prompt in prompts:
        for runtime in runtimes:
            items.append(BatchItem(len(items), key, prompt, runtime))
    return items


def to_frame(rows: Sequence[BatchRow], *, index_name: Hashable | None = None) -> pd.DataFrame:
    """The rows as a DataFrame indexed like the input; ``diff`` only when worktrees ran."""
    import pandas as pd

    records = [row.to_dict() for row in rows]
    if any(row.diff is not None for row in rows):
        for record, row in zip(records, rows, strict=True):
            record["diff"] = row.diff
    frame = pd.DataFrame.from_records(
        records,
        columns=[*COLUMNS, *(["diff"] if records and "diff" in records[0] else [])],
        index=pd.Index([row.item.key for row in rows], name=index_name),
    )
    return frame
