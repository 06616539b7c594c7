"""JupyterLab and Voila in a real headless Chromium (Debian's), driven by Playwright.

Real Claude Code runs on the replay model, shown by the run view in JupyterLab:
the transcript's order, one rendering per run, Markdown as HTML, the header's
figures mid-run against the scenario's usage, the CLI's request and tool timings mid-run
(its telemetry on), failed-call counts, the dark
theme's colours, a saved notebook reopened without its kernel; a stop and a
model overload without a traceback; a long run's navigation; the dashboard's
states, labels and transcripts, also as a Voila app. Screenshots go to
``test-artifacts/``.
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
from typing import Any

import nbformat
import pytest

from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"

pytestmark = [
    pytest.mark.e2e,
    # A JupyterLab, a kernel, Chromium and the CLIs on a shared 2-core machine.
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
]  # fmt: skip

# Usage of the first model turn: the header must show exactly these while the second waits.
FIRST = {"input_tokens": 2400, "output_tokens": 61, "cache_read_input_tokens": 1800,
         "cache_creation_input_tokens": 600}  # fmt: skip
STORY = f"""
model = "claude-sonnet-4-5"
[[turn]]
text = "Reading the log first."
tool = "mcp__*__state_get"
input = {{ key = "measurements/weight" }}
usage = {{ {", ".join(f"{k} = {v}" for k, v in FIRST.items())} }}
[[turn]]
delay_ms = 6000
text = "The old log, too."
shell = "cat /nonexistent/weights.csv"
usage = {{ input_tokens = 2500, output_tokens = 40 }}
[[turn]]
shell = "echo 72.4"
usage = {{ input_tokens = 2600, output_tokens = 30 }}
[[turn]]
usage = {{ input_tokens = 2700, output_tokens = 120 }}
text = '''## Weight trend

| week | kg |
|---|---|
| 1 | 73.1 |
| 2 | **72.4** |

```
slope -0.35 kg/week
```'''
"""
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
STOPPED = """
[[turn]]
text = "Starting."
shell = "echo started"
[[turn]]
delay_ms = 120000
text = "too late"
"""
CHAT = """
[[turn]]
delay_ms = 4000
shell = "cat ./notes/todo.txt"
[[turn]]
text = "Your todo: {{ last_tool_result }}"
[[turn]]
text = "Nothing else was asked before: {{ prompt }}"
"""
VERY_SLOW = '[[turn]]\ndelay_ms = 120000\ntext = "too late"\n'
OVERLOAD = '[[turn]]\nerror = { status = 529, type = "overloaded_error", message = "Overloaded" }\n'


def long_scenario(calls: int = 20) -> str:
    """``calls`` shell turns with outputs of 40 to 135 lines; every seventh fails; then a
    long wait for the model, during which the view is navigated: an ended run's display
    is its static transcript, without the toolbar, and a cell waiting on a run reads no
    widget message ("Show all"), so the notebook runs it in the background."""
    turns = []
    for i in range(calls):
        lines = 40 + (i * 5) % 96  # 40 to 135
        fail = "; exit 3" if i % 7 == 5 else ""
        turns.append(f"[[turn]]\nshell = \"seq -f 'line %g of the report' 1 {lines}{fail}\"\n")
    turns.append('[[turn]]\ndelay_ms = 300000\ntext = "All steps ran."\n')
    return "\n".join(turns)


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


def write_notebook(path: Path, sources: list[str]) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the example roster with slow scenarios, and notebooks that use it."""
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    roster = tmp_path / "roster"
    shutil.copytree(REPO / "roster", roster)
    (roster / "health" / "scenarios" / "a_slow_demo.toml").write_text(SLOW_DEMO)
    (roster / "health" / "scenarios" / "b_very_slow.toml").write_text(VERY_SLOW)
    for name, text in {"story": STORY, "stopped": STOPPED, "overload": OVERLOAD,
                       "long": long_scenario(), "chat": CHAT}.items():  # fmt: skip
        (tmp_path / f"{name}.toml").write_text(text)
    # The story's butler has its CLI's telemetry on: the view shows its timing line.
    timed = tmp_path / "roster-timed"
    shutil.copytree(roster, timed)
    with (timed / "health" / "butler.toml").open("a") as config:
        config.write("\n[butler.telemetry]\ncli = true\n")
    spawn = f"%%spawn --butler health --roster {roster}"
    story = f"%%spawn --butler health --roster {timed}"
    notebooks = {
        "story.ipynb": ["%load_ext spawnkit", f"{story} --replay story.toml --out r\nweigh in",
                        "print('failed calls:', r.failed_tool_calls)"],
        "stop.ipynb": ["%load_ext spawnkit", f"{spawn} --replay stopped.toml\nwait for me"],
        "overload.ipynb": ["%load_ext spawnkit", f"{spawn} --replay overload.toml\nthis fails"],
        "long.ipynb": ["%load_ext spawnkit",
                       f"%%spawn --butler general --roster {roster} --replay long.toml "
                       "--max-turns 30 --background\nrun the report"],
        "dashboard.ipynb": [
            "from spawnkit.notebook.widgets import ButlerDashboard\n"
            f"ButlerDashboard({str(roster)!r})"
        ],
        "chat.ipynb": [
            "from spawnkit.containment.sources import SourceRegistry\n"
            f"_ = SourceRegistry().add('notes', {str(tmp_path / 'notes')!r})",
            "from spawnkit.notebook import chat\n"
            "conversation = chat('notes', replay='chat.toml')\nconversation",
        ],
    }  # fmt: skip
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("buy milk")
    for name, sources in notebooks.items():
        write_notebook(tmp_path / name, sources)
    return tmp_path


