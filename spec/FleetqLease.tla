---------------------------- MODULE FleetqLease ----------------------------
(***************************************************************************)
(* The lease protocol of fleetq (migrations/protocol/*.sql) and the         *)
(* runner's side of it (fleetq/runner/), for a few jobs and runners.        *)
(* The database's writes are guarded by the lease's owner and its fencing  *)
(* token (the lease version); a runner acts on what it believes it holds,  *)
(* which may be out of date (a zombie), and on its own clock.              *)
(*                                                                         *)
(* DESIGN (what is state, and which action mirrors which code)             *)
(*                                                                         *)
(* The database, per job j:                                                *)
(*   state[j]      queued | leased | waiting | succeeded | failed |        *)
(*                 cancelled. `leased` is claimed or running: the start    *)
(*                 report is folded into Launch (its guard is the one of   *)
(*                 every holder's write).                                  *)
(*   owner[j]      lease_owner; reservedOn[j] reserved_on (the slot and    *)
(*                 the lane cap's room: a cancel keeps it until the stop   *)
(*                 is confirmed); token[j] lease_version.                  *)
(*   age[j]        ticks since the lease was granted or last renewed, on   *)
(*                 the database's clock (0..Lease+1); the reaper takes a   *)
(*                 lease only at Lease+1: lease_expires_at < clock.        *)
(*   txn[j]        the owner's handler transaction (ctx.transaction())     *)
(*                 holds the row: renewals answer `busy`, the reaper and   *)
(*                 cancel skip or wait for it.                             *)
(*   reassigned, lost, attempts: reassign_count, lost_count, attempts.     *)
(*   released[j]   released_by/version/kind: what answers `already`.       *)
(*   outcomes[j], handbacks[j]: history (outcomes written; uncounted       *)
(*                 shutdown releases), read only by invariants.            *)
(*                                                                         *)
(* A runner r: run[r] up | frozen (SIGSTOP: nothing of the runner acts,    *)
(* its job processes run on) | down (crashed; with --orphans adopt its     *)
(* commands live on; the journal remembers what it launched). held[r] is   *)
(* its executions [job, tok, phase, eage]:                                 *)
(*   phase  claimed (nothing launched) | running (process alive, start     *)
(*          reported) | ended (exited by itself, outcome to write) |       *)
(*          written (outcome committed, reply lost: retried) | fenced |    *)
(*          moved (stopped: superseded or cancelled) | shutdown (stopped   *)
(*          by a graceful shutdown): the last three have no process.       *)
(*   eage   ticks since the renewal (or claim) the runner counts from was  *)
(*          SENT (Execution.renewed_at), 0..FenceAt+1. The runner stops a  *)
(*          run at FenceAt = Lease - Margin (fencing.FenceRule).           *)
(*                                                                         *)
(* Time is integer ticks, kept relative (ages, not a clock), so the state  *)
(* space is finite without a horizon. Tick ages every live lease and every *)
(* execution of a runner that is not down; it cannot pass an up runner's   *)
(* fence deadline while that runner still runs the job: that is the       *)
(* runner's timeliness (its 0.25 s fence check), which a frozen runner    *)
(* does not have. Runner actions are atomic with their database call (the *)
(* call's reply may be lost where it matters: claim, renewal, outcome).    *)
(*                                                                         *)
(* Actions: Claim (claim.sql claim_take), Launch (report_start), Heartbeat *)
(* (heartbeat_unchecked: ok | busy | stale), TxnBegin/TxnEnd (context.py   *)
(* _lock/_renew), Finish, Complete (complete_unchecked, with `already`;    *)
(* a failed attempt its operation retries waits: schedule_retries),       *)
(* DueRetry (queue_due_retries), SelfFence (keeping._self_fence_once),     *)
(* HandBackFenced (confirm_stop + release_counted), Notice + ConfirmStop   *)
(* (cancel's stop request, confirm_stop), Shutdown + Release (service.     *)
(* _shutdown, release_unchecked uncounted), Stray (keeping._strays_once:   *)
(* report_lost), Reap (reap_unchecked), Cancel (cancel_unchecked), Freeze, *)
(* Thaw, Crash, Restart (collection.collect: adopt, report lost, confirm), *)
(* Tick.                                                                   *)
(*                                                                         *)
(* Mutation names one deliberate bug (see the Mutant* configs): CI checks  *)
(* that TLC reports each; a model that cannot fail proves nothing.         *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    Runners,        \* runner ids (a symmetry set)
    Jobs,           \* job ids, all of one lane (a symmetry set)
    Slots,          \* slots per runner in the lane
    Cap,            \* the lane's cap on jobs in flight (reserved), fleet-wide
    ReassignCap,    \* settings.reassignment_cap
    MaxAttempts,    \* the operation's retry.max_attempts (1: no retry)
    Lease,          \* lease length, in ticks
    Margin,         \* the self-fence margin (SIGKILL, reaping, scheduling), in ticks
    MaxClaims,      \* state constraint: claims of all jobs together, at most
    Mutation,       \* "none", or the bug this run of TLC must find
    HandlerSessionLost  \* the server may end a handler's session mid-transaction

None == "none"
FenceAt == Lease - Margin
Terminal == {"succeeded", "failed", "cancelled"}
Live == {"claimed", "running"}          \* phases the runner renews and fences
Stopped == {"fenced", "moved", "shutdown"}
NoRelease == [by |-> None, tok |-> 0, kind |-> None]

VARIABLES
    state, owner, reservedOn, token, age, txn, reassigned, lost, attempts, released,
    outcomes, handbacks,
    run, held

db == <<state, owner, reservedOn, token, age, txn, reassigned, lost, attempts, released>>
vars == <<db, outcomes, handbacks, run, held>>

Exec == [job : Jobs, tok : Nat,
         phase : Live \cup Stopped \cup {"ended", "written"}, eage : 0..FenceAt + 1]

TypeOK ==
    /\ state \in [Jobs -> {"queued", "leased", "waiting"} \cup Terminal]
    /\ owner \in [Jobs -> Runners \cup {None}]
    /\ reservedOn \in [Jobs -> Runners \cup {None}]
    /\ token \in [Jobs -> Nat]
    /\ age \in [Jobs -> 0..Lease + 1]
    /\ txn \in [Jobs -> BOOLEAN]
    /\ run \in [Runners -> {"up", "frozen", "down"}]
    /\ \A r \in Runners : held[r] \subseteq Exec

Init ==
    /\ state = [j \in Jobs |-> "queued"]
    /\ owner = [j \in Jobs |-> None]
    /\ reservedOn = [j \in Jobs |-> None]
    /\ token = [j \in Jobs |-> 0]
    /\ age = [j \in Jobs |-> 0]
    /\ txn = [j \in Jobs |-> FALSE]
    /\ reassigned = [j \in Jobs |-> 0]
    /\ lost = [j \in Jobs |-> 0]
    /\ attempts = [j \in Jobs |-> 1]
    /\ released = [j \in Jobs |-> NoRelease]
    /\ outcomes = [j \in Jobs |-> {}]
    /\ handbacks = [j \in Jobs |-> 0]
    /\ run = [r \in Runners |-> "up"]
    /\ held = [r \in Runners |-> {}]

Min(a, b) == IF a < b THEN a ELSE b
InFlight == {j \in Jobs : reservedOn[j] # None}
Reserved(r) == {j \in Jobs : reservedOn[j] = r}

(* The truth: e's lease is the job's live lease. *)
Current(r, e) == state[e.job] = "leased" /\ owner[e.job] = r /\ token[e.job] = e.tok

(* The guard of every write a lease holder makes (owner AND token, and a live lease). *)
Holds(r, e) ==
    /\ state[e.job] = "leased" /\ owner[e.job] = r
    /\ (Mutation = "OwnerOnly" \/ token[e.job] = e.tok)

(* The renewal's guard (heartbeat_unchecked locks owner + token rows only). *)
RenewHolds(r, e) ==
    /\ state[e.job] = "leased" /\ owner[e.job] = r
    /\ (Mutation \in {"OwnerOnly", "HeartbeatWithoutToken"} \/ token[e.job] = e.tok)

Drop(r, e) == held' = [held EXCEPT ![r] = @ \ {e}]
Replace(r, e, f) == held' = [held EXCEPT ![r] = (@ \ {e}) \cup {f}]

(* Every end of a lease clears these columns, as the SQL does. *)
EndLease(j, newState) ==
    /\ state' = [state EXCEPT ![j] = newState]
    /\ owner' = [owner EXCEPT ![j] = None]
    /\ age' = [age EXCEPT ![j] = 0]

Outcome(j, by, kind, tok) ==
    outcomes' = [outcomes EXCEPT ![j] = @ \cup
                 {[by |-> by, kind |-> kind, tok |-> tok, current |-> token[j]]}]

-----------------------------------------------------------------------------
(* Runner r claims queued job j (claim_take): within its slots and the lane's cap,  *)
(* both counted under locks (the runner's row; the lane's row in claim_rooms), with *)
(* token + 1 and a fresh lease. A lost reply leaves a lease the runner does not know *)
(* of (settled by Stray or by a restart's collection).                             *)
Claim(r, j, replyLost) ==
    /\ run[r] = "up"
    /\ state[j] = "queued"
    /\ Cardinality(Reserved(r)) < Slots
    /\ Cardinality(InFlight) < Cap
    /\ state' = [state EXCEPT ![j] = "leased"]
    /\ owner' = [owner EXCEPT ![j] = r]
    /\ reservedOn' = [reservedOn EXCEPT ![j] = r]
    /\ token' = [token EXCEPT ![j] = @ + 1]
    /\ age' = [age EXCEPT ![j] = 0]
    /\ held' = IF replyLost THEN held
               ELSE [held EXCEPT ![r] = @ \cup
                     {[job |-> j, tok |-> token[j] + 1, phase |-> "claimed", eage |-> 0]}]
    /\ UNCHANGED <<txn, reassigned, lost, attempts, released, outcomes, handbacks, run>>

(* Mutation CapWithoutLock: two runners' claims each count the lane's last room     *)
(* before the other commits (claim_rooms without p_lock), and both take a job.      *)
ClaimRace(r1, r2, j1, j2) ==
    /\ Mutation = "CapWithoutLock"
    /\ r1 # r2 /\ j1 # j2
    /\ run[r1] = "up" /\ run[r2] = "up"
    /\ state[j1] = "queued" /\ state[j2] = "queued"
    /\ Cardinality(Reserved(r1)) < Slots /\ Cardinality(Reserved(r2)) < Slots
    /\ Cardinality(InFlight) = Cap - 1
    /\ state' = [state EXCEPT ![j1] = "leased", ![j2] = "leased"]
    /\ owner' = [owner EXCEPT ![j1] = r1, ![j2] = r2]
    /\ reservedOn' = [reservedOn EXCEPT ![j1] = r1, ![j2] = r2]
    /\ token' = [token EXCEPT ![j1] = @ + 1, ![j2] = @ + 1]
    /\ age' = [age EXCEPT ![j1] = 0, ![j2] = 0]
    /\ held' = [held EXCEPT
                  ![r1] = @ \cup {[job |-> j1, tok |-> token[j1] + 1, phase |-> "claimed", eage |-> 0]},
                  ![r2] = @ \cup {[job |-> j2, tok |-> token[j2] + 1, phase |-> "claimed", eage |-> 0]}]
    /\ UNCHANGED <<txn, reassigned, lost, attempts, released, outcomes, handbacks, run>>

(* The runner launches the process and reports its start (report_start: owner,    *)
(* token, live). Not before its fence deadline has come: a claim it could not renew *)
(* in time is fenced instead. A stale start report stops what it launched.         *)
Launch(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase = "claimed" /\ e.eage < FenceAt
    /\ IF Holds(r, e) THEN Replace(r, e, [e EXCEPT !.phase = "running"]) ELSE Drop(r, e)
    /\ UNCHANGED <<db, outcomes, handbacks, run>>

(* Renewal of every lease the runner holds in one statement (heartbeat_unchecked).  *)
(*   ok    owner + token, row free: renewed (age 0); the runner counts from the send *)
(*   busy  its own handler transaction holds the row (SKIP LOCKED): the row is not *)
(*         written, the renewal is (busy_renewals), and the reaper honours it, so    *)
(*         keeping.py counts it as renewed: nobody can take the lease while the row *)
(*         is held (the reaper skips it, cancel waits), nor after the holder's      *)
(*         session ends (TxnLost) until the busy renewal runs out. The transaction  *)
(*         renews the lease before it lets the row go (TxnEnd). Mutation            *)
(*         BusyRenewalUnrecorded is the code before 0039: busy renewed nothing.    *)
(*   stale the lease is not this (owner, token): the runner stops the run.          *)
(* A lost reply renews in the database and tells the runner nothing.               *)
Answer(r, e) ==
    IF e.phase \notin Live \cup {"ended"} THEN "none"
    ELSE IF RenewHolds(r, e) THEN (IF txn[e.job] THEN "busy" ELSE "ok")
    ELSE "stale"

AfterRenewal(r, e) ==
    LET a == Answer(r, e) IN
    IF a \in {"ok", "busy"} /\ e.phase \in Live THEN [e EXCEPT !.eage = 0]
    ELSE IF a = "stale" /\ e.phase \in Live THEN [e EXCEPT !.phase = "moved", !.eage = 0]
    ELSE e

Renews(a) ==
    a = "ok" \/ (a = "busy" /\ Mutation \notin {"BusyRenewalUnrecorded", "BusyCountedNoRenewal"})

Heartbeat(r, replyLost) ==
    /\ run[r] = "up"
    /\ \E e \in held[r] : Answer(r, e) # "none"
    /\ age' = [j \in Jobs |-> IF \E e \in held[r] : e.job = j /\ Renews(Answer(r, e))
                              THEN 0 ELSE age[j]]
    /\ held' = IF replyLost THEN held
               ELSE [held EXCEPT ![r] = {AfterRenewal(r, e) : e \in held[r]}]
    /\ UNCHANGED <<state, owner, reservedOn, token, txn, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

(* The handler opens ctx.transaction(): lease_lock_for_handler locks the row under *)
(* (owner, token), or raises StaleLease.                                           *)
TxnBegin(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase = "running"
    /\ Holds(r, e) /\ ~txn[e.job]
    /\ txn' = [txn EXCEPT ![e.job] = TRUE]
    /\ UNCHANGED <<state, owner, reservedOn, token, age, reassigned, lost, attempts, released,
                   outcomes, handbacks, run, held>>

(* The transaction ends (commit, or the handler's error: its writes are in a        *)
(* savepoint). context._renew renews the lease first, in the transaction that holds *)
(* the row, and tells the execution (Execution.renewed). Mutation                   *)
(* BusyCountedNoRenewal is the code before 6710256: busy answers counted as         *)
(* renewals, and nothing renews the lease when the row is let go.                   *)
TxnEnd(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase = "running"
    /\ txn[e.job] /\ Current(r, e)
    /\ txn' = [txn EXCEPT ![e.job] = FALSE]
    /\ IF Mutation = "BusyCountedNoRenewal"
       THEN UNCHANGED <<age, held>>
       ELSE /\ age' = [age EXCEPT ![e.job] = 0]
            /\ Replace(r, e, [e EXCEPT !.eage = 0])
    /\ UNCHANGED <<state, owner, reservedOn, token, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

(* The server ends the handler's session mid-transaction (its connection is cut,   *)
(* idle_in_transaction_session_timeout): rolled back, the row let go, no renewal.  *)
(* The handler learns it only at its next statement, and runs on till then.        *)
TxnLost(j) ==
    /\ HandlerSessionLost /\ txn[j]
    /\ txn' = [txn EXCEPT ![j] = FALSE]
    /\ UNCHANGED <<state, owner, reservedOn, token, age, reassigned, lost, attempts, released,
                   outcomes, handbacks, run, held>>

(* The job's process exits by itself, whatever its runner is doing (a handler ends *)
(* its transaction first).                                                         *)
Finish(r, e) ==
    /\ e \in held[r] /\ e.phase = "running"
    /\ ~(txn[e.job] /\ Current(r, e))
    /\ Replace(r, e, [e EXCEPT !.phase = "ended", !.eage = 0])
    /\ UNCHANGED <<db, outcomes, handbacks, run>>

(* The outcome (complete_unchecked), guarded by owner and token. A failed attempt    *)
(* that its operation retries waits for the next (schedule_retries), without an      *)
(* outcome. Committed, its reply may be lost: the runner writes it again, and is     *)
(* answered `already` (released_* say this runner ended this lease with an outcome); *)
(* anything else not guarded through is `stale`. Either way it lets the run go.      *)
Complete(r, e, kind, replyLost) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase \in {"ended", "written"}
    /\ IF e.phase = "ended" /\ Holds(r, e)
       THEN LET j == e.job
                retry == kind = "failed" /\ attempts[j] < MaxAttempts
            IN /\ EndLease(j, IF retry THEN "waiting" ELSE kind)
               /\ reservedOn' = [reservedOn EXCEPT ![j] = None]
               /\ attempts' = [attempts EXCEPT ![j] = IF retry THEN @ + 1 ELSE @]
               /\ released' = [released EXCEPT ![j] = [by |-> r, tok |-> e.tok, kind |-> "outcome"]]
               /\ IF retry THEN UNCHANGED outcomes ELSE Outcome(j, r, kind, e.tok)
               /\ IF replyLost THEN Replace(r, e, [e EXCEPT !.phase = "written"]) ELSE Drop(r, e)
       ELSE /\ Drop(r, e)   \* `already` or `stale`: nothing written
            /\ UNCHANGED <<state, owner, reservedOn, age, attempts, released, outcomes>>
    /\ UNCHANGED <<token, txn, reassigned, lost, handbacks, run>>

(* A retry's backoff ends: the reaper's leader queues it (queue_due_retries). *)
DueRetry(j) ==
    /\ state[j] = "waiting"
    /\ state' = [state EXCEPT ![j] = "queued"]
    /\ UNCHANGED <<owner, reservedOn, token, age, txn, reassigned, lost, attempts, released,
                   outcomes, handbacks, run, held>>

(* The self-fence (keeping._self_fence_once): the runner could not renew before its  *)
(* deadline, so it stops the run (SIGKILL included) before the database could expire *)
(* the lease. A handler's open transaction dies with it, rolled back, unrenewed.     *)
SelfFence(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase \in Live /\ e.eage >= FenceAt
    /\ txn' = IF txn[e.job] /\ Current(r, e) THEN [txn EXCEPT ![e.job] = FALSE] ELSE txn
    /\ Replace(r, e, [e EXCEPT !.phase = "fenced", !.eage = 0])
    /\ UNCHANGED <<state, owner, reservedOn, token, age, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

(* Once the database answers again: confirm_stop, then release_counted (release with *)
(* p_fenced): a lease still ours is handed back counted as a reassignment, so a job  *)
(* that makes every runner fence itself fails past the cap instead of cycling.       *)
(* Mutation FenceHandBackUncounted: the hand-back does not count.                    *)
HandBackFenced(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase = "fenced"
    /\ LET j == e.job IN
       IF Holds(r, e)
       THEN LET counted == Mutation # "FenceHandBackUncounted"
                fail == counted /\ reassigned[j] + 1 > ReassignCap
            IN /\ EndLease(j, IF fail THEN "failed" ELSE "queued")
               /\ reservedOn' = [reservedOn EXCEPT ![j] = None]
               /\ reassigned' = [reassigned EXCEPT ![j] = IF counted THEN @ + 1 ELSE @]
               /\ released' = [released EXCEPT ![j] = [by |-> r, tok |-> e.tok, kind |-> "release"]]
               /\ IF fail THEN Outcome(j, r, "failed", e.tok) ELSE UNCHANGED outcomes
       ELSE /\ reservedOn' = IF state[j] = "cancelled" /\ reservedOn[j] = r /\ token[j] = e.tok
                             THEN [reservedOn EXCEPT ![j] = None] ELSE reservedOn
            /\ UNCHANGED <<state, owner, age, reassigned, released, outcomes>>
    /\ Drop(r, e)
    /\ UNCHANGED <<token, txn, lost, attempts, handbacks, run>>

(* A cancel of this lease notifies its runner (fleetq_control), which stops the run. *)
Notice(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase \in Live
    /\ state[e.job] = "cancelled" /\ token[e.job] = e.tok
    /\ txn' = txn   \* a cancel waits for the handler's transaction: none is open
    /\ Replace(r, e, [e EXCEPT !.phase = "moved", !.eage = 0])
    /\ UNCHANGED <<state, owner, reservedOn, token, age, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

(* confirm_stop: the stop of a cancelled or moved run is recorded; a cancel of this  *)
(* very lease kept its room reserved until now.                                      *)
ConfirmStop(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase = "moved"
    /\ reservedOn' = IF state[e.job] = "cancelled" /\ reservedOn[e.job] = r
                        /\ token[e.job] = e.tok
                     THEN [reservedOn EXCEPT ![e.job] = None] ELSE reservedOn
    /\ Drop(r, e)
    /\ UNCHANGED <<state, owner, token, age, txn, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

(* Graceful shutdown (service._shutdown) stops what still runs... *)
Shutdown(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase = "running"
    /\ txn' = IF txn[e.job] /\ Current(r, e) THEN [txn EXCEPT ![e.job] = FALSE] ELSE txn
    /\ Replace(r, e, [e EXCEPT !.phase = "shutdown", !.eage = 0])
    /\ UNCHANGED <<state, owner, reservedOn, token, age, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

(* ...and hands back every lease it holds, claimed-but-not-started ones included   *)
(* (release_unchecked, not fenced): requeued at once, counted nowhere. A cancelled  *)
(* one's stop is confirmed instead (_close_unrun_executions).                      *)
Release(r, e) ==
    /\ run[r] = "up" /\ e \in held[r] /\ e.phase \in {"claimed", "shutdown"}
    /\ LET j == e.job IN
       IF Holds(r, e)
       THEN /\ EndLease(j, "queued")
            /\ reservedOn' = [reservedOn EXCEPT ![j] = None]
            /\ handbacks' = [handbacks EXCEPT ![j] = @ + 1]
            /\ released' = [released EXCEPT ![j] = [by |-> r, tok |-> e.tok, kind |-> "release"]]
       ELSE /\ reservedOn' = IF state[j] = "cancelled" /\ reservedOn[j] = r /\ token[j] = e.tok
                             THEN [reservedOn EXCEPT ![j] = None] ELSE reservedOn
            /\ UNCHANGED <<state, owner, age, handbacks, released>>
    /\ Drop(r, e)
    /\ UNCHANGED <<token, txn, reassigned, lost, attempts, outcomes, run>>

(* report_lost: the first loss requeues, the second fails the job (reason lost). *)
ReportLost(j, r, tok) ==
    /\ EndLease(j, IF lost[j] = 0 THEN "queued" ELSE "failed")
    /\ reservedOn' = [reservedOn EXCEPT ![j] = None]
    /\ lost' = [lost EXCEPT ![j] = @ + 1]
    /\ released' = [released EXCEPT ![j] = [by |-> r, tok |-> tok, kind |-> "lost"]]
    /\ IF lost[j] = 0 THEN UNCHANGED outcomes ELSE Outcome(j, r, "failed", tok)

(* The collection's periodic pass (_strays_once): a lease the database says this     *)
(* runner holds and nothing here runs (its claim's reply was lost) is reported lost. *)
Stray(r, j) ==
    /\ run[r] = "up"
    /\ state[j] = "leased" /\ owner[j] = r
    /\ ~\E e \in held[r] : e.job = j /\ e.tok = token[j]
    /\ ReportLost(j, r, token[j])
    /\ UNCHANGED <<token, txn, reassigned, attempts, handbacks, run, held>>

(* The reaper (reap_unchecked): only a lease whose expiry has passed on the database *)
(* clock, and only a row nobody holds (FOR UPDATE SKIP LOCKED): requeued, or failed  *)
(* past the reassignment cap. Mutation ReaperIgnoresExpiry takes any live lease.     *)
Reap(j) ==
    /\ state[j] = "leased" /\ ~txn[j]
    /\ Mutation = "ReaperIgnoresExpiry" \/ age[j] > Lease
    /\ LET fail == reassigned[j] + 1 > ReassignCap IN
       /\ EndLease(j, IF fail THEN "failed" ELSE "queued")
       /\ IF fail THEN Outcome(j, "reaper", "failed", token[j]) ELSE UNCHANGED outcomes
    /\ reservedOn' = [reservedOn EXCEPT ![j] = None]
    /\ reassigned' = [reassigned EXCEPT ![j] = @ + 1]
    /\ UNCHANGED <<token, txn, lost, attempts, released, handbacks, run, held>>

(* An operator cancels (cancel_unchecked: waits for the row): terminal at once; a   *)
(* live lease ends, its room stays reserved until the runner confirms the stop.     *)
(* Mutation CancelFreesRoom gives the room back at once, as if a cancel were a stop. *)
Cancel(j) ==
    /\ state[j] \in {"queued", "waiting", "leased"} /\ ~txn[j]
    /\ EndLease(j, "cancelled")
    /\ Outcome(j, "operator", "cancelled", token[j])
    /\ reservedOn' = IF Mutation = "CancelFreesRoom" THEN [reservedOn EXCEPT ![j] = None]
                     ELSE reservedOn
    /\ UNCHANGED <<token, txn, reassigned, lost, attempts, released, handbacks, run, held>>

(* SIGSTOP and SIGCONT: a frozen runner does nothing, its job processes run on, and *)
(* its handler transactions stay open.                                              *)
Freeze(r) ==
    /\ run[r] = "up"
    /\ run' = [run EXCEPT ![r] = "frozen"]
    /\ UNCHANGED <<db, outcomes, handbacks, held>>

Thaw(r) ==
    /\ run[r] = "frozen"
    /\ run' = [run EXCEPT ![r] = "up"]
    /\ UNCHANGED <<db, outcomes, handbacks, held>>

(* The runner dies. Its commands live on (--orphans adopt; with kill they die, as   *)
(* Finish can say); its handlers and their transactions die with it. Its memory is  *)
(* gone: only the journal's launches remain.                                        *)
Crash(r) ==
    /\ run[r] \in {"up", "frozen"}
    /\ run' = [run EXCEPT ![r] = "down"]
    /\ txn' = [j \in Jobs |-> txn[j] /\ owner[j] # r]
    /\ held' = [held EXCEPT ![r] = {[e EXCEPT !.eage = 0] : e \in {f \in @ : f.phase \in {"running", "ended"}}}]
    /\ UNCHANGED <<state, owner, reservedOn, token, age, reassigned, lost, attempts, released,
                   outcomes, handbacks>>

(* Restarted, the collection pass (collection.collect) settles everything the       *)
(* database says it holds before anything else runs: a live lease whose journal run *)
(* still runs is adopted, its fence clock set from the lease's time left            *)
(* (service._adopt: lease_left_s); any other live lease launched nothing that still *)
(* runs and is reported lost; a cancelled job's stop is confirmed; every other run  *)
(* of the journal is killed.                                                        *)
Restart(r) ==
    LET adopt(j) == \E e \in held[r] : e.job = j /\ e.tok = token[j] /\ e.phase = "running"
        lostNow(j) == state[j] = "leased" /\ owner[j] = r /\ ~adopt(j)
        freed(j) == state[j] = "cancelled" /\ reservedOn[j] = r
    IN
    /\ run[r] = "down"
    /\ run' = [run EXCEPT ![r] = "up"]
    /\ state' = [j \in Jobs |-> IF lostNow(j) THEN (IF lost[j] = 0 THEN "queued" ELSE "failed")
                                ELSE state[j]]
    /\ owner' = [j \in Jobs |-> IF lostNow(j) THEN None ELSE owner[j]]
    /\ age' = [j \in Jobs |-> IF lostNow(j) THEN 0 ELSE age[j]]
    /\ reservedOn' = [j \in Jobs |-> IF lostNow(j) \/ freed(j) THEN None ELSE reservedOn[j]]
    /\ lost' = [j \in Jobs |-> IF lostNow(j) THEN lost[j] + 1 ELSE lost[j]]
    /\ released' = [j \in Jobs |-> IF lostNow(j) THEN [by |-> r, tok |-> token[j], kind |-> "lost"]
                                   ELSE released[j]]
    /\ outcomes' = [j \in Jobs |->
                      IF lostNow(j) /\ lost[j] > 0
                      THEN outcomes[j] \cup {[by |-> r, kind |-> "failed", tok |-> token[j],
                                              current |-> token[j]]}
                      ELSE outcomes[j]]
    /\ held' = [held EXCEPT ![r] =
                  {[e EXCEPT !.eage = Min(age[e.job], FenceAt + 1)] :
                     e \in {f \in @ : f.phase = "running" /\ Current(r, f)}}]
    /\ UNCHANGED <<token, txn, reassigned, attempts, handbacks>>

(* Time passes: every live lease ages on the database's clock, every execution on   *)
(* its runner's (a frozen runner's clock runs; a dead one's is gone). Never past an *)
(* up runner's fence deadline while it still holds the run: it fences first.        *)
Aged(r, e) ==
    IF e.phase \in Live /\ run[r] # "down" THEN [e EXCEPT !.eage = Min(@ + 1, FenceAt + 1)]
    ELSE e

Tick ==
    /\ \A r \in Runners : run[r] = "up" => \A e \in held[r] : e.phase \in Live => e.eage < FenceAt
    /\ \/ \E j \in Jobs : state[j] = "leased" /\ age[j] <= Lease
       \/ \E r \in Runners : run[r] # "down" /\ \E e \in held[r] : e.phase \in Live /\ e.eage <= FenceAt
    /\ age' = [j \in Jobs |-> IF state[j] = "leased" THEN Min(age[j] + 1, Lease + 1) ELSE 0]
    /\ held' = [r \in Runners |-> {Aged(r, e) : e \in held[r]}]
    /\ UNCHANGED <<state, owner, reservedOn, token, txn, reassigned, lost, attempts, released,
                   outcomes, handbacks, run>>

Next ==
    \/ \E r \in Runners, j \in Jobs, replyLost \in BOOLEAN : Claim(r, j, replyLost)
    \/ \E r1, r2 \in Runners, j1, j2 \in Jobs : ClaimRace(r1, r2, j1, j2)
    \/ \E r \in Runners : \E e \in held[r] :
           \/ Launch(r, e) \/ TxnBegin(r, e) \/ TxnEnd(r, e) \/ Finish(r, e)
           \/ SelfFence(r, e) \/ HandBackFenced(r, e) \/ Notice(r, e) \/ ConfirmStop(r, e)
           \/ Shutdown(r, e) \/ Release(r, e)
           \/ \E kind \in {"succeeded", "failed"}, replyLost \in BOOLEAN :
                  Complete(r, e, kind, replyLost)
    \/ \E r \in Runners, replyLost \in BOOLEAN : Heartbeat(r, replyLost)
    \/ \E r \in Runners, j \in Jobs : Stray(r, j)
    \/ \E j \in Jobs : Reap(j) \/ Cancel(j) \/ DueRetry(j) \/ TxnLost(j)
    \/ \E r \in Runners : Freeze(r) \/ Thaw(r) \/ Crash(r) \/ Restart(r)
    \/ Tick

Spec == Init /\ [][Next]_vars

\* Model size: runners and jobs are interchangeable, and the jobs are claimed at most
\* MaxClaims times together (a job that cycles for ever is one ClaimsArePaid names).
Symmetry == Permutations(Runners) \cup Permutations(Jobs)
RECURSIVE Claims(_)
Claims(S) == IF S = {} THEN 0 ELSE LET j == CHOOSE j \in S : TRUE IN token[j] + Claims(S \ {j})
TokenBound == Claims(Jobs) <= MaxClaims

-----------------------------------------------------------------------------
(* Invariants: what must hold in every reachable state.                     *)

Running(r, e) == e \in held[r] /\ e.phase = "running"

\* A job has at most one outcome (a cancel is its outcome too).
AtMostOneOutcome == \A j \in Jobs : Cardinality(outcomes[j]) <= 1

\* An outcome is written under the lease current when it commits: a zombie's never lands.
OutcomeUnderCurrentLease == \A j \in Jobs : \A o \in outcomes[j] : o.tok = o.current

\* Once cancelled, nothing else is ever recorded for the job.
NoOutcomeAfterCancel ==
    \A j \in Jobs : state[j] = "cancelled" => \A o \in outcomes[j] : o.kind = "cancelled"

\* Requeues are bounded: one loss is requeued, expiries and fences up to the cap,
\* retries up to the operation's attempts.
BoundedRequeue ==
    \A j \in Jobs : lost[j] <= 2 /\ reassigned[j] <= ReassignCap + 1 /\ attempts[j] <= MaxAttempts

\* Every claim after the first is paid for by a counted requeue (expiry or self-fence:
\* reassigned; loss; a retried attempt), or by a shutdown's release: a job cannot cycle
\* for ever unless its runners are shut down for ever.
ClaimsArePaid ==
    \A j \in Jobs : token[j] <= 1 + reassigned[j] + lost[j] + (attempts[j] - 1) + handbacks[j]

\* A terminal job has its outcome, and holds no lease.
TerminalIsRecorded ==
    \A j \in Jobs : state[j] \in Terminal => (outcomes[j] # {} /\ owner[j] = None)

\* A live job's lease is held by a runner, under a token it was granted, whose room it holds;
\* room stays reserved after a lease ends only for a cancel's pending stop.
LiveIsHeld ==
    \A j \in Jobs :
        /\ state[j] = "leased" => (owner[j] # None /\ token[j] > 0 /\ reservedOn[j] = owner[j])
        /\ (reservedOn[j] # None /\ state[j] # "leased") => state[j] = "cancelled"
        /\ txn[j] => state[j] = "leased"

\* Match before claim: a runner's slots, and the lane's cap fleet-wide, are never exceeded
\* (a pending stop still counts).
WithinSlotsAndCap ==
    /\ Cardinality(InFlight) <= Cap
    /\ \A r \in Runners : Cardinality(Reserved(r)) <= Slots

\* Nor does a runner run more jobs than it has slots: a cancelled run still holds its
\* slot until its stop is confirmed (DESIGN 1.7). A run past its fence deadline is
\* exempt (a frozen runner's run, whose lease expired: it is fenced at once).
ProcessesWithinSlots ==
    \A r \in Runners : run[r] = "up" =>
        Cardinality({e \in held[r] : e.phase = "running" /\ e.eage <= FenceAt}) <= Slots

\* An outcome committed whose reply was lost is answered `already` on its retry, as long as
\* no newer claim happened (then `stale`, and the runner has nothing left to lose).
RetryAnswersAlready ==
    \A r \in Runners : \A e \in held[r] :
        (e.phase = "written" /\ token[e.job] = e.tok)
            => released[e.job] = [by |-> r, tok |-> e.tok, kind |-> "outcome"]

\* The runner's fence clock is never behind the database's: it counts from the SEND of
\* the renewal, which the database dates later. (While its own transaction holds the row,
\* busy answers count and the database's clock runs on: nobody can take the lease then.)
FenceClockSound ==
    \A r \in Runners : run[r] # "down" =>
        \A e \in held[r] :
            (e.phase \in Live /\ Current(r, e) /\ ~txn[e.job])
                => e.eage >= Min(age[e.job], FenceAt + 1)

\* The self-fence: a runner never runs a job whose lease has passed the self-fence
\* deadline (or ended, but for a cancel, which asks for a stop and waits for it), while
\* it counts the run as within its own deadline. A run past its deadline by the runner's
\* own count (a frozen runner thawed, a run adopted late) is fenced before time moves on.
RunsUnderItsLease ==
    \A r \in Runners : run[r] = "up" =>
        \A e \in held[r] :
            (e.phase = "running" /\ e.eage <= FenceAt)
                => \/ state[e.job] = "cancelled" /\ token[e.job] = e.tok
                   \/ Current(r, e) /\ (age[e.job] <= FenceAt \/ txn[e.job])

\* Two runs of one job at once only while the older holder has not fenced itself yet:
\* it is frozen or down (it cannot), or past its self-fence deadline (it does so now).
OverlapOnlyBeforeFence ==
    \A r1, r2 \in Runners : \A e1 \in held[r1], e2 \in held[r2] :
        (Running(r1, e1) /\ Running(r2, e2) /\ e1.job = e2.job /\ e1.tok < e2.tok)
            => (run[r1] # "up" \/ e1.eage > FenceAt)

Safety ==
    /\ TypeOK
    /\ AtMostOneOutcome
    /\ OutcomeUnderCurrentLease
    /\ NoOutcomeAfterCancel
    /\ BoundedRequeue
    /\ ClaimsArePaid
    /\ TerminalIsRecorded
    /\ LiveIsHeld
    /\ WithinSlotsAndCap
    /\ ProcessesWithinSlots
    /\ RetryAnswersAlready
    /\ FenceClockSound
    /\ RunsUnderItsLease
    /\ OverlapOnlyBeforeFence

\* Tokens only grow, and every claim is a new one.
TokensOnlyGrow ==
    [][\A j \in Jobs : /\ token'[j] >= token[j]
                       /\ (state[j] # "leased" /\ state'[j] = "leased") => token'[j] > token[j]
      ]_vars
=============================================================================
