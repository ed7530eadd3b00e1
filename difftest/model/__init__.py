"""The model: what a case is (the spec), its tensors, the outcomes and the errors."""
