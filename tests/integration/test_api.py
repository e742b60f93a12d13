"""The HTTP producer API (issue 17), tested as a client meets it: `fleetq api` started as
its own process on a gateway login, spoken to over TCP by a real HTTP client (httpx).

The gateway login holds no power of its own: every call acts for its bearer token, and
the protocol's checks (protocol/roles.sql) decide what the token's holder may do, so
each rule a login is held to (test_roles.py) is checked here over HTTP too.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import ssl
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from fleetq.core import roles, tokens, validation
from fleetq.core.db import SyncConnection, connect, with_database
from fleetq.core.errors import InvalidInput
from tests import factories, fleet
from tests.conftest import create_database, drop_database
from tests.faults.proxy import fault_proxy
from tests.fleet import OTHER_SHA, SHA
from tests.integration.conftest import Cli, login_dsn
from tests.locks import wait_for

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
MaxBody = 4096

Token = Callable[..., str]  # (kind, identity) -> a bearer token


@contextlib.contextmanager
def serving(
    dsn: str,
    *extra: str,
    log: list[str] | None = None,
    verify: str | None = None,
    health: int = 200,
) -> Iterator[str]:
    """`fleetq api` on a free port; its base URL once it answers health (over HTTPS:
    checked against `verify`, a CA file). Its stderr is read all along (it logs each
    request: a full pipe would stop it), into `log`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetq", "--dsn", dsn, "api", "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if log is not None:
                log.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=drain, daemon=True).start()
    try:
        try:
            first = lines.get(timeout=30)
        except queue.Empty:
            raise AssertionError("fleetq api printed no address within 30 s") from None
        while "listening on" not in first:  # a line said before it (a warning)
            first = lines.get(timeout=30)
        found = re.search(r"https?://\S+", first)
        assert found, first
        base = found.group(0)

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                trust = ssl.create_default_context(cafile=verify) if verify else True
                answer = httpx.get(f"{base}/v1/health", timeout=2, verify=trust)
                return answer.status_code == health
            return False

        wait_for(healthy, "the API answering health", deadline_s=30)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def api_db(server_dsn: str, template_db: str) -> Iterator[str]:
    """One database for the module's tests, which share one server (each test uses
    identities and a commit of its own, so none sees another's jobs)."""
    name = create_database(server_dsn, template_db)
    dsn = with_database(server_dsn, name)
    with connect(dsn, autocommit=True) as conn:
        fleet.operations(conn)
    yield dsn
    drop_database(server_dsn, name)


