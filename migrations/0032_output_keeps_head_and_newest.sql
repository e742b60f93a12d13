-- 0032_output_keeps_head_and_newest: a run's stored output is its head and its newest
-- bytes, with what was dropped between them counted (issue 42, finding 3).
--
-- fleetq: expand
--
-- A run's output past output_keep_kib lost its newest end: the runner shipped at most
-- 1 MiB a half second from where it had got to, so a job writing faster ended with its
-- last lines never shipped, and a check's summary (its last lines) was never stored.
-- The runner now skips ahead to the newest output_keep_kib when it falls behind, always
-- after the first 64 KiB (what ran, and how it started), and ships everything to the end
-- before the outcome. Each chunk says where it starts in the run's output (start_byte),
-- so append_output keeps the head's chunks besides the newest ones and a reader names
-- the bytes missing between two chunks. The node's log file keeps everything.
--
-- A nullable column: older runners' chunks (the old append_output, kept for them) have
-- none, and are kept and read as before.

ALTER TABLE fleetq.job_output ADD COLUMN start_byte bigint CHECK (start_byte >= 0);

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.append_output(text,bigint,bigint,integer,bigint,bytea)',
     'fleetq_runner');
