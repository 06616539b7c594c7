"""A session's record as Python values, and the time stamps the store keeps as text.

:class:`SessionRecord` is one row of the ``sessions`` table, read back the same from
either engine: times are ISO text in the row and aware datetimes here, JSON columns are
decoded into the types of :mod:`spawnkit.result`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..result import Attempt, BudgetReport, PermissionAnswer, ToolCall, Usage
from .backend import Row


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def from_iso(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def stamp(value: datetime) -> str:
    """A UTC time as ISO text of fixed width, so leases compare as text on both engines."""
    return value.astimezone(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class SessionRecord:
    """One row of the ``sessions`` table."""

    id: str
    butler: str
    runtime: str
    model: str | None
    prompt: str
    context: str | None
    trigger_source: str
    status: str
    success: bool | None
    error: str | None
    error_kind: str | None
    output: str | None
    tool_calls: list[ToolCall]
    duration_ms: int | None
    usage: Usage
    cost_usd: float | None
    num_turns: int | None
    trace_id: str | None
    runtime_session_id: str | None
    parent_session_id: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    log_dir: Path | None = None
    role: str | None = None
    # Which sandbox the run had ("bwrap" or "none") and what its CLI was given.
    sandbox: str | None = None
    given: dict[str, Any] | None = None
    # The run's workspace while it ran (removed when it ended, or by the sweep).
    workspace: Path | None = None
    # "run" (a butler's trigger) or "ask" (a question about sources), and those sources.
    kind: str = "run"
    sources: tuple[str, ...] = ()
    # How the run stood against its limits, when it had any that needed its usage.
    budget: BudgetReport | None = None
    # Each start of the run's CLI; several when a rate-limited run was started again.
    attempts: tuple[Attempt, ...] = ()
    # The host the run belongs to, and until when it holds the record unless it renews it.
    owner_host: str | None = None
    lease_until: datetime | None = None
    # The process that owns it on that host (a dispatching client's, until a worker adopts it).
    owner_pid: int | None = None
    # Connections its network sandbox refused (spawnkit.containment.egress); 0 in records from
    # before.
    network_denied: int = 0
    # Each answer to a [butler.permissions] ask question (spawnkit.run.approval), in order.
    permissions: tuple[PermissionAnswer, ...] = ()

    @classmethod
    def from_row(cls, row: Row) -> SessionRecord:
        calls = [ToolCall.from_dict(c) for c in json.loads(row["tool_calls"] or "[]")]
        return cls(
            id=row["id"],
            butler=row["butler"],
            runtime=row["runtime"],
            model=row["model"],
            prompt=row["prompt"],
            context=row["context"],
            trigger_source=row["trigger_source"],
            status=row["status"],
            success=None if row["success"] is None else bool(row["success"]),
            error=row["error"],
            error_kind=row["error_kind"],
            output=row["output"],
            tool_calls=calls,
            duration_ms=row["duration_ms"],
            usage=Usage(
                row["input_tokens"] or 0,
                row["output_tokens"] or 0,
                row["cache_read_tokens"] or 0,
                row["cache_write_tokens"] or 0,
            ),
            cost_usd=row["cost_usd"],
            num_turns=row["num_turns"],
            trace_id=row["trace_id"],
            runtime_session_id=row["runtime_session_id"],
            parent_session_id=row["parent_session_id"],
            created_at=datetime.fromisoformat(row["created_at"]),
            started_at=from_iso(row["started_at"]),
            completed_at=from_iso(row["completed_at"]),
            log_dir=Path(row["log_dir"]) if row["log_dir"] else None,
            role=row["role"],
            sandbox=row["sandbox"],
            given=json.loads(row["given"]) if row["given"] else None,
            workspace=Path(row["workspace"]) if row["workspace"] else None,
            kind=row["kind"] or "run",
            sources=tuple(json.loads(row["sources"])) if row["sources"] else (),
            budget=BudgetReport.from_dict(json.loads(row["budget"])) if row["budget"] else None,
            attempts=tuple(Attempt.from_dict(a) for a in json.loads(row["attempts"] or "[]")),
            owner_host=row["owner_host"],
            lease_until=from_iso(row["lease_until"]),
            owner_pid=row["owner_pid"],
            network_denied=row["network_denied"] or 0,
            permissions=tuple(
                PermissionAnswer.from_dict(a) for a in json.loads(row["permissions"] or "[]")
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "butler": self.butler,
            "runtime": self.runtime,
            "model": self.model,
            "prompt": self.prompt,
            "context": self.context,
            "trigger_source": self.trigger_source,
            "status": self.status,
            "success": self.success,
            "error": self.error,
            "error_kind": self.error_kind,
            "output": self.output,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "duration_ms": self.duration_ms,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cache_read_tokens": self.usage.cache_read_tokens,
            "cache_write_tokens": self.usage.cache_write_tokens,
            "cost_usd": self.cost_usd,
            "num_turns": self.num_turns,
            "trace_id": self.trace_id,
            "runtime_session_id": self.runtime_session_id,
            "parent_session_id": self.parent_session_id,
            "created_at": to_iso(self.created_at),
            "started_at": to_iso(self.started_at),
            "completed_at": to_iso(self.completed_at),
            "log_dir": str(self.log_dir) if self.log_dir else None,
            "role": self.role,
            "sandbox": self.sandbox,
            "given": self.given,
            "workspace": str(self.workspace) if self.workspace else None,
            "kind": self.kind,
            "sources": list(self.sources),
            "budget": asdict(self.budget) if self.budget else None,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
            "owner_host": self.owner_host,
            "lease_until": to_iso(self.lease_until),
            "network_denied": self.network_denied,
            "permissions": [answer.to_dict() for answer in self.permissions],
        }
