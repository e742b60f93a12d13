-- 0030_every_entry_point_acts_as_its_caller: coordination that no other login can hold,
-- and idempotency keys scoped to who submits (issue 41).
--
-- fleetq: expand
--
-- Advisory locks are anyone's: every login of the database may take any key, and
-- pg_locks shows the keys in use. A reader holding the reaper's key stalled expiry,
-- schedules, samples and retries; one holding a runner id's key kept that runner from
-- starting. fleetq.coordination holds one row per coordination lock: the reaper's pass
-- takes its row FOR UPDATE SKIP LOCKED (a row lock needs UPDATE on the table, which only
-- fleetq_owner has), and a runner id is held by a session named in its row (pid and
-- login), taken and checked only through fleetq.take_runner_id.
--
-- An idempotency key named a job of its project whoever asked: a submitter's key
-- `schedule:nightly:<next tick>` made the schedule's leader fail every tick, and one
-- bot's key blocked another's. Keys are now scoped to (project, identity): a schedule
-- submits as `schedule:NAME`, an identity no submitter acts as.
--
-- Building the index holds SHARE on jobs (submits wait); a lock that does not come
-- within 5 s fails the migration (run it again).
SET LOCAL lock_timeout = '5s';

CREATE TABLE fleetq.coordination (
    name        text PRIMARY KEY,       -- 'reaper', 'runner:NODE/NAME'
    holder_pid  integer,                -- the session holding it (runner ids)
    holder_role text,                   -- and its login: a pid is reused
    holder_app  text,                   -- its application_name, to recognise itself
    taken_at    timestamptz
);
INSERT INTO fleetq.coordination (name) VALUES ('reaper');

CREATE UNIQUE INDEX jobs_idempotency_identity
    ON fleetq.jobs (project, submitted_by, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX fleetq.jobs_idempotency_key;

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.take_runner_id(text)', 'fleetq_runner');
