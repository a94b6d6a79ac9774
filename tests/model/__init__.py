"""Model-based, state-machine, differential and property tests (hypothesis)."""
