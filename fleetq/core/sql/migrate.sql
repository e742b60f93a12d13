-- Schema migrations (`fleetq migrate`). These run before the fleetq schema exists, so
-- they touch only what the bootstrap creates: fleetq.schema_migrations and the migration
-- lock's table.

-- name: migrate_bootstrap
-- The schema, the record of applied migrations and the migration lock's table. Not run
-- under the lock (it makes the lock's table): two first runs may race on a CREATE, and
-- the loser fails with unique_violation or duplicate_object; it is one transaction, so
-- migrate() runs it again and finds everything made. It runs beside another run's
-- migrations, so it changes nothing that exists (CREATE ... IF NOT EXISTS of an existing
-- table locks nothing).
DO $$
BEGIN
    -- not CREATE SCHEMA IF NOT EXISTS: that asks for CREATE on the database even when the
    -- schema exists, which an administrator owning the schema (fleetq_owner) may lack
    IF to_regnamespace('fleetq') IS NULL THEN
        CREATE SCHEMA fleetq;
    END IF;
    -- the lock's owner (migration 0007 makes the role too, and the groups)
    IF to_regrole('fleetq_owner') IS NULL THEN
        CREATE ROLE fleetq_owner NOLOGIN;
    END IF;
END;
$$;
CREATE TABLE IF NOT EXISTS fleetq.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Only locked (migrate_lock), never read or written: no columns, no rows. No migration
-- may alter or drop it, since the run applying that migration holds its lock.
CREATE TABLE IF NOT EXISTS fleetq.migration_lock ();
-- Owned by fleetq_owner from the start: fleetq.secure(), which migrations and migrate run,
-- hands every table it does not own to fleetq_owner with ALTER TABLE, which would wait for
-- the lock the run calling it holds, forever.
DO $$
BEGIN
    IF (SELECT relowner FROM pg_class WHERE oid = 'fleetq.migration_lock'::regclass)
       <> 'fleetq_owner'::regrole THEN
        ALTER TABLE fleetq.migration_lock OWNER TO fleetq_owner;
    END IF;
END;
$$;

-- name: migrate_lock_private
-- No role but the owner holds any privilege on the lock's table, whatever fleetq.secure()
-- (SELECT on every table to readers and operators) or default privileges granted. A lock
-- that conflicts with migrate_lock needs UPDATE, DELETE, TRUNCATE or INSERT (or being the
-- owner), so only administrators (members of fleetq_owner, superusers) can take one:
-- unlike an advisory key, which any login takes, a reader can stall no migration. Run
-- under the lock: GRANT and REVOKE take none, and two at once on one table fail.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'fleetq.migration_lock'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('REVOKE ALL ON fleetq.migration_lock FROM %s',
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END;
$$;

-- name: migrate_lock_session
-- The lock's own connection waits for another migrate or reset as long as that takes,
-- then sits idle in its transaction while the run migrates on another connection: no
-- timeout of the login's or the server's may end it half-way.
SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;

-- name: migrate_lock_nowait
-- migrate_lock, unless another holds it (55P03): then the run says whom it waits for.
LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE NOWAIT;

-- name: migrate_lock
-- The migration lock, to the end of the lock connection's transaction: concurrent
-- migrate and reset runs take turns. EXCLUSIVE conflicts with itself, not with a plain
-- read. Fails with 42P01 or 3F000 when a reset dropped the table while this waited.
LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE;

-- name: migrate_lock_holders
-- Who holds the migration lock (another migrate or reset), for "waiting for ..."
SELECT l.pid FROM pg_locks l
WHERE l.locktype = 'relation' AND l.granted AND l.mode <> 'AccessShareLock'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = 'fleetq.migration_lock'::regclass
ORDER BY l.pid;

-- name: migrate_lock_held
-- Before each step: whether this session still holds the migration lock.
SELECT EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.granted
                 AND l.relation = 'fleetq.migration_lock'::regclass
                 AND l.mode = 'ExclusiveLock') AS held;

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

-- name: migrate_reset
-- `fleetq demo --reset`: every fleetq table, function and row in this database goes; the
-- next migrate recreates them. The lock and the drop in one transaction, so the lock's
-- table is dropped by the session that holds its lock (never waited on by it) and no
-- migration is half-dropped. Waits for a running migrate as long as it takes, the drop
-- (readers' locks on the tables) only as long as the session's statement_timeout allows.
SET LOCAL lock_timeout = 0;
SET LOCAL statement_timeout = 0;
DO $$
BEGIN
    IF to_regclass('fleetq.migration_lock') IS NOT NULL THEN  -- none before issue 41
        LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE;
    END IF;
END;
$$;
SET LOCAL statement_timeout TO DEFAULT;
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
