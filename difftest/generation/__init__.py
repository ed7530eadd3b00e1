"""Generation: case specs drawn by Hypothesis, and spec -> tensors (bit for bit on any device)."""
