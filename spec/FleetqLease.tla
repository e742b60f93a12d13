---------------------------- MODULE FleetqLease ----------------------------
(***************************************************************************)
(* The lease protocol of fleetq (migrations/protocol/), as the database    *)
(* and the runners see it. The database's writes are guarded by the        *)
(* lease's owner and its fencing token (the lease version); a runner acts  *)
(* on what it believes it holds, which may be out of date: a zombie.       *)
(*                                                                         *)
(* Modelled: claim (token + 1, within the runner's slots), launch, start   *)
(* report, heartbeat, lease expiry and the reaper (requeue, or fail past   *)
(* the reassignment cap), outcome with a lost reply and its retry (the     *)
(* `already` answer), cancel with a stop request, a claim that launched    *)
(* nothing reported lost (requeued once, then failed), self-fence (the     *)
(* runner stops a run it could not renew, and hands the lease back counted *)
(* as a reassignment), runner crash and restart with                       *)
(* adoption of a launched run whose start report was lost.                 *)
(*                                                                         *)
(* Time is abstract: a lease expires whenever its holder has not renewed   *)
(* it, which covers every schedule of slow heartbeats, pauses and clocks.  *)
(*                                                                         *)
(* GuardOwner and GuardToken switch the two halves of the write guard; CI  *)
(* checks the real protocol (both TRUE) and a mutated one (owner only)     *)
(* that TLC must report violating: a model that cannot fail proves nothing.*)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Runners,        \* runner ids, each one process with `Slots` slots
    Jobs,           \* job ids
    Slots,          \* slots per runner
    ReassignCap,    \* lease expiries a job may have before it fails
    GuardOwner,     \* writes check the lease's owner
    GuardToken      \* writes check the fencing token

None == "none"
Live == {"claimed", "running"}
Terminal == {"succeeded", "failed", "cancelled"}

VARIABLES
    state,          \* job -> queued | claimed | running | succeeded | failed | cancelled
    owner,          \* job -> runner holding the lease, or None
    token,          \* job -> the lease version (the fencing token)
    expired,        \* job -> the lease's time has run out (not yet reaped)
    reassigned,     \* job -> lease expiries so far
    lost,           \* job -> losses reported so far
    stopRequested,  \* job -> a cancel asked its runner to stop the process
    released,       \* job -> [runner, token] of the last voluntary release, for `already`
    started,        \* job -> set of tokens whose start report was recorded
    outcomes,       \* job -> set of outcome records ever written (a history variable)
    held,           \* runner -> set of executions it believes it has
    up              \* runner -> its process is running

vars == <<state, owner, token, expired, reassigned, lost, stopRequested, released,
          started, outcomes, held, up>>

(* An execution as the runner knows it. phase: claimed (nothing launched yet),      *)
(* launched (process started, start not reported), started (report recorded).     *)
(* retry: the runner wrote its outcome but lost the reply, and will write it again. *)
Exec == [job : Jobs, tok : Nat, phase : {"claimed", "launched", "started"},
         retry : BOOLEAN]

TypeOK ==
    /\ state \in [Jobs -> {"queued"} \cup Live \cup Terminal]
    /\ owner \in [Jobs -> Runners \cup {None}]
    /\ token \in [Jobs -> Nat]
    /\ expired \in [Jobs -> BOOLEAN]
    /\ held \in [Runners -> SUBSET Exec]
    /\ up \in [Runners -> BOOLEAN]

Init ==
    /\ state = [j \in Jobs |-> "queued"]
    /\ owner = [j \in Jobs |-> None]
    /\ token = [j \in Jobs |-> 0]
    /\ expired = [j \in Jobs |-> FALSE]
    /\ reassigned = [j \in Jobs |-> 0]
    /\ lost = [j \in Jobs |-> 0]
    /\ stopRequested = [j \in Jobs |-> FALSE]
    /\ released = [j \in Jobs |-> [runner |-> None, tok |-> 0]]
    /\ started = [j \in Jobs |-> {}]
    /\ outcomes = [j \in Jobs |-> {}]
    /\ held = [r \in Runners |-> {}]
    /\ up = [r \in Runners |-> TRUE]

(* The guard of every write a lease holder makes (heartbeat, start, outcome, loss). *)
Holds(r, e) ==
    /\ state[e.job] \in Live
    /\ GuardOwner => owner[e.job] = r
    /\ GuardToken => token[e.job] = e.tok

Drop(r, e) == held' = [held EXCEPT ![r] = @ \ {e}]
Replace(r, e, f) == held' = [held EXCEPT ![r] = (@ \ {e}) \cup {f}]

(* Runner r claims queued job j: the claim checks room first, and grants token + 1. *)
Claim(r, j) ==
    /\ up[r]
    /\ state[j] = "queued"
    /\ Cardinality(held[r]) < Slots
    /\ state' = [state EXCEPT ![j] = "claimed"]
    /\ owner' = [owner EXCEPT ![j] = r]
    /\ token' = [token EXCEPT ![j] = @ + 1]
    /\ expired' = [expired EXCEPT ![j] = FALSE]
    /\ held' = [held EXCEPT ![r] = @ \cup
                {[job |-> j, tok |-> token[j] + 1, phase |-> "claimed", retry |-> FALSE]}]
    /\ UNCHANGED <<reassigned, lost, stopRequested, released, started, outcomes, up>>

(* The runner starts the job's process: nothing is written (the start report follows). *)
Launch(r, e) ==
    /\ up[r] /\ e \in held[r] /\ e.phase = "claimed"
    /\ Replace(r, e, [e EXCEPT !.phase = "launched"])
    /\ UNCHANGED <<state, owner, token, expired, reassigned, lost, stopRequested, released,
                   started, outcomes, up>>

(* The start report; after a restart the same write adopts a launched run. A stale   *)
(* answer makes the runner stop the process.                                          *)
ReportStart(r, e) ==
    /\ up[r] /\ e \in held[r] /\ e.phase = "launched"
    /\ IF Holds(r, e) /\ state[e.job] = "claimed"
       THEN /\ state' = [state EXCEPT ![e.job] = "running"]
            /\ expired' = [expired EXCEPT ![e.job] = FALSE]
            /\ started' = [started EXCEPT ![e.job] = @ \cup {e.tok}]
            /\ Replace(r, e, [e EXCEPT !.phase = "started"])
       ELSE /\ Drop(r, e)
            /\ UNCHANGED <<state, expired, started>>
    /\ UNCHANGED <<owner, token, reassigned, lost, stopRequested, released, outcomes, up>>

(* A renewal by the holder; a stale answer makes the runner stop the process. *)
Heartbeat(r, e) ==
    /\ up[r] /\ e \in held[r] /\ ~e.retry
    /\ IF Holds(r, e)
       THEN /\ expired' = [expired EXCEPT ![e.job] = FALSE]
            /\ UNCHANGED held
       ELSE /\ Drop(r, e)
            /\ UNCHANGED expired
    /\ UNCHANGED <<state, owner, token, reassigned, lost, stopRequested, released, started,
                   outcomes, up>>

(* Time passes without a renewal reaching the database. *)
Expire(j) ==
    /\ state[j] \in Live /\ ~expired[j]
    /\ expired' = [expired EXCEPT ![j] = TRUE]
    /\ UNCHANGED <<state, owner, token, reassigned, lost, stopRequested, released, started,
                   outcomes, held, up>>

(* The reaper returns an expired lease to the queue, or fails the job past the cap. *)
Reap(j) ==
    /\ state[j] \in Live /\ expired[j]
    /\ IF reassigned[j] + 1 > ReassignCap
       THEN /\ state' = [state EXCEPT ![j] = "failed"]
            /\ outcomes' = [outcomes EXCEPT ![j] = @ \cup
                            {[by |-> "reaper", kind |-> "failed", tok |-> token[j],
                              current |-> token[j]]}]
       ELSE /\ state' = [state EXCEPT ![j] = "queued"]
            /\ UNCHANGED outcomes
    /\ owner' = [owner EXCEPT ![j] = None]
    /\ reassigned' = [reassigned EXCEPT ![j] = @ + 1]
    /\ UNCHANGED <<token, expired, lost, stopRequested, released, started, held, up>>

(* The runner writes its outcome. Committed, its reply may be lost: the runner keeps   *)
(* the execution marked for a retry. A retry of a committed outcome answers `already`; *)
(* anything else not guarded through is stale. Either way the runner lets it go.       *)
Complete(r, e, kind, replyLost) ==
    /\ up[r] /\ e \in held[r] /\ e.phase # "claimed"
    /\ IF Holds(r, e)
       THEN /\ state' = [state EXCEPT ![e.job] = kind]
            /\ owner' = [owner EXCEPT ![e.job] = None]
            /\ released' = [released EXCEPT ![e.job] = [runner |-> r, tok |-> e.tok]]
            /\ outcomes' = [outcomes EXCEPT ![e.job] = @ \cup
                            {[by |-> r, kind |-> kind, tok |-> e.tok,
                              current |-> token[e.job]]}]
            /\ IF replyLost THEN Replace(r, e, [e EXCEPT !.retry = TRUE]) ELSE Drop(r, e)
       ELSE /\ Drop(r, e)   \* `already` (released by r at e.tok) or stale: nothing written
            /\ UNCHANGED <<state, owner, released, outcomes>>
    /\ UNCHANGED <<token, expired, reassigned, lost, stopRequested, started, up>>

(* A claim that launched nothing is reported lost: requeued once, then failed. *)
ReportLost(r, e) ==
    /\ up[r] /\ e \in held[r] /\ e.phase = "claimed"
    /\ IF Holds(r, e)
       THEN /\ IF lost[e.job] = 0
               THEN /\ state' = [state EXCEPT ![e.job] = "queued"]
                    /\ UNCHANGED outcomes
               ELSE /\ state' = [state EXCEPT ![e.job] = "failed"]
                    /\ outcomes' = [outcomes EXCEPT ![e.job] = @ \cup
                                    {[by |-> r, kind |-> "failed", tok |-> e.tok,
                                      current |-> token[e.job]]}]
            /\ owner' = [owner EXCEPT ![e.job] = None]
            /\ lost' = [lost EXCEPT ![e.job] = @ + 1]
            /\ released' = [released EXCEPT ![e.job] = [runner |-> r, tok |-> e.tok]]
       ELSE UNCHANGED <<state, outcomes, owner, lost, released>>
    /\ Drop(r, e)
    /\ UNCHANGED <<token, expired, reassigned, stopRequested, started, up>>

(* After fencing itself, the runner hands the lease back once the database answers:   *)
(* it counts a reassignment, as an expiry does, so a job that makes every runner fence *)
(* itself fails past the cap instead of cycling.                                      *)
HandBackFenced(r, e) ==
    /\ up[r] /\ e \in held[r] /\ ~e.retry
    /\ IF Holds(r, e)
       THEN /\ IF reassigned[e.job] + 1 > ReassignCap
               THEN /\ state' = [state EXCEPT ![e.job] = "failed"]
                    /\ outcomes' = [outcomes EXCEPT ![e.job] = @ \cup
                                    {[by |-> r, kind |-> "failed", tok |-> e.tok,
                                      current |-> token[e.job]]}]
               ELSE /\ state' = [state EXCEPT ![e.job] = "queued"]
                    /\ UNCHANGED outcomes
            /\ owner' = [owner EXCEPT ![e.job] = None]
            /\ reassigned' = [reassigned EXCEPT ![e.job] = @ + 1]
            /\ released' = [released EXCEPT ![e.job] = [runner |-> r, tok |-> e.tok]]
       ELSE UNCHANGED <<state, outcomes, owner, reassigned, released>>
    /\ Drop(r, e)
    /\ UNCHANGED <<token, expired, lost, stopRequested, started, up>>

