-- 0040_runner_tokens: an API token may stand for one runner id (issue 46), so a runner
-- on a node with no database credentials serves its lanes through `fleetq api`.
--
-- fleetq: expand
--
-- A runner token's holder is the runner its subject names: fleetq.caller() answers
-- ('runner', NODE/NAME) for it, and every runner function's own check
-- (fleetq.acting_runner) holds over HTTP exactly as for a runner login: it acts as that
-- runner only. The gateway login may call what a runner login calls, never on its own
-- (without a token caller() refuses it), and the API serves runner tokens only a fixed
-- list of the runner's statements (fleetq/core/runnercalls.py). A function granted to
-- runners by a later migration is granted to the gateway by that migration too.

ALTER TABLE fleetq.api_tokens DROP CONSTRAINT api_tokens_kind_check;
ALTER TABLE fleetq.api_tokens ADD CONSTRAINT api_tokens_kind_check
    CHECK (kind IN ('submitter', 'operator', 'reader', 'runner'));

-- Not the three bound to a database session of the runner's own (the runner-id lock, a
-- handler's row lock and its fenced ledger write): a gateway never holds one for a runner.
INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT privilege, object, 'fleetq_gateway' FROM fleetq.grants
WHERE grantee = 'fleetq_runner' AND privilege = 'EXECUTE'
  AND object NOT IN ('FUNCTION fleetq.take_runner_id(text)',
                     'FUNCTION fleetq.lock_for_handler(bigint, text, bigint)',
                     'FUNCTION fleetq.fenced_write(text, bigint, bigint, jsonb)')
ON CONFLICT DO NOTHING;

-- A runner served through the API holds its runner id for a while (fleetq.hold_runner_id,
-- renewed as it runs), not by a session of its own: the row says until when.
ALTER TABLE fleetq.coordination ADD COLUMN holder_until timestamptz;

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.hold_runner_id(text, text, integer)', 'fleetq_runner'),
    ('EXECUTE', 'FUNCTION fleetq.hold_runner_id(text, text, integer)', 'fleetq_gateway');
