"""``spawnkit.map``'s inputs, progress line and magic, and the worktrees it runs in.

The batches themselves run on the real CLIs in tests/test_map_e2e.py; here are the parts
a user meets before and around them: what a bad input says, what the bar shows, what
``%%spawn_map`` does with a cell, and git worktrees made and removed for real. The cost a
batch shows is tested with a hand-written runner: a run whose runtime reports a cost other
than its estimate (two price tables that disagree) is a case no replay CLI makes on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from spawnkit.cluster.batch import Batch, BatchItem, Progress
from spawnkit.cluster.worktrees import DiffDoesNotApply, Worktrees, apply_diff, base_commit
from spawnkit.errors import ConfigError
from spawnkit.events import EventSink, UsageUpdate
from spawnkit.notebook.batch import _TextBar, prompt_list, static_html
from spawnkit.result import SpawnerResult, Usage

from .conftest import REPO, git

COUNT = REPO / "notebooks" / "scenarios" / "slow_count.toml"


def test_a_list_a_series_and_a_dataframe_become_keyed_prompts() -> None:
    assert prompt_list(["a", "b"]) == ([(0, "a"), (1, "b")], None)
    assert prompt_list(["x"], template="Say {prompt}!") == ([(0, "Say x!")], None)
    series = pd.Series(["p", "q"], index=pd.Index(["k1", "k2"], name="key"))
    assert prompt_list(series) == ([("k1", "p"), ("k2", "q")], "key")
    frame = pd.DataFrame({"title": ["t1", "t2"], "n": [1, 2]}, index=[7, 9])
    assert prompt_list(frame, template="{title} x{n}")[0] == [(7, "t1 x1"), (9, "t2 x2")]
    frame["task"] = ["do a", "do b"]
    assert prompt_list(frame, column="task")[0] == [(7, "do a"), (9, "do b")]


@pytest.mark.parametrize(
    ("prompts", "options", "message"),
    [
        ("one prompt", {}, "give a list of prompts"),
        ([], {}, "there are none"),
        (["ok", "  "], {}, "empty prompt at 1"),
        (["ok", 3], {}, "strings expected, got int"),
        (pd.DataFrame({"a": ["x"]}), {}, "no 'prompt' column; name one with prompt_column="),
        (
            pd.DataFrame({"a": ["x"]}),
            {"template": "{b}"},
            "template: no column 'b' \\(row 0 has a\\)",
        ),
        (pd.DataFrame({"a": ["x"]}), {"template": "{a"}, "template: .*use \\{column\\} fields"),
        (42, {}, "a list, Series or DataFrame, not int"),
    ],
)
def test_bad_inputs_say_what_is_wrong(prompts: Any, options: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        prompt_list(prompts, **options)


def test_the_progress_line_counts_every_state_and_the_budget() -> None:
    progress = Progress(total=10, done=4, failed=1, running=3, cost_usd=0.25, budget_usd=1.0)
    assert progress.waiting == 2 and not progress.finished
    assert progress.line() == "5/10 · 4 ok · 1 failed · 3 running · $0.2500 of $1.0000"
    stopped = Progress(total=4, done=1, skipped=3, stopping="budget", cost_usd=1.2)
    assert stopped.finished
    assert stopped.line().endswith("3 skipped · $1.2000 · budget reached: no new runs")
    assert _TextBar.render(progress).startswith("[############............] 5/10")
    assert '<progress max="100" value="50">' in static_html(progress)


def test_a_running_estimate_is_shown_apart_from_what_finished_runs_cost() -> None:
    progress = Progress(total=4, done=1, running=2, cost_usd=0.01, running_cost_usd=0.0138)
    assert progress.line() == "1/4 · 1 ok · 0 failed · 2 running · $0.0100 (+$0.0138 running)"


class EstimatedHigh:
    """A runner whose runs report usage priced at 0.02 live, then finish at a cost of 0.01
    (the CLI's own price), one after another as the test releases them."""

    def __init__(self) -> None:
        self.release: asyncio.Queue[None] = asyncio.Queue()
        self.reported = 0

    async def trigger(
        self, prompt: str, trigger_source: str = "external", *, on_event: EventSink | None = None,
        session_id: str | None = None, workdir: Path | None = None,
    ) -> SpawnerResult:  # fmt: skip
        assert on_event is not None and session_id is not None
        on_event(UsageUpdate(session_id, Usage(1000, 100), 0.02, 1, "some-model"))
        self.reported += 1
        await self.release.get()
        return SpawnerResult(output="done", session_id=session_id, cost_usd=0.01)

    async def cancel(self, session_id: str) -> bool:
        return False


async def test_the_cost_so_far_never_goes_down_when_a_run_ends_below_its_estimate() -> None:
    runner = EstimatedHigh()
    shown: list[Progress] = []
    items = [BatchItem(n, n, f"prompt {n}", "fake") for n in range(3)]
    batch = Batch(items, {"fake": runner}, max_concurrent=3, on_progress=shown.append)
    running = asyncio.create_task(batch.run())
    while runner.reported < 3:
        await asyncio.sleep(0.01)
    for _ in items:
        runner.release.put_nowait(None)
    rows = await asyncio.wait_for(running, 30)
    assert [row.result.cost_usd for row in rows if row.result] == [0.01] * 3
    costs = [p.cost_usd for p in shown]
    assert costs == sorted(costs) and costs[-1] == pytest.approx(0.03), costs
    assert shown[-1].line().endswith(" · $0.0300")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "project"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("x = 1\n")
    (repo / "logo.bin").write_bytes(bytes(range(256)))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "first")
    return repo


