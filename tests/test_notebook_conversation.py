"""Conversations in real Jupyter kernels: Stop on a run's view, ``%%spawn --continue`` and
``--resume``, and the chat widget's turns, on the real Claude Code CLI against the replay
model.

A view's Stop button sends the kernel a widget message (a ``comm_msg``); here the test
sends the same message on the kernel's shell channel, as the browser does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env, workspaces_of
from .test_notebook_kernel import errors_of, run_notebook, scenario, text_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WIDGET = "application/vnd.jupyter.widget-view+json"
SLOW = '[[turn]]\ndelay_ms = 120000\ntext = "too late"\n'
QUICK = '[[turn]]\ntext = "quick: {{ prompt }}"\n'


class Kernel:
    """A kernel of this test: run code, read its display outputs, message its widgets."""

    def __init__(self, cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 120) -> dict[str, Any]:
        """Execute ``code``; its reply, with ``outputs``: the iopub messages it caused."""
        msg_id = self.client.execute(code)
        outputs: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no reply to {code!r}"
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            outputs.append(msg)
        while True:
            reply = self.client.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                return {**reply["content"], "outputs": outputs}

    def printed(self, code: str) -> str:
        reply = self.run(code)
        assert reply["status"] == "ok", reply
        return "".join(
            m["content"]["text"] for m in reply["outputs"] if m["msg_type"] == "stream"
        ).strip()

    def send_widget(self, model_id: str, content: dict[str, Any]) -> None:
        """What a widget's ``model.send(content)`` sends from the browser."""
        data = {"method": "custom", "content": content}
        msg = self.client.session.msg("comm_msg", {"comm_id": model_id, "data": data})
        self.client.shell_channel.send(msg)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def widget_id(reply: dict[str, Any]) -> str:
    (shown,) = [
        m["content"]["data"][WIDGET]["model_id"]
        for m in reply["outputs"]
        if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]
    ]
    return str(shown)


