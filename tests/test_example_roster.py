"""The example roster: butler settings, composed prompts, scenarios and skill scripts.

Skill scripts run as real subprocesses with a bare environment, the way a run's Bash tool
starts them, and their printed figures are checked against values worked out by hand.
Scenarios are played turn by turn without a CLI; the shell commands they script are run for
real from the butler's folder, so a scenario cannot drift from the skill it drives.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest
from croniter import croniter

from spawnkit import ButlerConfig, load_roster
from spawnkit.config.system_prompt import compose_system_prompt, read_prompt_file
from spawnkit.replay import Scenario
from spawnkit.replay.anthropic import SHELL_TOOL
from spawnkit.replay.scenario import Reply, TurnRequest

ROSTER = Path(__file__).resolve().parent.parent / "roster"
SCENARIOS = sorted(ROSTER.glob("*/scenarios/*.toml"))
TREND = ROSTER / "health" / "skills" / "weight_trend" / "trend.py"
UPCOMING = ROSTER / "relationship" / "skills" / "upcoming_birthdays" / "upcoming.py"
WORD_COUNT = ROSTER / "general" / "skills" / "word_count" / "count.py"
SCRIPT_TIMEOUT_S = 30
# Dates must agree between the test and the scripts it runs.
HOST_TZ = {"TZ": os.environ["TZ"]} if "TZ" in os.environ else {}


def run_script(
    script: Path,
    *args: str,
    stdin: str | bytes = "",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a skill like a butler's Bash tool does: its folder as cwd, a bare environment."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        input=data,
        capture_output=True,
        cwd=script.parent.parent.parent,
        env={"PATH": os.environ.get("PATH", ""), **HOST_TZ, **(env or {})},
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


def run_shell(command: str, cwd: Path) -> str:
    """A scripted Bash command, run as the CLI would run it; its stdout, stripped."""
    proc = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(cwd), **HOST_TZ},
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


# -- the roster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roster() -> dict[str, ButlerConfig]:
    return {butler.name: butler for butler in load_roster(ROSTER)}


def test_roster_has_the_three_butlers_on_their_ports(roster: dict[str, ButlerConfig]) -> None:
    assert {name: b.port for name, b in roster.items()} == {
        "health": 8101,
        "relationship": 8102,
        "general": 8103,
    }
    for butler in roster.values():
        assert butler.runtime.type == "claude-code"
        assert butler.runtime.model is None
        assert butler.runtime.base_url is None
        assert butler.runtime.tools == ("Bash", "Read", "Glob", "Grep")
        assert butler.mcp_transport == "http"
        assert butler.description


def test_health_settings(roster: dict[str, ButlerConfig]) -> None:
    health = roster["health"]
    assert dict(health.modules["memory"]) == {"max_tokens": 1500}
    assert [(s.name, s.cron) for s in health.schedules] == [("weekly_summary", "0 8 * * 1")]
    after = datetime(2025, 6, 4, 12, 0)  # a Wednesday
    assert croniter("0 8 * * 1", after).get_next(datetime) == datetime(2025, 6, 9, 8, 0)
    assert [p.name for p in health.skills()] == ["weight_trend"]


def test_relationship_settings(roster: dict[str, ButlerConfig]) -> None:
    relationship = roster["relationship"]
    assert relationship.env.optional == ("RELATIONSHIP_TIMEZONE",)
    assert relationship.env.required == ()
    assert [(s.name, s.cron) for s in relationship.schedules] == [("daily_birthdays", "0 8 * * *")]
    assert "memory" not in relationship.modules
    assert [p.name for p in relationship.skills()] == ["upcoming_birthdays"]


def test_general_settings(roster: dict[str, ButlerConfig]) -> None:
    general = roster["general"]
    assert general.runtime.max_concurrent_sessions == 2
    assert general.runtime.max_queued_sessions == 10
    assert general.schedules == ()
    assert [p.name for p in general.skills()] == ["word_count"]


def test_schedules_name_skills_the_butler_has(roster: dict[str, ButlerConfig]) -> None:
    for butler in roster.values():
        skills = {p.name for p in butler.skills()}
        for schedule in butler.schedules:
            named = set(re.findall(r"(\w+) skill\b", schedule.prompt))
            assert named, f"{butler.name}: schedule {schedule.name} names no skill"
            assert named <= skills, (butler.name, schedule.name, named - skills)


@pytest.mark.parametrize(
    ("name", "skill_line"),
    [
        (
            "health",
            "- `skills/weight_trend/`: Count, min, max, mean and least-squares change per "
            "week of weight readings (`trend.py`)",
        ),
        (
            "relationship",
            "- `skills/upcoming_birthdays/`: Birthdays of the next N days, soonest first, "
            "with weekdays and ages (`upcoming.py`)",
        ),
        (
            "general",
            "- `skills/word_count/`: Lines, words, characters, sentences, reading time and "
            "top words of a text (`count.py`)",
        ),
    ],
)
def test_system_prompt_composes(
    roster: dict[str, ButlerConfig], name: str, skill_line: str
) -> None:
    butler = roster[name]
    raw = butler.system_prompt_file.read_text("utf-8")
    assert "<!-- @include shared/NOTIFY.md -->" in raw
    prompt = compose_system_prompt(
        butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    )
    assert "@include" not in prompt
    notify = (ROSTER / "shared" / "NOTIFY.md").read_text("utf-8").strip()
    assert notify in prompt
    # The appendices follow the butler's own text, and the skills list closes the prompt.
    own = prompt.index(raw.splitlines()[0])
    skills_doc = prompt.index("## Using your skills")
    logging_doc = prompt.index("## Keeping records with the state tools")
    skills_list = prompt.index("## Your skills")
    assert own < skills_doc < logging_doc < skills_list
    assert prompt.endswith(skill_line)


def test_every_skill_documents_its_script(roster: dict[str, ButlerConfig]) -> None:
    for butler in roster.values():
        for skill in butler.skills():
            scripts = sorted(skill.glob("*.py"))
            assert scripts, skill
            doc = (skill / "SKILL.md").read_text("utf-8")
            for script in scripts:
                assert f"python3 skills/{skill.name}/{script.name}" in doc


# -- scenarios -------------------------------------------------------------------------------

TOOLS = ("Bash", "Read", "Glob", "Grep")


def offered(butler: str) -> tuple[str, ...]:
    mcp = ("state_get", "state_set", "state_list", "schedule_list", "sessions_list", "trigger")
    return (*TOOLS, *(f"mcp__{butler}__{tool}" for tool in mcp))


def play(scenario: Scenario, butler: str, prompt: str, results: list[str]) -> list[Reply]:
    """Every turn of the script ``prompt`` selects; ``results[i]`` answers turn i's calls."""
    replies: list[Reply] = []
    last = ""
    for index in range(50):
        # As Claude Code asks: its shell tool is Bash.
        reply = scenario.reply(TurnRequest(prompt, index, offered(butler), last, shell=SHELL_TOOL))
        assert not reply.text.startswith("[replay]"), reply.text
        replies.append(reply)
        if not reply.tool_calls:
            return replies
        last = results[index]
    raise AssertionError("the script never ends")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_scenario_loads(path: Path) -> None:
    scenario = Scenario.load(path)
    assert scenario.description
    assert scenario.scripts[-1].match is None, "the last script should be a fallback"


