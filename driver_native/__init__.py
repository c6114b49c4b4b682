"""The native driver (work in progress)."""
