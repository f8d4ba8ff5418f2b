/*
 * Concurrency limits (Table::concurrency_limit), checked by spin, in two protocols:
 *
 * - default: the lease form's count and turn (src/consuming/form/lease.rs, claim_limited).
 *   A claim counts the rows in work per key (committed, unexpired leases), picks candidates
 *   whose key has room (the first page locked FOR UPDATE SKIP LOCKED, so two claims never
 *   choose one row) and leases them in its transaction; then it waits for the table's turn
 *   (the registry row, locked until the transaction ends), counts again (everything committed
 *   before the turn, and its own rows), hands back what is over the max, and commits.
 * - SLOTS: the slot keys of the forms held by a session (src/consuming/form/limit_keys.rs):
 *   a key of a limit has `max` slots, each a lock key; a row runs holding one slot of its
 *   key, taken without waiting after the row's own key, given back after its settlement.
 *   Here in the advisory lock form (the MySQL row lock form takes the same slots around its
 *   transaction).
 *
 * Two rows of one limit key (max 1), two claimers (each its own process and session), a
 * crash at any step (MAXCRASH), the fenced settlement, renewal and expiry (lease), a session
 * that ends under its handler (SLOTS).
 *
 * The database is a set of atomic statements. Lease: the turn, the second count, the
 * hand-back and the COMMIT are one step (the turn is held from its lock to the commit, and
 * nothing another claim does meanwhile can raise the count).
 *
 * Steps are annotated "@step <name>" (the code's doc comments: "Modelled in
 * model/limits.pml (<name>)") and "@code <item>" (a TableSql/LimitSql/RegistrySql field or
 * Dialect method of src/dialect/mod.rs, or <file under src/>::<function>);
 * tests/model_refs.rs checks both directions.
 *
 * Invariants:
 *   C1 the limit is never exceeded: lease, at most MAX rows of the key leased with their
 *      leases not yet ended; slots, at most MAX rows of the key in work (taken and not yet
 *      settled, on a live session);
 *   I2 a settlement takes effect only for the claim that holds the row: lease, fenced by its
 *      token; slots, on the session that holds the row's key;
 *   I6 no row lost: once everything stopped, no turn, row lock or key is held.
 *
 * TIMELY_RENEWAL (1, the code since finding F2) makes the renewer run only while the lease holds; see
 * finding F2 in model/README.md for what spin reports without it.
 */

#define NR 2
#define MAX 1
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
#define TURN 1          /* lease: a row chosen and leased in the open transaction */
#define KEYS 1          /* slots: a candidate read; its keys are tried next */
#define TAKE 2          /* slots: row key and slot held; the take is next */
#define AHEAD 3
#define RUN 4
#define SETTLE 5

#define ACK 1
#define RETRY 2
#define DEADL 3
#define UNCLAIM 4

byte st[NR];
byte att[NR];
byte now = 1;
#ifndef SLOTS
byte lu[NR];            /* locked_until */
byte rl[NR];            /* the claim transaction that has the row locked */
byte turn;              /* the claim transaction holding the table's turn */
byte holder[NR];
byte tok[3];
#define inwork_at(r, t) (st[r] == LIVE && lu[r] > t)
#define inwork(r) inwork_at(r, now)
#define count_at(t) (inwork_at(0, t) + inwork_at(1, t))
#define chosen(r) (count_at(c) < MAX && st[r] == LIVE && (lu[r] == 0 || lu[r] <= c) && rl[r] == 0)
#define C1 (count_at(now) <= MAX)
#else
byte rk[NR];            /* the session holding the row's own key */
byte slot;              /* the session holding the key's one slot (MAX 1) */
bit sess[3];
byte wrow[3];           /* row + 1 from the take until the settlement, on its session */
#define inwork(p) (wrow[p] != 0 && sess[p])
#define C1 (inwork(1) + inwork(2) <= MAX)
#endif
bit crash[3], fin[3];
byte crashes, lost, done;

active proctype monitor() {
end:
    if
    :: !C1 -> assert(C1)
    fi
}

active proctype clock() {
    do
    :: now < TMAX -> now++
    :: else -> break
    od
}

active proctype crasher() {
    do
    :: atomic { crashes < MAXCRASH && !fin[1] -> crash[1] = 1; crashes++ }
    :: atomic { crashes < MAXCRASH && !fin[2] -> crash[2] = 1; crashes++ }
    :: break
    od
}

#ifndef SLOTS

inline rollback() {
    if
    :: rl[0] == p -> rl[0] = 0
    :: else -> skip
    fi;
    if
    :: rl[1] == p -> rl[1] = 0
    :: else -> skip
    fi;
    if
    :: turn == p -> turn = 0
    :: else -> skip
    fi
}

inline forget() {
    phase = IDLE; r = 0; out = 0; c = 0; tok[p] = 0
}