@pytest.fixture(scope="module")
def admin(api_db: str) -> Iterator[SyncConnection]:
    with connect(api_db, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def gateway_dsn(
    api_db: str, admin: SyncConnection, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A gateway login (roles are the cluster's: a unique name, dropped after)."""
    name = f"fq_gateway_{uuid.uuid4().hex[:10]}"
    roles.add(
        admin,
        roles.Kind.GATEWAY,
        "api",
        admin_dsn=api_db,
        password_file=tmp_path_factory.mktemp("gateway") / "pgpass",
        login=name,
    )
    yield login_dsn(api_db, name)
    roles.remove(admin, name)


@pytest.fixture(scope="module")
def api(gateway_dsn: str) -> Iterator[httpx.Client]:
    """The API on a gateway login (the recommended deployment), with a small body limit."""
    with (
        serving(
            gateway_dsn, "--max-body", str(MaxBody), "--max-runner-body", str(2 * MaxBody)
        ) as base,
        httpx.Client(base_url=base, timeout=10) as client,
    ):
        yield client


@pytest.fixture
def token(admin: SyncConnection) -> Token:
    """Make tokens; their names are unique to this test, the identities are as given."""
    suffix = uuid.uuid4().hex[:8]

    def make(kind: str, identity: str) -> str:
        _, secret = tokens.add(
            admin,
            roles.Kind(kind),
            identity,
            name=f"{identity.replace('/', '.')}-{suffix}",
            created_by="t",
        )
        return secret

    return make


@pytest.fixture
def sha() -> str:
    """A commit of this test's own, so results by commit see only its jobs."""
    return uuid.uuid4().hex + uuid.uuid4().hex[:8]


def _auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _job(**fields: object) -> dict[str, object]:
    return {"project": "webapp", "operation": "unit", "commit": SHA, **fields}


def _presenting(
    conn: psycopg.Connection[tuple[object, ...]], secret: str, query: str, *, raw: bool = False
) -> tuple[object, ...]:
    """Run `query` (on SHA) in a transaction that presents `secret` as the API does, or
    (`raw`) by setting `fleetq.token` directly, which any login can try."""
    present = (
        "SELECT set_config('fleetq.token', $1, true)"
        if raw
        else "SELECT * FROM fleetq.act_for_token($1)"
    )
    with conn.transaction(), psycopg.RawCursor(conn) as cursor:
        cursor.execute(present.encode(), [secret])
        cursor.execute(query.encode(), [SHA])
        row = cursor.fetchone()
    assert row is not None
    return row


def test_a_gateway_login_acts_only_for_a_token(
    gateway_dsn: str, token: Token, admin: SyncConnection, api_db: str, tmp_path: Path
) -> None:
    """Straight at the database, no API in between: what a stolen gateway DSN is worth."""
    secret = token("submitter", "alice")
    submit = "SELECT * FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'x', '{}')"
    with psycopg.connect(gateway_dsn, autocommit=True) as conn:
        cursor = psycopg.RawCursor(conn)
        with pytest.raises(psycopg.Error, match="acts only for an API token"):
            cursor.execute(submit, [SHA])
        with pytest.raises(psycopg.Error, match="invalid or revoked API token"):
            _presenting(conn, "fq_guess", submit)
        with pytest.raises(psycopg.Error, match="invalid or revoked API token"):
            _presenting(conn, "fq_guess", submit, raw=True)
        job = _presenting(conn, secret, submit)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            cursor.execute("SELECT * FROM fleetq.api_tokens")
    who = admin.execute("SELECT submitted_by FROM fleetq.jobs WHERE id = $1", [job[0]])
    assert who.fetchone() == ("alice",)
    # any other login presenting a token is refused: a token is not a way to climb
    name = f"fq_submitter_{uuid.uuid4().hex[:10]}"
    roles.add(
        admin,
        roles.Kind.SUBMITTER,
        "bob",
        admin_dsn=api_db,
        password_file=tmp_path / "p",
        login=name,
    )
    try:
        with psycopg.connect(login_dsn(api_db, name), autocommit=True) as conn:
            cursor = psycopg.RawCursor(conn)
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                _presenting(conn, secret, submit, raw=True)
            assert "cannot act for an API token" in str(refused.value)
    finally:
        roles.remove(admin, name)


def test_submit_is_idempotent_by_key_and_answers_where_the_job_is(
    api: httpx.Client, token: Token
) -> None:
    ci = _auth(token("submitter", "ci-bot"))
    first = api.post("/v1/jobs", json=_job(), headers={**ci, "Idempotency-Key": "build-7"})
    assert first.status_code == 201, first.text
    job = first.json()
    assert job["created"] and job["state"] == "queued"
    assert first.headers["Location"] == f"/v1/jobs/{job['job_id']}"
    # a retried request (a lost reply): the same job, 200, nothing new queued
    again = api.post("/v1/jobs", json=_job(), headers={**ci, "Idempotency-Key": "build-7"})
    assert again.status_code == 200 and again.json()["job_id"] == job["job_id"]
    assert not again.json()["created"]
    # the key in the body works as the header does
    body_key = api.post("/v1/jobs", json=_job(idempotency_key="build-7"), headers=ci)
    assert body_key.json()["job_id"] == job["job_id"]
    # the same key for another request is a conflict, not a silent second job
    other = api.post(
        "/v1/jobs", json=_job(commit=OTHER_SHA), headers={**ci, "Idempotency-Key": "build-7"}
    )
    assert other.status_code == 409 and other.json()["error"]["type"] == "idempotency_conflict"
    # waiting on a job is part of the request too (issue 43, finding 2)
    waits = api.post(
        "/v1/jobs", json=_job(after=[job["job_id"]]), headers={**ci, "Idempotency-Key": "build-7"}
    )
    assert waits.status_code == 409, waits.text
    both = api.post(
        "/v1/jobs", json=_job(idempotency_key="a"), headers={**ci, "Idempotency-Key": "b"}
    )
    assert both.status_code == 400
    status = api.get(job and f"/v1/jobs/{job['job_id']}", headers=ci).json()
    assert status["submitted_by"] == "ci-bot" and status["idempotency_key"] == "build-7"


def test_the_priority_class_follows_the_token_never_the_request(
    api: httpx.Client, token: Token, admin: SyncConnection
) -> None:
    """release-bot's identity buys class 0; a submitter cannot name it, in any field."""
    release = api.post("/v1/jobs", json=_job(), headers=_auth(token("submitter", "release-bot")))
    plain = api.post("/v1/jobs", json=_job(), headers=_auth(token("submitter", "alice")))
    assert release.json()["priority_class"] == 0
    assert plain.json()["priority_class"] > 0
    named = api.post(
        "/v1/jobs",
        json=_job(submitted_by="release-bot"),
        headers=_auth(token("submitter", "mallory")),
    )
    assert named.status_code == 400
    assert named.json()["error"]["message"] == "submitted_by is not a field of this request"
    row = admin.execute(
        "SELECT submitted_by FROM fleetq.jobs WHERE id = $1", [plain.json()["job_id"]]
    ).fetchone()
    assert row == ("alice",)


def test_each_token_may_do_what_its_kind_may(api: httpx.Client, token: Token) -> None:
    alice, bob = _auth(token("submitter", "alice")), _auth(token("submitter", "bob"))
    operator, reader = _auth(token("operator", "ops")), _auth(token("reader", "dash"))
    mine = api.post("/v1/jobs", json=_job(), headers=alice).json()["job_id"]
    theirs = api.post("/v1/jobs", json=_job(), headers=bob).json()["job_id"]
    # a submitter cancels its own jobs only
    refused = api.post(f"/v1/jobs/{theirs}/cancel", headers=alice)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["message"] == "submitter alice may cancel only its own jobs"
    assert api.get(f"/v1/jobs/{theirs}", headers=alice).json()["state"] == "queued"
    cancelled = api.post(f"/v1/jobs/{mine}/cancel", headers=alice, json={"reason": "mine"})
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    # an operator cancels anyone's, audited as itself
    assert api.post(f"/v1/jobs/{theirs}/cancel", headers=operator).status_code == 200
    assert api.get(f"/v1/jobs/{theirs}", headers=reader).json()["cancelled_by"] == "ops"
    # a reader reads, and nothing else
    submit = api.post("/v1/jobs", json=_job(), headers=reader)
    assert submit.status_code == 403
    assert "dash (a reader token) may not do this" in submit.json()["error"]["message"]
    assert api.get("/v1/whoami", headers=reader).json() == {"kind": "reader", "identity": "dash"}


def test_no_token_or_a_revoked_one_is_refused(
    api: httpx.Client, token: Token, admin: SyncConnection
) -> None:
    missing = api.get("/v1/whoami")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    assert api.get("/v1/whoami", headers=_auth("fq_made-up")).status_code == 401
    assert api.get("/v1/whoami", headers={"Authorization": "Basic eDp5"}).status_code == 401
    secret = token("submitter", "leaver")
    assert api.get("/v1/whoami", headers=_auth(secret)).status_code == 200
    name = admin.execute("SELECT name FROM fleetq.api_tokens WHERE subject = 'leaver'").fetchone()
    assert name is not None and tokens.revoke(admin, name[0])
    revoked = api.post("/v1/jobs", json=_job(), headers=_auth(secret))
    assert revoked.status_code == 401
    assert revoked.json()["error"]["message"] == "invalid or revoked API token"


def _cli_message(check: Callable[[], object]) -> str:
    with pytest.raises(InvalidInput) as exc:
        check()
    return str(exc.value)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"commit": "abc123"}, lambda: validation.commit_sha("abc123")),
        ({"payload": [1]}, lambda: validation.payload([1])),  # type: ignore[arg-type]
        ({"project": "we\x1bb"}, lambda: validation.text("we\x1bb", "project")),
        ({"after": [0]}, lambda: validation.job_ids([0], "after")),
        ({"node": ""}, lambda: validation.optional_text("", "node")),
    ],
)
def test_bad_input_gets_the_clis_message(
    api: httpx.Client, token: Token, fields: dict[str, object], expected: Callable[[], object]
) -> None:
    answer = api.post("/v1/jobs", json=_job(**fields), headers=_auth(token("submitter", "ci")))
    assert answer.status_code == 400
    assert answer.json()["error"] == {"type": "invalid_input", "message": _cli_message(expected)}


