"""A butler served as an Agent Client Protocol (ACP) agent: ``spawnkit acp --butler NAME``.

ACP clients (Zed, JetBrains, Jupyter AI) start an agent as a process and speak JSON-RPC
with it over its stdio. Here each prompt of an ACP session is one spawnkit run of the
butler, through the same :class:`~spawnkit.serve.service.ButlerService` as ``spawnkit run``
(sandbox, MCP server, budgets, record, spans); the session goes on across prompts by
resuming the runtime's own session. :mod:`.agent` answers the protocol's methods,
:mod:`.updates` turns run events and records into ``session/update`` notifications,
:mod:`.approval` asks the client before a tool under ``[butler.permissions] ask`` runs, and
:mod:`.wire` frames the messages on stdio (and answers what is not JSON-RPC at all).
"""
