-- `fleetq-bench --compare`: server-side counters, and the peers' own tables read back.
-- These blocks read views and tables outside fleetq's schema (pg_stat_statements, the
-- peers' schemas), so they live here and not in core/sql/, whose blocks the test suite
-- prepares against fleetq's schema. tests/integration/test_bench_sql.py prepares these
-- against a database holding what they read.

-- name: counters_read
-- Every counter of one snapshot, in one statement: one call and one transaction of the
-- harness's own each time, whatever is read. None of it assigns a transaction id:
-- pg_current_snapshot's xmax is the next id to be assigned, read without taking one (as
-- pg_current_xact_id would). WAL position in bytes from 0/0: the insert position, so a
-- window closed after its work returned holds all of it even with synchronous_commit off
-- (pg_walinspect reads only flushed WAL: Counters.wal waits for the flush). Transactions from the
-- cumulative statistics (flushed by each backend within 1 s while busy, 10 s when idle:
-- see bench/fleetq_bench/counters.py). Statements: the top-level calls on this database that
-- pg_stat_statements has counted, what clients sent (with pg_stat_statements.track =
-- all it also counts the statements run inside functions and triggers: not these).
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
       pg_current_wal_insert_lsn()::text AS lsn,
       (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint AS wal_bytes,
       (SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
         WHERE datname = current_database()) AS pids,
       (SELECT xact_commit + xact_rollback FROM pg_stat_database
         WHERE datname = current_database()) AS xacts,
       (SELECT xact_rollback FROM pg_stat_database
         WHERE datname = current_database()) AS rollbacks,
       -- rows inserted (its tables and the peers': flushed like the transactions)
       (SELECT tup_inserted FROM pg_stat_database
         WHERE datname = current_database()) AS rows_inserted,
       (SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database
         WHERE datname IS DISTINCT FROM current_database())::bigint AS foreign_xacts,
       (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
         WHERE toplevel AND dbid = (SELECT oid FROM pg_database
                                     WHERE datname = current_database()))::bigint
       AS statements,
       -- entries evicted so far (server-wide): a window with evictions may have lost
       -- some of this database's calls, when the table is full (pg_stat_statements.max)
       (SELECT dealloc FROM pg_stat_statements_info) AS evictions;

-- name: counters_read_unstated
-- counters_read where pg_stat_statements cannot count (not preloaded): no statements.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
       pg_current_wal_insert_lsn()::text AS lsn,
       (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint AS wal_bytes,
       (SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
         WHERE datname = current_database()) AS pids,
       (SELECT xact_commit + xact_rollback FROM pg_stat_database
         WHERE datname = current_database()) AS xacts,
       (SELECT xact_rollback FROM pg_stat_database
         WHERE datname = current_database()) AS rollbacks,
       -- rows inserted (its tables and the peers': flushed like the transactions)
       (SELECT tup_inserted FROM pg_stat_database
         WHERE datname = current_database()) AS rows_inserted,
       (SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database
         WHERE datname IS DISTINCT FROM current_database())::bigint AS foreign_xacts,
       NULL::bigint AS statements,
       NULL::bigint AS evictions;

-- name: counters_flushed
-- Whether the WAL up to $1 (text) is flushed, so pg_walinspect can read it.
SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn AS flushed;

-- name: counters_wal
-- This database's share of the WAL written from $1 to $2 (pg_walinspect): the write
-- transactions (distinct transaction ids, subtransactions included) whose records
-- touched one of its relations, and the bytes of those transactions' records and of
-- any other record of its relations (vacuum, pruning). Other databases' work on the
-- same server, which the server-wide counters would count, is left out. A transaction
-- that wrote no page of the database (a NOTIFY alone) is not seen here.
-- $1 start LSN, $2 end LSN (text)
WITH records AS (
    SELECT r.xid::text::bigint AS xid, r.record_length,
           r.block_ref ~ (' rel [0-9]+/' || d.oid || '/') AS ours
    FROM pg_database d,
         LATERAL pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn) r
    WHERE d.datname = current_database()
), writers AS (
    SELECT DISTINCT xid FROM records WHERE ours AND xid <> 0
)
SELECT (SELECT count(*) FROM writers) AS write_xacts,
       (SELECT coalesce(sum(record_length), 0) FROM records
         WHERE ours OR xid IN (SELECT xid FROM writers))::bigint AS wal_bytes;

-- name: counters_create_walinspect
-- The WAL reader, in the scratch database (superuser, or pg_read_server_files).
CREATE EXTENSION IF NOT EXISTS pg_walinspect;

-- name: counters_reserve_wal
-- Keep the WAL from now on until this session ends, so a checkpoint in the middle of a
-- window cannot remove the segments counters_wal is about to read: a temporary physical
-- slot (dropped with the session), reserving from its creation, named after the scratch
-- database (unique on the server).
SELECT slot_name FROM pg_create_physical_replication_slot(current_database(), true, true);

-- name: counters_preloaded
-- Whether pg_stat_statements can count: only when in shared_preload_libraries (its
-- view fails otherwise).
SELECT 'pg_stat_statements' = ANY(string_to_array(
           replace(current_setting('shared_preload_libraries'), ' ', ''), ',')) AS preloaded;

-- name: counters_create_extension
-- The view over the server's statement statistics, in the scratch database.
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;

-- name: counters_server
-- This session's backend and when it started, to find it among this machine's
-- processes (and the server as its parent). The backend's start, not the postmaster's:
-- a process's start time as the kernel reports it moves with every step of the wall
-- clock since (a virtual machine's clock is stepped now and then), and a backend started
-- a moment ago has seen none.
SELECT pid AS backend_pid, extract(epoch FROM backend_start)::float8 AS started
FROM pg_stat_activity WHERE pid = pg_backend_pid();

-- name: counters_server_settings
-- The server's version and the settings that move these figures most.
SELECT version() AS version,
       current_setting('server_version_num')::integer AS version_num,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('fsync') AS fsync,
       current_setting('shared_buffers') AS shared_buffers,
       current_setting('max_connections') AS max_connections;
