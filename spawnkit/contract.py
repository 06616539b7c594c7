"""The shell adapter contract: ``spawnkit adapter RUNTIME ...`` for meta-orchestrators.

An orchestrator that drives several agent CLIs through one shell interface
calls::

    spawnkit adapter RUNTIME capabilities                      -> JSON on stdout
    spawnkit adapter RUNTIME spawn BRIEF_FILE STATE_FILE PROMPT -> a session id
    spawnkit adapter RUNTIME resume SESSION_ID STATE_FILE PROMPT -> a new session id
    spawnkit adapter RUNTIME check_status SESSION_ID           -> pending|active|completed|failed

``spawn`` and ``resume`` return as soon as the session exists: the run goes on
in a detached worker process (logging to ``$SPAWNKIT_HOME/sessions/<id>/
adapter.log``), so ``check_status`` can be polled at once. The brief is the
run's system prompt; the state file is a JSON object the agent receives as
context and that the worker updates when the run ends (under ``"spawnkit"``:
the latest session and its result; under ``"sessions"``: every session id).

Exit codes (see docs/adapter-contract.md): 0 done, 1 failure of the session
being waited on, 2 usage error (bad arguments, unreadable brief, state file
that is not a JSON object), 3 runtime unavailable, 4 unknown session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import RuntimeNotFoundError, SpawnkitError
from .result import SpawnerResult
from .roster import ButlerConfig, adhoc_butler, load_roster
from .runlog import session_log_dir
from .runtimes import get_adapter
from .store import SessionStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_UNKNOWN = 0, 1, 2, 3, 4
START_TIMEOUT_S = 30.0

STATUS = {
    "queued": "pending",
    "running": "active",
    "success": "completed",
    "failed": "failed",
    "cancelled": "failed",
    "crashed": "failed",
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
    """The contract status; a finished run stays ``active`` until its state file is written."""
    record = (store or SessionStore()).get_session(session_id)
    if record is None:
        raise ContractError(f"unknown session {session_id!r}", EXIT_UNKNOWN)
    status = STATUS.get(record.status, "failed")
    if status in ("completed", "failed") and record.status != "crashed":
        meta = _read_meta(session_id)
        worker = meta.get("worker_pid")
        if meta and not meta.get("done") and isinstance(worker, int) and _alive(worker):
            return "active"
    return status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def contract_butler(
    runtime: str, brief: Path, roster: Path | None, butler_name: str | None
) -> ButlerConfig:
    if not brief.is_file():
        raise ContractError(f"the brief file {brief} does not exist")
    if butler_name:
        from .notebook.hub import with_runtime

        return with_runtime(load_roster(roster or "roster")[butler_name], runtime)
    return adhoc_butler(runtime, Path.cwd(), name=f"adapter-{runtime}", prompt_file=brief)


def start_worker(argv: list[str], session_id: str, store: SessionStore) -> str:
    """Start a detached worker for ``session_id`` and wait until its session exists."""
    log_dir = session_log_dir(session_id)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "adapter.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spawnkit", *argv],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, env=dict(os.environ),
        )  # fmt: skip
    save_meta(session_id, worker_pid=proc.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    while store.get_session(session_id) is None:
        code = proc.poll()
        if code is not None:
            tail = (log_dir / "adapter.log").read_text(errors="replace").strip().splitlines()
            reason = tail[-1] if tail else f"exit code {code}"
            exit_code = EXIT_UNAVAILABLE if code == EXIT_UNAVAILABLE else EXIT_USAGE
            raise ContractError(f"the session did not start: {reason}", exit_code)
        if time.monotonic() > deadline:
            raise ContractError("the session did not start within 30 s", EXIT_FAILED)
        time.sleep(0.05)
    return session_id


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


def preflight(butler: ButlerConfig) -> None:
    """Fail fast, before a worker is started, when the runtime's CLI is missing."""
    try:
        get_adapter(butler.runtime.type)(butler.runtime).find_binary()
    except RuntimeNotFoundError as exc:
        raise ContractError(str(exc), EXIT_UNAVAILABLE) from None
