"""The command line is an application above the port and the drivers (issue 17): the port
imports no driver, no conformance kit and no application, not even lazily by name, and the
``wfe`` command comes from ``wfe_cli``."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _forbidden(module: str) -> bool:
    """What the port never imports: a driver (driver_*), the conformance kit, an application
    (wfe_*)."""
    top = module.split(".", maxsplit=1)[0]
    return top == "conformance" or top.startswith(("driver_", "wfe_"))


def _named_by_call(node: ast.Call) -> str | None:
    """The module a call imports by name: ``importlib.import_module("x")``,
    ``import_module("x")`` or ``__import__("x")``; None for any other call."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def imported_modules(source: str) -> list[str]:
    """Every module ``source`` imports: import statements at the top or inside a function,
    and modules imported by name through importlib or ``__import__``."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Call):
            named = _named_by_call(node)
            if named is not None:
                out.append(named)
    return out


def test_the_scan_finds_every_way_of_importing_by_name() -> None:
    source = """
import importlib
from importlib import import_module
import driver_native
from conformance._cli import run

def later():
    import wfe_ui
    from driver_temporal import SEARCH_ATTRIBUTES
    importlib.import_module("wfe_cli")
    import_module("driver_memory._engine")
    __import__("conformance")
    importlib.import_module(name_in_a_variable)
"""
    found = [m for m in imported_modules(source) if _forbidden(m)]
    assert found == [
        "driver_native",
        "conformance._cli",
        "wfe_ui",
        "driver_temporal",
        "wfe_cli",
        "driver_memory._engine",
        "conformance",
    ]
    assert not _forbidden("engine_port._drivers") and not _forbidden("prometheus_client")


def test_the_port_imports_no_driver_conformance_or_application_even_lazily() -> None:
    """import-linter sees import statements only; this also finds import_module("...")."""
    found = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "engine_port").rglob("*.py"))
        for module in imported_modules(path.read_text(encoding="utf-8"))
        if _forbidden(module)
    ]
    assert found == [], "the port builds drivers through the wfe.drivers entry points only"


def test_the_cli_uses_only_the_public_port() -> None:
    """An application reads the port as a caller does: no engine_port._* module (and not the
    driver interface either)."""
    public = {"engine_port", "engine_port.authoring", "engine_port.calling", "engine_port.errors"}
    private = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "wfe_cli").rglob("*.py"))
        for module in imported_modules(path.read_text(encoding="utf-8"))
        if module.split(".")[0] == "engine_port" and module not in public
    ]
    assert private == [], "import these from engine_port (make the name public if it must be)"


def test_wfe_cli_public_names_are_frozen() -> None:
    import wfe_cli

    assert sorted(wfe_cli.__all__) == ["EXIT_CODES", "app", "build_app", "exit_code", "main"]


def test_importing_the_port_loads_no_driver_conformance_or_application() -> None:
    code = (
        "import sys, engine_port, engine_port.errors, engine_port.driver\n"
        "import engine_port.authoring, engine_port.calling\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'conformance'"
        " or m.split('.')[0].startswith(('driver_', 'wfe_')))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.stdout.strip() == ""


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_wfe_script_is_the_application_package() -> None:
    project = _pyproject()
    assert project["project"]["scripts"] == {"wfe": "wfe_cli:main"}  # type: ignore[index]
    tool = project["tool"]
    assert "wfe_cli" in tool["hatch"]["build"]["targets"]["wheel"]["packages"]  # type: ignore[index]
    assert "wfe_cli" in tool["mypy"]["packages"]  # type: ignore[index]
    linter = tool["importlinter"]  # type: ignore[index]
    assert "wfe_cli" in linter["root_packages"]
    (layers,) = [c["layers"] for c in linter["contracts"] if c["type"] == "layers"]
    assert layers[0] == "wfe_cli"  # on top: it may import the web view, the drivers, the port
    assert layers[-1] == "engine_port"


@pytest.mark.parametrize(
    ("module", "works"), [("wfe_cli", True), ("engine_port", False)], ids=["wfe_cli", "port"]
)
def test_python_dash_m_runs_the_cli_from_wfe_cli_only(module: str, works: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    if works:
        assert done.returncode == 0, done.stderr
        assert "worker" in done.stdout and "conformance" in done.stdout
    else:
        assert done.returncode != 0
        assert "cannot be directly executed" in done.stderr
