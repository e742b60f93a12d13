-- Fleet-wide caps (issue 17): `max_running` per lane and per project, how many of its
-- jobs may hold capacity at once across the whole fleet (claimed, running, or cancelled
-- with the stop not yet confirmed). NULL, the default, is no cap.
--
-- Enforced in the claim's transaction, counted with locking: a claim in a capped lane
-- (or while any project is capped) takes that lane's (projects') row first, so claims
-- under one cap run one at a time and each counts what the one before it took. The
-- count reads jobs_reserved_on (jobs holding capacity: bounded by the fleet's slots,
-- not by history). Uncapped lanes and projects cost the claim one read of a small row.

ALTER TABLE fleetq.lanes ADD COLUMN max_running integer CHECK (max_running > 0);
ALTER TABLE fleetq.projects ADD COLUMN max_running integer CHECK (max_running > 0);
