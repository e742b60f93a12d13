-- Bulk submit (issue 18): fleetq.submit_many (protocol/submit.sql) queues many jobs in
-- one statement, with one event insert and one NOTIFY per lane, for `submit_many` in the
-- Python API and `fleetq submit --from-file`. The same rules as one submit: derived
-- priority, idempotency keys, validation; the identity is the caller's.

INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE',
       'FUNCTION fleetq.submit_many(text[], text[], text[], text[], text[], text[], jsonb[], '
       'text[], text)', g
FROM unnest(ARRAY['fleetq_submitter', 'fleetq_operator']) g;
