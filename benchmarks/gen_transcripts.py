"""Synthetic Claude Code transcripts shaped like real ones, for the history benchmarks and tests.

The line shapes copy what Claude Code 2.1.330 writes under ``~/.claude/projects`` (see
``tests/fixtures/history/claude``): one line per content block of an API response, each
repeating the response's ``message.id``, ``requestId`` and usage (earlier lines of some
responses carry a partial ``output_tokens``, as streaming writers did); user lines with
``tool_result`` blocks and a ``toolUseResult`` copy; attachments, queue operations and
request shapes that a usage reader must skip. On top of that the corpus holds the traps the
readers must handle: subagent sidechain files under ``<session>/subagents/``, sidechain files
that replay parent responses with new request ids, in-file sidechain lines (Claude Code 1.x),
``<synthetic>`` error messages, cache writes split into 5-minute and 1-hour parts, inputs over
the 200k-token long-context tier, several models, sessions that cross midnight, and a few
truncated or garbage lines.

File sizes follow a log-normal law with a median near 100 KB and a tail to tens of MB.
Usage::

    python benchmarks/gen_transcripts.py OUT_DIR --size-mb 1000 [--seed 7]

writes ``OUT_DIR/projects/<escaped cwd>/<session>.jsonl``; point ``CLAUDE_CONFIG_DIR`` (or
``spawnkit.history.transcripts("claude", root=OUT_DIR)``) at ``OUT_DIR``.
"""

from __future__ import annotations

import argparse
import math
import random
import string
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

MEDIAN_FILE_BYTES = 150_000
SIGMA = 1.5
MAX_FILE_BYTES = 40_000_000
START = datetime(2026, 10, 1, tzinfo=UTC)
DAYS = 50

# (model, weight as a session's main model); tiered long-context pricing applies to sonnet-4-5.
MODELS = [
    ("claude-sonnet-4-5-20250929", 30),
    ("claude-opus-4-5-20251101", 20),
    ("claude-opus-4-6", 10),
    ("claude-sonnet-4-6", 15),
    ("claude-haiku-4-5-20251001", 10),
    ("claude-opus-4-1-20250805", 5),
    ("claude-sonnet-4-20250514", 10),
]
SIDE_MODEL = "claude-haiku-4-5-20251001"
VERSIONS = ["2.1.330", "2.1.330", "2.0.76", "1.0.98"]
TOOLS = ["Bash", "Read", "Edit", "Write", "Grep", "Glob", "TodoWrite", "WebFetch",
         "mcp__github__get_issue", "mcp__health__state_get", "Agent"]  # fmt: skip
PROJECTS = [
    "/home/dev/src/spawnkit", "/home/dev/src/webapp", "/home/dev/src/data-pipeline",
    "/home/dev/src/infra", "/home/dev/notes", "/home/dev/src/mobile-app",
    "/home/dev/src/ml-experiments", "/home/dev/src/docs-site", "/home/dev/src/cli-tool",
    "/home/dev/src/game", "/home/dev/work/client-a", "/home/dev/work/client-b",
]  # fmt: skip
B62 = string.ascii_letters + string.digits


def escape_cwd(cwd: str) -> str:
    """Claude Code's folder name for a working directory."""
    return "".join(c if c.isalnum() else "-" for c in cwd)


