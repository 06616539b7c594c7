"""JupyterLab and Voila in a real headless Chromium (Debian's), driven by Playwright.

A notebook spawns a replayed run and the tool-call rows appear while it runs;
the butler dashboard triggers a run and cancels another; the same dashboard
works as a Voila app. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from spawnkit.store import SessionStore

from .conftest import REPO

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
]  # fmt: skip

SLOW_DEMO = """
[[turn]]
delay_ms = 1500
text = "Reading the log."
tool = "mcp__*__state_get"
input = { key = "measurements/weight" }
[[turn]]
delay_ms = 1500
tool = "Bash"
input = { command = "python3 skills/weight_trend/trend.py --unit kg 73.1 72.8 72.4" }
[[turn]]
delay_ms = 1500
text = "Trend: {{ last_tool_result }}"
"""
VERY_SLOW = '[[turn]]\ndelay_ms = 120000\ntext = "too late"\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited during start-up"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the example roster with slow scenarios, and notebooks that use it."""
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    roster = tmp_path / "roster"
    shutil.copytree(REPO / "roster", roster)
    (roster / "health" / "scenarios" / "a_slow_demo.toml").write_text(SLOW_DEMO)
    (roster / "health" / "scenarios" / "b_very_slow.toml").write_text(VERY_SLOW)
    cells = {
        "run.ipynb": [
            "%load_ext spawnkit",
            f"%%spawn --butler health --roster {roster} "
            f"--replay {roster}/health/scenarios/a_slow_demo.toml\nI weighed 72.4 kg",
        ],
        "dashboard.ipynb": [
            f"from spawnkit.widgets import ButlerDashboard\nButlerDashboard({str(roster)!r})"
        ],
    }
    for name, sources in cells.items():
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nbformat.write(nb, tmp_path / name)
    return tmp_path


def jupyter_env(base: Path) -> dict[str, str]:
    base.mkdir(exist_ok=True)
    env = dict(os.environ)
    for key in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        path = base / key.lower()
        path.mkdir(exist_ok=True)
        env[key] = str(path)
    # Data dirs of the environment (where the lab extensions live) stay visible.
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    return env


@pytest.fixture
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


def start(command: list[str], cwd: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def open_notebook(browser: object, port: int, name: str):  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    # ?reset: do not restore the previous page's tabs (Run All would run the wrong one).
    page.goto(f"http://127.0.0.1:{port}/lab/tree/{name}?reset")
    # The execution indicator can say idle before the kernel is up; the status bar cannot.
    page.get_by_text("| Idle").first.wait_for(timeout=90_000)
    return page


def run_all(page) -> None:  # type: ignore[no-untyped-def]
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()


def test_jupyterlab_streams_rows_and_the_dashboard_triggers_and_cancels(
    workdir: Path, browser: object, tmp_path: Path
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    lab = start(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
         "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1",
         "--allow-root", f"--ServerApp.root_dir={workdir}"],
        workdir, jupyter_env(tmp_path / "jupyter"), port,
    )  # fmt: skip
    try:
        page = open_notebook(browser, port, "run.ipynb")
        run_all(page)
        rows = page.locator(".spawnkit-run .sk-row")
        rows.first.wait_for(timeout=90_000)
        status = page.locator(".spawnkit-run .sk-status").first
        assert "running" in status.inner_text(), "the first row shows while the run goes on"
        page.screenshot(path=str(ARTIFACTS / "lab-run-streaming.png"))
        page.wait_for_function(
            "() => document.querySelector('.spawnkit-run .sk-status')?.dataset.state === 'success'",
            timeout=90_000,
        )
        assert rows.count() == 2
        assert "Trend: readings: 3" in page.locator(".spawnkit-run .sk-text").first.inner_text()
        page.screenshot(path=str(ARTIFACTS / "lab-run-done.png"))
        assert "Loading widget" not in page.content()
        page.close()

        page = open_notebook(browser, port, "dashboard.ipynb")
        run_all(page)
        trigger = page.get_by_role("button", name="Trigger")
        trigger.wait_for(timeout=90_000)
        page.locator(".widget-dropdown select").first.select_option("health")
        page.locator("textarea").first.fill("I weighed 72.4 kg")
        trigger.click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.spawnkit-run .sk-status')]"
            ".some(e => e.dataset.state === 'success')",
            timeout=90_000,
        )
        page.screenshot(path=str(ARTIFACTS / "lab-dashboard-run.png"))
        page.locator(".widget-dropdown select").nth(1).select_option(label="replay: b_very_slow")
        trigger.click()
        cancel = page.get_by_role("button", name="Cancel").last
        page.wait_for_function(
            "() => [...document.querySelectorAll('.spawnkit-run .sk-status')]"
            ".some(e => e.dataset.state === 'running')",
            timeout=90_000,
        )
        cancel.click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.spawnkit-run .sk-status')]"
            ".some(e => e.dataset.state === 'cancelled')",
            timeout=60_000,
        )
        page.wait_for_function(
            "() => document.querySelector('.sk-sessions')?.innerText.includes('cancelled')",
            timeout=30_000,
        )
        page.screenshot(path=str(ARTIFACTS / "lab-dashboard-cancelled.png"))
        page.close()
    finally:
        stop(lab)
    statuses = sorted(r.status for r in SessionStore().list_sessions())
    assert statuses == ["cancelled", "success", "success"]


def test_dashboard_as_a_voila_app(workdir: Path, browser: object, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    voila = start(
        [sys.executable, "-m", "voila", "dashboard.ipynb", f"--port={port}", "--no-browser",
         "--Voila.ip=127.0.0.1"],
        workdir, jupyter_env(tmp_path / "jupyter"), port,
    )  # fmt: skip
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
        page.goto(f"http://127.0.0.1:{port}/")
        trigger = page.get_by_role("button", name="Trigger")
        trigger.wait_for(timeout=90_000)
        page.locator(".widget-dropdown select").first.select_option("health")
        page.locator("textarea").first.fill("I weighed 72.4 kg")
        trigger.click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.spawnkit-run .sk-status')]"
            ".some(e => e.dataset.state === 'success')",
            timeout=90_000,
        )
        assert page.locator(".spawnkit-run .sk-row").count() >= 2
        page.screenshot(path=str(ARTIFACTS / "voila-dashboard.png"))
        page.close()
    finally:
        stop(voila)
    records = SessionStore().list_sessions()
    assert [r.status for r in records] == ["success"]
    assert json.dumps(records[0].to_dict())
