-- 0026_handler_runs_have_no_run_id: an in-process handler's execution has no run id
-- (issue 18).
--
-- fleetq: expand
--
-- A run id names a launched process: the runner puts it in the command's environment
-- (FLEETQ_RUN_ID) and its journal, and finds and kills its process by it. A handler runs
-- in the runner's own process and has none of that, yet the protocol gave each of its
-- executions a random one (gen_random_uuid()) to satisfy NOT NULL UNIQUE. A random key
-- is the dearest thing a btree can be given: each insert lands on an arbitrary leaf of an
-- index that only grows, splits pages in the middle and misses the cache. Under a
-- backlog, at 256 jobs a call, that index was 14% of the server's CPU per job
-- (scripts/call_costs.py --against, with it dropped). Handlers' executions now have
-- NULL there, and the uniqueness covers the run ids there are: a partial unique index of
-- the same name in place of the constraint (no ON CONFLICT names it).
--
-- Expand: nullable where it was not. Code since 0025 already reads a NULL run id (a
-- running handler's execution in fleetq.all_executions has none); the runner reads run
-- ids only of its own open executions, to kill their processes, and one without an id
-- has no process to kill. Building the index reads fleetq.executions once and holds its
-- writes off meanwhile (about a second per million executions).

ALTER TABLE fleetq.executions ALTER COLUMN run_id DROP NOT NULL;
ALTER TABLE fleetq.executions DROP CONSTRAINT executions_run_id_key;
CREATE UNIQUE INDEX executions_run_id_key ON fleetq.executions (run_id)
    WHERE run_id IS NOT NULL;
