"""The Agent Client Protocol (ACP) as spawnkit speaks it.

ACP is JSON-RPC 2.0 over an agent's stdio (Jupyter AI 3, Zed and JetBrains are its
clients). spawnkit speaks it both ways: a butler served as an ACP agent (``spawnkit acp``,
:mod:`spawnkit.serve.acp`), and any ACP agent run as a spawnkit runtime (``[butler.runtime]
type = "acp"``, this package). What both directions share, how a tool call is described in
ACP terms, is in :mod:`.kinds`.
"""
