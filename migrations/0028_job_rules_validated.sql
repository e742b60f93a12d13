-- 0028_job_rules_validated: validate the constraint migration 0027 added NOT VALID
-- (issue 18).
--
-- fleetq: expand
--
-- It reads every job once to confirm what the dropped constraints already guaranteed,
-- so the catalog says the rules hold for every row (convalidated). A migration of its
-- own because VALIDATE CONSTRAINT takes only a SHARE UPDATE EXCLUSIVE lock, which lets
-- submits, claims and outcomes go on while it reads (about four seconds per million
-- jobs on a two-CPU machine); in 0027's transaction it would have held 0027's exclusive
-- lock throughout.
--
-- The read has no time limit: `fleetq migrate`'s sessions stop any statement after 30 s
-- (a queue call's ceiling, fleetq/core/db.py), which a table of five million jobs or so
-- outlasts, and then this migration could never be applied. The wait for its lock has
-- one (5 s, then run it again): the lock conflicts with VACUUM and other schema changes,
-- not with the queue's writes.

SET LOCAL statement_timeout = 0;
SET LOCAL lock_timeout = '5s';

ALTER TABLE fleetq.jobs VALIDATE CONSTRAINT jobs_rules;
