/*
 * Jobs that wait on other jobs (Table::dependencies, src/runtime/deps.rs), checked by spin:
 * the release of a job that waits on two others.
 *
 * - publish: the child's publish names parents 0 and 1; it locks each parent's head row in
 *   sqlbroker_deps (in (table, id) order) and reads its outcome (recorded in the head, else
 *   told by the parent's row: live, gone = acked, dead letter), then writes the child's waits
 *   (a wait on a parent settled already carries its outcome), its count (the parents still
 *   pending) and the child's row: waiting while one is pending, ready when none is, dead-
 *   lettered if a parent it waits on with `after` failed; COMMIT (the heads unlocked).
 * - settlement of a parent (ack or dead letter, in the transaction that settles its row):
 *   locks its head and records its outcome there, reads the waits on it with no outcome yet
 *   (committed ones), marks them with its outcome, then counts the child down under the
 *   count's row lock (held to the commit). `after` and the parent failed: the child is dead-
 *   lettered (if it still waits); else the count is read and at 0 the child is released (if it
 *   still waits). The head is deleted unless a job waits on the parent (the row tells a later
 *   publish). COMMIT. A settlement can be rolled back before its commit (a lost connection):
 *   the parent stays live and is settled again.
 * - requeue: an operator requeues a dead parent: its row live again, its head's outcome reset
 *   (a publish that names it now waits for it); it is settled again. Waits already marked
 *   are not counted down again.
 *
 * Two parents, one child (`after_settled`; `-DAFTER`: `after`), each parent settled by its own
 * process (so both settlements race each other and the publish), MAXREQ requeues, MAXABORT
 * settlements rolled back. The child's own requeue, publishes naming a parent twice, parents
 * in other tables, a parent's row deleted by hand (the sweeper) and chains (a dead letter
 * passed on down) are not modelled.
 *
 * The database is a set of atomic statements under READ COMMITTED. A transaction's writes to
 * rows it holds locked (the parent's head, the marked waits, the child's count and row) are
 * applied at once where no one else reads them before its COMMIT, else at the COMMIT.
 *
 * Steps are annotated "@step <name>" (the code's doc comments: "Modelled in
 * model/deps.pml (<name>)") and "@code <item>"; tests/model_refs.rs checks both directions.
 *
 * Invariants:
 *   D1 the child is released at most once, and its count is seen at 0 by at most one
 *      settlement (the last);
 *   D2 the child is released only once every parent has settled (`after`: every parent
 *      acked); a parent requeued after its settlement counted the child down has settled
 *      for it (only a publish after the requeue waits for it again); a child dead-lettered
 *      never runs (its row changes only while it waits);
 *   D3 no child waits for ever: once every process stopped (both parents settled, no requeue
 *      left), a published child is released or dead-lettered, and no head or count is locked.
 */

#ifndef MAXREQ
#define MAXREQ 1
#endif
#ifndef MAXABORT
#define MAXABORT 0
#endif
#ifdef AFTER
#define SETTLED_ONLY 0
#else
#define SETTLED_ONLY 1
#endif

/* a parent's row */
#define LIVE 0
#define GONE 1          /* acked (not kept) */
#define DEAD 2          /* dead letter */

/* an outcome (a head's, a wait's) */
#define NONE 0
#define ACKED 1
#define FAILED 2

/* the child's row */
#define UNPUB 0
#define WAITING 1
#define READY 2
#define CDEAD 3

/* a wait */
#define NOWAIT 0
#define PENDING 1       /* outcome NULL: a dependent of the parent */
#define MARKED 2        /* the parent's outcome recorded in it */

byte pst[2];            /* each parent's row */
byte hout[2];           /* each parent's head: its outcome (NONE: no head, or not settled) */
byte hl[2];             /* the transaction holding each head's lock (process id) */
byte wt[2];             /* the child's wait on each parent */
byte cst;               /* the child's row */
byte cnt;               /* the child's count, as committed */
byte cl;                /* the transaction holding the count's lock */
byte released, zeros;
bit settled_ever[2], acked_ever[2];
byte requeues, aborts, done;

#define SETTLERS 2
#define PUB 3
#define OP 4

/* What a publish reads of parent i: its head's outcome, else its row's. */
#define told(i) (hout[i] != NONE -> hout[i] : (pst[i] == LIVE -> NONE : (pst[i] == GONE -> ACKED : FAILED)))

proctype publisher() {
    byte o0, o1;
    /* @step publish_read: each parent's head made if missing and locked (in (table, id)
       order), its outcome read (the head's, else the row's)
       @code runtime/deps.rs::read @code runtime/deps.rs::outcome_of */
    atomic { hl[0] == 0 -> hl[0] = PUB; o0 = told(0) }
    atomic { hl[1] == 0 -> hl[1] = PUB; o1 = told(1) }
    atomic {
        /* @step publish_write: the waits (a settled parent's with its outcome), the count of
           the parents pending, the child's row (waiting, ready, or dead-lettered for a failed
           `after` parent); COMMIT, the heads unlocked
           @code runtime/deps.rs::write */
        wt[0] = (o0 == NONE -> PENDING : MARKED);
        wt[1] = (o1 == NONE -> PENDING : MARKED);
        cnt = (o0 == NONE -> 1 : 0) + (o1 == NONE -> 1 : 0);
        if
        :: !SETTLED_ONLY && (o0 == FAILED || o1 == FAILED) -> cst = CDEAD
        :: else ->
            if
            :: cnt > 0 -> cst = WAITING
            :: else ->
                cst = READY; released++;
                assert(released == 1);                                  /* D1 */
                assert(settled_ever[0] && settled_ever[1]);             /* D2 */
                assert(SETTLED_ONLY || (acked_ever[0] && acked_ever[1]))
            fi
        fi;
        hl[0] = 0; hl[1] = 0
    }
    atomic { done++ }
}

