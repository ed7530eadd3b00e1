"""Triage: what a finding needs (its trigger), which findings are one bug, and where its error
is."""
