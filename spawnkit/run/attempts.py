"""Attempts: a run started, and started again while it fails on a rate limit or overload.

Each start first waits out the butler's cool-down and stagger (:mod:`spawnkit.budgets.pacing`)
and gets a workspace, a span and the parts :mod:`spawnkit.run.assembly` opens; its CLI
runs until it ends, its timeout, a cancel, or one of the run's limits
(:mod:`spawnkit.budgets.budget`, fed by the collector or the relay's meter) stops it. What this
spawner's runs spend counts towards the butler's daily budget until their records hold
it. Whatever outlived the CLI is reaped; its transcripts are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from ..budgets.budget import LimitHit, UnrecordedSpend, day_start, max_turns_message
from ..config.retry import RETRYABLE_KINDS, retry_after_hint
from ..containment import pid_namespace, run_group
from ..containment.mcp_access import AccessTable
from ..containment.run_group import RunGroup
from ..containment.sandbox import SandboxPlan
from ..containment.sweep import reap
from ..containment.workspace import remove_all, run_workspace
from ..errors import (
    BudgetRefused,
    ConfigError,
    ModelUnavailable,
    RuntimeFailure,
    RuntimeNotFoundError,
    StoreError,
)
from ..events import Started
from ..result import Attempt, AttemptOutcome, RunStatus, SpawnerResult, tool_count
from ..runtimes.base import RunOutcome, RunSpec, RuntimeAdapter
from ..signals import finish, finish_in_thread
from ..telemetry.spans import RunSpan, run_span
from .accepted import CANCEL_GRACE_S, AcceptedRun, RunStart
from .assembly import Assembly
from .recording import Recorder, in_thread, ms_since, now_utc
from .settings import RunSettings

logger = logging.getLogger(__name__)


class Attempts:
    """Runs an accepted run's attempts and keeps its spend in view of the daily budget."""

    def __init__(self, settings: RunSettings, assembly: Assembly, recorder: Recorder) -> None:
        self.settings = settings
        self.assembly = assembly
        self.recorder = recorder
        # Runs started here whose spend is not in the store yet (for the daily budget).
        self.spending = UnrecordedSpend()

    async def run(self, run: AcceptedRun) -> SpawnerResult:
        """The run, started again while it fails on a rate limit or overload before any tool.

        Each start first waits out the butler's cool-down and stagger
        (:mod:`spawnkit.budgets.pacing`). A rate limit or overload sets the cool-down to the
        backoff of :mod:`spawnkit.config.retry`, whether or not this run is started again; a run
        that had called a tool is not (its tools may have had effects) and fails saying so. The
        result lists every attempt and its duration covers them all.
        """
        policy = self.settings.retry
        attempts: list[Attempt] = []
        first = time.monotonic()
        while True:
            waited = await self.settings.pacer.wait()
            if not attempts:
                first = time.monotonic()
            begun = now_utc()
            result = await self._execute(run, begun)
            outcome = attempt_outcome(result)
            attempts.append(
                Attempt(
                    number=len(attempts) + 1, started_at=begun, ended_at=now_utc(), outcome=outcome,
                    message=None if result.success else result.error,
                    cooldown_s=waited.cooldown_s, stagger_s=waited.stagger_s,
                )
            )  # fmt: skip
            if outcome not in RETRYABLE_KINDS:
                break
            self.settings.pacer.cool_down(
                policy.backoff(len(attempts), retry_after_hint(result.error))
            )
            if result.tool_calls:
                if policy.max_attempts > 1:
                    done = tool_count(len(result.tool_calls), result.failed_tool_calls)
                    reason = f"not retried: the run had already made {done}"
                    result = replace(result, error=f"{result.error}; {reason}")
                break
            if len(attempts) >= policy.max_attempts:
                if len(attempts) > 1:
                    result = replace(
                        result, error=f"{result.error}; gave up after {len(attempts)} attempts"
                    )
                break
            logger.info(
                "run %s of butler %s: %s on attempt %d; retrying after the cool-down (%.1f s)",
                run.session_id, self.settings.butler.name, outcome, len(attempts),
                self.settings.pacer.cooling_for,
            )  # fmt: skip
            await self.withdraw_secret(run)
            await finish_in_thread(remove_all, run.workspaces)  # not left for the cool-down
            run.collector.restart()
        return replace(result, attempts=tuple(attempts), duration_ms=ms_since(first))

    async def daily_budget_spent(self, run: AcceptedRun) -> SpawnerResult | None:
        """A refusal, if the butler's daily budget was spent while the run waited its turn.

        From here the run's spend counts towards the day's until its record holds it.
        """
        self.spending.add(run.session_id, run.budget)
        if run.budget.limits.daily_cost_usd is None:
            return None
        butler = self.settings.butler.name
        spent = await self.spending.with_store(
            lambda: self.settings.store.spent_since(butler, day_start()), but=run.budget
        )
        try:
            run.budget.check_daily(butler, spent)
        except BudgetRefused as refused:
            result = self.recorder.unfinished(run.collector, "budget", str(refused), "daily_budget")
            return replace(result, budget=run.budget.report())
        return None

    async def withdraw_secret(self, run: AcceptedRun) -> None:
        """The run is over: from now on its MCP secret is refused."""
        secret, run.mcp_secret = run.mcp_secret, None
        if secret is None:
            return
        access = self.settings.mcp_access
        if isinstance(access, AccessTable):  # in this process: at once, nothing to shield
            access.remove(secret)
            return
        try:
            await asyncio.shield(access.revoke(secret))
        except asyncio.CancelledError:
            logger.debug("cancelled while withdrawing the secret of %s; it goes on", run.session_id)

    async def _execute(self, run: AcceptedRun, started_at: datetime) -> SpawnerResult:
        butler = self.settings.butler
        clock = time.monotonic()
        with run_span(
            butler=butler.name,
            runtime=butler.runtime.type,
            model=self.settings.model,
            session_id=run.session_id,
            trigger_source=run.trigger_source,
            provider=self.settings.tracer_provider,
            redactor=run.redactor,
            kind=run.kind,
        ) as span:
            async with run_workspace(
                butler, self.settings.workspace_root, handed_to=run.workspaces,
                session_id=run.session_id,
            ) as workspace:  # fmt: skip
                result = await self._in_workspace(run, started_at, span, workspace, clock)
        if result.success and self.settings.memory is not None:
            try:
                await self.settings.memory.store_episode(
                    butler.name, run.session_id, run.redactor.text(run.prompt), result.output
                )
            except Exception:
                logger.exception(
                    "memory: could not store the episode of %s; going on", run.session_id
                )
        return result

    async def _in_workspace(
        self, run: AcceptedRun, started_at: datetime, span: RunSpan, workspace: Path, clock: float
    ) -> SpawnerResult:
        butler, worker, collector = self.settings.butler, run.worker, run.collector
        collector.span = span
        collector.trace_id = trace_id = span.trace_id
        # Recorded with the run's setup, in one transaction, just before its CLI starts
        # (Assembly.prepare); by the end of this attempt if it never gets that far.
        run.start = RunStart(started_at, trace_id, workspace)
        collector.emit(
            Started(
                run.session_id,
                butler.name,
                butler.runtime.type,
                self.settings.model,
                run.runtime_session_id,
                max_turns=run.max_turns,
            )
        )
        outcome: RunOutcome | None = None
        status: RunStatus = "failed"
        error: str | None = None
        error_kind: str | None = None
        exit_code: int | None = None
        # A sandboxed run's end waits until its pid namespace is gone (.pid_namespace);
        # an unsandboxed one gets a cgroup of its own where one can be made, and its end
        # waits until that cgroup is empty.
        contained = False
        group: RunGroup | None = None
        try:
            async with contextlib.AsyncExitStack() as parts:
                spec = await self.assembly.assemble(run, workspace, span, parts)
                contained = spec.sandbox.kind == "bwrap"
                group = None if contained else await _run_group(run.session_id)
                if group is not None:
                    spec = replace(spec, sandbox=grouped(spec.sandbox, group))
                async with asyncio.timeout(run.timeout_s):
                    outcome = await self._invoke(run, spec)
            status = "success" if outcome.success else "failed"
            error, error_kind = outcome.error, outcome.error_kind
            if error_kind == "max_turns":
                error = max_turns_message(error, run.max_turns, butler.config_file)
                # A CLI counts the turn it refused to start; the counter ends at the limit.
                turns = outcome.num_turns or collector.model_calls or run.max_turns
                outcome.num_turns = min(turns, run.max_turns)
            if not outcome.success and run.relay is not None and run.relay.unreachable:
                # The CLI's own message hides the address: the relay's names it.
                error = f"{run.relay.unreachable[-1]} ({ModelUnavailable.remedy})"
                error_kind = ModelUnavailable.kind_default
        except LimitReached as reached:
            status, error, error_kind = "budget", reached.hit.message(), "budget"
        except TimeoutError:
            run.budget.timed_out(run.timeout_s, time.monotonic() - clock)
            status, error_kind = "timeout", "timeout"
            error = f"timed out after {run.timeout_s:g} s (timeout_s)"
        except (RuntimeFailure, RuntimeNotFoundError, ConfigError) as exc:
            error, exit_code = str(exc), getattr(exc, "exit_code", None)
            error_kind = getattr(
                exc, "kind", "config" if isinstance(exc, ConfigError) else "not_found"
            )
            worker.reset()
        except StoreError:
            raise  # the store's own failure, recorded by Spawner._run as such
        except Exception as exc:
            # Not a RuntimeFailure: a bug or an unforeseen error in the adapter (or in
            # preparing the run). The run fails with what was raised; the adapter is
            # reset like after any failure, and the span carries the exception.
            logger.exception(
                "run %s of butler %s raised %s", run.session_id, butler.name,
                type(exc).__name__,
            )  # fmt: skip
            error, error_kind = f"{type(exc).__name__}: {exc}", "adapter_error"
            span.record_exception(exc)
            worker.reset()
        except asyncio.CancelledError:
            cancelled = self.recorder.unfinished(
                collector, "cancelled", "the run was cancelled", "cancelled"
            )
            span.finish(replace(cancelled, duration_ms=ms_since(clock)))
            await _reap(run.session_id, workspace, group, contained)
            raise
        finally:
            if run.start is not None:  # it ended before its CLI could start
                await asyncio.shield(in_thread(self._record_start, run))
            if keeps_transcripts(worker):
                await asyncio.shield(
                    in_thread(self.recorder.keep_transcripts, worker, workspace, run.redactor)
                )
        if outcome is not None and not outcome.success:
            worker.reset()
        result = self.recorder.result(
            collector, outcome, status, error, error_kind, trace_id, clock
        )
        if outcome is None and exit_code is not None:
            result = replace(result, exit_code=exit_code)
        result = self.recorder.with_budget(run, result)
        span.finish(result)
        # Whatever is left in the run's cgroup now is a leftover: tools a stopped CLI left
        # running, children the agent backgrounded into sessions of their own (Claude Code
        # and Gemini do that to every tool). Killing them waits for them to go; where no
        # cgroup could be made an unsandboxed run is found by a scan of this user's
        # processes, in a thread. A sandbox's pid namespace, still being torn down after
        # bwrap exited, is waited for.
        await _reap(run.session_id, workspace, group, contained)
        return result

    def _record_start(self, run: AcceptedRun) -> None:
        """Record the attempt's start on its own (its setup never came)."""
        start, run.start = run.start, None
        if start is not None:
            self.settings.store.mark_started(
                run.session_id, started_at=start.started_at, trace_id=start.trace_id,
                workspace=start.workspace,
            )  # fmt: skip

    async def _invoke(self, run: AcceptedRun, spec: RunSpec) -> RunOutcome:
        """The worker's run, stopped (``LimitReached``) as soon as it reaches a limit."""
        reached: asyncio.Future[LimitHit] = asyncio.get_running_loop().create_future()

        def on_limit(hit: LimitHit) -> None:
            if not reached.done():
                reached.set_result(hit)

        run.collector.on_limit = on_limit
        invoke = asyncio.ensure_future(
            run.worker.interact(spec)
            if run.kind == "chat"
            else run.worker.invoke(spec, run.collector.emit)
        )
        try:
            await asyncio.wait(
                {invoke, cast(asyncio.Future[Any], reached)}, return_when=asyncio.FIRST_COMPLETED
            )
            stopped = not invoke.done()
        finally:
            run.collector.on_limit = None
            if not invoke.done():
                # Stopped by a limit, a timeout or a cancel: the adapter kills its CLI.
                invoke.cancel()
                await asyncio.wait({invoke}, timeout=CANCEL_GRACE_S)
        if stopped:
            if invoke.done() and not invoke.cancelled() and invoke.exception() is not None:
                logger.debug("run %s: its CLI ended on %r when stopped", run.session_id,
                             invoke.exception())  # fmt: skip
            raise LimitReached(reached.result())
        run.budget.hit = None  # reached on its last turn: the run ended by itself
        return invoke.result()


