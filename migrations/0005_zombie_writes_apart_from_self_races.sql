-- Zombie writes counted apart from a runner's races with itself.
--
-- Every fenced write refused as stale was counted in runners.stale_rejections and logged
-- 'stale_rejected'. Most were benign: a heartbeat or a release that raced the runner's
-- own committed outcome (2 in a run with no fault at all), which hid the writes that
-- matter, those of a holder whose lease had moved on (cancelled, expired, claimed again
-- under a newer token). A refused write is a *self-race* when the job was settled by
-- this very runner under this very token (released_by/released_version, which outcome,
-- release and loss set) and no newer token exists; anything else is a *zombie* write.
-- stale_rejections and 'stale_rejected' now count zombies only; self-races go to
-- runners.self_races and 'stale_self_race'.

ALTER TABLE fleetq.runners ADD COLUMN self_races bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION fleetq.note_stale(
    p_runner text, p_kind text, p_jobs bigint[], p_versions bigint[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_zombie bigint[];
    v_zombie_versions bigint[];
    v_self bigint[];
    v_self_versions bigint[];
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    WITH w AS (
        SELECT i.id, i.version,
               coalesce(j.released_by = p_runner AND j.released_version = i.version
                        AND j.lease_version = i.version, false) AS own
        FROM unnest(p_jobs, p_versions) AS i(id, version)
        LEFT JOIN fleetq.jobs j ON j.id = i.id
    )
    SELECT array_agg(w.id) FILTER (WHERE NOT w.own),
           array_agg(w.version) FILTER (WHERE NOT w.own),
           array_agg(w.id) FILTER (WHERE w.own),
           array_agg(w.version) FILTER (WHERE w.own)
    INTO v_zombie, v_zombie_versions, v_self, v_self_versions
    FROM w;
    UPDATE fleetq.runners
    SET stale_rejections = stale_rejections + coalesce(cardinality(v_zombie), 0),
        self_races = self_races + coalesce(cardinality(v_self), 0)
    WHERE id = p_runner;
    IF v_zombie IS NOT NULL THEN
        PERFORM fleetq.log_events('stale_rejected', v_zombie, p_runner, v_zombie_versions, NULL,
                                  jsonb_build_object('write', p_kind));
    END IF;
    IF v_self IS NOT NULL THEN
        PERFORM fleetq.log_events('stale_self_race', v_self, p_runner, v_self_versions, NULL,
                                  jsonb_build_object('write', p_kind));
    END IF;
END;
$$;
