-- Dependencies between jobs (issue 17): `submit --after 41 42`. A job with unmet
-- dependencies waits in its own state, `waiting`, outside the queued index, so the claim
-- pays nothing for it; it is queued when the last of them succeeds, and cancelled
-- ("dependency failed", naming the job) when one fails, is refused or is cancelled.
--
-- The rows and the state change here; the functions that use them (submit, and
-- record_outcomes, the one place every job passes through when it ends) live in
-- migrations/protocol/. submit gains a parameter: its old signature is dropped here and
-- the new one is created by protocol/submit.sql; its grants name the new signature.

ALTER TABLE fleetq.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE fleetq.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('waiting', 'queued', 'claimed', 'running', 'succeeded', 'failed', 'cancelled', 'refused'));

CREATE TABLE fleetq.job_dependencies (
    job_id      bigint NOT NULL REFERENCES fleetq.jobs (id),
    depends_on  bigint NOT NULL REFERENCES fleetq.jobs (id),
    PRIMARY KEY (job_id, depends_on),
    CHECK (job_id <> depends_on)
);

-- a job that ends finds the jobs waiting on it through this index
CREATE INDEX job_dependencies_on ON fleetq.job_dependencies (depends_on);

-- the waiting jobs, for the console and `fleetq jobs --state waiting`
CREATE INDEX jobs_waiting ON fleetq.jobs (id) WHERE state = 'waiting';

DROP FUNCTION fleetq.submit(text, text, text, text, text, text, text, jsonb);
DROP FUNCTION fleetq.submit_unchecked(text, text, text, text, text, text, text, jsonb);

UPDATE fleetq.grants
SET object = 'FUNCTION fleetq.submit(text, text, text, text, text, text, text, jsonb, bigint[])'
WHERE object = 'FUNCTION fleetq.submit(text, text, text, text, text, text, text, jsonb)';

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('SELECT', 'TABLE fleetq.job_dependencies', 'fleetq_submitter');
INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.waiting_on(bigint, text)', 'fleetq_submitter'),
    ('EXECUTE', 'FUNCTION fleetq.waiting_on(bigint, text)', 'fleetq_reader');
INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.waiting_on(bigint, text)', 'fleetq_operator');
