"""``repo=``: the real Claude Code CLI edits a git worktree of a repository, offline.

The agent (the CLI bundled in claude-agent-sdk, against the replay server, in its sandbox)
reads, edits and writes files of a temporary repository through ``Spawner.trigger(repo=)``,
``spawnkit run --repo`` and ``%%spawn --repo``. The repository must not change until the
diff is applied; the diff must hold the agent's changes only (not the user's uncommitted
ones it started from); applying twice, or over a conflicting change, must refuse and change
nothing; and no worktree may outlive its run, however the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest

from spawnkit.errors import ConfigError
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore
from spawnkit.worktree import DiffDoesNotApply

from .conftest import git, processes_with_env
from .test_notebook_kernel import errors_of, run_notebook, text_of

CLAUDE = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CLAUDE.exists(), reason="the bundled claude CLI is missing"),
]

TOOLS = '[butler.runtime]\ntools = ["Bash", "Read", "Edit", "Write"]\n'
# Read, then Edit, then Write, with paths relative to the working directory (the worktree).
PARQUET = """
[[script]]
match = "(?i)switch .* to parquet"
  [[script.turn]]
  text = "Reading it."
  tool = "Read"
  input = { file_path = "analysis.py" }
  [[script.turn]]
  text = "I saw: {{ last_tool_result }}"
  tool = "Edit"
  [script.turn.input]
  file_path = "analysis.py"
  old_string = "read_csv('data.csv')"
  new_string = "read_parquet('data.parquet')"
  [[script.turn]]
  tool = "Write"
  [script.turn.input]
  file_path = "convert.py"
  content = "import pandas as pd\\npd.read_csv('data.csv').to_parquet('data.parquet')\\n"
  [[script.turn]]
  text = "Switched analysis.py to parquet and wrote convert.py."

[[script]]
match = "(?i)edit slowly"
  [[script.turn]]
  tool = "Edit"
  input = { file_path = "analysis.py", old_string = "read_csv", new_string = "read_json" }
  [[script.turn]]
  delay_ms = 120000
  text = "Finally done."
