"""The float64 reference oracle (:mod:`difftest.oracle.attention`): the definition of correct for
every kernel path. It imports nothing from difftest or any kernel library."""
