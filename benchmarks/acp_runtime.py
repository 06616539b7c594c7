"""What the ``acp`` runtime adds on top of driving the same ACP agent directly, in one run.

For each known agent (``gemini --acp``, ``claude-code-acp``, ``codex-acp``) both sides
run the same agent binary against the same replay model server and the same butler MCP
server (each on its own thread), and the scenario makes one real MCP tool call.

* direct: the agent as a plain subprocess (its own process group, killed at the end),
  driven by the ACP SDK's own client (``acp.ClientSideConnection``): ``initialize``,
  ``session/new`` with the butler's MCP server, ``session/prompt``, every permission
  allowed. Its files and environment are exactly the ones the acp runtime's preset
  writes for a run (settings, config, system prompt), in a fresh folder each round.
  Where the agent writes a transcript the session resumes from (claude-code-acp), the
  direct client, as spawnkit does, kills it only once the transcript holds the turn:
  killed at once, the last line is lost and the session does not resume whole.
* direct, killed at once (only for such agents): the same without that wait, the floor.
* spawnkit: ``Spawner.trigger(PROMPT)`` of a butler with ``[butler.runtime] type = "acp"``:
  admission, record, workspace, sandbox and its network namespace, relay, isolated
  environment, the ACP client, events, cleanup.

Rounds alternate between the sides (after one warm-up each), each round starting one side
later than the one before (use a multiple of the number of sides as ``--rounds``); the
figure is the ratio of the medians, with CPU seconds per run counted as
benchmarks/spawn_overhead.py counts them (a cgroup). Usage::

    .venv/bin/python benchmarks/acp_runtime.py [--rounds 6] [--agents gemini,claude-code-acp]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import acp
from acp.schema import AllowedOutcome, HttpHeader, HttpMcpServer, RequestPermissionResponse

from spawnkit._asgi import serve_in_thread
from spawnkit.config.roster import load_roster
from spawnkit.config.system_prompt import compose_system_prompt, read_prompt_file
from spawnkit.containment.mcp_access import AccessTable
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.run import Spawner
from spawnkit.runtimes import get_adapter
from spawnkit.runtimes.acp.client import transcript_written
from spawnkit.runtimes.acp.presets import AcpPreset
from spawnkit.runtimes.base import McpServerSpec, RunSpec
from spawnkit.serve.butler_server import ButlerServer
from spawnkit.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
# The same prompt, one-MCP-call scenario and replay key as the spawn-overhead benchmark.
from paired import paired_sides
from spawn_overhead import KEY, PROMPT, SCENARIO, TARGET, accounting, cpu_figures

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "acp_runtime.json"
AGENTS = {
    "gemini": ("gemini", "--acp"),
    "claude-code-acp": ("claude-code-acp",),
    "codex-acp": ("codex-acp",),
}


class DirectClient:
    """The ACP SDK's client side, as an application would write it: collect the text,
    allow every permission."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.answer: list[str] = []  # the text since the last tool call

    async def request_permission(
        self, options: list[Any], session_id: str, tool_call: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
        )

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk":
            self.text.append(getattr(update.content, "text", ""))
            self.answer.append(self.text[-1])
        elif kind == "tool_call":
            self.answer.clear()


