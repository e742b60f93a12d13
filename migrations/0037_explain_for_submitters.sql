-- 0037_explain_for_submitters: a submitter is told why its job waits (issue 42, item 9).
--
-- fleetq: expand
--
-- `fleetq submit` and the API's POST /v1/jobs warn when no registered runner could ever
-- run the job; explaining that reads the runner tables, which only readers and operators
-- may, so a submitter's login and the API's gateway said nothing. fleetq.explain_jobs
-- (protocol/fleet.sql) answers the runners' verdicts for the caller's jobs.

INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE', 'FUNCTION fleetq.explain_jobs(bigint[])', g
FROM unnest(ARRAY['fleetq_submitter', 'fleetq_operator', 'fleetq_reader', 'fleetq_gateway']) g;

-- the lanes' fleet-wide caps, which explain names ("lane checks at its cap (8/8)"): the
-- configuration, as the projects and operations a submitter reads already
INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'SELECT', 'TABLE fleetq.lanes', g
FROM unnest(ARRAY['fleetq_submitter', 'fleetq_gateway']) g;
