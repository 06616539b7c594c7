"""`%load_ext spawnkit` registers the magics and imports nothing a run needs: the views,
ipywidgets, the MCP server stack, OpenTelemetry, the agent SDK and pandas load when a
magic first runs. Checked on the modules loaded, not on a clock (benchmarks/load_ext.py
times it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = (
    "mcp", "pydantic", "claude_agent_sdk", "opentelemetry.sdk", "pandas", "httpx", "uvicorn",
    "starlette", "cryptography", "ipywidgets", "anywidget", "spawnkit.serve.service",
    "spawnkit.notebook.hub", "spawnkit.notebook.view", "spawnkit.run",
)  # fmt: skip

PROBE = f"""
import json, sys
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "spawnkit")
magics = ip.magics_manager.magics
loaded = [m for m in {HEAVY!r} if m in sys.modules]
cells, lines = sorted(magics["cell"]), sorted(magics["line"])
ip.run_line_magic("unload_ext", "spawnkit")
print(json.dumps({{"loaded": loaded, "cell": cells, "line": lines,
                   "after_unload": "spawn" in ip.magics_manager.magics["cell"]}}))
"""


def test_load_ext_registers_the_magics_and_loads_no_run_machinery(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
        check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                          "SPAWNKIT_HOME": str(tmp_path / "spawnkit")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] == [], "imported by %load_ext alone"
    assert {"spawn", "ask", "spawn_map"} <= set(report["cell"])
    assert {"spawn_sessions", "spawn_dashboard", "spawn_cancel"} <= set(report["line"])
    assert report["after_unload"] is False
    assert (tmp_path / "spawnkit" / "sessions.db").exists(), "the start-up sweep opened the store"


def test_a_magic_loads_what_it_needs_when_first_used(tmp_path: Path) -> None:
    probe = (
        "from IPython.testing.globalipapp import start_ipython\n"
        "import sys\nip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'spawnkit')\n"
        "print(type(ip.run_line_magic('spawn_sessions', '')).__name__, "
        "'pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
        check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                          "SPAWNKIT_HOME": str(tmp_path / "spawnkit")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["DataFrame", "True"]
