-- "Why is (or isn't) this job running?": the claim's own eligibility rule
-- (fleetq.ineligibility), evaluated for jobs against every registered runner.

-- name: eligibility_explain
-- The rule for each distinct shape (lane, capabilities, node, memory, CPU) among the
-- given jobs against every runner: a page of 500 queued jobs is a handful of shapes, so
-- the console can say why each waits without evaluating the rule 500 x runners times.
-- A function (protocol/fleet.sql), so a submitter is told why its job waits without
-- reading the runner tables. $1 job ids
SELECT * FROM fleetq.explain_jobs($1::bigint[]);

-- name: eligibility_caps
-- The fleet-wide caps in force, with what holds capacity under each now (read along
-- jobs_reserved_on: bounded by the fleet's slots), for explain.
SELECT 'lane' AS kind, l.name, l.max_running AS cap,
       (SELECT count(*) FROM fleetq.jobs j
        WHERE j.reserved_on IS NOT NULL AND j.lane = l.name) AS running
FROM fleetq.lanes l WHERE l.max_running IS NOT NULL
UNION ALL
SELECT 'project', p.name, p.max_running,
       (SELECT count(*) FROM fleetq.jobs j
        WHERE j.reserved_on IS NOT NULL AND j.project = p.name)
FROM fleetq.projects p WHERE p.max_running IS NOT NULL;
