-- "Why is (or isn't) this job running?": the claim's own eligibility rule
-- (fleetq.ineligibility), evaluated for jobs against every registered runner.

-- name: eligibility_explain
-- The rule for each distinct shape (lane, capabilities, node, memory, CPU) among the
-- given jobs against every runner: a page of 500 queued jobs is a handful of shapes, so
-- the console can say why each waits without evaluating the rule 500 x runners times.
-- $1 job ids
WITH shapes AS (
    SELECT DISTINCT lane, capabilities, requested_node, memory_mb, cpu_millis
    FROM fleetq.jobs
    WHERE id = ANY ($1::bigint[])
)
SELECT s.lane, s.capabilities, s.requested_node, s.memory_mb, s.cpu_millis,
       r.id AS runner_id,
       r.node,
       fleetq.ineligibility(s.capabilities, s.requested_node, s.memory_mb, s.cpu_millis,
                            r.node, r.capabilities, r.state,
                            fleetq.runner_is_stale(r.last_heartbeat_at),
                            r.memory_mb - r.reserved_memory_mb,
                            r.cpu_millis - r.reserved_cpu_millis,
                            l.slots, l.slots_used) AS reason,
       s.memory_mb AS needs_memory_mb,
       s.cpu_millis AS needs_cpu_millis,
       ARRAY(SELECT c FROM unnest(s.capabilities) c
             EXCEPT SELECT c FROM unnest(r.capabilities) c ORDER BY 1) AS missing_capabilities,
       r.memory_mb - r.reserved_memory_mb AS free_memory_mb,
       r.cpu_millis - r.reserved_cpu_millis AS free_cpu_millis,
       r.memory_mb AS total_memory_mb,
       r.cpu_millis AS total_cpu_millis,
       l.slots,
       l.slots_used
FROM shapes s
CROSS JOIN fleetq.runners r
LEFT JOIN fleetq.runner_lanes l ON l.runner_id = r.id AND l.lane = s.lane
WHERE fleetq.runner_listed(r.forgotten_at, r.last_heartbeat_at)
ORDER BY r.id;

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