def test_malformed_requests_are_refused_by_field_without_echoing_them(
    api: httpx.Client, token: Token
) -> None:
    ci = _auth(token("submitter", "ci"))
    cases = {
        b'{"project": "webapp"': "the request body is not valid JSON",
        b'{"project": "webapp", "operation": "unit"}': "commit is required",
        b"[1, 2]": "the request body must be a JSON object (Content-Type: application/json)",
    }
    for body, message in cases.items():
        answer = api.post(
            "/v1/jobs", content=body, headers={**ci, "Content-Type": "application/json"}
        )
        assert (answer.status_code, answer.json()["error"]["message"]) == (400, message)
    unknown = api.post("/v1/jobs", json=_job(project="nope"), headers=ci)
    assert unknown.status_code == 422 and unknown.json()["error"]["type"] == "not_allowed"
    assert api.get("/v1/jobs/0", headers=ci).status_code == 400
    assert api.get("/v1/jobs/424242", headers=ci).json()["error"] == {
        "type": "not_found",
        "message": "no job 424242",
    }


def test_request_bodies_over_the_limit_are_refused_before_they_are_read(
    api: httpx.Client, token: Token
) -> None:
    ci = _auth(token("submitter", "ci"))
    big = _job(payload={"blob": "x" * MaxBody})
    declared = api.post("/v1/jobs", json=big, headers=ci)
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["type"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        yield b'{"project": "webapp", "payload": {"blob": "'
        for _ in range(MaxBody // 512 + 2):
            yield b"x" * 512
        yield b'"}}'

    streamed = api.post("/v1/jobs", content=chunks(), headers=ci)
    assert streamed.status_code == 413, streamed.text
    fits = api.post("/v1/jobs", json=_job(payload={"blob": "x" * 100}), headers=ci)
    assert fits.status_code == 201


def test_trace_context_from_the_header_reaches_the_job(api: httpx.Client, token: Token) -> None:
    ci = _auth(token("submitter", "ci"))
    traced = api.post("/v1/jobs", json=_job(), headers={**ci, "traceparent": TRACE}).json()
    assert traced["warnings"] == []
    assert api.get(f"/v1/jobs/{traced['job_id']}", headers=ci).json()["traceparent"] == TRACE
    # a malformed header is ignored, as W3C asks of a receiver, and the answer says so
    garbled = api.post("/v1/jobs", json=_job(), headers={**ci, "traceparent": "00-zz"}).json()
    assert garbled["warnings"][0].startswith("ignored the traceparent header")
    assert api.get(f"/v1/jobs/{garbled['job_id']}", headers=ci).json()["traceparent"] is None


def test_dependencies_and_results_by_project_and_commit(
    api: httpx.Client, token: Token, sha: str
) -> None:
    ci = _auth(token("submitter", "ci"))
    nothing = api.get(f"/v1/results/webapp/{sha.upper()}", headers=ci).json()
    assert (nothing["status"], nothing["commit"], nothing["operations"]) == ("pending", sha, [])
    first = api.post("/v1/jobs", json=_job(commit=sha), headers=ci).json()["job_id"]
    then = api.post(
        "/v1/jobs", json=_job(commit=sha, operation="browser", after=[first]), headers=ci
    ).json()
    assert then["state"] == "waiting"
    assert api.get(f"/v1/jobs/{then['job_id']}", headers=ci).json()["waiting_on"] == [first]
    live = api.get(f"/v1/results/webapp/{sha}?operation=unit", headers=ci).json()
    assert live["status"] == "pending" and live["operations"][0]["status"] == "live"
    # the first is cancelled: its dependent is cancelled naming it; neither decided
    # anything about the commit (issue 42, finding 4: a cancel read as a failure)
    assert api.post(f"/v1/jobs/{first}/cancel", headers=ci).status_code == 200
    dependent = api.get(f"/v1/jobs/{then['job_id']}", headers=ci).json()
    assert dependent["state"] == "cancelled"
    assert f"dependency failed: job {first}" in dependent["cancel_reason"]
    done = api.get(f"/v1/results/webapp/{sha}", headers=ci).json()
    assert done["status"] == "pending"
    assert {o["status"] for o in done["operations"]} == {"cancelled"}
    reasons = {o["operation"]: o["reason"] for o in done["operations"]}
    assert f"dependency failed: job {first}" in reasons["browser"], reasons
    unknown = api.get(f"/v1/results/nope/{SHA}", headers=ci)
    assert unknown.status_code == 422
    short = api.get("/v1/results/webapp/abc", headers=ci)
    assert short.status_code == 400


def test_the_openapi_document_describes_every_route_and_the_bearer_scheme(
    api: httpx.Client,
) -> None:
    doc = api.get("/openapi.json").json()
    assert set(doc["paths"]) == {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/results/{project}/{commit}",
        "/v1/whoami",
        "/v1/health",
        "/v1/runner/calls",
        "/v1/runner/wake",
    }
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    submit = doc["paths"]["/v1/jobs"]["post"]
    assert {"201", "200", "400", "401", "403", "409", "422", "503"} <= set(submit["responses"])
    assert api.get("/v1/health").json()["status"] == "ok"
    # a commit is a full SHA, in the body and in a path (issue 42, item 9)
    sha = {"pattern": "^[0-9a-fA-F]{40}$"}
    assert (
        sha.items() <= doc["components"]["schemas"]["SubmitRequest"]["properties"]["commit"].items()
    )
    result = doc["paths"]["/v1/results/{project}/{commit}"]["get"]
    commit = next(p for p in result["parameters"] if p["name"] == "commit")
    assert sha.items() <= commit["schema"].items()
    # no FastAPI "Validation Error" 422: a malformed request is answered 400
    assert "HTTPValidationError" not in json.dumps(doc)


def test_no_page_loads_scripts_from_a_cdn(api: httpx.Client) -> None:
    """/docs and /redoc loaded Swagger UI and ReDoc from a CDN: blank offline (issue 42,
    item 9). They are gone; the schema is /openapi.json."""
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = api.get(page)
        assert answer.status_code == 404, (page, answer.text)
    assert api.get("/openapi.json").status_code == 200


BIGINT_MAX = 2**63 - 1


def test_every_documented_status_is_answered_and_every_answer_documented(
    api: httpx.Client, api_db: str, token: Token, sha: str
) -> None:
    """For each operation of /openapi.json: the statuses its requests really get, driven
    one by one (ok, malformed, no token, not allowed, missing, conflicting, too large,
    unknown, the database away), are exactly the statuses it documents (issue 42,
    item 9: 422 was documented where 400 is answered; 413 was not; a submitter's cancel
    of a missing job answered 403; GET documented a 403 no token gets)."""
    doc = api.get("/openapi.json").json()
    documented = {
        (method.upper(), path): {int(code) for code in operation["responses"]}
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
    }
    ci, other = _auth(token("submitter", "contract")), _auth(token("submitter", "contract-2"))
    reader, operator = _auth(token("reader", "contract-r")), _auth(token("operator", "contract-o"))
    key = {"Idempotency-Key": f"contract-{sha}"}
    mine = api.post("/v1/jobs", json=_job(commit=sha), headers=ci).json()["job_id"]
    theirs = api.post("/v1/jobs", json=_job(commit=sha), headers=other).json()["job_id"]
    big = "x" * MaxBody
    job, cancel = "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel"
    result = "/v1/results/{project}/{commit}"
    calls, wake = "/v1/runner/calls", "/v1/runner/wake"
    call = {"name": "runners_lease_seconds"}
    runner = _auth(token("runner", "node-contract/r"))
    probes: list[tuple[str, str, str, dict[str, Any]]] = [
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(commit=sha), "headers": {**ci, **key}}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(commit=sha), "headers": {**ci, **key}}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(commit="abc123"), "headers": ci}),
        ("POST", "/v1/jobs", "/v1/jobs", {"content": b"{", "headers": ci}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(extra=1), "headers": ci}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job()}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(), "headers": _auth("fq_guess")}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(), "headers": reader}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(), "headers": {**ci, **key}}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(payload={"b": big}), "headers": ci}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(project="nope"), "headers": ci}),
        ("POST", "/v1/jobs", "/v1/jobs", {"json": _job(after=[BIGINT_MAX]), "headers": ci}),
        ("GET", job, f"/v1/jobs/{mine}", {"headers": ci}),
        ("GET", job, f"/v1/jobs/{theirs}", {"headers": ci}),  # every token reads every job
        ("GET", job, f"/v1/jobs/{mine}", {"headers": reader}),
        ("GET", job, "/v1/jobs/0", {"headers": ci}),
        ("GET", job, "/v1/jobs/x", {"headers": ci}),
        ("GET", job, f"/v1/jobs/{mine}", {}),
        ("GET", job, f"/v1/jobs/{BIGINT_MAX}", {"headers": ci}),
        ("POST", cancel, f"/v1/jobs/{mine}/cancel", {"headers": ci, "json": {"reason": "x"}}),
        ("POST", cancel, f"/v1/jobs/{theirs}/cancel", {"headers": operator}),
        ("POST", cancel, "/v1/jobs/0/cancel", {"headers": ci}),
        ("POST", cancel, f"/v1/jobs/{mine}/cancel", {"headers": ci, "json": {"why": "x"}}),
        ("POST", cancel, f"/v1/jobs/{mine}/cancel", {}),
        ("POST", cancel, f"/v1/jobs/{theirs}/cancel", {"headers": ci}),
        ("POST", cancel, f"/v1/jobs/{mine}/cancel", {"headers": reader}),
        ("POST", cancel, f"/v1/jobs/{BIGINT_MAX}/cancel", {"headers": ci}),
        ("POST", cancel, f"/v1/jobs/{BIGINT_MAX}/cancel", {"headers": operator}),
        ("POST", cancel, f"/v1/jobs/{mine}/cancel", {"headers": ci, "json": {"reason": big}}),
        ("GET", result, f"/v1/results/webapp/{sha}", {"headers": ci}),
        ("GET", result, f"/v1/results/webapp/{sha}", {"headers": reader}),
        ("GET", result, "/v1/results/webapp/abc", {"headers": ci}),
        ("GET", result, f"/v1/results/webapp/{sha}", {}),
        ("GET", result, f"/v1/results/nope/{sha}", {"headers": ci}),
        ("GET", "/v1/whoami", "/v1/whoami", {"headers": reader}),
        ("GET", "/v1/whoami", "/v1/whoami", {}),
        ("GET", "/v1/whoami", "/v1/whoami", {"headers": _auth("fq_guess")}),
        ("GET", "/v1/health", "/v1/health", {}),
        ("POST", calls, calls, {"json": call, "headers": runner}),
        ("POST", calls, calls, {"json": {**call, "name": "runners_list"}, "headers": runner}),
        ("POST", calls, calls, {"content": b"{", "headers": runner}),
        ("POST", calls, calls, {"json": call}),
        ("POST", calls, calls, {"json": call, "headers": ci}),
        ("POST", calls, calls, {"json": {**call, "args": [big * 2]}, "headers": runner}),
        ("GET", wake, wake, {"params": {"wait_s": 0}, "headers": runner}),
        ("GET", wake, wake, {"params": {"wait_s": 99}, "headers": runner}),
        ("GET", wake, wake, {"params": {"wait_s": 0}}),
        ("GET", wake, wake, {"params": {"wait_s": 0}, "headers": ci}),
    ]
    answered: dict[tuple[str, str], set[int]] = {operation: set() for operation in documented}
    for method, template, url, request in probes:
        answer = api.request(method, url, **request)
        assert answer.status_code < 500, (method, url, answer.text)
        answered[(method, template)].add(answer.status_code)
    # the database away: every operation says 503, retry (a token is checked there)
    with (
        fault_proxy(api_db) as proxy,
        serving(proxy.dsn) as base,
        httpx.Client(base_url=base, timeout=30) as away,
    ):
        proxy.degrade(drop=1.0)
        for method, path in documented:
            url = path.format(job_id=mine, project="webapp", commit=sha)
            body = {"/v1/jobs": _job(commit=sha), calls: call}.get(path)
            answer = away.request(method, url, headers=ci, json=body)
            answered[(method, path)].add(answer.status_code)
    differ = {
        f"{method} {path}": {
            "documented, never answered": sorted(documented[(method, path)] - statuses),
            "answered, not documented": sorted(statuses - documented[(method, path)]),
        }
        for (method, path), statuses in answered.items()
        if statuses != documented[(method, path)]
    }
    assert not differ, json.dumps(differ, indent=1)