# Server extensions a test's JupyterLab does without unless it asks for them (Jupyter AI's
# chat, the language servers): they were a third of its start-up, 8.0 CPU-s against 5.3.
UNUSED_SERVER_EXTENSIONS = (
    "jupyter_lsp", "jupyter_ai_acp_client", "jupyter_ai_persona_manager", "jupyter_ai_router",
    "jupyterlab_chat",
)  # fmt: skip


def jupyter_env(base: Path, *, jupyter_ai: bool = False) -> dict[str, str]:
    base.mkdir(exist_ok=True)
    env = dict(os.environ)
    for key in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        path = base / key.lower()
        path.mkdir(exist_ok=True)
        env[key] = str(path)
    if not jupyter_ai:
        off = {"ServerApp": {"jpserver_extensions": dict.fromkeys(UNUSED_SERVER_EXTENSIONS, False)}}
        Path(env["JUPYTER_CONFIG_DIR"], "jupyter_server_config.json").write_text(json.dumps(off))
    # Data dirs of the environment (where the lab extensions live) stay visible.
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    settings = base / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    widgets = base / "lab-settings" / "@jupyter-widgets" / "jupyterlab-manager"
    widgets.mkdir(parents=True, exist_ok=True)
    (widgets / "plugin.jupyterlab-settings").write_text(json.dumps({"saveState": True}))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(base / "lab-settings")
    return env


@pytest.fixture
def browser() -> Iterator[Any]:
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


