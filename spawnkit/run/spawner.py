"""The Spawner: admits triggers for one butler, runs them, and records every run.

Admission is decided at once, before any await: a free slot runs now; a busy
butler queues the trigger up to ``max_queued_sessions`` and refuses the next
with :class:`~spawnkit.errors.QueueFullError`; a trigger from the butler's own
agent (``trigger_source="trigger"``) is refused with ``success=False`` when no
slot is free, because it would wait for the very run that is waiting for it.
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
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import TracerProvider

from .. import sandbox
from ..budget import LimitHit, RunBudget, admit, day_start
from ..credentials import (
    MODEL_CREDENTIALS,
    CredentialStore,
    check_required,
    injected_secrets,
    isolated_env,
    missing_optional,
    run_values,
    secret_names,
)
from ..dispatch import Cluster
from ..doors import DOORS_DIR, Door, Doors, loopback_address, open_doors
from ..egress import Denial, egress_proxy, proxy_env
from ..errors import (
    BudgetRefused,
    ConfigError,
    InvalidArgument,
    InvalidTriggerSource,
    ModelUnavailable,
    QueueFullError,
    RuntimeFailure,
    RuntimeNotFoundError,
    SpawnerClosedError,
    SpawnkitError,
    StoreError,
)
from ..events import (
    AssistantText,
    EventSink,
    Finished,
    NetworkDenied,
    Queued,
    RunEvent,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from ..limits import Limits
from ..mcp_access import AccessTable, McpAccess
from ..memory import MemoryProvider, StoreMemory
from ..otlp import CliTelemetry, OtlpReceiver, OtlpTarget, tracer_provider_from_env
from ..pacing import Pacer
from ..redaction import Redactor
from ..relay import Relay, free_port, open_relay
from ..result import (
    OUTPUT_LIMIT,
    Attempt,
    AttemptOutcome,
    RunStatus,
    SpawnerResult,
    ToolCall,
    Usage,
    tool_count,
    truncate,
)
from ..retry import RETRYABLE_KINDS, RetryPolicy, retry_after_hint
from ..roster import ButlerConfig
from ..runlog import DEFAULT_CAP_BYTES, RunLog, check_session_id, session_log_dir
from ..runtimes import get_adapter
from ..runtimes.base import McpServerSpec, RunOutcome, RunSpec, RuntimeAdapter
from ..sources import Source, sources_list
from ..store import SessionStore
from ..store_backend import Admission, SlotClaim
from ..sweep import HOME_VAR, reap, run_home
from ..system_prompt import append_memory, compose_system_prompt
from ..telemetry import RunSpan, run_span
from ..workspace import files_in, link_sources, mcp_url, run_workspace, source_paths

logger = logging.getLogger(__name__)
T = TypeVar("T")

TRIGGER_SOURCES = ("tick", "external", "trigger", "route")
# What a run is: a butler's trigger, a question about sources, or an interactive session
# about them on the user's terminal (spawnkit.ask).
RunKind = Literal["run", "ask", "chat"]
_SOURCE_KINDS = ("ask", "chat")
_SCHEDULE_RE = re.compile(r"^schedule:[A-Za-z0-9_.-]+$")
_ROLE_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# How long a cancelled run may take to kill its CLI and record itself.
CANCEL_GRACE_S = 30.0
# How often a run waiting for a slot another host holds tries again (PostgreSQL stores).
SLOT_POLL_S = 0.2
# How long a run's end waits for its live tool-call writes before its result is written.
LIVE_WRITE_TIMEOUT_S = 10.0


def validate_trigger_source(source: str) -> None:
    if source in TRIGGER_SOURCES or (isinstance(source, str) and _SCHEDULE_RE.match(source)):
        return
    raise InvalidTriggerSource(
        f"invalid trigger_source {source!r}: use one of {', '.join(TRIGGER_SOURCES)} "
        "or schedule:<task-name> (a context is passed as context=...)"
    )


def validate_request(prompt: object, max_turns: int | None = None) -> None:
    """Refuse a prompt no run can be made of, or a turn limit below 1 (``InvalidArgument``)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidArgument("the prompt is empty: give the agent something to do")
    if max_turns is not None and max_turns < 1:
        raise InvalidArgument(f"max_turns must be at least 1, not {max_turns}")


