"""wfe_cli: the ``wfe`` command line, an application above the port and the drivers.

``wfe`` (the console script) and ``python -m wfe_cli`` run :func:`main`. The port
(``engine_port``) never imports this package; this package builds engines through the port
(``create_engine``, any installed driver) and imports a driver, the conformance kit or the web
view (``wfe_ui``) only inside the commands that need one.

Importing the package loads only :func:`main` (the console script's first import, which must be
quick: see ``_entry``); the other names load the command line when first used.
"""

from ._entry import main

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing; mypy knows the name)
if TYPE_CHECKING:
    from ._errors import EXIT_CODES, exit_code
    from ._main import app, build_app

__all__ = ["EXIT_CODES", "app", "build_app", "exit_code", "main"]


def __getattr__(name: str) -> object:
    if name in ("EXIT_CODES", "exit_code"):
        from . import _errors

        return getattr(_errors, name)
    if name in ("app", "build_app"):
        from . import _main

        return getattr(_main, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