def test_every_butler_has_a_scenario(roster: dict[str, ButlerConfig]) -> None:
    assert {p.parent.parent.name for p in SCENARIOS} == set(roster)


def test_health_demo_records_the_weight_and_quotes_the_skill() -> None:
    scenario = Scenario.load(ROSTER / "health" / "scenarios" / "demo.toml")
    prompt = "I weighed 72.4 kg this morning"
    trend_command = "python3 skills/weight_trend/trend.py --unit kg 73.1 72.8 72.4"
    trend_output = run_shell(trend_command, ROSTER / "health")
    replies = play(scenario, "health", prompt, ["null", "2025-06-02", "stored", trend_output])
    calls = [reply.tool_calls[0] for reply in replies[:-1]]
    assert [(c.name, dict(c.input)) for c in calls[:3]] == [
        ("mcp__health__state_get", {"key": "measurements/weight"}),
        ("Bash", {"command": "date +%F"}),
        (
            "mcp__health__state_set",
            {
                "key": "measurements/weight",
                "value": [{"date": "2025-06-02", "value": "72.4", "unit": "kg"}],
            },
        ),
    ]
    assert calls[3].name == "Bash"
    # The scripted command really runs, and its output is what the final text quotes.
    assert run_shell(calls[3].input["command"], ROSTER / "health") == trend_output
    assert trend_output.endswith("change per week: -0.35 kg (least-squares fit over 14 days)")
    final = replies[-1].text
    assert final.startswith("Recorded 72.4 kg in your weight log.")
    assert f"```\n{trend_output}\n```" in final


