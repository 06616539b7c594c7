"""Loading and validating butler.toml: defaults, every key, and errors that name file and key.

Each butler is written as real files under ``tmp_path`` and loaded the way the CLI and
the notebook load a roster; an error must name the file and the key so a user can fix it
without reading spawnkit's source.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

import spawnkit
from spawnkit.config.roster import DEFAULT_TOOLS, load_butler, load_roster
from spawnkit.errors import ConfigError, RosterError, UnknownRuntimeError
from spawnkit.run import Spawner
from spawnkit.store import SessionStore

from .conftest import REPO, RosterFactory
from .fakes import FakeAdapter

FULL = """
[butler]
name = "health"
port = 8201
description = "Keeps health records."
mcp_transport = "sse"

  [butler.runtime]
  type = "claude-code"
  model = "claude-haiku-4-5"
  base_url = "http://127.0.0.1:9999"
  max_turns = 7
  max_concurrent_sessions = 3
  max_queued_sessions = 0
  timeout_s = 12.5
  tools = ["Read", "Bash(git status)"]

  [butler.env]
  required = ["HEALTH_TOKEN"]
  optional = ["HEALTH_TZ", "_PRIVATE2"]

  [[butler.schedule]]
  name = "weekly_summary"
  cron = "0 8 * * 1"
  prompt = "Summarise the week."

  [[butler.schedule]]
  name = "nightly-check"
  cron = "30 2 * * *"
  prompt = "Check the logs."

[modules.memory]
max_tokens = 1500

