"""How a run is locked down: everything between an agent and the machine it runs on.

A run's private workspace (:mod:`.workspace`) and the sweep that removes what a dead
owner left (:mod:`.sweep`); the bubblewrap sandbox (:mod:`.sandbox`) and the doors of the
run's own network namespace (:mod:`.doors`, with the forwarder inside,
:mod:`.sandbox_forward`); the egress proxy for the hosts a butler allows (:mod:`.egress`);
the model relay that holds the run's real keys (:mod:`.relay`) and the placeholders its CLI
gets instead (:mod:`.credentials`); the per-run MCP secret and its check
(:mod:`.mcp_access`, :mod:`.mcp_guard`); the read-only sources an ask may see
(:mod:`.sources`); and the certificates that keep a Dask cluster its owner's
(:mod:`.cluster_security`). docs/security.md is the threat model these implement.
"""
