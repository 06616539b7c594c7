"""spawnkit installed from its wheel, the way a pip user has it, offline and in seconds.

The wheel is built from this checkout (``pip wheel --no-deps``: hatchling comes from pip's
cache). It is installed with ``--no-deps --no-index`` into a new virtual environment of the
same Python, whose dependencies come from the dev venv: a ``.pth`` file names the dev
venv's site-packages. A ``.pth`` line that is a folder only appends that folder to
``sys.path``; the ``.pth`` files *inside* it are not processed, so the dev venv's editable
hook (which would import the checkout) stays inert, and the new venv's own site-packages,
which holds the installed wheel, comes first. ``import spawnkit`` is the wheel's copy,
with the package data the wheel ships (the example roster, the pinned package.json) and
nothing the checkout has beside it (its node_modules, its roster/).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

DEV_SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def wheel_venv(checkout: Path, root: Path) -> Path:
    """Build the wheel of ``checkout`` and install it into ``root/venv``; that venv."""
    dist, venv = root / "dist", root / "venv"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
          "-w", str(dist), str(checkout)])  # fmt: skip
    (wheel,) = dist.glob("spawnkit-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", "--disable-pip-version-check", str(wheel)])  # fmt: skip
    paths = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", paths], cwd=root))
    (site / "_spawnkit_test_dependencies.pth").write_text(f"{DEV_SITE_PACKAGES}\n")
    # From outside the checkout: `python -c` puts the current folder first on sys.path.
    where = _run([str(python), "-c", "import spawnkit; print(spawnkit.__file__)"], cwd=root)
    assert where.startswith(str(site)), f"spawnkit imported from {where}, not the wheel"
    return venv


def _run(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=cwd)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout.strip()
