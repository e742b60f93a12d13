-- Job output in the database (issue 14), so `fleetq logs JOB --follow` works from any
-- machine, not only on the runner's node where the log file is.
--
-- The runner ships a command job's output as it runs, in chunks of at most 64 KiB, each
-- numbered within its (job, token). Bytes are stored raw, as the job wrote them (escape
-- sequences included); whoever displays them escapes them. Per (job, token) only the
-- newest `output_keep_kib` (default 1024) are kept: older chunks are dropped, so a job
-- printing without end costs bounded space, and the tail, which says how it ended, stays.
-- A cancelled or self-fenced run keeps what it had shipped. A NOTIFY on fleetq_output
-- (the job id only) wakes followers.

INSERT INTO fleetq.settings (name, value) VALUES ('output_keep_kib', '1024')
ON CONFLICT (name) DO NOTHING;

CREATE TABLE fleetq.job_output (
    job_id         bigint NOT NULL REFERENCES fleetq.jobs (id),
    lease_version  bigint NOT NULL,
    seq            integer NOT NULL CHECK (seq >= 0),
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    data           bytea NOT NULL CHECK (octet_length(data) <= 65536),
    PRIMARY KEY (job_id, lease_version, seq)
);

-- Append one chunk of a run's output. Only the runner that claimed that (job, token)
-- may; the lease may have moved on since (a cancelled or fenced run's last words are
-- kept). A retried chunk (lost reply) is written once.
CREATE FUNCTION fleetq.append_output(
    p_runner text, p_job bigint, p_version bigint, p_seq integer, p_data bytea
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
    v_keep bigint := coalesce(fleetq.setting_int('output_keep_kib'), 1024)::bigint * 1024;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fleetq.events e
                   WHERE e.job_id = p_job AND e.kind = 'claimed' AND e.lease_version = p_version
                     AND e.runner_id = v_runner)
    THEN
        RAISE EXCEPTION 'runner % never claimed job % under token %', v_runner, p_job,
                        p_version
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO fleetq.job_output (job_id, lease_version, seq, data)
    VALUES (p_job, p_version, p_seq, p_data)
    ON CONFLICT (job_id, lease_version, seq) DO NOTHING;
    -- keep the newest chunks whose sizes add up to at most output_keep_kib
    DELETE FROM fleetq.job_output o
    WHERE o.job_id = p_job AND o.lease_version = p_version
      AND o.seq < (SELECT coalesce(min(k.seq), 0) FROM (
                       SELECT seq, sum(octet_length(data)) OVER (ORDER BY seq DESC) AS kept
                       FROM fleetq.job_output
                       WHERE job_id = p_job AND lease_version = p_version) k
                   WHERE k.kept <= v_keep);
    PERFORM pg_notify('fleetq_output', p_job::text);
END;
$$;

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.append_output(text, bigint, bigint, integer, bytea)',
     'fleetq_runner'),
    ('SELECT', 'TABLE fleetq.job_output', 'fleetq_submitter');

SELECT fleetq.secure();
