"""The migration files on disk: numbered migrations and the protocol's files.

Why apart from `migrate`: reading and checking the files needs no database (the wheel
test, `fleetq migrate --status` and the schema window all read them), and the rules of
their names and markers are stated here once:
- Files are `NNNN_description.sql`, numbered without gaps, applied in that order.
- A numbered migration is *expand* unless its leading comment lines hold `-- fleetq:
  contract`; `-- fleetq: expand` may be written too; any other value, a second marker or
  one below the first statement is refused, never read as no marker.
- The protocol's functions live in `migrations/protocol/concern.sql`, applied in name
  order whenever a file's checksum changes (see `migrate`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from fleetq.core.errors import MigrationError
from fleetq.core.resources import shipped_dir

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PROTOCOL_NAME = re.compile(r"^[a-z0-9_]+\.sql$")
# `-- fleetq: contract` (or `expand`), matched loosely so a misspelt one is refused, never
# read as no marker at all
_MARKER = re.compile(r"^--\s*fleetq\s*:(.*)$", re.IGNORECASE)
_KINDS = ("expand", "contract")
PROTOCOL = "protocol"  # the subdirectory of the migrations holding the protocol files


class Migration(BaseModel):
    """One migration file."""

    model_config = ConfigDict(frozen=True)

    version: int
    name: str
    path: Path
    checksum: str
    contract: bool = False  # `-- fleetq: contract` in its header

    def sql(self) -> bytes:
        """The file's bytes, exactly those that were checksummed."""
        return self.path.read_bytes()


def discover(directory: Path | None = None) -> list[Migration]:
    """The migration files in order; a misnamed file or a gap in numbering is an error,
    because it would silently reorder the schema's history."""
    directory = directory or shipped_dir("migrations")
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_description.sql")
        text = path.read_bytes()
        found.append(
            Migration(
                version=int(match[1]),
                name=path.name,
                path=path,
                checksum=hashlib.sha256(text).hexdigest(),
                contract=is_contract(path.name, text.decode("utf-8", errors="replace")),
            )
        )
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"{migration.name}: expected migration {expected:04d} here (numbering has a gap "
                "or a duplicate)"
            )
    return found


def is_contract(name: str, text: str) -> bool:
    """Whether a migration's leading comment lines hold `-- fleetq: contract`. A marker
    that is misspelt, repeated or below the first statement is an error, never a silent
    expand: a contract taken for an expand lets older code start on a schema it cannot
    use."""
    kinds: list[str] = []
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        match = _MARKER.match(stripped)
        if match is None:
            in_header = in_header and (not stripped or stripped.startswith("--"))
            continue
        kind = match[1].strip().lower()
        where = f"{name} line {number}: `{stripped}`"
        if kind not in _KINDS:
            raise MigrationError(f"{where}: the kind is `expand` or `contract`")
        if not in_header:
            raise MigrationError(f"{where}: the marker belongs in the leading comment lines")
        if kinds:
            raise MigrationError(f"{where}: a migration has one marker at most")
        kinds.append(kind)
    return kinds == ["contract"]


class ProtocolFile(BaseModel):
    """One file of protocol functions, re-applied when its checksum changes."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: Path
    checksum: str


def discover_protocol(directory: Path | None = None) -> list[ProtocolFile]:
    """The protocol files, in name order (the order they are applied in)."""
    base = (directory or shipped_dir("migrations")) / PROTOCOL
    found: list[ProtocolFile] = []
    for path in sorted(base.glob("*.sql")):
        if not _PROTOCOL_NAME.match(path.name):
            raise MigrationError(f"{PROTOCOL}/{path.name}: protocol files are named concern.sql")
        checksum = hashlib.sha256(path.read_bytes()).hexdigest()
        found.append(ProtocolFile(name=path.name, path=path, checksum=checksum))
    return found
