"""Record real transcripts of Claude Code, Codex and Gemini CLI for the history tests' fixtures.

Each CLI runs for real, offline, in a throw-away HOME against spawnkit's replay model server
playing one scenario: text, a shell call that succeeds, one that fails, and (Claude Code) a
subagent and a response with two tool calls. What the CLIs wrote under their own folders is
copied to ``tests/fixtures/history/<cli>/`` unchanged, except that absolute temporary paths
are replaced by ``/fixture`` so the files are stable. The replay server sends no
``request-id`` header, which Claude Code records as ``requestId``; a small ASGI wrapper adds
one, as the real API does. Usage::

    .venv/bin/python benchmarks/record_cli_transcripts.py [--out tests/fixtures/history]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import claude_agent_sdk

from spawnkit._asgi import serve_in_thread
from spawnkit.replay import ReplayServer, Scenario

ROOT = Path(__file__).resolve().parent.parent
CLAUDE = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
CODEX = ROOT / "node_modules" / ".bin" / "codex"
GEMINI = ROOT / "node_modules" / ".bin" / "gemini"
TIMEOUT_S = 120
SCENARIO = """
[[script]]
match = "SUBTASK"
  [[script.turn]]
  text = "Sub agent listing."
  tool = "Bash"
  input = { command = "echo sub", description = "sub" }
  usage = { input_tokens = 300, output_tokens = 20, cache_read_input_tokens = 100 }
  [[script.turn]]
  text = "Sub agent done."
  usage = { input_tokens = 310, output_tokens = 10, cache_read_input_tokens = 120 }

[[script]]
match = "(?i)count"
  [[script.turn]]
  text = "Let me look."
  shell = "echo hello"
  usage = { input_tokens = 1200, output_tokens = 40, cache_read_input_tokens = 800 }
  [[script.turn]]
  shell = "exit 3"
  usage = { input_tokens = 1300, output_tokens = 30, cache_read_input_tokens = 900 }
  [[script.turn]]
  text = "Done: 2 words."
  usage = { input_tokens = 1500, output_tokens = 25, cache_read_input_tokens = 1100 }

[[script]]
match = "(?i)delegate"
  [[script.turn]]
  text = "Delegating."
  tool = "Agent"
  input = { description = "sub work", prompt = "SUBTASK please", subagent_type = "general-purpose" }
  usage = { input_tokens = 1400, output_tokens = 50, cache_read_input_tokens = 1000 }
  [[script.turn]]
  text = "Two tools in one."
  usage = { input_tokens = 1450, output_tokens = 45, cache_read_input_tokens = 1050 }
  [[script.turn.tool_calls]]
  tool = "Bash"
  input = { command = "echo a", description = "a" }
  [[script.turn.tool_calls]]
  tool = "Bash"
  input = { command = "echo b", description = "b" }
  [[script.turn]]
  text = "All done."
  usage = { input_tokens = 1500, output_tokens = 25, cache_read_input_tokens = 1100 }
"""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                Awaitable[None]]  # fmt: skip


def with_request_ids(app: ASGI) -> ASGI:
    """Add a ``request-id`` response header, as Anthropic's API does."""
    counter = itertools.count(1)

    async def wrapped(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request_id = f"req_fixture{next(counter):04d}".encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"request-id", request_id)]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_id)

    return wrapped


def run(command: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(
        command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({done.returncode}): {done.stderr[-1500:]}")


def base_env(tmp: Path) -> dict[str, str]:
    for name in ("home", "tmp", "work"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp / "home"),
            "TMPDIR": str(tmp / "tmp"), "NO_COLOR": "1"}  # fmt: skip


def record_claude(url: str, tmp: Path) -> Path:
    env = base_env(tmp) | {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "replay",
                           "ENABLE_TOOL_SEARCH": "false"}  # fmt: skip
    common = ["--output-format", "stream-json", "--verbose", "--setting-sources", "",
              "--permission-mode", "dontAsk", "--tools", "Bash,Agent",
              "--allowedTools", "Bash,Agent", "--system-prompt", "Be brief."]  # fmt: skip
    for prompt in ("count words please", "delegate some work"):
        run([str(CLAUDE), "-p", prompt, *common], env, tmp / "work")
    return tmp / "home" / ".claude"


def record_codex(url: str, tmp: Path) -> Path:
    env = base_env(tmp)
    home = tmp / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(f"""
model = "replay-model"
model_provider = "replay"
approval_policy = "never"
sandbox_mode = "danger-full-access"
[model_providers.replay]
name = "replay"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "REPLAY_API_KEY"
request_max_retries = 0
stream_max_retries = 0
[features]
plugins = false
apps = false
remote_plugin = false
unbounded_connection_retries = false
[analytics]
enabled = false
""")
    env |= {"CODEX_HOME": str(home), "REPLAY_API_KEY": "replay"}
    run([str(CODEX), "exec", "--json", "--skip-git-repo-check", "count words please"], env,
        tmp / "work")  # fmt: skip
    return home


def record_gemini(url: str, tmp: Path) -> Path:
    env = base_env(tmp)
    home = tmp / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
                "general": {"retryFetchErrors": False, "maxAttempts": 1,
                            "disableAutoUpdate": True}}  # fmt: skip
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    env |= {"GEMINI_CLI_HOME": str(home), "GEMINI_API_KEY": "replay",
            "GOOGLE_GEMINI_BASE_URL": url, "GEMINI_CLI_TRUST_WORKSPACE": "true"}  # fmt: skip
    run([str(GEMINI), "-m", "gemini-2.5-flash", "-p", "count words please", "--output-format",
         "stream-json", "--yolo"], env, tmp / "work")  # fmt: skip
    return home / ".gemini"


def copy_transcripts(source: Path, dest: Path, patterns: list[str], tmp: Path) -> list[Path]:
    copied = []
    for pattern in patterns:
        for path in sorted(source.glob(pattern)):
            rel = path.relative_to(source)
            rel = Path(str(rel).replace(str(tmp).replace("/", "-"), "-fixture"))
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text(encoding="utf-8").replace(str(tmp), "/fixture")
            target.write_text(text, encoding="utf-8")
            copied.append(target)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "history")
    args = parser.parse_args(argv)
    scenario = Scenario.from_dict(tomllib.loads(SCENARIO), source="fixtures.toml")
    server = ReplayServer(scenario)
    with (
        tempfile.TemporaryDirectory(prefix="spawnkit-fixtures-") as raw_tmp,
        serve_in_thread(
            with_request_ids(server.app)  # type: ignore[arg-type]
        ) as address,
    ):
        tmp = Path(raw_tmp)
        url = f"http://{address.host}:{address.port}"
        jobs = [("claude", record_claude, ["projects/**/*.jsonl"]),
                ("codex", record_codex, ["sessions/**/rollout-*.jsonl"]),
                ("gemini", record_gemini, ["tmp/*/chats/session-*"])]  # fmt: skip
        for name, record, patterns in jobs:
            folder = tmp / name
            folder.mkdir()
            root = record(url, folder)
            dest = args.out / name
            shutil.rmtree(dest, ignore_errors=True)
            for path in copy_transcripts(root, dest, patterns, folder):
                print(f"{name}: {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
