"""Calibration: mutant kernels with planted bugs, and the self-test that measures difftest on
them."""
