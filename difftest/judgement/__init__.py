"""Judgement: the oracle's output, the noise-floor tolerance, verdicts and failure signatures."""
