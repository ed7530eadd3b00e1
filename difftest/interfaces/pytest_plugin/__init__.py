"""The pytest plugin: its hooks and fixtures (:mod:`.hooks`) and where each setting comes from
(:mod:`.options`)."""
