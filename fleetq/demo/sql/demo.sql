-- The demo's own database (fleetq/demo/database.py): found or created beside the user's,
-- and the lock that lets one demo at a time run in it. Identifiers in braces are filled
-- in with psycopg.sql.Identifier, never with text from input.

-- name: demo_current_database
-- The database the DSN the user gave names (libpq defaults it to the login's name).
SELECT current_database() AS name;

-- name: demo_database_exists
-- Whether the demo's database is there yet. $1 its name
SELECT 1 FROM pg_database WHERE datname = $1;

-- name: demo_create_database
-- The demo's database, on first use. Made from template0, so nothing the server's
-- template1 holds (an administrator's extensions, tables) comes along.
CREATE DATABASE {database} TEMPLATE template0;

-- name: demo_private_database
-- Nobody but its owner and the server's superusers may connect to the demo's database:
-- it holds no one else's work, and no other login can reach its lock (issue 41's rule).
REVOKE CONNECT, TEMPORARY ON DATABASE {database} FROM PUBLIC;

-- name: demo_lock_bootstrap
-- The lock's table, in a schema of the demo's own (not fleetq's: `fleetq.secure()` grants
-- SELECT on every fleetq table, and `demo --reset` drops that schema while the lock is
-- held). No role but its owner has a privilege on either, so no other login can lock it.
DO $$
BEGIN
    IF to_regclass('fleetq_demo.run_lock') IS NULL THEN
        CREATE SCHEMA IF NOT EXISTS fleetq_demo;
        REVOKE ALL ON SCHEMA fleetq_demo FROM PUBLIC;
        CREATE TABLE fleetq_demo.run_lock ();
        REVOKE ALL ON fleetq_demo.run_lock FROM PUBLIC;
    END IF;
END
$$;

-- name: demo_lock_session
-- The lock's session waits for nothing and may sit idle in its transaction for the
-- whole run (it holds one lock on one table and no snapshot).
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;

-- name: demo_lock_name
-- Who holds the lock, as another demo will read it in pg_stat_activity. $1 the name
SELECT set_config('application_name', $1, false);

-- name: demo_lock_nowait
-- One demo run per demo database at a time: the second is refused at once, not queued.
-- EXCLUSIVE conflicts with every lock a privilege could grant, and nobody holds one.
LOCK TABLE fleetq_demo.run_lock IN EXCLUSIVE MODE NOWAIT;

-- name: demo_lock_holders
-- The sessions holding the lock (the running demo's, named by its process).
SELECT a.application_name AS holder
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.relation = to_regclass('fleetq_demo.run_lock')
    AND l.granted
    AND l.pid <> pg_backend_pid();
