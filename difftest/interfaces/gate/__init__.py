"""The pre-merge gate: the ``ci/gate`` command (:mod:`.command`) and what a run leaves behind
(:mod:`.report`)."""
