-- Application retries (issue 17), for operations that opt in: a failed outcome whose
-- reason the operation's policy names (exception, timeout, exit: any code or the listed
-- ones) is tried again, up to max_attempts in all, after an exponential backoff with
-- jitter. Between attempts the job waits (state `waiting` with `retry_at`, outside the
-- queued index) and the reaper's leader queues it when due. Attempts are counted apart
-- from losses (lost_count), lease expiries and self-fences (reassign_count). A failed
-- check is a verdict: nothing is retried unless the operation says so.

ALTER TABLE fleetq.operations ADD COLUMN retry jsonb NOT NULL DEFAULT '{}';
ALTER TABLE fleetq.jobs ADD COLUMN attempts smallint NOT NULL DEFAULT 1 CHECK (attempts >= 1);
ALTER TABLE fleetq.jobs ADD COLUMN retry_at timestamptz;
ALTER TABLE fleetq.jobs ADD CONSTRAINT jobs_retry_waits CHECK (retry_at IS NULL OR state = 'waiting');

-- the reaper finds the retries that are due along this index
CREATE INDEX jobs_retry_due ON fleetq.jobs (retry_at) WHERE state = 'waiting' AND retry_at IS NOT NULL;
