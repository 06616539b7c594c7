"""The shell adapter contract: ``spawnkit adapter RUNTIME ...`` for meta-orchestrators.

An orchestrator that drives several agent CLIs through one shell interface
calls::

    spawnkit adapter RUNTIME capabilities                      -> JSON on stdout
    spawnkit adapter RUNTIME spawn BRIEF_FILE STATE_FILE PROMPT -> a session id
    spawnkit adapter RUNTIME resume SESSION_ID STATE_FILE PROMPT -> a new session id
    spawnkit adapter RUNTIME check_status SESSION_ID           -> pending|active|completed|failed
    spawnkit adapter RUNTIME spawn_subagent ROLE BRIEF_FILE STATE_FILE PROMPT -> a session id
    spawnkit adapter RUNTIME --roster R --butler B start_mcp_server -> the server's pid
    spawnkit adapter RUNTIME start_mcp_server BUTLER_OR_CONFIG     -> the same, positionally
      (clients send the token in $SPAWNKIT_HOME/mcp/<butler>-<port>.token as a bearer)

``spawn`` and ``resume`` return as soon as the session exists: the run goes on
in a detached worker process (logging to ``$SPAWNKIT_HOME/sessions/<id>/
adapter.log``), so ``check_status`` can be polled at once. The brief is the
run's system prompt; the state file is a JSON object the agent receives as
context and that the worker updates when the run ends (under ``"spawnkit"``:
the latest session and its result; under ``"sessions"``: every session id).
``spawn`` is idempotent: the same brief and state file (and role) while that
session is still pending (its worker started, its record not written yet, included) or
active return it instead of starting another; once it has finished, a new one starts.
Timeouts come from ``$SPAWNKIT_HOME/adapter.toml`` (``[adapter] timeout_s``,
``start_timeout_s``).

Exit codes (see docs/adapter-contract.md): 0 done, 1 failure of the session
being waited on, 2 usage error (bad arguments, unreadable brief, state file
that is not a JSON object), 3 runtime unavailable, 4 unknown session.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..containment.liveness import owner_alive, process_start
from ..errors import MissingApiKeyError, MissingEnvError, RuntimeNotFoundError, SpawnkitError
from ..home import spawnkit_home
from ..result import RunStatus, SpawnerResult
from ..runtimes import get_adapter
from ..store import SessionRecord, SessionStore
from ..telemetry.runlog import session_log_dir
from .runs import check_runnable

if TYPE_CHECKING:
    import subprocess

    from ..config.roster import ButlerConfig

# `check_status` is polled: this module imports only what it needs at the top, and the
# roster, subprocesses, sockets and MCP tokens where spawn, resume and the MCP server
# use them.

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_UNKNOWN = 0, 1, 2, 3, 4
START_TIMEOUT_S = 30.0

STATUS = {
    "queued": "pending",
    "running": "active",
    "success": "completed",
    "failed": "failed",
    "cancelled": "failed",
    "crashed": "failed",
    "budget": "failed",
    "timeout": "failed",
}


class ContractError(SpawnkitError):
    """A contract command that cannot be carried out; ``code`` is its exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        self.code = code
        super().__init__(message)


