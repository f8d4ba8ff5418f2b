/*
 * The advisory lock form's protocol (src/consuming/form/advisory.rs), checked by spin.
 *
 * Two subscriptions (claimers, each its own process and database session) claim two rows
 * whose keys are equal (the template renders one key for both, so they must run one at a
 * time): a claim reads candidates without locking, tries the row's key without waiting,
 * then takes the row if it is still claimable (counting its attempt); the session holds the
 * key until the settlement has run on it, then unlocks. An operator cancels row 0 (marks it,
 * then removes it under its key if the key is free). A claimer may crash at any step (its
 * session ends and the database frees its key), a session may end under a running handler,
 * and the answer of a statement may never arrive (the connection is gone: its session ends).
 *
 * The database is a set of atomic statements; the key is `ko` (the session holding it).
 *
 * Steps are annotated "@step <name>" (the code's doc comments: "Modelled in
 * model/advisory.pml (<name>)") and "@code <item>" (a TableSql/LimitSql/RegistrySql field or
 * Dialect method of src/dialect/mod.rs, or <file under src/>::<function>);
 * tests/model_refs.rs checks both directions.
 *
 * Invariants:
 *   I1 no two live handlers of one row, nor of two rows of one key: only a live session
 *      holding the key runs a handler of its rows;
 *   I2 a settlement runs only on the session that holds the key: a late one (its session
 *      gone, the key taken by another) changes nothing;
 *   I3 attempts are counted when the row is taken: a row's attempts are its takes less its
 *      hand-backs (a crash spends the attempt);
 *   I4 a cancelled job never starts again;
 *   I7 no double delivery: a handler on a live session starts only on an unfinished row;
 *   I6 no row lost: once everything stopped no key is held and every row is finished or
 *      claimable.
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

#define LIVE 0
#define GONE 1          /* acked or cancelled: deleted */
#define DEAD 2          /* dead-lettered, kept */

#define IDLE 0
#define KEY 1           /* a candidate read; its key is tried next */
#define TAKE 2          /* the key held; the take is next */
#define AHEAD 3         /* taken, not yet handled */
#define RUN 4           /* its handler runs */
#define SETTLE 5        /* the outcome's statement is next */

#define ACK 1
#define RETRY 2
#define DEADL 3
#define UNCLAIM 4

#define CANCELLER 3

byte st[NR];
byte att[NR];
bit cr[NR];             /* cancel_requested */
byte ko;                /* the session holding the rows' key (0: free) */

/* ghosts */
byte takes[NR];         /* takes committed, less hand-backs */
bit cancelled[NR];
byte hrow[3];           /* row + 1 while a claimer's handler runs */
bit sess[3];            /* its session is alive */
bit crash[3], fin[3];
byte crashes, lost, done;
bit cdone;

#define exists(r) (st[r] == LIVE || st[r] == DEAD)

/* I1: one live handler at a time of the key's rows (row 0 and 1 share the key) */
#define I1 (!(hrow[1] != 0 && hrow[2] != 0 && sess[1] && sess[2]))
#define I3 (att[0] == takes[0] && att[1] == takes[1])

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

/* The session ends: the database frees its key. */
inline end_session() {
    sess[p] = 0;
    if
    :: ko == p -> ko = 0
    :: else -> skip
    fi
}

inline forget() {
    phase = IDLE; r = 0; out = 0; mark = 0; cbc = 0; hrow[p] = 0
}

