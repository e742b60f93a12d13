-- What the console's overview reads on every refresh must not grow with history.
--
-- Throughput (jobs finished per minute) and queue wait (over jobs claimed recently, which
-- are either still live or finished since) look jobs up by finish time. One more index
-- entry per finished job; the claim path is untouched.

CREATE INDEX jobs_finished_at ON fleetq.jobs (finished_at) WHERE finished_at IS NOT NULL;