def read_state(path: Path) -> dict[str, Any]:
    """The state file's JSON object; a missing or empty file is an empty state."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ContractError(f"cannot read the state file {path}: {exc.strerror}") from None
    if not text.strip():
        return {}
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"the state file {path} is not JSON: {exc}") from None
    if not isinstance(state, dict):
        raise ContractError(f"the state file {path} must hold a JSON object")
    return state


def write_state(path: Path, state: Mapping[str, Any]) -> None:
    """Replace the state file atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(state, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def state_context(state: Mapping[str, Any]) -> str | None:
    if not state:
        return None
    return "Current state (JSON, from the orchestrator's state file):\n" + json.dumps(
        state, indent=2, ensure_ascii=False
    )


def record_result(path: Path, result: SpawnerResult) -> None:
    state = read_state(path)
    state["spawnkit"] = {
        "session_id": result.session_id,
        "runtime": result.runtime,
        "status": STATUS.get(result.status, result.status),
        "success": result.success,
        "error": result.error,
        "output": result.output,
        "runtime_session_id": result.runtime_session_id,
        "updated_at": datetime.now(UTC).isoformat(),
    }
    sessions = state.get("sessions")
    sessions = sessions if isinstance(sessions, list) else []
    if result.session_id not in sessions:
        sessions.append(result.session_id)
    state["sessions"] = sessions
    write_state(path, state)


def capabilities(runtime: str) -> dict[str, Any]:
    adapter = get_adapter(runtime)()
    return {"runtime": runtime, **adapter.capabilities()}


def check_status(session_id: str, store: SessionStore | None = None) -> str:
    """The contract status; a finished run stays ``active`` until its state file is written.

    A session spawn started whose worker has not written its record yet is ``pending``
    while that worker lives, and ``failed`` once it is gone without writing one.
    """
    record = (store or SessionStore()).get_session(session_id)
    if record is None:
        meta = _read_meta(session_id)
        if not meta.get("worker_pid"):
            raise ContractError(f"unknown session {session_id!r}", EXIT_UNKNOWN)
        return "pending" if _worker_alive(meta) else "failed"
    status = STATUS.get(record.status, "failed")
    finished = status in ("completed", "failed") and record.status != "crashed"
    return "active" if finished and _worker_alive(_read_meta(session_id)) else status


@dataclass(frozen=True)
class Options:
    """What every contract command shares: the runtime and where its runs come from."""

    runtime: str
    roster: Path | None = None
    butler: str | None = None
    replay: Path | None = None

    def argv(self) -> list[str]:
        flags = [f"--{name}={value}" for name in ("roster", "butler", "replay")
                 if (value := getattr(self, name)) is not None]  # fmt: skip
        return ["adapter", self.runtime, *flags]


@dataclass(frozen=True)
class Config:
    """``$SPAWNKIT_HOME/adapter.toml``, section ``[adapter]``."""

    timeout_s: float | None = None  # a session's run timeout (else the butler's own)
    start_timeout_s: float = START_TIMEOUT_S  # how long spawn waits for the worker

    @classmethod
    def load(cls) -> Config:
        path = spawnkit_home() / "adapter.toml"
        try:
            with open(path, "rb") as fh:
                table = tomllib.load(fh).get("adapter", {})
        except FileNotFoundError:
            return cls()
        except tomllib.TOMLDecodeError as exc:
            raise ContractError(f"{path}: invalid TOML: {exc}") from None
        unknown = set(table) - {"timeout_s", "start_timeout_s"}
        if unknown:
            raise ContractError(f"{path}: [adapter]: unknown keys {', '.join(sorted(unknown))}")
        try:
            return cls(
                timeout_s=float(table["timeout_s"]) if "timeout_s" in table else None,
                start_timeout_s=float(table.get("start_timeout_s", START_TIMEOUT_S)),
            )
        except (TypeError, ValueError):
            raise ContractError(f"{path}: [adapter]: timeouts must be numbers") from None


def contract_butler(options: Options, brief: Path, role: str | None = None) -> ButlerConfig:
    """The butler a contract session runs as: a roster butler, or the brief as a prompt."""
    from ..config.roster import adhoc_butler, load_roster
    from ..config.roster_location import find_roster

    config = Config.load()
    if options.butler:
        butler = load_roster(find_roster(options.roster))[options.butler].with_runtime(
            options.runtime
        )
        if role is not None and role not in butler.agents:
            known = ", ".join(sorted(butler.agents)) or "none"
            raise ContractError(f"butler {butler.name!r} has no role {role!r} (roles: {known})")
    else:
        if not brief.is_file():
            raise ContractError(f"the brief file {brief} does not exist")
        butler = adhoc_butler(
            options.runtime, Path.cwd(), name=f"adapter-{options.runtime}", prompt_file=brief
        )
    if config.timeout_s is not None:
        butler = replace(butler, runtime=replace(butler.runtime, timeout_s=config.timeout_s))
    return butler


def preflight(butler: ButlerConfig, store: SessionStore, *, replayed: bool = False) -> None:
    """Fail fast, before a worker is started, when the runtime's CLI is missing or, unless
    the run is replayed (the replay server gives it a key), nothing could authenticate it."""
    try:
        check_runnable(butler, store, replayed=replayed)
    except (RuntimeNotFoundError, MissingApiKeyError, MissingEnvError) as exc:
        raise ContractError(str(exc), EXIT_UNAVAILABLE) from None


# -- spawn, resume, spawn_subagent ---------------------------------------------------------


def spawn(
    options: Options,
    brief: Path,
    state: Path,
    prompt: str,
    *,
    role: str | None = None,
    store: SessionStore,
) -> str:
    """Start a session (or return the one still active for this brief and state file)."""
    _check_prompt(prompt)
    if role is not None and not capabilities(options.runtime).get("supports_subagents"):
        raise ContractError(f"the {options.runtime} runtime has no sub-agents")
    brief, state = brief.resolve(), state.resolve()
    read_state(state)  # a broken state file is refused now, not in the worker
    butler = contract_butler(options, brief, role)
    preflight(butler, store, replayed=options.replay is not None)
    key = _spawn_key(options, brief, state, role)
    # The decision and the worker's start are one step under the lock; the earlier spawn is
    # remembered before its worker starts, so an identical spawn that comes while that worker
    # has not written the record yet (this spawn still waiting below, or gone: killed, timed
    # out) finds it pending instead of starting a second session.
    with _spawn_lock():
        active = _active_spawn(key, store)
        if active is not None:
            return active
        session_id = str(uuid.uuid4())
        save_meta(session_id, brief=str(brief), spawn_key=key, role=role)
        prompt_file = write_prompt(session_id, prompt)
        argv = [*options.argv(), "_worker", "--session-id", session_id, "--brief", str(brief),
                "--state", str(state), "--prompt-file", str(prompt_file)]  # fmt: skip
        if role is not None:
            argv += ["--role", role]
        _spawns_dir().joinpath(f"{key}.json").write_text(json.dumps({"session_id": session_id}))
        worker = launch_worker(argv, session_id)
    return wait_for_session(worker, session_id, store)


def resume(
    options: Options, session_id: str, state: Path, prompt: str, *, store: SessionStore
) -> str:
    """Continue a finished contract session as a new linked one; returns the new id."""
    _check_prompt(prompt)
    if store.get_session(session_id) is None:
        raise ContractError(f"unknown session {session_id!r}", EXIT_UNKNOWN)
    meta = session_meta(session_id)
    read_state(state)
    brief = Path(meta.get("brief", ""))
    butler = contract_butler(options, brief)
    preflight(butler, store, replayed=options.replay is not None)
    new_id = str(uuid.uuid4())
    save_meta(new_id, brief=str(brief))
    argv = [*options.argv(), "_worker", "--session-id", new_id, "--brief", str(brief),
            "--state", str(state.resolve()), "--resume-from", session_id,
            "--prompt-file", str(write_prompt(new_id, prompt))]  # fmt: skip
    return start_worker(argv, new_id, store)


def _spawn_key(options: Options, brief: Path, state: Path, role: str | None) -> str:
    material = json.dumps(
        [options.runtime, str(options.roster), options.butler, str(brief), str(state), role]
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _spawns_dir() -> Path:
    folder = spawnkit_home() / "contract" / "spawns"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def _spawn_lock() -> Iterator[None]:
    """One spawn decision at a time across processes (two identical spawns race here)."""
    with open(_spawns_dir().parent / "spawn.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _active_spawn(key: str, store: SessionStore) -> str | None:
    """The session of an earlier identical spawn, if it is still pending or active."""
    try:
        earlier = json.loads(_spawns_dir().joinpath(f"{key}.json").read_text())["session_id"]
    except (OSError, ValueError, KeyError):
        return None
    try:
        status = check_status(earlier, store)
    except ContractError:
        return None
    return str(earlier) if status in ("pending", "active") else None


# -- the worker and the MCP server ----------------------------------------------------------


def run_worker(
    options: Options,
    session_id: str,
    brief: Path,
    state: Path,
    prompt: str,
    *,
    resume_from: str | None,
    role: str | None,
    store: SessionStore,
) -> SpawnerResult:
    """Run one contract session in this (detached) process and update the state file.

    SIGTERM and SIGHUP cancel the session as Ctrl-C would (see :mod:`spawnkit.signals`);
    the state file then reports it cancelled, and :class:`~spawnkit.signals.Stopped`
    goes on to the command line.
    """
    from ..replay import Scenario
    from ..serve.service import ButlerService

    butler = contract_butler(options, brief, role)
    context = state_context(read_state(state))

    async def work() -> SpawnerResult:
        async with ButlerService(
            butler, store=store, replay=Scenario.load(options.replay) if options.replay else None
        ) as service:
            if resume_from:
                return await service.spawner.resume(
                    resume_from, prompt, context, new_session_id=session_id
                )
            return await service.spawner.trigger(
                prompt, context=context, session_id=session_id, role=role
            )

    from .. import signals  # here: it loads asyncio, which a status poll does not need

    try:
        try:
            result = signals.run(work())
        except signals.Stopped:
            # Cancelled and recorded like a Ctrl-C; the orchestrator still gets its state.
            record = store.get_session(session_id)
            if record is not None:
                record_result(state, _result_of(record))
            raise
        record_result(state, result)
    finally:
        save_meta(session_id, done=True)
    return result


def _result_of(record: SessionRecord) -> SpawnerResult:
    """The fields of a recorded session that the state file reports."""
    return SpawnerResult(
        output=record.output or "", success=bool(record.success), error=record.error,
        session_id=record.id, runtime_session_id=record.runtime_session_id,
        runtime=record.runtime, status=cast(RunStatus, record.status),
    )  # fmt: skip


def mcp_server_butler(options: Options, config: str | None = None) -> ButlerConfig:
    """The butler ``start_mcp_server`` serves: ``--butler``, or the interface's positional
    form, a butler's name in the roster or the path of its ``butler.toml`` or folder."""
    from ..config.roster import load_butler, load_roster
    from ..config.roster_location import find_roster

    if config is None:
        if not options.butler:
            raise ContractError(
                "start_mcp_server needs --butler (and --roster), or a butler's name or the "
                "path of its butler.toml"
            )
        return load_roster(find_roster(options.roster))[options.butler]
    path = Path(config).expanduser()
    is_path = os.sep in config or config.endswith(".toml") or (path / "butler.toml").is_file()
    if not is_path:
        butler = load_roster(find_roster(options.roster))[config]
    elif path.is_file() or (path / "butler.toml").is_file():
        butler = load_butler(path.parent if path.is_file() else path)
    else:
        raise ContractError(f"no butler.toml at {path}")
    if options.butler and options.butler != butler.name:
        raise ContractError(
            f"{config} is butler {butler.name!r}, but --butler says {options.butler!r}"
        )
    return butler


def start_mcp_server(options: Options, config: str | None = None) -> int:
    """Serve the butler's MCP server in a detached process; returns its pid once it listens.

    Clients authenticate with the owner token in :func:`~spawnkit.containment.mcp_access.
    owner_token_path` (``$SPAWNKIT_HOME/mcp/<butler>-<port>.token``, mode 0600). It is
    created here, before the server starts, so it can be read as soon as the pid is out.
    """
    import subprocess

    from ..containment.mcp_access import owner_token, owner_token_path

    butler = mcp_server_butler(options, config)
    if _listening(butler.port):
        raise ContractError(f"port {butler.port} of butler {butler.name!r} is already in use")
    owner_token(owner_token_path(butler.name, butler.port), create=True)
    logs = spawnkit_home() / "servers"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "spawnkit", "serve", butler.name,
            "--roster", str(butler.roster_dir)]  # fmt: skip
    with open(logs / f"{butler.name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env=dict(os.environ),
        )  # fmt: skip
    deadline = time.monotonic() + Config.load().start_timeout_s
    while not _listening(butler.port):
        if proc.poll() is not None:
            raise ContractError(f"the MCP server exited; see {logs / f'{butler.name}.log'}")
        if time.monotonic() > deadline:
            proc.kill()
            raise ContractError(f"the MCP server did not listen on port {butler.port} in time")
        time.sleep(0.05)
    return proc.pid


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def start_worker(argv: list[str], session_id: str, store: SessionStore) -> str:
    """Start a detached worker for ``session_id`` and wait until its session exists."""
    return wait_for_session(launch_worker(argv, session_id), session_id, store)


def launch_worker(argv: list[str], session_id: str) -> subprocess.Popen[bytes]:
    """Start the detached worker of ``session_id``; its pid (and start time, so that a later
    process with its pid is not taken for it) goes into the session's contract facts."""
    import subprocess

    log_dir = session_log_dir(session_id)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "adapter.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spawnkit", *argv],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, env=dict(os.environ),
        )  # fmt: skip
    save_meta(session_id, worker_pid=proc.pid, worker_start=process_start(proc.pid))
    return proc


