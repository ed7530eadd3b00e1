"""The float64 reference oracle: the definition of correct for every kernel path."""

from oracles.attention import paged_attention_reference

__all__ = ["paged_attention_reference"]
