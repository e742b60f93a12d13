-- 0023_contract_migrations: the database records, per applied migration, whether it is a
-- contract one (`-- fleetq: contract` in its leading comment lines; the rules are in
-- fleetq/core/migrate.py). Code older than the database cannot read the files it lacks,
-- so it reads this flag to decide whether it may still start: through expand migrations
-- only, it may (an old runner restarted mid-rollout keeps working); past a contract one,
-- it refuses and names it. Every migration before this one is recorded as expand.
--
-- fleetq: expand
--
-- A new column with a constant default: older code reads schema_migrations by naming
-- its columns and never sees it. Grants on the table cover it (table-level SELECT).

ALTER TABLE fleetq.schema_migrations ADD COLUMN contract boolean NOT NULL DEFAULT false;
