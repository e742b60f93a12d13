-- 0041_verdict_provenance: what a verdict rests on besides the commit (issue 47).
--
-- fleetq: expand
--
-- A verdict keeps its provenance: the runner's environment (id, node, fleetq version, OS,
-- kernel, the tool versions its operation declares), the operation's definition as run,
-- the staging facts, the lockfiles' hashes, the test reports' counts. The environment
-- and the definition are the same for a runner's thousands of verdicts: they are kept
-- once, by their hash, in provenance_parts, and a verdict names them; what is its own
-- (staging, lockfiles, tests) is a column of the verdict's row. In steady state a
-- verdict costs no row more than before.
--
-- The runner sends it with the outcome (fleetq.complete and complete_and_claim take one
-- more array, last), and it is stored only with an outcome the fence accepted: no one
-- else's, no zombie's.

CREATE TABLE fleetq.provenance_parts (
    hash        text PRIMARY KEY CHECK (hash ~ '^[0-9a-f]{64}$'),  -- sha256 of body::text
    kind        text NOT NULL CHECK (kind IN ('environment', 'definition')),
    body        jsonb NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE fleetq.verdicts ADD COLUMN provenance jsonb;

-- The new signatures are created by protocol/leases.sql; the old ones stay, as wrappers
-- that keep no provenance, so a runner not yet upgraded goes on recording outcomes.
INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE', 'FUNCTION fleetq.' || f, g
FROM unnest(ARRAY['fleetq_runner', 'fleetq_gateway']) g, unnest(ARRAY[
    'complete(text, bigint[], bigint[], text[], integer[], text[], text[], integer[], '
        'integer[], integer[], jsonb[])',
    'complete_and_claim(text, bigint[], bigint[], text[], integer[], text[], text[], '
        'integer[], integer[], integer[], text, integer, uuid, jsonb[])']) f;

-- What an operation declares beyond its command: the tool versions to record
-- (`provenance`), the lockfiles to hash (`lockfiles`) and the test reports to read
-- (`reports`), as the fleet file gives them (configschema.EvidenceConfig); runners read
-- it with the operation (protocol/roles.sql: runner_operations returns one more column).
ALTER TABLE fleetq.operations ADD COLUMN evidence jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(evidence) = 'object');

-- whoever reads verdicts (`fleetq result`, the API's gateway) reads their provenance
INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'SELECT', 'TABLE fleetq.provenance_parts', g
FROM unnest(ARRAY['fleetq_submitter', 'fleetq_gateway']) g;
INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE', 'FUNCTION fleetq.provenance_whole(jsonb)', g
FROM unnest(ARRAY['fleetq_reader', 'fleetq_submitter', 'fleetq_operator', 'fleetq_gateway']) g;