proctype settler(byte i) {
    byte me = i + 1, out, dep, mine, was, rel, dl;
    do
    :: atomic {
        pst[i] == LIVE && hl[i] == 0 ->
        /* @step settle_head: the parent's head locked (made if missing), its outcome recorded
           there; the waits on it with no outcome read (as committed) and marked with it
           @code runtime/deps.rs::settle */
        hl[i] = me; was = hout[i];
        if
        :: out = ACKED
        :: out = FAILED
        fi;
        hout[i] = out;
        dep = (wt[i] == PENDING);
        if
        :: dep -> wt[i] = MARKED
        :: else -> skip
        fi
       };
        if
        :: dep ->
            atomic {
                (cl == 0) ->
                /* @step count_down: the child's count taken down by one under its row lock,
                   held to the commit
                   @code runtime/deps.rs::settle */
                cl = me; mine = cnt - 1
            };
            atomic {
                /* @step count_read: `after` and the parent failed: the child dead-lettered if
                   it still waits; else its count read (this transaction's own), and at 0 the
                   child released if it still waits
                   @code runtime/deps.rs::settle */
                if
                :: !SETTLED_ONLY && out == FAILED -> dl = 1
                :: else ->
                    if
                    :: mine == 0 -> rel = 1; zeros++;
                        assert(zeros == 1)                              /* D1 */
                    :: else -> skip
                    fi
                fi
            }
        :: else -> skip
        fi;
        if
        :: atomic {
            aborts < MAXABORT ->
            /* @step rollback: the settlement's transaction rolled back (its connection lost):
               nothing of it stays, the parent is live and settled again */
            aborts++;
            hout[i] = was;
            if
            :: dep -> wt[i] = PENDING
            :: else -> skip
            fi;
            if
            :: cl == me -> cl = 0
            :: else -> skip
            fi;
            if
            :: rel -> zeros--
            :: else -> skip
            fi;
            hl[i] = 0; out = 0; dep = 0; mine = 0; was = 0; rel = 0; dl = 0
           }
        :: atomic {
            /* @step settle_commit: the parent's row settled (gone, or a dead letter), its head
               deleted unless a job waits on it, the child's count, release or dead letter
               written; COMMIT, every lock released
               @code runtime/deps.rs::settle_in_transaction */
            pst[i] = (out == ACKED -> GONE : DEAD);
            settled_ever[i] = 1;
            if
            :: out == ACKED -> acked_ever[i] = 1
            :: else -> skip
            fi;
            if
            :: !dep -> hout[i] = NONE
            :: else -> skip
            fi;
            if
            :: dep -> cnt = mine
            :: else -> skip
            fi;
            if
            :: cl == me -> cl = 0
            :: else -> skip
            fi;
            if
            :: dl && cst == WAITING -> cst = CDEAD
            :: rel && cst == WAITING ->
                cst = READY; released++;
                assert(released == 1);                                  /* D1 */
                assert(settled_ever[0] && settled_ever[1]);             /* D2 */
                assert(SETTLED_ONLY || (acked_ever[0] && acked_ever[1]))
            :: else -> skip
            fi;
            hl[i] = 0; out = 0; dep = 0; mine = 0; was = 0; rel = 0; dl = 0
           }
        fi
    :: atomic { pst[i] != LIVE && done >= 2 -> break }
    od;
    atomic { done++ }
}

proctype operator() {
    do
    :: atomic {
        requeues < MAXREQ && pst[0] == DEAD && (hl[0] == 0 || hout[0] == NONE) ->
        /* @step requeue: a dead parent requeued: its row live again, its head's outcome
           reset (no outcome: a publish that names it now waits for it)
           @code runtime/deps.rs::requeue */
        requeues++; pst[0] = LIVE; hout[0] = NONE
       }
    :: atomic {
        requeues < MAXREQ && pst[1] == DEAD && (hl[1] == 0 || hout[1] == NONE) ->
        requeues++; pst[1] = LIVE; hout[1] = NONE
       }
    :: break
    od;
    atomic { done++ }
}

/* D3, and D2's dead letter that never runs (the child's row changes only from WAITING) */
active proctype checker() {
    done == 4;
    atomic {
        assert(cst != WAITING);
        assert(hl[0] == 0 && hl[1] == 0 && cl == 0);
        assert(released <= 1)
    }
}

init {
    atomic {
        run operator();
        run publisher();
        run settler(0);
        run settler(1)
    }
}
