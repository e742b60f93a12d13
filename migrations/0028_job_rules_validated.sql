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

ALTER TABLE fleetq.jobs VALIDATE CONSTRAINT jobs_rules;
