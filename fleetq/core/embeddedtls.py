"""The certificate the embedded server's TLS front serves to `--listen` clients.

Why apart from `embedded`: the certificate is files, not a process. It is self-signed,
made at the first --listen start in the data directory (`server.crt`, `server.key` 0600,
the server user's), and kept: an operator may put a real one in its place, and a client
compares its fingerprint before trusting a copy.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from fleetq.core.embeddedconn import certificate_names, fingerprint, subject_alt_name
from fleetq.core.embeddedhost import give_to_server
from fleetq.core.errors import EmbeddedServerError

log = logging.getLogger("fleetq.core.embedded")  # the server's own log name


class Certificate:
    """A certificate and its key (PostgreSQL's default names in the data directory)."""

    def __init__(self, file: Path, key_file: Path, *, workdir: Path, as_root: bool):
        self.file, self.key_file = file, key_file
        self.workdir = workdir  # where openssl runs
        self.as_root = as_root  # then both files are the server user's

    def fingerprint(self) -> str | None:
        """The certificate's SHA-256 (colon-separated hex), None when there is none
        (or it is unreadable here): what a client compares before trusting a copy."""
        try:
            return fingerprint(self.file.read_text())
        except (OSError, ValueError):
            return None

    def ensure(self, host: str) -> None:
        """Make a certificate for `host` (the listen host) unless one is in place."""
        if not (self.file.exists() and self.key_file.exists()):
            self._make(host)

    def _make(self, host: str) -> None:
        """A self-signed certificate (its own root) naming what clients dial."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise EmbeddedServerError(
                "--listen serves TLS and needs a certificate: install the `openssl` command, "
                f"or put a certificate and its key in {self.file} and "
                f"{self.key_file} (mode 0600)"
            )
        names = certificate_names(host)
        key = self.key_file.with_name(self.key_file.name + ".new")
        crt = self.file.with_name(self.file.name + ".new")
        argv = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt"]
        argv += ["ec_paramgen_curve:prime256v1", "-nodes", "-sha256", "-days", "3650"]
        argv += ["-subj", f"/CN={names[0]}", "-addext", "subjectAltName=" + subject_alt_name(names)]
        argv += ["-keyout", str(key), "-out", str(crt)]
        try:
            subprocess.run(argv, check=True, capture_output=True, text=True, cwd=self.workdir)
        except subprocess.CalledProcessError as exc:
            raise EmbeddedServerError(
                f"openssl could not make the server's certificate: {exc.stderr.strip()}"
            ) from exc
        for made in (key, crt):
            made.chmod(0o600 if made == key else 0o644)
            if self.as_root:
                give_to_server(made)
        # the key first: a certificate in place means its key is there too
        key.replace(self.key_file)
        crt.replace(self.file)
        log.info("made a self-signed certificate for %s in %s", ", ".join(names), crt.parent)
