-- 0025_handler_runs_recorded_at_their_end: an in-process handler's execution is a row of
-- fleetq.executions once its lease ends, not from its claim (issue 18).
--
-- fleetq: expand
--
-- A handler starts when it is claimed, so until its lease ends its job's row says all
-- there is to say of its execution: the runner (lease_owner), the token (lease_version)
-- and the start (claimed_at). Writing the row at the claim and again at the outcome was
-- a tenth of the server's CPU per job in a runner's outcome-and-claim cycle
-- (scripts/call_costs.py). The protocol now writes it once, where the lease ends: the
-- outcome inserts it ended; every other end of the lease (cancel, release, a reported
-- loss, expiry) inserts it first, open, in the transaction that ends the lease, so a
-- handler that may still run under a lease that moved on (a frozen one) stays visible
-- until its stop is confirmed or its stale outcome arrives, as before.
--
-- fleetq.all_executions is what every reader of live executions reads (the console's
-- alerts and job detail, `fleetq overlaps`, the demo's report): the rows, and the
-- running handlers' executions that are still only their job's lease (no run id yet:
-- the row gets one when it is written). Older code that reads fleetq.executions
-- directly sees a handler's run only once its lease ended: an older console shows no
-- open execution for a running handler, and nothing older writes or decides on them.
-- Readers and operators may read the view as they read every table (`fleetq migrate`
-- asserts the grants after the migrations, fleetq.secure).
CREATE VIEW fleetq.all_executions AS
SELECT e.id, e.job_id, e.lease_version, e.runner_id, e.node, e.run_id, e.pid,
       e.process_started_at, e.prepared_at, e.launched_at, e.start_reported_at, e.ended_at,
       e.prepare_ms, e.run_ms, e.exit_code, e.signal, e.stop_reason, e.stop_requested_at,
       e.stop_confirmed, e.end_measured
FROM fleetq.executions e
UNION ALL
SELECT NULL::bigint, j.id, j.lease_version, j.lease_owner, r.node, NULL::uuid, NULL::integer,
       NULL::timestamptz, NULL::timestamptz, j.claimed_at, j.claimed_at, NULL::timestamptz,
       NULL::integer, NULL::integer, NULL::integer, NULL::integer, NULL::text,
       NULL::timestamptz, false, false
FROM fleetq.jobs j
JOIN fleetq.operations o ON o.project = j.project AND o.name = j.operation
JOIN fleetq.runners r ON r.id = j.lease_owner
WHERE j.state IN ('claimed', 'running') AND o.handler IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM fleetq.executions x
                  WHERE x.job_id = j.id AND x.lease_version = j.lease_version);
