-- Job output shipped by runners (migration 0008).

-- name: output_append
-- The answer is the run's budget past its head (output_keep_kib, in bytes).
-- $1 runner, $2 job, $3 token, $4 chunk number, $5 its first byte's offset, $6 bytes
SELECT fleetq.append_output($1::text, $2::bigint, $3::bigint, $4::integer, $5::bigint,
                            $6::bytea) AS keep_bytes;

-- name: output_read
-- A job's output chunks after (token, seq), oldest first; $2 NULL: every token.
-- $1 job, $2 token, $3 after token, $4 after seq
SELECT lease_version, seq, at, data, start_byte
FROM fleetq.job_output
WHERE job_id = $1::bigint AND ($2::bigint IS NULL OR lease_version = $2::bigint)
  AND (lease_version, seq) > ($3::bigint, $4::integer)
ORDER BY lease_version, seq;

-- name: output_newest
-- The newest chunks of a job's output, newest first (the console's live tail).
-- $1 job, $2 at most this many chunks
SELECT lease_version, seq, data, start_byte
FROM fleetq.job_output
WHERE job_id = $1::bigint
ORDER BY lease_version DESC, seq DESC
LIMIT $2::integer;

-- name: output_token_granted
-- Whether a job was ever claimed under a token (`fleetq logs --token N`).
-- $1 job, $2 token
SELECT EXISTS (SELECT 1 FROM fleetq.events
               WHERE job_id = $1::bigint AND kind = 'claimed' AND lease_version = $2::bigint);
