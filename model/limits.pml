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
 * CHANGE: the max is changed at run time. It starts at 2 and an operator sets it NCHANGE (2)
 * times, each time to another of 1, 2 and lifted (room LIFTED, 3: more than the claimers), at
 * any step: lowered while rows are in work, raised, lifted, set again. The table's record
 * keeps the limit's slot space, the largest room it has had (SLOTS: 3 slot keys). Lease: a
 * claim chooses by the max it read at its start, and the turn reads the max again under the
 * registry row's lock, which the operator's write takes too, so the count that decides is
 * made against the max in force. Slots: a claim reads the record (max and slot space) with its
 * candidates and takes a slot below the max it read; where the space reaches past that max
 * and the key is not known clean, it counts the slots held above the max (none: the key noted
 * clean, by its process, until the record changes), and else every slot held, its own
 * included, and gives its slot back if they are more than the max. The allowance: a claim that
 * read the record before a change may still take a slot by the old max (the code bounds that
 * reading's age by CLAIM_STALE; here, until its slot is taken), so rows in work exceed a
 * lowered max until they finish. A key is noted clean only once no claim by an older reading is
 * under way (the code: once its broker has known the record twice CLAIM_STALE).
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
 *   C1 the limit is never exceeded: lease, at most max rows of the key leased with their
 *      leases not yet ended; slots, at most max rows of the key in work (taken and not yet
 *      settled, on a live session). With CHANGE, the max is the largest of those the rows in
 *      work were admitted under (without CHANGE: 1);
 *   C7 (CHANGE) a claim that read the max in force takes a row only while fewer than that max
 *      are held by others: lease, rows leased with unended leases, at the turn; slots, slot
 *      keys held, when it has taken its slot, if the record has not changed since it read it
 *      (after a lower, no claim by the new max enters until fewer than the new max are held);
 *   I2 a settlement takes effect only for the claim that holds the row: lease, fenced by its
 *      token; slots, on the session that holds the row's key;
 *   I6 no row lost: once everything stopped, no turn, row lock or key is held.
 *
 * TIMELY_RENEWAL (1, the code since finding F2) makes the renewer run only while the lease holds; see
 * finding F2 in model/README.md for what spin reports without it.
 */

#define NR 2
#define L 2
#ifdef CHANGE
#define MAX0 2          /* the max before the operator's changes */
#ifndef NCHANGE
#define NCHANGE 2
#endif
#else
#define MAX0 1
#define NCHANGE 0
#endif
#define LIFTED 3        /* a lifted limit's room (Table::MAX_CONCURRENCY): more than the claimers */
#define SPACE 3         /* slot keys of the key: the largest room there can be */
#define room(m) ((m) == 0 -> LIFTED : (m))
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
byte max = MAX0;        /* the record's max in force (0: lifted) */
byte ver;               /* the record's text: each change writes a new one */
byte adm[3];            /* the room a row in work was admitted under (by row: lease; by claimer: slots) */
#define amax2(a, b) ((a) > (b) -> (a) : (b))
#ifndef SLOTS
byte lu[NR];            /* locked_until */
byte rl[NR];            /* the claim transaction that has the row locked */
byte turn;              /* the claim transaction holding the table's turn */
byte holder[NR];
byte tok[3];
#define inwork_at(r, t) (st[r] == LIVE && lu[r] > t)
#define inwork(r) inwork_at(r, now)
#define count_at(t) (inwork_at(0, t) + inwork_at(1, t))
#define chosen(r) (count_at(c) < room(rmax) && st[r] == LIVE && (lu[r] == 0 || lu[r] <= c) && rl[r] == 0)
#define admitted(r) (inwork(r) -> adm[r] : 0)
#define C1 (count_at(now) <= amax2(admitted(0), admitted(1)))
#else
byte rk[NR];            /* the session holding the row's own key */
byte slot[SPACE];       /* the session holding each slot key of the limit's key */
byte space = MAX0;      /* the record's slot space: the largest room the limit has had */
byte rv[3];             /* ver + 1 of a claim's reading of the record, from its read to its slot */
byte cleanv[3];         /* ver + 1 of the record under which the process found the key clean */
bit sess[3];
byte wrow[3];           /* row + 1 from the take until the settlement, on its session */
#define inwork(p) (wrow[p] != 0 && sess[p])
#define admitted(p) (inwork(p) -> adm[p] : 0)
#define C1 (inwork(1) + inwork(2) <= amax2(admitted(1), admitted(2)))
#define heldby(s, p) (slot[s] != 0 && slot[s] != (p) -> 1 : 0)
#define held_at(s, a, b) (slot[s] != 0 && (s) >= (a) && (s) < (b) -> 1 : 0)
#define held_in(a, b) (held_at(0, a, b) + held_at(1, a, b) + held_at(2, a, b))
#define others(p) (heldby(0, p) + heldby(1, p) + heldby(2, p))
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

#ifdef CHANGE
/* @step change: an operator sets the max (lowers it while rows are in work, raises it, lifts
   it, sets it again): a new text of the table's record, written where it is still the one
   read; the slot space kept (the largest room the limit has had)
   @code runtime/registry.rs::set_limit */
active proctype operator() {
    byte changes;
    do
    :: changes < NCHANGE ->
        atomic {
            if
            :: max != 1 -> max = 1
            :: max != 2 -> max = 2
            :: max != 0 -> max = 0
            fi;
#ifdef SLOTS
            space = amax2(space, room(max));
#endif
            ver++; changes++
        }
    :: break
    od
}
#endif

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
    phase = IDLE; r = 0; out = 0; c = 0; tok[p] = 0; rmax = 0
}