def test_cancelling_a_job_that_does_not_exist_is_404_as_its_read_is(
    api: httpx.Client, token: Token
) -> None:
    """A submitter's cancel of a missing job answered 403 "may cancel only its own jobs"
    where its read answered 404 (issue 42, item 9). Every token reads every job, so the
    404 tells a submitter nothing a read would not; another's job is still refused."""
    alice, bob = _auth(token("submitter", "alice")), _auth(token("submitter", "bob"))
    read = api.get(f"/v1/jobs/{BIGINT_MAX}", headers=alice)
    cancel = api.post(f"/v1/jobs/{BIGINT_MAX}/cancel", headers=alice)
    assert (cancel.status_code, cancel.json()) == (read.status_code, read.json())
    assert read.json()["error"] == {"type": "not_found", "message": f"no job {BIGINT_MAX}"}
    theirs = api.post("/v1/jobs", json=_job(), headers=bob).json()["job_id"]
    assert api.get(f"/v1/jobs/{theirs}", headers=alice).status_code == 200
    assert api.post(f"/v1/jobs/{theirs}/cancel", headers=alice).status_code == 403


_LINE = re.compile(r"fleetq\.api: (\S+) (\S+) (\d{3}) (\d+\.\d) ms (\S+)$")


def test_each_request_has_one_access_line_with_its_identity_never_its_token(
    gateway_dsn: str, token: Token
) -> None:
    """Method, path, status, milliseconds and who the token stands for, on the API's
    logger, once per request even under -v (uvicorn's own access log is off), and
    never the token (issue 42, item 9: there was no access log)."""
    secret = token("submitter", "log-bot")
    log: list[str] = []
    with (
        serving(gateway_dsn, "-v", "--max-body", str(MaxBody), log=log) as base,
        httpx.Client(base_url=base, timeout=10) as api,
    ):
        made = api.post("/v1/jobs", json=_job(), headers=_auth(secret))
        assert made.status_code == 201, made.text
        job = made.json()["job_id"]
        assert api.get(f"/v1/jobs/{job}", headers=_auth(secret)).status_code == 200
        assert api.get("/v1/whoami").status_code == 401
        assert api.get("/v1/whoami", headers=_auth("fq_not-a-token")).status_code == 401
        big = _job(payload={"blob": "x" * MaxBody})
        assert api.post("/v1/jobs", json=big, headers=_auth(secret)).status_code == 413
        assert api.get("/v1/results/we%1bb/x", headers=_auth(secret)).status_code == 400
        expected = Counter(
            [
                ("POST", "/v1/jobs", "201", "submitter:log-bot"),
                ("GET", f"/v1/jobs/{job}", "200", "submitter:log-bot"),
                ("GET", "/v1/whoami", "401", "-"),
                ("GET", "/v1/whoami", "401", "-"),
                ("POST", "/v1/jobs", "413", "-"),
                ("GET", "/v1/results/we\\x1bb/x", "400", "submitter:log-bot"),
            ]
        )

        def lines() -> Counter[tuple[str, ...]]:
            found = (_LINE.search(line) for line in list(log))
            return Counter(
                (m[1], m[2], m[3], m[5]) for m in found if m is not None and m[2] != "/v1/health"
            )

        wait_for(lambda: sum(lines().values()) >= expected.total(), "the access lines")
    assert lines() == expected, "\n".join(log)
    whole = "\n".join(log)
    assert secret not in whole and "fq_not-a-token" not in whole and "Bearer" not in whole
    assert "HTTP/1.1" not in whole, whole  # uvicorn's access line: not a second one


