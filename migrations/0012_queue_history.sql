-- Queue history (issue 15): depth and wait per lane and priority class, one sample a
-- minute, so the console shows the last hour the moment it opens (not only what it saw
-- while it was open), and an operator can tell a queue that is building up from one that
-- is draining.
--
-- The reaper's leader writes the sample in its pass (fleetq.sample_queues, in
-- migrations/protocol/recovery.sql): one leader at a time already exists
-- (the advisory lock), so a minute is sampled once however many runners run; a minute no
-- runner led is missing and shows as a gap, never as an empty queue. Reading the
-- queue's depth back from the events would have to replay every kind of requeue; a
-- sample is a few rows a minute and one index probe per pass otherwise.

CREATE TABLE fleetq.queue_samples (
    at              timestamptz NOT NULL,   -- the minute sampled (its start)
    lane            text NOT NULL,
    priority_class  smallint NOT NULL,
    queued          integer NOT NULL,       -- queued jobs when sampled
    oldest_wait_s   real,                   -- how long the oldest of them had waited
    claimed         integer NOT NULL,       -- jobs claimed in the minute before
    wait_p50_s      real,                   -- their wait (created -> claimed), median
    wait_max_s      real,                   -- and longest
    PRIMARY KEY (at, lane, priority_class)
);

COMMENT ON TABLE fleetq.queue_samples IS
    'One row per minute, lane and priority class, written by the reaper''s leader; kept 7 days.';
