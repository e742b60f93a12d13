-- 0001_initial: the whole fleetq schema.
--
-- Conventions:
-- * Every timestamp is timestamptz written from clock_timestamp(): the database owns
--   time (DESIGN §1.6), never a runner's clock and never now() (fixed at transaction start).
-- * CPU amounts are integer millicpus (1000 = one CPU) so reservations add up exactly and
--   the capacity CHECKs never fail on rounding.
-- * Identifiers that operators type (lanes, projects, operations, nodes) are restricted to
--   a safe alphabet, so they can appear in logs, NOTIFY hints and shell commands unquoted.
-- `fleetq migrate` creates the schema and fleetq.schema_migrations before running this.

-- Settings the queue reads at run time (lease length, reassignment cap, ...). Values are
-- JSON so one table carries numbers, booleans and strings; `fleetq apply` writes them.
CREATE TABLE fleetq.settings (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    value       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

INSERT INTO fleetq.settings (name, value) VALUES
    ('lease_seconds', '30'),                 -- a claim's lease; heartbeats extend it
    ('reassignment_cap', '5'),               -- lease expiries before a job fails (poison jobs)
    ('runner_offline_after_seconds', '30'),  -- a runner silent this long is offline
    ('max_payload_bytes', '65536'),          -- submit refuses larger payloads
    ('aging_promote_after_seconds', 'null'); -- opt-in aging (DESIGN §5); null = off

-- A lane is a category of work with its own claim loop in every runner (DESIGN §2).
CREATE TABLE fleetq.lanes (
    name         text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,62}$'),
    description  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A registered source repository. Jobs name one; results attach to (project, commit).
CREATE TABLE fleetq.projects (
    name          text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    repository    text NOT NULL CHECK (repository <> ''),
    release_gate  boolean NOT NULL DEFAULT false,   -- gate projects get priority class 1
    description   text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- What a project allows to be run, on which lane, needing what. A job snapshots these
-- requirements at submit, so editing an operation never changes a job already queued.
CREATE TABLE fleetq.operations (
    project       text NOT NULL REFERENCES fleetq.projects (name) ON UPDATE CASCADE,
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    lane          text NOT NULL REFERENCES fleetq.lanes (name),
    command       text,      -- a shell command run in the staged source tree
    handler       text,      -- or an in-process async callable, "module:function"
    capabilities  text[] NOT NULL DEFAULT '{}',
    memory_mb     integer NOT NULL DEFAULT 0 CHECK (memory_mb >= 0),
    cpu_millis    integer NOT NULL DEFAULT 0 CHECK (cpu_millis >= 0),
    timeout_s     integer NOT NULL DEFAULT 3600 CHECK (timeout_s > 0),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (project, name),
    CHECK ((command IS NULL) <> (handler IS NULL))
);

-- Submitting identities with a role. Jobs submitted by a release-verification identity
-- get priority class 0; the caller never picks a priority number (DESIGN §3).
CREATE TABLE fleetq.identities (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$'),
    role        text NOT NULL CHECK (role IN ('release-verification', 'service', 'operator')),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One fleetq-runner process. Its id "node/name" is stable, so a restart is the same
-- runner. `state` is what operators set (drain, pause) plus 'drained' and 'offline' that
-- the runner itself writes; a stale heartbeat is *also* read as offline. Reserved
-- capacity is taken by claims and given back by outcomes in the same transactions; the
-- CHECKs make over-subscription impossible even under concurrent claims.
CREATE TABLE fleetq.runners (
    id                   text PRIMARY KEY,
    node                 text NOT NULL CHECK (node ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    name                 text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    capabilities         text[] NOT NULL DEFAULT '{}',
    memory_mb            integer NOT NULL CHECK (memory_mb >= 0),
    cpu_millis           integer NOT NULL CHECK (cpu_millis >= 0),
    reserved_memory_mb   integer NOT NULL DEFAULT 0,
    reserved_cpu_millis  integer NOT NULL DEFAULT 0,
    state                text NOT NULL DEFAULT 'active'
                         CHECK (state IN ('active', 'paused', 'draining', 'drained', 'offline')),
    state_reason         text,
    state_actor          text,
    state_changed_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_heartbeat_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    stale_rejections     bigint NOT NULL DEFAULT 0,  -- fenced writes refused to this runner
    version              text NOT NULL DEFAULT '',
    pid                  integer,
    registered_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (id = node || '/' || name),
    CHECK (reserved_memory_mb BETWEEN 0 AND memory_mb),
    CHECK (reserved_cpu_millis BETWEEN 0 AND cpu_millis)
);

-- The lanes a runner serves and its slots in each; slots_used is reserved by claims.
CREATE TABLE fleetq.runner_lanes (
    runner_id   text NOT NULL REFERENCES fleetq.runners (id) ON DELETE CASCADE,
    lane        text NOT NULL REFERENCES fleetq.lanes (name),
    slots       integer NOT NULL CHECK (slots > 0),
    slots_used  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (runner_id, lane),
    CHECK (slots_used BETWEEN 0 AND slots)
);

-- A job: project + operation + exact commit. Life: queued -> claimed -> running ->
-- succeeded | failed, or cancelled | refused at any point; lease expiry and a first
-- explicit loss send claimed/running back to queued. `lease_version` is the fencing
-- token: it only ever increases, once per claim.
CREATE TABLE fleetq.jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project              text NOT NULL,
    operation            text NOT NULL,
    commit_sha           text NOT NULL CHECK (commit_sha ~ '^[0-9a-f]{40}$'),
    -- requirements, snapshotted from the operation at submit
    lane                 text NOT NULL REFERENCES fleetq.lanes (name),
    capabilities         text[] NOT NULL DEFAULT '{}',
    memory_mb            integer NOT NULL DEFAULT 0 CHECK (memory_mb >= 0),
    cpu_millis           integer NOT NULL DEFAULT 0 CHECK (cpu_millis >= 0),
    timeout_s            integer NOT NULL CHECK (timeout_s > 0),
    requested_node       text,
    -- submission
    idempotency_key      text CHECK (length(idempotency_key) BETWEEN 1 AND 256),
    task_id              text,
    submitted_by         text NOT NULL,
    payload              jsonb NOT NULL DEFAULT '{}',
    priority_class       smallint NOT NULL CHECK (priority_class IN (0, 1, 2)),
    -- state and lease
    state                text NOT NULL DEFAULT 'queued' CHECK (state IN
                         ('queued', 'claimed', 'running', 'succeeded', 'failed', 'cancelled', 'refused')),
    lease_owner          text REFERENCES fleetq.runners (id),
    lease_version        bigint NOT NULL DEFAULT 0 CHECK (lease_version >= 0),
    lease_expires_at     timestamptz,
    claim_id             uuid,      -- the client's id for the claim that holds the lease
    -- The runner whose capacity this job holds. Set by the claim; still set after a
    -- cancel until that runner confirms the stop ("stop pending"); cleared when released.
    reserved_on          text REFERENCES fleetq.runners (id),
    -- Who ended the last lease voluntarily (an outcome or a loss report), so a retry of
    -- that same write after a lost reply answers "already", not "stale".
    released_by          text,
    released_version     bigint,
    released_kind        text,
    lost_count           smallint NOT NULL DEFAULT 0,   -- explicit losses (requeued once)
    reassign_count       integer NOT NULL DEFAULT 0,    -- lease expiries (capped separately)
    failure_reason       text,      -- e.g. exit, timeout, lost, reassignments_exhausted
    cancel_requested_at  timestamptz,
    cancelled_by         text,
    cancel_reason        text,
    -- a timestamp for every transition
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_at           timestamptz,
    started_at           timestamptz,
    finished_at          timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    FOREIGN KEY (project, operation) REFERENCES fleetq.operations (project, name)
        ON UPDATE CASCADE,
    -- A live lease has an owner and an expiry; nothing else does.
    CHECK ((state IN ('claimed', 'running'))
           = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    -- A live lease always holds its owner's capacity.
    CHECK (state NOT IN ('claimed', 'running') OR reserved_on = lease_owner),
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'refused')) = (finished_at IS NOT NULL))
);

CREATE UNIQUE INDEX jobs_idempotency_key ON fleetq.jobs (project, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The claim walks this index in priority order within one lane: an index scan over
-- queued jobs only, so finished history never slows the hot path.
CREATE INDEX jobs_queued ON fleetq.jobs (lane, priority_class, created_at, id)
    WHERE state = 'queued';
-- The reaper finds expired leases. What a runner holds is found through reserved_on
-- (equal to lease_owner for every live lease, by CHECK), so no lease_owner index: each
-- index on jobs costs every claim and every outcome an insert.
CREATE INDEX jobs_lease_expiry ON fleetq.jobs (lease_expires_at)
    WHERE state IN ('claimed', 'running');
-- The result reader and task threads.
CREATE INDEX jobs_project_commit ON fleetq.jobs (project, commit_sha, operation);
CREATE INDEX jobs_task ON fleetq.jobs (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX jobs_reserved_on ON fleetq.jobs (reserved_on) WHERE reserved_on IS NOT NULL;
-- A retried claim finds what its claim id took; only live leases can be retried.
CREATE INDEX jobs_claim_id ON fleetq.jobs (claim_id) WHERE state IN ('claimed', 'running');

-- One launch of a job by a runner under one lease version (DESIGN §2). Two executions
-- of one job whose [launched_at, ended_at) intervals intersect form an overlap window.
CREATE TABLE fleetq.executions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id              bigint NOT NULL REFERENCES fleetq.jobs (id),
    lease_version       bigint NOT NULL,
    runner_id           text NOT NULL REFERENCES fleetq.runners (id),
    node                text NOT NULL,
    run_id              uuid NOT NULL UNIQUE,
    pid                 integer,
    process_started_at  timestamptz,   -- with pid, identifies the process across pid reuse
    prepared_at         timestamptz,
    launched_at         timestamptz,
    start_reported_at   timestamptz,
    ended_at            timestamptz,
    prepare_ms          integer,
    run_ms              integer,
    exit_code           integer,
    signal              integer,
    stop_reason         text CHECK (stop_reason IN
                        ('cancelled', 'superseded', 'self_fenced', 'lost', 'timeout', 'shutdown')),
    stop_requested_at   timestamptz,
    stop_confirmed      boolean NOT NULL DEFAULT false,  -- the runner saw the process group gone
    UNIQUE (job_id, lease_version)
);

CREATE INDEX executions_live ON fleetq.executions (runner_id) WHERE ended_at IS NULL;

-- Append-only history. Every transition writes one row in its own transaction, so the
-- console can draw lease timelines and `fleetq stats` can measure recovery.
CREATE TABLE fleetq.events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind           text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]*$'),
    job_id         bigint,
    runner_id      text,
    lease_version  bigint,
    actor          text,
    detail         jsonb NOT NULL DEFAULT '{}'
);

