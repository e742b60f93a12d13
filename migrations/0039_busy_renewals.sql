-- 0039_busy_renewals: a renewal answered `busy` renews the lease in the database too
-- (issue 43: a handler's session ended mid-transaction).
--
-- fleetq: expand
--
-- A handler's ctx.transaction() holds its job's row; the runner's heartbeat skips a held
-- row (SKIP LOCKED) and answers `busy`, which the runner counts as a renewal: nobody can
-- take a lease whose row is held. But the row's lease_expires_at cannot be written
-- meanwhile, so it ran out in the database while the runner's fence clock was fresh, and
-- were the handler's session then ended (a cut connection,
-- idle_in_transaction_session_timeout) the row came free with an expired lease: the
-- reaper gave the job to another runner while the first still ran it. A busy answer now
-- writes its renewal here (heartbeat_unchecked) and the reaper takes a lease only once
-- both have passed (reap_unchecked). No foreign key: its check would wait for the very
-- row lock this table works around. Rows go with their job (prune_jobs).

CREATE TABLE fleetq.busy_renewals (
    job_id            bigint PRIMARY KEY,
    lease_version     bigint NOT NULL,       -- the token renewed: an older one counts for nothing
    lease_expires_at  timestamptz NOT NULL   -- the lease runs at least until then
);
