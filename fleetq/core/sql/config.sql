-- Declarative fleet configuration (`fleetq apply`): upserts only, so applying a file
-- twice changes nothing and entries not in the file are left alone.

-- name: config_upsert_setting
-- $1 name, $2 value (jsonb)
INSERT INTO fleetq.settings (name, value) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = clock_timestamp()
WHERE fleetq.settings.value IS DISTINCT FROM EXCLUDED.value;

-- name: config_upsert_lane
-- $1 name, $2 description, $3 max_running (NULL: no fleet-wide cap)
INSERT INTO fleetq.lanes (name, description, max_running) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description,
    max_running = EXCLUDED.max_running, updated_at = clock_timestamp()
WHERE (fleetq.lanes.description, fleetq.lanes.max_running)
    IS DISTINCT FROM (EXCLUDED.description, EXCLUDED.max_running);

-- name: config_upsert_identity
-- $1 name, $2 role
INSERT INTO fleetq.identities (name, role) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET role = EXCLUDED.role, updated_at = clock_timestamp()
WHERE fleetq.identities.role IS DISTINCT FROM EXCLUDED.role;

-- name: config_upsert_project
-- $1 name, $2 repository, $3 release_gate, $4 description, $5 max_running (NULL: no cap)
INSERT INTO fleetq.projects (name, repository, release_gate, description, max_running)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE SET
    repository = EXCLUDED.repository,
    release_gate = EXCLUDED.release_gate,
    description = EXCLUDED.description,
    max_running = EXCLUDED.max_running,
    updated_at = clock_timestamp()
WHERE (fleetq.projects.repository, fleetq.projects.release_gate, fleetq.projects.description,
       fleetq.projects.max_running)
    IS DISTINCT FROM (EXCLUDED.repository, EXCLUDED.release_gate, EXCLUDED.description,
                      EXCLUDED.max_running);

-- name: config_upsert_operation
-- $1 project, $2 name, $3 lane, $4 command, $5 handler, $6 capabilities,
-- $7 memory_mb, $8 cpu_millis, $9 timeout_s, $10 limits (JSON text), $11 retry policy
-- (JSON text; {} never retries), $12 evidence: provenance, lockfiles, reports (JSON text)
INSERT INTO fleetq.operations
    (project, name, lane, command, handler, capabilities, memory_mb, cpu_millis, timeout_s,
     limits, retry, evidence)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::jsonb, $11::text::jsonb,
        $12::text::jsonb)
ON CONFLICT (project, name) DO UPDATE SET
    lane = EXCLUDED.lane,
    command = EXCLUDED.command,
    handler = EXCLUDED.handler,
    capabilities = EXCLUDED.capabilities,
    memory_mb = EXCLUDED.memory_mb,
    cpu_millis = EXCLUDED.cpu_millis,
    timeout_s = EXCLUDED.timeout_s,
    limits = EXCLUDED.limits,
    retry = EXCLUDED.retry,
    evidence = EXCLUDED.evidence,
    retired_at = NULL,  -- applying a removed operation brings it back
    retired_by = NULL,
    updated_at = clock_timestamp()
WHERE fleetq.operations.retired_at IS NOT NULL OR (fleetq.operations.lane, fleetq.operations.command, fleetq.operations.handler,
       fleetq.operations.capabilities, fleetq.operations.memory_mb,
       fleetq.operations.cpu_millis, fleetq.operations.timeout_s, fleetq.operations.limits,
       fleetq.operations.retry, fleetq.operations.evidence)
    IS DISTINCT FROM
      (EXCLUDED.lane, EXCLUDED.command, EXCLUDED.handler, EXCLUDED.capabilities,
       EXCLUDED.memory_mb, EXCLUDED.cpu_millis, EXCLUDED.timeout_s, EXCLUDED.limits,
       EXCLUDED.retry, EXCLUDED.evidence);

-- name: config_lane_names
-- The lanes already registered, so a file may name lanes it does not declare.
SELECT name FROM fleetq.lanes ORDER BY name;

-- name: config_wake_lanes
-- Wake every lane's runners at commit (a NOTIFY naming the lane alone: each claims). A
-- raised cap, a settings change or a revived operation may let queued jobs run that were
-- announced once at their submit and are announced by nothing else.
SELECT pg_notify('fleetq_work', name) FROM fleetq.lanes;

-- name: config_changed
-- Tell every runner at commit that the configuration changed (a hint on fleetq_control):
-- each reads again the settings it keeps (lease, offline threshold) and its operations.
SELECT pg_notify('fleetq_control', 'config');

-- name: config_summary
-- What the fleet configuration holds now, one row per kind.
SELECT 'lanes' AS kind, count(*) AS n FROM fleetq.lanes
UNION ALL SELECT 'projects', count(*) FROM fleetq.projects
UNION ALL SELECT 'operations', count(*) FROM fleetq.operations WHERE retired_at IS NULL
UNION ALL SELECT 'identities', count(*) FROM fleetq.identities
UNION ALL SELECT 'schedules', count(*) FROM fleetq.schedules;

-- name: config_operations
-- Every operation in force with its requirements, for listings.
SELECT project, name, lane, command, handler, capabilities, memory_mb, cpu_millis, timeout_s
FROM fleetq.operations
WHERE retired_at IS NULL
ORDER BY project, name;

-- name: configview_settings
SELECT name, value FROM fleetq.settings ORDER BY name;

-- name: configview_lanes
SELECT name, description, max_running FROM fleetq.lanes ORDER BY name;

-- name: configview_identities
SELECT name, role FROM fleetq.identities ORDER BY name;

-- name: configview_projects
SELECT name, repository, release_gate, description, max_running FROM fleetq.projects
ORDER BY name;

-- name: configview_operations
SELECT project, name, lane, command, handler, capabilities, memory_mb, cpu_millis, timeout_s,
       limits, retry, evidence
FROM fleetq.operations
WHERE retired_at IS NULL
ORDER BY project, name;

-- name: config_remove_operation
-- Retire an operation (refused while it has live jobs); its jobs and results stay.
-- $1 project, $2 operation, $3 actor
SELECT * FROM fleetq.retire_operation($1::text, $2::text, $3::text);

-- name: config_upsert_schedule
-- $1 name, $2 cron, $3 timezone, $4 project, $5 operation, $6 commit, $7 branch,
-- $8 payload (JSON text), $9 catch_up. A new schedule starts from now (last_tick's
-- default): applying a file never fires the past.
INSERT INTO fleetq.schedules
    (name, cron, timezone, project, operation, commit_sha, branch, payload, catch_up)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9)
ON CONFLICT (name) DO UPDATE SET
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, project = EXCLUDED.project,
    operation = EXCLUDED.operation, commit_sha = EXCLUDED.commit_sha,
    branch = EXCLUDED.branch, payload = EXCLUDED.payload, catch_up = EXCLUDED.catch_up,
    updated_at = clock_timestamp()
WHERE (fleetq.schedules.cron, fleetq.schedules.timezone, fleetq.schedules.project,
       fleetq.schedules.operation, fleetq.schedules.commit_sha, fleetq.schedules.branch,
       fleetq.schedules.payload, fleetq.schedules.catch_up)
    IS DISTINCT FROM
      (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.project, EXCLUDED.operation,
       EXCLUDED.commit_sha, EXCLUDED.branch, EXCLUDED.payload, EXCLUDED.catch_up);

-- name: configview_schedules
SELECT name, cron, timezone, project, operation, commit_sha, branch, payload, catch_up
FROM fleetq.schedules ORDER BY name;
