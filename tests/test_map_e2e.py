"""``spawnkit.map`` on the real CLIs against the replay model.

Codex is the quickest CLI to start, so most batches run on it; the side-by-side test runs
all three. Concurrency is measured from the session records (each run's ``started_at`` to
its ``completed_at``), the budget on scenarios whose usage gives a known cost.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import spawnkit
from spawnkit.cluster.batch import SKIPPED_BUDGET, SKIPPED_STOPPED, BatchRefused
from spawnkit.cluster.worktrees import DiffDoesNotApply
from spawnkit.errors import MissingApiKeyError
from spawnkit.history.pricing import default_pricing
from spawnkit.notebook.hub import Hub
from spawnkit.store import SessionRecord, SessionStore

from .conftest import REPO, git, processes_with_env, workspaces_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]

MODEL = "replay-gpt-5"  # priced as gpt-5 by family (Codex defers MCP tools for known slugs)
COUNT = """
[[script]]
match = "(?i)count the words in: (.*)"
  [[script.turn]]
  text = "Counting."
  shell = "printf '%s\\\\n' '{{ match.1 }}' | wc -w"
  usage = { input_tokens = 1000, output_tokens = 100 }
  [[script.turn]]
  text = "{{ match.1 }} has {{ last_tool_result }} words."
  usage = { input_tokens = 1000, output_tokens = 100 }

[[script]]
match = "(?i)take your time"
  [[script.turn]]
  delay_ms = 120000
  text = "Finally done."
"""
EDIT = """
[[script]]
match = "(?i)write (\\\\w+)"
  [[script.turn]]
  text = "Writing."
  shell = "echo '{{ match.1 }}' > NOTE.txt && sed -i 's/old/new/' README.md"
  [[script.turn]]
  text = "Wrote {{ match.1 }}."
