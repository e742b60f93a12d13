-- Schema migrations (`fleetq migrate`). These run before the fleetq schema exists, so
-- they touch only fleetq.schema_migrations, which the bootstrap creates.

-- name: migrate_lock
-- Session advisory lock: concurrent migrate runs apply each migration once.
-- $1 lock key
SELECT pg_advisory_lock($1);

-- name: migrate_unlock
-- $1 lock key
SELECT pg_advisory_unlock($1);

-- name: migrate_bootstrap
-- Run under migrate_lock, so two first runs cannot race on CREATE ... IF NOT EXISTS.
CREATE SCHEMA IF NOT EXISTS fleetq;
CREATE TABLE IF NOT EXISTS fleetq.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: migrate_has_table
-- Whether this database was ever migrated.
SELECT to_regclass('fleetq.schema_migrations') IS NOT NULL;

-- name: migrate_applied
-- What the database has; every fleetq process reads it before it starts (check_schema).
-- The contract flag is read through the row's JSON, not by name: a database before
-- migration 0023 has no such column, and this code must still say it is behind.
SELECT version, name, checksum, applied_at,
       coalesce((to_jsonb(m) ->> 'contract')::boolean, false) AS contract
FROM fleetq.schema_migrations AS m
ORDER BY version;

-- name: migrate_record
-- In the migration's own transaction, so the record and the change commit together.
-- $1 version, $2 file name, $3 sha256
INSERT INTO fleetq.schema_migrations (version, name, checksum) VALUES ($1, $2, $3);

-- name: migrate_record_contract
-- After migrate_record, in the same transaction, for a `-- fleetq: contract` migration:
-- code older than it reads this flag to refuse to start, as it cannot read the file.
-- (The column comes with migration 0023, so a contract migration is numbered after it.)
-- $1 version
UPDATE fleetq.schema_migrations SET contract = true WHERE version = $1;

-- name: migrate_drop_schema
-- `fleetq demo --reset`: every fleetq table, function and row in this database goes; the
-- next migrate recreates them. Run under migrate_lock, so no migration is half-dropped.
DROP SCHEMA IF EXISTS fleetq CASCADE;

-- name: migrate_has_secure
-- Whether the schema asserts its own ownership and grants (migration 0007 on).
SELECT to_regprocedure('fleetq.secure()') IS NOT NULL AS present;

-- name: migrate_secure
-- Ownership (fleetq_owner) and grants (the fleetq_* groups; PUBLIC nothing), asserted
-- again after migrating.
SELECT fleetq.secure();

-- name: migrate_protocol_bootstrap
-- The protocol files (migrations/protocol/*.sql) applied, by checksum: re-applied when
-- their text changes, unlike numbered migrations, which are applied once.
CREATE TABLE IF NOT EXISTS fleetq.schema_protocol (
    name        text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: migrate_protocol_applied
SELECT name, checksum FROM fleetq.schema_protocol;

-- name: migrate_protocol_record
-- $1 file name, $2 sha256
INSERT INTO fleetq.schema_protocol (name, checksum) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = clock_timestamp();
