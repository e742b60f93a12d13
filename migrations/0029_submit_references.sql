-- 0029_submit_references: a job's lane and operation are kept by the submits that write
-- them, not by foreign keys (issue 18), as its lease holder and execution are since 0024.
--
-- fleetq: expand
--
-- A foreign key checks each row it covers with a query of its own, after the statement:
-- a bulk submit of 5,000 jobs ran 10,000 of them (its lane, its operation), a quarter of
-- its time (0.25 s against 0.19 without, alternating on one server). What they checked
-- holds without them. Both submits (fleetq.submit_unchecked, submit_many_unchecked) read
-- the operation under the KEY SHARE lock the key took, which still orders a submit
-- against a removal (fleetq.retire_operation locks the row FOR UPDATE), and refuse an
-- unknown or retired one; a job's lane is its operation's, read in the same statement,
-- and an operation's lane is a foreign key of its own. Nothing deletes or renames a
-- lane, a project or an operation (operations are retired, never deleted), so the
-- ON UPDATE CASCADE had nothing to follow. tests/integration/test_protocol_machine.py
-- checks after every step that every job's lane and operation resolve.
--
-- Dropping a constraint takes ACCESS EXCLUSIVE on its table for an instant; a lock that
-- does not come within 5 s fails the migration (run it again) rather than queueing
-- every runner's writes behind it. Older code is unaffected (its submits refused an
-- unknown operation before writing, as these do).
SET LOCAL lock_timeout = '5s';

ALTER TABLE fleetq.jobs
    DROP CONSTRAINT jobs_lane_fkey,
    DROP CONSTRAINT jobs_project_operation_fkey;
