"""Side-by-side benchmarks: the native and Temporal drivers against DBOS, hand-written
temporalio and the raw database floor, on the same five workloads, in one run.

``python -m bench`` (or ``./dev bench``) runs everything; ``--quick`` runs each workload once
at tiny size. Results go to ``bench/results/latest.json`` and ``latest.png``.
"""

__all__: list[str] = []
