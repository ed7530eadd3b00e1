"""Interfaces: the command line, the pytest plugin, the gate and the console report."""