def test_health_demo_other_weights_and_fallback() -> None:
    scenario = Scenario.load(ROSTER / "health" / "scenarios" / "demo.toml")
    replies = play(scenario, "health", "My weight was 80 kg", ["", "", "", ""])
    assert "73.1 72.8 80" in replies[3].tool_calls[0].input["command"]
    fallback = play(scenario, "health", "How did I sleep?", [])
    assert len(fallback) == 1
    assert "I weighed 72.4 kg this morning" in fallback[0].text
    # A weight without kg is not recorded as kg.
    assert len(play(scenario, "health", "I weighed 160 lb", [])) == 1


def test_env_probe_prints_the_environment() -> None:
    scenario = Scenario.load(ROSTER / "health" / "scenarios" / "env_probe.toml")
    replies = play(scenario, "health", "anything", ["A=1\nPATH=/bin"])
    assert replies[0].tool_calls[0].name == "Bash"
    assert replies[0].tool_calls[0].input["command"] == "env | sort"
    assert replies[1].text == "A=1\nPATH=/bin"


def test_relationship_scenario_pipes_state_into_the_skill() -> None:
    scenario = Scenario.load(ROSTER / "relationship" / "scenarios" / "birthdays.toml")
    prompt = "Remember that Ada Lovelace's birthday is 1815-12-10, please"
    state = json.dumps(
        {
            "people/Ada Lovelace": {"name": "Ada Lovelace", "birthday": "1815-12-10"},
            "people/Bob": {"name": "Bob", "last_contact": "2025-05-01"},
        }
    )
    replies = play(scenario, "relationship", prompt, ["{}", "stored", state, "OUTPUT"])
    names = [reply.tool_calls[0].name for reply in replies[:-1]]
    assert names == [
        "mcp__relationship__state_list",
        "mcp__relationship__state_set",
        "mcp__relationship__state_list",
        "Bash",
    ]
    assert dict(replies[1].tool_calls[0].input) == {
        "key": "people/Ada Lovelace",
        "value": {"name": "Ada Lovelace", "birthday": "1815-12-10"},
    }
    command = replies[3].tool_calls[0].input["command"]
    assert command.startswith("python3 skills/upcoming_birthdays/upcoming.py --days 366 <<'EOF'")
    today = date.today()
    next_birthday = date(today.year, 12, 10)
    if next_birthday < today:
        next_birthday = date(today.year + 1, 12, 10)
    output = run_shell(command, ROSTER / "relationship")
    assert output.splitlines()[0].startswith("1 birthday in the next 366 days")
    assert output.splitlines()[1].startswith(f"{next_birthday.isoformat()} (")
    assert output.endswith(f"Ada Lovelace turns {next_birthday.year - 1815}")
    assert replies[-1].text.startswith("Saved: Ada Lovelace's birthday is 1815-12-10.")
    assert replies[-1].text.endswith("OUTPUT")


