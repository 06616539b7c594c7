"""Codex's own binary behind its npm launcher, which spawnkit runs directly.

``npm install @openai/codex`` puts a node program on PATH (``bin/codex.js``). All it does is
find the native binary of the platform package npm installed beside it
(``@openai/codex-linux-x64/vendor/<target>/bin/codex``), give it two environment variables
that say which package launched it, and run it as its child, passing signals on. Node's
start costs about 0.1 CPU-s and 0.05 to 0.15 s, a third of a short Codex run, and a process
that lives as long as the run. spawnkit finds the binary the way the launcher does (node's
package lookup from the launcher's folder up) and runs it with the same environment.

Where the binary is not there (another platform, a package manager that lays files out
otherwise, a ``codex`` that is not this launcher), the launcher is run as before. Zed's
``codex-acp`` is packaged the same way (``bin/codex-acp.js`` runs
``@zed-industries/codex-acp-<platform>-<arch>/bin/codex-acp`` and waits for it):
:func:`native_codex_acp` finds that one.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = ("bin", "codex.js")
# (system, machine) -> (the npm platform package, the target folder in its vendor/).
PLATFORM_PACKAGES = {
    ("Linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("Linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("Darwin", "x86_64"): ("codex-darwin-x64", "x86_64-apple-darwin"),
    ("Darwin", "arm64"): ("codex-darwin-arm64", "aarch64-apple-darwin"),
}
# (system, machine) -> node's process.platform-process.arch, as codex-acp's packages name it.
NODE_PLATFORMS = {
    ("Linux", "x86_64"): "linux-x64", ("Linux", "aarch64"): "linux-arm64",
    ("Darwin", "x86_64"): "darwin-x64", ("Darwin", "arm64"): "darwin-arm64",
}  # fmt: skip


@dataclass(frozen=True)
class NativeCodex:
    """The binary the launcher would run, and what the launcher adds to its environment."""

    binary: Path
    package_root: Path

    def env(self) -> dict[str, str]:
        # As the launcher sets them for an npm install: Codex's doctor and update notices
        # read them; nothing else does.
        return {"CODEX_MANAGED_PACKAGE_ROOT": str(self.package_root), "CODEX_MANAGED_BY_NPM": "1"}


@functools.lru_cache(maxsize=16)
def native_codex(cli: Path) -> NativeCodex | None:
    """The native Codex that ``cli``, when it is the npm launcher, would start; else None.

    Looked up once per path (the adapter's reset after a failed run clears it)."""
    launcher = cli.resolve()
    if (launcher.parent.name, launcher.name) != LAUNCHER:
        return None
    target = PLATFORM_PACKAGES.get((platform.system(), platform.machine()))
    if target is None:
        return None
    package, triple = target
    root = launcher.parent.parent
    inside = Path("vendor", triple, "bin", "codex")
    for candidate in [*_package_dirs(launcher.parent, "@openai", package), root]:
        binary = candidate / inside
        if binary.is_file():
            return NativeCodex(binary, root)
    return None


@functools.lru_cache(maxsize=16)
def native_codex_acp(cli: Path) -> Path | None:
    """The binary ``codex-acp``, when it is Zed's npm launcher, would run; else None."""
    launcher = cli.resolve()
    if (launcher.parent.name, launcher.name) != ("bin", "codex-acp.js"):
        return None
    target = NODE_PLATFORMS.get((platform.system(), platform.machine()))
    if target is None:
        return None
    for candidate in _package_dirs(launcher.parent, "@zed-industries", f"codex-acp-{target}"):
        binary = candidate / "bin" / "codex-acp"
        if binary.is_file():
            return binary
    return None


def _package_dirs(start: Path, scope: str, package: str) -> list[Path]:
    """Where node looks for ``<scope>/<package>`` from ``start``: each ``node_modules``
    folder from there up to the root."""
    folders = []
    for folder in (start, *start.parents):
        if folder.name == "node_modules":
            continue  # node does not look in node_modules/node_modules
        folders.append(folder / "node_modules" / scope / package)
    return folders