def test_worktrees_start_at_head_and_their_diff_has_edits_new_deleted_and_binary_files(
    repo: Path,
) -> None:
    (repo / "src" / "a.py").write_text("x = 'uncommitted'\n")  # not in the worktrees
    base = base_commit(repo / "src")
    assert (
        base.repo == repo and base.dirty and base.commit == git(repo, "rev-parse", "HEAD").strip()
    )
    with Worktrees(base) as trees:
        tree = trees.add("00001")
        assert (tree / "src" / "a.py").read_text() == "x = 1\n"
        (tree / "src" / "a.py").write_text("x = 2\n")
        (tree / "new.txt").write_text("hello\n")
        (tree / "logo.bin").unlink()
        (tree / "icon.bin").write_bytes(b"\x00\x01\x02\xff")
        diff = trees.diff(tree)
        root = trees.root
    assert not root.exists(), "the worktrees' folder is gone with them"
    assert git(repo, "worktree", "list").count("\n") == 1
    assert "+x = 2" in diff and "+hello" in diff and "deleted file mode" in diff
    assert "GIT binary patch" in diff
    git(repo, "checkout", "--", "src/a.py")
    assert sorted(apply_diff(diff, repo)) == ["icon.bin", "logo.bin", "new.txt", "src/a.py"]
    assert (repo / "icon.bin").read_bytes() == b"\x00\x01\x02\xff"
    assert not (repo / "logo.bin").exists() and (repo / "new.txt").read_text() == "hello\n"
    with pytest.raises(DiffDoesNotApply):
        apply_diff(diff, repo)
    assert apply_diff("", repo) == []


def test_a_folder_that_is_no_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a git repository"):
        base_commit(tmp_path)
    with pytest.raises(ConfigError, match="is not a directory"):
        base_commit(tmp_path / "missing")


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    shell = globalipapp.get_ipython()  # the one test shell, whoever started it first
    shell.run_line_magic("load_ext", "spawnkit")
    yield shell
    shell.run_line_magic("unload_ext", "spawnkit")


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("nothing_here --butler general", "x {prompt}", "no variable 'nothing_here'"),
        ("words --butler general", "  \n", "needs a prompt template"),
        ("words", "x", "the following arguments are required: --butler"),
        ("words --butler nope", "x {prompt}", "unknown butler 'nope'"),
        ("words --butler general --runtimes gpt-cli", "x {prompt}", "unknown runtime"),
        ("frame --butler general", "count {missing}", "no column 'missing'"),
    ],
)
def test_spawn_map_magic_errors_are_usage_errors(
    ip: Any, line: str, cell: str, message: str
) -> None:
    ip.run_line_magic("cd", str(REPO))
    ip.user_ns["words"] = ["a b"]
    ip.user_ns["frame"] = pd.DataFrame({"words": ["a b"]})
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("spawn_map", line, cell)


@pytest.mark.e2e
def test_spawn_map_runs_the_cell_over_a_dataframe(ip: Any, capsys: Any) -> None:
    ip.run_line_magic("cd", str(REPO))
    ip.user_ns["texts"] = pd.DataFrame({"words": ["one two", "three four five"]})
    frame = ip.run_cell_magic(
        "spawn_map",
        f"texts --butler general --runtimes codex --replay {COUNT} --out counted",
        "count the words in: {words}\n",
    )
    assert ip.user_ns["counted"] is frame
    assert frame["success"].all(), frame["error"].tolist()
    assert "one two has 2 words." in frame.loc[0, "result"]
    assert "three four five has 3 words." in frame.loc[1, "result"]
    assert "2/2 · 2 ok" in capsys.readouterr().err, "the terminal shows a text bar"