def checked_workdir(path: str | Path) -> Path:
    """A trigger's ``workdir``, resolved; it must be an existing directory."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise InvalidArgument(f"workdir {folder} is not a directory")
    return folder


def _now() -> datetime:
    return datetime.now(UTC)


def compose_prompt(prompt: str, context: str | None) -> str:
    """The text the agent receives: context first, when given, then the prompt."""
    if context is None or not context.strip():
        return prompt
    return f"{context.rstrip()}\n\n{prompt}"


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


class _LiveToolCalls:
    """Writes a run's tool calls to its record as they start and end, in order, off the loop.

    So a host watching a shared store sees a call while the run is still going (the
    PostgreSQL store's NOTIFY goes out with each write). A write that fails is logged and
    skipped: the call is written with the result in any case.
    """

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id
        self._last: asyncio.Task[None] | None = None

    def __call__(self, seq: int, call: ToolCall) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            logger.debug("tool call %s of %s not written live: no loop", call.id, self._session_id)
            return
        previous = self._last

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            try:
                await asyncio.to_thread(self._store.record_tool_call, self._session_id, seq, call)
            except (StoreError, RuntimeError) as exc:
                logger.warning("live tool call of %s not written: %s", self._session_id, exc)

        self._last = loop.create_task(write())

    async def flush(self) -> None:
        """Wait (bounded) for the writes still under way: the result's own write comes after."""
        if self._last is not None:
            await asyncio.wait([self._last], timeout=LIVE_WRITE_TIMEOUT_S)


class _Collector:
    """Redacts a run's events, folds them into its result and fans them out to listeners."""

    def __init__(
        self,
        session_id: str,
        sinks: list[EventSink],
        redactor: Redactor,
        config_file: Path | None = None,
    ) -> None:
        self.session_id = session_id
        self.sinks = sinks
        self.redactor = redactor
        self._deltas = redactor.stream()
        self.span: RunSpan | None = None
        self.calls: dict[str, ToolCall] = {}
        self.texts: list[str] = []
        self.text_chars = 0
        self.usage = Usage()
        self.cost_usd: float | None = None
        self.trace_id: str | None = None
        # The run's limits; fed by usage events, or by its relay's meter when it has one.
        self.budget: RunBudget | None = None
        self.metered = False
        self.on_limit: Callable[[LimitHit], None] | None = None
        self.live_calls: _LiveToolCalls | None = None
        # Connections the run's egress proxy refused, and the butler.toml that decides.
        self.denied = 0
        self.config_file = str(config_file) if config_file is not None else None

    def network_denied(self, denial: Denial) -> None:
        """A connection the run's egress proxy refused (its ``on_denied``): counted, and an
        event naming the tool call in progress, when exactly one was."""
        self.denied += 1
        running = [call for call in self.calls.values() if call.status == "running"]
        call = running[0] if len(running) == 1 else None
        self.emit(
            NetworkDenied(
                self.session_id, denial.host, denial.port, denial.reason,
                tool=call.name if call else None, tool_call_id=call.id if call else None,
                config_file=self.config_file,
            )
        )  # fmt: skip

    def emit(self, event: RunEvent) -> None:
        # Deltas are redacted as one stream (a secret may span two); whatever the
        # stream holds back goes out before any other event.
        if isinstance(event, TextDelta):
            if text := self._deltas.feed(event.text):
                self._deliver(TextDelta(event.session_id, text))
            return
        if held := self._deltas.flush():
            self._deliver(TextDelta(event.session_id, held))
        self._deliver(self.redactor.event(event))

    def _deliver(self, event: RunEvent) -> None:
        if isinstance(event, ToolCallStarted | ToolCallFinished):
            self.calls[event.call.id] = event.call
            if self.live_calls is not None:
                self.live_calls(list(self.calls).index(event.call.id), event.call)
            if isinstance(event, ToolCallFinished) and self.span is not None:
                self.span.tool_call(event.call)
        elif isinstance(event, AssistantText) and self.text_chars < OUTPUT_LIMIT:
            self.texts.append(event.text)
            self.text_chars += len(event.text)
        elif isinstance(event, UsageUpdate):
            self.usage, self.cost_usd = event.usage, event.cost_usd
            if not self.metered:
                self._observe(event.usage)
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                # A broken renderer must not break the run it renders.
                logger.exception("event listener %r failed on %s", sink, type(event).__name__)

    @property
    def partial_output(self) -> str:
        return truncate("\n\n".join(self.texts), OUTPUT_LIMIT)

    def restart(self) -> None:
        """Forget a failed attempt's text and usage: the run starts its CLI again."""
        self.texts, self.text_chars = [], 0
        self.usage, self.cost_usd = Usage(), None

    def metered_usage(self, usage: Usage) -> None:
        """The run's total after a model call, as its relay measured it."""
        self.emit(UsageUpdate(self.session_id, usage, None, None))
        self._observe(usage)

    def _observe(self, usage: Usage) -> None:
        hit = self.budget.observe(usage) if self.budget is not None else None
        if hit is not None and self.on_limit is not None:
            self.on_limit(hit)


@dataclass
class _Run:
    """One accepted trigger on its way through the spawner."""

    session_id: str
    prompt: str
    context: str | None
    trigger_source: str
    max_turns: int
    parent_session_id: str | None
    resume: str | None
    role: str | None
    worker: RuntimeAdapter
    runtime_session_id: str | None
    collector: _Collector
    budget: RunBudget
    timeout_s: float
    kind: RunKind = "run"
    sources: tuple[Source, ...] = ()
    workdir: Path | None = None  # this run's own working directory (see trigger)
    log: RunLog | None = None
    mcp_secret: str | None = None
    # The run's model relay, while it runs (see Spawner._open_relay): a door of its sandbox.
    relay: Relay | None = None
    # The inside port of the run's egress proxy (its butler's allow_hosts), while it runs.
    egress_port: int | None = None
    # A dispatched run: the owner of the queued record its client made, adopted here.
    queued_by: tuple[str, int] | None = None

    @property
    def redactor(self) -> Redactor:
        return self.collector.redactor


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
        cli_telemetry: bool | None = None,
        cluster: Cluster | None = None,
        origin: dict[str, str] | None = None,
    ) -> None:
        # Given a cluster, triggers run on its workers (spawnkit.dispatch), not here.
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
        # The CLI's own spans, to a receiver per run (spawnkit.otlp); None: [butler.telemetry].
        self.cli_telemetry = butler.cli_telemetry if cli_telemetry is None else cli_telemetry
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
        self._capacity = butler.runtime.max_concurrent_sessions
        self._max_queued = butler.runtime.max_queued_sessions
        self._slots = asyncio.Semaphore(self._capacity)
        # Records are written in a thread; this lock keeps runs reaching the
        # semaphore in the order they were accepted (first come, first served).
        self._admission = asyncio.Lock()
        self._active = 0
        self._pending = 0  # accepted, not yet holding a slot
        self._accepting = True
        self._runs: dict[str, asyncio.Task[SpawnerResult]] = {}
        self._redactors: dict[str, Redactor] = {}  # by every key a run's MCP URL may carry
        # Runs started here whose spend is not in the store yet (for the daily budget).
        self._spending: dict[str, RunBudget] = {}
        self._listeners: list[EventSink] = []
        # Renews the leases of this spawner's records while it has any (see _keep_leases).
        self._lease_task: asyncio.Task[None] | None = None
        # What runs of owners that died left behind is cleaned up before ours start.
        self.store.recover_orphans()

    # -- observation -------------------------------------------------------------

    def add_listener(self, listener: EventSink) -> Callable[[], None]:
        """Receive every event of every run; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    @property
    def status(self) -> SpawnerStatus:
        return SpawnerStatus(
            butler=self.butler.name,
            capacity=self._capacity,
            active=self._active,
            queued=self._queued(),
            max_queued=self._max_queued,
            accepting=self._accepting,
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
        return list(self._runs)

    def _queued(self) -> int:
        return max(0, self._active + self._pending - self._capacity)

    def _has_free_slot(self) -> bool:
        return self._active + self._pending < self._capacity

    # -- control -------------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Refuse every new trigger from now on; runs already accepted go on."""
        self._accepting = False

    def resume_accepting(self) -> None:
        self._accepting = True

    async def cancel(self, session_id: str) -> bool:
        """Cancel one in-flight run; it is recorded as cancelled. False if not in flight."""
        task = self._runs.get(session_id)
        if task is None:
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        return True

    async def drain(self, timeout: float) -> dict[str, int]:  # noqa: ASYNC109 - the API asks for it
        """Wait up to ``timeout`` seconds for in-flight runs, then cancel the rest.

        Returns how many runs finished on their own and how many were cancelled.
        """
        tasks = set(self._runs.values())
        if not tasks:
            return {"finished": 0, "cancelled": 0}
        _, remaining = await asyncio.wait(tasks, timeout=max(0.0, timeout))
        for task in remaining:
            task.cancel()
        if remaining:
            await asyncio.wait(remaining, timeout=CANCEL_GRACE_S)
        return {"finished": len(tasks) - len(remaining), "cancelled": len(remaining)}

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

        Raises for triggers that are refused or wrong before they are accepted
        (bad arguments, closed spawner, full queue, missing CLI, variable or API key);
        once accepted, failures come back as ``success=False`` results.

        A spawner given a ``cluster`` runs the trigger on one of its Dask workers
        (:mod:`spawnkit.dispatch`), through this same method there: the events, the result,
        the record and the refusals are a local run's; a run whose worker died comes back
        ``crashed`` ("worker lost") and is never run again. Only ``kind="run"`` is sent.
        Its record is made ``queued`` here when the trigger is accepted (with a ``Queued``
        event); the worker adopts it: ``queued_by`` is that record's owner (host, pid), given
        by :mod:`spawnkit.cluster_worker` on the worker.
        """
        validate_trigger_source(trigger_source)
        # A chat's prompt is only recorded: the user types at the CLI's own prompt.
        validate_request(prompt if kind != "chat" else "(chat)", max_turns)
        if not self._accepting:
            raise SpawnerClosedError(f"butler {self.butler.name!r} is not accepting triggers")
        if self.cluster is not None:
            return await self._dispatch(
                prompt, trigger_source, on_event=on_event, session_id=session_id, kind=kind,
                sources=sources, role=role,
                options={
                    "context": context, "max_turns": max_turns, "limits": limits,
                    "parent_session_id": parent_session_id, "resume": resume, "role": role,
                    # A path on the worker: a worktree of spawnkit.map on a LocalCluster, or
                    # a folder every worker sees (a shared filesystem).
                    "workdir": workdir,
                },
            )  # fmt: skip
        if not self._has_free_slot():
            if trigger_source == "trigger":
                return self._rejected_self_trigger()
            if self._queued() >= self._max_queued:
                raise QueueFullError(
                    f"butler {self.butler.name!r} is full: {self._active} running, "
                    f"{self._queued()} queued (max_queued_sessions = {self._max_queued})"
                )
        if role is not None and not _ROLE_RE.fullmatch(role):
            raise InvalidArgument(f"invalid role name {role!r}")
        if session_id is not None:
            check_session_id(session_id)  # it names the run's log folder
        if kind not in ("run", *_SOURCE_KINDS):
            raise InvalidArgument(f"invalid run kind {kind!r}: use run, ask or chat")
        if sources and kind not in _SOURCE_KINDS:
            raise InvalidArgument("sources are given to ask and chat runs only")
        if workdir is not None:
            if kind in _SOURCE_KINDS:
                raise InvalidArgument("ask and chat runs work in their sources, not a workdir")
            workdir = checked_workdir(workdir)
        if kind == "chat":
            self.adapter.check_interactive()  # its interactive CLI, which may be another
        else:
            self.adapter.find_binary()
        sandbox.check_available(self.butler)
        check_required(self.butler, self.credentials)
        self.adapter.check_authenticated(
            run_values(
                self.butler, self.credentials, self.adapter.passthrough_env,
                self.adapter.other_vendor_keys,
            )
        )  # fmt: skip
        secrets = injected_secrets(
            self.butler, self.credentials, self.adapter.passthrough_env,
            self.adapter.other_vendor_keys,
        )  # fmt: skip
        run_limits = self._limits(limits, max_turns)
        agent = self.butler.agents.get(role) if role else None
        budget = admit(
            run_limits,
            (agent.model if agent is not None and agent.model else None) or self.model,
            runtime=self.butler.runtime.type,
            api_key=any(
                name in secrets
                for name in self.adapter.api_key_env
                if name not in self.adapter.subscription_env
            ),
        )
        if run_limits.daily_cost_usd is not None:  # one indexed query, before acceptance
            spent = self.store.spent_since(self.butler.name, day_start())
            budget.check_daily(self.butler.name, spent + self._unrecorded_spend())
        redactor = Redactor(secrets)

        # Across the hosts sharing a PostgreSQL store: a place of the butler's queue.
        admitted = await self._cluster_admission(trigger_source)
        if isinstance(admitted, SpawnerResult):
            return admitted
        return await self._accept(
            admitted, prompt, context, trigger_source, run_limits, budget, redactor,
            max_turns=max_turns, on_event=on_event, parent_session_id=parent_session_id,
            resume=resume, session_id=session_id, role=role, kind=kind, sources=sources,
            workdir=workdir, queued_by=queued_by,
        )  # fmt: skip

    async def _cluster_admission(
        self, trigger_source: str
    ) -> tuple[Admission, int] | SpawnerResult | None:
        """A place among the butler's ``max_concurrent_sessions + max_queued_sessions``
        across every host sharing the store (PostgreSQL; None on SQLite), held until the
        run's record is closed. Refused as on one host: a full queue raises
        :class:`~spawnkit.errors.QueueFullError`, a self-trigger with no run slot free
        anywhere is rejected."""
        admission = self.store.admission(self.butler.name)
        if admission is None:
            return None
        below = self._capacity if trigger_source == "trigger" else None
        ticket = await asyncio.to_thread(admission.enter, self._capacity + self._max_queued, below)
        if ticket.place is not None:
            return admission, ticket.place
        if below is not None and ticket.held >= below:
            return self._rejected_self_trigger()
        raise QueueFullError(
            f"butler {self.butler.name!r} is full across the hosts sharing "
            f"{self.store.location}: {ticket.running} running, "
            f"{max(0, ticket.held - ticket.running)} queued "
            f"(max_queued_sessions = {self._max_queued})"
        )

    async def _accept(
        self,
        admitted: tuple[Admission, int] | None,
        prompt: str,
        context: str | None,
        trigger_source: str,
        run_limits: Limits,
        budget: RunBudget,
        redactor: Redactor,
        *,
        max_turns: int | None,
        on_event: EventSink | None,
        parent_session_id: str | None,
        resume: str | None,
        session_id: str | None,
        role: str | None,
        kind: RunKind,
        sources: Sequence[Source],
        workdir: Path | None,
        queued_by: tuple[str, int] | None = None,
    ) -> SpawnerResult:
        # Accepted: reserve the place synchronously, before the first await.
        try:
            self._pending += 1
            session_id = session_id if session_id is not None else str(uuid.uuid4())
            worker = self.adapter.create_worker()
            run = _Run(
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
                collector=_Collector(
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
            )
            run.collector.budget = budget
            run.collector.live_calls = _LiveToolCalls(self.store, session_id)
            for key in {session_id, run.runtime_session_id, resume} - {None}:
                self._redactors[str(key)] = redactor
            task = asyncio.create_task(
                self._run(run, self._queued(), admitted),
                name=f"spawnkit:{self.butler.name}:{session_id[:8]}",
            )
        except BaseException:
            if admitted is not None:  # no run took the place
                admitted[0].leave(admitted[1])
            raise
        self._runs[session_id] = task
        self._keep_leases()
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller gave up (an interrupt, a timeout of its own): cancel the
            # run, let it clean up and record itself, then pass the cancel on.
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
            raise

    async def _dispatch(
        self,
        prompt: str,
        trigger_source: str,
        *,
        on_event: EventSink | None,
        session_id: str | None,
        kind: RunKind,
        sources: Sequence[Source],
        role: str | None,
        options: dict[str, Any],
    ) -> SpawnerResult:
        """The trigger, run on a worker of ``self.cluster`` (spawnkit.dispatch).

        Its record is made here, ``queued`` and owned by this process (whose leases keep
        it), the moment the trigger is accepted, and a ``Queued`` event says so: a run
        waiting in Dask's queue is seen, and one cancelled or lost before it starts is
        closed. The worker admits it (its spawner's queue and the store's slots across
        hosts), adopts the record and streams its events back; here it counts as running
        until it ends.
        """
        assert self.cluster is not None
        if role is not None and not _ROLE_RE.fullmatch(role):
            raise InvalidArgument(f"invalid role name {role!r}")
        if session_id is not None:
            check_session_id(session_id)
        if kind != "run" or sources:
            raise InvalidArgument("only runs (not ask or chat) are dispatched to a cluster")
        session_id = session_id if session_id is not None else str(uuid.uuid4())
        sinks = [*self._listeners, *([on_event] if on_event else [])]
        redactor = Redactor(
            injected_secrets(
                self.butler, self.credentials, self.adapter.passthrough_env,
                self.adapter.other_vendor_keys,
            )
        )  # fmt: skip
        # Accepted: recorded before it is sent (an id used again raises here, as locally).
        creating = asyncio.ensure_future(
            asyncio.to_thread(
                self.store.create_session, session_id, butler=self.butler.name,
                runtime=self.butler.runtime.type, model=self.model,
                prompt=redactor.text(prompt), context=redactor.text(options.get("context")),
                trigger_source=trigger_source, role=role,
                parent_session_id=options.get("parent_session_id"),
            )
        )  # fmt: skip
        try:
            await asyncio.shield(creating)
        except asyncio.CancelledError:  # interrupted as it was accepted: closed, not sent
            await asyncio.wait({creating})
            if not creating.cancelled() and creating.exception() is None:
                await asyncio.to_thread(
                    self.store.close_queued, session_id, status="cancelled",
                    error="the run was cancelled before it was sent", error_kind="cancelled",
                )  # fmt: skip
            raise

        def deliver(event: RunEvent) -> None:
            for sink in sinks:
                try:
                    sink(event)
                except Exception:
                    logger.exception("event listener %r failed on %s", sink, type(event).__name__)

        task = asyncio.create_task(
            self.cluster.trigger(
                self.butler, self.store, prompt, trigger_source,
                session_id=session_id, options=options, deliver=deliver,
            ),
            name=f"spawnkit:{self.butler.name}:{session_id[:8]}:dispatch",
        )  # fmt: skip
        self._runs[session_id] = task
        self._active += 1

        def finished(_: asyncio.Task[SpawnerResult]) -> None:
            self._active -= 1
            self._runs.pop(session_id, None)

        task.add_done_callback(finished)
        self._keep_leases()  # the queued record is this host's until a worker adopts it
        deliver(Queued(session_id, self.butler.name, len(self._runs)))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # As for a local run: cancel it (on its worker), wait for its record, pass it on.
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S + 5)
            raise

    async def _cluster_slot(self) -> SlotClaim | None:
        """One of the butler's ``max_concurrent_sessions`` slots across every host sharing
        the store (PostgreSQL), held until the run's record is closed; None on SQLite."""
        claim = await asyncio.to_thread(self.store.slot_claim, self.butler.name, self._capacity)
        if claim is None:
            return None
        try:
            while True:
                if await asyncio.to_thread(claim.try_acquire) is not None:
                    return claim
                await asyncio.sleep(SLOT_POLL_S)  # held elsewhere: nothing here to wake us
        except BaseException:
            claim.release()
            raise

    def _keep_leases(self) -> None:
        """Renew this spawner's records' leases while it has runs, unless already renewing.

        Each record belongs to this host for ``store.lease_s`` seconds; it is renewed every
        third of that, so two renewals can fail before another host takes the run for dead.
        Each round also closes other hosts' records whose lease ran out.
        """
        if self._lease_task is None or self._lease_task.done():
            self._lease_task = asyncio.create_task(
                self._renew_leases(), name=f"spawnkit:{self.butler.name}:leases"
            )

    async def _renew_leases(self) -> None:
        interval = self.store.lease_s / 3
        while self._runs:
            await asyncio.sleep(interval)
            held = list(self._runs)
            try:
                await asyncio.to_thread(self.store.renew_leases, held)
                await asyncio.to_thread(self.store.expire_leases)
            except StoreError as exc:  # the server away a moment: the next round tries again
                logger.warning("could not renew the leases of %d run(s): %s", len(held), exc)

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
    ) -> SpawnerResult:
        """Continue a finished session on the runtime that ran it, as a new linked session.

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
            context=context,
            max_turns=max_turns,
            on_event=on_event,
            parent_session_id=session_id,
            resume=record.runtime_session_id,
            session_id=new_session_id,
            kind=kind or ("ask" if record.kind in _SOURCE_KINDS else "run"),
            sources=sources,
        )

    def _rejected_self_trigger(self) -> SpawnerResult:
        return SpawnerResult(
            success=False,
            status="failed",
            error_kind="rejected",
            error=(
                f"rejected: butler {self.butler.name!r} has no free slot, and a run waiting "
                "for its own butler would deadlock; try again when the current run has finished"
            ),
            butler=self.butler.name,
            runtime=self.butler.runtime.type,
        )

    async def _run(
        self, run: _Run, position: int, admitted: tuple[Admission, int] | None = None
    ) -> SpawnerResult:
        butler = self.butler
        collector = run.collector
        holding_slot = False
        started_at: datetime | None = None
        started_clock = 0.0
        result: SpawnerResult | None = None
        recorded = False
        cluster: SlotClaim | None = None
        try:
            async with self._admission:
                if run.queued_by is not None:
                    await self._adopt(run)
                else:
                    await asyncio.to_thread(
                        self.store.create_session,
                        run.session_id,
                        butler=butler.name,
                        runtime=butler.runtime.type,
                        model=self.model,
                        prompt=run.redactor.text(run.prompt),
                        context=run.redactor.text(run.context),
                        trigger_source=run.trigger_source,
                        runtime_session_id=run.runtime_session_id or run.resume,
                        parent_session_id=run.parent_session_id,
                        log_dir=session_log_dir(run.session_id),
                        role=run.role,
                        kind=run.kind,
                        sources=[source.name for source in run.sources],
                    )
                recorded = True
            run.log = RunLog.for_session(run.session_id, self.log_cap_bytes, run.redactor)
            if position > 0:
                collector.emit(Queued(run.session_id, butler.name, position))
            async with self._slots:
                self._pending -= 1
                self._active += 1
                holding_slot = True
                try:
                    cluster = await self._cluster_slot()
                    started_at, started_clock = _now(), time.monotonic()
                    result = await self._daily_budget_spent(run) or await self._attempts(run)
                finally:
                    self._active -= 1
        except asyncio.CancelledError:
            result = self._unfinished(collector, "cancelled", "the run was cancelled", "cancelled")
        except StoreError as exc:
            if not recorded:
                # No record can be written (a damaged or read-only store): nothing runs
                # unrecorded, so the trigger fails with the store's own one-line error.
                self._runs.pop(run.session_id, None)
                raise
            result = self._unfinished(collector, "failed", str(exc), "store")
        except Exception as exc:  # a bug of ours: record it rather than lose the session
            logger.exception(
                "run %s of butler %s failed inside spawnkit", run.session_id, butler.name
            )
            result = self._unfinished(collector, "failed", f"internal error: {exc!r}", "internal")
        finally:
            if not holding_slot:
                self._pending -= 1
            if run.log is not None:
                run.log.close()
            await self._withdraw_secret(run)
        assert result is not None  # every branch above sets it
        if started_at is not None and result.duration_ms == 0:
            result = replace(result, duration_ms=int((time.monotonic() - started_clock) * 1000))
        result = replace(
            result, session_id=run.session_id, butler=butler.name, runtime=butler.runtime.type,
            network_denied=collector.denied,
        )  # fmt: skip

        async def record() -> None:
            # The live tool-call writes first: the result's write rewrites the calls.
            if collector.live_calls is not None:
                await collector.live_calls.flush()
            await _in_thread(self.store.complete_session, run.session_id, result)

        try:
            await asyncio.shield(record())
        except asyncio.CancelledError:
            logger.debug("cancelled while recording session %s; the write goes on", run.session_id)
        finally:
            if cluster is not None:  # freed once the record is closed: records never overlap
                cluster.release()
            if admitted is not None:  # the queue place too
                admitted[0].leave(admitted[1])
            self._runs.pop(run.session_id, None)
            if not self._runs and self._lease_task is not None:
                self._lease_task.cancel()  # nothing left to renew
                self._lease_task = None
            self._spending.pop(run.session_id, None)
            for key, redactor in list(self._redactors.items()):
                if redactor is run.redactor:
                    del self._redactors[key]
        collector.emit(Finished(run.session_id, result))
        return result

    async def _adopt(self, run: _Run) -> None:
        """Take over the ``queued`` record the dispatching client made (spawnkit.dispatch)."""
        assert run.queued_by is not None
        adopted = await asyncio.to_thread(
            self.store.adopt_session, run.session_id, queued_by=run.queued_by,
            model=self.model, prompt=run.redactor.text(run.prompt),
            context=run.redactor.text(run.context),
            runtime_session_id=run.runtime_session_id or run.resume,
            log_dir=session_log_dir(run.session_id),
        )  # fmt: skip
        if not adopted:
            raise StoreError(
                f"session {run.session_id}: its queued record is closed or was taken by "
                "another worker; it is not run"
            )

    async def _attempts(self, run: _Run) -> SpawnerResult:
        """The run, started again while it fails on a rate limit or overload before any tool.

        Each start first waits out the butler's cool-down and stagger (:mod:`spawnkit.pacing`).
        A rate limit or overload sets the cool-down to the backoff of :mod:`spawnkit.retry`,
        whether or not this run is started again; a run that had called a tool is not (its
        tools may have had effects) and fails saying so. The result lists every attempt and
        its duration covers them all.
        """
        policy = self.retry
        attempts: list[Attempt] = []
        first = time.monotonic()
        while True:
            waited = await self.pacer.wait()
            if not attempts:
                first = time.monotonic()
            begun = _now()
            result = await self._execute(run, begun)
            outcome = _attempt_outcome(result)
            attempts.append(
                Attempt(
                    number=len(attempts) + 1, started_at=begun, ended_at=_now(), outcome=outcome,
                    message=None if result.success else result.error,
                    cooldown_s=waited.cooldown_s, stagger_s=waited.stagger_s,
                )
            )  # fmt: skip
            if outcome not in RETRYABLE_KINDS:
                break
            self.pacer.cool_down(policy.backoff(len(attempts), retry_after_hint(result.error)))
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
                run.session_id, self.butler.name, outcome, len(attempts), self.pacer.cooling_for,
            )  # fmt: skip
            await self._withdraw_secret(run)
            run.collector.restart()
        return replace(result, attempts=tuple(attempts), duration_ms=_ms_since(first))

    async def _daily_budget_spent(self, run: _Run) -> SpawnerResult | None:
        """A refusal, if the butler's daily budget was spent while the run waited its turn.

        From here the run's spend counts towards the day's until its record holds it.
        """
        self._spending[run.session_id] = run.budget
        if run.budget.limits.daily_cost_usd is None:
            return None
        spent = await asyncio.to_thread(self.store.spent_since, self.butler.name, day_start())
        try:
            run.budget.check_daily(self.butler.name, spent + self._unrecorded_spend(run.budget))
        except BudgetRefused as refused:
            result = self._unfinished(run.collector, "budget", str(refused), "daily_budget")
            return replace(result, budget=run.budget.report())
        return None

    def _unrecorded_spend(self, but: RunBudget | None = None) -> float:
        """What this spawner's runs have spent so far that their records do not hold yet."""
        return sum(b.cost_usd or 0.0 for b in self._spending.values() if b is not but)

    async def _withdraw_secret(self, run: _Run) -> None:
        """The run is over: from now on its MCP secret is refused."""
        secret, run.mcp_secret = run.mcp_secret, None
        if secret is None:
            return
        try:
            await asyncio.shield(self.mcp_access.revoke(secret))
        except asyncio.CancelledError:
            logger.debug("cancelled while withdrawing the secret of %s; it goes on", run.session_id)

    def _unfinished(
        self, collector: _Collector, status: RunStatus, error: str, kind: str
    ) -> SpawnerResult:
        """A result for a run that ended before its runtime reported an outcome."""
        now = _now()
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
            model=self.model,
            trace_id=collector.trace_id,
        )
        return collector.redactor.result(unfinished)

    async def _execute(self, run: _Run, started_at: datetime) -> SpawnerResult:
        butler, worker, collector = self.butler, run.worker, run.collector
        clock = time.monotonic()
        with (
            run_span(
                butler=butler.name,
                runtime=butler.runtime.type,
                model=self.model,
                session_id=run.session_id,
                trigger_source=run.trigger_source,
                provider=self.tracer_provider,
                redactor=run.redactor,
                kind=run.kind,
            ) as span,
            run_workspace(butler, self.workspace_root) as workspace,
        ):
            collector.span = span
            collector.trace_id = trace_id = span.trace_id
            await asyncio.to_thread(
                self.store.mark_started, run.session_id, started_at=started_at,
                trace_id=trace_id, workspace=workspace,
            )  # fmt: skip
            collector.emit(
                Started(
                    run.session_id,
                    butler.name,
                    butler.runtime.type,
                    self.model,
                    run.runtime_session_id,
                    max_turns=run.max_turns,
                )
            )
            outcome: RunOutcome | None = None
            status: RunStatus = "failed"
            error: str | None = None
            error_kind: str | None = None
            exit_code: int | None = None
            contained = False  # in a pid namespace: whatever the run started is gone with it
            try:
                async with contextlib.AsyncExitStack() as parts:
                    doors = await self._open_doors(run, workspace, parts)
                    base_url = await self._open_relay(run, parts, doors)
                    telemetry = await self._cli_receiver(run, span, parts)
                    await self._bridge_doors(run, doors, base_url, telemetry, parts)
                    spec = await self._prepare(
                        run, workspace, span, base_url, None if doors is None else doors.doors
                    )
                    spec = replace(spec, telemetry=telemetry)
                    contained = spec.sandbox.kind == "bwrap"
                    async with asyncio.timeout(run.timeout_s):
                        outcome = await self._invoke(run, spec)
                status = "success" if outcome.success else "failed"
                error, error_kind = outcome.error, outcome.error_kind
                if not outcome.success and run.relay is not None and run.relay.unreachable:
                    # The CLI's own message hides the address: the relay's names it.
                    error = f"{run.relay.unreachable[-1]} ({ModelUnavailable.remedy})"
                    error_kind = ModelUnavailable.kind_default
            except _LimitReached as reached:
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
                raise  # the store's own failure, recorded by _run as such
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
                cancelled = self._unfinished(
                    collector, "cancelled", "the run was cancelled", "cancelled"
                )
                span.finish(replace(cancelled, duration_ms=_ms_since(clock)))
                reap(run.session_id, workspace)
                raise
            finally:
                await asyncio.shield(
                    _in_thread(self._keep_transcripts, worker, workspace, run.redactor)
                )
            if outcome is not None and not outcome.success:
                worker.reset()
            result = self._result(collector, outcome, status, error, error_kind, trace_id, clock)
            if outcome is None and exit_code is not None:
                result = replace(result, exit_code=exit_code)
            result = self._with_budget(run, result)
            span.finish(result)
            # Whatever carries the run's marker now is a leftover: tools a stopped CLI left
            # running, or children the agent backgrounded into sessions of their own (Claude
            # Code and Gemini do that to every tool). Outside a sandbox only this finds them;
            # in one, the end of its pid namespace has killed them all (and the scan of
            # every process on the host would cost the loop milliseconds a run).
            if not contained:
                reap(run.session_id, workspace)
        if result.success and self.memory is not None:
            try:
                await self.memory.store_episode(
                    butler.name, run.session_id, run.redactor.text(run.prompt), result.output
                )
            except Exception:
                logger.exception(
                    "memory: could not store the episode of %s; going on", run.session_id
                )
        return result

    async def _open_relay(
        self, run: _Run, stack: contextlib.AsyncExitStack, doors: Doors | None
    ) -> str | None:
        """Open the run's model relay in ``stack`` (``run.relay``); the base URL its CLI is given.

        A CLI that reaches its model API through a base URL goes through a relay of its own
        (:mod:`spawnkit.relay`) whenever there is an API to forward to: the butler's
        base_url, else the CLI's default API when the run has a model key (a subscription
        login without one goes its own way). The relay swaps the real keys in for the
        placeholders the CLI gets (:meth:`_prepare`), and meters a CLI that reports usage
        only at its end (Codex, Gemini) when the run has a token or dollar limit.
        """
        worker = run.worker
        run.relay = None  # an earlier attempt's, closed
        metered = not worker.live_usage and run.budget.limits.needs_usage
        upstream = self.base_url
        if upstream is None and worker.model_via_base_url():
            resolve = run_values(
                self.butler, self.credentials, worker.passthrough_env, worker.other_vendor_keys
            )
            keyed = await asyncio.to_thread(lambda: any(map(resolve, MODEL_CREDENTIALS)))
            if keyed or (metered and run.budget.price is not None):
                upstream = worker.default_api_url
        if upstream is None or not worker.model_via_base_url():
            if metered:
                logger.warning(
                    "run %s: %s reports usage only at its end, and no model API is known to "
                    "meter; its limits are checked on what it reports", run.session_id,
                    worker.type,
                )  # fmt: skip
            return self.base_url
        meter = None
        if metered:
            from ..metering import Meter

            meter = Meter(run.collector.metered_usage)
            run.collector.metered = True
        # In a network sandbox the relay serves on a door of its own: no TCP port at all,
        # and no bridge between the sandbox's forwarder and the relay.
        uds = port = None
        if doors is not None:
            port = free_port()
            uds = doors.socket_for(port)
        relay = await stack.enter_async_context(
            open_relay(upstream, sink=meter, uds=uds, port=port)
        )
        # Its URL carries the secret, and a CLI may print its URL (in an error, say).
        run.redactor.add_run_secret("SPAWNKIT_RELAY_SECRET", relay.secret)
        run.relay = relay
        return relay.url

    async def _cli_receiver(
        self, run: _Run, span: RunSpan, stack: contextlib.AsyncExitStack
    ) -> CliTelemetry | None:
        """Start the run's OTLP receiver (CLI telemetry on); what it got is stored when it stops.

        It lives in ``stack``, which closes after the CLI has exited: the CLIs flush
        their spans before they exit.
        """
        if not self.cli_telemetry:
            return None
        context = span.span.get_span_context()
        receiver = OtlpReceiver(
            run.session_id,
            run.redactor,
            prompt=run.prompt,
            run_trace=(
                (trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id))
                if context.is_valid
                else None
            ),
            forward=self.otlp_target,
            on_timing=run.collector.emit,  # live: the views show each request and tool
        )
        run.redactor.add_run_secret("SPAWNKIT_OTLP_SECRET", receiver.secret)

        async def store() -> None:
            try:
                await asyncio.to_thread(
                    self.store.record_cli_spans, [asdict(s) for s in receiver.finished()]
                )
                await asyncio.to_thread(
                    self.store.record_cli_events, [asdict(e) for e in receiver.events]
                )
            except StoreError:
                logger.exception("could not store the CLI spans of run %s", run.session_id)

        stack.push_async_callback(store)
        return await stack.enter_async_context(receiver.serve())

    async def _open_doors(
        self, run: _Run, workspace: Path, stack: contextlib.AsyncExitStack
    ) -> Doors | None:
        """The door folder of the run's own network (:mod:`spawnkit.doors`), open until
        ``stack`` closes; None when the run has the host's network."""
        if sandbox.network_policy(self.butler) == "host":
            return None
        return await stack.enter_async_context(open_doors(workspace))

    async def _bridge_doors(
        self,
        run: _Run,
        doors: Doors | None,
        base_url: str | None,
        telemetry: CliTelemetry | None,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        """The other doors of a run in a network of its own: bridges to the butler's MCP
        server, the run's OTLP receiver and a model URL with no relay in front (a loopback
        model server such as the replay server); and the egress proxy when the butler
        allows hosts. The relay, when the run has one, is a door already (:meth:`_open_relay`).

        A model API elsewhere with no relay in front (a subscription login) has no door:
        such a run fails here, before its CLI starts.
        """
        run.egress_port = None  # an earlier attempt's, closed
        if doors is None:
            return
        ports: dict[int, tuple[str, int]] = {}
        port = self.mcp_port or self.butler.port
        if run.kind not in _SOURCE_KINDS and port:  # 0: no server (an ad-hoc butler's own)
            ports[port] = (self.mcp_host, port)
        if telemetry is not None:
            address = loopback_address(telemetry.endpoint)
            if address is not None:
                ports[address[1]] = address
        model = base_url or run.worker.default_api_url
        if run.relay is None and model is not None:
            address = loopback_address(model)
            if address is None:
                raise ConfigError(
                    f'[butler.sandbox] network = "model-only" needs spawnkit\'s relay to reach '
                    f"{model}, and this run has none; give the butler a base_url on this "
                    'machine, or network = "host"'
                )
            ports[address[1]] = address
        for target in ports.values():
            await doors.bridge(target)
        if self.butler.sandbox.allow_hosts:
            # The proxy is a door of its own: on a unix socket only the run reaches.
            port = free_port()
            await stack.enter_async_context(
                egress_proxy(
                    self.butler.sandbox.allow_hosts, doors.socket_for(port),
                    butler=self.butler.name, config_file=self.butler.config_file,
                    on_denied=run.collector.network_denied,
                )
            )  # fmt: skip
            run.egress_port = port

    async def _invoke(self, run: _Run, spec: RunSpec) -> RunOutcome:
        """The worker's run, stopped (``_LimitReached``) as soon as it reaches a limit."""
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
            raise _LimitReached(reached.result())
        run.budget.hit = None  # reached on its last turn: the run ended by itself
        return invoke.result()

    def _with_budget(self, run: _Run, result: SpawnerResult) -> SpawnerResult:
        """The result with the run's budget report, when it had limits that needed one."""
        budget = run.budget
        if not budget.limits.needs_usage and budget.hit is None:
            return result
        cost = result.cost_usd
        if cost is None and budget.limits.needs_usage:
            cost = budget.cost_usd  # Codex and Gemini report no cost: the budget's price
        return replace(result, budget=budget.report(), cost_usd=cost)

    def _keep_transcripts(
        self, worker: RuntimeAdapter, workspace: Path, redactor: Redactor
    ) -> None:
        try:
            worker.keep_transcripts(workspace, redactor.text)
        except OSError:
            logger.exception("could not keep the transcripts of the run in %s", workspace)

    async def _prepare(
        self,
        run: _Run,
        workspace: Path,
        span: RunSpan,
        base_url: str | None,
        doors: tuple[Door, ...] | None = None,
    ) -> RunSpec:
        butler, worker = self.butler, run.worker
        agent = butler.agents.get(run.role) if run.role else None
        if agent is not None:
            base = agent.prompt
        else:
            base = worker.parse_system_prompt_file(butler.system_prompt_file, butler.roster_dir)
        system_prompt = compose_system_prompt(butler, base)
        if self.memory is not None:
            try:
                memory_context = await self.memory.fetch_context(butler.name, run.prompt)
            except Exception:
                logger.exception("memory: could not fetch context for %s; going on", run.session_id)
                memory_context = None
            system_prompt = append_memory(system_prompt, memory_context)
        asking = run.kind in _SOURCE_KINDS
        if run.sources:
            system_prompt += "\n\nThe sources, as linked in your working directory:\n"
            system_prompt += sources_list(run.sources)
        server: McpServerSpec | None = None
        if not asking:
            session_key = run.runtime_session_id or run.resume or run.session_id
            run.mcp_secret = run.redactor.add_run_secret(
                "SPAWNKIT_MCP_SECRET",
                await self.mcp_access.grant(session_key, ttl_s=run.timeout_s + CANCEL_GRACE_S),
            )
            server = McpServerSpec(
                name=butler.name,
                transport=butler.mcp_transport,
                url=mcp_url(butler, session_key, self._mcp_host_seen(doors), self.mcp_port),
                secret=run.mcp_secret,
            )
        identity = {
            "SPAWNKIT_SESSION_ID": run.session_id,
            "SPAWNKIT_BUTLER": butler.name,
            "SPAWNKIT_ROLE": run.role or "butler",
            "SPAWNKIT_WORKSPACE": str(workspace),
            HOME_VAR: run_home(),  # which home's sweep may kill what is left of the run
        }
        traceparent = span.traceparent()
        if traceparent:
            identity["TRACEPARENT"] = traceparent
        env = await asyncio.to_thread(
            isolated_env, butler, self.credentials, worker.passthrough_env, identity,
            worker.other_vendor_keys,
        )  # fmt: skip
        if missing := missing_optional(butler, env):
            logger.warning(
                "run %s of butler %s goes on without %s (optional, not set; "
                "`spawnkit credentials set NAME` sets one)",
                run.session_id, butler.name, ", ".join(missing),
            )  # fmt: skip
        # What was really injected is what must be redacted (a value may have changed
        # since the trigger was accepted).
        names = secret_names(butler, worker.passthrough_env, worker.other_vendor_keys)
        run.redactor.add({name: env[name] for name in names if name in env})
        if run.relay is not None:
            # The CLI gets placeholders; the real keys stay with its relay, which swaps them in.
            env = run.relay.keys.hide(env)
            run.redactor.add({name: env[name] for name in MODEL_CREDENTIALS if name in env})
        if run.egress_port is not None:
            env = {**env, **proxy_env(run.egress_port)}
        linked = source_paths(run.sources)
        if asking:
            cwd = await asyncio.to_thread(link_sources, workspace, run.sources)
        else:
            cwd = run.workdir or butler.workdir or workspace
        tools = (
            agent.tools if agent is not None and agent.tools is not None else butler.runtime.tools
        )
        if run.resume and not await asyncio.to_thread(
            worker.stage_resume, workspace, cwd, run.resume
        ):
            logger.warning("no kept transcript of %s to resume; the CLI looks for it itself",
                           run.resume)  # fmt: skip
        plan = sandbox.plan(
            butler, workspace, worker.install_paths(), read=linked, cwd=cwd,
            write=(run.workdir,) if run.workdir is not None else (),
            interactive=run.kind == "chat", doors=doors or (),
        )  # fmt: skip
        config_file = worker.build_config_file(workspace, server)
        await asyncio.to_thread(
            self.store.record_setup,
            run.session_id,
            sandbox=plan.kind,
            given={
                "config_files": [
                    name for name in files_in(workspace) if not name.startswith(f"{DOORS_DIR}/")
                ],
                "network": _network_given(doors, run.egress_port),
                "mcp_servers": [server.name] if server is not None else [],
                "tools": list(tools),
                "home": "the run's workspace",
                **({"dispatch": self.origin} if self.origin else {}),
                **({"sources": [str(path) for path in linked]} if asking else {}),
            },
        )  # fmt: skip
        return RunSpec(
            session_id=run.session_id,
            butler=butler.name,
            prompt=compose_prompt(run.prompt, run.context),
            system_prompt=system_prompt,
            workspace=workspace,
            cwd=cwd,
            mcp_server=server,
            config_file=config_file,
            env=env,
            max_turns=run.max_turns,
            tools=tools,
            model=(agent.model if agent is not None and agent.model else None) or self.model,
            base_url=base_url,
            default_api=run.relay is not None and self.base_url is None,
            runtime_session_id=run.runtime_session_id,
            resume=run.resume,
            log=run.log,
            # A run acting as one of the roles does not delegate further.
            agents={} if agent is not None or asking else butler.agents,
            sandbox=plan,
            add_dirs=linked,
            model_retries=0 if self.retry.max_attempts > 1 else None,
        )

    def _mcp_host_seen(self, doors: tuple[Door, ...] | None) -> str:
        """The MCP server's host as the CLI names it: behind a door, a loopback name."""
        if doors is None or loopback_address(f"http://{self.mcp_host}") is not None:
            return self.mcp_host
        return "127.0.0.1"

    def _result(
        self,
        collector: _Collector,
        outcome: RunOutcome | None,
        status: RunStatus,
        error: str | None,
        error_kind: str | None,
        trace_id: str | None,
        clock: float,
    ) -> SpawnerResult:
        calls = list(collector.calls.values())
        if outcome is None:
            result = self._unfinished(
                collector, status, error or "the run failed", error_kind or ""
            )
            return replace(result, trace_id=trace_id, duration_ms=_ms_since(clock))
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
            duration_ms=_ms_since(clock),
            usage=outcome.usage,
            cost_usd=outcome.cost_usd,
            trace_id=trace_id,
            model=outcome.model or self.model,
            num_turns=outcome.num_turns,
            exit_code=outcome.exit_code,
        )
        # The outcome's output and error come from the adapter, not through the collector.
        return collector.redactor.result(finished)


class _LimitReached(Exception):
    """Raised inside a run's execution when its budget stops it."""

    def __init__(self, hit: LimitHit) -> None:
        super().__init__(hit.message())
        self.hit = hit


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
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


def _attempt_outcome(result: SpawnerResult) -> AttemptOutcome:
    """What an attempt's result was, as far as retrying goes."""
    if result.success:
        return "ok"
    kind = result.error_kind
    if kind == "rate_limit":
        return "rate_limit"
    if kind == "overloaded":
        return "overloaded"
    return "auth" if kind == "auth" else "other"


def _network_given(doors: tuple[Door, ...] | None, egress_port: int | None) -> str:
    """The run's network policy as its record gives it."""
    if doors is None:
        return "host"
    return "model-only+allow_hosts" if egress_port is not None else "model-only"


def _ms_since(clock: float) -> int:
    return int((time.monotonic() - clock) * 1000)
