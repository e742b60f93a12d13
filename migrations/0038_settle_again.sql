-- 0038_settle_again: an ending never waits for a dependent submit in flight (issue 41,
-- finding 4).
--
-- fleetq: expand
--
-- A dependent submit (`--after J`) holds J's row in KEY SHARE (its foreign key) until it
-- commits, and every ending took J's row FOR UPDATE, which waits for it: that order made
-- the ending see the new dependent, but a submitter holding its transaction open held
-- another tenant's outcome (and cancel, loss report, retry) for as long as it liked.
-- Endings now take FOR NO KEY UPDATE, which a KEY SHARE does not block, and
-- settle_dependents then tries FOR UPDATE SKIP LOCKED on what ended: a row it cannot
-- take so may have a dependent it cannot see yet, and is named here; the reaper's
-- leader settles it again once nothing holds it (fleetq.settle_again).
CREATE TABLE fleetq.settle_again (
    job_id  bigint PRIMARY KEY,  -- no foreign key: prune must never wait on it
    since   timestamptz NOT NULL DEFAULT clock_timestamp()
);
