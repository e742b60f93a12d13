"""Gateways for the scale benchmark: `fleetq api` processes in front of a scratch
database (their pools through PgBouncer in transaction mode, if asked), and a runner
token for each simulated runner. Runner i talks to gateway i mod count: what a load
balancer in front of them would spread."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from fleetq.core import roles, tokens
from fleetq.core.db import connect
from fleetq_bench.pgbouncer import PgBouncer

START_S = 60.0  # a gateway answers health within this, or the benchmark stops


class Gateways:
    """`count` gateway processes (`urls`), each a pool of `pool_size` connections; with
    `pgbouncer`, the pools go through one PgBouncer of `bouncer_pool` server connections
    and each process's LISTEN session straight to PostgreSQL, as docs/operations.md says."""

    def __init__(
        self,
        dsn: str,
        *,
        count: int = 2,
        pool_size: int = 10,
        pgbouncer: bool = False,
        bouncer_pool: int = 20,
    ) -> None:
        self.dsn, self.count, self.pool_size = dsn, count, pool_size
        self.bouncer = (
            PgBouncer(dsn, pool_size=bouncer_pool, max_clients=4000) if pgbouncer else None
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = Path(tempfile.mkdtemp(prefix="fleetq-bench-gateways-"))
        self.urls: list[str] = []

    def __enter__(self) -> Gateways:
        try:
            if self.bouncer is not None:
                self.bouncer.start()
            for i in range(self.count):
                self.urls.append(self._start(i))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self, i: int) -> str:
        via = ["--pgbouncer", "--session-dsn", self.dsn] if self.bouncer is not None else []
        dsn = self.bouncer.dsn if self.bouncer is not None else self.dsn
        log = self.logs / f"gateway{i}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "fleetq", "--dsn", dsn, "api"),
                    *("--listen", "127.0.0.1:0", "--pool-size", str(self.pool_size)),
                    *("--max-connections", "5000", *via),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway {i} exited: {log.read_text(errors='replace')}")
            found = re.search(r"listening on (https?://\S+)", log.read_text(errors="replace"))
            if found and _healthy(found.group(1)):
                return found.group(1)
            time.sleep(0.1)  # polling its log and health, with a deadline
        raise RuntimeError(f"gateway {i} did not answer within {START_S:.0f}s")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.bouncer is not None:
            self.bouncer.close()
        shutil.rmtree(self.logs, ignore_errors=True)

    def apis(self, secrets: list[str]) -> list[tuple[str, str]]:
        """Each runner's gateway and token: runner i to gateway i mod count."""
        return [(self.urls[i % len(self.urls)], s) for i, s in enumerate(secrets)]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def runner_tokens(dsn: str, runners: Sequence[str]) -> list[str]:
    """A runner token for each runner id, in order (`fleetq tokens add runner`)."""
    with connect(dsn, autocommit=True) as conn:
        return [
            tokens.add(
                conn,
                roles.Kind.RUNNER,
                runner,
                name=f"bench-{runner.replace('/', '.')}",
                created_by="bench",
            )[1]
            for runner in runners
        ]
