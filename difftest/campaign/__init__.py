"""The campaign: planned cases, the run loop, shards and profiles."""
