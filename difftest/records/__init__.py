"""Records: repro files, the regression corpus, replay, and standalone export."""
