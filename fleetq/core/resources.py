"""Files fleetq ships beside its code: migrations and example configs.

In the repository they sit at the top level (DESIGN §8); the wheel carries them inside
the package (`fleetq/migrations`, `fleetq/examples`, see pyproject's force-include). This
is the one place that knows both locations, so an installed wheel and a checkout behave
the same.
"""

from __future__ import annotations

from pathlib import Path

import fleetq
from fleetq.core.errors import FleetqError


def shipped_dir(name: str) -> Path:
    """The directory `name` ("migrations", "examples") from the wheel or the checkout."""
    package = Path(fleetq.__file__).parent
    for candidate in (package / name, package.parent / name):
        if candidate.is_dir():
            return candidate
    raise FleetqError(f"fleetq is installed without its {name}/ directory (looked in {package})")
