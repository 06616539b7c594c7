"""The Spawner: admits triggers for one butler, runs them, and records every run.

The Spawner is an orchestration over named collaborators, each in its own module:
:mod:`~spawnkit.run.admission` (slots, queue, shared places, leases, drain),
:mod:`~spawnkit.run.assembly` (doors, relay, OTLP receiver, env, sandbox plan, CLI config),
:mod:`~spawnkit.run.attempts` (retries, cool-down, budgets, the CLI's invocation) and
:mod:`~spawnkit.run.recording` (the session record and results), with
:mod:`~spawnkit.run.collector` for events. Follow one trigger: :meth:`Spawner.trigger`
checks it (:mod:`~spawnkit.run.request`) and admits it, :meth:`Spawner._run` records it
and waits for a slot, ``Attempts.run`` starts it, ``Assembly.assemble`` builds what its
CLI gets, and the adapter's ``invoke`` turns that into the CLI's argv.

Admission is decided at once, before any await (:mod:`~spawnkit.run.admission`).
User mistakes (a missing CLI, a missing required variable) raise before a
trigger is accepted.

An accepted trigger gets exactly one session record, created before the
runtime starts and completed when the run ends, whatever happens (success,
failure, timeout, an exception, a cancellation by the caller or by
:meth:`Spawner.drain`). Each run happens in its own task, inside a fresh
workspace, with an isolated environment and its own telemetry span; what is
shared by every runtime is written here once, never per adapter.

Each run has one :class:`~spawnkit.redaction.Redactor` holding the secret values
it is given. It is applied where things leave the run, once each: the collector
(every event before listeners see it or the result is folded from it), the
results built here (so the record and the caller get the same redacted result),
the run's logs, its span, and the prompt and context written to the record.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import TracerProvider

from ..budgets.budget import RunBudget, admit, day_start
from ..budgets.pacing import Pacer
from ..config.butler_config import cannot_ask
from ..config.cli_telemetry import CliTelemetryChoice, parse_choice
from ..config.limits import Limits
from ..config.retry import RetryPolicy
from ..config.roster import ButlerConfig
from ..containment import sandbox
from ..containment.credentials import CredentialStore, check_required, injected_secrets, run_values
from ..containment.mcp_access import AccessTable, McpAccess
from ..containment.sources import Source
from ..errors import ConfigError, SpawnerClosedError, SpawnkitError, StoreError
from ..events import EventSink, Finished, Queued
from ..permissions import Approver
from ..redaction import Redactor
from ..result import SpawnerResult
from ..runtimes import get_adapter
from ..runtimes.base import RuntimeAdapter
from ..store import SessionStore
from ..telemetry.otlp_export import OtlpTarget, tracer_provider_from_env
from ..telemetry.runlog import DEFAULT_CAP_BYTES, RunLog
from ..worktree import RepoStart
from .accepted import CANCEL_GRACE_S, AcceptedRun
from .admission import Admissions, Place
from .approval import RunApprover
from .assembly import Assembly
from .attempts import Attempts
from .checkout import checked_out, checked_repo
from .collector import Collector, LiveToolCalls
from .dispatch import Cluster
from .dispatched import dispatch
from .memory import MemoryProvider, StoreMemory
from .recording import Recorder, now_utc
from .request import (
    FRONTEND_SOURCES,
    SOURCE_KINDS,
    RunKind,
    checked_run_arguments,
    validate_request,
    validate_trigger_source,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpawnerStatus:
    butler: str
    capacity: int
    active: int
    queued: int
    max_queued: int
    accepting: bool
    # Seconds left of the cool-down a rate-limited run set (0: none in effect).
    cooldown_s: float = 0.0


class Spawner:
    """Runs triggers for one butler with bounded concurrency and a bounded queue."""

    def __init__(
        self,
        butler: ButlerConfig,
        *,
        store: SessionStore | None = None,
        adapter: RuntimeAdapter | None = None,
        credentials: CredentialStore | None = None,
        memory: MemoryProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        mcp_host: str = "localhost",
        mcp_port: int | None = None,
        base_url: str | None = None,
        model: str | None = None,
        workspace_root: Path | None = None,
        log_cap_bytes: int = DEFAULT_CAP_BYTES,
        mcp_access: McpAccess | None = None,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        cli_telemetry: CliTelemetryChoice | None = None,
        cluster: Cluster | None = None,
        origin: dict[str, str] | None = None,
    ) -> None:
        # Given a cluster, triggers run on its workers (spawnkit.run.dispatch), not here.
        self.cluster = cluster
        # Where this spawner's runs came from, kept in each record's setup (a Dask worker
        # names itself there, so a sweep can tell a lost worker's runs).
        self.origin = origin
        # Limits given here are laid over the butler's [butler.limits].
        self.butler = butler = butler.with_limits(limits) if limits is not None else butler
        # Given here, a retry policy replaces the butler's [butler.retry].
        self.retry = (retry if retry is not None else butler.retry).validate()
        # The butler's shared cool-down after a rate limit, and the spacing of starts.
        self.pacer = Pacer(self.retry.stagger_s)
        # Where each run's MCP secret is granted: the table the butler's server checks.
        self.mcp_access: McpAccess = mcp_access if mcp_access is not None else AccessTable()
        self.store = store if store is not None else SessionStore()
        self.adapter = adapter or get_adapter(butler.runtime.type)(butler.runtime)
        self.credentials = credentials or CredentialStore(self.store)
        if memory is None and "memory" in butler.modules:
            memory = StoreMemory.from_module_config(self.store, butler.modules["memory"])
        self.memory = memory
        # The CLI's own spans, to a receiver per run (spawnkit.telemetry.otlp); None:
        # [butler.telemetry]. True (each runtime's default), or the signals it exports
        # ("all", "logs", "logs+traces@0.1"); a run's own are drawn when it starts.
        self.cli_telemetry = parse_choice(
            butler.cli_telemetry if cli_telemetry is None else cli_telemetry
        )
        # The user's own collector (OTEL_EXPORTER_OTLP_*): the receivers forward to it.
        self.otlp_target = OtlpTarget.from_env()
        if tracer_provider is None and isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider
        ):
            # The application configured no tracing: spawnkit's spans go where the
            # standard variables say, or (CLI telemetry on, and they say nothing) to a
            # provider of our own exporting nowhere, so the CLIs' spans have a run span
            # to join (TRACEPARENT).
            tracer_provider = tracer_provider_from_env()
            if tracer_provider is None and self.cli_telemetry:
                tracer_provider = SdkTracerProvider()
        self.tracer_provider = tracer_provider
        self.mcp_host = mcp_host
        self.mcp_port = mcp_port
        self.base_url = base_url or butler.runtime.base_url
        self.model = model or butler.runtime.model
        self.workspace_root = workspace_root
        self.log_cap_bytes = log_cap_bytes
        # The collaborators read this spawner's attributes when they need them (RunSettings).
        self._admissions = Admissions(self)
        self._recorder = Recorder(self)
        self._attempts = Attempts(self, Assembly(self), self._recorder)
        self._redactors: dict[str, Redactor] = {}  # by every key a run's MCP URL may carry
        self._listeners: list[EventSink] = []
        # What runs of owners that died left behind is cleaned up before ours start.
        self.store.recover_orphans()

    # -- observation -------------------------------------------------------------

    def add_listener(self, listener: EventSink) -> Callable[[], None]:
        """Receive every event of every run; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    @property
    def status(self) -> SpawnerStatus:
        admissions = self._admissions
        return SpawnerStatus(
            butler=self.butler.name,
            capacity=admissions.capacity,
            active=admissions.active,
            queued=admissions.queued(),
            max_queued=admissions.max_queued,
            accepting=admissions.accepting,
            cooldown_s=round(self.pacer.cooling_for, 3),
        )

    def redactor_for(self, session_key: str | None) -> Redactor:
        """The redactor of the in-flight run ``session_key`` names (as an MCP URL does).

        For a key of no run in flight, one built from the values a run would get now.
        """
        if session_key and (redactor := self._redactors.get(session_key)):
            return redactor
        return Redactor(
            injected_secrets(self.butler, self.credentials, self.adapter.passthrough_env)
        )

    @property
    def in_flight(self) -> list[str]:
        """Session ids of accepted runs that have not finished (running or queued)."""
        return list(self._admissions.runs)

    # -- control -------------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Refuse every new trigger from now on; runs already accepted go on."""
        self._admissions.accepting = False

    def resume_accepting(self) -> None:
        self._admissions.accepting = True

    async def cancel(self, session_id: str) -> bool:
        """Cancel one in-flight run; it is recorded as cancelled. False if not in flight."""
        return await self._admissions.cancel(session_id)

    async def drain(self, timeout: float) -> dict[str, int]:  # noqa: ASYNC109 - the API asks for it
        """Wait up to ``timeout`` seconds for in-flight runs, then cancel the rest.

        Returns how many runs finished on their own and how many were cancelled.
        """
        return await self._admissions.drain(timeout)

    # -- triggering ------------------------------------------------------------------

    async def trigger(
        self,
        prompt: str,
        trigger_source: str = "external",
        *,
        context: str | None = None,
        max_turns: int | None = None,
        on_event: EventSink | None = None,
        parent_session_id: str | None = None,
        resume: str | None = None,
        session_id: str | None = None,
        role: str | None = None,
        kind: RunKind = "run",
        sources: Sequence[Source] = (),
        limits: Limits | None = None,
        workdir: Path | None = None,
        queued_by: tuple[str, int] | None = None,
        approver: Approver | None = None,
        repo: str | Path | None = None,
    ) -> SpawnerResult:
        """Run ``prompt`` on this butler's runtime and return its result.

        ``trigger_source`` says who asked: one of :data:`TRIGGER_SOURCES` or
        ``schedule:<task-name>``; anything else raises
        :class:`~spawnkit.errors.InvalidTriggerSource` listing them. Every other argument
        is keyword-only, so ``trigger("hi", "some context")`` cannot pass a context by
        position. ``context`` is text the agent receives before the prompt.
        ``session_id`` chooses the new session's id (the shell adapter contract
        announces it before the run starts); by default a fresh UUID. It names the
        run's log folder, so anything but a plain name (letters, digits, ``._-``)
        raises :class:`~spawnkit.errors.InvalidSessionId`. ``role``
        runs the prompt as one of the butler's ``[butler.agents.<role>]`` (its
        prompt, tools and model), or, for a role the butler does not define,
        only labels the run (``SPAWNKIT_ROLE``). ``limits`` are laid over the butler's
        for this run (``max_turns``, when given, wins over theirs); a run that reaches
        one is stopped and recorded ``budget`` (or ``timeout``), and a trigger whose
        limits cannot be enforced raises :class:`~spawnkit.errors.BudgetRefused`.

        ``kind="ask"`` makes the run a question about ``sources``: the agent works in
        ``<workspace>/ask/`` with each source linked by its name, reaches no MCP server,
        is told about the sources' real paths (``RunSpec.add_dirs``) and, in the sandbox,
        sees them read-only and no other source. The record names them.
        ``kind="chat"`` is the same over an interactive session: the CLI runs on this
        process's terminal until the user ends it (nothing is parsed, so no events but
        ``Started`` and ``Finished``); ``prompt`` may be empty and is only recorded.

        ``workdir`` runs this one run in another existing directory (instead of the
        butler's ``workdir`` or the workspace), writable in the sandbox: ``spawnkit.map``
        gives each run of a batch over a repository its own git worktree this way.

        ``repo`` runs the agent in a git worktree of that repository, made when the run
        starts, in its sandbox: the user's files do not change during the run. It starts
        from ``HEAD`` plus the repository's uncommitted changes (tracked edits, staged or
        not, applied from ``git diff HEAD --binary``; untracked files that are not ignored,
        copied), and the result's :attr:`~spawnkit.result.SpawnerResult.diff` is taken
        against that starting state, so :meth:`~spawnkit.result.SpawnerResult.apply` puts
        back exactly the agent's changes, beside the user's own. The worktree is removed when
        the run ends, whatever ends it; the record keeps the repository, base commit and diff
        (``spawnkit apply SESSION_ID``). A path that is no git repository with a commit
        raises :class:`~spawnkit.errors.ConfigError` (see :mod:`spawnkit.worktree`).

        Raises for triggers that are refused or wrong before they are accepted
        (bad arguments, closed spawner, full queue, missing CLI, variable or API key);
        once accepted, failures come back as ``success=False`` results.

        A spawner given a ``cluster`` runs the trigger on one of its Dask workers
        (:mod:`spawnkit.run.dispatch`), through this same method there: the events, the result,
        the record and the refusals are a local run's; a run whose worker died comes back
        ``crashed`` ("worker lost") and is never run again. Only ``kind="run"`` is sent.
        Its record is made ``queued`` here when the trigger is accepted (with a ``Queued``
        event); the worker adopts it: ``queued_by`` is that record's owner (host, pid), given
        by :mod:`spawnkit.cluster.worker` on the worker.

        ``approver`` is asked before each call of a tool in the butler's
        ``[butler.permissions] ask`` (:mod:`spawnkit.permissions`); without one such calls
        are denied (:data:`~spawnkit.permissions.NO_APPROVER`). Every question and answer
        is a ``PermissionAsked`` and a ``PermissionDecided`` event and is kept in the
        record (``permissions``), see :mod:`spawnkit.run.approval`. A run sent to a cluster
        has no approver: nobody on its worker can answer.
        """
        validate_trigger_source(trigger_source)
        # A chat's prompt is only recorded: the user types at the CLI's own prompt.
        validate_request(prompt if kind != "chat" else "(chat)", max_turns, context)
        if not self._admissions.accepting:
            raise SpawnerClosedError(f"butler {self.butler.name!r} is not accepting triggers")
        start = checked_repo(repo, kind=kind, workdir=workdir, on_cluster=self.cluster is not None)
        if self.cluster is not None:
            return await dispatch(
                self, self.cluster, self._admissions, self._listeners, prompt, trigger_source,
                on_event=on_event, session_id=session_id, kind=kind, sources=sources, role=role,
                options={
                    "context": context, "max_turns": max_turns, "limits": limits,
                    "parent_session_id": parent_session_id, "resume": resume, "role": role,
                    # A path on the worker: a worktree of spawnkit.map on a LocalCluster, or
                    # a folder every worker sees (a shared filesystem).
                    "workdir": workdir,
                },
            )  # fmt: skip
        if (rejected := self._admissions.refuse_if_full(trigger_source)) is not None:
            return rejected
        workdir = checked_run_arguments(
            role=role, session_id=session_id, kind=kind, sources=sources, workdir=workdir
        )
        credentials = self.credentials.pinned()  # read once for what follows
        self._check_runnable(kind, credentials)
        secrets = injected_secrets(
            self.butler, credentials, self.adapter.passthrough_env,
            self.adapter.other_vendor_keys,
        )  # fmt: skip
        run_limits = self._limits(limits, max_turns)
        budget = self._budget(run_limits, role, secrets)
        redactor = Redactor(secrets)

        # Across the hosts sharing a PostgreSQL store: a place of the butler's queue.
        admitted = await self._admissions.shared_place(trigger_source)
        if isinstance(admitted, SpawnerResult):
            return admitted
        # The run is made once its place is reserved: a worker that cannot be made gives
        # the shared place back.
        return await self._accept(admitted, lambda: self._accepted_run(
            prompt, context, trigger_source, run_limits, budget, redactor, on_event=on_event,
            parent_session_id=parent_session_id, resume=resume, session_id=session_id,
            role=role, kind=kind, sources=sources, workdir=workdir, queued_by=queued_by,
            approver=approver, repo=start,
        ))  # fmt: skip

    def _check_runnable(self, kind: RunKind, credentials: CredentialStore) -> None:
        """Refuse a trigger its CLI, sandbox, variables or API key cannot run (user mistakes)."""
        if kind == "chat":
            self.adapter.check_interactive()  # its interactive CLI, which may be another
        else:
            self.adapter.find_binary()
        if self.butler.permissions.ask and (why := cannot_ask(self.butler.runtime.type)):
            raise ConfigError(f"butler {self.butler.name!r}: [butler.permissions] ask: {why}")
        sandbox.check_available(self.butler)
        check_required(self.butler, credentials)
        self.adapter.check_authenticated(
            run_values(
                self.butler, credentials, self.adapter.passthrough_env,
                self.adapter.other_vendor_keys,
            )
        )  # fmt: skip

    def _budget(self, run_limits: Limits, role: str | None, secrets: dict[str, str]) -> RunBudget:
        """The run's budget; refused (:class:`~spawnkit.errors.BudgetRefused`) when its
        limits cannot be enforced or the butler's daily budget is spent."""
        agent = self.butler.agents.get(role) if role else None
        budget = admit(
            run_limits,
            (agent.model if agent is not None and agent.model else None)
            or self.model
            or self.adapter.default_model(self.base_url),
            runtime=self.butler.runtime.type,
            api_key=any(
                name in secrets
                for name in self.adapter.api_key_env
                if name not in self.adapter.subscription_env
            ),
        )
        if run_limits.daily_cost_usd is not None:  # one indexed query, before acceptance
            spent = self.store.spent_since(self.butler.name, day_start())
            budget.check_daily(self.butler.name, spent + self._attempts.spending.total())
        return budget

    def _accepted_run(
        self,
        prompt: str,
        context: str | None,
        trigger_source: str,
        run_limits: Limits,
        budget: RunBudget,
        redactor: Redactor,
        *,
        on_event: EventSink | None,
        parent_session_id: str | None,
        resume: str | None,
        session_id: str | None,
        role: str | None,
        kind: RunKind,
        sources: Sequence[Source],
        workdir: Path | None,
        queued_by: tuple[str, int] | None,
        approver: Approver | None,
        repo: RepoStart | None = None,
    ) -> AcceptedRun:
        """The accepted trigger, with its worker, collector and budget."""
        session_id = session_id if session_id is not None else str(uuid.uuid4())
        worker = self.adapter.create_worker()
        run = AcceptedRun(
            session_id=session_id,
            prompt=prompt,
            context=context,
            trigger_source=trigger_source,
            max_turns=run_limits.max_turns or self.butler.runtime.max_turns,
            parent_session_id=parent_session_id,
            resume=resume,
            role=role,
            worker=worker,
            runtime_session_id=None if resume else worker.new_runtime_session_id(),
            collector=Collector(
                session_id,
                [*self._listeners, *([on_event] if on_event else [])],
                redactor,
                config_file=self.butler.config_file,
            ),
            kind=kind,
            sources=tuple(sources),
            workdir=workdir,
            budget=budget,
            timeout_s=run_limits.timeout_s or self.butler.runtime.timeout_s,
            queued_by=queued_by,
            repo=repo,
        )
        run.collector.budget = budget
        run.collector.live_calls = LiveToolCalls(self.store, session_id)
        run.approver = RunApprover(run.collector, approver)
        return run

    async def _accept(
        self, admitted: Place | None, make_run: Callable[[], AcceptedRun]
    ) -> SpawnerResult:
        # Accepted: reserve the place synchronously, before the first await.
        try:
            self._admissions.pending += 1
            run = make_run()
            for key in {run.session_id, run.runtime_session_id, run.resume} - {None}:
                self._redactors[str(key)] = run.redactor
            task = asyncio.create_task(
                self._run(run, self._admissions.queued(), admitted),
                name=f"spawnkit:{self.butler.name}:{run.session_id[:8]}",
            )
        except BaseException:
            Admissions.leave(admitted)  # no run took the place
            raise
        self._admissions.track(run.session_id, task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller gave up (an interrupt, a timeout of its own): cancel the
            # run, let it clean up and record itself, then pass the cancel on.
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
            raise

    def _limits(self, given: Limits | None, max_turns: int | None) -> Limits:
        """A run's limits: ``given`` over the butler's; an explicit ``max_turns`` wins."""
        runtime = self.butler.runtime
        base = Limits(max_turns=runtime.max_turns, timeout_s=runtime.timeout_s).over(
            self.butler.limits
        )
        limits = given.over(base) if given is not None else base
        if max_turns is not None:
            limits = Limits(max_turns=max_turns).over(limits)
        return limits

    async def resume(
        self,
        session_id: str,
        prompt: str,
        context: str | None = None,
        *,
        on_event: EventSink | None = None,
        max_turns: int | None = None,
        new_session_id: str | None = None,
        sources: Sequence[Source] = (),
        kind: RunKind | None = None,
        trigger_source: str | None = None,
        limits: Limits | None = None,
        approver: Approver | None = None,
    ) -> SpawnerResult:
        """Continue a finished session on the runtime that ran it, as a new linked session.

        It comes from the frontend its parent came from (a chat's next turn is ``chat``
        too), else from ``external``, unless ``trigger_source`` says otherwise.

        The new session's ``parent_session_id`` is ``session_id``; the runtime
        picks up the conversation from its own transcript. An ask or a chat goes on as an
        ask over ``sources`` (the caller's: they are looked up by their names again), or
        as the ``kind`` given (``"chat"``: an interactive session continues it).
        """
        record = await asyncio.to_thread(self.store.get_session, session_id)
        if record is None:
            raise SpawnkitError(f"no session {session_id!r} in {self.store.location}")
        if record.butler != self.butler.name or record.runtime != self.butler.runtime.type:
            raise SpawnkitError(
                f"session {session_id} ran on butler {record.butler!r} ({record.runtime}); "
                f"this spawner runs {self.butler.name!r} ({self.butler.runtime.type})"
            )
        if record.completed_at is None:
            raise SpawnkitError(f"session {session_id} has not finished; resume it afterwards")
        if not record.runtime_session_id:
            raise SpawnkitError(f"session {session_id} has no runtime session id to resume")
        if not self.adapter.capabilities().get("supports_resume"):
            raise SpawnkitError(f"the {self.butler.runtime.type} runtime cannot resume sessions")
        return await self.trigger(
            prompt,
            trigger_source
            or (record.trigger_source if record.trigger_source in FRONTEND_SOURCES else "external"),
            context=context,
            max_turns=max_turns,
            on_event=on_event,
            parent_session_id=session_id,
            resume=record.runtime_session_id,
            session_id=new_session_id,
            kind=kind or ("ask" if record.kind in SOURCE_KINDS else "run"),
            sources=sources,
            limits=limits,
            approver=approver,
        )

    async def _run(
        self, run: AcceptedRun, position: int, admitted: Place | None = None
    ) -> SpawnerResult:
        """The accepted run from its record to its result: it waits its turn, runs its
        attempts, and is recorded whatever happens (a cancel, a store error, a bug)."""
        butler, collector, admissions = self.butler, run.collector, self._admissions
        holding_slot = False
        started_at: datetime | None = None
        started_clock = 0.0
        result: SpawnerResult | None = None
        recorded = False
        cluster = None
        try:
            async with admissions.order:
                await self._recorder.open(run)
                recorded = True
            run.log = RunLog.for_session(run.session_id, self.log_cap_bytes, run.redactor)
            if position > 0:
                collector.emit(Queued(run.session_id, butler.name, position))
            async with admissions.slot():
                holding_slot = True
                cluster = await admissions.shared_slot()
                started_at, started_clock = now_utc(), time.monotonic()
                attempts = self._attempts
                async with checked_out(run):  # repo=: the run's worktree, while it runs
                    result = await attempts.daily_budget_spent(run) or await attempts.run(run)
        except asyncio.CancelledError:
            result = self._recorder.unfinished(
                collector, "cancelled", "the run was cancelled", "cancelled"
            )
        except StoreError as exc:
            if not recorded:
                # No record can be written (a damaged or read-only store): nothing runs
                # unrecorded, so the trigger fails with the store's own one-line error.
                admissions.runs.pop(run.session_id, None)
                raise
            result = self._recorder.unfinished(collector, "failed", str(exc), "store")
        except ConfigError as exc:  # the worktree of repo= could not be made
            result = self._recorder.unfinished(collector, "failed", str(exc), "config")
        except Exception as exc:  # a bug of ours: record it rather than lose the session
            logger.exception(
                "run %s of butler %s failed inside spawnkit", run.session_id, butler.name
            )
            result = self._recorder.unfinished(
                collector, "failed", f"internal error: {exc!r}", "internal"
            )
        finally:
            if not holding_slot:
                admissions.pending -= 1
            if run.log is not None:
                run.log.close()
            await self._attempts.withdraw_secret(run)
        assert result is not None  # every branch above sets it
        if started_at is not None and result.duration_ms == 0:
            result = replace(result, duration_ms=int((time.monotonic() - started_clock) * 1000))
        result = replace(
            result, session_id=run.session_id, butler=butler.name, runtime=butler.runtime.type,
            network_denied=collector.denied, repo=run.repo_change,
        )  # fmt: skip
        try:
            await self._recorder.close(run, result)
        finally:
            if cluster is not None:  # freed once the record is closed: records never overlap
                cluster.release()
            Admissions.leave(admitted)  # the queue place too
            admissions.forget(run.session_id)
            self._attempts.spending.settle(run.session_id)
            for key, redactor in list(self._redactors.items()):
                if redactor is run.redactor:
                    del self._redactors[key]
        collector.emit(Finished(run.session_id, result))
        return result