proctype claimer(byte p) {
    byte phase, r, out, rounds;
    bit mark, cbc;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step candidates: ready rows with the columns of their keys, locking nothing, on a
           pooled session
           @code TableSql::claim @code TableSql::claim_after @code TableSql::advisory_cursor
           @code consuming/form/advisory.rs::claim @code consuming/form/advisory.rs::scan */
        rounds++;
        sess[p] = 1;
        if
        :: st[0] == LIVE -> r = 0; phase = KEY
        :: st[1] == LIVE -> r = 1; phase = KEY
        :: else -> r = 0
        fi
       }
    :: atomic {
        phase == KEY ->
        /* @step key_lock: tries the row's key without waiting; a key held elsewhere is
           skipped (this claim ends here)
           @code TableSql::key_lock @code dialect/keys.rs::lock
           @code consuming/form/advisory.rs::keys_of */
        if
        :: ko == 0 -> ko = p; phase = TAKE
        :: else -> forget()
        fi
       }
    :: atomic {
        phase == TAKE ->
        /* @step take: under the key, takes the row if it is still claimable, counting its
           attempt, and reads its cancel mark; else unlocks
           @code TableSql::take @code Dialect::advisory_take @code TableSql::fetch
           @code consuming/form/advisory.rs::take */
        if
        :: st[r] == LIVE ->
            att[r]++; takes[r]++;
            mark = cr[r]; cbc = cancelled[r];
            phase = AHEAD;
            if
            :: lost < MAXLOST ->
                /* @step take_lost: committed, the connection lost: its session ends */
                lost++; end_session(); forget()
            :: skip
            fi
        :: else ->
            /* @step take_missed: settled meanwhile: the key goes back
               @code TableSql::key_unlock @code consuming/form/limit_keys.rs::unlock_all */
            ko = 0; forget()
        fi
       }
    :: atomic {
        phase == AHEAD && mark ->
        /* @step end_cancelled: its cancel was requested while an earlier claim held it: the
           retry statement ends it as cancelled
           @code consuming/claimer.rs::sort @code consuming/claimer.rs::end_cancelled */
        out = RETRY; phase = SETTLE
       }
    :: atomic {
        phase == AHEAD && !mark ->
        /* @step hand_back: claimed ahead, then the subscription closed: the attempt given
           back under the key, then unlocked
           @code consuming/form/advisory.rs::hand_back @code consuming/form/mod.rs::hand_back */
        out = UNCLAIM; phase = SETTLE
       }
    :: atomic {
        phase == AHEAD && !mark ->
        /* @step handler: the delivery, with the session that holds its key, reaches its
           handler */
        assert(!cbc);                                           /* I4 */
        assert(!sess[p] || st[r] == LIVE);                       /* I7 */
        hrow[p] = r + 1; phase = RUN
       }
    :: atomic {
        phase == RUN ->
        /* @step outcome: the handler returns: ack (or cancel: ends the row as the ack does),
           retry (a failure too) or dead letter */
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
        /* @step settle: the outcome's statement on the session that holds the key, then the
           key is unlocked; a session that is gone fails the statement
           @code consuming/form/advisory.rs::settle @code consuming/form/advisory.rs::under_key
           @code TableSql::ack @code TableSql::cancel_held @code TableSql::retry
           @code TableSql::dead @code TableSql::unclaim @code TableSql::key_unlock
           @code consuming/form/limit_keys.rs::unlock_all */
        if
        :: sess[p] ->
            assert(ko == p);                                    /* I2 */
            if
            :: out == ACK -> st[r] = GONE
            :: out == RETRY ->
                if                          /* @code dialect/shared.rs::cancelled_case */
                :: cr[r] -> st[r] = GONE
                :: else -> skip
                fi
            :: out == DEADL -> st[r] = DEAD
            :: out == UNCLAIM ->
                att[r]--; takes[r]--;
                if
                :: cr[r] -> st[r] = GONE
                :: else -> skip
                fi
            fi;
            if
            :: lost < MAXLOST ->
                /* @step settle_lost: committed, the connection lost: its session ends */
                lost++; end_session()
            :: ko = 0
            fi
        :: else -> skip
        fi;
        forget()
       }
    :: atomic {
        (phase == AHEAD || phase == RUN) && sess[p] && lost < MAXLOST ->
        /* @step session_lost: the server ends the session under the delivery: the key is
           freed; the handler runs on and its settlement will fail */
        lost++; end_session()
       }
    od
    } unless {
        /* @step crash: the process dies; its session ends and the key is freed */
        atomic { crash[p] -> crash[p] = 0; end_session(); forget() }
    };
    if
    :: phase == IDLE && rounds == ROUNDS -> skip
    :: else -> goto life
    fi;
    atomic { fin[p] = 1; done++ }
}

/*
 * The operator's cancel of row 0: gone or completed: false; else mark it (no key needed),
 * then remove it under its key if the key is free now; if the key is held, true at once:
 * the mark ends the row at its next take, retry or hand-back.
 * @step cancel @code operating/jobs.rs::cancel_advisory @code runtime/update.rs::with_key
 */
active proctype canceller() {
    bit marked;
    if
    :: CANCELS && exists(0) ->
        atomic {
            /* @step cancel_mark: marks a live row's cancel request
               @code TableSql::job @code TableSql::cancel_mark */
            if
            :: st[0] == LIVE -> cr[0] = 1; cancelled[0] = 1; marked = 1
            :: else -> skip
            fi
        }
        if
        :: !marked ->
            atomic {
                /* @step cancel_remove_dead: not live: a dead letter is removed at once
                   @code TableSql::cancel_remove @code operating/jobs.rs::remove */
                if
                :: exists(0) -> st[0] = GONE; cancelled[0] = 1
                :: else -> skip
                fi
            }
        :: else ->
            if
            :: atomic {
                ko == 0 ->
                /* @step cancel_under_key: the key is free: taken, the row removed under it,
                   unlocked
                   @code TableSql::key_lock @code TableSql::cancel_remove
                   @code TableSql::key_unlock */
                if
                :: exists(0) -> st[0] = GONE
                :: else -> skip
                fi
               }
            :: atomic {
                ko != 0 ->
                /* @step cancel_key_held: the key is held: true, the mark stands */
                skip
               }
            fi
        fi
    :: else -> skip
    fi;
    cdone = 1
}

/* I6: once the claimers and the cancel have stopped, no key is held. */
active proctype checker() {
    done == 2 && cdone;
    atomic {
        assert(ko == 0);
        assert(hrow[1] == 0 && hrow[2] == 0)
    }
}

init {
    atomic {
        run claimer(1);
        run claimer(2)
    }
}
