"""The embedded server's superuser login for TCP clients (`--listen`), and its DSNs.

Why apart from `embedded`: TCP logins authenticate with the password generated at init
and kept in `HOME/password` (mode 0600); the DSN fleetq shows must not hold it, so it
names a pgpass file made from it instead. Remote runners should get logins of their own
(`fleetq roles add-runner`) rather than this superuser's.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import quote

from fleetq.core.embeddedconn import DATABASE, SUPERUSER


class SuperuserLogin:
    """The superuser's password, and the pgpass file made from it."""

    def __init__(self, password_file: Path, pgpass_file: Path):
        self.password_file = password_file
        self.pgpass_file = pgpass_file

    def create(self) -> str:
        """A new password, written (mode 0600) for the data directory `initdb` makes."""
        password = secrets.token_urlsafe(24)
        self.password_file.touch(mode=0o600)
        self.password_file.write_text(password + "\n")
        return password

    def tcp_dsn(self, host: str, port: int) -> str:
        """The TCP DSN with no password in it: `passfile=` names a pgpass file (mode
        0600) beside the password, so the DSN can be shown, logged and put on a command
        line."""
        query = f"passfile={quote(str(self.pgpass_file))}&" if self._write_pgpass() else ""
        return f"postgresql://{SUPERUSER}@{_shown(host)}:{port}/{DATABASE}?{query}sslmode=require"

    def tcp_dsn_with_password(self, host: str, port: int) -> str | None:
        """The TCP DSN with the password in it; None when the password is unreadable."""
        try:
            password = self.password_file.read_text().strip()
        except OSError:
            return None
        auth = f"{SUPERUSER}:{quote(password, safe='')}"
        return f"postgresql://{auth}@{_shown(host)}:{port}/{DATABASE}?sslmode=require"

    def _write_pgpass(self) -> bool:
        """HOME/pgpass from HOME/password (once); False when the password is unreadable."""
        if self.pgpass_file.exists():
            return True
        try:
            password = self.password_file.read_text().strip()
            fd = os.open(self.pgpass_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return True
        except OSError:
            return False
        with os.fdopen(fd, "w") as f:
            escaped = password.replace("\\", "\\\\").replace(":", "\\:")
            f.write(f"*:*:*:{SUPERUSER}:{escaped}\n")
        return True


def _shown(host: str) -> str:
    """The host a DSN names: a wildcard listen address is reached as `localhost`."""
    return "localhost" if host in ("*", "0.0.0.0", "::") else host  # noqa: S104