async def _run_group(session_id: str) -> RunGroup | None:
    """The run's cgroup (:mod:`spawnkit.containment.run_group`); the first of
    this process probes where one can be made, in a thread (it starts a process)."""
    if run_group.decided():
        return run_group.open_run_group(session_id)
    return await asyncio.to_thread(run_group.open_run_group, session_id)


async def _reap(session_id: str, workspace: Path, group: RunGroup | None, contained: bool) -> None:
    """Kill what the run left and wait for it to go, through cancellations. A sandboxed
    run's pid namespace is waited for (its init's pidfd, on the event loop); an unsandboxed
    run's own cgroup is emptied on the event loop (its few small files; a cgroup left
    empty, the common case, is one ``rmdir``); without one, an unsandboxed run's processes
    are found by a scan of this user's, in a thread."""
    if contained:
        init = pid_namespace.running_init(pid_namespace.info_path(workspace))
        if init is not None:  # bwrap has exited, its namespace is still being torn down
            await finish(pid_namespace.wait_gone(init))
    elif group is not None and group.ever_ran():
        if not group.removed_at_once():  # something is left in it: killed, waited for
            await finish(group.reap_soon())
    else:
        await finish_in_thread(reap, session_id, workspace, group)


def keeps_transcripts(worker: RuntimeAdapter) -> bool:
    """Whether the worker may have transcripts to keep (else no thread is started for it)."""
    plain = type(worker).keep_transcripts is RuntimeAdapter.keep_transcripts
    return not plain or worker.transcripts_dir is not None


def grouped(plan: SandboxPlan, group: RunGroup) -> SandboxPlan:
    """``plan`` with its CLI joining ``group`` first."""
    return replace(plan, steps=(group.step, *plan.steps))


class LimitReached(Exception):
    """Raised inside a run's execution when its budget stops it."""

    def __init__(self, hit: LimitHit) -> None:
        super().__init__(hit.message())
        self.hit = hit


def attempt_outcome(result: SpawnerResult) -> AttemptOutcome:
    """What an attempt's result was, as far as retrying goes."""
    if result.success:
        return "ok"
    kind = result.error_kind
    if kind == "rate_limit":
        return "rate_limit"
    if kind == "overloaded":
        return "overloaded"
    return "auth" if kind == "auth" else "other"
