-- The HTTP producer API (issue 17): bearer tokens that stand for a submitter, operator or
-- reader identity, and a gateway login for the API server that holds no power of its own.
--
-- - fleetq.api_tokens keeps a token's SHA-256 only: the token itself is shown once, when
--   it is made (`fleetq tokens add`), and never stored.
-- - The API server puts the caller's token in the transaction-local setting
--   `fleetq.token` (fleetq.act_for_token); fleetq.caller() (protocol/roles.sql) then
--   answers the token's kind and identity, so every entry point's checks (a submitter submits as itself, cancels only
--   its own jobs; a reader writes nothing) hold over HTTP exactly as for a login.
-- - A gateway login may act only for a token's holder: without a valid token every entry
--   point refuses it. A compromised API server can submit and cancel only for the callers
--   that present their tokens to it, never choose an identity (it can still read what a
--   submitter reads: docs/security.md).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fleetq_gateway') THEN
        BEGIN
            CREATE ROLE fleetq_gateway NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database of this cluster created it meanwhile
        END;
    END IF;
END;
$$;

CREATE TABLE fleetq.api_tokens (
    name          text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$'),
    kind          text NOT NULL CHECK (kind IN ('submitter', 'operator', 'reader')),
    subject       text NOT NULL,   -- the identity the token's holder acts as
    token_sha256  bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by    text
);

ALTER TABLE fleetq.logins DROP CONSTRAINT logins_kind_check;
ALTER TABLE fleetq.logins ADD CONSTRAINT logins_kind_check
    CHECK (kind IN ('runner', 'submitter', 'operator', 'reader', 'gateway'));

ALTER TABLE fleetq.grants DROP CONSTRAINT grants_grantee_check;
ALTER TABLE fleetq.grants ADD CONSTRAINT grants_grantee_check
    CHECK (grantee IN ('fleetq_runner', 'fleetq_submitter', 'fleetq_operator',
                       'fleetq_reader', 'fleetq_gateway'));

-- A gateway calls what a submitter calls and reads what a submitter reads (operators'
-- and readers' tokens read jobs and results through it too); the protocol decides, per
-- call, what the token's holder may do.
INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT privilege, object, 'fleetq_gateway' FROM fleetq.grants
WHERE grantee = 'fleetq_submitter'
ON CONFLICT DO NOTHING;

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.act_for_token(text)', 'fleetq_gateway');
