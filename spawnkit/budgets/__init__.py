"""What a run may spend, and how fast a butler may start runs.

A run's token, dollar and time limits as it goes (:mod:`.budget`); the usage read from a
model stream for CLIs that report theirs only at the end (:mod:`.metering`); and a
butler's cool-down and start spacing (:mod:`.pacing`).
"""
