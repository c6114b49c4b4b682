"""A mutation check of the conformance suite: plant one bug at a time in a copy of the tree
and show the contract tests fail (``python -m tests.mutation``, see conformance/README.md)."""
