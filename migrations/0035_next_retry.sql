-- 0035_next_retry: a retry runs when its backoff ends, not at the next reaper pass
-- (issue 42, finding 10).
--
-- fleetq: expand
--
-- A retry is queued by a reaper pass (queue_due_retries), which ran every reap interval
-- whatever was due: a backoff of 2 s became about 5 s. The runner that records a failed
-- attempt now asks when the next retry falls due (fleetq.next_retry_in, protocol/
-- dependencies.sql) and runs a reaper pass then; whichever runner's pass runs at that
-- moment queues it. A runner login cannot read jobs, so the question is a function of
-- its own that answers one number.

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.next_retry_in()', 'fleetq_runner');