"""
ANALYSIS = "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(df.describe())\n"
MY_NOTE = "# my own uncommitted note\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with one commit, an uncommitted edit and an untracked, unignored file."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "analysis.py").write_text(ANALYSIS)
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "first")
    (repo / "analysis.py").write_text(ANALYSIS + MY_NOTE)  # the user's own, uncommitted
    (repo / "todo.md").write_text("- switch to parquet\n")  # untracked, not ignored
    (repo / "run.log").write_text("ignored\n")  # ignored: not carried
    return repo


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "parquet.toml"
    path.write_text(PARQUET)
    return path


def snapshot(repo: Path) -> dict[str, Any]:
    """Everything of the repository a run must not change: files, status, index, refs."""
    return {
        "files": {
            str(p.relative_to(repo)): p.read_bytes()
            for p in sorted(repo.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(repo).parts
        },
        "status": git(repo, "status", "--porcelain"),
        "staged": git(repo, "diff", "--cached"),
        "refs": git(repo, "for-each-ref"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
    }


def no_worktree_left(repo: Path) -> None:
    assert git(repo, "worktree", "list").count("\n") == 1, git(repo, "worktree", "list")
    assert not (repo / ".git" / "worktrees").exists() or not any(
        (repo / ".git" / "worktrees").iterdir()
    )
    folder = Path(os.environ["SPAWNKIT_HOME"]) / "worktrees"
    assert not folder.exists() or list(folder.iterdir()) == []


async def test_the_agent_edits_a_worktree_and_apply_puts_back_only_its_change(
    make_butler: Any, store: SessionStore, repo: Path, scenario: Path
) -> None:
    before = snapshot(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    async with ButlerService(
        make_butler(extra=TOOLS), store=store, replay=Scenario.load(scenario)
    ) as service:
        result = await service.trigger("switch analysis.py to parquet", repo=repo)
    assert result.success, result.error
    assert [call.tool for call in result.tool_calls] == ["Read", "Edit", "Write"]
    # The agent started from the user's uncommitted state: it read their note.
    assert "my own uncommitted note" in (result.tool_calls[0].output or "")
    assert snapshot(repo) == before, "the repository does not change during the run"
    no_worktree_left(repo)

    diff = result.diff
    assert "-df = pd.read_csv('data.csv')" in diff and "+df = pd.read_parquet(" in diff
    assert "+++ b/convert.py" in diff and "new file mode" in diff
    assert "+# my own uncommitted note" not in diff, "the user's change is not the agent's"
    assert "todo.md" not in diff and "run.log" not in diff
    assert result.repo is not None and result.repo.base_commit == head
    assert sorted(result.repo.carried) == ["analysis.py", "todo.md"]

    record = store.get_session(result.session_id or "")
    assert record is not None and record.given is not None
    kept = record.given["repo"]
    assert kept["diff"] == diff and kept["base_commit"] == head and kept["repo"] == str(repo)

    assert sorted(result.apply()) == ["analysis.py", "convert.py"]
    text = (repo / "analysis.py").read_text()
    assert "read_parquet('data.parquet')" in text and "read_csv" not in text
    assert text.count("my own uncommitted note") == 1, "the user's change is not duplicated"
    assert (repo / "convert.py").read_text().startswith("import pandas")
    applied = snapshot(repo)
    with pytest.raises(DiffDoesNotApply, match=r"already applied .*analysis\.py, convert\.py"):
        result.apply()
    assert snapshot(repo) == applied, "a refused apply changes nothing"


async def test_apply_over_a_conflicting_change_refuses_naming_the_file(
    make_butler: Any, store: SessionStore, repo: Path, scenario: Path
) -> None:
    async with ButlerService(
        make_butler(extra=TOOLS), store=store, replay=Scenario.load(scenario)
    ) as service:
        result = await service.trigger("switch analysis.py to parquet", repo=repo)
    assert result.success, result.error
    # Meanwhile the user changed the same line.
    (repo / "analysis.py").write_text(ANALYSIS.replace("data.csv", "other.csv") + MY_NOTE)
    before = snapshot(repo)
    with pytest.raises(DiffDoesNotApply) as refused:
        result.apply()
    message = str(refused.value)
    assert "analysis.py changed since the run started" in message and "\n" not in message
    assert "convert.py" not in message.split(":")[1], "only the conflicting file is named"
    assert snapshot(repo) == before, "nothing of the diff is applied, convert.py included"


async def test_a_cancelled_run_leaves_no_worktree_and_the_repository_as_it_was(
    make_butler: Any, store: SessionStore, repo: Path, scenario: Path
) -> None:
    before = snapshot(repo)
    folder = Path(os.environ["SPAWNKIT_HOME"]) / "worktrees"
    async with ButlerService(
        make_butler(extra=TOOLS), store=store, replay=Scenario.load(scenario)
    ) as service:
        task = asyncio.create_task(service.trigger("edit slowly", repo=repo))
        for _ in range(600):  # a hang guard, not a timing assertion
            edited = [
                path for path in folder.glob("*/project/analysis.py") if "read_json" in
                path.read_text()
            ]  # fmt: skip
            if edited:
                break
            await asyncio.sleep(0.1)
        assert edited, "the agent's edit reached its worktree"
        (session_id,) = service.spawner.in_flight
        assert await service.spawner.cancel(session_id)
        result = await task
    assert result.status == "cancelled"
    assert snapshot(repo) == before
    no_worktree_left(repo)
    assert "+df = pd.read_json(" in result.diff, "a cancelled run's partial change is kept"


async def test_a_run_whose_cli_is_killed_leaves_no_worktree(
    make_butler: Any, store: SessionStore, repo: Path, scenario: Path
) -> None:
    before = snapshot(repo)
    folder = Path(os.environ["SPAWNKIT_HOME"]) / "worktrees"
    async with ButlerService(
        make_butler(extra=TOOLS), store=store, replay=Scenario.load(scenario)
    ) as service:
        task = asyncio.create_task(service.trigger("edit slowly", repo=repo))
        pids: list[int] = []
        for _ in range(600):  # a hang guard, not a timing assertion
            in_flight = service.spawner.in_flight
            if in_flight and list(folder.glob("*/project/analysis.py")):
                pids = processes_with_env("SPAWNKIT_SESSION_ID", in_flight[0])
                edited = "read_json" in next(folder.glob("*/project/analysis.py")).read_text()
                if pids and edited:
                    break
            await asyncio.sleep(0.1)
        assert pids, "the run's CLI was found"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        result = await task
    assert not result.success and result.status == "failed", result.status
    assert snapshot(repo) == before
    no_worktree_left(repo)
    assert "+df = pd.read_json(" in result.diff


async def test_a_path_that_is_no_repository_is_one_line_and_nothing_runs(
    make_butler: Any, store: SessionStore, tmp_path: Path, scenario: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    async with ButlerService(
        make_butler(extra=TOOLS), store=store, replay=Scenario.load(scenario)
    ) as service:
        with pytest.raises(ConfigError, match=r"^repo: .*plain is not a git repository"):
            await service.trigger("switch analysis.py to parquet", repo=plain)
    assert store.list_sessions() == []


def spawnkit_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args],
        capture_output=True, text=True, timeout=240, cwd=cwd,
    )  # fmt: skip


def test_spawnkit_run_repo_prints_the_stat_and_spawnkit_apply_applies_once(
    make_butler: Any, repo: Path, scenario: Path, tmp_path: Path
) -> None:
    make_butler(extra=TOOLS)
    roster = str(tmp_path / "roster")
    before = snapshot(repo)
    run = spawnkit_cli(
        "run", "--roster", roster, "--butler", "health", "--replay", str(scenario),
        "--repo", str(repo), "switch analysis.py to parquet", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert snapshot(repo) == before
    no_worktree_left(repo)
    assert f"Changes to {repo} (not applied yet):" in run.stdout
    assert re.search(r"analysis\.py \|\s+2 \+-\n convert\.py  \|\s+2 \+\+\n", run.stdout)
    assert "2 files changed, 3 insertions(+), 1 deletion(-)" in run.stdout
    (session_id,) = [s.id for s in SessionStore().list_sessions()]
    assert f"Apply them: spawnkit apply {session_id}" in run.stdout

    shown = spawnkit_cli("apply", session_id[:8], "--print", cwd=tmp_path)
    assert shown.returncode == 0 and "+df = pd.read_parquet(" in shown.stdout
    assert snapshot(repo) == before, "--print changes nothing"
    applied = spawnkit_cli("apply", session_id[:8], cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == f"Applied to {repo}: analysis.py, convert.py"
    assert "read_parquet" in (repo / "analysis.py").read_text()
    again = spawnkit_cli("apply", session_id, cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "already applied" in again.stderr
    assert "Traceback" not in again.stderr
    # --last names the same run: the newest that changed a repository.
    last = spawnkit_cli("apply", "--last", "--print", cwd=tmp_path)
    assert last.returncode == 0 and last.stdout == shown.stdout
    both = spawnkit_cli("apply", session_id, "--last", cwd=tmp_path)
    assert both.returncode == 2 and "not both" in both.stderr


def test_spawnkit_apply_last_without_a_repo_run_is_one_line(tmp_path: Path) -> None:
    done = spawnkit_cli("apply", "--last", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "changed a repository" in done.stderr and "Traceback" not in done.stderr


def test_spawnkit_run_repo_on_a_plain_folder_is_one_line(
    make_butler: Any, tmp_path: Path, scenario: Path
) -> None:
    make_butler(extra=TOOLS)
    plain = tmp_path / "plain"
    plain.mkdir()
    run = spawnkit_cli(
        "run", "--roster", str(tmp_path / "roster"), "--butler", "health", "--replay",
        str(scenario), "--repo", str(plain), "switch analysis.py to parquet", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"spawnkit: error: repo: {plain} is not a git repository with a commit "
        "(git init, then commit)"
    )
    assert SessionStore().list_sessions() == []


def test_a_killed_spawnkit_run_leaves_its_worktree_to_the_sweep(
    make_butler: Any, repo: Path, scenario: Path, tmp_path: Path
) -> None:
    make_butler(extra=TOOLS)
    before = snapshot(repo)
    folder = Path(os.environ["SPAWNKIT_HOME"]) / "worktrees"
    process = subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "run", "--roster", str(tmp_path / "roster"),
         "--butler", "health", "--replay", str(scenario), "--repo", str(repo), "edit slowly"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(1200):  # a hang guard, not a timing assertion
            if any("read_json" in p.read_text() for p in folder.glob("*/project/analysis.py")):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the agent's edit never reached its worktree")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert list(folder.iterdir()), "a SIGKILLed owner cannot clean up itself"
    with SessionStore() as store:  # opening the store sweeps what dead owners left
        (record,) = store.list_sessions()
    assert record.status == "crashed"
    assert record.error is not None and "its repository worktree removed" in record.error
    assert list(folder.iterdir()) == []
    git(repo, "worktree", "prune")  # what the next repo= run of the repository does first
    assert snapshot(repo) == before
    no_worktree_left(repo)


def test_spawn_magic_repo_shows_the_diff_and_its_apply_button_applies(
    repo: Path, scenario: Path, tmp_path: Path
) -> None:
    roster = tmp_path / "roster" / "coder"
    roster.mkdir(parents=True)
    (roster / "butler.toml").write_text(
        '[butler]\nname = "coder"\nport = 18190\ndescription = "edits code"\n' + TOOLS
    )
    (roster / "CLAUDE.md").write_text("Be brief.")
    cells = [
        "%load_ext spawnkit",
        f"%%spawn --butler coder --roster {tmp_path / 'roster'} --replay {scenario} "
        f"--repo {repo} --out r\nswitch analysis.py to parquet",
        f"print(open({str(repo / 'analysis.py')!r}).read().count('read_parquet'))",
        "import ipywidgets\nfrom ipywidgets.widgets.widget import _instances\n"
        "buttons = [w for w in list(_instances.values())\n"
        "           if isinstance(w, ipywidgets.Button) and w.description == 'Apply']\n"
        "(apply,) = buttons\n"
        "apply.click()\n"
        "status = [w for w in _instances.values()\n"
        "          if isinstance(w, ipywidgets.HTML) and 'Applied' in w.value]\n"
        "print(apply.disabled, len(status), status[0].value if status else '')\n"
        f"print(open({str(repo / 'analysis.py')!r}).read().count('read_parquet'))",
        "apply.click()\nprint([w.value for w in _instances.values()\n"
        "       if isinstance(w, ipywidgets.HTML) and 'Not applied' in w.value])",
    ]
    outputs = run_notebook(cells, cwd=tmp_path, timeout=240)
    _, spawn, before, clicked, again = outputs
    assert errors_of(spawn) == [], text_of(spawn)
    html = [out.data["text/html"] for out in spawn if "text/html" in out.get("data", {})]
    diff_html = next(part for part in html if "spawnkit-diff" in part)
    assert "read_parquet" in diff_html and "rgba(46,160,67" in diff_html, "+ lines in green"
    assert any("Changes to" in part and "not applied yet" in part for part in html)
    widgets = [out.data for out in spawn if "application/vnd.jupyter.widget-view+json" in out.get(
        "data", {})]  # fmt: skip
    # The ended run view is its static transcript; the Apply/Discard box gave way to its outcome.
    assert widgets == []
    assert "Applied: analysis.py, convert.py" in html[-1], "the box's display, updated"
    assert text_of(before).strip() == "0", "the repository is unchanged until Apply"
    printed = text_of(clicked).split("\n")
    assert printed[0].startswith("True 1 ") and "Applied: analysis.py, convert.py" in printed[0]
    assert printed[1].strip() == "1"
    assert errors_of(again) == []
    assert "Not applied" not in text_of(again), "a disabled button does nothing on click"
    (record,) = SessionStore().list_sessions()
    assert record.given is not None and record.given["repo"]["diff"].count("read_parquet") == 1
