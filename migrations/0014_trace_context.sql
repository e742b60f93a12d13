-- Trace context on every job (issue 17): a W3C `traceparent` given at submit is stored
-- on the job, handed to the job as TRACEPARENT, and shown wherever the job is. The
-- format is checked here too, so no client can store something else under the name.
-- submit takes it and claim returns it: both signatures change, so the old ones are
-- dropped here and protocol/{submit,claim}.sql create the new ones. IF EXISTS: the old
-- ones were made by a protocol file, which a fresh database has not run yet (protocol
-- files are applied after every numbered migration).

ALTER TABLE fleetq.jobs ADD COLUMN traceparent text
    CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');

DROP FUNCTION IF EXISTS fleetq.submit(text, text, text, text, text, text, text, jsonb, bigint[]);
DROP FUNCTION IF EXISTS fleetq.submit_unchecked(text, text, text, text, text, text, text, jsonb, bigint[]);
DROP FUNCTION IF EXISTS fleetq.claim(text, text, integer, uuid);
DROP FUNCTION IF EXISTS fleetq.claim_unchecked(text, text, integer, uuid);

UPDATE fleetq.grants
SET object = 'FUNCTION fleetq.submit(text, text, text, text, text, text, text, jsonb, bigint[], text)'
WHERE object = 'FUNCTION fleetq.submit(text, text, text, text, text, text, text, jsonb, bigint[])';