def start_lab(root: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    """JupyterLab serving ``root`` on ``port``, no token (the test's browser is its user)."""
    return start(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
         "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1",
         "--allow-root", f"--ServerApp.root_dir={root}"],
        root, env, port,
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def lab(workdir: Path, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    proc = start_lab(workdir, jupyter_env(tmp_path / "jupyter"), port)
    try:
        yield port
    finally:
        stop(proc)


def open_notebook(browser: Any, port: int, name: str, height: int = 1000) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": height})
    # ?reset: do not restore the previous page's tabs (Run All would run the wrong one).
    page.goto(f"http://127.0.0.1:{port}/lab/tree/{name}?reset")
    # The execution indicator can say idle before the kernel is up; the status bar cannot.
    # A kernel may take minutes to start on a loaded machine (tests run in parallel workers).
    page.get_by_text("| Idle").first.wait_for(timeout=240_000)
    return page


def run_all(page: Any) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()


def shut_down_kernels(page: Any) -> int:
    """Shut down every kernel of the server (its REST API, with the page's XSRF cookie)."""
    return int(
        page.evaluate(
            """async () => {
            const x = document.cookie.match(/_xsrf=([^;]+)/);
            const headers = x ? {"X-XSRFToken": decodeURIComponent(x[1])} : {};
            const kernels = await (await fetch("/api/kernels")).json();
            for (const k of kernels) {
              await fetch(`/api/kernels/${k.id}`, {method: "DELETE", headers});
            }
            return kernels.length; }"""
        )
    )


def command(page: Any, name: str) -> None:
    """Run a JupyterLab command through the command palette."""
    page.keyboard.press("Control+Shift+C")
    page.keyboard.type(name)
    page.locator(".lm-CommandPalette-item", has_text=name).first.click()


def wait_state(page: Any, state: str, scope: str = ".spawnkit-run", timeout: int = 120_000) -> None:
    page.wait_for_function(
        f"() => [...document.querySelectorAll('{scope} .sk-head')]"
        f".some(e => e.dataset.state === '{state}')",
        timeout=timeout,
    )


def cell_output(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")


def item_kinds(page: Any, scope: str = ".jp-OutputArea .spawnkit-run") -> list[str]:
    return list(
        page.eval_on_selector_all(
            f"{scope} .sk-transcript .sk-item",
            "items => items.map(i => i.classList.contains('sk-tool') ? 'tool' : 'text')",
        )
    )


def colour_of(page: Any, selector: str) -> str:
    return str(page.eval_on_selector(selector, "e => getComputedStyle(e).color"))


def theme_colour(page: Any, variable: str) -> str:
    """What a CSS variable of the current theme resolves to, as a computed colour."""
    return str(
        page.evaluate(
            """v => { const e = document.createElement('span'); e.style.color = `var(${v})`;
            document.body.append(e); const c = getComputedStyle(e).color; e.remove();
            return c; }""",
            variable,
        )
    )


def test_run_view_tells_the_run_in_order_and_survives_saving(
    lab: int, browser: Any, workdir: Path
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, lab, "story.ipynb")
    run_all(page)
    view = page.locator(".jp-OutputArea .spawnkit-run").first
    page.locator(".spawnkit-run .sk-tool[data-status='ok']").first.wait_for(timeout=120_000)
    # The second model turn waits 6 s: the header now shows the first turn's usage exactly.
    figures = view.locator(".sk-figures")
    cache_read, cache_write = FIRST["cache_read_input_tokens"], FIRST["cache_creation_input_tokens"]
    expected = (
        f"{FIRST['input_tokens']:,} in / {FIRST['output_tokens']:,} out tokens · cache "
        f"{cache_read:,} read / {cache_write:,} write"
    )
    page.wait_for_function(
        "t => document.querySelector('.spawnkit-run .sk-figures').textContent.includes(t)",
        arg=expected, timeout=30_000,
    )  # fmt: skip
    head = view.locator(".sk-head")
    assert head.get_attribute("data-state") == "running"
    assert "turn 1/12" in figures.inner_text() and "≈$" in figures.inner_text(), "running cost"
    assert "claude-sonnet-4-5" in head.locator(".sk-who").inner_text(), "the model's name"
    assert view.locator(".sk-waiting").inner_text() == "waiting on the model"
    # The CLI's telemetry of the first request and tool call, shown while the second waits.
    page.wait_for_function(
        "() => document.querySelector('.spawnkit-run .sk-timing').textContent"
        ".startsWith('model 1 request · p50 ')", timeout=30_000,
    )  # fmt: skip
    assert "tools mcp_tool " in view.locator(".sk-timing").inner_text()
    assert head.get_attribute("data-state") == "running"
    page.screenshot(path=str(ARTIFACTS / "lab-run-streaming.png"))

    wait_state(page, "success")
    assert item_kinds(page) == ["text", "tool", "text", "tool", "tool", "text"]
    tools = view.locator(".sk-tool")
    assert tools.nth(1).get_attribute("data-status") == "error"
    assert tools.nth(1).locator(".sk-summary").inner_text() == "$ cat /nonexistent/weights.csv"
    assert "No such file" in tools.nth(1).locator(".sk-result").inner_text()
    assert "(1 failed)" in figures.inner_text() and view.get_attribute("data-failed-tools") == "1"
    timing = view.locator(".sk-timing").inner_text()
    assert timing.startswith("model 4 requests · p50 ") and "Bash" in timing, timing
    answer = view.locator(".sk-text").last
    assert answer.locator("h2").inner_text() == "Weight trend"
    assert answer.locator("table td strong").inner_text() == "72.4"
    assert "slope -0.35" in answer.locator("pre code").inner_text()
    # One rendering: the view, no Out[n] repeating the run under it.
    output = cell_output(page, 1)
    assert output.locator(".spawnkit-run").count() == 1
    assert output.locator(".jp-OutputArea-executeResult").count() == 0
    assert output.inner_text().count("Weight trend") == 1
    cell_output(page, 2).get_by_text("failed calls: 1").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "lab-run-done.png"))

    ok_mark = ".spawnkit-run .sk-tool[data-status='ok'] .sk-mark"
    error_mark = ".spawnkit-run .sk-tool[data-status='error'] .sk-mark"
    command(page, "Use Theme: JupyterLab Dark")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
    page.wait_for_timeout(500)
    assert colour_of(page, ok_mark) == theme_colour(page, "--jp-success-color1")
    assert colour_of(page, error_mark) == theme_colour(page, "--jp-error-color1")
    assert colour_of(page, ok_mark) != colour_of(page, error_mark)
    page.screenshot(path=str(ARTIFACTS / "lab-run-dark.png"))
    command(page, "Use Theme: JupyterLab Light")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'")

    page.keyboard.press("Control+s")
    page.get_by_text("| Idle").first.wait_for()
    page.wait_for_timeout(1000)
    assert shut_down_kernels(page) == 1, "the reopened notebook gets a new kernel"
    page.close()
    saved = nbformat.read(workdir / "story.ipynb", as_version=4)
    outputs = saved.cells[1].outputs
    assert len(outputs) == 1, "one output per run in the saved notebook"
    assert "Weight trend" in outputs[0].data["text/html"]

    # Reopened with a new kernel: the run as it ended, from the widget state JupyterLab
    # saved (a trusted notebook renders the widget, so it needs its state; viewers
    # without widgets use the static snapshot saved next to it, checked below).
    page = open_notebook(browser, lab, "story.ipynb")
    shown = page.locator(".jp-OutputArea .spawnkit-run").first
    shown.locator(".sk-head[data-state='success']").wait_for(timeout=60_000)
    assert shown.locator(".sk-item").count() == 6
    assert shown.locator(".sk-text h2").inner_text() == "Weight trend"
    assert "in progress" not in page.locator(".jp-Notebook").inner_text()
    page.screenshot(path=str(ARTIFACTS / "lab-reopened.png"))
    # The static snapshot alone (what a site rendering the notebook shows).
    page.set_content(outputs[0].data["text/html"])
    static = page.locator(".spawnkit-run.sk-static")
    assert static.locator(".sk-head").get_attribute("data-state") == "success"
    assert item_kinds(page, ".spawnkit-run") == ["text", "tool", "text", "tool", "tool", "text"]
    assert static.locator(".sk-text h2").inner_text() == "Weight trend"
    assert static.locator(".sk-tool[data-status='error']").count() == 1
    assert static.locator(".sk-timing").inner_text() == timing
    page.close()


def test_a_stop_and_an_overload_end_quietly(lab: int, browser: Any) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, lab, "stop.ipynb")
    run_all(page)
    page.locator(".spawnkit-run .sk-tool[data-status='ok']").first.wait_for(timeout=120_000)
    page.locator("[data-command='notebook:interrupt-kernel']").first.click()
    wait_state(page, "cancelled", timeout=60_000)
    output = cell_output(page, 1)
    output.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    ).wait_for(timeout=30_000)
    text = output.inner_text()
    assert text.count("RunCancelled: the run was stopped and recorded as cancelled") == 1, text
    for leak in ("Traceback", "KeyboardInterrupt", "exit code 143", "Fatal error", 'File "'):
        assert leak not in text, f"{leak!r} leaked into the cell:\n{text}"
    page.screenshot(path=str(ARTIFACTS / "lab-stopped.png"))
    page.close()

    page = open_notebook(browser, lab, "overload.ipynb")
    run_all(page)
    wait_state(page, "failed")
    output = cell_output(page, 1)
    output.get_by_text("RunFailed").wait_for(timeout=30_000)
    text = output.inner_text()
    assert text.count("API Error: 529") == 1, f"the error is said once:\n{text}"
    assert "overloaded: this is temporary, retry in a minute" in text
    for leak in ("Traceback", "base_url", "127.0.0.1", 'File "'):
        assert leak not in text, f"{leak!r} in the cell:\n{text}"
    page.screenshot(path=str(ARTIFACTS / "lab-overloaded.png"))
    page.close()
    records = SessionStore().list_sessions()
    assert sorted(r.status for r in records) == ["cancelled", "failed"]
    for record in records:
        assert processes_with_env("SPAWNKIT_SESSION_ID", record.id) == [], "no CLI left behind"


