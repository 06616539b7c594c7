"""Old import paths of modules that moved into packages: they keep working for one release.

spawnkit 0.x kept every module at the top of the package; they now live in packages named
for their concept (``spawnkit.config``, ``spawnkit.containment``, ``spawnkit.run``, ...).
A program that still imports an old path (``from spawnkit.spawner import Spawner``,
``import spawnkit.roster``) gets the module at its new path, the very same module object
(so a monkeypatch through either name is seen through both), and one
:class:`DeprecationWarning` naming the new path. :data:`MOVED` is the whole list; the
finder answers for nothing else. It is installed when ``spawnkit`` is imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

# Old module path -> new module path. Remove an entry one release after its move.
MOVED: dict[str, str] = {
    # Budgets: spawnkit.budgets.
    "spawnkit.budget": "spawnkit.budgets.budget",
    "spawnkit.metering": "spawnkit.budgets.metering",
    "spawnkit.pacing": "spawnkit.budgets.pacing",
    # The command line.
    "spawnkit.contract": "spawnkit.cli.contract",
    # Many runs: spawnkit.cluster.
    "spawnkit.batch": "spawnkit.cluster.batch",
    "spawnkit.cluster_worker": "spawnkit.cluster.worker",
    "spawnkit.worktrees": "spawnkit.cluster.worktrees",
    # Configuration: spawnkit.config.
    "spawnkit.butler_config": "spawnkit.config.butler_config",
    "spawnkit.credential_file": "spawnkit.config.credential_file",
    "spawnkit.limits": "spawnkit.config.limits",
    "spawnkit.pricing": "spawnkit.config.pricing",
    "spawnkit.retry": "spawnkit.config.retry",
    "spawnkit.roster": "spawnkit.config.roster",
    "spawnkit.roster_location": "spawnkit.config.roster_location",
    "spawnkit.runtime_names": "spawnkit.config.runtime_names",
    "spawnkit.scaffold": "spawnkit.config.scaffold",
    "spawnkit.system_prompt": "spawnkit.config.system_prompt",
    # How a run is locked down: spawnkit.containment.
    "spawnkit.cluster_security": "spawnkit.containment.cluster_security",
    "spawnkit.credentials": "spawnkit.containment.credentials",
    "spawnkit.doors": "spawnkit.containment.doors",
    "spawnkit.egress": "spawnkit.containment.egress",
    "spawnkit.mcp_access": "spawnkit.containment.mcp_access",
    "spawnkit.mcp_guard": "spawnkit.containment.mcp_guard",
    "spawnkit.relay": "spawnkit.containment.relay",
    "spawnkit.sandbox": "spawnkit.containment.sandbox",
    "spawnkit.sandbox_forward": "spawnkit.containment.sandbox_forward",
    "spawnkit.sources": "spawnkit.containment.sources",
    "spawnkit.sweep": "spawnkit.containment.sweep",
    "spawnkit.workspace": "spawnkit.containment.workspace",
    # The notebook frontend.
    "spawnkit.widgets": "spawnkit.notebook.widgets",
    # The run lifecycle: spawnkit.run.
    "spawnkit.dispatch": "spawnkit.run.dispatch",
    "spawnkit.memory": "spawnkit.run.memory",
    # A butler's services: spawnkit.serve.
    "spawnkit.butler_server": "spawnkit.serve.butler_server",
    "spawnkit.queue_report": "spawnkit.serve.queue_report",
    "spawnkit.scheduler": "spawnkit.serve.scheduler",
    "spawnkit.service": "spawnkit.serve.service",
    # Telemetry: spawnkit.telemetry (itself a package now, exporting what the module did).
    "spawnkit.otlp": "spawnkit.telemetry.otlp",
    "spawnkit.runlog": "spawnkit.telemetry.runlog",
    "spawnkit.timings": "spawnkit.telemetry.timings",
    # The spawner became the package spawnkit.run (which exports all spawner.py did).
    "spawnkit.spawner": "spawnkit.run",
    "spawnkit.testing": "spawnkit.run.testing",
    # The session store became a package.
    "spawnkit.pg_local": "spawnkit.store.pg_local",
    "spawnkit.store_backend": "spawnkit.store.backend",
    "spawnkit.store_journal": "spawnkit.store.journal",
    "spawnkit.store_listen": "spawnkit.store.listen",
    "spawnkit.store_migrate": "spawnkit.store.migrate",
    "spawnkit.store_postgres": "spawnkit.store.postgres",
    "spawnkit.store_repair": "spawnkit.store.repair",
}


class _MovedLoader:
    """Loads an old path as the module at its new one (a plain class: importlib.abc is
    slow to import, and every ``spawnkit`` command pays for what ``spawnkit`` imports)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; import it from there (the old path goes in "
            "the next release)",
            DeprecationWarning,
            stacklevel=_caller_depth(),
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported at its new path."""


class _MovedFinder:
    """Answers for the old paths in :data:`MOVED`, and for nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", _MovedLoader(new)))


def _caller_depth() -> int:
    """The ``stacklevel`` of the importing code, as seen from :meth:`_MovedLoader.create_module`.

    ``warnings`` does not count importlib's bootstrap frames (filenames holding
    "importlib" and "_bootstrap"), so neither does this.
    """
    frame: FrameType | None = sys._getframe(2)  # the frame that called create_module
    depth = 1
    while frame is not None:
        name = frame.f_code.co_filename
        internal = "importlib" in name and "_bootstrap" in name
        if not internal and name != __file__:
            return depth + 1
        if not internal:
            depth += 1
        frame = frame.f_back
    return depth


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
