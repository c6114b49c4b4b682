"""wfe_cli: the ``wfe`` command line, an application above the port and the drivers.

``wfe`` (the console script) and ``python -m wfe_cli`` run :func:`main`. The port
(``engine_port``) never imports this package; this package builds engines through the port
(``create_engine``, any installed driver) and imports a driver, the conformance kit or the web
view (``wfe_ui``) only inside the commands that need one.
"""

from ._errors import EXIT_CODES, exit_code
from ._main import app, build_app, main

__all__ = ["EXIT_CODES", "app", "build_app", "exit_code", "main"]