def test_relationship_scenario_lists_upcoming() -> None:
    scenario = Scenario.load(ROSTER / "relationship" / "scenarios" / "birthdays.toml")
    replies = play(scenario, "relationship", "Whose birthday is coming up?", ["{}", "none"])
    assert replies[0].tool_calls[0].name == "mcp__relationship__state_list"
    command = replies[1].tool_calls[0].input["command"]
    assert run_shell(command, ROSTER / "relationship").startswith(
        "No birthdays in the next 30 days"
    )
    assert replies[-1].text == "none"


def test_general_scenario_counts_words_and_keeps_notes() -> None:
    scenario = Scenario.load(ROSTER / "general" / "scenarios" / "assistant.toml")
    replies = play(scenario, "general", "Count the words in: The cat sat. The cat ran!", ["X"])
    output = run_shell(replies[0].tool_calls[0].input["command"], ROSTER / "general")
    assert output == (
        "lines: 1\nwords: 6\ncharacters: 25\nsentences: 2\n"
        "reading time: 1 min (at 200 words a minute)\n"
        "top words: cat (2), the (2), ran (1)"
    )
    assert replies[-1].text.endswith("\n\nX")
    notes = play(
        scenario, "general", "Remember that the plumber comes on Friday.", ["", "2025-06-02", ""]
    )
    assert dict(notes[2].tool_calls[0].input) == {
        "key": "notes",
        "value": [{"date": "2025-06-02", "text": "the plumber comes on Friday"}],
    }
    assert notes[-1].text == "Noted: the plumber comes on Friday."


# -- weight_trend ---------------------------------------------------------------------------


def test_trend_from_arguments() -> None:
    proc = run_script(TREND, "--unit", "kg", "73.1", "72.8", "72.4")
    assert proc.returncode == 0, proc.stderr
    # x = 0, 7, 14 days: slope = ((-7)(1/3) + 7(-11/30)) / 98 = -0.05 kg a day.
    assert proc.stdout == (
        "readings: 3\nmin: 72.4 kg\nmax: 73.1 kg\nmean: 72.77 kg\n"
        "change per week: -0.35 kg (least-squares fit over 14 days)\n"
    )


def test_trend_interval_scales_the_slope() -> None:
    proc = run_script(TREND, "--interval", "1", "73.1", "72.8", "72.4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "change per week: -2.45 (least-squares fit over 2 days)"


def test_trend_from_dated_entries_uses_the_dates() -> None:
    # Days 0, 2, 9 (given out of order); slope = -4.5 / (402/9) = -0.100746 kg a day.
    entries = [
        {"date": "2025-01-03", "value": 79.5, "unit": "kg"},
        {"date": "2025-01-01", "value": "80", "unit": "kg"},
        {"date": "2025-01-10", "value": 79, "unit": "kg"},
    ]
    proc = run_script(TREND, stdin=json.dumps(entries))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "readings: 3\nmin: 79 kg\nmax: 80 kg\nmean: 79.5 kg\n"
        "change per week: -0.71 kg (least-squares fit over 9 days)\n"
    )


def test_trend_rising_and_plain_json_numbers() -> None:
    proc = run_script(TREND, "--unit", "lb", stdin="[150, 151, 152.5]")
    assert proc.returncode == 0, proc.stderr
    # x = 0, 7, 14; slope = (-7(-1.1667) + 7(1.3333)) / 98 = 0.178571 lb a day.
    assert proc.stdout.splitlines()[-1] == (
        "change per week: +1.25 lb (least-squares fit over 14 days)"
    )


def test_trend_single_reading_has_no_slope() -> None:
    proc = run_script(TREND, "72.4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "readings: 1",
        "min: 72.4",
        "max: 72.4",
        "mean: 72.4",
        "change per week: n/a (needs readings on at least two different days)",
    ]


