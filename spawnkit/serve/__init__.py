"""What runs while a butler is up: its MCP server, its schedule and the service joining them.

A butler's MCP server, its tools and ``trigger`` (:mod:`.butler_server`); its cron schedule
(:mod:`.scheduler`); the two started together as one service (:mod:`.service`); and a
butler's queue waits, cool-downs and spend against its budget (:mod:`.queue_report`).
"""
