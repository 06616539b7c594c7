"""What a butler is, before anything runs: configuration, read and checked.

The frozen types of ``butler.toml`` (:mod:`.butler_config`), the roster loader that
validates them (:mod:`.roster`) and where a roster is found (:mod:`.roster_location`);
runtime names and aliases (:mod:`.runtime_names`); run limits, the retry policy and the
model price table (:mod:`.limits`, :mod:`.retry`, :mod:`.pricing` with ``prices.json``);
the system prompt a run is given (:mod:`.system_prompt`); stored credentials
(:mod:`.credential_file`); and ``spawnkit init`` (:mod:`.scaffold`).
"""