def test_trend_help() -> None:
    proc = run_script(TREND, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: trend.py")
    assert "--interval DAYS" in proc.stdout


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["72", "abc"], "", "argument 2: not a number: 'abc'"),
        (["72", "nan"], "", "argument 2: not a finite number"),
        ([], "", "no readings"),
        ([], "[]", "no readings given"),
        ([], "{not json", "stdin is not valid JSON"),
        ([], '{"value": 1}', "expected a JSON list, got dict"),
        ([], '[{"date": "2025-01-01", "value": 1}, 2]', "mix of plain numbers and entries"),
        ([], '[{"date": "2025-13-01", "value": 1}]', "not a date YYYY-MM-DD"),
        ([], '[{"value": 1}]', 'entry has no "date"'),
        (
            [],
            '[{"date": "2025-01-01", "value": 70, "unit": "kg"},'
            ' {"date": "2025-01-02", "value": 154, "unit": "lb"}]',
            "entries mix units (kg, lb)",
        ),
        (
            ["--unit", "lb"],
            '[{"date": "2025-01-01", "value": 70, "unit": "kg"}]',
            "--unit lb differs from the entries' unit kg",
        ),
        (["--interval", "0", "1", "2"], "", "must be a positive number of days"),
    ],
)
def test_trend_bad_input_exits_2(args: list[str], stdin: str, message: str) -> None:
    proc = run_script(TREND, *args, stdin=stdin)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert message in proc.stderr


# -- upcoming_birthdays ----------------------------------------------------------------------


def test_upcoming_sorted_with_weekdays_and_ages() -> None:
    people = {
        "people/Ada Lovelace": {"name": "Ada Lovelace", "birthday": "1815-12-10"},
        "people/Bob": {"last_contact": "2025-05-01"},  # no birthday: skipped
        "people/Leap": {"birthday": "02-29"},
        "Grace Hopper": "1906-12-09",
        "Tom": "12-01",
        "Ann": "12-02",
        "Alan Turing": "1912-06-23",
    }
    proc = run_script(UPCOMING, "--today", "2025-12-01", "--days", "90", stdin=json.dumps(people))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "5 birthdays in the next 90 days (2025-12-01 to 2026-03-01):\n"
        "2025-12-01 (Mon, today): Tom\n"
        "2025-12-02 (Tue, tomorrow): Ann\n"
        "2025-12-09 (Tue, in 8 days): Grace Hopper turns 119\n"
        "2025-12-10 (Wed, in 9 days): Ada Lovelace turns 210\n"
        "2026-02-28 (Sat, in 89 days): Leap\n"
    )


def test_upcoming_wraps_into_next_year_and_honours_leap_years() -> None:
    people = {"New Year": "2000-01-02", "Leap": "1996-02-29"}
    proc = run_script(UPCOMING, "--today", "2027-12-30", "--days", "366", stdin=json.dumps(people))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == [
        "2028-01-02 (Sun, in 3 days): New Year turns 28",
        "2028-02-29 (Tue, in 61 days): Leap turns 32",
    ]


def test_upcoming_default_window_and_empty_result() -> None:
    proc = run_script(UPCOMING, "--today", "2025-06-01", stdin='{"Ada": "12-10"}')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "No birthdays in the next 30 days (2025-06-01 to 2025-07-01).\n"
    today_only = run_script(
        UPCOMING, "--today", "2025-12-10", "--days", "0", stdin='{"Ada": "12-10"}'
    )
    assert today_only.stdout == "1 birthday today (2025-12-10):\n2025-12-10 (Wed, today): Ada\n"


def test_upcoming_takes_today_in_relationship_timezone() -> None:
    zone = "Pacific/Kiritimati"  # UTC+14: often a day ahead of the host
    try:
        before = datetime.now(ZoneInfo(zone)).date()
    except ZoneInfoNotFoundError:
        pytest.skip("no time zone database on this host")
    people = {"Zed": before.strftime("%m-%d")}
    proc = run_script(
        UPCOMING, "--days", "0", stdin=json.dumps(people), env={"RELATIONSHIP_TIMEZONE": zone}
    )
    after = datetime.now(ZoneInfo(zone)).date()
    assert proc.returncode == 0, proc.stderr
    if before != after:
        pytest.skip("midnight passed in Kiritimati during the call")
    assert proc.stdout == f"1 birthday today ({before}):\n{before} ({before:%a}, today): Zed\n"


