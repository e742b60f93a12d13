"""The API's listening socket: accepted connections must get TCP_NODELAY, or every
keep-alive response waits on Nagle and the client's delayed ACK (44 ms p50 per request
was measured before; the socket was made with proto 0, which asyncio does not take for
TCP)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from fleetq.cli.api import listen_address, listening_socket
from fleetq.core.errors import InvalidInput


async def test_accepted_connections_do_not_wait_on_nagle() -> None:
    sock = listening_socket("127.0.0.1", 0, "127.0.0.1:0")
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("socket")
        accepted.set_result(peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(connected, sock=sock)
    async with server:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()


def test_listen_addresses() -> None:
    assert listen_address("api.example:8080") == ("api.example", 8080)
    assert listen_address("[::1]:0") == ("::1", 0)
    for bad in ("8080", "host:", "host:http", "host:70000"):
        with pytest.raises(InvalidInput):
            listen_address(bad)
