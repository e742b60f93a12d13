"""PostgreSQL's programs as the embedded server runs them: `initdb`, `pg_ctl` and friends,
as the server user when fleetq is root.

Why apart from `embedded`: which programs run (the wheel's own, or a copy the server user
can run, see `pgbinaries`) is found once, by trying them as that user, and every failure
must say where the server's log is; the server's lifecycle only says what to run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fleetq.core.embeddedhost import SERVER_USER, ensure_server_user, runs_as_server
from fleetq.core.errors import EmbeddedServerError
from fleetq.core.pgbinaries import Bundle, prune_copies, runnable_copy


class Programs:
    """The programs of `bundle`, run for the server rooted at `home`."""

    def __init__(
        self, bundle: Bundle, home: Path, *, log_file: Path, as_root: bool, timeout_s: float
    ):
        self.bundle = bundle  # the wheel's, or one tests lay out
        self.home = home  # the programs' working directory, and where a copy goes
        self.log_file = log_file  # the server's log, named when a program fails
        self.as_root = as_root  # then they run as the server user
        self.timeout_s = timeout_s
        self._runnable: Bundle | None = None  # found once: it probes as the server user

    def version(self) -> str:
        """The bundled PostgreSQL version, e.g. "18.6"."""
        out = subprocess.run(
            [str(self.bundle.bin / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip().rsplit(" ", 1)[-1]

    def run(self, argv: list[str]) -> None:
        """Run a bundled PostgreSQL program (as the server user when we are root)."""
        command = [str(self.runnable().bin / argv[0]), *argv[1:]]
        user = ensure_server_user().pw_name if self.as_root else None
        try:
            subprocess.run(
                command,
                check=True,
                capture_output=True,
                text=True,
                user=user,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                timeout=self.timeout_s,
            )
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip()
            raise EmbeddedServerError(
                f"{argv[0]} failed (exit {exc.returncode}): {detail}; server log: {self.log_file}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedServerError(f"{argv[0]} timed out; see {self.log_file}") from exc

    def prune_copies(self) -> None:
        """Remove copies of older wheels: call it while no server runs from them."""
        runnable = self.runnable()
        prune_copies(self.home, keep=runnable if runnable != self.bundle else None)

    def runnable(self) -> Bundle:
        """The wheel's own programs when the server user can run them there; else (as
        root, with the wheel somewhere `fleetq-pg` cannot enter) a copy under home that
        keeps the layout their libraries are found by (see `pgbinaries`)."""
        if self._runnable is None:
            self._runnable = self._find_runnable()
        return self._runnable

    def _find_runnable(self) -> Bundle:
        if not self.as_root or runs_as_server(self.bundle.bin) is None:
            return self.bundle
        copy = runnable_copy(self.bundle, self.home)
        if (failure := runs_as_server(copy.bin)) is not None:
            raise EmbeddedServerError(
                f"PostgreSQL's programs do not run as {SERVER_USER!r}, neither from "
                f"{self.bundle.bin} nor from the copy in {copy.bin}: {failure}"
            )
        return copy
