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

STORE_PATH_HELP = "a SQLite file or postgresql:// URL (default: the configured store, see --store)"


def add_store(commands: Commands) -> None:
    store_cmd = commands.add_parser("store", help="check, repair or migrate the session store")
    store_commands = store_cmd.add_subparsers(dest="store_command", required=True)
    check = store_commands.add_parser(
        "check", help="check every page of the store; exit 1 if it is damaged"
    )
    check.add_argument("path", nargs="?", help=STORE_PATH_HELP)
    check.add_argument(
        "--repair", action="store_true",
        help="copy every readable row into a fresh store; the damaged file is kept as a backup",
    )  # fmt: skip
    repair = store_commands.add_parser(
        "repair", help="the same as check --repair: rebuild a damaged SQLite store"
    )
    repair.add_argument("path", nargs="?", help=STORE_PATH_HELP)
    migrate = store_commands.add_parser(
        "migrate", help="copy a SQLite store into PostgreSQL (idempotent; counts verified)"
    )
    migrate.add_argument(
        "path", nargs="?",
        help="the SQLite file (default: the configured store when it is one, else "
        "$SPAWNKIT_HOME/sessions.db)",
    )  # fmt: skip
    migrate.add_argument("--to", required=True, metavar="URL", help="postgresql://user@host/db")
    store_commands.add_parser(
        "replay",
        help="write the journaled writes a PostgreSQL server away could not take; exit 1 if "
        "some still wait",
    )


def cmd_store(args: argparse.Namespace) -> int:
    from ..home import default_store_path, store_setting
    from ..store import check_store, is_postgres_url

    if args.store_command == "replay":
        return _replay_journal()
    # The store the command is about: the one named, else the one every command uses
    # ($SPAWNKIT_STORE or --store, [store] url, then $SPAWNKIT_HOME/sessions.db).
    chosen: str | Path = args.path or store_setting() or default_store_path()
    if args.store_command == "migrate" and args.path is None and is_postgres_url(chosen):
        chosen = default_store_path()  # the store is the server already: copy the old file
    if is_postgres_url(chosen):
        if args.store_command == "check" and not args.repair:
            return _check_server(str(chosen))
        raise SpawnkitError(
            f"`spawnkit store {args.store_command}` works on a SQLite file, and the store is "
            f"the PostgreSQL server {_location(str(chosen))}: give a file (spawnkit store "
            f"{args.store_command} PATH)"
        )
    path = Path(chosen).expanduser()
    if not path.exists():
        raise SpawnkitError(f"no session store at {path}")
    if args.store_command == "migrate":
        return _migrate(path, args.to)
    if args.store_command == "repair" or args.repair:
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


def _location(url: str) -> str:
    from ..store.backend import redact_url

    return redact_url(url)


def _check_server(url: str) -> int:
    from ..store.postgres import check_server_store

    health = check_server_store(url)
    if health.healthy:
        schema = health.schema_version if health.schema_version is not None else "none yet"
        print(f"{health.path}: ok (schema {schema}, {health.sessions} sessions)")
        return EXIT_OK
    print(f"{health.path}: {'; '.join(health.problems)}", file=sys.stderr)
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
