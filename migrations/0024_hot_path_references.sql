-- 0024_hot_path_references: the references a job's every claim and outcome writes are kept
-- by the protocol functions that write them, not by foreign keys (issue 18).
--
-- fleetq: expand
--
-- A foreign key checks each row it covers with a query of its own, which also locks the
-- referenced row (FOR KEY SHARE), after every statement. Five of them fired on every job:
-- a claim sets jobs.lease_owner and jobs.reserved_on (runners) and records the
-- execution (its job and its runner), an outcome records the verdict (its job). Each
-- of those rows is written by a protocol function in the transaction that holds the
-- referenced job locked (the claim's FOR UPDATE SKIP LOCKED, the outcome's FOR UPDATE)
-- or its runner (the claim and every hand-back lock the runner's row); runners are never
-- deleted (forgotten ones stay, marked), and jobs only by prune, which deletes the
-- executions and verdicts of the jobs it takes in the same transaction. So the checks
-- found what the writer had just locked, at a quarter of the server's CPU per job in a
-- runner's outcome-and-claim cycle (scripts/call_costs.py: 0.100 -> 0.078 ms per job at
-- 256 jobs a call). tests/integration/test_protocol_machine.py checks after every step
-- that every one of these references resolves.
--
-- The colder references stay: jobs' lane and operation (a submit's), output chunks,
-- dependencies, schedule ticks, task notifications.
--
-- Dropping a constraint takes ACCESS EXCLUSIVE on its table for an instant; a lock that
-- does not come within 5 s fails the migration (run it again) rather than queueing
-- every runner's writes behind it. Older code is unaffected (it never relied on the
-- errors these raised: its own writes resolve).
SET LOCAL lock_timeout = '5s';

ALTER TABLE fleetq.jobs
    DROP CONSTRAINT jobs_lease_owner_fkey,
    DROP CONSTRAINT jobs_reserved_on_fkey;
ALTER TABLE fleetq.executions
    DROP CONSTRAINT executions_job_id_fkey,
    DROP CONSTRAINT executions_runner_id_fkey;
ALTER TABLE fleetq.verdicts
    DROP CONSTRAINT verdicts_job_id_fkey;