def test_upcoming_help() -> None:
    proc = run_script(UPCOMING, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: upcoming.py")
    assert "RELATIONSHIP_TIMEZONE" in proc.stdout


@pytest.mark.parametrize(
    ("args", "stdin", "env", "message"),
    [
        ([], '{"Ada": "13-01"}', {}, "Ada: no such date: '13-01'"),
        ([], '{"Ada": "1990-02-30"}', {}, "no such date"),
        ([], '{"Ada": "10 December"}', {}, "birthday must be YYYY-MM-DD or MM-DD"),
        ([], '{"Ada": 1210}', {}, "expected a birthday string or a record"),
        ([], '["Ada"]', {}, "expected a JSON object of name -> birthday, got list"),
        ([], "", {}, "nothing on stdin"),
        ([], "{", {}, "stdin is not valid JSON"),
        (["--days", "400"], "{}", {}, "must be between 0 and 366"),
        (["--today", "2025-02-30"], "{}", {}, "not a date YYYY-MM-DD"),
        ([], "{}", {"RELATIONSHIP_TIMEZONE": "Mars/Olympus"}, "is not a known time zone"),
    ],
)
def test_upcoming_bad_input_exits_2(
    args: list[str], stdin: str, env: dict[str, str], message: str
) -> None:
    proc = run_script(UPCOMING, *args, stdin=stdin, env=env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert message in proc.stderr


# -- word_count ---------------------------------------------------------------------------


def test_word_count_from_stdin() -> None:
    text = "Don't stop -- the well-known cat sat.\nThe CAT ran! Did it? Yes\n"
    proc = run_script(WORD_COUNT, "--top", "2", stdin=text)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "lines: 2\nwords: 12\ncharacters: 62\nsentences: 4\n"
        "reading time: 1 min (at 200 words a minute)\n"
        "top words: cat (2), the (2)\n"
    )


def test_word_count_files_with_total(tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("One two three.\n", encoding="utf-8")
    long = tmp_path / "long.txt"
    long.write_text(" ".join(["word"] * 401), encoding="utf-8")  # no final newline
    proc = run_script(WORD_COUNT, str(short), str(long))
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("\n\n")
    assert blocks[0].splitlines()[:3] == [f"== {short} ==", "lines: 1", "words: 3"]
    assert blocks[1].splitlines()[2:5] == ["words: 401", "characters: 2004", "sentences: 1"]
    assert blocks[1].splitlines()[5] == "reading time: 3 min (at 200 words a minute)"
    assert blocks[2].splitlines() == [
        "== total ==",
        "lines: 2",
        "words: 404",
        "characters: 2018",
        "sentences: 2",
        "reading time: 3 min (at 200 words a minute)",
    ]


def test_word_count_empty_text() -> None:
    proc = run_script(WORD_COUNT, "--top", "3", stdin="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1] == "words: 0"
    assert proc.stdout.splitlines()[-1] == "top words: none"


def test_word_count_help() -> None:
    proc = run_script(WORD_COUNT, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: count.py")


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["missing.txt"], b"", "missing.txt: no such file"),
        (["skills"], b"", "skills: is a directory"),
        ([], b"\xff\xfe", "stdin: not UTF-8 text"),
        (["--top", "-1"], b"x", "must be 0 or more"),
        (["--top", "many"], b"x", "not a whole number"),
    ],
)
def test_word_count_bad_input_exits_2(args: list[str], stdin: bytes, message: str) -> None:
    proc = run_script(WORD_COUNT, *args, stdin=stdin)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert message in proc.stderr
