"""Make a ``wfe.drivers`` entry point visible the way an installed package does: a
``.dist-info`` folder (METADATA + entry_points.txt) on ``sys.path``."""

from __future__ import annotations

from pathlib import Path


def write_dist_info(site: Path, dist: str, drivers: dict[str, str]) -> Path:
    """Write ``site/<dist>-1.0.dist-info`` declaring ``drivers`` (name -> "module:factory")
    in the ``wfe.drivers`` group; put ``site`` on sys.path (or PYTHONPATH) to install it."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in drivers.items())
    (info / "entry_points.txt").write_text(f"[wfe.drivers]\n{lines}")
    return info