def test_a_long_run_is_navigable(lab: int, browser: Any) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, lab, "long.ipynb")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    run_all(page)
    transcript = page.locator(".jp-OutputArea .spawnkit-run .sk-transcript").first
    page.locator(".spawnkit-run .sk-tool").nth(12).wait_for(timeout=240_000)
    geometry = "e => [e.scrollHeight, e.clientHeight, e.scrollTop]"
    height, visible, top = transcript.evaluate(geometry)
    assert visible < height, "bounded height, scrolling inside"
    assert top + visible >= height - 40, "following the newest row"
    view = page.locator(".jp-OutputArea .spawnkit-run").first
    page.wait_for_function(
        "() => document.querySelectorAll('.spawnkit-run .sk-tool[data-status]:not("
        "[data-status=running])').length === 20", timeout=300_000,
    )  # fmt: skip
    view.locator(".sk-waiting", has_text="waiting on the model").wait_for(timeout=60_000)
    rows = view.locator(".sk-tool")
    assert rows.count() == 20
    assert "20 tool calls (3 failed)" in view.locator(".sk-figures").inner_text()
    rights = view.locator(".sk-tool .sk-dur").evaluate_all(
        "ds => ds.map(d => [Math.round(d.getBoundingClientRect().right), d.scrollWidth <= "
        "d.clientWidth, d.textContent])",
    )
    assert len({right for right, _, _ in rights}) == 1, f"one right-aligned column: {rights}"
    assert all(fits and text.endswith(("ms", "s")) for _, fits, text in rights), rights
    view.locator(".sk-expand").click()
    assert view.locator(".sk-tool[open]").count() == 20
    view.locator(".sk-collapse").click()
    assert view.locator(".sk-tool[open]").count() == 0
    view.locator(".sk-filter input").check()
    shown = view.locator(".sk-item").evaluate_all(
        "items => items.filter(i => i.offsetParent !== null).map(i => i.dataset.status)"
    )
    assert shown == ["error", "error", "error"], "failures only"
    view.locator(".sk-filter input").uncheck()
    # The longest output (135 lines) is cut; "Show all" fetches the rest from the kernel.
    longest = rows.filter(has_text="1 135")
    longest.locator("summary").click()
    output = longest.locator(".sk-output")
    assert "line 135 of the report" not in output.inner_text()
    longest.locator(".sk-show-all").click()
    page.wait_for_function(
        "e => e.textContent.includes('line 135 of the report')", arg=output.element_handle()
    )
    longest.locator(".sk-copy").click()
    longest.locator(".sk-copy", has_text="Copied").wait_for(timeout=30_000)
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied.rstrip().endswith("line 135 of the report") and copied.count("\n") >= 134
    transcript.evaluate("e => { e.scrollTop = 0; }")
    page.wait_for_function(
        "() => document.querySelector('.spawnkit-run .sk-follow').textContent === 'Follow'"
    )
    page.screenshot(path=str(ARTIFACTS / "lab-long-run.png"))
    view.locator(".sk-stop").click()
    wait_state(page, "cancelled", timeout=60_000)
    page.close()


