/*
 * FIFO groups in the lease form (PostgreSQL's protocol: TableSql::fifo_takes), checked by
 * spin.
 *
 * Two rows of one group, row 0 older (smaller id) than row 1, are published by two
 * transactions that may commit in either order (a row is invisible until its publish
 * commits). Two subscriptions (claimers, each its own process) claim in two statements in one
 * READ COMMITTED transaction: the first reads the heads of their groups under its snapshot and
 * takes each head's group lock (transaction-scoped, without waiting: a group locked elsewhere
 * is passed by); the second, under a new snapshot taken while the locks are held, checks each
 * head again (claimable, still the head, no row of its group leased) and leases it; COMMIT
 * frees the group locks. Then as in the lease form: the handler, renewal, fenced settlement,
 * a hand-back, a crash at any step (MAXCRASH), a claim whose answer never arrives (MAXLOST).
 *
 * The database is a set of atomic statements. The second statement and the COMMIT are one
 * step: the rows it leases are locked until the commit, so nothing can write them between,
 * and the group lock keeps every other claim of the group out until then.
 *
 * Steps are annotated "@step <name>" (the code's doc comments: "Modelled in model/fifo.pml
 * (<name>)") and "@code <item>" (a TableSql/LimitSql/RegistrySql field or Dialect method of
 * src/dialect/mod.rs, or <file under src/>::<function>); tests/model_refs.rs checks both.
 *
 * Invariants:
 *   F1 heads one at a time: no two rows of a group in work at once (leased, the lease not
 *      yet ended);
 *   F2 in order: a row is leased only while every older row of its group that has been
 *      published is finished;
 *   I1, I2 as in lease.pml: two handlers of a row never both run within their leases; a fenced
 *      statement only takes effect for the claim that holds the row;
 *   I6 no row lost: once everything stopped no group lock is held (so the group's first
 *      unfinished row is a claimable head once its lease ends).
 *
 * TIMELY_RENEWAL (1, the code since finding F2) makes the renewer run only while the lease holds; see
 * finding F2 in model/README.md for what spin reports without it.
 */

#define NR 2
#define L 2
#ifndef TMAX
#define TMAX 4
#endif
#ifndef ROUNDS
#define ROUNDS 1
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXLOST
#define MAXLOST 1
#endif
#ifndef TIMELY_RENEWAL
#define TIMELY_RENEWAL 1
#endif

#define LIVE 0
#define GONE 1
#define DEAD 2

#define IDLE 0
#define LOCK 1          /* the first statement read a head; its group lock is taken next */
#define TAKE 2          /* the group locked; the second statement is next */
#define AHEAD 3
#define RUN 4
#define SETTLE 5

#define ACK 1
#define RETRY 2
#define DEADL 3
#define UNCLAIM 4

byte st[NR];
byte lu[NR];
byte att[NR];
bit vis[NR];            /* the row's publish has committed */
byte gl;                /* the claim transaction holding the group's lock (0: none) */
byte now = 1;

/* ghosts */
byte holder[NR];
byte hrow[3];
byte tok[3];
bit crash[3], fin[3];
byte crashes, lost, done;

#define live(r) (vis[r] && st[r] == LIVE)
#define free(r) (lu[r] == 0 || lu[r] <= now)
#define leased(r) (live(r) && lu[r] > now)
/* the head of the group: no older unfinished row visible */
#define head(r) (r == 0 || !live(0))
#define claimable(r) (live(r) && free(r) && head(r) && !leased(0) && !leased(1))

#define F1 (!(leased(0) && leased(1)))
#define I1 (!(hrow[1] != 0 && hrow[1] == hrow[2] && tok[1] > now && tok[2] > now))

active proctype monitor() {
end:
    if
    :: !F1 -> assert(F1)
    :: !I1 -> assert(I1)
    fi
}

active proctype clock() {
    do
    :: now < TMAX -> now++
    :: else -> break
    od
}

/* The publishes of row 0 and row 1 commit, in either order. */
active proctype publisher() {
    do
    :: atomic { !vis[0] -> vis[0] = 1 }
    :: atomic { !vis[1] -> vis[1] = 1 }
    :: vis[0] && vis[1] -> break
    od
}

active proctype crasher() {
    do
    :: atomic { crashes < MAXCRASH && !fin[1] -> crash[1] = 1; crashes++ }
    :: atomic { crashes < MAXCRASH && !fin[2] -> crash[2] = 1; crashes++ }
    :: break
    od
}

