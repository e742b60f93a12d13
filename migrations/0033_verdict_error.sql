-- 0033_verdict_error: a check that could not run says `error`, not `failed` (issue 42,
-- finding 5).
--
-- fleetq: expand
--
-- A command that does not exist on the runner, a checkout that failed, a run lost with
-- its runner or the runner's own fault ended `failed`, exit 1: the same word and status
-- as a red test, so a CI gate blamed the commit for the fleet. The verdict's word is
-- now derived in one place from the job's end (fleetq.verdict_of, protocol/leases.sql):
-- `failed` only when the check ran and failed (a non-zero exit, a timeout, a signal, a
-- handler's exception), `error` when it could not run. The job's state keeps its
-- meaning (`failed` is a terminal state); only the verdict says which. Past verdicts
-- are read again by the same rule.
--
-- Older code reads a verdict as text: `error` is a word it shows as it is (and its
-- `fleetq result` exits 1 on it, as before).

ALTER TABLE fleetq.verdicts DROP CONSTRAINT verdicts_verdict_check;
ALTER TABLE fleetq.verdicts ADD CONSTRAINT verdicts_verdict_check
    CHECK (verdict IN ('passed', 'failed', 'error', 'refused', 'cancelled'));

UPDATE fleetq.verdicts
SET verdict = 'error'
WHERE verdict = 'failed'
  AND coalesce(reason, 'exit') NOT IN ('exit', 'timeout', 'signal', 'exception');
UPDATE fleetq.task_notifications n
SET verdict = 'error'
FROM fleetq.jobs j
WHERE n.job_id = j.id AND n.verdict = 'failed'
  AND coalesce(j.failure_reason, 'exit') NOT IN ('exit', 'timeout', 'signal', 'exception');
