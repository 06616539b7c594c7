"""``spawnkit credentials``: the values runs get for the variables their butlers declare,
kept in spawnkit's credential file. A value is read from a pipe or asked for without
echo; only names are ever listed."""

from __future__ import annotations

import argparse
import sys

from ..errors import SpawnkitError
from .parsing import Commands
from .reporting import EXIT_OK


def add_credentials(commands: Commands) -> None:
    creds = commands.add_parser("credentials", help="values runs get for declared variables")
    creds_commands = creds.add_subparsers(dest="credentials_command", required=True)
    creds_set = creds_commands.add_parser(
        "set", help="store a value: piped on stdin, else asked for without echo"
    )
    creds_set.add_argument("name")
    creds_set.add_argument("value", nargs="?")
    creds_commands.add_parser("list", help="list stored names (never values)")
    creds_delete = creds_commands.add_parser("delete", help="remove a stored value")
    creds_delete.add_argument("name")


def cmd_credentials(args: argparse.Namespace) -> int:
    from ..config.credential_file import CredentialFile, validate_name
    from ..errors import HomeNotWritable
    from ..store import SessionStore

    try:
        # Opening the store moves credentials an older spawnkit kept in it to the file.
        SessionStore().close()
    except HomeNotWritable:
        pass  # nothing can have been moved; the file's own reads and writes say what fails
    except SpawnkitError as exc:
        print(f"spawnkit: warning: {exc}", file=sys.stderr)
    credentials = CredentialFile.default()
    if args.credentials_command == "set":
        name = validate_name(args.name)
        if args.value is not None:
            print(
                "spawnkit: note: a value given as an argument shows in the process list and "
                f"your shell history; prefer `... | spawnkit credentials set {name}`",
                file=sys.stderr,
            )
        value = args.value if args.value is not None else _read_secret(name)
        credentials.set(name, value)
        print(f"stored {name} in {credentials.path}")
    elif args.credentials_command == "delete":
        if not credentials.delete(validate_name(args.name)):
            raise SpawnkitError(f"no stored credential named {args.name!r}")
        print(f"deleted {args.name}")
    else:
        for name in credentials.names():
            print(name)
    return EXIT_OK


def _read_secret(name: str) -> str:
    """A value from the terminal (not echoed) or, when piped, all of stdin minus one newline."""
    import getpass

    from ..config.credential_file import MAX_VALUE_BYTES, CredentialError

    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(f"{name}: ")
    data = sys.stdin.buffer.read(MAX_VALUE_BYTES + 1) if sys.stdin is not None else b""
    if len(data) > MAX_VALUE_BYTES:
        raise CredentialError(f"the value of {name} is longer than {MAX_VALUE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialError(f"the value of {name} on stdin is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")