inline unlock_group() {
    if
    :: gl == p -> gl = 0
    :: else -> skip
    fi
}

inline fenced(tk) {
    if
    :: tk != 0 && lu[r] == tk ->
        assert(holder[r] == me);                                /* I2 */
        if
        :: out == ACK -> st[r] = GONE
        :: out == RETRY -> skip
        :: out == DEADL -> st[r] = DEAD
        :: out == UNCLAIM -> att[r]--
        fi;
        lu[r] = 0; holder[r] = 0
    :: else -> skip
    fi
}

inline forget() {
    phase = IDLE; r = 0; out = 0; tok[p] = 0; hrow[p] = 0
}

proctype claimer(byte p) {
    byte phase, r, out, me, rounds;
    me = p;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step heads: BEGIN READ COMMITTED; under its snapshot, the heads of groups none of
           whose rows is leased, in claim order
           @code TableSql::begin @code TableSql::claim @code Dialect::lease_claim
           @code dialect/shared.rs::fifo_head @code consuming/form/lease.rs::claim */
        rounds++;
        if
        :: claimable(0) -> r = 0; phase = LOCK
        :: claimable(1) -> r = 1; phase = LOCK
        :: else -> r = 0                                        /* none: rolled back */
        fi
       }
    :: atomic {
        phase == LOCK ->
        /* @step group_lock: the head's group lock, transaction-scoped, without waiting (the
           same statement, after its snapshot was taken); a group locked elsewhere is passed
           by */
        if
        :: gl == 0 -> gl = p; phase = TAKE
        :: else -> forget()
        fi
       }
    :: atomic {
        phase == TAKE ->
        /* @step fifo_take: under a new snapshot, the head checked again (claimable, still
           its group's head, no row of its group leased) and leased, its attempt counted;
           COMMIT frees the group lock
           @code TableSql::fifo_takes @code Dialect::lease_claim */
        if
        :: claimable(r) ->
            assert(head(r));                                    /* F2 */
            lu[r] = now + L; att[r]++;
            holder[r] = me; tok[p] = lu[r];
            phase = AHEAD;
            if
            :: lost < MAXLOST ->
                /* @step claim_lost: committed, the answer lost: leased until it ends */
                lost++; unlock_group(); forget()
            :: skip
            fi
        :: else -> forget()
        fi;
        unlock_group()
       }
    :: atomic {
        phase == AHEAD ->
        /* @step hand_back: claimed ahead, then closed: the lease cleared, fenced
           @code consuming/form/lease.rs::hand_back @code TableSql::unclaim */
        out = UNCLAIM; phase = SETTLE
       }
    :: atomic {
        phase == AHEAD ->
        /* @step handler */
        hrow[p] = r + 1; phase = RUN
       }
    :: atomic {
        phase == RUN && tok[p] < now + L && (!TIMELY_RENEWAL || now < tok[p]) ->
        /* @step renew: the renewer moves the lease held to now + L
           @code runtime/renewer.rs::renew_chunk @code Dialect::lease_renew */
        if
        :: lu[r] == tok[p] ->
            assert(holder[r] == me);                            /* I2 */
            lu[r] = now + L; tok[p] = lu[r]
        :: else -> skip
        fi
       }
    :: atomic {
        phase == RUN ->
        /* @step outcome: the handler returns: ack, retry or dead letter */
        hrow[p] = 0;
        if
        :: out = ACK
        :: out = RETRY
        :: out = DEADL
        fi;
        phase = SETTLE
       }
    :: atomic {
        phase == SETTLE ->
        /* @step settle: fenced by the token held
           @code consuming/form/lease.rs::settle @code TableSql::ack @code TableSql::retry
           @code TableSql::dead */
        fenced(tok[p]);
        forget()
       }
    od
    } unless {
        /* @step crash: the process dies: its leases stay until they end; its open claim
           transaction (and its group lock) is rolled back */
        atomic { crash[p] -> crash[p] = 0; unlock_group(); forget(); me = me + 2 }
    };
    if
    :: phase == IDLE && rounds == ROUNDS -> skip
    :: else -> goto life
    fi;
    atomic { fin[p] = 1; done++ }
}

/* I6: once every claimer stopped, the group lock is free and the group is not stuck. */
active proctype checker() {
    done == 2 && vis[0] && vis[1];
    atomic {
        assert(gl == 0);
        assert(hrow[1] == 0 && hrow[2] == 0)
    }
}

init {
    atomic {
        run claimer(1);
        run claimer(2)
    }
}