def direct_side(
    agent: str,
    butler: Any,
    replay_url: str,
    mcp_port: int,
    work: Path,
    secret: str,
    keep_transcript: bool = True,
) -> tuple[Callable[[], Any], list[str | None]]:
    """One direct ACP prompt per call (the preset's files and env, the SDK's client), and
    the versions the agent gave in ``initialize``. ``keep_transcript``: before the agent
    is killed, wait (as spawnkit does) until its transcript holds the turn, where it
    writes one."""
    adapter = get_adapter("acp")(butler.runtime)
    preset = adapter.agent()
    binary = str(adapter.find_binary().resolve())
    system_prompt = compose_system_prompt(
        butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    )
    url = f"http://localhost:{mcp_port}/mcp?session_id=bench"
    versions: list[str | None] = []

    async def run() -> None:
        workspace = Path(tempfile.mkdtemp(prefix="direct-", dir=work))
        try:
            server = McpServerSpec(butler.name, "http", url, secret)
            spec = RunSpec(
                session_id="bench", butler=butler.name, prompt=PROMPT,
                system_prompt=system_prompt, workspace=workspace, cwd=workspace,
                mcp_server=server, config_file=preset.build_config_file(workspace),
                env={"PATH": os.environ["PATH"], "OPENAI_API_KEY": KEY, "GEMINI_API_KEY": KEY,
                     "ANTHROPIC_API_KEY": KEY},
                max_turns=20, tools=butler.runtime.tools, base_url=replay_url,
            )  # fmt: skip
            preset.prepare(spec)
            argv = preset.command(spec, binary)
            client = DirectClient()
            # Its own process group, killed at the end: the Gemini CLI relaunches itself as
            # a child that holds the pipes (the SDK's spawn_stdio_transport then never ends).
            proc = await asyncio.create_subprocess_exec(
                *argv, env=preset.env(spec), cwd=workspace, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True, limit=50 * 1024 * 1024,
            )  # fmt: skip
            assert proc.stdin is not None
            assert proc.stdout is not None
            try:
                conn = acp.connect_to_agent(client, proc.stdin, proc.stdout)
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                versions.append(init.agent_info.version if init.agent_info else None)
                mcp = HttpMcpServer(
                    type="http", name=butler.name, url=url,
                    headers=[HttpHeader(name="Authorization", value=f"Bearer {secret}")],
                )  # fmt: skip
                session = await conn.new_session(
                    cwd=str(workspace), mcp_servers=[mcp], **preset.session_meta(spec)
                )
                text = PROMPT if not preset.system_in_prompt else f"{system_prompt}\n\n{PROMPT}"
                await conn.prompt(session_id=session.session_id, prompt=[acp.text_block(text)])
                written = preset.transcript(spec, session.session_id)
                if keep_transcript and written is not None:
                    answer = "".join(client.answer)
                    await transcript_written(written, lambda line: preset.turn_logged(line, answer))
                await conn.close()
            finally:
                proc.stdin.close()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            if "measurements/weight" not in "".join(client.text):
                raise SystemExit(f"direct {agent} failed: {''.join(client.text)[:300]}")
        finally:
            shutil.rmtree(workspace, ignore_errors=True)

    return run, versions


