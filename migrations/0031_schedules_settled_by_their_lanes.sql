-- 0031_schedules_settled_by_their_lanes: a schedule's ticks are settled by the runners
-- of its lane, one runner a tick (issue 41, finding 6).
--
-- fleetq: expand
--
-- The reaper's leader, any runner, fired every schedule and resolved a branch schedule's
-- commit itself: a runner login of any lane (another tenant's) could fire a due tick of
-- a branch schedule at a commit of its choosing, and the verdict was then that commit's.
-- Now every runner settles the schedules of the lanes it serves, once a minute, and
-- fire_schedule, skip_schedule and take_schedule_turn refuse a runner login whose runner
-- does not serve the schedule's lane (protocol/schedules.sql). A runner of the lane
-- already decides the outcome of that lane's jobs: resolving the branch gives it nothing
-- new, and a runner of another lane gets nothing.
--
-- So that one runner of the lane, not all of them, runs `git ls-remote` at the minute, a
-- runner first takes a turn on the tick (fleetq.take_schedule_turn): resolving_by names
-- it, resolving_tick the tick, resolving_until when the turn lapses. A turn ends when its
-- tick is settled (fired or skipped, by anyone) or when it lapses, so a runner that dies
-- mid-resolve holds the schedule back that long and no longer. The turn saves work only:
-- each tick is still fired once through schedule_ticks and last_tick, whoever fires it.
--
-- Nullable columns without a default: older code never names them. An older runner
-- leading the reaper still fires every schedule: it is refused (42501, logged, retried
-- at its next pass) those of lanes it does not serve, which the upgraded runners of
-- those lanes fire.

ALTER TABLE fleetq.schedules
    ADD COLUMN resolving_by    text,          -- the runner whose turn it is
    ADD COLUMN resolving_tick  timestamptz,   -- the tick it is settling
    ADD COLUMN resolving_until timestamptz;   -- when the turn lapses

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.take_schedule_turn(text, text, timestamptz)', 'fleetq_runner'),
    ('EXECUTE', 'FUNCTION fleetq.lane_schedules(text)', 'fleetq_runner');
