/*
 * The row lock form's protocol (src/consuming/form/row_lock.rs), checked by spin.
 *
 * Two subscriptions (claimers, each its own process and database session) claim two rows:
 * a transaction locks a row FOR UPDATE SKIP LOCKED and stays open while the handler runs; the
 * settlement's statement and COMMIT run on that same connection. A handler may save a
 * checkpoint (its commit, then a chained transaction that locks the row again), an operator
 * cancels row 0 (waiting for the row's lock), a claimer may crash at any step (the database
 * rolls its transaction back), and a session may end under a running handler or the answer
 * of a COMMIT may never arrive (MAXLOST).
 *
 * The database is a set of atomic statements; a transaction's row lock is `lk`, and its
 * uncommitted writes are folded into its COMMIT (nobody else can write a row it has locked,
 * so what it wrote before is invisible and undone by a rollback).
 *
 * Steps are annotated "@step <name>" (what the code's doc comments point at: "Modelled in
 * model/row_lock.pml (<name>)") and "@code <item>" (a TableSql/LimitSql/RegistrySql field or
 * Dialect method of src/dialect/mod.rs, or <file under src/>::<function>); tests/model_refs.rs
 * checks both directions.
 *
 * Invariants:
 *   I1 no two live handlers of one row: two handlers of a row never both run on live
 *      sessions (a session's transaction holds the row's lock from claim to settlement);
 *   I2 a settlement changes the row only on the transaction that holds its lock: a late one
 *      (its session gone) changes nothing;
 *   I3 attempts are counted at settlement: a row's attempts are its committed retries and
 *      dead letters (a crash, a lost session, a hand-back spend nothing);
 *   I4 a cancelled job never starts again;
 *   I6 no row lost: once everything stopped no lock is held, no checkpoint is between its
 *      commit and its lock, and every row is finished or claimable (when its checkpoint
 *      guard has passed).
 */

#define NR 2
#ifndef ROUNDS
#define ROUNDS 1
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXLOST
#define MAXLOST 1
#endif
#ifndef CANCELS
#define CANCELS 1
#endif
#ifndef CHECKPOINTS
#define CHECKPOINTS 1
#endif

#define LIVE 0
#define GONE 1          /* acked or cancelled: deleted */
#define DEAD 2          /* dead-lettered */

#define IDLE 0
#define AHEAD 1         /* claimed, the transaction open, not yet handled */
#define RUN 2           /* its handler runs */
#define GAP 3           /* a checkpoint committed; its chained transaction locks the row next */

#define ACK 1
#define RETRY 2
#define DEADL 3

#define CANCELLER 3     /* the cancel's session */

byte st[NR];
byte att[NR];
byte lk[NR];            /* the session whose transaction has the row locked (0: none) */
bit due[NR] = 1;        /* run_at <= now (0: a checkpoint moved it ahead) */

/* ghosts */
byte fails[NR];         /* committed retries and dead letters */
bit cancelled[NR];
byte hrow[3];           /* row + 1 while a claimer's handler runs */
bit sess[3];            /* its session is alive (its transaction, if any, open) */
byte gap[3];            /* row + 1 between a checkpoint's commit and its lock */
bit crash[3], fin[3];
byte crashes, lost, done;
bit cdone;

#define exists(r) (st[r] == LIVE || st[r] == DEAD)

#define I1 (!(hrow[1] != 0 && hrow[1] == hrow[2] && sess[1] && sess[2]))
#define I3 (att[0] == fails[0] && att[1] == fails[1])

active proctype monitor() {
end:
    if
    :: !I1 -> assert(I1)
    :: !I3 -> assert(I3)
    fi
}

active proctype crasher() {
    do
    :: atomic { crashes < MAXCRASH && !fin[1] -> crash[1] = 1; crashes++ }
    :: atomic { crashes < MAXCRASH && !fin[2] -> crash[2] = 1; crashes++ }
    :: break
    od
}

/* The checkpoint guard passes (run_at, moved CHECKPOINT_GUARD ahead, is due again), never
   while the checkpoint that moved it is between its commit and its lock (the code assumes
   that gap lasts less than the guard). */
active proctype guard() {
    do
    :: atomic { !due[0] && gap[1] != 1 && gap[2] != 1 -> due[0] = 1 }
    :: atomic { !due[1] && gap[1] != 2 && gap[2] != 2 -> due[1] = 1 }
    :: done == 2 -> break
    od
}

/* The session's transaction ends: the database rolls it back and frees its row lock. */
inline rollback() {
    if
    :: lk[0] == p -> lk[0] = 0
    :: else -> skip
    fi;
    if
    :: lk[1] == p -> lk[1] = 0
    :: else -> skip
    fi
}

inline forget() {
    phase = IDLE; r = 0; out = 0; cbc = 0; cp = 0; hrow[p] = 0; gap[p] = 0
}

