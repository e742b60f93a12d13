-- Schedules (issue 17): `[schedules.NAME]` in the fleet file fires a job on a cron
-- expression in a time zone, at a fixed commit or a branch's head resolved at fire time.
-- Fired by the reaper's leader; each (schedule, tick) is a row written in the same
-- transaction as the job's submit, so a leader change neither skips nor doubles a tick
-- (protocol/schedules.sql). `last_tick` is how far the schedule has been settled (fired
-- or skipped by its catch-up rule); a new schedule starts from when it was created.

CREATE TABLE fleetq.schedules (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,62}$'),
    cron            text NOT NULL,
    timezone        text NOT NULL DEFAULT 'UTC',
    project         text NOT NULL,
    operation       text NOT NULL,
    commit_sha      text CHECK (commit_sha ~ '^[0-9a-f]{40}$'),
    branch          text,
    payload         jsonb NOT NULL DEFAULT '{}',
    catch_up        text NOT NULL DEFAULT 'last' CHECK (catch_up IN ('none', 'last', 'all')),
    last_tick       timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_at       timestamptz,
    paused_by       text,
    paused_reason   text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    FOREIGN KEY (project, operation) REFERENCES fleetq.operations (project, name),
    CHECK ((commit_sha IS NULL) <> (branch IS NULL))
);

CREATE TABLE fleetq.schedule_ticks (
    schedule    text NOT NULL REFERENCES fleetq.schedules (name) ON DELETE CASCADE,
    tick        timestamptz NOT NULL,
    job_id      bigint REFERENCES fleetq.jobs (id),
    fired_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (schedule, tick)
);

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.fire_schedule(text, timestamptz, text)', 'fleetq_runner'),
    ('EXECUTE', 'FUNCTION fleetq.skip_schedule(text, timestamptz)', 'fleetq_runner'),
    ('EXECUTE', 'FUNCTION fleetq.pause_schedule(text, boolean, text, text)', 'fleetq_operator'),
    ('EXECUTE', 'FUNCTION fleetq.runner_schedules()', 'fleetq_runner');
