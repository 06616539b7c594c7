"""What the spawner's collaborators read of it: its butler, store, runtime and seams.

The :class:`~spawnkit.run.Spawner` is a :class:`RunSettings`: admission, assembly,
attempts and recording are given the spawner itself and read these attributes when they
need them, so a value set on the spawner after it was made (a server's ``mcp_port`` once
it listens, another ``base_url``, another ``mcp_access``) holds for the next run, as it did
when one class did everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from opentelemetry.trace import TracerProvider

from ..budgets.pacing import Pacer
from ..config.cli_telemetry import SignalChoice
from ..config.retry import RetryPolicy
from ..config.roster import ButlerConfig
from ..containment.credentials import CredentialStore
from ..containment.mcp_access import McpAccess
from ..runtimes.base import RuntimeAdapter
from ..store import SessionStore
from ..telemetry.otlp_export import OtlpTarget
from .memory import MemoryProvider


class RunSettings(Protocol):
    """The spawner's configuration and seams, as its collaborators see them."""

    butler: ButlerConfig
    store: SessionStore
    adapter: RuntimeAdapter
    credentials: CredentialStore
    memory: MemoryProvider | None
    mcp_access: McpAccess
    mcp_host: str
    mcp_port: int | None
    base_url: str | None
    model: str | None
    cli_telemetry: SignalChoice  # the signals its CLIs export (each run's drawn); false: off
    otlp_target: OtlpTarget | None
    tracer_provider: TracerProvider | None
    workspace_root: Path | None
    log_cap_bytes: int
    retry: RetryPolicy
    pacer: Pacer
    origin: dict[str, str] | None