"""


@pytest.fixture
def hub(store: SessionStore) -> Iterator[Hub]:
    hub = Hub(store)
    yield hub
    hub.close()


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "count.toml"
    path.write_text(COUNT)
    return path


def codex_butler(make_butler: Any, slots: int = 4) -> Any:
    return make_butler(
        extra=f"""
        [butler.runtime]
        type = "codex"
        model = "{MODEL}"
        max_concurrent_sessions = {slots}
        max_queued_sessions = 50
        """
    )


def most_at_once(records: list[SessionRecord]) -> int:
    edges = sorted(
        [(r.started_at, 1) for r in records if r.started_at is not None]
        + [(r.completed_at, -1) for r in records if r.completed_at is not None],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_dataframe_of_prompts_gives_one_row_each_in_order(
    make_butler: Any, hub: Hub, scenario: Path, store: SessionStore
) -> None:
    tickets = pd.DataFrame(
        {"words": ["a b", "c d e", "f", "g h i j"], "team": ["x", "y", "x", "y"]},
        index=pd.Index([11, 12, 13, 14], name="ticket"),
    )
    frame = spawnkit.map(
        codex_butler(make_butler), tickets, template="count the words in: {words}",
        replay=scenario, hub=hub, progress="text",
    )  # fmt: skip
    assert list(frame.index) == [11, 12, 13, 14] and frame.index.name == "ticket"
    assert frame["success"].all(), frame["error"].tolist()
    for words, text in zip(tickets["words"], frame["result"], strict=True):
        assert f"{words} has {len(words.split())} words." in text
    assert frame["session_id"].is_unique
    assert (frame["input_tokens"] == 2000).all() and (frame["output_tokens"] == 200).all()
    assert (frame["cost_usd"] > 0).all() and (frame["duration_s"] > 0).all()
    assert (frame["host"] == store.host).all()
    assert (frame["tool_calls"] == 1).all()
    records = {r.id: r for r in store.list_sessions(limit=100)}
    assert set(frame["session_id"]) == set(records)
    assert all(records[s].status == "success" for s in frame["session_id"])


def test_map_never_runs_more_than_max_concurrent(
    make_butler: Any, hub: Hub, scenario: Path, store: SessionStore
) -> None:
    prompts = [f"count the words in: {' '.join(['w'] * (n % 5 + 1))}" for n in range(20)]
    frame = spawnkit.map(
        codex_butler(make_butler, slots=6), prompts, max_concurrent=3,
        replay=scenario, hub=hub, progress="none",
    )  # fmt: skip
    assert len(frame) == 20 and frame["success"].all(), frame["error"].tolist()
    records = store.list_sessions(limit=100)
    assert len(records) == 20
    assert most_at_once(records) == 3, "3 at once at most, and 3 reached"


def test_the_budget_stops_dispatch_and_marks_the_rest_skipped(
    make_butler: Any, hub: Hub, scenario: Path, store: SessionStore
) -> None:
    price, _ = default_pricing().resolve(MODEL)
    assert price is not None
    per_run = float(price.cost(2000, 200, 0, 0, 0))
    # One at a time: after 2 runs the cost is 2 per_run (< 2.5), after 3 it is 3 (>= 2.5).
    frame = spawnkit.map(
        codex_butler(make_butler), [f"count the words in: {w}" for w in "abcdefgh"],
        max_concurrent=1, max_cost_usd=2.5 * per_run, replay=scenario, hub=hub,
        progress="none",
    )  # fmt: skip
    assert frame["status"].tolist() == ["success"] * 3 + [SKIPPED_BUDGET] * 5
    assert frame["session_id"].notna().sum() == 3 and frame["cost_usd"].iloc[3:].isna().all()
    assert frame["cost_usd"].sum() == pytest.approx(3 * per_run, rel=0.01)
    assert len(store.list_sessions(limit=100)) == 3, "the skipped prompts never ran"


def test_an_interrupt_cancels_the_runs_and_returns_the_partial_frame(
    make_butler: Any, hub: Hub, scenario: Path, store: SessionStore, capsys: Any
) -> None:
    prompts = ["count the words in: a b", "count the words in: c"] + ["take your time"] * 4
    main = threading.get_ident()

    def interrupt_when_two_are_slow() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = [r for r in store.list_sessions(limit=100) if r.status == "running"]
            done = [r for r in store.list_sessions(limit=100) if r.status == "success"]
            if len(done) == 2 and len(running) == 2:
                time.sleep(0.5)  # the slow ones are mid-turn
                signal.pthread_kill(main, signal.SIGINT)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=interrupt_when_two_are_slow, daemon=True)
    watcher.start()
    frame = spawnkit.map(
        codex_butler(make_butler), prompts, max_concurrent=2,
        replay=scenario, hub=hub, progress="text",
    )  # fmt: skip
    watcher.join(timeout=5)
    assert frame["status"].tolist() == ["success"] * 2 + ["cancelled"] * 2 + [SKIPPED_STOPPED] * 2
    assert "a b has 2 words." in frame["result"].iloc[0]
    records = {r.id: r.status for r in store.list_sessions(limit=100)}
    assert sorted(records.values()) == ["cancelled", "cancelled", "success", "success"]
    for session_id in frame["session_id"].dropna():
        assert processes_with_env("SPAWNKIT_SESSION_ID", session_id) == []
    assert workspaces_of("health") == []
    assert "stopped" in capsys.readouterr().err, "the text bar says the batch stopped"


def test_runtimes_side_by_side_give_one_row_per_prompt_and_runtime(
    make_butler: Any, hub: Hub, scenario: Path
) -> None:
    runtimes = ["claude-code", "codex", "gemini"]
    frame = spawnkit.map(
        make_butler(), ["count the words in: a b c", "count the words in: d"],
        runtimes=runtimes, replay=scenario, hub=hub, progress="none",
    )  # fmt: skip
    assert list(frame.index) == [(p, r) for p in (0, 1) for r in runtimes]
    assert frame.index.names == [None, "runtime"]
    assert frame["success"].all(), frame["error"].tolist()
    assert frame.xs("gemini", level="runtime")["result"].str.contains("has 3 words").iloc[0]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("the old text\n")
    git(repo, "add", "README.md")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "first")
    return repo


def test_each_run_edits_its_own_worktree_and_the_chosen_diff_applies(
    make_butler: Any, hub: Hub, tmp_path: Path, repo: Path
) -> None:
    scenario = tmp_path / "edit.toml"
    scenario.write_text(EDIT)
    frame = spawnkit.map(
        codex_butler(make_butler), ["write alpha", "write beta"], repo=repo,
        replay=scenario, hub=hub, progress="none",
    )  # fmt: skip
    assert frame["success"].all(), frame["error"].tolist()
    alpha, beta = frame["diff"]
    assert "+alpha" in alpha and "+beta" in beta and "+beta" not in alpha
    assert "-the old text" in alpha and "+the new text" in alpha
    # The repository is untouched: no change, no branch, no worktree left behind.
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "worktree", "list").count("\n") == 1
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["main"]

    touched = spawnkit.apply_diff(frame.loc[1, "diff"], repo)
    assert sorted(touched) == ["NOTE.txt", "README.md"]
    assert (repo / "NOTE.txt").read_text() == "beta\n"
    assert (repo / "README.md").read_text() == "the new text\n"
    with pytest.raises(DiffDoesNotApply, match="does not apply"):
        spawnkit.apply_diff(alpha, repo)  # the same lines were changed by beta's
    assert (repo / "NOTE.txt").read_text() == "beta\n", "a refused diff changes nothing"


def test_a_repo_that_is_not_a_checkout_is_named_and_nothing_runs(
    make_butler: Any, hub: Hub, tmp_path: Path, store: SessionStore
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(spawnkit.SpawnkitError, match="plain is not a git repository"):
        spawnkit.map(codex_butler(make_butler), ["write x"], repo=plain, hub=hub)
    assert store.list_sessions() == []


@pytest.mark.timeout(240)
def test_map_on_a_local_cluster_runs_on_its_workers_within_max_concurrent(
    make_butler: Any, hub: Hub, scenario: Path, store: SessionStore
) -> None:
    distributed = pytest.importorskip("distributed")
    prompts = [f"count the words in: {' '.join(['w'] * (n + 1))}" for n in range(8)]
    with (
        distributed.LocalCluster(
            processes=True, n_workers=2, threads_per_worker=2, dashboard_address=None,
            env={"SPAWNKIT_HOST": "dask-worker-host"},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):  # fmt: skip
        frame = spawnkit.map(
            codex_butler(make_butler), prompts, cluster=client, max_concurrent=3,
            replay=scenario, hub=hub, progress="none",
        )  # fmt: skip
    assert frame["success"].all(), frame["error"].tolist()
    for n, text in enumerate(frame["result"]):
        assert f"has {n + 1} words." in text
    assert (frame["host"] == "dask-worker-host").all(), "each record names its worker's host"
    records = store.list_sessions(limit=100)
    assert len(records) == 8 and {r.owner_host for r in records} == {"dask-worker-host"}
    assert 2 <= most_at_once(records) <= 3, "runs in parallel, never more than 3 at once"


def test_a_batch_every_run_of_which_has_no_key_raises_that_one_error(
    make_butler: Any, hub: Hub, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "CODEX_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(MissingApiKeyError, match="codex has no API key"):
        spawnkit.map(codex_butler(make_butler), ["a", "b", "c"], hub=hub, progress="none")
    assert store.list_sessions(limit=10) == []


def test_a_batch_with_some_runs_refused_says_why_on_each_row_and_warns_once(
    make_butler: Any, hub: Hub, scenario: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_GEMINI_CLI", "/nonexistent/gemini")
    with pytest.warns(RuntimeWarning, match=r"2 of 4 runs were refused .*gemini") as warned:
        frame = spawnkit.map(
            codex_butler(make_butler), ["count the words in: a b", "count the words in: c"],
            runtimes=["codex", "gemini"], replay=scenario, hub=hub, progress="none",
        )  # fmt: skip
    assert len(warned) == 1
    codex, gemini = frame.xs("codex", level="runtime"), frame.xs("gemini", level="runtime")
    assert codex["success"].all(), codex["error"].tolist()
    assert (gemini["status"] == "refused").all()
    assert gemini["error"].str.contains("cannot find the '/nonexistent/gemini").all()


def test_runtimes_that_are_all_missing_are_one_error_naming_each(
    make_butler: Any, hub: Hub, scenario: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_GEMINI_CLI", "/nonexistent/gemini")
    monkeypatch.setenv("SPAWNKIT_CODEX_CLI", "/nonexistent/codex")
    with pytest.raises(BatchRefused, match=r"every run of the batch was refused: codex.*; gemini"):
        spawnkit.map(
            codex_butler(make_butler), ["count the words in: a"], runtimes=["codex", "gemini"],
            replay=scenario, hub=hub, progress="none",
        )  # fmt: skip


MAP_SCRIPT = """
import spawnkit
frame = spawnkit.map("{butler}", ["count the words in: a b", "count the words in: c d e"],
                     runtimes=["claude-code", "codex"], replay="{scenario}", progress="text")
print(frame["status"].tolist())
"""


def test_a_script_that_maps_ends_quietly_and_its_cost_so_far_only_goes_up(
    make_butler: Any, scenario: Path, tmp_path: Path
) -> None:
    """Codex's MCP client opens an SSE stream, whose library leaves a task on the loop; and
    Claude Code reports its own cost at the end, which the live estimate need not match."""
    butler = make_butler("mapper", extra="[butler.runtime]\nmax_concurrent_sessions = 4\n")
    script = MAP_SCRIPT.format(butler=butler.name, scenario=scenario)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("['success', 'success', 'success', 'success']")
    assert "Task was destroyed" not in done.stderr and "Traceback" not in done.stderr
    shown = [line for line in re.split(r"[\r\n]", done.stderr) if line.startswith("[")]
    costs = [float(re.search(r" · \$([0-9.]+)", line)[1]) for line in shown]  # type: ignore[index]
    assert len(costs) > 2 and costs == sorted(costs) and costs[-1] > 0, shown
