-- Pruning history (`fleetq prune`): the rules are migrations/protocol/prune.sql's.

-- name: prune_cutoff
-- The cutoff on the database's clock, and that clock: an absolute one as given, an age
-- counted back from now; and whether this login may prune (only an administrator may
-- execute the functions). $1 cutoff (or NULL), $2 age (or NULL)
SELECT coalesce($1::timestamptz, clock_timestamp() - $2::interval) AS before,
       clock_timestamp() AS now,
       has_function_privilege(
           'fleetq.prune_jobs(timestamptz, bigint, integer, boolean)', 'EXECUTE') AS allowed;

-- name: prune_jobs
-- One batch: the jobs after id $2, at most $3, that ended before $1 go with every row that
-- names them (with $4, only counted). $1 cutoff, $2 after id, $3 batch, $4 dry run
SELECT * FROM fleetq.prune_jobs($1::timestamptz, $2::bigint, $3::integer, $4::boolean);

-- name: prune_events
-- One batch of the events tied to no (remaining) job, older than $1: the events after id
-- $2, at most $3 (with $4, only counted). $1 cutoff, $2 after id, $3 batch, $4 dry run
SELECT * FROM fleetq.prune_events($1::timestamptz, $2::bigint, $3::integer, $4::boolean);
