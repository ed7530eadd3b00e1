"""The machine: which device a command runs on, and what is installed there."""