def wait_for_session(proc: subprocess.Popen[bytes], session_id: str, store: SessionStore) -> str:
    """Wait until the worker wrote the session's record; a worker that exits first, or one
    that has not written it within ``start_timeout_s`` (it is then stopped, so that no
    session starts after spawn said it did not), is a :class:`ContractError`."""
    import signal

    timeout = Config.load().start_timeout_s
    deadline = time.monotonic() + timeout
    log = session_log_dir(session_id) / "adapter.log"
    while store.get_session(session_id) is None:
        code = proc.poll()
        if code is not None:
            tail = log.read_text(errors="replace").strip().splitlines()
            reason = tail[-1] if tail else f"exit code {code}"
            exit_code = EXIT_UNAVAILABLE if code == EXIT_UNAVAILABLE else EXIT_USAGE
            raise ContractError(f"the session did not start: {reason}", exit_code)
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):  # as Ctrl-C: a record it made is
                os.killpg(proc.pid, signal.SIGTERM)  # recorded cancelled
            raise ContractError(f"the session did not start within {timeout:g} s", EXIT_FAILED)
        time.sleep(0.05)
    return session_id


def _worker_alive(meta: Mapping[str, Any]) -> bool:
    """Whether the worker named in a session's contract facts still runs (and is not done)."""
    worker, start = meta.get("worker_pid"), meta.get("worker_start")
    if meta.get("done") or not isinstance(worker, int):
        return False
    return owner_alive(worker, start if isinstance(start, str) else None)


