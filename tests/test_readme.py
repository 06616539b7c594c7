"""The README, top to bottom, as a pip user meets it: every code block runs as written.

spawnkit is installed from its wheel (tests/wheel_venv.py) and the blocks run in document
order in one empty folder, with a HOME and SPAWNKIT_HOME of their own, no model key, and
no node CLI on PATH: the state one block leaves (the roster ``spawnkit init`` made, the
sessions, the installed CLIs) is what the next one finds. ``sh`` blocks run with bash
(``set -euo pipefail``), ``python`` blocks with the wheel's Python, ``ipython`` blocks in
an IPython shell, and a ``toml`` block must load as a butler. ``text`` blocks are output.

A comment before a block says what it needs, and the test stands in for it:

* ``<!-- readme-test: needs=key -->``: a model key. The model is spawnkit's replay server
  (``spawnkit replay serve`` on the roster's scenario), named as the ``general`` butler's
  ``base_url``; the keys are placeholders (a piped one for ``credentials set``).
* ``<!-- readme-test: needs=npm -->``: ``spawnkit install-clis`` is replaced by a link from
  ``$SPAWNKIT_HOME/clis/node_modules`` to the checkout's ``node_modules`` (``npm ci`` of
  the same package-lock.json); tests/test_install_clis.py runs the real one.
* ``<!-- readme-test: skip="why" -->``: not run, and counted; the reason is required.

A block that fails, or a block of another language with no mark, fails the test.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import textwrap
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spawnkit.config.roster import load_roster

from .conftest import REPO
from .wheel_venv import wheel_venv

pytestmark = pytest.mark.e2e

README = REPO / "README.md"
_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?^```(?P<lang>[a-z]*)\n(?P<code>.*?)^```",
    re.S | re.M,
)
RUNS = {"sh", "python", "ipython", "toml"}
SHOWN = {"text"}
SCENARIO = "roster/general/scenarios/assistant.toml"


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    code: str
    needs: str | None
    skip: str | None

    @property
    def name(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def readme_blocks() -> list[Block]:
    text = README.read_text()
    blocks = []
    for match in _BLOCK.finditer(text):
        mark = match["mark"] or ""
        needs = re.search(r"needs=(\w+)", mark)
        skip = re.search(r'skip="([^"]+)"', mark)
        line = text.count("\n", 0, match.start("lang")) + 1
        blocks.append(
            Block(line, match["lang"], match["code"], needs and needs[1], skip and skip[1])
        )
    return blocks


BLOCKS = readme_blocks()


def test_every_block_is_run_shown_or_skipped_with_a_reason() -> None:
    unmarked = [b.name for b in BLOCKS if b.lang not in RUNS | SHOWN and not b.skip]
    assert not unmarked, f"blocks of no known kind and no readme-test mark: {unmarked}"
    assert {b.needs for b in BLOCKS} <= {None, "key", "npm"}


def test_the_butler_toml_shown_loads_as_a_butler(tmp_path: Path) -> None:
    (shown,) = [b for b in BLOCKS if b.lang == "toml"]
    folder = tmp_path / "roster" / tomllib.loads(shown.code)["butler"]["name"]
    folder.mkdir(parents=True)
    (folder / "butler.toml").write_text(shown.code)
    (folder / "CLAUDE.md").write_text("You are a test butler.")
    butler = load_roster(tmp_path / "roster")["general"]
    assert butler.limits.max_cost_usd == 0.5 and butler.runtime.max_concurrent_sessions == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Reader:
    """The pip user: a wheel's venv, an empty folder, a fresh home; runs blocks in order."""

    def __init__(self, venv: Path, root: Path) -> None:
        self.venv, self.work, home = venv, root / "work", root / "home"
        self.work.mkdir()
        home.mkdir()
        system = [p for p in os.environ["PATH"].split(os.pathsep) if "node_modules" not in p
                  and not p.startswith(str(REPO))]  # fmt: skip
        self.env = {
            "PATH": os.pathsep.join([str(venv / "bin"), *system]),
            "HOME": str(home),
            "SPAWNKIT_HOME": str(home / ".spawnkit"),
            "NO_COLOR": "1",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        }
        self.model: subprocess.Popen[bytes] | None = None

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        env, stdin, code = dict(self.env), None, block.code
        if block.needs == "key":
            env.update(self.stand_in_model())
            stdin = "sk-ant-readme-test-placeholder\n"
        if block.needs == "npm":
            code = self.stand_in_install_clis() + code
        argv = {
            "sh": ["bash", "-euo", "pipefail", "-c", code],
            "python": [str(self.venv / "bin" / "python"), "-W", "error::DeprecationWarning",
                       "-c", code],
            "ipython": [str(self.venv / "bin" / "python"), "-c", IPYTHON.format(cell=code)],
        }[block.lang]  # fmt: skip
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=300, check=False,
            cwd=self.work, env=env,
        )  # fmt: skip

    def stand_in_install_clis(self) -> str:
        """A shell function that links the checkout's pinned CLIs where install-clis puts them."""
        target = Path(self.env["SPAWNKIT_HOME"]) / "clis"
        return textwrap.dedent(f"""\
            spawnkit() {{
              if [ "$1" = install-clis ]; then
                mkdir -p {target} && ln -sfn {REPO / "node_modules"} {target}/node_modules
              else command spawnkit "$@"; fi
            }}
            """)

    def stand_in_model(self) -> dict[str, str]:
        """The replay server as the real API: the butler's base_url, placeholder keys."""
        if self.model is None:
            port = _free_port()
            self.model = subprocess.Popen(
                [str(self.venv / "bin" / "spawnkit"), "replay", "serve", SCENARIO, "--port",
                 str(port)], cwd=self.work, env=self.env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while not _listening(port):
                assert time.monotonic() < deadline and self.model.poll() is None
                time.sleep(0.1)
            toml = self.work / "roster" / "general" / "butler.toml"
            text = toml.read_text()
            assert "[butler.runtime]\n" in text
            toml.write_text(text.replace(
                "[butler.runtime]\n", f'[butler.runtime]\nbase_url = "http://127.0.0.1:{port}"\n'
            ))  # fmt: skip
        return {"OPENAI_API_KEY": "sk-readme-test-placeholder",
                "GEMINI_API_KEY": "readme-test-placeholder"}  # fmt: skip

    def close(self) -> None:
        if self.model is not None:
            self.model.terminate()
            self.model.wait(30)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# An IPython shell, as in terminal IPython: the extension loaded, then the README's cell.
IPYTHON = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
for cell in ("%load_ext spawnkit", {cell!r}):
    result = ip.run_cell(cell)
    result.raise_error()
"""


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    root = tmp_path_factory.mktemp("readme")
    reader = Reader(wheel_venv(REPO, root), root)
    yield reader
    reader.close()


# The whole README is one test (each block needs what the ones before it left): about 90
# CPU-s of runs, servers and a wheel build, which took 181 s of wall with three test
# workers on two cores, past the suite's 180 s default.
@pytest.mark.timeout(900)
def test_the_readme_runs_top_to_bottom_from_the_wheel(reader: Reader) -> None:
    failed, ran, skipped = [], [], []
    for block in BLOCKS:
        if block.skip:
            skipped.append(block.name)
            continue
        if block.lang not in RUNS - {"toml"}:
            continue
        done = reader.run(block)
        ran.append(block.name)
        noise = [w for w in ("Traceback", "Task was destroyed", "error:") if w in done.stderr]
        if done.returncode != 0 or noise:
            failed.append(f"{block.name} exit {done.returncode} {noise}\n{block.code}\n"
                          f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}")  # fmt: skip
    print(f"README: {len(ran)} blocks ran, {len(skipped)} skipped: {skipped}")
    assert not failed, "\n\n".join(failed)
    assert len(ran) >= 10 and len(skipped) <= 6, (ran, skipped)
