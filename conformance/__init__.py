"""The conformance suite (work in progress)."""
