-- A verdict never waits for another verdict (issue 12).
--
-- Seen in the fault suite: every outcome upserted the one `results` row of its
-- (project, commit, operation). A runner stopped or partitioned inside a handler's
-- `transaction(finish=True)` after its outcome was written in it held that row (idle in
-- transaction) until idle_in_transaction_session_timeout; every other outcome for the
-- same check waited on it (lock_timeout, 10 s) while holding its own runner's row, so
-- that runner's renewals waited too, its healthy runs fenced themselves, and a handler
-- job failed `exception`.
--
-- Now each outcome inserts its own row (`verdicts`, one per job: nothing to wait for),
-- and `results`, the latest verdict per (project, commit, operation), is a view over
-- them: the newest job wins, as before.

CREATE TABLE fleetq.verdicts (
    job_id       bigint PRIMARY KEY REFERENCES fleetq.jobs (id),
    project      text NOT NULL,
    commit_sha   text NOT NULL,
    operation    text NOT NULL,
    verdict      text NOT NULL CHECK (verdict IN ('passed', 'failed', 'refused', 'cancelled')),
    exit_code    integer,
    reason       text,
    log_tail     text NOT NULL DEFAULT '',
    prepare_ms   integer,
    run_ms       integer,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- `fleetq result PROJECT COMMIT`: the newest verdict per operation, found by this index
CREATE INDEX verdicts_by_check ON fleetq.verdicts (project, commit_sha, operation, job_id DESC);

INSERT INTO fleetq.verdicts
    (job_id, project, commit_sha, operation, verdict, exit_code, reason, log_tail, prepare_ms,
     run_ms, recorded_at)
SELECT job_id, project, commit_sha, operation, verdict, exit_code, reason, log_tail,
       prepare_ms, run_ms, recorded_at
FROM fleetq.results;

DROP TABLE fleetq.results;

CREATE VIEW fleetq.results AS
SELECT DISTINCT ON (project, commit_sha, operation)
       project, commit_sha, operation, job_id, verdict, exit_code, reason, log_tail,
       prepare_ms, run_ms, recorded_at
FROM fleetq.verdicts
ORDER BY project, commit_sha, operation, job_id DESC;

CREATE OR REPLACE FUNCTION fleetq.record_outcomes(
    p_jobs bigint[], p_exit_codes integer[], p_log_tails text[],
    p_prepare_ms integer[], p_run_ms integer[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fleetq.verdicts
        (job_id, project, commit_sha, operation, verdict, exit_code, reason, log_tail,
         prepare_ms, run_ms)
    SELECT j.id, j.project, j.commit_sha, j.operation,
           CASE j.state WHEN 'succeeded' THEN 'passed' ELSE j.state END,
           t.exit_code, j.failure_reason, coalesce(t.log_tail, ''), t.prepare_ms, t.run_ms
    FROM unnest(p_jobs, p_exit_codes, p_log_tails, p_prepare_ms, p_run_ms)
         AS t(job_id, exit_code, log_tail, prepare_ms, run_ms)
    JOIN fleetq.jobs j ON j.id = t.job_id
    ON CONFLICT (job_id) DO NOTHING;  -- one outcome per job: a repeat changes nothing

    INSERT INTO fleetq.task_notifications (task_id, job_id, state, verdict)
    SELECT j.task_id, j.id, j.state, CASE j.state WHEN 'succeeded' THEN 'passed' ELSE j.state END
    FROM fleetq.jobs j
    WHERE j.id = ANY (p_jobs) AND j.task_id IS NOT NULL;
END;
$$;

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('SELECT', 'TABLE fleetq.verdicts', 'fleetq_submitter');

SELECT fleetq.secure();