def measure(agent: str, rounds: int, work: Path) -> dict[str, Any]:
    base = load_roster(ROOT / "roster")["health"]
    runtime = dataclasses.replace(base.runtime, type="acp", acp_command=AGENTS[agent])
    butler = dataclasses.replace(base, runtime=runtime)
    store = SessionStore(work / f"{agent}.db")
    replay = ReplayServer(Scenario.from_dict(tomllib.loads(SCENARIO), source="benchmark"))
    access = AccessTable()
    secret = asyncio.run(access.grant("bench"))
    cpu: dict[str, list[tuple[float, float]]] = {"bare": [], "spawnkit": [], "killed": []}
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
        direct, versions = direct_side(
            agent, butler, replay_address.url, mcp_address.port, work, secret
        )
        # The floor: the direct client that kills the agent as soon as the prompt returns
        # (only where the agent writes a transcript to wait for).
        writes_transcript = type(get_adapter("acp")(butler.runtime).agent()).transcript
        killed_at_once = None
        if writes_transcript is not AcpPreset.transcript:
            killed_at_once, _ = direct_side(
                agent, butler, replay_address.url, mcp_address.port, work, secret,
                keep_transcript=False,
            )  # fmt: skip

        async def through_spawnkit() -> None:
            result = await spawner.trigger(PROMPT)
            if not result.success or "measurements/weight" not in result.output:
                raise SystemExit(f"spawnkit {agent} failed: {result.error} {result.output[:300]}")

        runner = asyncio.Runner()

        def timed(run: Callable[[], Any], side: str | None = None) -> float:
            total, before, start = accounting.seconds(), time.process_time(), time.perf_counter()
            runner.run(run())
            wall, after = time.perf_counter() - start, time.process_time()
            if side:
                own = after - before
                children = float("nan")
                if total is not None:
                    children = (accounting.seconds() or 0.0) - total - own
                cpu[side].append((children, own))
            return wall

        timed(direct)  # warm-up: first starts
        timed(through_spawnkit)
        direct_s: list[float] = []
        spawnkit_s: list[float] = []
        killed_s: list[float] = []
        sides: list[tuple[Callable[[], Any], str, list[float]]] = [
            (direct, "bare", direct_s), (through_spawnkit, "spawnkit", spawnkit_s),
        ]  # fmt: skip
        if killed_at_once is not None:
            sides.append((killed_at_once, "killed", killed_s))
        for number in range(rounds):
            # Each round starts one side later than the one before: no side always runs
            # right after the same other one (what one leaves the kernel to tear down, a
            # network namespace, dying processes, runs into the next).
            shift = number % len(sides)
            for run, side, times in sides[shift:] + sides[:shift]:
                times.append(timed(run, side))
        runner.close()
    if not killed_s:
        del cpu["killed"]
    figures = cpu_figures(cpu)
    floor: dict[str, Any] = {}
    if killed_s:
        floor = {
            "killed_at_once_median_s": round(statistics.median(killed_s), 4),
            "ratio_to_killed_at_once": round(
                statistics.median(spawnkit_s) / statistics.median(killed_s), 3
            ),
            "killed_at_once_child_cpu_s": figures["killed_child_cpu_s"],
            "killed_at_once_s": [round(x, 4) for x in killed_s],
        }
    return {
        "agent_version": versions[-1],  # as the agent named itself in initialize
        "rounds": rounds,
        "direct_median_s": round(statistics.median(direct_s), 4),
        "spawnkit_median_s": round(statistics.median(spawnkit_s), 4),
        "ratio": round(statistics.median(spawnkit_s) / statistics.median(direct_s), 3),
        # Round by round, with a 95 % interval: what says whether the target is met.
        "paired": paired_sides({"bare": direct_s, "spawnkit": spawnkit_s}, cpu, "bare", TARGET)[
            "spawnkit"
        ],
        "direct_child_cpu_s": figures["bare_child_cpu_s"],
        "spawnkit_child_cpu_s": figures["spawnkit_child_cpu_s"],
        "child_cpu_ratio": figures["child_cpu_ratio"],
        "direct_own_cpu_s": figures["bare_own_cpu_s"],
        "spawnkit_own_cpu_s": figures["spawnkit_own_cpu_s"],
        "direct_s": [round(x, 4) for x in direct_s],
        "spawnkit_s": [round(x, 4) for x in spawnkit_s],
        **floor,
        "load_avg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spawnkit-bench-"))
    os.environ["HOME"] = str(work / "home")
    os.environ["SPAWNKIT_HOME"] = str(work / "spawnkit")
    (work / "home").mkdir()
    report: dict[str, Any] = {
        "benchmark": "acp_runtime", "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "agents": {},
    }  # fmt: skip
    for agent in args.agents.split(","):
        result = measure(agent, args.rounds, work)
        report["agents"][agent] = result
        print(
            f"{agent}: direct over ACP median {result['direct_median_s']:.3f} s, spawnkit "
            f"median {result['spawnkit_median_s']:.3f} s, ratio {result['ratio']:.3f} over "
            f"{args.rounds} rounds (target <= 1.05; load {result['load_avg']:.1f}); CPU per "
            f"run in the agent's processes {result['direct_child_cpu_s']} vs "
            f"{result['spawnkit_child_cpu_s']} s, in ours {result['direct_own_cpu_s']} vs "
            f"{result['spawnkit_own_cpu_s']} s"
            + (
                f"; against the agent killed as soon as it answers (its transcript's last line "
                f"lost) {result['ratio_to_killed_at_once']:.3f}"
                if "ratio_to_killed_at_once" in result
                else ""
            ),
            flush=True,
        )
        paired = result["paired"]
        print(f"{agent}: round by round: " + "; ".join(
            f"{kind} x{f['median']} [{f['ci95'][0]}, {f['ci95'][1]}] {f['verdict']}"
            for kind, f in paired.items()
        ))  # fmt: skip
    accounting.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
