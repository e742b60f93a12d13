"""The embedded server: started once, found and reused by other processes, stopped."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from fleetq.core.embedded import EmbeddedServer
from fleetq.core.embeddedconn import fingerprint, front_only_hba, parse_listen
from fleetq.core.errors import EmbeddedServerError
from fleetq.core.pgbinaries import Bundle, installed, prune_copies, runnable_copy
from fleetq.core.tlsfront import SSL_REQUEST, read_state
from tests.conftest import make_home

pytestmark = pytest.mark.slow


@pytest.fixture
def home() -> Iterator[Path]:
    """A FLEETQ_HOME of the test's own; its server is stopped afterwards."""
    path = make_home()
    yield path
    EmbeddedServer(path).stop()
    shutil.rmtree(path, ignore_errors=True)


def _fleetq(home: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "FLEETQ_HOME": str(home)}
    env.pop("FLEETQ_DSN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "fleetq", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _run(home: Path, *args: str) -> tuple[int, str, str]:
    proc = _fleetq(home, *args)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_two_processes_start_one_server_and_share_it(home: Path) -> None:
    procs = [_fleetq(home, "server", "start", "--json") for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    first, second = (json.loads(out) for out, _ in results)
    assert first["pid"] == second["pid"]
    assert first["dsn"] == second["dsn"]
    with psycopg.connect(first["dsn"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("fleetq",)

    code, out, _ = _run(home, "server", "status", "--json")
    assert code == 0 and json.loads(out)["pid"] == first["pid"]

    code, out, _ = _run(home, "server", "stop")
    assert (code, out.strip()) == (0, "embedded server stopped")
    code, out, _ = _run(home, "server", "status")
    assert code == 3 and "stopped" in out
    code, out, _ = _run(home, "server", "stop")
    assert (code, out.strip()) == (0, "embedded server was not running")


def test_any_command_starts_the_server_on_first_use(home: Path) -> None:
    code, out, err = _run(home, "migrate")
    assert code == 0, err
    assert "schema up to date" in out
    assert EmbeddedServer(home).status().running


def test_stale_pid_file_is_detected_and_replaced(home: Path) -> None:
    server = EmbeddedServer(home)
    server.ensure_running()
    assert server.stop()
    # A postmaster.pid left by a crash, naming a pid that is not a postgres process.
    stale = subprocess.Popen(["sleep", "0"])
    stale.wait()
    lines = [str(stale.pid), str(server.pgdata), "0", "5432", str(home / "run"), "", "0", "ready"]
    (server.pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")
    assert not server.status().running
    status = server.ensure_running()
    assert status.running and status.pid != stale.pid


def test_listen_serves_tls_only(home: Path) -> None:
    """--listen served TCP with ssl=off: passwords and all traffic in clear over the network
    (issue 41, finding 13); then it refused, as the wheel's PostgreSQL has no TLS. Now the
    TLS front serves it, on a data directory made before (lines letting any address in,
    no certificate), which the --listen start upgrades."""
    server = EmbeddedServer(home)
    server._init_if_needed()
    hba = server.pgdata / "pg_hba.conf"
    with open(hba, "a") as f:  # what fleetq's init wrote before TLS
        f.write(
            "\n# fleetq: TCP clients (--listen) authenticate with HOME/password\n"
            "host all all 0.0.0.0/0 scram-sha-256\nhostssl all all ::/0 scram-sha-256\n"
        )
    assert not server.certificate.file.exists()
    port = _free_port()
    status = server.ensure_running(listen=f"127.0.0.1:{port}")
    assert status.tcp_dsn is not None and status.listen == f"127.0.0.1:{port}"
    assert "sslmode=require" in status.tcp_dsn and f":{port}/" in status.tcp_dsn

    # pg_hba: the front's loopback line only, and a second rewrite changes nothing
    lines = [line.split() for line in hba.read_text().splitlines()]
    assert [f[:4] for f in lines if f and f[0].startswith("host")] == [
        ["host", "all", "all", "127.0.0.1/32"]
    ]
    assert front_only_hba(hba.read_text()) == hba.read_text()
    # the key is the server user's own, 0600
    key = server.certificate.key_file.stat()
    owner = pwd.getpwnam("fleetq-pg").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert (stat.S_IMODE(key.st_mode), key.st_uid) == (0o600, owner)

    with psycopg.connect(status.tcp_dsn, connect_timeout=10) as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="TLS only"):
        psycopg.connect(status.tcp_dsn.replace("sslmode=require", "sslmode=disable"))
    # verify-full against a client's copy of the certificate, checked by its fingerprint
    copy = home / "client-copy.crt"
    shutil.copyfile(server.certificate.file, copy)
    assert status.fingerprint == fingerprint(copy.read_text())
    verified = status.tcp_dsn.replace("sslmode=require", f"sslmode=verify-full&sslrootcert={copy}")
    with psycopg.connect(verified, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    # the superuser's password is printed only when asked for (issue 13); the
    # fingerprint always
    password = (home / "password").read_text().strip()
    assert password not in status.tcp_dsn and "passfile=" in status.tcp_dsn
    code, out, _ = _run(home, "server", "status")
    assert code == 0 and password not in out and f"SHA-256 {status.fingerprint}" in out, out
    code, out, _ = _run(home, "server", "status", "--show-password")
    assert code == 0 and password in out, out
    without_password = f"postgresql://postgres@127.0.0.1:{port}/fleetq?sslmode=require"
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without_password, connect_timeout=10)
    with pytest.raises(EmbeddedServerError, match="already listens"):
        server.ensure_running(listen=f"127.0.0.1:{port + 1}")


def test_the_front_is_restarted_and_stopped_with_the_server(home: Path) -> None:
    """A front that died is started again by the next `start --listen` (the server and
    its clients on the socket stay up); `stop` stops both; a server started for the
    socket only is not given TCP behind its clients' backs."""
    server = EmbeddedServer(home)
    port = _free_port()
    status = server.ensure_running(listen=f"127.0.0.1:{port}")
    front = read_state(server.front_file)
    assert front is not None and status.pid is not None
    os.kill(front.pid, signal.SIGKILL)
    _wait_for(lambda: not _alive(front.pid), "the killed front to be gone")
    down = server.status()
    assert down.listen is None and down.front_down == f"127.0.0.1:{port}" and down.tcp_dsn is None
    again = server.ensure_running(listen=f"127.0.0.1:{port}")
    assert again.pid == status.pid and again.listen == f"127.0.0.1:{port}"
    assert again.tcp_dsn is not None
    with psycopg.connect(again.tcp_dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    restarted = read_state(server.front_file)
    assert restarted is not None and restarted.pid != front.pid
    assert server.stop()
    assert not _alive(restarted.pid) and not server.front_file.exists()

    server.ensure_running()  # the Unix socket only
    with pytest.raises(EmbeddedServerError, match="unix socket only"):
        server.ensure_running(listen=f"127.0.0.1:{port}")


def test_the_front_refuses_clear_text_and_slow_handshakes(home: Path) -> None:
    """What reaches the front before TLS: a startup packet in clear gets PostgreSQL's own
    error, a client that says nothing is dropped, and neither reaches the server."""
    server = EmbeddedServer(home)
    port = _free_port()
    server.ensure_running(listen=f"127.0.0.1:{port}")
    startup = b"\x00\x03\x00\x00user\x00postgres\x00database\x00fleetq\x00\x00"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(struct.pack("!I", len(startup) + 4) + startup)
        answer = raw.recv(4096)
    assert answer[:1] == b"E" and b"TLS only" in answer and b"28000" in answer
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(b"\x00\x00")  # half a length, then silence
        assert raw.recv(4096) == b""  # closed by the front's handshake deadline
    log = (home / "log" / "front.log").read_text()
    assert "refused: fleetq's embedded server serves TCP over TLS only" in log
    assert "dropped before its TLS handshake" in log


def test_clear_text_sent_with_the_ssl_request_never_reaches_the_server(home: Path) -> None:
    """Bytes a man in the middle appends in clear after the client's SSLRequest stay in
    the front's StreamReader buffer across start_tls and are piped to the server as if
    they had come inside TLS; the server's answer to them is then delivered inside the
    client's TLS session (CVE-2021-23214's class; PostgreSQL refuses such a connection:
    "received unencrypted data after SSL request")."""
    server = EmbeddedServer(home)
    port = _free_port()
    server.ensure_running(listen=f"127.0.0.1:{port}")
    with socket.create_connection(("127.0.0.1", port), timeout=15) as raw:
        startup = b"\x00\x03\x00\x00user\x00postgres\x00database\x00fleetq\x00\x00"
        injected = struct.pack("!I", len(startup) + 4) + startup  # in clear, pre-TLS
        raw.sendall(struct.pack("!II", 8, SSL_REQUEST) + injected)
        answered = raw.recv(4096)
    # refused before TLS, as PostgreSQL refuses it (the review's fix: once the front
    # answered `S`, the server's reply to the clear-text packet came inside TLS)
    assert answered[:1] == b"E" and b"08P01" in answered, answered
    assert b"unencrypted data after the SSL request" in answered


def test_a_stale_state_file_naming_another_homes_front(home: Path) -> None:
    """`is_front` accepts any process whose command line says fleetq.core.tlsfront, so a
    stale front.json whose pid is reused by another home's front (kill -9, OOM, reboot
    with several homes) makes `status`/`start --listen` report this home served while
    nothing listens, and this home's `stop` kills the other home's front."""
    home_b = make_home()
    a, b = EmbeddedServer(home), EmbeddedServer(home_b)
    port_a, port_b = _free_port(), _free_port()
    a.ensure_running(listen=f"127.0.0.1:{port_a}")
    b.ensure_running(listen=f"127.0.0.1:{port_b}")
    front_a, front_b = read_state(a.front_file), read_state(b.front_file)
    assert front_a is not None and front_b is not None
    os.kill(front_a.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(front_a.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    # the pid of A's dead front now names B's front, as a reused pid would
    stale = {"pid": front_b.pid, "listen": front_a.listen, "upstream": front_a.upstream}
    a.front_file.write_text(json.dumps(stale) + "\n")

    try:
        assert a.status().front_down == f"127.0.0.1:{port_a}"  # not B's front
        status = a.ensure_running(listen=f"127.0.0.1:{port_a}")  # so A's is started again
        assert status.listen == f"127.0.0.1:{port_a}"
        socket.create_connection(("127.0.0.1", port_a), timeout=10).close()
        a.stop()  # waits for what it stops to be gone: B's front must not be that
        assert _alive(front_b.pid)
        socket.create_connection(("127.0.0.1", port_b), timeout=10).close()
    finally:
        b.stop()
        shutil.rmtree(home_b, ignore_errors=True)


def test_sigterm_stops_the_front_with_clients_connected(home: Path) -> None:
    """On SIGTERM with an idle client connected the front lingered: 5 s on Python 3.11
    (it waited for the client's TLS close), and on Python >= 3.12 until every client
    left (`async with server` waits for connections), so `stop` SIGKILLed it."""
    server = EmbeddedServer(home)
    port = _free_port()
    status = server.ensure_running(listen=f"127.0.0.1:{port}")
    assert status.tcp_dsn is not None
    password = server.password_file.read_text().strip()
    front = read_state(server.front_file)
    assert front is not None
    client = psycopg.connect(status.tcp_dsn, password=password, connect_timeout=10)
    client.execute("SELECT 1")
    try:
        os.kill(front.pid, signal.SIGTERM)
        _wait_for(lambda: not _alive(front.pid), "the front to stop, a client still on it")
        with pytest.raises(psycopg.OperationalError):
            client.execute("SELECT 1")  # cut by the front, not closed by the client
    finally:
        client.close()


def _alive(pid: int) -> bool:
    try:
        return b"tlsfront" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_socket_directory_someone_else_made_is_refused(tmp_path: Path) -> None:
    """A long home puts the socket in a predictable /tmp/fleetq-<euid>-<hash>, which was
    accepted even when another user had made it first, mode 0777 (and could then answer
    for the server, or swap its socket)."""
    home = make_home() / ("h" * 90)
    home.mkdir()
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:10]
    planted = Path("/tmp") / f"fleetq-{os.geteuid()}-{digest}"  # noqa: S108 - the point
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(planted, nobody.pw_uid, nobody.pw_gid)
    else:  # not root: a symlink to a directory elsewhere stands for the foreign one
        planted.rmdir()
        planted.symlink_to(tmp_path)
    try:
        with pytest.raises(EmbeddedServerError, match="not this user's own directory"):
            EmbeddedServer(home).ensure_running()
    finally:
        EmbeddedServer(home).stop()
        if planted.is_symlink():
            planted.unlink()
        else:
            shutil.rmtree(planted, ignore_errors=True)
        shutil.rmtree(home.parent, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("value", ["6543", "host:", ":6543", "host:99999", "host:port"])
def test_listen_must_be_host_and_port(value: str) -> None:
    with pytest.raises(EmbeddedServerError, match="HOST:PORT"):
        parse_listen(value)


def test_a_private_home_works(home: Path) -> None:
    """A home made elsewhere with mode 700 (`mktemp -d`): as root, the server user must
    still be able to enter it (it failed in initdb before); as a user, nothing changes."""
    home.chmod(0o700)
    code, _out, err = _run(home, "server", "start")
    assert code == 0, err
    assert EmbeddedServer(home).status().running


# -- where PostgreSQL's programs run from ---------------------------------------------


@pytest.fixture(scope="module")
def private_wheel(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """The wheel laid out as a venv inside a checkout only its owner can enter: a clone
    under /root, or in `mktemp -d` (mode 700), with a space in its path for good measure."""
    private = tmp_path_factory.mktemp("private")
    private.chmod(0o700)
    return _lay_out(installed(), private / "my checkout" / "site-packages")


def _lay_out(wheel: Bundle, root: Path, version: str | None = None) -> Bundle:
    for part in wheel.parts():
        shutil.copytree(wheel.root / part, root / part, symlinks=True)
    return Bundle(root=root, version=version or wheel.version)


def _programs_run(programs: Path) -> None:
    for program in ("initdb", "pg_ctl", "postgres"):
        done = subprocess.run(
            [str(programs / program), "--version"], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{program}: {done.stderr}"


def test_a_copy_of_the_programs_finds_their_libraries(private_wheel: Bundle, home: Path) -> None:
    """The wheel's programs find libpq through an RPATH relative to themselves; a copy of
    `bin/` alone failed with exit 127 (`libpq-….so.5: cannot open shared object file`)."""
    copy = runnable_copy(private_wheel, home)
    assert copy.root == home / f"pginstall-{private_wheel.version}"
    _programs_run(copy.bin)
    assert runnable_copy(private_wheel, home) == copy  # reused while it matches


def test_a_copy_is_remade_when_the_wheel_changes(
    private_wheel: Bundle, home: Path, tmp_path: Path
) -> None:
    # What fleetq made before the libraries were copied: bin/ without its libraries.
    broken = home / f"pginstall-{private_wheel.version}"
    shutil.copytree(private_wheel.pginstall, broken, symlinks=True)
    copy = runnable_copy(private_wheel, home)
    assert (copy.libs).is_dir()
    _programs_run(copy.bin)

    # The same version rebuilt (auditwheel renames a library whose content changed).
    rebuilt = _lay_out(private_wheel, tmp_path / "rebuilt")
    next(rebuilt.libs.iterdir()).rename(rebuilt.libs / "libextra-0123abcd.so.1")
    assert (runnable_copy(rebuilt, home).libs / "libextra-0123abcd.so.1").exists()

    # A newer wheel gets its own copy; the older ones go once no server runs from them.
    newer = _lay_out(private_wheel, tmp_path / "newer", version="99.0.0")
    fresh = runnable_copy(newer, home)
    assert fresh.root == home / "pginstall-99.0.0"
    assert prune_copies(home, keep=fresh) == [copy.root]
    assert sorted(p.name for p in home.glob("pginstall-*")) == ["pginstall-99.0.0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="as a user, the server runs the wheel's programs")
def test_root_starts_the_server_from_a_checkout_only_root_can_enter(
    private_wheel: Bundle, home: Path
) -> None:
    """`git clone … ~/fleetq && uv run fleetq demo` as root: the server user cannot enter
    /root, so the programs run from a copy, which must keep their libraries."""
    (home / "pginstall-18.6").mkdir()  # left by an older fleetq: pruned at start
    server = EmbeddedServer(home, bundle=private_wheel)
    status = server.ensure_running()
    assert status.dsn is not None
    with psycopg.connect(status.dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("fleetq",)
    assert sorted(p.name for p in home.glob("pginstall-*")) == [
        f"pginstall-{private_wheel.version}"
    ]
    assert server.stop()


def test_a_home_with_spaces_and_quotes_works(tmp_path: Path) -> None:
    home = make_home() / "fleet's home"
    try:
        status = EmbeddedServer(home).ensure_running()
        assert status.dsn is not None
        with psycopg.connect(status.dsn, connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        EmbeddedServer(home).stop()
        shutil.rmtree(home.parent, ignore_errors=True)
