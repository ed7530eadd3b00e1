"""Execution: running cases through kernel paths (in this process or an isolated worker), in packed
launches, inside one run session."""