def test_the_dashboard_shows_states_labels_and_transcripts(lab: int, browser: Any) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, lab, "dashboard.ipynb", height=2400)
    run_all(page)
    trigger = page.get_by_role("button", name="Trigger")
    trigger.wait_for(timeout=90_000)
    page.locator(".widget-dropdown select").first.select_option("health")
    page.locator("textarea").first.fill("I weighed 72.4 kg")
    trigger.click()
    wait_state(page, "success", ".sk-run-row")
    # The run shows its result before it gives its slot back (cleanup, the record).
    page.wait_for_function(
        "() => document.querySelectorAll('.sk-in-flight .sk-run-row').length === 0",
        timeout=60_000,
    )
    page.locator(".widget-dropdown select").nth(1).select_option(label="replay: b_very_slow")
    page.locator("textarea").first.fill("first slow one")
    trigger.click()
    # The next prompt typed at once, as a quick user does, and sent with Ctrl+Enter: each
    # submit carries the text the field showed (a click overtook ipywidgets' throttled syncs
    # of a plain Textarea's value, and both runs were labelled with the second prompt).
    page.locator("textarea").first.fill("second slow one")
    page.locator("textarea").first.press("Control+Enter")
    labels = page.locator(".sk-in-flight .sk-run-label")
    # Both labels are redrawn as the runs move on: wait for the view showing both states.
    try:
        page.wait_for_function(
            "() => { const t = [...document.querySelectorAll('.sk-in-flight .sk-run-label')]"
            ".map(e => e.textContent);"
            " return t.some(x => x.includes('queued') && x.includes('position 1')"
            " && x.includes('second slow one'))"
            " && t.some(x => x.includes('running') && x.includes('first slow one')); }",
            timeout=60_000,
        )
    except PlaywrightTimeout as exc:  # say what the dashboard showed instead (it has flaked)
        shown = labels.all_inner_texts()
        finished = page.locator(".sk-finished .sk-run-label").all_inner_texts()
        raise AssertionError(f"in flight: {shown}; finished: {finished}") from exc
    texts = labels.all_inner_texts()
    running = next(t for t in texts if "running" in t)
    queued = next(t for t in texts if "queued" in t)
    assert running.startswith("● running") and "“first slow one”" in running
    assert queued.startswith("◷ queued") and "“second slow one”" in queued
    assert all(any(c.isalnum() for c in t.split(" · ")[-1]) for t in texts), "session ids shown"
    assert page.locator(".sk-finished .sk-run-label").first.inner_text().startswith("✓ success")
    page.screenshot(path=str(ARTIFACTS / "lab-dashboard-queue.png"))
    # Cancelling the running one moves the queued one up: its label follows.
    page.locator(".sk-in-flight .sk-run-row").first.get_by_role("button", name="Cancel").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.sk-in-flight .sk-run-label')]"
        ".some(e => e.textContent.startsWith('● running') && e.textContent.includes('second'))",
        timeout=60_000,
    )
    page.locator(".sk-in-flight .sk-run-row").first.get_by_role("button", name="Cancel").click()
    page.wait_for_function(
        "() => document.querySelectorAll('.sk-in-flight .sk-run-row').length === 0",
        timeout=60_000,
    )
    # The browser draws each list's children when their views are built: wait for the third.
    page.wait_for_function(
        "() => document.querySelectorAll('.sk-finished .sk-run-label').length === 3",
        timeout=30_000,
    )
    finished = page.locator(".sk-finished .sk-run-label").all_inner_texts()
    assert [t.split(" ")[0] for t in finished] == ["■", "■", "✓"], finished
    page.wait_for_function(
        "() => document.querySelectorAll('.sk-sessions tbody tr').length === 3"
        " && ![...document.querySelectorAll('.sk-sessions tbody tr')]"
        ".some(r => ['running', 'queued'].includes(r.dataset.status))",
        timeout=30_000,
    )
    marks = page.eval_on_selector_all(
        ".sk-sessions tbody tr",
        "rows => rows.map(r => [r.dataset.status, r.querySelector('.sk-mark').textContent])",
    )
    assert sorted(marks) == [["cancelled", "■"], ["cancelled", "■"], ["success", "✓"]]
    card = page.locator(".sk-card").filter(has_text="health").first
    assert [m for m in card.locator(".sk-mark").all_inner_texts()] == ["■", "■", "✓"]
    page.locator(".sk-sessions tbody tr[data-status='success']").click()
    panel = page.locator(".sk-transcript-panel")
    panel.locator(".sk-tool").first.wait_for(timeout=30_000)
    assert panel.locator(".sk-tool").count() == 2 and "I weighed 72.4 kg" in panel.inner_text()
    assert "Trend: readings: 3" in panel.inner_text()
    page.screenshot(path=str(ARTIFACTS / "lab-dashboard-transcript.png"))
    page.close()
    statuses = sorted(r.status for r in SessionStore().list_sessions())
    assert statuses == ["cancelled", "cancelled", "success"]