def wait_until(kernel: Kernel, expression: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while kernel.printed(f"print({expression})") != "True":
        assert time.monotonic() < deadline, f"never true: {expression}"
        time.sleep(0.2)


def test_stop_on_one_of_two_background_runs_cancels_that_run_only(tmp_path: Path) -> None:
    slow, quick = scenario(tmp_path, "slow", SLOW), scenario(tmp_path, "quick", QUICK)
    kernel = Kernel(REPO)
    try:
        assert kernel.run("%load_ext spawnkit")["status"] == "ok"
        stopped = kernel.run(
            f"%%spawn --butler general --replay {slow} --background --out a\nwait for me"
        )
        kernel.run(f"%%spawn --butler general --replay {quick} --background --out b\ngo on")
        wait_until(kernel, "a.status == 'running' and b.done()")
        kernel.send_widget(widget_id(stopped), {"kind": "stop"})
        wait_until(kernel, "a.done()")
        assert kernel.printed("print(a.result().status, b.result().status)") == "cancelled success"
        assert kernel.printed("print(b.result().output)") == "quick: go on"
    finally:
        kernel.close()
    records = {r.status: r for r in SessionStore().list_sessions()}
    assert sorted(records) == ["cancelled", "success"], "one record each, one cancelled"
    assert processes_with_env("SPAWNKIT_SESSION_ID", records["cancelled"].id) == []
    assert workspaces_of("general") == [], "nothing left behind"


CONVERSATION = """
[[turn]]
text = "First answer to: {{ prompt }}"
[[turn]]
text = "Second answer, the same conversation: {{ prompt }}"
[[turn]]
text = "Third answer, the same conversation: {{ prompt }}"
"""
STOPPED_AT_MAX_TURNS = """
[[turn]]
shell = "echo one"
[[turn]]
text = "Going on after the stop: {{ prompt }}"
"""


def test_continue_and_resume_go_on_with_the_conversation(tmp_path: Path) -> None:
    talk = scenario(tmp_path, "talk", CONVERSATION)
    capped = scenario(tmp_path, "capped", STOPPED_AT_MAX_TURNS)
    spawn = "%%spawn --butler general"
    outputs = run_notebook(
        [
            "%load_ext spawnkit",
            f"{spawn} --continue\nthere is nothing to continue",
            f"{spawn} --replay {talk} --out a\nremember the number 42",
            f"{spawn} --continue --out b\nwhat number was it?",
            f"{spawn} --replay {talk} --resume {{b.session_id[:12]}} --out c\nand doubled?",
            "from spawnkit.store import SessionStore\n"
            "store = SessionStore()\n"
            "print(b.output)\nprint(c.output)\n"
            "print(store.get_session(b.session_id).parent_session_id == a.session_id,\n"
            "      store.get_session(c.session_id).parent_session_id == b.session_id)",
            f"{spawn} --replay {capped} --max-turns 1 --allow-failure --out m\nstart",
            f"{spawn} --continue --out n\ngo on",
            "print(m.error_kind, n.status, n.output)\n"
            "print(store.get_session(n.session_id).parent_session_id == m.session_id)",
            f"{spawn} --resume nonexistent\nhello",
        ]
    )
    _, nothing, first, _, resumed, printed, _, _, after_stop, unknown = outputs
    # IPython shows a magic's UsageError as one line on stderr (the cell still fails).
    assert text_of(nothing).strip() == (
        "UsageError: --continue: no earlier run of butler 'general' in this notebook; "
        "run one first, or name a session with --resume SESSION_ID"
    )
    assert errors_of(first) == []
    lines = text_of(printed).strip().splitlines()
    # The replay plays a conversation's turns in order: a later turn means the agent had
    # the earlier ones in its conversation.
    assert lines[0].startswith("Second answer, the same conversation"), lines
    assert lines[1].startswith("Third answer, the same conversation"), lines
    assert lines[2] == "True True", "each run links to the one it continued"
    (view,) = resumed
    page = view.data["text/html"]
    assert page.startswith('<details class="sk-earlier"><summary>Earlier in this conversation')
    earlier, own = page.split("</details>", 1)
    assert "remember the number 42" in earlier and "what number was it?" in earlier
    assert "Second answer" in earlier and "Third answer" in own
    stopped, linked = text_of(after_stop).strip().splitlines()
    assert stopped.startswith("max_turns success Going on after the stop"), stopped
    assert linked == "True"
    assert text_of(unknown).startswith("UsageError: --resume: no session 'nonexistent' in ")


CHAT = """
[[script]]
match = "slow please"
  [[script.turn]]
  delay_ms = 120000
  text = "too late"
[[script]]
  [[script.turn]]
  shell = "cat ./notes/todo.txt"
  [[script.turn]]
  text = "**Your todo:** {{ last_tool_result }}"
"""


def test_chat_shows_each_answer_once_takes_one_turn_at_a_time_and_stops(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("buy milk")
    script = scenario(tmp_path, "chat", CHAT)
    kernel = Kernel(tmp_path)
    try:
        kernel.printed(
            "from spawnkit.containment.sources import SourceRegistry\n"
            f"_ = SourceRegistry().add('notes', '{tmp_path / 'notes'}')\n"
            "from spawnkit.notebook import chat\n"
            f"c = chat('notes', replay='{script}')\n"
            "slow = c.send('slow please')"
        )
        wait_until(kernel, "c.transcript.children[1].state.status.state == 'running'")
        assert kernel.printed("print(c.send('too soon') is None, c.entry.disabled)") == (
            "True True"
        ), "no second message while a turn runs"
        stop = kernel.printed("print(c.stop_button.model_id)")
        kernel.send_widget(stop, {"event": "click"})  # what the browser sends for a click
        wait_until(kernel, "slow.done() and not c.entry.disabled")
        assert kernel.printed("print(slow.future.cancelled(), c.transcript.children[2].value)") == (
            "True <i>stopped: this turn is left out of the conversation</i>"
        )
        assert kernel.printed(
            "answer = await c.send('what is on my todo?')\n"
            "you, view, below = c.transcript.children[3:]\n"
            "print(answer.answer)\n"
            "print(repr(below.value))"
        ).splitlines() == ["**Your todo:** buy milk", "''"], "nothing under the view"
        page = kernel.printed("print(view.static_html())")
        assert "<strong>Your todo:</strong> buy milk" in page, "the answer rendered, in the view"
        assert "**Your todo" not in page
    finally:
        kernel.close()
    records = sorted(SessionStore().list_sessions(), key=lambda r: r.status)
    assert [(r.kind, r.status) for r in records] == [("ask", "cancelled"), ("ask", "success")]
    assert processes_with_env("SPAWNKIT_SESSION_ID", records[0].id) == []
