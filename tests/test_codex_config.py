"""The Codex run config carries the system prompt as a TOML string written at C speed.

:func:`spawnkit.runtimes.codex.toml_string` replaces tomli_w for the one long value; any
text must read back from the file exactly as it was, control characters and all.
"""

from __future__ import annotations

import random
import tomllib

import pytest

from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.runtimes.codex import toml_string
from spawnkit.serve.service import ButlerService

from .conftest import REPO

TRICKY = [
    "",
    'quote " backslash \\ and a closing """',
    "new\nline, tab\t, return\r, form feed\f, backspace\b",
    "NUL \x00, unit separator \x1f, DEL \x7f, C1 \x85",
    "line separators \u2028 \u2029, BOM \ufeff, astral 😀 𝄞",
    "a TOML-looking line\n[table]\nkey = 'value'\n",
]


@pytest.mark.parametrize("text", TRICKY)
def test_a_tricky_prompt_reads_back_exactly(text: str) -> None:
    assert tomllib.loads(f"developer_instructions = {toml_string(text)}\n") == {
        "developer_instructions": text
    }


def test_any_unicode_text_reads_back_exactly() -> None:
    chars = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    pick = random.Random(7)
    for _ in range(50):
        text = "".join(chr(pick.choice(chars)) for _ in range(pick.randrange(1, 400)))
        assert tomllib.loads(f"k = {toml_string(text)}")["k"] == text


LIST_SKILLS = """
[[turn]]
shell = "find \\"$CODEX_HOME\\" -path '*skills*' | wc -l; ls -A \\"$CODEX_HOME\\""
usage = { input_tokens = 10, output_tokens = 1 }
[[turn]]
text = "The shell said: {{ last_tool_result }}"
usage = { input_tokens = 10, output_tokens = 1 }
"""


@pytest.mark.e2e
@pytest.mark.skipif(not (REPO / "node_modules" / ".bin" / "codex").exists(), reason="no codex")
async def test_a_codex_run_gets_none_of_codexs_bundled_skills(make_butler, store) -> None:
    """Codex writes its bundled skills (72 files) into a fresh home unless told not to:
    a run's own shell finds no skills folder in its CODEX_HOME."""
    server = ReplayServer(Scenario.from_dict(tomllib.loads(LIST_SKILLS), source="<test>"))
    butler = with_runtime(make_butler(), "codex")
    async with ButlerService(butler, store=store, replay=server, model="replay-model") as svc:
        result = await svc.trigger("list your skills")
    assert result.success, result.error
    said = result.output.removeprefix("The shell said:").split()
    assert said[0] == "0", result.output
    assert "config.toml" in said and "skills" not in said, said
