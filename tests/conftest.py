"""Shared fixtures: an isolated SPAWNKIT_HOME and HOME per test, roster builders, stores.

No test touches the real home directory: the CLI's own state (``~/.claude``)
goes to a per-session temporary HOME, spawnkit's to a per-test SPAWNKIT_HOME.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spawnkit.config.roster import ButlerConfig, load_roster
from spawnkit.store import SessionStore

from .postgres import PostgresServer, postgres_server

REPO = Path(__file__).resolve().parent.parent

# The whole test process (and the notebook kernels nbval starts, which inherit its
# environment) gets a scratch HOME and SPAWNKIT_HOME: no test touches the real ones.
# Both are deleted when the session ends (pytest_unconfigure below).
_SCRATCH = (
    tempfile.mkdtemp(prefix="spawnkit-tests-home-"),
    tempfile.mkdtemp(prefix="spawnkit-tests-state-"),
)
os.environ["HOME"], os.environ["SPAWNKIT_HOME"] = _SCRATCH


# The prefix of the root-only files tests/test_sandbox.py plants in /etc.
ETC_PLANTED_PREFIX = "spawnkit-test-"


def pytest_unconfigure(config: pytest.Config) -> None:
    for count in _cpu_count:
        count.close()
    for folder in _SCRATCH:
        shutil.rmtree(folder, ignore_errors=True)
    if not hasattr(config, "workerinput"):  # the last process: no test worker runs any more
        # The files tests/test_sandbox.py planted in /etc, left while other workers' runs
        # might have them masked.
        for planted in Path("/etc").glob(f"{ETC_PLANTED_PREFIX}*"):
            planted.unlink(missing_ok=True)


# scripts/test runs the suite in pytest-xdist workers (--dist loadfile), which take whole
# files in collection order (--no-loadscope-reorder). The longest files (measured, about 40 s
# to 3 min each) come first, so that none of them starts last and keeps one worker busy
# long after the others have finished; every other file keeps its place.
LONGEST_FIRST = (
    "tests/test_binder.py", "tests/test_browser.py", "tests/test_contract.py",
    "tests/test_sandbox.py", "tests/test_store_restart.py", "tests/test_cli.py",
    "tests/test_benchmarks.py", "tests/test_stop_signals.py", "notebooks/batch.ipynb",
    "tests/test_budget_e2e.py", "tests/test_cluster_e2e.py", "tests/test_claude_e2e.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


# SPAWNKIT_TEST_CPU_LOG=FILE: one JSON line per test with its wall time and the CPU it cost.
# What to trim when the suite grows slow: wall time on a shared machine hides where the CPU
# goes, and CI's two cores are the limit. The CPU is counted through a cgroup each test
# process moves into (it holds every process the tests start: sandboxed CLIs, kernels,
# PostgreSQL servers, daemons reparented away); where none can be made, through getrusage
# (this process and the children it reaped, which misses about half).
_CPU_LOG = os.environ.get("SPAWNKIT_TEST_CPU_LOG")


class _CpuCount:
    """This process's CPU and its processes', through a cgroup of its own where one can be
    made (benchmarks/cgroup_cpu.py), else through getrusage."""

    def __init__(self) -> None:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from cgroup_cpu import CpuCounter

        self.counter = CpuCounter("spawnkit-tests")
        # Again at exit: at pytest_unconfigure a server a test started may still be inside.
        atexit.register(self.counter.close)

    def seconds(self) -> float:
        if (counted := self.counter.seconds()) is not None:
            return counted
        usages = (
            resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
        return sum(usage.ru_utime + usage.ru_stime for usage in usages)

    def close(self) -> None:
        self.counter.close()  # a run cgroup left inside keeps it


_cpu_count: list[_CpuCount] = []


def pytest_configure(config: pytest.Config) -> None:
    # Before any run's cgroup is made: they are made inside this process's own.
    if _CPU_LOG:
        _cpu_count.append(_CpuCount())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if not _cpu_count:
        yield
        return
    cpu, wall = _cpu_count[0].seconds(), time.monotonic()
    yield
    line = {"test": item.nodeid, "cpu_s": round(_cpu_count[0].seconds() - cpu, 2),
            "wall_s": round(time.monotonic() - wall, 2)}  # fmt: skip
    with open(_CPU_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


@pytest.fixture(scope="session")
def cli_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HOME for every CLI run of the session (a fresh HOME is slow to start)."""
    return tmp_path_factory.mktemp("cli-home")


