-- 0036_rerun: `fleetq rerun JOB` submits an ended job's check again, as a new job that
-- names the one it repeats (issue 42).
--
-- fleetq: expand
--
-- The function is fleetq.rerun (protocol/submit.sql); the link is a `rerun` event on the
-- new job ({"rerun_of": N}), so no table changes under running runners, and prune takes
-- the link with the job's other events.

INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE', 'FUNCTION fleetq.rerun(bigint, text, text)', g
FROM unnest(ARRAY['fleetq_submitter', 'fleetq_operator']) g;
