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
 * settlements rolled back. TWO: a second child, published by a process of its own, waiting on
 * both parents the other way (`after` beside `after_settled`): a settlement counts both down,
 * their counts locked in (table, id) order. The child's own requeue, publishes naming a parent
 * twice, parents in other tables, a parent's row deleted by hand (the sweeper) and chains (a
 * dead letter passed on down) are not modelled.
 *
 * The database is a set of atomic statements under READ COMMITTED. A transaction's writes to
 * rows it holds locked (the parent's head, the marked waits, the child's count and row) are
 * applied at once where no one else reads them before its COMMIT, else at the COMMIT.
 *
 * Steps are annotated "@step <name>" (the code's doc comments: "Modelled in
 * model/deps.pml (<name>)") and "@code <item>"; tests/model_refs.rs checks both directions.
 *
 * Invariants, for each child:
 *   D1 the child is released at most once, and its count is seen at 0 by at most one
 *      settlement (the last);
 *   D2 the child is released only once every parent has settled (`after`: every parent
 *      acked); a parent requeued after its settlement counted the child down has settled
 *      for it (only a publish after the requeue waits for it again); a child dead-lettered
 *      never runs (its row changes only while it waits);
 *   D3 no child waits for ever: once every process stopped (both parents settled, no requeue
 *      left), a published child is released or dead-lettered, and no head or count is locked
 *      (nor does any settlement wait for ever for a count's lock: spin's invalid end states).
 */

#ifndef MAXREQ
#define MAXREQ 1
#endif
#ifndef MAXABORT
#define MAXABORT 0
#endif
#ifdef TWO
#define NC 2
#else
#define NC 1
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
byte wt[4];             /* child c's wait on parent i: wt[2 * c + i] */
byte cst[2];            /* each child's row */
byte cnt[2];            /* each child's count, as committed */
byte cl[2];             /* the transaction holding each child's count's lock */
byte released[2], zeros[2];
bit settled_ever[2], acked_ever[2];
byte requeues, aborts, done;

/* child 0 waits as SETTLED_ONLY says; child 1 (TWO) the other way */
#define so(c) ((c) == 0 -> SETTLED_ONLY : 1 - SETTLED_ONLY)

/* What a publish reads of parent i: its head's outcome, else its row's. */
#define told(i) (hout[i] != NONE -> hout[i] : (pst[i] == LIVE -> NONE : (pst[i] == GONE -> ACKED : FAILED)))

/* D1, D2 at a release of child c */
inline release(c) {
    cst[c] = READY; released[c]++;
    assert(released[c] == 1);                                           /* D1 */
    assert(settled_ever[0] && settled_ever[1]);                         /* D2 */
    assert(so(c) || (acked_ever[0] && acked_ever[1]))                   /* D2 */
}

proctype publisher(byte c) {
    byte o0, o1, me = 3 + c;
    /* @step publish_read: each parent's head made if missing and locked (in (table, id)
       order), its outcome read (the head's, else the row's)
       @code runtime/deps.rs::read @code runtime/deps.rs::outcome_of */
    atomic { hl[0] == 0 -> hl[0] = me; o0 = told(0) }
    atomic { hl[1] == 0 -> hl[1] = me; o1 = told(1) }
    atomic {
        /* @step publish_write: the waits (a settled parent's with its outcome), the count of
           the parents pending, the child's row (waiting, ready, or dead-lettered for a failed
           `after` parent); COMMIT, the heads unlocked
           @code runtime/deps.rs::write */
        wt[2 * c] = (o0 == NONE -> PENDING : MARKED);
        wt[2 * c + 1] = (o1 == NONE -> PENDING : MARKED);
        cnt[c] = (o0 == NONE -> 1 : 0) + (o1 == NONE -> 1 : 0);
        if
        :: !so(c) && (o0 == FAILED || o1 == FAILED) -> cst[c] = CDEAD
        :: else ->
            if
            :: cnt[c] > 0 -> cst[c] = WAITING
            :: else -> release(c)
            fi
        fi;
        hl[0] = 0; hl[1] = 0
    }
    atomic { done++ }
}

/* A settlement's work for child c, if it waits on the parent: its count taken down under the
   count's lock, then read (or the child dead-lettered). */
inline count(c) {
    if
    :: dep[c] ->
        atomic {
            (cl[c] == 0) ->
            /* @step count_down: the child's count taken down by one under its row lock, held
               to the commit (the children's counts locked in (table, id) order)
               @code runtime/deps.rs::settle */
            cl[c] = me; mine[c] = cnt[c] - 1
        };
        atomic {
            /* @step count_read: `after` and the parent failed: the child dead-lettered if it
               still waits; else its count read (this transaction's own), and at 0 the child
               released if it still waits
               @code runtime/deps.rs::settle */
            if
            :: !so(c) && out == FAILED -> dl[c] = 1
            :: else ->
                if
                :: mine[c] == 0 -> rel[c] = 1; zeros[c]++;
                    assert(zeros[c] == 1)                                 /* D1 */
                :: else -> skip
                fi
            fi
        }
    :: else -> skip
    fi
}

/* The settlement's end for child c: rolled back (undo) or committed. */
inline undo(c) {
    if
    :: dep[c] -> wt[2 * c + i] = PENDING
    :: else -> skip
    fi;
    if
    :: cl[c] == me -> cl[c] = 0
    :: else -> skip
    fi;
    if
    :: rel[c] -> zeros[c]--
    :: else -> skip
    fi
}

inline commit(c) {
    if
    :: dep[c] -> cnt[c] = mine[c]
    :: else -> skip
    fi;
    if
    :: cl[c] == me -> cl[c] = 0
    :: else -> skip
    fi;
    if
    :: dl[c] && cst[c] == WAITING -> cst[c] = CDEAD
    :: rel[c] && cst[c] == WAITING -> release(c)
    :: else -> skip
    fi
}

inline forget() {
    hl[i] = 0; out = 0; was = 0;
    dep[0] = 0; dep[1] = 0; mine[0] = 0; mine[1] = 0; rel[0] = 0; rel[1] = 0; dl[0] = 0; dl[1] = 0
}

proctype settler(byte i) {
    byte me = i + 1, out, was;
    byte mine[2];
    bit dep[2], rel[2], dl[2];
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
        dep[0] = (wt[i] == PENDING);
        dep[1] = (wt[2 + i] == PENDING);
        if
        :: dep[0] -> wt[i] = MARKED
        :: else -> skip
        fi;
        if
        :: dep[1] -> wt[2 + i] = MARKED
        :: else -> skip
        fi
       };
        count(0); count(1);
        if
        :: atomic {
            aborts < MAXABORT ->
            /* @step rollback: the settlement's transaction rolled back (its connection lost):
               nothing of it stays, the parent is live and settled again */
            aborts++;
            hout[i] = was;
            undo(0); undo(1);
            forget()
           }
        :: atomic {
            /* @step settle_commit: the parent's row settled (gone, or a dead letter), its head
               deleted unless a job waits on it, the children's counts, releases or dead
               letters written; COMMIT, every lock released
               @code runtime/deps.rs::settle_in_transaction */
            pst[i] = (out == ACKED -> GONE : DEAD);
            settled_ever[i] = 1;
            if
            :: out == ACKED -> acked_ever[i] = 1
            :: else -> skip
            fi;
            if
            :: !dep[0] && !dep[1] -> hout[i] = NONE
            :: else -> skip
            fi;
            commit(0); commit(1);
            forget()
           }
        fi
    :: atomic { pst[i] != LIVE && done >= NC + 1 -> break }
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

/* D3, and D2's dead letter that never runs (a child's row changes only from WAITING) */
active proctype checker() {
    done == NC + 3;
    atomic {
        assert(cst[0] != WAITING && cst[1] != WAITING);
        assert(hl[0] == 0 && hl[1] == 0 && cl[0] == 0 && cl[1] == 0);
        assert(released[0] <= 1 && released[1] <= 1)
    }
}

init {
    atomic {
        run operator();
        run publisher(0);
#if NC > 1
        run publisher(1);
#endif
        run settler(0);
        run settler(1)
    }
}
