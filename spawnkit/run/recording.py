"""What is written of a run, and the results it is written with.

Every accepted trigger gets exactly one session record, created before the runtime starts
(:meth:`Recorder.open`, or adopted from the client that dispatched it) and completed when
the run ends, whatever happens (:meth:`Recorder.close`). The results built here are
redacted by the run's redactor, so the record and the caller get the same redacted result.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ..budgets.budget import list_price
from ..containment.workspace import remove_all
from ..errors import StoreError
from ..redaction import Redactor
from ..result import RunStatus, SpawnerResult, Usage
from ..runtimes.base import RunOutcome, RuntimeAdapter
from ..store import SessionStore, WriteWouldWait
from ..telemetry.runlog import session_log_path
from .accepted import AcceptedRun
from .collector import Collector
from .settings import RunSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Recorder:
    """Writes a run's record at its start and end, and builds the results written there."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings

    async def open(self, run: AcceptedRun) -> None:
        """Create the run's record, or adopt the ``queued`` one its dispatching client made."""
        if run.queued_by is not None:
            await self._adopt(run)
            return
        settings, butler = self.settings, self.settings.butler
        store = settings.store
        await on_store(store, functools.partial(
            store.create_session,
            run.session_id,
            butler=butler.name,
            runtime=butler.runtime.type,
            model=settings.model,
            prompt=run.redactor.text(run.prompt),
            context=run.redactor.text(run.context),
            trigger_source=run.trigger_source,
            runtime_session_id=run.runtime_session_id or run.resume,
            parent_session_id=run.parent_session_id,
            log_dir=session_log_path(run.session_id),
            role=run.role,
            kind=run.kind,
            sources=[source.name for source in run.sources],
        ))  # fmt: skip

    async def _adopt(self, run: AcceptedRun) -> None:
        """Take over the ``queued`` record the dispatching client made (spawnkit.run.dispatch)."""
        assert run.queued_by is not None
        adopted = await asyncio.to_thread(
            self.settings.store.adopt_session, run.session_id, queued_by=run.queued_by,
            model=self.settings.model, prompt=run.redactor.text(run.prompt),
            context=run.redactor.text(run.context),
            runtime_session_id=run.runtime_session_id or run.resume,
            log_dir=session_log_path(run.session_id),
        )  # fmt: skip
        if not adopted:
            raise StoreError(
                f"session {run.session_id}: its queued record is closed or was taken by "
                "another worker; it is not run"
            )

    async def close(self, run: AcceptedRun, result: SpawnerResult) -> None:
        """Remove the run's workspaces and complete its record with ``result``, in one
        thread; a cancel neither stops that nor ends this before it is done."""
        live_calls = run.collector.live_calls

        async def record() -> None:
            # The live tool-call writes first: the result's write rewrites the calls.
            if live_calls is not None:
                await live_calls.flush()
            await in_thread(self._finish, run, result)

        # Nothing to wait for first (a run that made no tool call): the thread's own
        # future, with no task around it.
        writing = (
            asyncio.ensure_future(record())
            if live_calls is not None and live_calls.writing
            else thread_future(self._finish, run, result)
        )
        while not writing.done():
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:
                logger.debug("cancelled while recording session %s; the write goes on",
                             run.session_id)  # fmt: skip
        writing.result()

    def _finish(self, run: AcceptedRun, result: SpawnerResult) -> None:
        """The end of a run's record, in a thread: its workspaces removed first (the record
        names the last, for a sweep), then the setup a ``repo=`` run adds, then the result."""
        store = self.settings.store
        try:
            remove_all(run.workspaces)
        finally:
            if result.repo is not None and run.setup is not None:  # repo=: `spawnkit apply`
                sandbox, given = run.setup
                given = {**given, "repo": result.repo.to_dict()}
                store.record_setup(run.session_id, sandbox=sandbox, given=given)
            store.complete_session(run.session_id, result)

    def unfinished(
        self, collector: Collector, status: RunStatus, error: str, kind: str
    ) -> SpawnerResult:
        """A result for a run that ended before its runtime reported an outcome."""
        now = now_utc()
        calls = [
            call if call.finished_at else call.finish(f"[not finished: {error}]", True, now)
            for call in collector.calls.values()
        ]
        unfinished = SpawnerResult(
            output=collector.partial_output,
            tool_calls=calls,
            success=False,
            error=error,
            error_kind=kind,
            status=status,
            usage=collector.usage,
            cost_usd=collector.cost_usd,
            model=self.settings.model,
            trace_id=collector.trace_id,
            permissions=tuple(collector.permissions),
        )
        return collector.redactor.result(unfinished)

    def result(
        self,
        collector: Collector,
        outcome: RunOutcome | None,
        status: RunStatus,
        error: str | None,
        error_kind: str | None,
        trace_id: str | None,
        clock: float,
    ) -> SpawnerResult:
        calls = list(collector.calls.values())
        if outcome is None:
            result = self.unfinished(collector, status, error or "the run failed", error_kind or "")
            return replace(result, trace_id=trace_id, duration_ms=ms_since(clock))
        finished = SpawnerResult(
            output=outcome.output
            if outcome.success
            else (outcome.output or collector.partial_output),
            tool_calls=calls,
            success=outcome.success,
            error=error,
            error_kind=error_kind,
            status=status,
            runtime_session_id=outcome.runtime_session_id,
            duration_ms=ms_since(clock),
            # A CLI that tells no usage of its own (claude-code-acp): its relay's meter did.
            usage=outcome.usage
            if outcome.usage != Usage() or not collector.metered
            else collector.usage,
            cost_usd=outcome.cost_usd,
            trace_id=trace_id,
            model=outcome.model or self.settings.model,
            # A CLI that does not count model calls (Codex): its relay's meter did.
            num_turns=outcome.num_turns if outcome.num_turns is not None else collector.model_calls,
            exit_code=outcome.exit_code,
            permissions=tuple(collector.permissions),
        )
        # The outcome's output and error come from the adapter, not through the collector.
        return collector.redactor.result(finished)

    @staticmethod
    def with_budget(run: AcceptedRun, result: SpawnerResult) -> SpawnerResult:
        """The result priced (the list price of its model when the runtime reported no
        cost), with the run's budget report when it had limits that needed one."""
        budget = run.budget
        if result.cost_usd is None:
            # Codex and Gemini report no cost: the list price of the model they named.
            result = replace(result, cost_usd=list_price(result.model, result.usage))
        if not budget.limits.needs_usage and budget.hit is None:
            return result
        cost = result.cost_usd
        if cost is None and budget.limits.needs_usage:
            cost = budget.cost_usd  # Codex and Gemini report no cost: the budget's price
        return replace(result, budget=budget.report(), cost_usd=cost)

    @staticmethod
    def keep_transcripts(worker: RuntimeAdapter, workspace: Path, redactor: Redactor) -> None:
        try:
            worker.keep_transcripts(workspace, redactor.text)
        except OSError:
            logger.exception("could not keep the transcripts of the run in %s", workspace)