def _any_job(warning: str, job: int) -> str:
    return warning.replace(f"job {job} ", "job N ").replace(f"explain {job})", "explain N)")


def test_a_submit_no_runner_could_ever_run_warns_as_the_cli_does(
    api_db: str, gateway_dsn: str, admin: SyncConnection, token: Token, sha: str
) -> None:
    """The CLI warned "no registered runner could ever run job N" and the API answered
    `"warnings": []` (issue 42, item 9): both say it now, from one function
    (eligibility.never_runnable), on an administrator's DSN and a gateway login alike."""
    factories.runner(admin, node=f"node-{sha[:8]}", lanes={"checks": 2})
    ci = _auth(token("submitter", "ci"))
    nowhere = _job(commit=sha, node="nowhere")
    with serving(api_db) as base, httpx.Client(base_url=base, timeout=10) as api:
        made = api.post("/v1/jobs", json=nowhere, headers=ci)
        assert made.status_code == 201, made.text
        job = made.json()["job_id"]
        runnable = api.post("/v1/jobs", json=_job(commit=sha), headers=ci).json()
    assert runnable["warnings"] == []
    argv = ["submit", "webapp", "unit", "--commit", sha, "--node", "nowhere", "--json"]
    cli = subprocess.run(
        [sys.executable, "-m", "fleetq", "--dsn", api_db, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    said = _any_job(cli.stderr.strip(), json.loads(cli.stdout)["job_id"])
    warnings = [_any_job(w, job) for w in made.json()["warnings"]]
    assert said.startswith("warning: no registered runner could ever run job N"), said
    assert [f"warning: {w}" for w in warnings] == [said]
    # a gateway login reads no runner table: explain_jobs answers it for the token
    with serving(gateway_dsn) as base, httpx.Client(base_url=base, timeout=10) as api:
        made = api.post("/v1/jobs", json=nowhere, headers=ci)
        assert made.status_code == 201, made.text
        warnings = [_any_job(w, made.json()["job_id"]) for w in made.json()["warnings"]]
        assert [f"warning: {w}" for w in warnings] == [said]
        stored = api.get(f"/v1/jobs/{made.json()['job_id']}", headers=ci)
        assert stored.status_code == 200 and stored.json()["requested_node"] == "nowhere"


def test_the_api_refuses_to_start_on_a_database_it_does_not_match(empty_dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetq", "--dsn", empty_dsn, "api", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 78, done.stderr
    assert "fleetq migrate" in done.stderr


def test_tokens_are_shown_once_kept_as_a_hash_and_revoked_by_name(
    cli: Cli, sync_conn: SyncConnection, tmp_path: Path
) -> None:
    path = tmp_path / "ci.token"
    code, out, _ = cli("tokens", "add", "submitter", "ci-bot", "--token-file", str(path))
    assert code == 0, out
    secret = path.read_text().strip()
    assert secret.startswith("fq_") and secret not in out
    assert path.stat().st_mode & 0o777 == 0o600
    stored = sync_conn.execute("SELECT token_sha256 FROM fleetq.api_tokens").fetchone()
    assert stored == (tokens.digest(secret),)
    # an existing file is never overwritten, and then no token is made either
    code, _, err = cli("tokens", "add", "operator", "ops", "--token-file", str(path))
    assert code == 64 and "exists" in err
    assert path.read_text().strip() == secret
    code, out, _ = cli("tokens", "list")
    assert "ci-bot" in out and "ops" not in out and secret not in out
    code, printed, _ = cli("tokens", "add", "reader", "dash", "--token-file", "-")
    assert code == 0 and printed.strip().startswith("fq_")
    # a runner token stands for a runner id (issue 46); its name is the id's, / as .
    code, printed, _ = cli("tokens", "add", "runner", "node-a/r", "--token-file", "-")
    assert code == 0 and printed.strip().startswith("fq_")
    code, _, err = cli("tokens", "add", "runner", "no-node", "--token-file", "-")
    assert code == 64 and "not a runner id" in err, err
    assert cli("tokens", "revoke", "ci-bot")[0] == 0
    assert cli("tokens", "revoke", "ci-bot")[0] == 65
    rows = sync_conn.execute("SELECT name FROM fleetq.api_tokens ORDER BY name").fetchall()
    assert rows == [("dash",), ("node-a.r",)]


def test_the_api_answers_503_while_the_database_is_away_and_recovers(
    api_db: str, token: Token
) -> None:
    """Every connection reset (a restart, a cut link): each call answers 503 with
    Retry-After, health says unavailable, and the same process serves again after."""
    with (
        fault_proxy(api_db) as proxy,
        serving(proxy.dsn) as base,
        httpx.Client(base_url=base, timeout=30) as api,
    ):
        ci = _auth(token("submitter", "ci"))
        assert api.post("/v1/jobs", json=_job(), headers=ci).status_code == 201
        proxy.degrade(drop=1.0)
        down = api.get("/v1/health")
        assert (down.status_code, down.json()["status"]) == (503, "unavailable")
        refused = api.post("/v1/jobs", json=_job(), headers=ci)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["type"] == "connection_failed"
        proxy.degrade()
        proxy.heal()

        def healthy() -> bool:
            return api.get("/v1/health").status_code == 200

        wait_for(healthy, "health after the outage", deadline_s=30)
        assert api.post("/v1/jobs", json=_job(), headers=ci).status_code == 201


def test_the_api_started_while_the_database_is_away_serves_once_it_is_back(
    api_db: str, token: Token
) -> None:
    """A service may start before its database answers (a reboot, or the database
    restarting just then: the fault suite's API died at start-up that way, and its
    runners waited on it for good): it says so, answers 503, and serves once the database
    is back, its schema checked then."""
    ci = _auth(token("submitter", "ci"))
    log: list[str] = []
    with fault_proxy(api_db) as proxy:
        proxy.degrade(drop=1.0)
        with (
            serving(proxy.dsn, log=log, health=503) as base,
            httpx.Client(base_url=base, timeout=30) as api,
        ):
            assert api.post("/v1/jobs", json=_job(), headers=ci).status_code == 503
            proxy.degrade()

            def healthy() -> bool:
                return api.get("/v1/health").status_code == 200

            wait_for(healthy, "health once the database is back", deadline_s=30)
            assert api.post("/v1/jobs", json=_job(), headers=ci).status_code == 201
            wait_for(
                lambda: any("the database answers again" in line for line in log),
                "the schema checked once the database is back",
                deadline_s=30,
            )
    assert any("the database is out of reach" in line for line in log), log


def test_what_review_found_is_refused_cleanly(api: httpx.Client, token: Token) -> None:
    """Each of these was a 500 (or a silent second job) before review."""
    ci = _auth(token("submitter", "ci"))
    deep = api.post("/v1/jobs", content=_nested_body(900), headers=ci)
    assert deep.status_code == 400, deep.text
    for after in (5, True, [2**63]):
        bad = api.post("/v1/jobs", json=_job(after=after), headers=ci)
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["type"] == "invalid_input"
    assert api.get(f"/v1/results/we%00b/{SHA}", headers=ci).status_code == 400
    mine = api.post("/v1/jobs", json=_job(), headers=ci).json()["job_id"]
    nul = api.post(f"/v1/jobs/{mine}/cancel", json={"reason": "a\u0000b"}, headers=ci)
    assert nul.status_code == 400, nul.text
    # a header key is ASCII: UTF-8 bytes read as latin-1 would name another job
    latin = api.post(
        "/v1/jobs",
        json=_job(),
        headers=[(k.encode(), v.encode()) for k, v in ci.items()]
        + [(b"Idempotency-Key", "café".encode())],
    )
    assert latin.status_code == 400, latin.text
    twice = api.post(
        "/v1/jobs",
        json=_job(),
        headers=httpx.Headers([*ci.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]),
    )
    assert twice.status_code == 400, twice.text


def _nested_body(depth: int) -> bytes:
    payload = '{"a": ' + "[" * depth + "]" * depth + "}"
    return (
        f'{{"project": "webapp", "operation": "unit", "commit": "{SHA}", "payload": {payload}}}'
    ).encode()


@pytest.mark.parametrize("stored", ["[1,2,3]", '"text"', "null", "42"])
def test_a_job_whose_payload_is_not_an_object_is_still_read(
    api: httpx.Client, token: Token, admin: SyncConnection, sha: str, stored: str
) -> None:
    """Rows written before submit refused such payloads (issue 41): answered 500."""
    ci = _auth(token("submitter", "ci-bot"))
    job = api.post("/v1/jobs", json=_job(commit=sha, payload={"n": 1}), headers=ci).json()
    admin.execute(
        "UPDATE fleetq.jobs SET payload = $2::text::jsonb WHERE id = $1", [job["job_id"], stored]
    )
    read = api.get(f"/v1/jobs/{job['job_id']}", headers=ci)
    assert read.status_code == 200, read.text
    assert read.json()["payload"] == json.loads(stored)
    result = api.get(f"/v1/results/webapp/{sha}", headers=ci)
    assert result.status_code == 200 and result.json()["status"] == "pending", result.text


def test_a_job_whose_payload_python_cannot_read_is_still_read(
    api: httpx.Client, token: Token, admin: SyncConnection, sha: str
) -> None:
    """A 5,000-digit integer, stored before submit refused it: Python's JSON reader
    raises on it, and the read answered 500."""
    ci = _auth(token("submitter", "ci-bot"))
    job = api.post("/v1/jobs", json=_job(commit=sha, payload={"n": 1}), headers=ci).json()
    admin.execute(
        """UPDATE fleetq.jobs SET payload = ('{"a":1' || repeat('0', 5000) || '}')::jsonb"""
        " WHERE id = $1",
        [job["job_id"]],
    )
    read = api.get(f"/v1/jobs/{job['job_id']}", headers=ci)
    assert read.status_code == 200, read.text
    assert read.json()["payload"].startswith("<JSON Python cannot read"), read.text[:300]