proctype claimer(byte p) {
    byte phase, r, out, me, rounds, c;
    me = p;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step count_and_choose: BEGIN READ COMMITTED; the rows in work per key as
           committed now; a claimable candidate whose key has room, locked FOR UPDATE SKIP
           LOCKED, leased in this transaction (uncommitted: no one else counts it yet)
           @code LimitSql::begin @code LimitSql::in_work @code LimitSql::candidates
           @code LimitSql::take_locked @code runtime/limits.rs::has_room
           @code consuming/form/lease.rs::claim_limited
           @code consuming/form/lease.rs::take_chosen */
        rounds++;
        c = now;
        if
        :: chosen(0) -> r = 0
        :: chosen(1) -> r = 1
        :: else -> r = NR
        fi;
        if
        :: r < NR -> rl[r] = p; phase = TURN
        :: else -> forget()
        fi
       }
    :: atomic {
        phase == TURN && turn == 0 ->
        /* @step turn: the table's turn (its registry row, locked until the transaction
           ends), then the count that decides: what others committed before the turn, and
           this claim's row; over the max, the row is handed back; COMMIT
           @code RegistrySql::limits_locked @code runtime/limits.rs::over
           @code TableSql::unclaim @code consuming/form/lease.rs::claim_limited */
        if
        :: count_at(c) + 1 > MAX -> rollback(); forget()
        :: else ->
            lu[r] = c + L; att[r]++; holder[r] = me; tok[p] = lu[r];
            rollback();
            phase = RUN
        fi
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
        /* @step settle: ack, retry or dead letter, fenced by the token held: the row leaves
           the count
           @code consuming/form/lease.rs::settle @code TableSql::ack @code TableSql::retry
           @code TableSql::dead */
        if
        :: tok[p] != 0 && lu[r] == tok[p] ->
            assert(holder[r] == me);                            /* I2 */
            if
            :: st[r] = GONE
            :: skip
            :: st[r] = DEAD
            fi;
            lu[r] = 0; holder[r] = 0
        :: else -> skip
        fi;
        forget()
       }
    od
    } unless {
        /* @step crash: the process dies: its open claim transaction is rolled back, its
           leases count until they end */
        atomic { crash[p] -> crash[p] = 0; rollback(); forget(); me = me + 2 }
    };
    if
    :: phase == IDLE && rounds == ROUNDS -> skip
    :: else -> goto life
    fi;
    atomic { fin[p] = 1; done++ }
}

/* I6 */
active proctype checker() {
    done == 2;
    atomic { assert(turn == 0 && rl[0] == 0 && rl[1] == 0) }
}

#else

/* The session ends: the database frees every key it held. */
inline end_session() {
    sess[p] = 0;
    if
    :: rk[0] == p -> rk[0] = 0
    :: else -> skip
    fi;
    if
    :: rk[1] == p -> rk[1] = 0
    :: else -> skip
    fi;
    if
    :: slot == p -> slot = 0
    :: else -> skip
    fi
}

inline unlock_all() {
    if
    :: slot == p -> slot = 0
    :: else -> skip
    fi;
    if
    :: rk[r] == p -> rk[r] = 0
    :: else -> skip
    fi
}

inline forget() {
    phase = IDLE; r = 0; wrow[p] = 0
}

proctype claimer(byte p) {
    byte phase, r, rounds;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step candidates: ready rows, locking nothing
           @code TableSql::claim @code consuming/form/advisory.rs::scan */
        rounds++;
        sess[p] = 1;
        if
        :: st[0] == LIVE -> r = 0; phase = KEYS
        :: st[1] == LIVE -> r = 1; phase = KEYS
        :: else -> skip
        fi
       }
    :: atomic {
        phase == KEYS ->
        /* @step take_slots: the row's own key, then one free slot of its limit key (slot
           keys tried in turn, none waited for); a key held or a limit full: all given back,
           the row passed by
           @code TableSql::key_lock @code consuming/form/limit_keys.rs::take_slots
           @code runtime/limits.rs::slot_prefix @code consuming/form/limit_keys.rs::unlock_all */
        if
        :: rk[r] == 0 && slot == 0 -> rk[r] = p; slot = p; phase = TAKE
        :: else -> forget()
        fi
       }
    :: atomic {
        phase == TAKE ->
        /* @step take: the row, if it is still claimable, its attempt counted; else its keys
           go back
           @code TableSql::take @code consuming/form/advisory.rs::take */
        if
        :: st[r] == LIVE -> att[r]++; wrow[p] = r + 1; phase = RUN
        :: else -> unlock_all(); forget()
        fi
       }
    :: atomic {
        phase == RUN ->
        /* @step settle: the outcome's statement on the session that holds the keys, then
           every key unlocked, the slot with them
           @code consuming/form/advisory.rs::under_key @code TableSql::ack
           @code TableSql::retry @code TableSql::dead
           @code consuming/form/limit_keys.rs::unlock_all @code TableSql::key_unlock */
        if
        :: sess[p] ->
            assert(rk[r] == p);                                 /* I2 */
            if
            :: st[r] = GONE
            :: skip
            :: st[r] = DEAD
            fi;
            wrow[p] = 0;
            unlock_all()
        :: else -> skip
        fi;
        forget()
       }
    :: atomic {
        phase == RUN && sess[p] && lost < MAXLOST ->
        /* @step session_lost: the server ends the session: its keys and slot are freed; the
           handler runs on and its settlement will fail */
        lost++; end_session()
       }
    od
    } unless {
        /* @step crash: the process dies; its session ends, every key and slot is freed */
        atomic { crash[p] -> crash[p] = 0; end_session(); forget() }
    };
    if
    :: phase == IDLE && rounds == ROUNDS -> skip
    :: else -> goto life
    fi;
    atomic { fin[p] = 1; done++ }
}

/* I6 */
active proctype checker() {
    done == 2;
    atomic { assert(slot == 0 && rk[0] == 0 && rk[1] == 0) }
}

#endif

init {
    atomic {
        run claimer(1);
        run claimer(2)
    }
}
