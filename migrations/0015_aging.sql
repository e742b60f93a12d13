-- Aging (issue 17): the setting aging_promote_after_seconds existed and nothing read it.
-- Now, when set, a job queued that long is promoted one priority class, and one more for
-- each further such wait, up to class 0 (protocol/recovery.sql, by the reaper's leader).
-- `promotions` counts them, so a promoted job's next promotion is due a whole wait later
-- and the class it was submitted with can be told: priority_class + promotions.

ALTER TABLE fleetq.jobs ADD COLUMN promotions smallint NOT NULL DEFAULT 0
    CHECK (promotions BETWEEN 0 AND 2);
