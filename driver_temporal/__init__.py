"""The Temporal driver (work in progress)."""
