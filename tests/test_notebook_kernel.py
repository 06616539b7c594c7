"""The notebook frontends in real Jupyter kernels: outputs, widgets, await, interrupts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env, workspaces_of

pytestmark = pytest.mark.e2e

WIDGET = "application/vnd.jupyter.widget-view+json"
DEMO = REPO / "roster" / "health" / "scenarios" / "demo.toml"


def run_notebook(cells: list[str], cwd: Path = REPO, timeout: int = 120) -> list[Any]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(cwd)}},
        # The kernel's flush thread may send one print in several stream messages.
        coalesce_streams=True,
    )  # fmt: skip
    client.execute()
    return [cell.outputs for cell in nb.cells]


def text_of(outputs: list[Any]) -> str:
    parts = []
    for out in outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)


def errors_of(outputs: list[Any]) -> list[str]:
    return [out.ename for out in outputs if out.output_type == "error"]


def scenario(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_spawn_cells_in_a_kernel(tmp_path: Path) -> None:
    echo = scenario(tmp_path, "echo", '[[turn]]\ntext = "echo: {{ prompt }}"\n')
    failing = scenario(
        tmp_path,
        "fail",
        '[[turn]]\nerror = { status = 529, type = "overloaded_error", message = "Overloaded" }\n',
    )
    peek = scenario(
        tmp_path,
        "peek",
        '[[turn]]\ntool = "mcp__*__kernel_variable"\ninput = { name = "df" }\n'
        '[[turn]]\ntext = "I see: {{ last_tool_result }}"\n',
    )
    outputs = run_notebook(
        [
            "%load_ext spawnkit",
            f"%%spawn --butler health --replay {DEMO} --out r\nI weighed 72.4 kg this morning",
            "print(r.success, [c.tool for c in r.tool_calls])",
            f"%%spawn --butler general --replay {echo}\nliteral {{x}} and $y",
            'x, y = 41, "why"',
            f"%%spawn --butler general --replay {echo} --interpolate\nliteral {{x+1}} and $y",
            f"%%spawn --butler general --replay {failing}\nthis fails",
            f"%%spawn --butler general --replay {failing} --allow-failure --out failed\nthis fails",
            "print(failed.status, failed.error_kind)",
            f"%%spawn --butler general --replay {echo} --background --out h\nin the background",
            "r2 = await h\nprint(r2.output, h.status)",
            "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})",
            f"%%spawn --butler general --replay {peek} --kernel-tools\nlook at df",
            "%spawn_sessions -n 20",
            "from spawnkit import load_roster\nfrom spawnkit.serve.service import ButlerService\n"
            f"async with ButlerService(load_roster('roster')['general'], replay='{echo}') as s:\n"
            "    direct = await s.trigger('top-level await works')\nprint(direct.output)",
        ]
    )
    load, demo, demo_print, verbatim, _, interpolated, fail, allowed, allowed_print = outputs[:9]
    background, awaited, _, peeked, sessions, direct = outputs[9:]
    assert errors_of(load) == [] and text_of(load) == ""
    kinds = [out.output_type for out in demo]
    assert kinds == ["display_data"], f"the run is shown once, not again as Out[n]: {kinds}"
    final = demo[0].data
    assert WIDGET not in final, "the ended run is its static transcript, no widget to miss"
    assert 'data-state="success"' in final["text/html"] and "Recorded 72.4 kg" in final["text/html"]
    assert final["text/plain"].startswith("✓ success"), "the end of the run replaced the display"
    assert text_of(demo_print).strip() == "True ['state_get', 'Bash', 'state_set', 'Bash']"
    assert "echo: literal {x} and $y" in text_of(verbatim), "no expansion without --interpolate"
    assert "echo: literal 42 and why" in text_of(interpolated)
    assert errors_of(fail) == ["RunFailed"]
    (error,) = [out for out in fail if out.output_type == "error"]
    assert len(error.traceback) == 1 and "%spawn_debug" in error.traceback[0], "one line"
    assert errors_of(allowed) == []
    assert text_of(allowed_print).strip() == "failed overloaded"
    assert [out.output_type for out in background] == ["display_data"]
    assert "echo: in the background" in background[0].data["text/html"], "shown once, ended"
    assert text_of(awaited).strip() == "echo: in the background success"
    assert "shape=(3, 2)" in text_of(peeked) and "x" in text_of(peeked)
    assert "text/html" in sessions[-1].data
    assert text_of(direct).strip() == "echo: top-level await works"
    statuses = sorted(r.status for r in SessionStore().list_sessions(limit=50))
    assert statuses == ["failed", "failed", *["success"] * 6]


def _execute(km_client: Any, code: str, *, stop_on_error: bool = True) -> str:
    return str(km_client.execute(code, stop_on_error=stop_on_error))


def _reply(km_client: Any, msg_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = km_client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"])
    raise TimeoutError(msg_id)


def test_interrupting_the_kernel_cancels_the_run(tmp_path: Path) -> None:
    slow = scenario(tmp_path, "slow", '[[turn]]\ndelay_ms = 60000\ntext = "late"\n')
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(REPO))
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        _reply(client, _execute(client, "%load_ext spawnkit"), 30)
        # After an error reply, ipykernel aborts every execute request that
        # reaches it before its "stop aborting" message does; on a loaded
        # machine the next request below can win that race (CI saw
        # 'aborted'). The queue policy is ipykernel's, not what this tests.
        msg_id = _execute(
            client,
            f"%%spawn --butler general --replay {slow}\nwait for me",
            stop_on_error=False,
        )
        deadline = time.monotonic() + 60
        while not processes_with_env("SPAWNKIT_BUTLER", "general"):
            assert time.monotonic() < deadline, "the CLI never started"
            time.sleep(0.05)
        km.interrupt_kernel()
        reply = _reply(client, msg_id, 60)
        assert reply["status"] == "error" and reply["ename"] == "RunCancelled"
        assert len(reply["traceback"]) == 1, "one line, no traceback into spawnkit"
        (record,) = SessionStore().list_sessions()
        assert record.status == "cancelled"
        assert processes_with_env("SPAWNKIT_BUTLER", "general") == []
        assert workspaces_of("general") == []
        # The kernel is still usable afterwards.
        after = _execute(client, "1 + 1")
        assert _reply(client, after, 30)["status"] == "ok"
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def test_saved_outputs_degrade_to_text(tmp_path: Path) -> None:
    outputs = run_notebook(
        ["%load_ext spawnkit", f"%%spawn --butler health --replay {DEMO}\nI weighed 72.4 kg"]
    )
    (view,) = outputs[1]
    assert WIDGET not in view.data, "reopened without widget state, no 'model not found'"
    text, page = view.data["text/plain"], view.data["text/html"]
    assert text.startswith("✓ success") and "⚙" not in text and "✓ Bash  $ date +%F" in text
    assert page.index("Reading the log first") < page.index("state_get") < page.index("Recorded")
    assert "<code>" in page or "<pre>" in page, "the answer's Markdown as HTML"
    json.dumps(view.data)  # the saved notebook holds plain JSON


ASK = """
[[turn]]
shell = "cat ./notes/todo.txt"
[[turn]]
text = "Your todo: {{ last_tool_result }}"
[[turn]]
text = "Nothing else was asked before: {{ prompt }}"
"""


def test_ask_and_chat_in_a_kernel(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk")
    script = scenario(tmp_path, "ask", ASK)
    outputs = run_notebook(
        [
            "%load_ext spawnkit",
            "from spawnkit.containment.sources import SourceRegistry\n"
            f"_ = SourceRegistry().add('notes', '{notes}')",
            f"%%ask --sources notes --replay {script} --out answer\nwhat is on my todo?",
            "import os\nprint(answer.answer, os.path.exists(answer.workdir))",
            "from spawnkit.notebook import chat\n"
            f"conversation = chat('notes', replay='{script}')\nconversation",
            "first = await conversation.send('what is on my todo?')\nprint(first.answer)",
            "second = await conversation.send('anything else?')\n"
            "print(second.answer.startswith('Nothing else'),\n"
            "      second.session_id == first.session_id)",
            "conversation.close()\n"
            "from spawnkit.store import SessionStore\n"
            "records = [SessionStore().get_session(t.record_id) for t in conversation.turns]\n"
            "print(first.workdir.exists(), second.workdir.exists(), conversation.closed,\n"
            "      [(r.kind, r.sources) for r in records],\n"
            "      records[1].parent_session_id == records[0].id)",
            "%%ask --sources nonexistent\nhello",
        ],
        cwd=tmp_path,
    )
    _, _, asked, printed, widget, first, second, closed, unknown = outputs
    assert WIDGET not in asked[0].data, "the ended view is its static transcript"
    assert "Your todo: buy milk" in asked[0].data["text/html"]
    # The answer once: in the view; the cell's Out[n] (the AskResult) is not shown again.
    assert len(asked) == 1 and "text/markdown" not in asked[0].data, asked
    assert text_of(printed).strip() == "Your todo: buy milk False", "the workdir is gone"
    assert WIDGET in widget[-1].data
    assert text_of(first).strip() == "Your todo: buy milk"
    assert text_of(second).strip() == "True True", "the second turn resumed the first"
    assert text_of(closed).strip() == (
        "False False True [('ask', ('notes',)), ('ask', ('notes',))] True"
    ), "each turn a recorded ask, the second resuming the first; nothing left behind"
    # IPython shows a magic's UsageError as one line on stderr (the cell still fails).
    assert text_of(unknown).startswith("UsageError: unknown source 'nonexistent'")