proctype claimer(byte p) {
    byte phase, r, out, me, rounds, c, rmax;
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
        rmax = max;
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
           ends), the maxes read again under it (an operator's change waits for the turn or
           is read by it), then the count that decides: what others committed before the
           turn, and this claim's row; over the max, the row is handed back; COMMIT
           @code RegistrySql::limits_locked @code runtime/limits.rs::over
           @code TableSql::unclaim @code consuming/form/lease.rs::claim_limited */
        if
        :: count_at(c) + 1 > room(max) -> rollback(); forget()
        :: else ->
            assert(count_at(now) < room(max));                  /* C7 */
            adm[r] = room(max);
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
            lu[r] = 0; holder[r] = 0; adm[r] = 0
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

inline free_slots() {
    if
    :: slot[0] == p -> slot[0] = 0
    :: else -> skip
    fi;
    if
    :: slot[1] == p -> slot[1] = 0
    :: else -> skip
    fi;
    if
    :: slot[2] == p -> slot[2] = 0
    :: else -> skip
    fi
}

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
    free_slots()
}

inline unlock_all() {
    free_slots();
    if
    :: rk[r] == p -> rk[r] = 0
    :: else -> skip
    fi
}

inline forget() {
    phase = IDLE; r = 0; wrow[p] = 0; rv[p] = 0; rmax = 0; rspace = 0; s = 0; adm[p] = 0
}

/* The key may be noted clean (no slot at or above the max held) only once no claim of any
   process still takes a slot by a reading of an older record: the code keeps the note only
   once the broker has known the record twice CLAIM_STALE, and no claim takes a slot by a
   reading older than CLAIM_STALE. */
#define no_old_reading (rv[1] == 0 || rv[1] == ver + 1) && (rv[2] == 0 || rv[2] == ver + 1)

proctype claimer(byte p) {
    byte phase, r, rounds, rmax, rspace, s;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step candidates: ready rows, locking nothing; the record's maxes and slot spaces
           as read now (a claim may take its slots by this reading after a change)
           @code TableSql::claim @code consuming/form/advisory.rs::scan */
        rounds++;
        sess[p] = 1;
        rmax = max; rspace = space; rv[p] = ver + 1;
        if
        :: st[0] == LIVE -> r = 0; phase = KEYS
        :: st[1] == LIVE -> r = 1; phase = KEYS
        :: else -> forget()
        fi
       }
    :: atomic {
        phase == KEYS ->
        /* @step take_slots: the row's own key, then one free slot of its limit key below the
           max read (slot keys tried from any point, none waited for); where the slot space
           reaches past the max and the key is not known clean, the slots held above the max
           counted: none, the key noted clean; some, every slot held counted, its own
           included, and over the max the slot given back. A key held or a limit full: all
           given back, the row passed by
           @code TableSql::key_lock @code consuming/form/limit_keys.rs::take_slots
           @code runtime/limits.rs::slot_prefix @code consuming/form/limit_keys.rs::unlock_all
           @code Dialect::slots_held */
        rspace = amax2(rspace, room(rmax));
        if
        :: room(rmax) > 0 && slot[0] == 0 -> s = 0
        :: room(rmax) > 1 && slot[1] == 0 -> s = 1
        :: room(rmax) > 2 && slot[2] == 0 -> s = 2
        :: else -> s = SPACE
        fi;
        if
        :: rk[r] == 0 && s < SPACE ->
            rk[r] = p; slot[s] = p;
            if
            :: rspace > room(rmax) && cleanv[p] != rv[p] ->
                if
                :: held_in(room(rmax), rspace) == 0 ->
                    if
                    :: rv[p] == ver + 1 && no_old_reading -> cleanv[p] = rv[p]
                    :: else -> skip
                    fi;
                    phase = TAKE
                :: held_in(room(rmax), rspace) > 0 && held_in(0, rspace) <= room(rmax) -> phase = TAKE
                :: held_in(room(rmax), rspace) > 0 && held_in(0, rspace) > room(rmax) -> unlock_all(); forget()
                fi
            :: else -> phase = TAKE
            fi;
            if
            :: phase == TAKE ->
                /* C7: a claim by the record in force takes a slot only while fewer than its
                   max are held by others */
                assert(rv[p] != ver + 1 || others(p) < room(rmax));
                adm[p] = room(rmax); rv[p] = 0
            :: else -> skip
            fi
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
        /* @step crash: the process dies; its session ends, every key and slot is freed (and
           the process's notes of clean keys are gone) */
        atomic { crash[p] -> crash[p] = 0; end_session(); forget(); cleanv[p] = 0 }
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
    atomic { assert(slot[0] == 0 && slot[1] == 0 && slot[2] == 0 && rk[0] == 0 && rk[1] == 0) }
}

#endif

init {
    atomic {
        run claimer(1);
        run claimer(2)
    }
}
