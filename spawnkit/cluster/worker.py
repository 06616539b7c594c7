"""The worker's side of a run on a Dask cluster (the client's side is :mod:`spawnkit.run.dispatch`).

:func:`run_trigger` is the task: it runs the trigger through a :class:`ButlerService` kept
per butler, store and scenario for the life of the worker, so the run goes through the one
lifecycle (admission through the store's slots, sandbox, the butler's MCP server on this
worker's loopback, a replay server when the client gave a scenario, one record with this
host's name). Beside the run it waits on the run's ``distributed.Event``: when the client
sets it, the run is cancelled here (its process group killed, its record ``cancelled``).

:class:`SpawnkitPlugin` checks at start-up that this worker can run agents: which CLIs it
finds, and that the store opens (which also sweeps what runs of a worker that died on this
host left behind). ``spawnkit worker --scheduler ADDR`` is ``dask worker ADDR --preload
spawnkit.cluster.worker`` run in its own process (:func:`run_worker`): the preload registers
the plugin (:func:`dask_setup`), and a worker the plugin closed makes the command fail. A
plain ``dask worker`` with spawnkit installed runs the same tasks, without the start-up check.
:func:`secured_worker` is why ``spawnkit worker`` joins only a ``tls://`` scheduler (the
certificates of :mod:`spawnkit.containment.cluster_security`) and listens on one address, not all.
No secret comes with a task: :func:`worker_store` supplies the store's password from this
worker's own configuration.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import pwd
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from distributed import Worker, WorkerPlugin, get_worker

from ..containment.cluster_security import (
    ClusterCredentials,
    ClusterSecurityError,
    default_directory,
    is_secured,
    listen_host,
    load_credentials,
    scheme_of,
)
from ..doctor import RuntimeCheck, check_runtimes
from ..errors import SpawnkitError
from ..events import Finished, RunEvent
from ..home import store_setting
from ..result import RunStatus, SpawnerResult
from ..run import CANCEL_GRACE_S
from ..run.dispatch import WORKER_LOST, DispatchError, RemoteTrigger, event_message
from ..serve.service import ButlerService
from ..store import SessionStore
from ..store.backend import is_postgres_url, redact_url

logger = logging.getLogger(__name__)

# The file `spawnkit worker` names for the plugin to leave the reason it closed the worker.
REFUSAL_VAR = "SPAWNKIT_WORKER_REFUSAL"
# A worker's services, by (butler, store, scenario): started by the first run that needs one.
_services: dict[str, ButlerService] = {}
_starting = asyncio.Lock()


async def _service(request: RemoteTrigger, worker: Worker) -> ButlerService:
    # Frozen dataclasses all the way down: equal configurations print the same.
    key = hashlib.sha256(repr((request.butler, request.store, request.replay)).encode()).hexdigest()
    async with _starting:
        if SpawnkitPlugin.name not in worker.plugins:
            # A plain `dask worker`: still stop the services when the worker closes.
            await worker.plugin_add(SpawnkitPlugin(check=False))
        if (service := _services.get(key)) is None:
            store = await asyncio.to_thread(SessionStore, worker_store(request.store))
            service = ButlerService(
                request.butler, store=store, replay=request.replay, mcp_host="127.0.0.1",
                origin={"worker": worker.address},
            )  # fmt: skip
            await service.__aenter__()
            _services[key] = service
        return service


def worker_store(travelled: str) -> str:
    """The store to open for a run whose client named ``travelled`` (a SQLite path, or a
    PostgreSQL URL without password: no secret travels in a task). This worker's own store
    (``$SPAWNKIT_STORE``, else ``[store] url`` in its config.toml) when it is that one,
    password included; else ``travelled`` as it is (libpq may still find a password in
    this host's ``~/.pgpass`` or ``$PGPASSWORD``)."""
    own = store_setting()
    if own is not None and is_postgres_url(own) and redact_url(own) == travelled:
        return own
    return travelled


async def close_services() -> None:
    """Stop this worker's services: their runs are cancelled and recorded."""
    services = list(_services.values())
    _services.clear()
    for service in services:
        try:
            await service.__aexit__(None, None, None)
        finally:
            service.store.close()


async def run_trigger(request: RemoteTrigger) -> SpawnerResult | SpawnkitError:
    """Run a dispatched trigger on this worker; its events go to the client as they happen.

    A trigger refused before it is accepted (a full queue, a missing CLI or variable) comes
    back as the error itself, for the client to raise: not a failed task, which Dask logs.
    """
    worker = get_worker()
    seq = 0

    def emit(event: RunEvent | None) -> None:
        nonlocal seq
        worker.log_event(request.topic, event_message(request.session_id, seq, event))
        seq += 1

    service = await _service(request, worker)
    store = service.store
    record = await asyncio.to_thread(store.get_session, request.session_id)
    queued = (  # the record the client made when it accepted the trigger, for us to adopt
        record is not None and record.completed_at is None and record.started_at is None
        and request.queued_by == (record.owner_host, record.owner_pid)
    )  # fmt: skip
    closed_first = (
        record is not None and record.completed_at is not None
        and not (record.error or "").startswith(WORKER_LOST)
    )  # fmt: skip
    if record is not None and closed_first and request.queued_by is not None:
        # Closed before it started: cancelled by its client, or its client died and a
        # sweep closed the record. Never started here; it stays as it is.
        return _not_run(
            request, emit, "cancelled" if record.status == "cancelled" else "crashed",
            record.error_kind or "cancelled", record.error or "closed before it started",
        )  # fmt: skip
    if (
        record is not None
        and not queued
        and (record.completed_at is None or (record.error or "").startswith(WORKER_LOST))
    ):
        # Dask runs a task again when the worker running it died; an agent run is not
        # idempotent. An open record no longer queued by its client says a worker adopted
        # it (it is adopted first); so does one a sweep closed as its worker's. (Another
        # closed one is an id used again: the trigger refuses it below, as a local one does.)
        reason = (
            f"{WORKER_LOST}: the Dask worker that ran this session died before it "
            "completed; it is not run again"
        )
        if not await asyncio.to_thread(store.mark_crashed, request.session_id, reason):
            record = await asyncio.to_thread(store.get_session, request.session_id)
            reason = (record.error if record is not None else None) or reason
        logger.warning("session %s: %s", request.session_id, reason)
        return _not_run(request, emit, "crashed", "worker_lost", reason)
    if await worker.scheduler.event_is_set(name=request.cancel_event):
        return _not_run(  # cancelled while it waited for a worker
            request, emit, "cancelled", "cancelled", "the run was cancelled before it started"
        )
    run = asyncio.create_task(
        service.spawner.trigger(
            request.prompt, request.trigger_source, session_id=request.session_id,
            on_event=emit, queued_by=request.queued_by if queued else None, **request.options,
        )
    )  # fmt: skip
    cancel = asyncio.create_task(worker.scheduler.event_wait(name=request.cancel_event))
    try:
        await asyncio.wait({run, cancel}, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            logger.info("session %s: cancelled by its client", request.session_id)
            if not await service.spawner.cancel(request.session_id):
                run.cancel()
            await asyncio.wait({run}, timeout=CANCEL_GRACE_S)
        try:
            result = run.result()
        except SpawnkitError as refused:
            return refused
    finally:
        await _end_wait(worker, request.cancel_event, cancel)
        emit(None)
    return replace(result, session_id=request.session_id)


def _not_run(
    request: RemoteTrigger,
    emit: Callable[[RunEvent | None], None],
    status: RunStatus,
    kind: str,
    error: str,
) -> SpawnerResult:
    """The result of a task that does not run its trigger, told to the client as a run's."""
    result = SpawnerResult(
        success=False, status=status, error=error, error_kind=kind,
        session_id=request.session_id, butler=request.butler.name,
        runtime=request.butler.runtime.type,
    )  # fmt: skip
    emit(Finished(request.session_id, result))
    emit(None)
    return result


async def _end_wait(worker: Worker, name: str, waiting: asyncio.Task[Any]) -> None:
    """Release the scheduler's wait on the run's event: by setting it (a waiter cancelled
    mid-call is logged there as an error), then clearing it (which frees its state)."""
    try:
        if not waiting.done():
            await worker.scheduler.event_set(name=name)
            async with asyncio.timeout(5):
                await waiting
        await worker.scheduler.event_clear(name=name)
    except (OSError, TimeoutError) as exc:  # the scheduler is gone: nothing left to free
        logger.debug("could not release the cancel event %s: %r", name, exc)
    finally:
        if not waiting.done():
            waiting.cancel()


# -- the plugin -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerReport:
    """What a worker found at start-up: its CLIs and its store."""

    host: str
    runtimes: tuple[RuntimeCheck, ...]
    store: str | None
    store_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.store_error is None and any(check.found for check in self.runtimes)

    def summary(self) -> str:
        """One line of what this worker found: its CLIs, its store, the roster here."""
        found = [f"{c.runtime} {c.version or '?'}" for c in self.runtimes if c.found]
        missing = [c.runtime for c in self.runtimes if not c.found]
        clis = ", ".join(found) or "none"
        if missing:
            clis += f" (not found: {', '.join(missing)})"
        return f"CLIs {clis}; store {self.store}; roster {_roster_here()}"

    @property
    def problem(self) -> str | None:
        """Why this worker cannot run agents, or None when it can."""
        if self.ready:
            return None
        return self.store_error or "no agent CLI (claude, codex, gemini) found"


class SpawnkitPlugin(WorkerPlugin):
    """Checks at start-up that the worker can run agents; stops its services at close.

    A worker with no agent CLI, or whose store does not open, fails to start (``strict``,
    the default) rather than take runs that would all fail.
    """

    name = "spawnkit"

    def __init__(
        self, store: str | None = None, *, strict: bool = True, check: bool = True
    ) -> None:
        self.store = store
        self.strict = strict
        self.check = check  # False: only stop the services at close (a plain dask worker)
        self.report: WorkerReport | None = None
        self._closing: asyncio.TimerHandle | None = None

    async def setup(self, worker: Worker) -> None:
        if not self.check:
            return
        self.report = report = await asyncio.to_thread(check_worker, self.store)
        for check in report.runtimes:
            logger.info(
                "spawnkit: %s %s", check.runtime,
                f"{check.version or ''} at {check.path}" if check.found else "not found",
            )  # fmt: skip
        problem = report.problem
        if problem is None:
            _say(f"spawnkit worker: ready at {worker.address}: {report.summary()}")
        else:
            logger.error("spawnkit: this worker cannot run agents: %s", problem)
            if self.strict:
                _leave_refusal(problem)
                # Dask logs a failing plugin or preload and starts the worker anyway: close
                # it, and its nanny (which would start it again), once it has started.
                self._closing = asyncio.get_running_loop().call_later(
                    0.1, lambda: asyncio.ensure_future(
                        worker.close(nanny=True, reason=f"spawnkit: {problem}")
                    ),
                )  # fmt: skip

    async def teardown(self, worker: Worker) -> None:
        await close_services()
        if self.check:
            _say(f"spawnkit worker: stopped ({worker.address})")


def _leave_refusal(problem: str) -> None:
    """Tell ``spawnkit worker`` why the plugin closed this worker, so that it exits non-zero.

    The plugin may run in the nanny's child process: the reason goes through the file the
    command named in :data:`REFUSAL_VAR`, which that child inherits (a plain ``dask worker``
    sets none, and only logs the reason).
    """
    path = os.environ.get(REFUSAL_VAR)
    if path:
        Path(path).write_text(problem, encoding="utf-8")


def _say(line: str) -> None:
    """A line of spawnkit's own among Dask's, on the worker's stderr."""
    print(line, file=sys.stderr, flush=True)


def _roster_here() -> str:
    """The roster found where the worker started (runs bring their own butler: informative)."""
    from ..config.roster_location import find_roster

    try:
        return str(find_roster(None))
    except SpawnkitError:
        return "none here (each run brings its butler)"


def check_worker(store: str | None = None) -> WorkerReport:
    """The CLIs this host finds, and whether its store opens (sweeping this host's dead runs)."""
    runtimes = tuple(check_runtimes())
    try:
        with SessionStore(store) as opened:
            return WorkerReport(opened.host, runtimes, opened.location)
    except SpawnkitError as exc:
        return WorkerReport(os.uname().nodename, runtimes, store, str(exc))


async def dask_setup(worker: Worker) -> None:
    """``--preload spawnkit.cluster.worker``: register the plugin on this worker (and say,
    at every start, when it takes connections without certificates)."""
    if not worker.security.require_encryption:
        logger.warning(
            "spawnkit: this worker is not secured (--insecure): whoever reaches it or its "
            "scheduler can run code here as %s", _user(),
        )  # fmt: skip
    await worker.plugin_add(SpawnkitPlugin(os.environ.get("SPAWNKIT_STORE") or None))


# -- `spawnkit worker` ----------------------------------------------------------------------

# `dask worker` options that say where the worker and its nanny listen: when one is given,
# spawnkit adds none of its own.
_PLACEMENT = ("--host", "--listen-address", "--contact-address", "--interface")
_DASHBOARD = ("--dashboard-address", "--dashboard", "--no-dashboard")


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _given(options: Sequence[str], names: Sequence[str]) -> bool:
    return any(o == n or o.startswith(f"{n}=") for o in options for n in names)


def secured_worker(
    scheduler: str,
    options: Sequence[str] = (),
    *,
    credentials: Path | None = None,
    insecure: bool = False,
) -> tuple[str, list[str], ClusterCredentials | None]:
    """The scheduler address, ``dask worker`` options and credentials of ``spawnkit worker``.

    A scheduler that is not ``tls://`` is refused (a :class:`ClusterSecurityError`) unless
    ``insecure``; a ``tls://`` one needs the cluster's credentials (``credentials``, else
    ``$SPAWNKIT_HOME/cluster``). Unless ``options`` place it, the worker and its nanny
    listen on the one address this host reaches the scheduler from (loopback for a
    scheduler on loopback), and a dashboard on loopback only.
    """
    found = load_credentials(credentials)
    if credentials is not None and found is None:
        raise ClusterSecurityError(f"no cluster credentials in {credentials}")
    if scheme_of(scheduler) is None and found is not None:
        scheduler = f"tls://{scheduler}"
    if not is_secured(scheduler):
        if not insecure:
            raise ClusterSecurityError(
                f"{scheduler} is not a secured scheduler: whoever reaches it, or this worker, "
                f"could run code here as {_user()}; give the tls:// address of one started "
                "by `spawnkit scheduler`, or pass --insecure"
            )
        found = None
    elif found is None:
        raise ClusterSecurityError(
            f"{scheduler} is secured and this host has no cluster credentials in "
            f"{default_directory()}: copy them from the scheduler's host (spawnkit scheduler "
            "--export-credentials DIR) and pass --credentials DIR, or copy the folder there"
        )
    added = found.dask_options() if found is not None else []
    if not _given(options, _PLACEMENT):
        host = listen_host(scheduler)
        added += ["--host", f"[{host}]" if ":" in host else host]
    if not _given(options, _DASHBOARD):
        added += ["--dashboard-address", "127.0.0.1:0"]
    return scheduler, [*added, *options], found


def reach_scheduler(scheduler: str, credentials: ClusterCredentials | None) -> None:
    """Connect to the scheduler once (with the worker's certificate on ``tls://``), within
    Dask's connect timeout: a scheduler out of reach, or one that refuses these
    credentials, is one line (a :class:`DispatchError`) rather than Dask's traceback."""
    import dask
    from dask.utils import parse_timedelta
    from distributed.comm.core import connect

    timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
    args = credentials.security().get_connection_args("worker") if credentials else {}

    async def probe() -> None:
        comm = await connect(scheduler, timeout=timeout, **args)
        await comm.close()

    try:
        asyncio.run(probe())
    except (OSError, TimeoutError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DispatchError(f"cannot reach the Dask scheduler at {scheduler}: {reason}") from None


def worker_command(scheduler: str, options: Sequence[str] = ()) -> list[str]:
    """``dask worker SCHEDULER --preload spawnkit.cluster.worker OPTIONS`` for this Python."""
    return [
        sys.executable, "-m", "distributed.cli.dask_worker", scheduler,
        "--preload", "spawnkit.cluster.worker", *options,
    ]  # fmt: skip


def run_worker(scheduler: str, options: Sequence[str] = ()) -> tuple[int, str | None]:
    """Be ``dask worker`` with spawnkit's plugin, in this process (signals reach Dask as
    they would), until it stops; returns its exit status and, when the plugin's start-up
    check closed it, why (Dask itself then exits 0, which a supervisor takes for a clean
    stop: the caller makes it a failure)."""
    import tempfile

    from distributed.cli.dask_worker import main as dask_worker

    fd, refusal = tempfile.mkstemp(prefix="spawnkit-worker-", suffix=".refusal")
    os.close(fd)
    os.environ[REFUSAL_VAR] = refusal
    try:
        code = 1
        try:  # click ends every run with SystemExit, a clean one included
            dask_worker.main(args=worker_command(scheduler, options)[3:], prog_name="dask worker")
        except SystemExit as stop:
            code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
        reason = Path(refusal).read_text(encoding="utf-8").strip() or None
    finally:
        os.environ.pop(REFUSAL_VAR, None)
        Path(refusal).unlink(missing_ok=True)
    return code, reason


def _worker_report(dask_worker: Worker) -> dict[str, Any] | None:
    """The plugin's report on a worker (``client.run(_worker_report)``), if it has one."""
    plugin = dask_worker.plugins.get(SpawnkitPlugin.name)
    report = getattr(plugin, "report", None)
    if report is None:
        return None
    return {"host": report.host, "ready": report.ready, "store": report.store,
            "runtimes": [c.runtime for c in report.runtimes if c.found]}  # fmt: skip
