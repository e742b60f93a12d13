-- API tokens (migration 0019): a bearer token stands for a submitter, operator or reader
-- identity; only its SHA-256 is stored.

-- name: tokens_add
-- $1 name, $2 kind, $3 identity, $4 sha256 of the token, $5 who made it
INSERT INTO fleetq.api_tokens (name, kind, subject, token_sha256, created_by)
VALUES ($1::text, $2::text, $3::text, $4::bytea, $5::text)
ON CONFLICT (name) DO NOTHING
RETURNING created_at;

-- name: tokens_list
SELECT name, kind, subject, created_at, created_by FROM fleetq.api_tokens
ORDER BY kind, name;

-- name: tokens_revoke
-- $1 name
DELETE FROM fleetq.api_tokens WHERE name = $1::text RETURNING name;

-- name: tokens_act_for
-- Act as the holder of this token for the rest of the transaction (every entry point's
-- checks then apply to that identity: protocol/roles.sql); answers who that is, or
-- refuses (FQ007) an unknown or revoked token.
-- $1 the token as the caller sent it
SELECT kind, subject FROM fleetq.act_for_token($1::text);
