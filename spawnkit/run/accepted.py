"""One accepted trigger on its way through the spawner, and what every part of it shares.

An :class:`AcceptedRun` is made when a trigger is accepted and carries what each
collaborator of the :class:`~spawnkit.run.Spawner` needs about the run: its request, its
runtime worker, its collector and budget, and the parts open while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..budgets.budget import RunBudget
from ..containment.relay import Relay
from ..containment.sources import Source
from ..redaction import Redactor
from ..runtimes.base import RuntimeAdapter
from ..telemetry.runlog import RunLog
from ..worktree import Checkout, RepoChange, RepoStart
from .approval import RunApprover
from .collector import Collector
from .request import RunKind

# How long a cancelled run may take to kill its CLI and record itself.
CANCEL_GRACE_S = 30.0


@dataclass(frozen=True)
class RunStart:
    """An attempt's start, to be recorded with its setup in one transaction
    (:meth:`~spawnkit.store.SessionStore.mark_started`) just before its CLI starts."""

    started_at: datetime
    trace_id: str | None
    workspace: Path


@dataclass
class AcceptedRun:
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
    collector: Collector
    budget: RunBudget
    timeout_s: float
    kind: RunKind = "run"
    sources: tuple[Source, ...] = ()
    workdir: Path | None = None  # this run's own working directory (see trigger)
    log: RunLog | None = None
    mcp_secret: str | None = None
    # The run's model relay, while it runs (see Assembly.open_run_relay): a door of its sandbox.
    relay: Relay | None = None
    # The inside port of the run's egress proxy (its butler's allow_hosts), while it runs.
    egress_port: int | None = None
    # A dispatched run: the owner of the queued record its client made, adopted here.
    queued_by: tuple[str, int] | None = None
    # Who the runtime asks about a tool of [butler.permissions] ask (spawnkit.run.approval);
    # None until the run is made (the spawner makes one for every run).
    approver: RunApprover | None = None
    # repo=: the repository, its worktree while the run goes on, the change it left
    # (spawnkit.run.checkout), and the setup recorded of the run (its sandbox, its given).
    repo: RepoStart | None = None
    checkout: Checkout | None = None
    repo_change: RepoChange | None = None
    setup: tuple[str, dict[str, Any]] | None = None
    # The attempt's start while it is not recorded yet (see Attempts._in_workspace).
    start: RunStart | None = None
    # Its attempts' workspaces, removed when its record is closed (Recorder.close), in the
    # same thread, or before it is started again.
    workspaces: list[Path] = field(default_factory=list)

    @property
    def redactor(self) -> Redactor:
        return self.collector.redactor
