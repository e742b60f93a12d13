"""The embedded server's TLS front as the server manager sees it: started, found, stopped.

Why apart from `embedded`: the front (`tlsfront`) is a process of its own beside the
server, found again by any later command through its state file, and the server's
lifecycle needs only a few answers of it: is one serving, on which loopback port should
the server listen for it, start one, stop it.

Invariants:
- A front is trusted only when its state file names a live process whose command line
  names that state file (`embeddedhost.is_front`): a pid reused by another process, or
  another home's front, is not ours to report or kill.
- Starting waits until the front has written its state file (it listens then); stopping
  waits until its process is gone, then removes the file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fleetq.core.embeddedconn import LOOPBACK, port_free
from fleetq.core.embeddedhost import ensure_server_user, is_front
from fleetq.core.errors import EmbeddedServerError
from fleetq.core.tlsfront import FrontState, read_state

FRONT_TIMEOUT_S = 15.0  # the TLS front's start and stop


class Front:
    """The TLS front of one home."""

    def __init__(
        self,
        state_file: Path,
        log_file: Path,
        port_file: Path,
        *,
        certificate: Path,
        key: Path,
        as_root: bool,
    ):
        self.state_file = state_file  # what it serves, for which server port, as which pid
        self.log_file = log_file
        self.port_file = port_file  # the server's loopback port for it, kept across starts
        self.certificate, self.key = certificate, key
        self.as_root = as_root  # then it serves as the server user

    def current(self) -> FrontState | None:
        """The TLS front named by its state file, when that process is alive."""
        state = read_state(self.state_file)
        if state is None or not is_front(state.pid, self.state_file):
            return None
        return state

    def start(self, listen: str, upstream: int) -> None:
        """Start the TLS front and wait until it listens (its state file names it)."""
        self.stop()
        argv = [sys.executable, "-m", "fleetq.core.tlsfront", "--listen", listen]
        argv += ["--upstream", str(upstream), f"--state={self.state_file}"]
        argv += ["--cert", str(self.certificate), "--key", str(self.key)]
        if self.as_root:
            argv += ["--user", ensure_server_user().pw_name]
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + FRONT_TIMEOUT_S
        while (state := read_state(self.state_file)) is None or state.pid != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:]
                raise EmbeddedServerError(
                    f"the TLS front for {listen} did not start"
                    + (f": {tail[0]}" if tail else "")
                    + f" (log: {self.log_file}); the server runs for the Unix socket meanwhile"
                )
            time.sleep(0.02)  # polling the state file the front writes once it listens

    def stop(self) -> None:
        """Stop the TLS front, if one runs, and wait for it to be gone."""
        state = self.current()
        if state is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pid, signal.SIGTERM)
            deadline = time.monotonic() + FRONT_TIMEOUT_S
            while is_front(state.pid, self.state_file) and time.monotonic() < deadline:
                time.sleep(0.02)  # polling for the process to be gone
            if is_front(state.pid, self.state_file):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.pid, signal.SIGKILL)
        self.state_file.unlink(missing_ok=True)

    def upstream_port(self, listen: tuple[str, int]) -> int:
        """The server's loopback port for its front: the one used before when it is
        free (DSNs of its Unix socket name it), else a free one, remembered."""
        with contextlib.suppress(OSError, ValueError):
            port = int(self.port_file.read_text())
            if port != listen[1] and port_free(port):
                return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((LOOPBACK, 0))
            port = int(probe.getsockname()[1])
        self.port_file.write_text(f"{port}\n")
        return port