@pytest.fixture(autouse=True)
def isolated_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory, cli_home: Path
) -> Iterator[Path]:
    spawnkit_home = tmp_path_factory.mktemp("spawnkit-home")
    monkeypatch.setenv("SPAWNKIT_HOME", str(spawnkit_home))
    monkeypatch.setenv("HOME", str(cli_home))
    for name in (
        "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "TRACEPARENT", "SPAWNKIT_ROSTER",
        "SPAWNKIT_SANDBOX", "SPAWNKIT_STORE",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    yield spawnkit_home


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole test session (tests/postgres.py)."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> Iterator[str]:
    """The URL (with its password) of a fresh, empty database on that server."""
    name = postgres.create_database()
    yield postgres.url(name)
    postgres.drop_database(name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    with SessionStore(tmp_path / "sessions.db") as s:
        yield s


BASE_TOML = """
[butler]
name = "{name}"
port = {port}
description = "A test butler"
"""


RosterFactory = Callable[..., ButlerConfig]

# The test butlers' ports: 18101 on, 100 more for each pytest-xdist worker after the first
# (gw1 from 18201), so that tests serving a butler on its port in parallel workers never
# meet on one.
BUTLER_PORTS = 18101 + 100 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


@pytest.fixture
def make_butler(tmp_path: Path) -> RosterFactory:
    """Write a butler into ``tmp_path/roster`` and load it.

    ``extra`` is TOML appended after ``[butler]`` (so it may add keys to it or
    open further tables); ``prompt`` is its CLAUDE.md.
    """
    roster_dir = tmp_path / "roster"
    ports = iter(range(BUTLER_PORTS, BUTLER_PORTS + 99))

    def make(
        name: str = "health",
        extra: str = "",
        prompt: str = "You are the {name} butler. Be brief.",
        files: dict[str, str] | None = None,
    ) -> ButlerConfig:
        folder = roster_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        toml = BASE_TOML.format(name=name, port=next(ports)) + textwrap.dedent(extra)
        (folder / "butler.toml").write_text(toml)
        (folder / "CLAUDE.md").write_text(prompt.format(name=name))
        for rel, content in (files or {}).items():
            path = roster_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        return load_roster(roster_dir)[name]

    return make


def workspaces_of(butler: str, root: Path | None = None) -> list[Path]:
    base = root or Path(os.environ["SPAWNKIT_HOME"]) / "workspaces"
    return sorted(base.glob(f"butler_{butler}_*"))


def live_processes() -> Iterator[tuple[int, str, list[str]]]:
    """Each live (not zombie) process: its pid, command name, and the fields of its
    /proc stat after the name (state, parent pid, process group, ...)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            yield int(entry.name), stat[stat.index("(") + 1 : stat.rindex(")")], fields


def processes_with_env(name: str, value: str) -> list[int]:
    """Live pids whose environment has ``name=value`` (Linux /proc).

    Only runs of this test's ``$SPAWNKIT_HOME`` count (their ``SPAWNKIT_WORKSPACE`` lies
    under it): a run of another test, still being torn down, is that test's to check.
    """
    needle = f"{name}={value}".encode()
    home = os.environ.get("SPAWNKIT_HOME")
    scope = f"SPAWNKIT_WORKSPACE={home}/".encode() if home else b""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        items = env.split(b"\0")
        if needle not in items or ") Z" in stat:
            continue
        workspaces = [i for i in items if i.startswith(b"SPAWNKIT_WORKSPACE=")]
        if scope and workspaces and not any(i.startswith(scope) for i in workspaces):
            continue
        found.append(int(entry.name))
    return found


def sessions_running(butler: str) -> set[str]:
    """Session ids of live processes of ``butler``'s runs (a CLI may have helper processes)."""
    sessions = set()
    for pid in processes_with_env("SPAWNKIT_BUTLER", butler):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"SPAWNKIT_SESSION_ID="):
                sessions.add(item.split(b"=", 1)[1].decode())
    return sessions


# A shell command that names every process of the run it runs in (its pid namespace).
PROCESS_NAMES = "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null | sort"


async def shell_output(butler: ButlerConfig, store: SessionStore, command: str) -> str:
    """What ``command`` printed, run by the shell tool of one replayed run of ``butler``."""
    from spawnkit.replay import Scenario
    from spawnkit.serve.service import ButlerService

    script = (
        f"[[turn]]\nshell = {json.dumps(command)}\n"
        '[[turn]]\ntext = "seen: {{ last_tool_result }}"\n'
    )
    scenario = Scenario.from_dict(tomllib.loads(script), source="<test>")
    async with ButlerService(butler, store=store, replay=scenario) as svc:
        result = await svc.trigger("run the command")
    assert result.success, result.error
    return result.tool_calls[0].output or ""


def env_lines(text: str) -> dict[str, str]:
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum():
            pairs[key] = value
    return pairs


os.environ.setdefault("NO_COLOR", "1")


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s output; a failure raises."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


# A run cgroup still empty this long after it was made is a leftover: a run's own is made
# just before its CLI starts and removed as it ends.
STALE_RUN_GROUP_S = 60.0


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the empty run cgroups that tests which kill a run's owner leave (a user's
    next spawnkit sweeps them; a test's home is gone by then). Once, in the process that
    ran every test (the xdist controller), and only cgroups old enough to be no one's run."""
    if hasattr(session.config, "workerinput"):
        return
    from spawnkit.containment import run_group

    now = time.time()
    for group in run_group.leftover_groups():
        try:
            old = now - group.path.stat().st_mtime > STALE_RUN_GROUP_S
        except OSError:
            continue
        if old and not group.pids():
            with contextlib.suppress(OSError):
                group.path.rmdir()