PROMPT_FILE = "prompt.txt"


def _check_prompt(prompt: str) -> None:
    from ..run.request import refuse_nul

    if not prompt.strip():
        raise ContractError("the prompt is empty: give the agent something to do")
    try:
        refuse_nul(prompt, "the prompt")
    except SpawnkitError as exc:
        raise ContractError(str(exc)) from None


def write_prompt(session_id: str, prompt: str) -> Path:
    """Hand the prompt to the worker as a file: an argument over 128 KiB cannot be passed."""
    log_dir = session_log_dir(session_id)
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / PROMPT_FILE
    path.write_text(prompt, encoding="utf-8")
    return path


def read_prompt_file(path: Path) -> str:
    """The prompt :func:`write_prompt` left for this worker."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from None


def save_meta(session_id: str, **meta: Any) -> None:
    """Contract facts next to the session's logs: the brief, the worker, whether it is done."""
    log_dir = session_log_dir(session_id)
    log_dir.mkdir(parents=True, exist_ok=True)
    merged = {**_read_meta(session_id), **meta}
    tmp = log_dir / f".contract.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(merged), encoding="utf-8")
    tmp.replace(log_dir / "contract.json")


def _read_meta(session_id: str) -> dict[str, Any]:
    try:
        data = json.loads((session_log_dir(session_id) / "contract.json").read_text())
    except (OSError, ValueError):
        return {}
    return dict(data) if isinstance(data, dict) else {}


def session_meta(session_id: str) -> dict[str, Any]:
    meta = _read_meta(session_id)
    if not meta:
        raise ContractError(
            f"session {session_id} was not started through the adapter contract", EXIT_UNKNOWN
        )
    return meta
