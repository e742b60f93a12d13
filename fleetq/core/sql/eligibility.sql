-- "Why is (or isn't) this job running?": the claim's own eligibility rule
-- (fleetq.ineligibility), evaluated for one job against every registered runner.

-- name: eligibility_explain
-- $1 job
SELECT r.id AS runner_id,
       r.node,
       fleetq.ineligibility(j.capabilities, j.requested_node, j.memory_mb, j.cpu_millis,
                            r.node, r.capabilities, r.state,
                            fleetq.runner_is_stale(r.last_heartbeat_at),
                            r.memory_mb - r.reserved_memory_mb,
                            r.cpu_millis - r.reserved_cpu_millis,
                            l.slots, l.slots_used) AS reason,
       j.lane,
       j.requested_node,
       j.memory_mb AS needs_memory_mb,
       j.cpu_millis AS needs_cpu_millis,
       ARRAY(SELECT c FROM unnest(j.capabilities) c
             EXCEPT SELECT c FROM unnest(r.capabilities) c ORDER BY 1) AS missing_capabilities,
       r.memory_mb - r.reserved_memory_mb AS free_memory_mb,
       r.cpu_millis - r.reserved_cpu_millis AS free_cpu_millis,
       r.memory_mb AS total_memory_mb,
       r.cpu_millis AS total_cpu_millis,
       l.slots,
       l.slots_used
FROM fleetq.jobs j
CROSS JOIN fleetq.runners r
LEFT JOIN fleetq.runner_lanes l ON l.runner_id = r.id AND l.lane = j.lane
WHERE j.id = $1::bigint
ORDER BY r.id;