class Writer:
    """Builds one session (main file plus sidechain files) line by line."""

    def __init__(self, rng: random.Random, pool: str, target: int, root: Path) -> None:
        self.rng = rng
        self.pool = pool
        self.target = target
        self.session = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.cwd = rng.choice(PROJECTS)
        self.folder = root / "projects" / escape_cwd(self.cwd)
        self.version = rng.choice(VERSIONS)
        self.model = rng.choices([m for m, _ in MODELS], [w for _, w in MODELS])[0]
        offset = rng.random() * DAYS * 86400
        self.now = START + timedelta(seconds=offset)
        self.branch = rng.choice(["main", "HEAD", "feature/history", "fix/flaky-test"])
        self.lines: list[bytes] = []
        self.size = 0
        self.parent: str | None = None
        self.responses: list[list[bytes]] = []  # raw lines of each main-chain response

    # -- identifiers and text ------------------------------------------------------

    def ident(self, prefix: str, n: int) -> str:
        return prefix + "".join(self.rng.choices(B62, k=n))

    def text(self, n: int) -> str:
        start = self.rng.randrange(0, len(self.pool) - n - 1)
        return self.pool[start : start + n]

    def tick(self, low: float, high: float) -> str:
        self.now += timedelta(seconds=self.rng.uniform(low, high))
        return self.now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.now.microsecond // 1000:03d}Z"

    def base(self, kind: str, sidechain: bool, agent: str | None) -> dict[str, Any]:
        line: dict[str, Any] = {"parentUuid": self.parent, "isSidechain": sidechain}
        if agent:
            line["agentId"] = agent
        line.update(userType="external", cwd=self.cwd, sessionId=self.session,
                    version=self.version, gitBranch=self.branch, type=kind)  # fmt: skip
        return line

    def emit(self, out: list[bytes], line: dict[str, Any]) -> bytes:
        raw = msgspec.json.encode(line)
        out.append(raw)
        self.size += len(raw) + 1
        self.parent = line.get("uuid", self.parent)
        return raw

    # -- line kinds ------------------------------------------------------------------

    def user_prompt(
        self, out: list[bytes], sidechain: bool = False, agent: str | None = None
    ) -> None:
        line = self.base("user", sidechain, agent)
        line.update(message={"role": "user", "content": self.text(self.rng.randint(20, 600))},
                    uuid=str(uuid.uuid4()), timestamp=self.tick(5, 600),
                    promptId=str(uuid.uuid4()))  # fmt: skip
        self.emit(out, line)

    def attachment(self, out: list[bytes]) -> None:
        n = int(self.rng.lognormvariate(math.log(1500), 1.2))
        line = self.base("attachment", False, None)
        line.update(attachment={"type": "file", "content": self.text(min(n, 200_000))},
                    uuid=str(uuid.uuid4()), timestamp=self.tick(0, 0.05))  # fmt: skip
        self.emit(out, line)

    def noise(self, out: list[bytes]) -> None:
        kind = self.rng.random()
        ts = self.tick(0, 0.01)
        if kind < 0.4:
            line = {"type": "queue-operation", "operation": "enqueue", "timestamp": ts,
                    "sessionId": self.session, "content": self.text(80)}  # fmt: skip
        elif kind < 0.7 and self.version == "2.1.330":
            line = {"type": "api-request", "sessionId": self.session, "id": str(uuid.uuid4()),
                    "timestamp": ts, "version": self.version, "querySource": "sdk",
                    "params": {"model": self.model, "max_tokens": 128000},
                    "requestDigest": self.text(64)}  # fmt: skip
        elif kind < 0.85:
            line = {"type": "summary", "summary": self.text(60), "leafUuid": str(uuid.uuid4())}
        else:
            line = self.base("system", False, None)
            line.update(subtype="informational", content=self.text(120), level="info",
                        uuid=str(uuid.uuid4()), timestamp=ts)  # fmt: skip
        self.emit(out, line)

    def usage(self, model: str) -> dict[str, Any]:
        r = self.rng
        if model == "<synthetic>":
            return {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0}  # fmt: skip
        cache_read = 0 if r.random() < 0.1 else int(r.lognormvariate(math.log(40_000), 0.8))
        if model.startswith("claude-sonnet-4-5") and r.random() < 0.05:
            cache_read = r.randint(200_001, 600_000)  # a 1M-context request over the tier
        write = int(r.lognormvariate(math.log(2_000), 1.2)) if r.random() < 0.6 else 0
        one_hour = write if r.random() < 0.2 else 0
        usage: dict[str, Any] = {
            "input_tokens": r.randint(1, 60) if cache_read else r.randint(100, 20_000),
            "cache_creation_input_tokens": write,
            "cache_read_input_tokens": cache_read,
            "output_tokens": int(r.lognormvariate(math.log(300), 1.0)) + 1,
        }
        if r.random() < 0.02:
            usage["input_tokens"] = r.randint(200_001, 300_000)
        if self.version != "1.0.98":
            usage["cache_creation"] = {"ephemeral_5m_input_tokens": write - one_hour,
                                       "ephemeral_1h_input_tokens": one_hour}  # fmt: skip
            usage["service_tier"] = "standard"
            usage["server_tool_use"] = {"web_search_requests": 0, "web_fetch_requests": 0}
            usage["speed"] = "standard"
        return usage

    def response(
        self,
        out: list[bytes],
        sidechain: bool = False,
        agent: str | None = None,
        model: str | None = None,
        tool_bytes: int = 0,
    ) -> list[tuple[str, str]]:
        """One API response: 1-4 lines (thinking, text, tool uses); returns the tool calls."""
        r = self.rng
        model = model or (SIDE_MODEL if r.random() < 0.05 else self.model)
        usage = self.usage(model)
        blocks: list[dict[str, Any]] = []
        if r.random() < 0.3:
            blocks.append({"type": "thinking", "thinking": self.text(r.randint(50, 2000)),
                           "signature": self.text(200)})  # fmt: skip
        if r.random() < 0.7 or model == "<synthetic>":
            blocks.append({"type": "text", "text": self.text(r.randint(20, 1500))})
        calls: list[tuple[str, str]] = []
        if model != "<synthetic>":
            for _ in range(r.choice([0, 1, 1, 1, 1, 2, 3]) if blocks else 1):
                name = r.choice(TOOLS)
                call_id = self.ident("toolu_01", 22)
                calls.append((call_id, name))
                size = max(10, int(r.lognormvariate(math.log(150), 1.0)) + tool_bytes // 4)
                blocks.append({"type": "tool_use", "id": call_id, "name": name,
                               "input": {"command": self.text(min(size, 100_000)),
                                         "description": self.text(30)}})  # fmt: skip
        message_id = self.ident("msg_01", 22)
        request_id = self.ident("req_011C", 20)
        partial = r.random() < 0.3 and len(blocks) > 1 and usage["output_tokens"] > 1
        raws: list[bytes] = []
        for i, block in enumerate(blocks):
            line = self.base("assistant", sidechain, agent)
            block_usage = dict(usage)
            if partial and i < len(blocks) - 1:
                block_usage["output_tokens"] = r.randint(1, usage["output_tokens"] - 1)
            line.update(
                message={"id": message_id, "type": "message", "role": "assistant",
                         "model": model, "content": [block],
                         "stop_reason": "tool_use" if calls else "end_turn",
                         "stop_sequence": None, "usage": block_usage},
                requestId=request_id, uuid=str(uuid.uuid4()),
                timestamp=self.tick(0.5, 20) if i == 0 else self.tick(0.001, 0.3),
            )  # fmt: skip
            if model == "<synthetic>":
                line["isApiErrorMessage"] = True
            raws.append(self.emit(out, line))
        if not sidechain:
            self.responses.append(raws)
        return calls

    def results(
        self,
        out: list[bytes],
        calls: list[tuple[str, str]],
        tool_bytes: int,
        sidechain: bool = False,
        agent: str | None = None,
    ) -> None:
        r = self.rng
        for call_id, _name in calls:
            n = min(int(r.lognormvariate(math.log(700), 1.3)) + tool_bytes, 2_000_000)
            content = self.text(n // 2)
            error = r.random() < 0.06
            line = self.base("user", sidechain, agent)
            line.update(
                message={"role": "user", "content": [
                    {"tool_use_id": call_id, "type": "tool_result", "content": content,
                     "is_error": error}]},
                uuid=str(uuid.uuid4()), timestamp=self.tick(0.05, 30),
                toolUseResult={"stdout": content, "stderr": "", "interrupted": False,
                               "isImage": False} if not error else f"Error: {content[:200]}",
            )  # fmt: skip
            self.emit(out, line)

    # -- sessions --------------------------------------------------------------------

    def turn(self, out: list[bytes], tool_bytes: int) -> None:
        calls = self.response(out, tool_bytes=tool_bytes)
        self.results(out, calls, tool_bytes)
        spawned = any(name == "Agent" for _, name in calls)
        if spawned and self.subagents < 3 and self.rng.random() < 0.06:
            self.subagents += 1
            self.subagent()

    def subagent(self) -> None:
        agent = self.ident("a", 16).lower()
        lines: list[bytes] = []
        saved = self.parent, self.now
        self.parent = None
        self.user_prompt(lines, True, agent)
        for _ in range(self.rng.randint(1, 6)):
            calls = self.response(
                lines, True, agent, model=self.rng.choice([self.model, SIDE_MODEL])
            )
            self.results(lines, calls, 0, True, agent)
        self.response(lines, True, agent)
        self.parent, self.now = saved
        self.files.append((f"{self.session}/subagents/agent-{agent}.jsonl", lines))

    def replay_sidechain(self) -> None:
        """A /btw-style side chain: parent responses replayed with new request ids."""
        if not self.responses:
            return
        agent = self.ident("a", 16).lower()
        lines: list[bytes] = []
        for raws in self.rng.sample(self.responses, min(len(self.responses), 4)):
            request_id = self.ident("req_011C", 20)  # the replay's own request
            for raw in raws:
                line = msgspec.json.decode(raw)
                line.update(isSidechain=True, agentId=agent, requestId=request_id)
                self.emit(lines, line)
        saved = self.parent, self.now
        self.user_prompt(lines, True, agent)
        self.response(lines, True, agent)
        self.parent, self.now = saved
        self.files.append((f"{self.session}/subagents/agent-{agent}.jsonl", lines))

    def build(self) -> list[tuple[str, list[bytes]]]:
        r = self.rng
        self.files: list[tuple[str, list[bytes]]] = []
        self.subagents = 0
        main: list[bytes] = []
        self.noise(main)
        # Bigger sessions get bigger tool outputs, so turn counts stay plausible.
        tool_bytes = int(max(0, self.target - 400_000) / 400)
        while self.size < self.target:
            self.user_prompt(main)
            if r.random() < 0.5:
                for _ in range(r.randint(1, 4)):
                    self.attachment(main)
            for _ in range(r.randint(1, 12)):
                if r.random() < 0.15:
                    self.noise(main)
                self.turn(main, tool_bytes)
                if r.random() < 0.03:
                    self.response(main, True, None)  # a Claude Code 1.x in-file sidechain line
                if r.random() < 0.02:
                    self.response(main, model="<synthetic>")
            if r.random() < 0.05:
                self.now += timedelta(hours=r.uniform(1, 30))  # resumed later, maybe next day
        if r.random() < 0.1:
            self.replay_sidechain()
        if r.random() < 0.02:
            cut = main[-1]
            main[-1] = cut[: len(cut) // 2]  # the CLI was killed mid-write
        if r.random() < 0.01:
            main.insert(r.randrange(len(main)), b'{"type":"assistant","message":{"usage":{oops')
        self.files.insert(0, (f"{self.session}.jsonl", main))
        return self.files


def word_pool(rng: random.Random, size: int = 4_000_000) -> str:
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(5000)]
    words += ["\\n", "def", "return", "{", "}", "(x)", "==", "'quoted'", '"q"', "é", "→"]
    parts: list[str] = []
    total = 0
    while total < size:
        w = rng.choice(words)
        parts.append(w)
        total += len(w) + 1
    return " ".join(parts)


def generate(out: Path, size_mb: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    uuid_rng = random.Random(seed + 1)
    original_uuid4 = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=uuid_rng.getrandbits(128), version=4)  # deterministic
    try:
        pool = word_pool(rng)
        budget = int(size_mb * 1_000_000)
        written = files = sessions = 0
        while written < budget:
            target = min(
                MAX_FILE_BYTES, int(rng.lognormvariate(math.log(MEDIAN_FILE_BYTES), SIGMA))
            )
            target = max(2_000, min(target, budget - written + 2_000))
            writer = Writer(rng, pool, target, out)
            for rel, lines in writer.build():
                path = writer.folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                data = b"\n".join(lines) + b"\n"
                path.write_bytes(data)
                written += len(data)
                files += 1
            sessions += 1
    finally:
        uuid.uuid4 = original_uuid4
    return {"bytes": written, "files": files, "sessions": sessions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    stats = generate(args.out, args.size_mb, args.seed)
    print(
        f"wrote {stats['bytes'] / 1e6:.1f} MB in {stats['files']} files "
        f"({stats['sessions']} sessions) to {args.out} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
