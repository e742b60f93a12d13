-- Pruning history: `fleetq prune --before DATE` removes the jobs that finished
-- before DATE with every row that names them, and the events tied to no job older than
-- DATE (fleetq.prune_jobs and fleetq.prune_events, in protocol/prune.sql), so a
-- long-lived fleet's history does not grow without bound. An administrator's command:
-- no group is granted the functions.
--
-- Here, what the functions need of the tables:
-- - events stay append-only for every writer, but a row older than the cutoff that a
--   prune's transaction names (the transaction-local setting `fleetq.prune_before`,
--   epoch seconds) may be deleted; an update, or a delete of any newer row, is refused
--   as before. A WHEN condition, not a test in the trigger's function: the rows a prune
--   deletes cost no function call.
-- - task_notifications and schedule_ticks get an index on job_id: deleting a job checks
--   each table whose foreign key names it, and without one that check reads the whole
--   table for every job deleted. Both are written once per job at most (a terminal
--   outcome with a task id, a schedule's tick), never on the claim path.
--
-- fleetq: expand
--
-- Older code neither deletes events nor reads the new indexes: it keeps working.

-- Applied under a running fleet: every claim and outcome writes events, so the lock on
-- it is taken last and held only for the trigger swap (CREATE OR REPLACE TRIGGER takes
-- SHARE ROW EXCLUSIVE, not the ACCESS EXCLUSIVE of DROP TRIGGER), and a lock that does
-- not come within 5 s fails the migration (run it again) rather than queueing every
-- runner's writes behind it.
SET LOCAL lock_timeout = '5s';

CREATE INDEX task_notifications_job ON fleetq.task_notifications (job_id);
CREATE INDEX schedule_ticks_job ON fleetq.schedule_ticks (job_id) WHERE job_id IS NOT NULL;

CREATE OR REPLACE TRIGGER events_append_only BEFORE UPDATE ON fleetq.events
    FOR EACH ROW EXECUTE FUNCTION fleetq.refuse_event_rewrite();

CREATE TRIGGER events_pruned_only BEFORE DELETE ON fleetq.events
    FOR EACH ROW
    WHEN (extract(epoch FROM OLD.at)
          >= coalesce(nullif(current_setting('fleetq.prune_before', true), '')::numeric,
                      '-Infinity'::numeric))
    EXECUTE FUNCTION fleetq.refuse_event_rewrite();