-- By job, for timelines. Not by runner: two event rows per job would each pay for that
-- index, while reading one runner's history is rare and can walk the id order.
CREATE INDEX events_job ON fleetq.events (job_id, id) WHERE job_id IS NOT NULL;

CREATE FUNCTION fleetq.refuse_event_rewrite() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'fleetq.events is append-only' USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON fleetq.events
    FOR EACH ROW EXECUTE FUNCTION fleetq.refuse_event_rewrite();

-- The latest verdict for (project, commit, operation), written in the outcome's
-- transaction: "this check reported this outcome for this project at this revision".
CREATE TABLE fleetq.results (
    project      text NOT NULL,
    commit_sha   text NOT NULL,
    operation    text NOT NULL,
    job_id       bigint NOT NULL REFERENCES fleetq.jobs (id),
    verdict      text NOT NULL CHECK (verdict IN ('passed', 'failed', 'refused', 'cancelled')),
    exit_code    integer,
    reason       text,
    log_tail     text NOT NULL DEFAULT '',
    prepare_ms   integer,
    run_ms       integer,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (project, commit_sha, operation)
);

-- Task-thread notifications, written by terminal outcomes of jobs that carry a task id.
CREATE TABLE fleetq.task_notifications (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id       text NOT NULL,
    job_id        bigint NOT NULL REFERENCES fleetq.jobs (id),
    state         text NOT NULL,
    verdict       text,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivered_at  timestamptz
);

CREATE INDEX task_notifications_task ON fleetq.task_notifications (task_id, id);

-- A fenced resource shipped with fleetq (DESIGN §1.3): per key, the highest fencing
-- token seen; a write with a lower token is rejected. Every attempt is recorded, so the
-- fault tests can count violations (an accepted write below an earlier accepted token).
CREATE TABLE fleetq.fenced_ledger (
    key            text PRIMARY KEY,
    highest_token  bigint NOT NULL,
    job_id         bigint NOT NULL,
    value          jsonb NOT NULL DEFAULT '{}',
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE fleetq.fenced_writes (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key       text NOT NULL,
    job_id    bigint NOT NULL,
    token     bigint NOT NULL,
    value     jsonb NOT NULL DEFAULT '{}',
    accepted  boolean NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX fenced_writes_key ON fleetq.fenced_writes (key, id);