proctype claimer(byte p) {
    byte phase, r, out, rounds;
    bit cbc, cp;
    sess[p] = 1;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step claim: BEGIN, then one due row FOR UPDATE SKIP LOCKED; no attempt counted
           @code TableSql::begin @code TableSql::claim @code TableSql::claim_from
           @code Dialect::row_lock_claim @code dialect/mod.rs::claim_one_row
           @code consuming/form/row_lock.rs::claim @code consuming/form/row_lock.rs::deliver */
        rounds++;
        sess[p] = 1;
        if
        :: st[0] == LIVE && due[0] && lk[0] == 0 -> r = 0
        :: st[1] == LIVE && due[1] && lk[1] == 0 -> r = 1
        :: else -> r = NR
        fi;
        if
        :: r < NR ->
            lk[r] = p;
            cbc = cancelled[r];
            phase = AHEAD
        :: else -> r = 0                                        /* nothing: rolled back */
        fi
       }
    :: atomic {
        phase == AHEAD ->
        /* @step hand_back: claimed, then the subscription closed: ROLLBACK, nothing spent
           @code consuming/form/row_lock.rs::rollback @code consuming/form/mod.rs::hand_back */
        rollback(); forget()
       }
    :: atomic {
        phase == AHEAD ->
        /* @step handler: the delivery, with its open transaction, reaches its handler */
        assert(!cbc);                                           /* I4 */
        hrow[p] = r + 1; phase = RUN
       }
    :: atomic {
        phase == RUN && CHECKPOINTS && !cp && sess[p] ->
        /* @step checkpoint: the checkpoint and run_at moved to the guard are written, and
           COMMIT AND CHAIN ends the transaction, freeing the row's lock
           @code consuming/form/row_lock.rs::checkpoint @code TableSql::checkpoint_write */
        assert(lk[r] == p);                                     /* I2 */
        cp = 1; due[r] = 0; lk[r] = 0; gap[p] = r + 1; phase = GAP
       }
    :: atomic {
        phase == GAP && lk[r] == 0 ->
        /* @step relock: the chained transaction locks the row again if it is still live
           (waiting for a lock another holds); else the delivery has lost it (ClaimLost)
           @code TableSql::relock @code consuming/form/row_lock.rs::checkpoint */
        gap[p] = 0;
        if
        :: st[r] == LIVE && sess[p] -> lk[r] = p; phase = RUN
        :: else -> rollback(); forget()
        fi
       }
    :: atomic {
        phase == RUN ->
        /* @step settle: the handler returns; its outcome's statement and COMMIT on the
           delivery's connection (ack deletes; retry and dead letter count the attempt); on a
           session that is gone, nothing
           @code consuming/form/row_lock.rs::settle @code TableSql::ack @code TableSql::retry
           @code TableSql::dead @code TableSql::cancel_held */
        hrow[p] = 0;
        if
        :: sess[p] ->
            assert(lk[r] == p);                                 /* I2 */
            if
            :: st[r] = GONE                                     /* ack, cancel */
            :: att[r]++; fails[r]++                             /* retry */
            :: st[r] = DEAD; att[r]++; fails[r]++               /* dead letter */
            fi;
            lk[r] = 0;
            if
            :: lost < MAXLOST ->
                /* @step commit_lost: committed, the answer lost: the connection is
                   discarded (nothing runs again) */
                lost++; sess[p] = 0
            :: skip
            fi
        :: else -> skip                                         /* the statement fails */
        fi;
        forget()
       }
    :: atomic {
        (phase == AHEAD || phase == RUN) && sess[p] && lost < MAXLOST ->
        /* @step session_lost: the server ends the session (killed, timed out idle): its
           transaction is rolled back; the handler runs on and its settlement will fail */
        lost++; sess[p] = 0; rollback()
       }
    od
    } unless {
        /* @step crash: the process dies; the database rolls its transaction back */
        atomic { crash[p] -> crash[p] = 0; rollback(); forget(); sess[p] = 1 }
    };
    if
    :: phase == IDLE && rounds == ROUNDS -> skip
    :: else -> goto life
    fi;
    atomic { fin[p] = 1; done++ }
}

/*
 * The operator's cancel of row 0: BEGIN, lock the row (waiting for the delivery that holds
 * it, at most the statement timeout), remove it if it is still there, COMMIT.
 * @step cancel @code operating/jobs.rs::cancel_row_lock
 */
active proctype canceller() {
    if
    :: CANCELS ->
        if
        :: atomic {
            lk[0] == 0 ->
            /* @step cancel_lock: waits for the row's lock; a row that is gone: false
               @code TableSql::cancel_lock */
            if
            :: exists(0) -> lk[0] = CANCELLER
            :: else -> skip
            fi
           }
        :: atomic {
            lk[0] != 0 ->
            /* @step cancel_timeout: the wait ran out: an error, nothing changed */
            skip
           }
        fi;
        if
        :: atomic {
            lk[0] == CANCELLER ->
            /* @step cancel_remove: deletes the locked row, then COMMIT
               @code TableSql::cancel_remove */
            st[0] = GONE; cancelled[0] = 1; lk[0] = 0
           }
        :: else -> skip
        fi
    :: else -> skip
    fi;
    cdone = 1
}

/* I6: once the claimers and the cancel have stopped, nothing holds a row. */
active proctype checker() {
    done == 2 && cdone;
    atomic {
        assert(lk[0] == 0 && lk[1] == 0);
        assert(gap[1] == 0 && gap[2] == 0);
        assert(hrow[1] == 0 && hrow[2] == 0)
    }
}

init {
    atomic {
        run claimer(1);
        run claimer(2)
    }
}
