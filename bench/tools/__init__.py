"""Small profiling scripts behind the notes in ``bench/README.md`` (not part of the bench)."""
