-- Queue history (issue 15): depth and wait per lane and priority class, one sample a
-- minute, so the console shows the last hour the moment it opens (not only what it saw
-- while it was open), and an operator can tell a queue that is building up from one that
-- is draining.
--
-- The reaper's leader writes the sample in its pass: one leader at a time already exists
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

CREATE FUNCTION fleetq.sample_queues(p_now timestamptz DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_minute timestamptz := date_trunc('minute', v_now);
    v_rows integer := 0;
BEGIN
    IF EXISTS (SELECT 1 FROM fleetq.queue_samples WHERE at = v_minute) THEN
        RETURN 0;  -- every pass but the minute's first stops here: one index probe
    END IF;
    BEGIN  -- a sample that fails costs the sample, never the reaper's pass
        WITH since AS (  -- the claims of the minute before, found as views_queue_wait does
            SELECT coalesce(max(id), 0) AS id
            FROM fleetq.events
            WHERE at < v_minute - interval '1 minute'
        ),
        waits AS (
            SELECT j.lane, j.priority_class, count(*) AS claimed,
                   percentile_cont(0.5) WITHIN GROUP
                       (ORDER BY extract(epoch FROM e.at - j.created_at)) AS p50_s,
                   max(extract(epoch FROM e.at - j.created_at)) AS max_s
            FROM since
            JOIN fleetq.events e ON e.id > since.id
            JOIN fleetq.jobs j ON j.id = e.job_id
            WHERE e.kind = 'claimed'
              AND e.at >= v_minute - interval '1 minute' AND e.at < v_minute
            GROUP BY j.lane, j.priority_class
        ),
        depth AS (
            SELECT lane, priority_class, count(*) AS queued, min(created_at) AS oldest
            FROM fleetq.jobs
            WHERE state = 'queued'
            GROUP BY lane, priority_class
        )
        INSERT INTO fleetq.queue_samples
            (at, lane, priority_class, queued, oldest_wait_s, claimed, wait_p50_s, wait_max_s)
        SELECT v_minute, l.name, c.class, coalesce(d.queued, 0),
               greatest(0, extract(epoch FROM v_now - d.oldest)),
               coalesce(w.claimed, 0), w.p50_s, w.max_s
        FROM fleetq.lanes l
        CROSS JOIN (VALUES (0::smallint), (1::smallint), (2::smallint)) AS c(class)
        LEFT JOIN depth d ON d.lane = l.name AND d.priority_class = c.class
        LEFT JOIN waits w ON w.lane = l.name AND w.priority_class = c.class
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        DELETE FROM fleetq.queue_samples WHERE at < v_minute - interval '7 days';
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'fleetq: queue sample of % not written: %', v_minute, SQLERRM;
        RETURN 0;
    END;
    RETURN v_rows;
END;
$$;

-- The leader samples after its pass (a runner may lead; only an administrator may move
-- the clock, which the sample then follows, so tests write history without sleeping).
CREATE OR REPLACE FUNCTION fleetq.reap(p_limit integer DEFAULT 1000, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (requeued integer, failed integer, leader boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    v record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF p_now IS NOT NULL AND c.kind <> 'admin' THEN
        RAISE EXCEPTION 'only an administrator may reap at another time'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO v FROM fleetq.reap_unchecked(p_limit, p_now);
    IF v.leader THEN
        PERFORM fleetq.sample_queues(p_now);
    END IF;
    RETURN QUERY SELECT v.requeued, v.failed, v.leader;
END;
$$;

SELECT fleetq.secure();
