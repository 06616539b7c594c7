"""What spawnkit adds on top of the bare CLI: the same scenario both ways, in one run.

For each runtime, both sides run the same CLI binary against the same replay
model server and the same butler MCP server (each on its own thread), and the
scenario makes one real MCP tool call.

* bare: the CLI as a plain subprocess in a fresh folder (its home and working folder, as
  a run's workspace is), output read to the end. For Claude Code
  that is ``claude -p PROMPT --output-format stream-json --verbose`` with the
  same system prompt, tools and MCP configuration; for Codex and Gemini it is
  exactly the command, configuration files and environment the adapter builds, the CLI
  started as a user starts it: ``codex`` is npm's node launcher, which starts Codex's
  native binary; ``gemini`` relaunches itself into a second node. spawnkit starts that
  binary, and that second node, itself.
* a second baseline where the CLI starts two ways: Claude Code through the agent SDK
  alone (``bare_sdk``); Codex's native binary, Gemini's second node (``bare_native``), the
  floor for what spawnkit itself adds.
* spawnkit: ``Spawner.trigger(PROMPT)``: admission, session record, workspace,
  isolated environment, system prompt composition, telemetry span, output
  parsing, per-session logs, cleanup.

* spawnkit, host network: the same trigger for the same butler with ``[butler.sandbox]
  network = "host"``, i.e. without the run's network namespace, its doors and the
  forwarder (the default, above, has them): the figure beside the one with them.
* spawnkit, unsandboxed: the same trigger with ``[butler.sandbox] mode = "none"``.
* spawnkit through the SDK (Claude Code only, ``through_sdk``): the same trigger with every
  run driven through ``claude_agent_sdk.query()``, as runs that ask about tools or
  delegate are; the others are ``claude --print`` (``spawnkit.runtimes.claude_code``).

The bare Claude Code side runs each time in a fresh home seeded with the CLI's
first-start record, as spawnkit's runs are: a home kept across runs would skip work
spawnkit's runs do, and the ratio would not measure spawnkit. Beside the wall-time
ratios, each side's CPU per run is counted (the CLI's processes through a cgroup, and
this process), and their sum against the bare side's (``*_total_cpu_ratio``).

Rounds alternate between the sides (after one warm-up each) so drift on a shared
machine hits all alike, and each round starts one side later than the one before, so that
no side always runs right after the same other one; the figure is the ratio of the
medians. Use a multiple of the number of sides as ``--rounds`` for every side to run in
every position equally often. With
``--cli-telemetry`` a further side alternates with them: the same trigger with the
CLI's own telemetry on (``Spawner(cli_telemetry=True)``: the run's OTLP receiver, the
CLI exporting its runtime's default signals, all stored; what each run collected is
counted from its record), reported as the extra
seconds per run over spawnkit without it (written to
``results/spawn_overhead_cli_telemetry.json``), and its extra CPU per run, in the CLI's
processes and in this process, as a share of a run's CPU without it (medians of each
round's difference, with their spread). ``--cli-telemetry logs`` (any choice
``Spawner(cli_telemetry=...)`` takes: ``all``, ``logs+traces@0.1``) measures that choice;
``--telemetry-only`` runs only the two sides it compares. Usage::

    .venv/bin/python benchmarks/spawn_overhead.py [--rounds 8] [--runtimes claude-code,codex]
        [--cli-telemetry [CHOICE]] [--telemetry-only]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spawnkit._asgi import serve_in_thread
from spawnkit.config.roster import ButlerConfig, load_roster
from spawnkit.config.system_prompt import compose_system_prompt, read_prompt_file
from spawnkit.containment.mcp_access import AccessTable
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.run import Spawner
from spawnkit.runtimes import get_adapter
from spawnkit.runtimes.base import McpServerSpec, RunSpec
from spawnkit.runtimes.claude_code import ClaudeCodeAdapter, seed_home
from spawnkit.runtimes.gemini_launch import NO_RELAUNCH, direct_command
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
from cgroup_cpu import CpuCounter  # sibling modules of this script
from paired import paired_sides

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "spawn_overhead.json"
TELEMETRY_RESULTS = ROOT / "benchmarks" / "results" / "spawn_overhead_cli_telemetry.json"
PROMPT = "What is my weight?"
SCENARIO = """
[[turn]]
tool = "mcp__*__state_get"
input = { key = "measurements/weight" }
[[turn]]
text = "Your weight log: {{ last_tool_result }}"
"""
KEY = "spawnkit-replay"
TARGET = 1.05  # issue #28: a run through spawnkit at most 1.05 x the bare CLI


CLAUDE_TOOLS = ["Bash", "Read", "Glob", "Grep"]


def claude_settings(
    butler: ButlerConfig, replay_url: str, mcp_port: int, work: Path, secret: str
) -> tuple[str, Path, dict[str, str]]:
    """What both bare Claude Code sides give the CLI, as spawnkit does: the system prompt,
    an MCP config file naming the butler's server with the granted secret, and the
    environment (the home and temp folder are each run's own)."""
    system_prompt = compose_system_prompt(
        butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    )
    mcp_config = work / "mcp.json"
    url = f"http://localhost:{mcp_port}/mcp?session_id=bench"
    server = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {secret}"}}
    mcp_config.write_text(json.dumps({"mcpServers": {butler.name: server}}))
    env = {
        "PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": replay_url, "ENABLE_TOOL_SEARCH": "false",
        "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "1",
    }  # fmt: skip
    return system_prompt, mcp_config, env


def claude_bare(
    butler: ButlerConfig, replay_url: str, mcp_port: int, work: Path, secret: str
) -> Callable[[], None]:
    """The bare Claude Code command, with the settings spawnkit gives it, each run in a
    fresh home seeded with the CLI's first-start record as spawnkit seeds its runs' homes
    (a home shared across runs would skip first-start work spawnkit's runs do not skip),
    which is also its working folder, as a run's workspace is (a folder inside a git
    checkout would have Claude Code read the repository's state first)."""
    binary = get_adapter("claude-code")(butler.runtime).find_binary()
    system_prompt, mcp_config, env = claude_settings(butler, replay_url, mcp_port, work, secret)
    tools = CLAUDE_TOOLS
    command = [
        str(binary), "-p", PROMPT, "--output-format", "stream-json", "--verbose",
        "--system-prompt", system_prompt, "--tools", ",".join(tools),
        "--allowedTools", ",".join([*tools, f"mcp__{butler.name}"]), "--permission-mode", "dontAsk",
        "--max-turns", "20", "--mcp-config", str(mcp_config), "--strict-mcp-config",
        "--setting-sources=",
    ]  # fmt: skip

    def run() -> None:
        home = Path(tempfile.mkdtemp(prefix="bare-home-", dir=work))
        try:
            seed_home(home)
            tmp = home / "tmp"
            tmp.mkdir(mode=0o700)
            done = subprocess.run(
                command, env={**env, "HOME": str(home), "TMPDIR": str(tmp)},
                cwd=home, capture_output=True, text=True, timeout=120,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            shutil.rmtree(home, ignore_errors=True)
        last = json.loads(done.stdout.strip().splitlines()[-1])
        if done.returncode or last.get("is_error") or "measurements/weight" not in last["result"]:
            raise SystemExit(f"bare claude failed: {done.stdout[-500:]} {done.stderr[-500:]}")

    return run


def claude_sdk_bare(
    butler: ButlerConfig, replay_url: str, mcp_port: int, work: Path, secret: str
) -> Callable[[], None]:
    """The same Claude Code run driven by ``claude_agent_sdk.query()`` as an application
    would write it, without spawnkit: the settings of :func:`claude_bare` (and the token
    deltas spawnkit asks for), in a fresh seeded home. The SDK runs the CLI in its streaming
    mode (the prompt after an ``initialize`` exchange on stdin), which costs the CLI more
    than ``-p``; spawnkit drives Claude Code through the SDK, so this is the floor it can
    reach."""
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query
    from claude_agent_sdk.types import SystemPromptFile

    binary = get_adapter("claude-code")(butler.runtime).find_binary()
    system_prompt, mcp_config, env = claude_settings(butler, replay_url, mcp_port, work, secret)
    system_file = work / "sdk-system-prompt.md"
    system_file.write_text(system_prompt)
    tools = CLAUDE_TOOLS

    async def once(home: Path) -> str:
        options = ClaudeAgentOptions(
            cli_path=binary, cwd=home,
            env={**env, "HOME": str(home), "TMPDIR": str(home / "tmp")},
            system_prompt=SystemPromptFile(type="file", path=str(system_file)),
            mcp_servers=str(mcp_config), strict_mcp_config=True, setting_sources=[],
            tools=tools, allowed_tools=[*tools, f"mcp__{butler.name}"],
            permission_mode="dontAsk", max_turns=20, include_partial_messages=True,
        )  # fmt: skip
        answer = ""
        async for message in query(prompt=PROMPT, options=options):
            if isinstance(message, ResultMessage):
                answer = message.result or ""
        return answer

    def run() -> None:
        home = Path(tempfile.mkdtemp(prefix="sdk-home-", dir=work))
        try:
            seed_home(home)
            (home / "tmp").mkdir(mode=0o700)
            answer = asyncio.run(once(home))
        finally:
            shutil.rmtree(home, ignore_errors=True)
        if "measurements/weight" not in answer:
            raise SystemExit(f"claude through the SDK failed: {answer[-500:]}")

    return run


def adapter_bare(
    runtime: str,
    butler: ButlerConfig,
    replay_url: str,
    mcp_port: int,
    work: Path,
    secret: str,
    *,
    as_installed: bool = True,
) -> Callable[[], None]:
    """The exact command, files and environment the adapter builds, run without spawnkit.

    ``as_installed``: the CLI's command is the one a user types (see the module's
    docstring); else the program the adapter runs."""
    adapter = get_adapter(runtime)(butler.runtime)
    system_prompt = compose_system_prompt(
        butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    )
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "OPENAI_API_KEY": KEY,
           "GEMINI_API_KEY": KEY}  # fmt: skip

    def run() -> None:
        workspace = Path(tempfile.mkdtemp(prefix="bare-", dir=work))
        try:
            server = McpServerSpec(
                butler.name, "http", f"http://localhost:{mcp_port}/mcp?session_id=bench", secret
            )
            spec = RunSpec(
                session_id="bench", butler=butler.name, prompt=PROMPT,
                system_prompt=system_prompt, workspace=workspace, cwd=workspace,
                mcp_server=server, config_file=adapter.build_config_file(workspace, server),
                env=env, max_turns=20, tools=butler.runtime.tools, base_url=replay_url,
            )  # fmt: skip
            command = adapter.command(spec)  # type: ignore[attr-defined]
            child_env = adapter.child_env(spec)
            if as_installed:
                command, child_env = installed_command(adapter, command, child_env)
            prompt = adapter.stdin(spec)  # type: ignore[attr-defined]  # the prompt, on stdin
            done = subprocess.run(
                command, env=child_env, cwd=spec.cwd, capture_output=True,
                timeout=120, input=prompt,
            )  # fmt: skip
            stdout = done.stdout.decode(errors="replace")
            stderr = done.stderr.decode(errors="replace")
            if done.returncode or "measurements/weight" not in stdout:
                raise SystemExit(f"bare {runtime} failed: {stdout[-500:]} {stderr[-500:]}")
        finally:
            shutil.rmtree(workspace, ignore_errors=True)

    return run


def installed_command(
    adapter: Any, command: list[str], env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """``command`` and ``env`` of the adapter's run as a user starts the CLI: npm's launcher
    for Codex's native binary, Gemini's own script (which relaunches itself)."""
    cli = str(adapter.find_binary())
    if adapter.type == "gemini":
        direct = direct_command(adapter.find_binary(), env.get("PATH"))
        if direct is not None and tuple(command[: len(direct)]) == direct:
            env = {name: value for name, value in env.items() if name not in NO_RELAUNCH}
            return [cli, *command[len(direct) :]], env
        return command, env
    return [cli, *command[1:]], env


def measure(
    runtime: str,
    rounds: int,
    work: Path,
    cli_telemetry: bool | str = False,
    telemetry_only: bool = False,
) -> dict[str, Any]:
    base = load_roster(ROOT / "roster")["health"]
    butler = dataclasses.replace(base, runtime=dataclasses.replace(base.runtime, type=runtime))
    store = SessionStore(work / f"{runtime}.db")
    replay = ReplayServer(Scenario.from_dict(tomllib.loads(SCENARIO), source="benchmark"))
    # One table for both sides: spawnkit's runs grant their own secrets in it, the bare
    # CLI sends one granted up front, so both authenticate the same way.
    access = AccessTable()
    secret = asyncio.run(access.grant("bench"))
    with (
        serve_in_thread(replay.app) as replay_address,
        serve_in_thread(ButlerServer(butler, store, access=access).app()) as mcp_address,
    ):
        for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
            os.environ[key] = KEY
        spawner = Spawner(
            butler, store=store, base_url=replay_address.url, mcp_port=mcp_address.port,
            mcp_access=access,
        )  # fmt: skip
        # The same butler on the host's network: no namespace, no doors, no forwarder.
        open_net = dataclasses.replace(
            butler, sandbox=dataclasses.replace(butler.sandbox, network="host")
        )
        host_network = Spawner(
            open_net, store=store, base_url=replay_address.url, mcp_port=mcp_address.port,
            mcp_access=access,
        )  # fmt: skip
        # And without the sandbox at all ([butler.sandbox] mode = "none").
        unsandboxed = Spawner(
            dataclasses.replace(butler, sandbox=dataclasses.replace(butler.sandbox, mode="none")),
            store=store, base_url=replay_address.url, mcp_port=mcp_address.port,
            mcp_access=access,
        )  # fmt: skip
        through_sdk = Spawner(
            butler, store=store, base_url=replay_address.url, mcp_port=mcp_address.port,
            mcp_access=access, adapter=_ThroughSdk(butler.runtime),
        ) if runtime == "claude-code" else spawner  # fmt: skip
        traced = Spawner(
            butler, store=store, base_url=replay_address.url, mcp_port=mcp_address.port,
            mcp_access=access, cli_telemetry=cli_telemetry or True,
        )  # fmt: skip
        # A second baseline, where the CLI can be started two ways: Claude Code through the
        # agent SDK alone (as spawnkit starts it); Codex's native binary and Gemini's second
        # node (which spawnkit starts in place of the launcher the bare side runs).
        bare_sdk = None
        alt = "bare_sdk" if runtime == "claude-code" else "bare_native"
        if runtime == "claude-code":
            bare = claude_bare(butler, replay_address.url, mcp_address.port, work, secret)
            bare_sdk = claude_sdk_bare(butler, replay_address.url, mcp_address.port, work, secret)
        else:
            bare = adapter_bare(runtime, butler, replay_address.url, mcp_address.port, work, secret)
        if runtime in ("codex", "gemini"):
            bare_sdk = adapter_bare(
                runtime, butler, replay_address.url, mcp_address.port, work, secret,
                as_installed=False,
            )  # fmt: skip

        async def through_spawnkit(chosen: Spawner) -> None:
            result = await chosen.trigger(PROMPT)
            if not result.success or "measurements/weight" not in result.output:
                raise SystemExit(f"spawnkit {runtime} failed: {result.error} {result.output[:300]}")
            if chosen is not traced:
                return
            if not (store.cli_spans(result.session_id) or store.cli_events(result.session_id)):
                raise SystemExit(f"spawnkit {runtime}: CLI telemetry on, and nothing stored")
            record = store.get_session(result.session_id)
            given = (record.given or {}) if record is not None else {}
            collected.append("+".join(given.get("cli_telemetry", [])) or "none")

        runner = asyncio.Runner()
        collected: list[str] = []  # what each run with telemetry collected (its record says)

        cpu: dict[str, list[tuple[float, float]]] = {"spawnkit": []}
        if not telemetry_only:
            cpu.update({"bare": [], "host_network": [], "unsandboxed": []})
            if runtime == "claude-code":
                cpu["through_sdk"] = []
            if bare_sdk is not None:
                cpu[alt] = []
        if cli_telemetry:
            cpu["telemetry"] = []

        def timed(run: Callable[[], Any], side: str | None = None) -> float:
            # This process's CPU to the microsecond (os.times counts 10 ms ticks).
            total, before, start = accounting.seconds(), time.process_time(), time.perf_counter()
            run()
            wall, after = time.perf_counter() - start, time.process_time()
            if side:
                own = after - before
                if total is not None:  # everything in our cgroup minus this process
                    children = (accounting.seconds() or 0.0) - total - own
                else:
                    children = float("nan")
                cpu[side].append((children, own))
            return wall

        def via_spawnkit() -> None:
            runner.run(through_spawnkit(spawner))

        def with_telemetry() -> None:
            runner.run(through_spawnkit(traced))

        def on_host_network() -> None:
            runner.run(through_spawnkit(host_network))

        def without_sandbox() -> None:
            runner.run(through_spawnkit(unsandboxed))

        def via_sdk() -> None:
            runner.run(through_spawnkit(through_sdk))

        sdk_way = runtime == "claude-code" and not telemetry_only

        others = not telemetry_only  # the bare CLI, and spawnkit without its sandboxes
        if others:
            timed(bare)  # warm-up: the CLI's files in the page cache
            if bare_sdk is not None:
                timed(bare_sdk)
        timed(via_spawnkit)
        if others:
            timed(on_host_network)
            timed(without_sandbox)
        if sdk_way:
            timed(via_sdk)
        if cli_telemetry:
            timed(with_telemetry)
        bare_s, spawnkit_s, host_s, open_s, telemetry_s, sdk_s = [], [], [], [], [], []
        via_sdk_s: list[float] = []
        sides: list[tuple[str, Callable[[], Any], list[float]]] = []
        if others:
            sides.append(("bare", bare, bare_s))
            if bare_sdk is not None:
                sides.append((alt, bare_sdk, sdk_s))
        sides.append(("spawnkit", via_spawnkit, spawnkit_s))
        if others:
            sides += [("host_network", on_host_network, host_s),
                      ("unsandboxed", without_sandbox, open_s)]  # fmt: skip
        if sdk_way:
            sides.append(("through_sdk", via_sdk, via_sdk_s))
        if cli_telemetry:
            sides.append(("telemetry", with_telemetry, telemetry_s))
        for round_ in range(rounds):
            # Each round starts one side later, so that every side runs in every position
            # as often as the others: a run that follows another (its page cache, its
            # leftovers, the machine's frequency) favours no side.
            first = round_ % len(sides)
            for side, run, walls in sides[first:] + sides[:first]:
                walls.append(timed(run, side))
        runner.close()
    adapter = get_adapter(runtime)(butler.runtime)
    telemetry: dict[str, Any] = {}
    if cli_telemetry:
        median = statistics.median(telemetry_s)
        telemetry = {
            "cli_telemetry": cli_telemetry,
            "cli_telemetry_collected": dict(collections.Counter(collected)),
            "cli_telemetry_median_s": round(median, 4),
            "cli_telemetry_extra_s": round(median - statistics.median(spawnkit_s), 4),
            "cli_telemetry_s": [round(x, 4) for x in telemetry_s],
            **telemetry_cpu(cpu["spawnkit"], cpu["telemetry"]),
        }
    version = {"cli_version": asyncio.run(adapter.binary_version()), "rounds": rounds}
    sdk: dict[str, Any] = {}
    if sdk_s:
        ratio = "sdk_ratio" if alt == "bare_sdk" else "native_ratio"
        sdk = {
            f"{alt}_median_s": round(statistics.median(sdk_s), 4),
            ratio: round(statistics.median(spawnkit_s) / statistics.median(sdk_s), 3),
            f"{alt}_s": [round(x, 4) for x in sdk_s],
        }
    if telemetry_only:
        return {**version, "spawnkit_median_s": round(statistics.median(spawnkit_s), 4),
                "spawnkit_s": [round(x, 4) for x in spawnkit_s], **cpu_figures(cpu),
                **telemetry}  # fmt: skip
    against_second = {}  # spawnkit against the second baseline, round by round
    if sdk_s:
        second = {alt: sdk_s, "spawnkit": spawnkit_s}
        against_second[f"paired_vs_{alt}"] = paired_sides(second, cpu, alt, TARGET)
    through: dict[str, Any] = {}
    if via_sdk_s:  # --print against the SDK's way, both through spawnkit
        ways = {"through_sdk": via_sdk_s, "spawnkit": spawnkit_s}
        against_second["paired_vs_through_sdk"] = paired_sides(ways, cpu, "through_sdk", TARGET)
        through = {
            "through_sdk_median_s": round(statistics.median(via_sdk_s), 4),
            "through_sdk_ratio": round(statistics.median(via_sdk_s) / statistics.median(bare_s), 3),
            "through_sdk_s": [round(x, 4) for x in via_sdk_s],
        }
    walls = {"bare": bare_s, "spawnkit": spawnkit_s, "host_network": host_s,
             "unsandboxed": open_s, **({alt: sdk_s} if sdk_s else {}),
             **({"through_sdk": via_sdk_s} if via_sdk_s else {})}  # fmt: skip
    return {
        **version,
        # Round by round, with a 95 % interval: what says whether the target is met.
        "paired": paired_sides(walls, cpu, "bare", TARGET),
        **against_second,
        "bare_median_s": round(statistics.median(bare_s), 4),
        "spawnkit_median_s": round(statistics.median(spawnkit_s), 4),
        "ratio": round(statistics.median(spawnkit_s) / statistics.median(bare_s), 3),
        "host_network_median_s": round(statistics.median(host_s), 4),
        "host_network_ratio": round(statistics.median(host_s) / statistics.median(bare_s), 3),
        "unsandboxed_median_s": round(statistics.median(open_s), 4),
        "unsandboxed_ratio": round(statistics.median(open_s) / statistics.median(bare_s), 3),
        **cpu_figures(cpu),
        "bare_s": [round(x, 4) for x in bare_s],
        "spawnkit_s": [round(x, 4) for x in spawnkit_s],
        "host_network_s": [round(x, 4) for x in host_s],
        "unsandboxed_s": [round(x, 4) for x in open_s],
        **sdk,
        **through,
        **telemetry,
    }


class _ThroughSdk(ClaudeCodeAdapter):
    """Claude Code's adapter with every run driven through ``claude_agent_sdk.query()``."""

    def print_command(self, spec: RunSpec) -> list[str] | None:
        return None


# CPU time of this process and every process it starts, sandboxed ones included (a pid
# namespace's processes are not reaped through us: getrusage never sees them). None (the
# figures left out) where no cgroup can be made.
accounting = CpuCounter(name="spawnkit-bench")
# Its cgroup goes when the process ends, however it ends (a failed run raises SystemExit).
atexit.register(accounting.close)


def cpu_figures(cpu: dict[str, list[tuple[float, float]]]) -> dict[str, float | None]:
    """Median CPU seconds per run, each side: in the CLI's processes (None where no cgroup
    could be made), and in this process (servers, spawner, parsing); the CLI's ratio."""
    figures: dict[str, float | None] = {}
    for side, samples in cpu.items():
        children = [c for c, _ in samples if not math.isnan(c)]
        figures[f"{side}_child_cpu_s"] = (
            round(statistics.median(children), 4) if len(children) == len(samples) else None
        )
        figures[f"{side}_own_cpu_s"] = round(statistics.median(o for _, o in samples), 4)
    if "bare" not in cpu:  # --telemetry-only
        return figures
    bare, ours = figures["bare_child_cpu_s"], figures["spawnkit_child_cpu_s"]
    figures["child_cpu_ratio"] = round(ours / bare, 3) if bare and ours is not None else None
    # Everything a run costs the machine: the CLI's processes and this process, each side.
    totals = {side: (figures[f"{side}_child_cpu_s"], figures[f"{side}_own_cpu_s"]) for side in cpu}
    for side, (children, own) in totals.items():
        figures[f"{side}_total_cpu_s"] = None if children is None else round(children + own, 4)
    bare_total = figures["bare_total_cpu_s"]
    for side in cpu:
        total = figures[f"{side}_total_cpu_s"]
        if side != "bare":
            figures[f"{side}_total_cpu_ratio"] = (
                round(total / bare_total, 3) if bare_total and total is not None else None
            )
    return figures


def telemetry_cpu(off: list[tuple[float, float]], on: list[tuple[float, float]]) -> dict[str, Any]:
    """What the CLI's telemetry adds to a run's CPU: each round's difference (on minus off,
    in the CLI's processes and in this process), their medians and spread, and the median
    total difference as a share of the median run's CPU without it. None where no cgroup."""
    pairs = list(zip(off, on, strict=True))
    child = [b[0] - a[0] for a, b in pairs]
    own = [b[1] - a[1] for a, b in pairs]
    figures: dict[str, Any] = {
        "cli_telemetry_extra_own_cpu_s": round(statistics.median(own), 4),
        "cli_telemetry_extra_own_cpu_spread_s": [round(min(own), 4), round(max(own), 4)],
    }
    if any(math.isnan(c) for c, _ in off + on):
        return {**figures, "cli_telemetry_extra_child_cpu_s": None, "cli_telemetry_cpu_share": None}
    total = [c + o for c, o in zip(child, own, strict=True)]
    run_cpu = statistics.median(c + o for c, o in off)
    return {
        **figures,
        "cli_telemetry_extra_child_cpu_s": round(statistics.median(child), 4),
        "cli_telemetry_extra_child_cpu_spread_s": [round(min(child), 4), round(max(child), 4)],
        "cli_telemetry_extra_cpu_s": round(statistics.median(total), 4),
        "cli_telemetry_cpu_share": round(statistics.median(total) / run_cpu, 3),
    }


def print_paired(runtime: str, result: dict[str, Any]) -> None:
    """Round by round: each figure against its baseline, its 95 % interval and verdict."""
    for key, against in (("paired", "the bare CLI"), ("paired_vs_bare_sdk", "the SDK alone"),
                         ("paired_vs_bare_native", "the native binary"),
                         ("paired_vs_through_sdk", "spawnkit through the SDK")):  # fmt: skip
        for side, figure in result.get(key, {}).items():
            parts = [f"{kind} x{f['median']} [{f['ci95'][0]}, {f['ci95'][1]}] {f['verdict']}"
                     for kind, f in figure.items()]  # fmt: skip
            print(f"{runtime}: {side} against {against}, round by round: {'; '.join(parts)}")


def print_telemetry(runtime: str, result: dict[str, Any]) -> None:
    print(
        f"{runtime}: with CLI telemetry on ({result['cli_telemetry']}), median "
        f"{result['cli_telemetry_median_s']:.3f} s: {result['cli_telemetry_extra_s']:+.3f} s per "
        f"run; CPU per run {result.get('cli_telemetry_extra_child_cpu_s')} s more in the CLI's "
        f"processes, {result['cli_telemetry_extra_own_cpu_s']} s in ours: "
        f"+{result.get('cli_telemetry_cpu_share')} of a run's CPU (target <= 0.10)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runtimes", default="claude-code,codex,gemini")
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    parser.add_argument(
        "--cli-telemetry", nargs="?", const=True, default=False, metavar="CHOICE",
        help="also time runs with the CLI's own telemetry on (the extra seconds and CPU per "
        'run); CHOICE as Spawner(cli_telemetry=...) takes it ("all", "logs", "logs+traces@0.1"; '
        "none: each runtime's default set)",
    )  # fmt: skip
    parser.add_argument(
        "--telemetry-only", action="store_true",
        help="with --cli-telemetry: only spawnkit with and without it (no bare CLI)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.telemetry_only and not args.cli_telemetry:
        parser.error("--telemetry-only needs --cli-telemetry")
    out = args.out or (TELEMETRY_RESULTS if args.cli_telemetry else RESULTS)

    work = Path(tempfile.mkdtemp(prefix="spawnkit-bench-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    os.environ["HOME"] = str(work / "home")
    os.environ["SPAWNKIT_HOME"] = str(work / "spawnkit")
    (work / "home").mkdir()
    report: dict[str, Any] = {
        "benchmark": "spawn_overhead", "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()], "runtimes": {},
    }  # fmt: skip
    for runtime in args.runtimes.split(","):
        result = measure(runtime, args.rounds, work, args.cli_telemetry, args.telemetry_only)
        report["runtimes"][runtime] = result
        if args.telemetry_only:
            print_telemetry(runtime, result)
            continue
        print(
            f"{runtime}: bare CLI median {result['bare_median_s']:.3f} s, spawnkit median "
            f"{result['spawnkit_median_s']:.3f} s, ratio {result['ratio']:.3f} over "
            f"{args.rounds} rounds (target <= 1.05; on the host's network, without the "
            f"namespace: {result['host_network_median_s']:.3f} s, "
            f"x{result['host_network_ratio']:.3f} the bare CLI; without the sandbox "
            f"x{result['unsandboxed_ratio']:.3f}); "
            "CPU per run in the CLI's processes "
            f"{result['bare_child_cpu_s']} vs {result['spawnkit_child_cpu_s']} s "
            f"(x{result['child_cpu_ratio']}), in ours {result['bare_own_cpu_s']} vs "
            f"{result['spawnkit_own_cpu_s']} s; all CPU x{result['spawnkit_total_cpu_ratio']}",
            flush=True,
        )
        print_paired(runtime, result)
        if "sdk_ratio" in result:
            print(
                f"{runtime}: against the CLI driven by claude_agent_sdk.query() without "
                f"spawnkit, median {result['bare_sdk_median_s']:.3f} s: ratio "
                f"{result['sdk_ratio']:.3f} (CPU per run in the CLI's processes "
                f"{result['bare_sdk_child_cpu_s']} s, all CPU "
                f"{result['bare_sdk_total_cpu_s']} s against spawnkit's "
                f"{result['spawnkit_total_cpu_s']} s)",
                flush=True,
            )
        if "native_ratio" in result:
            print(
                f"{runtime}: against the program its launcher starts, run directly as "
                f"spawnkit runs it, median {result['bare_native_median_s']:.3f} s: ratio "
                f"{result['native_ratio']:.3f} (all CPU {result['bare_native_total_cpu_s']} s "
                f"against spawnkit's {result['spawnkit_total_cpu_s']} s, "
                f"x{result['bare_native_total_cpu_ratio']} the bare CLI's as installed)",
                flush=True,
            )
        if args.cli_telemetry:
            print_telemetry(runtime, result)
    accounting.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    report["load_average"] += [round(x, 2) for x in os.getloadavg()]  # at the start and the end
    out.write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
