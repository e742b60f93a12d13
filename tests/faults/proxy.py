"""A TCP fault proxy between one runner and PostgreSQL (standard library asyncio).

It listens on 127.0.0.1 and forwards each connection to the server, over TCP or over the
server's Unix socket (so the embedded server's local trust auth still applies). Modes:

- `pass`: forward both ways;
- `blackhole`: a partition. Nothing is forwarded any more, in either direction, on old
  or new connections; nothing is closed either, so the runner sees silence, not an
  error, exactly as when a network path dies;
- `heal()`: back to `pass`, resetting the connections the partition held (their
  protocol state is unknown), so the runner reconnects;
- `degrade(latency_s, drop, lose_replies)`: each chunk waits `latency_s`; with
  probability `drop` a chunk in either direction resets the connection (RST) instead of
  passing; with probability `lose_replies` a chunk from the server does (the statement
  ran, possibly committed, and its reply is lost); with `reset_every` N, every Nth
  chunk it carries (counted over all its connections, both ways, from the `degrade` call)
  resets its connection instead: a lossy link without the luck, on which no exchange of
  N chunks or more gets through in one go.

The proxy runs its own event loop in a thread, so a test drives it from synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

_CHUNK = 65536


class FaultProxy:
    """One proxy in front of the server that `dsn` names."""

    def __init__(self, dsn: str) -> None:
        self.target_dsn = dsn
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        host = (query.get("host") or [parts.hostname or "localhost"])[0]
        port = int((query.get("port") or [str(parts.port or 5432)])[0])
        self._unix = Path(host) / f".s.PGSQL.{port}" if host.startswith("/") else None
        self._tcp = (host, port)
        self._writers: set[asyncio.StreamWriter] = set()
        self.latency_s = self.drop = self.lose_replies = 0.0
        self.reset_every = 0
        self._chunks = 0
        self._resets = 0
        self._random = random.Random(dsn)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def dsn(self) -> str:
        """The DSN a runner uses to go through this proxy."""
        parts = urlsplit(self.target_dsn)
        query = "&".join(
            f"{k}={v[0]}" for k, v in parse_qs(parts.query).items() if k not in ("host", "port")
        )
        user = parts.username or "postgres"
        auth = f"{user}:{parts.password}@" if parts.password else f"{user}@"
        return urlunsplit(("postgresql", f"{auth}127.0.0.1:{self.port}", parts.path, query, ""))

    def blackhole(self) -> None:
        self._call(self._set_mode, "blackhole")

    def degrade(
        self,
        *,
        latency_s: float = 0.0,
        drop: float = 0.0,
        lose_replies: float = 0.0,
        reset_every: int = 0,
    ) -> None:
        self.latency_s, self.drop, self.lose_replies = latency_s, drop, lose_replies
        self.reset_every, self._chunks = reset_every, 0

    @property
    def resets(self) -> int:
        """Connections this proxy reset on purpose (drops and lost replies)."""
        return self._resets

    def heal(self) -> None:
        self._call(self._heal)

    def close(self) -> None:
        self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the loop's side ---------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open = asyncio.Event()  # set: forwarding; clear: a partition
        self._open.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _call(self, fn: object, *args: object) -> None:
        async def call() -> None:
            fn(*args)  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def _set_mode(self, mode: str) -> None:
        if mode == "blackhole":
            self._open.clear()
        else:
            self._open.set()

    def _heal(self) -> None:
        self._open.set()
        for writer in list(self._writers):
            _reset(writer)
        self._writers.clear()

    def _close(self) -> None:
        self._heal()
        self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            await self._open.wait()  # during a partition a new connection goes nowhere
            if client_w.is_closing():
                return
            if self._unix is not None:
                server_r, server_w = await asyncio.open_unix_connection(str(self._unix))
            else:
                server_r, server_w = await asyncio.open_connection(*self._tcp)
        except OSError:
            _reset(client_w)
            return
        self._writers.add(server_w)
        await asyncio.gather(
            self._pump(client_r, server_w, (client_w, server_w), from_server=False),
            self._pump(server_r, client_w, (client_w, server_w), from_server=True),
            return_exceptions=True,
        )
        for writer in (client_w, server_w):
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        *,
        from_server: bool,
    ) -> None:
        """Forward until either end closes or resets; then close the other end too (a
        process killed on a live host closes its socket, and the server hears of it: a
        reset on one side that left the other open kept a dead runner's backend alive,
        holding its row locks)."""
        try:
            while data := await reader.read(_CHUNK):
                await self._open.wait()  # a partition holds the bytes: silence, not an error
                if writer.is_closing():
                    return
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                odds = self.drop + (self.lose_replies if from_server else 0.0)
                self._chunks += 1
                if (odds and self._random.random() < odds) or (
                    self.reset_every and self._chunks % self.reset_every == 0
                ):
                    self._resets += 1
                    for end in pair:
                        _reset(end)
                    return
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a dropped path looks once it is noticed."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.close()


@contextlib.contextmanager
def fault_proxy(dsn: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(dsn)
    try:
        yield proxy
    finally:
        proxy.close()