(* An operator cancels: terminal at once; a live job's runner is asked to stop. *)
Cancel(j) ==
    /\ state[j] \in {"queued"} \cup Live
    /\ state' = [state EXCEPT ![j] = "cancelled"]
    /\ owner' = [owner EXCEPT ![j] = None]
    /\ stopRequested' = [stopRequested EXCEPT ![j] = state[j] \in Live]
    /\ outcomes' = [outcomes EXCEPT ![j] = @ \cup
                    {[by |-> "operator", kind |-> "cancelled", tok |-> token[j],
                      current |-> token[j]]}]
    /\ UNCHANGED <<token, expired, reassigned, lost, released, started, held, up>>

(* The runner stops a run: asked to (cancel), or fencing itself because it could not *)
(* renew within its budget. Nothing is written that could change the job.          *)
StopRun(r, e) ==
    /\ up[r] /\ e \in held[r] /\ ~e.retry   \* stopRequested, or a self-fence: any moment
    /\ Drop(r, e)
    /\ UNCHANGED <<state, owner, token, expired, reassigned, lost, stopRequested, released,
                   started, outcomes, up>>

(* The runner's process dies; its job processes may live on, and its journal remains. *)
Crash(r) ==
    /\ up[r]
    /\ up' = [up EXCEPT ![r] = FALSE]
    /\ UNCHANGED <<state, owner, token, expired, reassigned, lost, stopRequested, released,
                   started, outcomes, held>>

(* Restarted, it reads its journal back: its executions resume through the same     *)
(* guarded writes (a launched run's start report adopts it; a stale one is stopped). *)
Restart(r) ==
    /\ ~up[r]
    /\ up' = [up EXCEPT ![r] = TRUE]
    /\ UNCHANGED <<state, owner, token, expired, reassigned, lost, stopRequested, released,
                   started, outcomes, held>>

Next ==
    \/ \E r \in Runners, j \in Jobs : Claim(r, j)
    \/ \E r \in Runners : \E e \in held[r] :
           \/ Launch(r, e) \/ ReportStart(r, e) \/ Heartbeat(r, e) \/ ReportLost(r, e)
           \/ StopRun(r, e) \/ HandBackFenced(r, e)
           \/ \E kind \in {"succeeded", "failed"}, replyLost \in BOOLEAN :
                  Complete(r, e, kind, replyLost)
    \/ \E j \in Jobs : Expire(j) \/ Reap(j) \/ Cancel(j)
    \/ \E r \in Runners : Crash(r) \/ Restart(r)

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(* Invariants: what must hold in every reachable state.                     *)

\* A job has at most one outcome (a cancel is its outcome too).
AtMostOneOutcome == \A j \in Jobs : Cardinality(outcomes[j]) <= 1

\* An outcome is written under the lease current when it commits: a zombie's never lands.
OutcomeUnderCurrentLease == \A j \in Jobs : \A o \in outcomes[j] : o.tok = o.current

\* Once cancelled, nothing else is ever recorded for the job.
NoOutcomeAfterCancel ==
    \A j \in Jobs : state[j] = "cancelled" => \A o \in outcomes[j] : o.kind = "cancelled"

\* Requeues are bounded: one loss is requeued, expiries up to the cap.
BoundedRequeue == \A j \in Jobs : lost[j] <= 2 /\ reassigned[j] <= ReassignCap + 1

\* A terminal job has its outcome, and holds no lease.
TerminalIsRecorded ==
    \A j \in Jobs : state[j] \in Terminal => (outcomes[j] # {} /\ owner[j] = None)

\* A live job's lease is held by a runner, under a token it was granted.
LiveIsHeld == \A j \in Jobs : state[j] \in Live => (owner[j] # None /\ token[j] > 0)

Safety ==
    /\ TypeOK
    /\ AtMostOneOutcome
    /\ OutcomeUnderCurrentLease
    /\ NoOutcomeAfterCancel
    /\ BoundedRequeue
    /\ TerminalIsRecorded
    /\ LiveIsHeld

\* Tokens only grow, and every claim is a new one.
TokensOnlyGrow ==
    [][\A j \in Jobs : /\ token'[j] >= token[j]
                       /\ (state[j] = "queued" /\ state'[j] = "claimed") => token'[j] > token[j]
      ]_vars
=============================================================================