[modules.calendar]
credentials = ["CAL_USER", "CAL_PASSWORD"]
"""

MINIMAL = """
[butler]
name = "{name}"
port = {port}
"""


def write_butler(
    roster: Path, folder: str, toml: str, prompt: str | None = "You are a butler."
) -> Path:
    """Write ``roster/<folder>/butler.toml`` (and CLAUDE.md unless ``prompt`` is None)."""
    directory = roster / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "butler.toml").write_text(textwrap.dedent(toml))
    if prompt is not None:
        (directory / "CLAUDE.md").write_text(prompt)
    return directory / "butler.toml"


def load_error(roster: Path, toml: str, folder: str = "health") -> tuple[Path, str]:
    """Write one butler, load the roster, and return (its butler.toml, the error message)."""
    path = write_butler(roster, folder, toml).resolve()
    with pytest.raises(RosterError) as info:
        load_roster(roster)
    assert info.value.path == path
    return path, str(info.value)


# -- valid butlers -------------------------------------------------------------------------


def test_every_key_is_read(tmp_path: Path) -> None:
    write_butler(tmp_path, "health", FULL)
    roster = load_roster(tmp_path)
    butler = roster["health"]
    assert (butler.name, butler.port, butler.description) == (
        "health", 8201, "Keeps health records.",
    )  # fmt: skip
    assert butler.mcp_transport == "sse" and butler.mcp_path == "/sse"
    r = butler.runtime
    assert (r.type, r.model, r.base_url) == (
        "claude-code", "claude-haiku-4-5", "http://127.0.0.1:9999",
    )  # fmt: skip
    assert (r.max_turns, r.max_concurrent_sessions, r.max_queued_sessions) == (7, 3, 0)
    assert r.timeout_s == 12.5 and isinstance(r.timeout_s, float)
    assert r.tools == ("Read", "Bash(git status)")
    assert butler.env.required == ("HEALTH_TOKEN",)
    assert butler.env.optional == ("HEALTH_TZ", "_PRIVATE2")
    assert [(s.name, s.cron, s.prompt) for s in butler.schedules] == [
        ("weekly_summary", "0 8 * * 1", "Summarise the week."),
        ("nightly-check", "30 2 * * *", "Check the logs."),
    ]
    assert dict(butler.modules["memory"]) == {"max_tokens": 1500}
    assert butler.module_credentials == ("CAL_USER", "CAL_PASSWORD")
    root = tmp_path.resolve()
    assert butler.directory == root / "health" and butler.roster_dir == root
    assert butler.config_file == root / "health" / "butler.toml"
    assert butler.system_prompt_file == root / "health" / "CLAUDE.md"
    assert roster.directory == root and roster.shared_dir == root / "shared"


def test_defaults_when_keys_are_omitted(make_butler: RosterFactory) -> None:
    butler = make_butler()
    assert butler.mcp_transport == "http" and butler.mcp_path == "/mcp"
    r = butler.runtime
    assert (r.type, r.model, r.base_url) == ("claude-code", None, None)
    assert (r.max_turns, r.max_concurrent_sessions, r.max_queued_sessions) == (20, 1, 100)
    assert r.timeout_s == 900.0
    assert r.tools == DEFAULT_TOOLS == ("Bash", "Read", "Glob", "Grep")
    assert (butler.env.required, butler.env.optional) == ((), ())
    assert butler.schedules == () and dict(butler.modules) == {}
    assert butler.module_credentials == () and butler.skills() == []


def test_description_defaults_to_empty(tmp_path: Path) -> None:
    write_butler(tmp_path, "health", MINIMAL.format(name="health", port=8201))
    assert load_roster(tmp_path)["health"].description == ""


def test_empty_model_means_the_cli_default(make_butler: RosterFactory) -> None:
    butler = make_butler(extra='[butler.runtime]\nmodel = ""\nbase_url = ""\n')
    assert (butler.runtime.model, butler.runtime.base_url) == (None, None)


def test_module_credentials_are_collected_in_module_order(make_butler: RosterFactory) -> None:
    butler = make_butler(
        extra="""
        [modules.mail]
        credentials = ["MAIL_USER", "MAIL_PASSWORD"]
        server = "imap.example.org"
        [modules.memory]
        max_tokens = 10
        [modules.bank]
        credentials = ["BANK_TOKEN"]
        """
    )
    assert butler.module_credentials == ("MAIL_USER", "MAIL_PASSWORD", "BANK_TOKEN")
    assert butler.modules["mail"]["server"] == "imap.example.org"


def test_skills_are_listed_sorted_without_files_or_hidden_dirs(
    make_butler: RosterFactory,
) -> None:
    butler = make_butler(
        files={
            "health/skills/zeta/SKILL.md": "# Z",
            "health/skills/alpha/SKILL.md": "# A",
            "health/skills/mid/run.py": "",
            "health/skills/.cache/x": "",
            "health/skills/README.md": "not a skill",
        }
    )
    assert [p.name for p in butler.skills()] == ["alpha", "mid", "zeta"]
    assert all(p.parent == butler.directory / "skills" for p in butler.skills())


def test_load_butler_alone_takes_the_parent_as_roster(tmp_path: Path) -> None:
    write_butler(tmp_path / "roster", "health", MINIMAL.format(name="health", port=8201))
    butler = load_butler(tmp_path / "roster" / "health")
    assert butler.roster_dir == (tmp_path / "roster").resolve()


def test_shared_draft_and_hidden_folders_and_files_are_skipped(tmp_path: Path) -> None:
    write_butler(tmp_path, "health", MINIMAL.format(name="health", port=8201))
    for skipped in ("shared", "_draft", ".hidden"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "notes.md").write_text("no butler.toml here")
    (tmp_path / "README.md").write_text("a file, not a butler")
    roster = load_roster(tmp_path)
    assert [b.name for b in roster] == ["health"] and len(roster) == 1


def test_butlers_are_sorted_by_folder(tmp_path: Path) -> None:
    for port, name in enumerate(["zed", "alpha", "mid"], start=8201):
        write_butler(tmp_path, name, MINIMAL.format(name=name, port=port))
    assert [b.name for b in load_roster(tmp_path)] == ["alpha", "mid", "zed"]


def test_example_roster_loads() -> None:
    roster = load_roster(REPO / "roster")
    assert sorted(b.name for b in roster) == ["general", "health", "relationship"]
    assert roster.shared_dir.is_dir()


# -- roster-level errors -------------------------------------------------------------------


def test_unknown_butler_lists_the_available_ones(tmp_path: Path) -> None:
    write_butler(tmp_path, "health", MINIMAL.format(name="health", port=8201))
    write_butler(tmp_path, "general", MINIMAL.format(name="general", port=8202))
    roster = load_roster(tmp_path)
    with pytest.raises(ConfigError) as info:
        roster["nope"]
    assert str(info.value) == (
        f"unknown butler 'nope' in roster {tmp_path.resolve()}; available: general, health"
    )


def test_unknown_butler_in_an_empty_roster(tmp_path: Path) -> None:
    roster = load_roster(tmp_path)
    with pytest.raises(ConfigError, match=r"available: none$"):
        roster["nope"]


def test_missing_roster_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_roster(tmp_path / "absent")
    assert not isinstance(info.value, RosterError)
    assert str(info.value) == f"roster directory not found: {(tmp_path / 'absent').resolve()}"


def test_folder_without_butler_toml_is_an_error(tmp_path: Path) -> None:
    write_butler(tmp_path, "health", MINIMAL.format(name="health", port=8201))
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "CLAUDE.md").write_text("orphan prompt")
    with pytest.raises(RosterError) as info:
        load_roster(tmp_path)
    assert str(info.value) == (
        f"{(tmp_path / 'stray').resolve()}: folder has no butler.toml "
        "(name it _<folder> to skip it)"
    )


def test_duplicate_port_names_both_butlers(tmp_path: Path) -> None:
    write_butler(tmp_path, "alpha", MINIMAL.format(name="alpha", port=8201))
    second = write_butler(tmp_path, "beta", MINIMAL.format(name="beta", port=8201))
    with pytest.raises(RosterError) as info:
        load_roster(tmp_path)
    assert str(info.value) == (
        f"{second.resolve()}: [butler.port]: port 8201 is already used by butler 'alpha'"
    )
    assert info.value.key == "butler.port"


def test_get_adapter_unknown_lists_registered_types() -> None:
    with pytest.raises(ValueError, match="available runtimes: acp, claude-code") as info:
        spawnkit.get_adapter("nope")
    assert isinstance(info.value, UnknownRuntimeError)
    assert str(info.value) == (
        "unknown runtime 'nope'; available runtimes: acp, claude-code (or claude), codex, "
        "command, gemini"
    )


# -- butler errors: each names the file and the key ----------------------------------------


def test_name_must_match_the_folder(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, MINIMAL.format(name="general", port=8201))
    assert message == f"{path}: [butler.name]: 'general' must match the folder name 'health'"


@pytest.mark.parametrize("name", ["Health", "9lives", "has space", "a" * 64, ""])
def test_invalid_butler_name(tmp_path: Path, name: str) -> None:
    path, message = load_error(tmp_path, MINIMAL.format(name=name, port=8201))
    assert message == (
        f"{path}: [butler.name]: invalid butler name {name!r} (lowercase letters, digits, - and _)"
    )


@pytest.mark.parametrize(
    ("port", "error"),
    [
        ("0", "must be at least 1"),
        ("-5", "must be at least 1"),
        ("70000", "must be at most 65535"),
        ('"8101"', "must be an integer, not str"),
        ("81.5", "must be an integer, not float"),
        ("true", "must be an integer, not bool"),
    ],
)
def test_invalid_port(tmp_path: Path, port: str, error: str) -> None:
    path, message = load_error(tmp_path, MINIMAL.format(name="health", port=port))
    assert message == f"{path}: [butler.port]: {error}"


def test_port_is_required(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, '[butler]\nname = "health"\n')
    assert message == f"{path}: [butler.port]: missing required key"


def test_butler_table_is_required(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, "[modules.memory]\n")
    assert message == f"{path}: [butler]: missing table"


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, MINIMAL.format(name="health", port=8201) + "[extras]\n")
    assert message == f"{path}: [extras]: unknown key (allowed: butler, modules)"


def test_unknown_key_in_butler(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + 'descripton = "typo"\n'
    )
    assert message == (
        f"{path}: [butler.descripton]: unknown key (did you mean 'description'? allowed: "
        "agents, description, env, limits, mcp_transport, name, permissions, port, retry, runtime, "
        "sandbox, schedule, telemetry)"
    )


def test_unknown_key_in_runtime(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + "[butler.runtime]\nmax_turn = 3\n"
    )
    assert message == (
        f"{path}: [butler.runtime.max_turn]: unknown key (did you mean 'max_turns'? allowed: "
        "base_url, chat_command, command, env, events, max_concurrent_sessions, "
        "max_queued_sessions, "
        "max_turns, model, output, resume_command, stdin, timeout_s, tools, type)"
    )


def test_unknown_key_in_env(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + '[butler.env]\nrequire = ["A"]\n'
    )
    assert message == (
        f"{path}: [butler.env.require]: unknown key (did you mean 'required'? allowed: optional, "
        "required)"
    )


def test_websocket_transport_is_refused(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + 'mcp_transport = "ws"\n'
    )
    assert message == f"{path}: [butler.mcp_transport]: must be 'http' or 'sse', not 'ws'"


def test_unknown_runtime_type_is_refused_at_load(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + '[butler.runtime]\ntype = "aider"\n'
    )
    assert message == (
        f"{path}: [butler.runtime.type]: unknown runtime 'aider'; "
        "available runtimes: acp, claude-code (or claude), codex, command, gemini"
    )


@pytest.mark.parametrize(
    ("line", "key", "error"),
    [
        ("max_concurrent_sessions = 0", "max_concurrent_sessions", "must be at least 1"),
        (
            "max_concurrent_sessions = true",
            "max_concurrent_sessions",
            "must be an integer, not bool",
        ),
        ("max_turns = 0", "max_turns", "must be at least 1"),
        ("max_turns = false", "max_turns", "must be an integer, not bool"),
        ("max_queued_sessions = -1", "max_queued_sessions", "must be at least 0"),
        ("timeout_s = 0", "timeout_s", "must be positive"),
        ("timeout_s = inf", "timeout_s", "must be a finite number, not inf"),
        ("timeout_s = nan", "timeout_s", "must be a finite number, not nan"),
        ("timeout_s = true", "timeout_s", "must be a number, not bool"),
        ('timeout_s = "10"', "timeout_s", "must be a number, not str"),
        ("model = 3", "model", "must be a string, not int"),
        ('tools = "Bash"', "tools", "must be a list of strings"),
        ('tools = ["Bash", "rm -rf"]', "tools", "invalid name 'rm -rf'"),
    ],
)
def test_invalid_runtime_values(tmp_path: Path, line: str, key: str, error: str) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + f"[butler.runtime]\n{line}\n"
    )
    assert message == f"{path}: [butler.runtime.{key}]: {error}"


def test_runtime_must_be_a_table(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + 'runtime = "claude-code"\n'
    )
    assert message == f"{path}: [butler.runtime]: must be a table"


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('required = ["GOOD", "1BAD"]', "[butler.env.required]: invalid name '1BAD'"),
        ('optional = ["WITH-DASH"]', "[butler.env.optional]: invalid name 'WITH-DASH'"),
        ('optional = ["A B"]', "[butler.env.optional]: invalid name 'A B'"),
        ('required = ["A=B"]', "[butler.env.required]: invalid name 'A=B'"),
        ('required = [""]', "[butler.env.required]: invalid name ''"),
        ('required = "TOKEN"', "[butler.env.required]: must be a list of strings"),
        ("optional = [1]", "[butler.env.optional]: must be a list of strings"),
    ],
)
def test_invalid_env_names(tmp_path: Path, line: str, error: str) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + f"[butler.env]\n{line}\n"
    )
    assert message == f"{path}: {error}"


def test_env_name_with_trailing_newline_is_refused(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path,
        MINIMAL.format(name="health", port=8201) + '[butler.env]\nrequired = ["API_KEY\\n"]\n',
    )
    assert message == f"{path}: [butler.env.required]: invalid name 'API_KEY\\n'"


def test_invalid_module_credential_name(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path,
        MINIMAL.format(name="health", port=8201) + '[modules.mail]\ncredentials = ["bad name"]\n',
    )
    assert message == f"{path}: [modules.mail.credentials]: invalid name 'bad name'"


def test_module_must_be_a_table(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + "[modules]\nmemory = 1\n"
    )
    assert message == f"{path}: [modules.memory]: must be a table"


SCHEDULE = """
[[butler.schedule]]
name = "{name}"
cron = "{cron}"
prompt = "{prompt}"
"""


def schedule(name: str = "daily", cron: str = "0 8 * * *", prompt: str = "Go.") -> str:
    return SCHEDULE.format(name=name, cron=cron, prompt=prompt)


@pytest.mark.parametrize("cron", ["61 * * * *", "* * *", "every day", "0 25 * * *"])
def test_bad_cron(tmp_path: Path, cron: str) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + schedule(cron=cron)
    )
    assert message == f"{path}: [butler.schedule[0].cron]: invalid cron expression {cron!r}"


def test_duplicate_schedule_names(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path,
        MINIMAL.format(name="health", port=8201) + schedule() + schedule(cron="0 9 * * *"),
    )
    assert message == f"{path}: [butler.schedule[1].name]: duplicate schedule name 'daily'"


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_schedule_prompt(tmp_path: Path, prompt: str) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + schedule(prompt=prompt)
    )
    assert message == f"{path}: [butler.schedule[0].prompt]: must not be empty"


def test_invalid_schedule_name(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + schedule(name="Daily Digest")
    )
    assert message == f"{path}: [butler.schedule[0].name]: invalid schedule name 'Daily Digest'"


def test_schedule_missing_cron_and_unknown_key(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path,
        MINIMAL.format(name="health", port=8201)
        + '[[butler.schedule]]\nname = "daily"\nprompt = "Go."\n',
    )
    assert message == f"{path}: [butler.schedule[0].cron]: missing required key"
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + schedule() + 'when = "now"\n'
    )
    assert message == (
        f"{path}: [butler.schedule[0].when]: unknown key (allowed: cron, name, prompt)"
    )


def test_schedule_must_be_an_array_of_tables(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path,
        MINIMAL.format(name="health", port=8201) + '[butler.schedule]\nname = "daily"\n',
    )
    assert message == f"{path}: [butler.schedule]: must be an array of tables ([[...]])"


def test_invalid_toml(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, '[butler]\nname = "health\nport = 8201\n')
    assert message.startswith(f"{path}: invalid TOML: ")
    assert "line 2" in message, "the TOML parser's position is kept"


def test_missing_system_prompt(tmp_path: Path) -> None:
    write_butler(tmp_path, "health", MINIMAL.format(name="health", port=8201), prompt=None)
    with pytest.raises(RosterError) as info:
        load_roster(tmp_path)
    prompt = (tmp_path / "health" / "CLAUDE.md").resolve()
    assert info.value.path == prompt
    assert str(info.value) == f"{prompt}: missing: every butler needs a system prompt"


def test_load_butler_without_butler_toml(tmp_path: Path) -> None:
    (tmp_path / "health").mkdir()
    with pytest.raises(RosterError) as info:
        load_butler(tmp_path / "health")
    assert str(info.value) == f"{(tmp_path / 'health' / 'butler.toml').resolve()}: file not found"


# -- agent roles ---------------------------------------------------------------------


def test_agent_roles(tmp_path: Path) -> None:
    toml = MINIMAL.format(name="health", port=8201) + (
        '[butler.agents.researcher]\ndescription = "Looks things up"\nprompt = "Research."\n'
        'tools = ["Read", "Grep"]\nmodel = "haiku"\n'
        '[butler.agents.writer]\ndescription = "Writes"\nprompt_file = "agents/writer.md"\n'
    )
    write_butler(tmp_path, "health", toml)
    (tmp_path / "health" / "agents").mkdir()
    (tmp_path / "health" / "agents" / "writer.md").write_text("You write reports.")
    agents = load_roster(tmp_path)["health"].agents
    assert set(agents) == {"researcher", "writer"}
    assert agents["researcher"].tools == ("Read", "Grep")
    assert agents["researcher"].model == "haiku"
    assert agents["writer"].prompt == "You write reports." and agents["writer"].tools is None


@pytest.mark.parametrize(
    ("table", "key", "error"),
    [
        (
            '[butler.agents.r]\ndescription = "d"\n',
            "butler.agents.r.prompt",
            "give exactly one of prompt and prompt_file",
        ),
        (
            '[butler.agents.r]\ndescription = "d"\nprompt = "p"\nprompt_file = "x.md"\n',
            "butler.agents.r.prompt",
            "give exactly one of prompt and prompt_file",
        ),
        (
            '[butler.agents.r]\ndescription = "d"\nprompt_file = "../../etc/passwd"\n',
            "butler.agents.r.prompt_file",
            "no such file inside the butler",
        ),
        (
            '[butler.agents.R2]\ndescription = "d"\nprompt = "p"\n',
            "butler.agents.R2",
            "invalid role name 'R2'",
        ),
        (
            '[butler.agents.r]\nprompt = "p"\n',
            "butler.agents.r.description",
            "missing required key",
        ),
        (
            '[butler.agents.r]\ndescription = "d"\nprompt = "p"\ncolour = "red"\n',
            "butler.agents.r.colour",
            "unknown key",
        ),
    ],
)
def test_agent_role_errors(tmp_path: Path, table: str, key: str, error: str) -> None:
    path, message = load_error(tmp_path, MINIMAL.format(name="health", port=8201) + table)
    assert message.startswith(f"{path}: [{key}]: {error}"), message


def test_telemetry_cli_is_a_bool_or_signals(tmp_path: Path) -> None:
    path, message = load_error(
        tmp_path, MINIMAL.format(name="health", port=8201) + '[butler.telemetry]\ncli = "yes"\n'
    )
    assert message == (
        f'{path}: [butler.telemetry.cli]: must be true, false, "default", "all", or signals '
        'joined by "+" from "traces", "logs", "metrics", each with an optional share of runs '
        '("traces@0.1")'
    )


async def test_a_prompt_that_is_not_utf8_is_refused_when_loaded_and_when_run(
    make_butler: RosterFactory, store: SessionStore
) -> None:
    """The roster check reports it; a run (the file changed after loading) refuses it with
    the same words."""
    butler = make_butler("cafe")
    butler.system_prompt_file.write_bytes(b"You are the caf\xe9 butler.\n")
    with pytest.raises(RosterError) as loading:
        load_roster(butler.roster_dir)
    assert str(loading.value) == (
        f"{butler.system_prompt_file}: not UTF-8 text (byte 0xe9 at offset 15): save it as UTF-8"
    )

    result = await Spawner(butler, store=store, adapter=FakeAdapter()).trigger("hi")

    assert (result.status, result.error_kind) == ("failed", "config")
    assert result.error == str(loading.value)


@pytest.mark.parametrize(
    ("name", "make_bad"),
    [
        ("butler.toml", lambda folder: folder / "butler.toml"),
        ("a role's prompt_file", lambda folder: folder / "roles" / "helper.md"),
    ],
)
def test_roster_files_that_are_not_utf8_name_the_byte(
    make_butler: RosterFactory, name: str, make_bad: Any
) -> None:
    butler = make_butler(
        "cafe",
        extra="""
        [butler.agents.helper]
        description = "helps"
        prompt_file = "roles/helper.md"
        """,
        files={"cafe/roles/helper.md": "Help."},
    )
    bad = make_bad(butler.directory)
    bad.write_bytes(bad.read_bytes() + b"\n# caf\xe9\n")
    with pytest.raises(RosterError) as caught:
        load_roster(butler.roster_dir)
    offset = bad.read_bytes().index(0xE9)
    assert str(caught.value).startswith(f"{bad}: not UTF-8 text (byte 0xe9 at offset {offset})")