async def on_store(store: SessionStore, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, whose writes are ``store``'s: here on the event loop when the store
    is a SQLite file whose write lock is free, else in a thread (a server's round trip, or
    a writer to wait for). A small write costs less than waking a thread and being woken
    by it: a third of a millisecond of this process's CPU each way, on a virtual machine.
    ``fn`` must change nothing before its first write, which is then retried whole."""
    if store.writes_at_once:
        try:
            with store.without_waiting():
                return fn(*args)
        except WriteWouldWait:
            pass
    return await in_thread(fn, *args)


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread, or here if the interpreter is exiting and starts none.

    A kernel's graceful shutdown cancels its runs from ``atexit``, when thread pools refuse
    new work; the run's record and transcripts must still be written.
    """
    try:
        return await asyncio.to_thread(fn, *args)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
        return fn(*args)


def thread_future(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """:func:`in_thread` as a future rather than a coroutine (what a caller shields until
    done needs no task around it); done at once if the interpreter is exiting."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    try:
        return loop.run_in_executor(None, call)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
    done: asyncio.Future[T] = loop.create_future()
    try:
        done.set_result(fn(*args))
    except Exception as failure:  # noqa: BLE001 - handed to the awaiting caller as it was
        done.set_exception(failure)
    return done


def now_utc() -> datetime:
    return datetime.now(UTC)


def ms_since(clock: float) -> int:
    return int((time.monotonic() - clock) * 1000)
