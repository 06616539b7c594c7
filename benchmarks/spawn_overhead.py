"""What spawnkit adds on top of the bare CLI: the same scenario both ways, in one run.

Both sides run the same Claude Code binary against the same replay model server
and the same butler MCP server (each on its own thread), with the same system
prompt, tools and MCP configuration; the scenario makes one real MCP tool call.

* bare: ``claude -p PROMPT --output-format stream-json --verbose ...`` as a
  subprocess, output read to the end.
* spawnkit: ``Spawner.trigger(PROMPT)``: admission, session record, workspace,
  isolated environment, system prompt composition, telemetry span, the SDK,
  event parsing, cleanup.

Rounds alternate between the two (after one warm-up each) so drift on a shared
machine hits both alike; the figure is the ratio of the medians. Usage::

    .venv/bin/python benchmarks/spawn_overhead.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from spawnkit._asgi import serve_in_thread
from spawnkit.butler_server import ButlerServer
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.roster import load_roster
from spawnkit.runtimes.claude_code import ClaudeCodeAdapter
from spawnkit.spawner import Spawner
from spawnkit.store import SessionStore
from spawnkit.system_prompt import compose_system_prompt, read_prompt_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "spawn_overhead.json"
PROMPT = "What is my weight?"
SCENARIO = """
[[turn]]
tool = "mcp__*__state_get"
input = { key = "measurements/weight" }
[[turn]]
text = "Your weight log: {{ last_tool_result }}"
"""


def bare_command(binary: Path, system_prompt: str, mcp_config: Path, butler: str) -> list[str]:
    tools = ["Bash", "Read", "Glob", "Grep"]
    return [
        str(binary), "-p", PROMPT, "--output-format", "stream-json", "--verbose",
        "--system-prompt", system_prompt, "--tools", ",".join(tools),
        "--allowedTools", ",".join([*tools, f"mcp__{butler}"]), "--permission-mode", "dontAsk",
        "--max-turns", "20", "--mcp-config", str(mcp_config), "--strict-mcp-config",
        "--setting-sources=",
    ]  # fmt: skip


def run_bare(command: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    last = json.loads(done.stdout.strip().splitlines()[-1])
    if done.returncode != 0 or last.get("is_error") or "measurements/weight" not in last["result"]:
        raise SystemExit(f"bare CLI run failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    return elapsed


async def run_spawnkit(spawner: Spawner) -> float:
    start = time.perf_counter()
    result = await spawner.trigger(PROMPT)
    elapsed = time.perf_counter() - start
    if not result.success or "measurements/weight" not in result.output:
        raise SystemExit(f"spawnkit run failed: {result.error} {result.output[:300]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="spawnkit-bench-"))
    os.environ["HOME"] = str(work / "home")
    os.environ["SPAWNKIT_HOME"] = str(work / "spawnkit")
    (work / "home").mkdir()
    butler = load_roster(ROOT / "roster")["health"]
    store = SessionStore(work / "sessions.db")
    adapter = ClaudeCodeAdapter(butler.runtime)
    binary = adapter.find_binary()
    replay = ReplayServer(Scenario.from_dict(tomllib.loads(SCENARIO), source="benchmark"))

    with (
        serve_in_thread(replay.app) as replay_address,
        serve_in_thread(ButlerServer(butler, store).app()) as mcp_address,
    ):
        os.environ["ANTHROPIC_API_KEY"] = "spawnkit-replay"
        spawner = Spawner(
            butler, store=store, base_url=replay_address.url, mcp_port=mcp_address.port
        )
        system_prompt = compose_system_prompt(
            butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
        )
        mcp_config = work / "mcp.json"
        mcp_config.write_text(
            json.dumps(
                {
                    "mcpServers": {
                        butler.name: {
                            "type": "http",
                            "url": f"http://localhost:{mcp_address.port}/mcp?session_id=bench",
                        }
                    }
                }
            )
        )
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ["HOME"],
            "ANTHROPIC_API_KEY": "spawnkit-replay",
            "ANTHROPIC_BASE_URL": replay_address.url,
            "ENABLE_TOOL_SEARCH": "false",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",
        }
        command = bare_command(binary, system_prompt, mcp_config, butler.name)

        runner = asyncio.Runner()
        bare: list[float] = []
        sk: list[float] = []
        run_bare(command, env, butler.directory)  # warm-up: first start in a fresh HOME
        runner.run(run_spawnkit(spawner))
        for _ in range(args.rounds):
            bare.append(run_bare(command, env, butler.directory))
            sk.append(runner.run(run_spawnkit(spawner)))
        runner.close()

    report = {
        "benchmark": "spawn_overhead",
        "runtime": "claude-code",
        "cli_version": adapter.binary_version(),
        "rounds": args.rounds,
        "bare_median_s": round(statistics.median(bare), 4),
        "spawnkit_median_s": round(statistics.median(sk), 4),
        "ratio": round(statistics.median(sk) / statistics.median(bare), 3),
        "bare_s": [round(x, 4) for x in bare],
        "spawnkit_s": [round(x, 4) for x in sk],
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"claude-code: bare CLI median {report['bare_median_s']:.3f} s, "
        f"spawnkit median {report['spawnkit_median_s']:.3f} s, "
        f"ratio {report['ratio']:.3f} over {args.rounds} rounds (target <= 1.05)"
    )


if __name__ == "__main__":
    main()
