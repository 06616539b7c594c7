"""MCP tools that let an agent look at the kernel's variables, read-only and bounded.

Enabled per run with ``%%spawn --kernel-tools`` (off by default). The agent can
list the user's variables and read a bounded summary of one: its type, shape,
dtypes and the head of a DataFrame, the length and first items of a
container, or a truncated repr. It cannot run code, import, or reach anything
but the named variables of the user namespace.
"""

from __future__ import annotations

import reprlib
import types
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.mcpserver import MCPServer

SUMMARY_CHARS = 4_000
MAX_VARIABLES = 200
_HIDDEN = {"In", "Out", "exit", "quit", "get_ipython", "open"}

Namespace = Callable[[], Mapping[str, Any]]


def visible_names(namespace: Mapping[str, Any]) -> list[str]:
    """User variables: no private names, modules, IPython plumbing."""
    names = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or name in _HIDDEN or isinstance(value, types.ModuleType):
            continue
        names.append(name)
    return sorted(names)[:MAX_VARIABLES]


def describe(value: Any) -> str:
    """One line: type plus shape or length."""
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple):
        return f"{kind} shape={shape}"
    if isinstance(value, str | bytes | list | tuple | dict | set | frozenset):
        return f"{kind} len={len(value)}"
    return kind


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A bounded, human-readable summary of one value."""
    lines = [describe(value)]
    dtypes = getattr(value, "dtypes", None)
    head = getattr(value, "head", None)
    if dtypes is not None and callable(head):  # a DataFrame or similar
        lines.append("dtypes:\n" + _text(dtypes, limit // 3))
        lines.append("head:\n" + _text(head(5), limit // 2))
    elif getattr(value, "dtype", None) is not None:  # an array or a Series
        lines.append(f"dtype: {value.dtype}")
        lines.append(_text(value, limit // 2))
    else:
        short = reprlib.Repr()
        short.maxstring, short.maxother, short.maxlist, short.maxdict = 400, 400, 20, 20
        lines.append(short.repr(value))
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "\n[… truncated]"


def _text(value: Any, limit: int) -> str:
    try:
        text = value.to_string() if hasattr(value, "to_string") else repr(value)
    except Exception as exc:  # noqa: BLE001 - a user's broken __repr__ must not break the tool
        text = f"<cannot render: {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit] + " …"


def kernel_tools(namespace: Namespace) -> Callable[[MCPServer[Any]], None]:
    """A tool extension for a butler's MCP server, reading from ``namespace()``."""

    def extend(mcp: MCPServer[Any]) -> None:
        @mcp.tool()
        def kernel_variables() -> list[dict[str, str]]:
            """The notebook kernel's user variables, each with its type and size."""
            ns = namespace()
            return [{"name": n, "summary": describe(ns[n])} for n in visible_names(ns)]

        @mcp.tool()
        def kernel_variable(name: str) -> str:
            """A bounded summary of one kernel variable (type, shape, dtypes, head)."""
            ns = namespace()
            if name not in visible_names(ns):
                return f"no variable named {name!r}; see kernel_variables()"
            return summarize(ns[name])

    return extend
