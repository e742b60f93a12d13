"""What the database keeps of a run's output (fleetq.append_output, migration 0032): its
head (the chunks of its first 64 KiB) and its newest chunks within output_keep_kib,
whatever the runner shipped between; readers name the bytes missing between them."""

from __future__ import annotations

import pytest

from fleetq.core import leasing, output, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import JobId, RunnerId
from fleetq.runner.output import skip_to
from tests import fleet
from tests.fleet import SHA

CHUNK = output.CHUNK_BYTES


async def _job(driver: Driver, sync_conn: SyncConnection, keep_kib: int) -> tuple[RunnerId, JobId]:
    """A runner and a job for it, on a fleet keeping `keep_kib` of a run's newest output."""
    fleet.operations(sync_conn)
    sync_conn.execute(
        b"UPDATE fleetq.settings SET value = $1 WHERE name = 'output_keep_kib'", [str(keep_kib)]
    )
    sync_conn.commit()
    runner = await fleet.runner(driver)
    submitted = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
    )
    return runner, submitted.job_id


async def test_a_run_keeps_its_head_and_its_newest_chunks(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner, job = await _job(driver, sync_conn, 256)
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    token = claim.lease_version
    # two small chunks make the head, then 20 full ones: the shipper sent all of them
    chunks = [b"ran: lint\n", b"x" * (CHUNK - 10)]
    chunks += [bytes([ord("a") + i]) * (CHUNK - 1) + b"\n" for i in range(20)]
    start = 0
    for seq, data in enumerate(chunks):
        keep = await output.append(
            driver, runner=runner, job_id=job, token=token, seq=seq, start=start, data=data
        )
        start += len(data)
    assert keep == 256 * 1024  # the budget, as every append answers it

    stored = sync_conn.execute(
        b"SELECT seq FROM fleetq.job_output WHERE job_id = $1 ORDER BY seq", [job]
    ).fetchall()
    assert [s for (s,) in stored] == [0, 1, 18, 19, 20, 21]  # the head, the newest 256 KiB
    (run,) = await output.newest(driver, job, max_bytes=8 * CHUNK)
    dropped = 16 * CHUNK
    assert run.text.startswith("ran: lint\nxxx")
    assert output.dropped_marker(dropped) in run.text
    before, _, after = run.text.partition(output.dropped_marker(dropped))
    assert before.endswith("x\n") and after.startswith("\n" + "q" * 10)  # chunk 18
    assert run.text.endswith("t" * (CHUNK - 1) + "\n")


@pytest.mark.parametrize(("end", "start", "missing"), [(None, 0, 0), (None, 10, 10), (5, 5, 0)])
def test_a_gap_is_what_lies_between_two_chunks(
    end: int | None, start: int | None, missing: int
) -> None:
    assert output.gap(end, start) == missing
    assert output.gap(end, None) == 0  # an older runner's chunk: its place is unknown


@pytest.mark.parametrize(
    ("offset", "size", "goes_on_at"),
    [
        (0, 50 * CHUNK, 0),  # the head is shipped first, whatever follows
        (CHUNK, 50 * CHUNK, 46 * CHUNK),  # behind by more than the budget: skip
        (CHUNK, 5 * CHUNK, CHUNK),  # within the budget: everything
        (40 * CHUNK, 44 * CHUNK, 40 * CHUNK),
    ],
)
def test_a_shipper_behind_skips_to_the_newest_budget(
    offset: int, size: int, goes_on_at: int
) -> None:
    assert skip_to(offset, size, 4 * CHUNK) == goes_on_at


async def test_each_execution_s_output_is_kept_apart(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A job's second execution trims its own output within the budget: the first
    execution's chunks neither count against it nor are trimmed with it."""
    runner, job = await _job(driver, sync_conn, 128)
    for chunks in (3, 5):  # the first execution fits its budget, the second does not
        (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
        for seq in range(chunks):
            await output.append(
                driver,
                runner=runner,
                job_id=job,
                token=claim.lease_version,
                seq=seq,
                start=seq * CHUNK,
                data=b"x" * CHUNK,
            )
        sync_conn.execute(
            b"UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 s' "
            b"WHERE id = $1",
            [job],
        )
        sync_conn.execute(b"SELECT * FROM fleetq.reap(1000, NULL)")
        sync_conn.commit()
    stored = sync_conn.execute(
        b"SELECT lease_version, array_agg(seq ORDER BY seq) FROM fleetq.job_output "
        b"WHERE job_id = $1 GROUP BY lease_version ORDER BY lease_version",
        [job],
    ).fetchall()
    assert stored == [(1, [0, 1, 2]), (2, [0, 3, 4])]
