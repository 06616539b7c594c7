"""``spawnkit store``: check every page of the session store and repair a damaged SQLite
file, copy a SQLite store into PostgreSQL, and write the journaled writes a PostgreSQL
server away could not take. Each exits 1 when something is left undone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SpawnkitError
from .parsing import Commands
from .reporting import EXIT_FAILED, EXIT_OK


def add_store(commands: Commands) -> None:
    store_cmd = commands.add_parser("store", help="check, repair or migrate the session store")
    store_commands = store_cmd.add_subparsers(dest="store_command", required=True)
    check = store_commands.add_parser(
        "check", help="check every page of the store; exit 1 if it is damaged"
    )
    check.add_argument("path", nargs="?", type=Path, help="default: $SPAWNKIT_HOME/sessions.db")
    check.add_argument(
        "--repair", action="store_true",
        help="copy every readable row into a fresh store; the damaged file is kept as a backup",
    )  # fmt: skip
    migrate = store_commands.add_parser(
        "migrate", help="copy a SQLite store into PostgreSQL (idempotent; counts verified)"
    )
    migrate.add_argument("path", nargs="?", type=Path, help="default: $SPAWNKIT_HOME/sessions.db")
    migrate.add_argument("--to", required=True, metavar="URL", help="postgresql://user@host/db")
    store_commands.add_parser(
        "replay",
        help="write the journaled writes a PostgreSQL server away could not take; exit 1 if "
        "some still wait",
    )


def cmd_store(args: argparse.Namespace) -> int:
    from ..home import default_store_path
    from ..store import check_store

    if args.store_command == "replay":
        return _replay_journal()
    path = args.path or default_store_path()
    if not path.exists():
        raise SpawnkitError(f"no session store at {path}")
    if args.store_command == "migrate":
        return _migrate(path, args.to)
    if args.repair:
        return _repair(path)
    health = check_store(path)
    if health.healthy:
        print(f"{health.path}: ok (schema {health.schema_version}, {health.sessions} sessions)")
        return EXIT_OK
    print(f"{health.path}: damaged", file=sys.stderr)
    for problem in health.problems:
        print(f"  {problem}", file=sys.stderr)
    print(f"repair it with: spawnkit store check --repair {path}", file=sys.stderr)
    return EXIT_FAILED


def _replay_journal() -> int:
    from ..store import SessionStore

    with SessionStore() as store:  # opening it replays what it can
        journal = store.journal
        if journal is None:
            print(f"{store.location}: a local file, nothing is ever journaled")
            return EXIT_OK
        waiting, failed = journal.pending(), journal.failed()
    print(f"{store.location}: {waiting} write(s) waiting in {journal.path}, {len(failed)} failed")
    for entry_id, op, session_id, why in failed:
        print(f"  failed #{entry_id}: {op} of session {session_id}: {why}", file=sys.stderr)
    return EXIT_OK if not waiting and not failed else EXIT_FAILED


def _repair(path: Path) -> int:
    from ..store.repair import repair_store

    report = repair_store(path)
    if report.backup is None:
        print(f"{path}: ok, nothing to repair")
        return EXIT_OK
    print(f"{path}: rebuilt from every readable row; the damaged file is kept as {report.backup}")
    for table in report.tables:
        if not table.reachable:
            state = "LOST: the table itself could not be read"
        elif table.unreadable:
            state = f"{table.recovered} rows recovered, up to {table.unreadable} unreadable"
        else:
            state = f"{table.recovered} rows recovered, none lost"
        print(f"  {table.name:<12} {state}")
    for name in report.lost_precious:
        print(
            f"warning: some rows of {name!r} could not be read: check `spawnkit credentials "
            f"list` and set the missing ones again; the backup {report.backup} keeps the rest",
            file=sys.stderr,
        )
    return EXIT_OK if report.complete else EXIT_FAILED


def _migrate(path: Path, url: str) -> int:
    from ..store.migrate import migrate_store

    report = migrate_store(path, url)
    print(f"{report.source} -> {report.target}")
    for t in report.tables:
        state = "verified" if t.verified else f"ONLY {t.present} FOUND IN THE TARGET"
        print(
            f"  {t.name:<11} {t.source:>8} rows: {t.copied} copied, {t.already} already there; "
            f"{state}"
        )
    if report.verified:
        return EXIT_OK
    print("spawnkit: error: some rows are missing from the target; run it again", file=sys.stderr)
    return EXIT_FAILED