def test_the_chat_entry_sends_on_enter_and_keeps_a_message_it_could_not_send(
    lab: int, browser: Any
) -> None:
    page = open_notebook(browser, lab, "chat.ipynb")
    run_all(page)
    entry = page.locator(".spawnkit-prompt-box input")
    entry.wait_for(timeout=90_000)
    entry.fill("what is on my todo?")
    entry.press("Enter")
    # Taken by the kernel: the entry empties, and Send waits while the turn runs.
    page.wait_for_function(
        "() => document.querySelector('.spawnkit-prompt-box input').value === ''"
        " && document.querySelector('.spawnkit-prompt-box button').disabled",
        timeout=60_000,
    )
    entry.fill("and the meeting?")
    entry.press("Enter")  # refused while the first turn runs: the text stays
    page.get_by_text("Your todo: buy milk").first.wait_for(timeout=120_000)
    assert entry.input_value() == "and the meeting?"
    page.wait_for_function(
        "() => !document.querySelector('.spawnkit-prompt-box button').disabled",
        timeout=60_000,
    )
    page.get_by_role("button", name="Send").click()
    page.get_by_text("Nothing else was asked before").first.wait_for(timeout=120_000)
    assert entry.input_value() == ""
    assert page.get_by_text("you: and the meeting?").count() == 1
    page.close()


def test_dashboard_as_a_voila_app(workdir: Path, browser: Any, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    voila = start(
        [sys.executable, "-m", "voila", "dashboard.ipynb", f"--port={port}", "--no-browser",
         "--Voila.ip=127.0.0.1"],
        workdir, jupyter_env(tmp_path / "jupyter"), port,
    )  # fmt: skip
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/")
        trigger = page.get_by_role("button", name="Trigger")
        trigger.wait_for(timeout=90_000)
        page.locator(".widget-dropdown select").first.select_option("health")
        page.locator("textarea").first.fill("I weighed 72.4 kg")
        trigger.click()
        wait_state(page, "success")
        assert page.locator(".spawnkit-run .sk-tool").count() >= 2
        page.screenshot(path=str(ARTIFACTS / "voila-dashboard.png"))
        page.close()
    finally:
        stop(voila)
    records = SessionStore().list_sessions()
    assert [r.status for r in records] == ["success"]
    assert json.dumps(records[0].to_dict())
