/*
 * The lease form's protocol (src/consuming/form/lease.rs), checked by spin.
 *
 * Two subscriptions (claimers; each its own process, so a crash loses its memory and none of
 * the database's) claim two rows of one table, hand them back or run their handlers, renew,
 * extend, checkpoint and settle them, while an operator cancels row 0 and the clock runs.
 * A claimer may crash at any step (MAXCRASH) and come back as a new process, and the answer
 * of a statement may never arrive (MAXLOST): a claim whose rows are never delivered, a
 * renewal whose outcome is unknown, a settlement that committed but reported a lost
 * connection.
 *
 * The database is a set of atomic statements: each atomic/d_step block that reads or writes
 * the rows is one statement (PostgreSQL's one-statement claim, MySQL's locking select and
 * update in one READ COMMITTED transaction, SQLite's one writer all behave so); the
 * process-local work around it is folded into the same step. Time is whole ticks (the code's
 * whole seconds): a claim at tick `now` writes the token `now + L`, and a row is free again
 * once `locked_until <= now`.
 *
 * Every step names what it stands for: "@step <name>" is what the code's doc comments point at
 * ("Modelled in model/lease.pml (<name>)"), "@code <item>" a field of TableSql (or LimitSql,
 * RegistrySql), a method of Dialect (src/dialect/mod.rs), or <file under src/>::<function>.
 * tests/model_refs.rs checks both directions.
 *
 * Invariants (the monitor and the asserts):
 *   I1 no two live handlers of one row: two handlers of a row never both run within their
 *      leases (each handler's token, as it knows it, ahead of the clock);
 *   I2 a fenced statement (settlement, hand-back, renewal, extension, checkpoint) only takes
 *      effect for the claim that holds the row (ghost `holder`): a late one changes nothing;
 *   I3 attempts are counted at claim: a row's attempts are its claims less its hand-backs;
 *   I4 a cancelled job never starts again: no claim committed after cancel became true
 *      (ghost `cancelled`, set by the statement that made it true) reaches a handler;
 *   I5 a cancel mark is never put back in the queue: a live marked row always holds a lease
 *      (so the claim after its expiry, which reads the mark, ends it);
 *   I6 no row lost: once everything stopped, every row is finished (acked, dead-lettered,
 *      cancelled) or live and claimable when its lease ends, and nothing holds it.
 */

#define NR 2            /* rows */
#define L 2             /* lease, in ticks */
#ifndef TMAX
#define TMAX 3          /* the clock stops here */
#endif
#ifndef ROUNDS
#define ROUNDS 1        /* claims per claimer life */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXLOST
#define MAXLOST 1
#endif
#ifndef WRITES
#define WRITES 1        /* the handler's own extend and checkpoint */
#endif
#ifndef FIX_RERUN
#define FIX_RERUN 1     /* the code since finding F1 (README); 0: the defect */
#endif
#ifndef CANCELS
#define CANCELS 1       /* the operator's cancel of row 0 */
#endif

/* row states: a finished row is kept with its state (a deleted row matches nothing) */
#define LIVE 0
#define GONE 1          /* acked or cancelled: deleted (or kept completed: finished) */
#define DEAD 2          /* dead-lettered: kept, finished */

/* what a claimer is doing */
#define IDLE 0
#define AHEAD 1         /* claimed, waiting in the subscription's buffer */
#define RUN 2           /* its handler runs */
#define SETTLE 3        /* its settlement's first statement is next */
#define AGAIN 4         /* the first statement's answer was lost: run it again */
#define NEXT 5          /* then the next token, if any */

/* outcomes */
#define ACK 1
#define RETRY 2
#define DEADL 3
#define UNCLAIM 4

byte st[NR];            /* dead_at (and deleted) */
byte lu[NR];            /* locked_until: 0 is NULL */
byte att[NR];           /* attempts */
bit cr[NR];             /* cancel_requested */
byte now = 1;           /* the clock */

/* ghosts */
byte claims[NR];        /* claims committed, less hand-backs */
byte holder[NR];        /* who holds the row: a claimer's id (0: nobody) */
bit cancelled[NR];      /* cancel is true */
byte hrow[3];           /* row + 1 while claimer 1 or 2 runs its handler */
byte tok[3];            /* its token as it knows it (the cell's state.token) */
byte uns[3];            /* a renewal's token whose answer was lost (state.unsure; one kept) */
bit crash[3];
bit fin[3];
byte crashes, lost, done;
bit cdone;

#define exists(r) (st[r] == LIVE || st[r] == DEAD)
#define free(r) (lu[r] == 0 || lu[r] <= now)

#define I1 (!(hrow[1] != 0 && hrow[1] == hrow[2] && tok[1] > now && tok[2] > now))
#define I3 (att[0] == claims[0] && att[1] == claims[1])
#define I5 (!(cr[0] && st[0] == LIVE && lu[0] == 0) && !(cr[1] && st[1] == LIVE && lu[1] == 0))

active proctype monitor() {
end:
    if
    :: !I1 -> assert(I1)
    :: !I3 -> assert(I3)
    :: !I5 -> assert(I5)
    fi
}

active proctype clock() {
    do
    :: now < TMAX -> now++
    :: else -> break
    od
}

/* A claimer's process dies at its next step; the database keeps its leases. */
active proctype crasher() {
    do
    :: atomic { crashes < MAXCRASH && !fin[1] -> crash[1] = 1; crashes++ }
    :: atomic { crashes < MAXCRASH && !fin[2] -> crash[2] = 1; crashes++ }
    :: break
    od
}

/*
 * One fenced statement for token `tk`: it matches only a row still holding `tk` (every
 * statement that finishes a row or clears its lease writes locked_until NULL, so a finished
 * row matches nothing).
 */
inline fenced(tk) {
    if
    :: tk != 0 && lu[r] == tk ->
        assert(holder[r] == me);                                /* I2 */
        if
        :: out == ACK -> st[r] = GONE       /* @code TableSql::ack @code TableSql::cancel_held */
        :: out == RETRY ->                                      /* @code TableSql::retry */
            if                                  /* @code dialect/shared.rs::cancelled_case */
            :: cr[r] -> st[r] = GONE
            :: else -> skip
            fi
        :: out == DEADL -> st[r] = DEAD                         /* @code TableSql::dead */
        :: out == UNCLAIM ->                                    /* @code TableSql::unclaim */
            att[r]--; claims[r]--;
            if
            :: cr[r] -> st[r] = GONE
            :: else -> skip
            fi
        fi;
        lu[r] = 0;
        holder[r] = 0;
        ok = 1
    :: else -> ok = 0
    fi
}

inline forget() {
    phase = IDLE; r = 0; out = 0; ok = 0; mark = 0; cbc = 0; ext = 0; cp = 0;
    tok[p] = 0; uns[p] = 0; hrow[p] = 0
}

proctype claimer(byte p) {
    byte phase, r, out, me, rounds;
    bit ok, mark, cbc, ext, cp;
    me = p;
life:
    {
    do
    :: phase == IDLE && rounds == ROUNDS -> break
    :: atomic {
        phase == IDLE && rounds < ROUNDS ->
        /* @step claim: leases a free row (no lease, or an expired one) to now + L, counts
           its attempt, returns it with its cancel mark
           @code TableSql::claim @code TableSql::claim_from @code TableSql::claim_one
           @code Dialect::lease_claim @code consuming/form/lease.rs::claim
           @code consuming/form/lease.rs::book */
        rounds++;
        if
        :: st[0] == LIVE && free(0) -> r = 0
        :: st[1] == LIVE && free(1) -> r = 1
        :: else -> r = NR
        fi;
        if
        :: r < NR ->
            lu[r] = now + L;
            att[r]++;                                           /* counted at claim */
            claims[r]++;
            holder[r] = me;
            tok[p] = lu[r];
            mark = cr[r];
            cbc = cancelled[r];
            phase = AHEAD;
            if
            :: lost < MAXLOST ->
                /* @step claim_lost: committed, the answer never arrived: the row stays
                   leased, its attempt spent, until the lease ends */
                lost++;
                forget()
            :: skip
            fi
        :: else -> r = 0
        fi
       }
    :: atomic {
        phase == AHEAD && mark ->
        /* @step end_cancelled: a row whose cancel was requested while an earlier claim held
           it is ended as that claim's retry would end it
           @code consuming/claimer.rs::sort @code consuming/claimer.rs::end_cancelled */
        out = RETRY; phase = SETTLE
       }
    :: atomic {
        phase == AHEAD && !mark ->
        /* @step hand_back: claimed ahead, then the subscription closed: the lease cleared,
           the attempt given back, fenced
           @code consuming/form/lease.rs::hand_back @code consuming/form/mod.rs::hand_back */
        out = UNCLAIM; phase = SETTLE
       }
    :: atomic {
        phase == AHEAD && !mark ->
        /* @step handler: the delivery reaches its handler */
        assert(!cbc);                                           /* I4 */
        hrow[p] = r + 1; phase = RUN
       }
    :: atomic {
        phase == RUN && (tok[p] < now + L || uns[p] != 0) ->
        /* @step renew: the renewer rewrites the token held, or a renewal's whose answer was
           lost, to now + L (the cell's lock keeps it apart from the delivery's statements);
           its answer may be lost whether it committed or not
           @code runtime/renewer.rs::round @code runtime/renewer.rs::renew_chunk
           @code Dialect::lease_renew @code model/schedule.rs::renewal_is_ours */
        if
        :: (tok[p] != 0 && lu[r] == tok[p]) || (uns[p] != 0 && lu[r] == uns[p]) ->
            assert(holder[r] == me);                            /* I2 */
            lu[r] = now + L;
            if
            :: tok[p] = now + L; uns[p] = 0                     /* renewed */
            :: lost < MAXLOST ->                                /* committed, answer lost */
                lost++;
                if
                :: now < tok[p] -> uns[p] = now + L             /* renewal_is_ours */
                :: else -> skip
                fi
            fi
        :: else -> skip                                         /* not renewed: lost */
        fi
       }
    :: atomic {
        phase == RUN && (tok[p] < now + L || uns[p] != 0) && lost < MAXLOST ->
        /* @step renew_unsent: the connection died before the renewal ran */
        lost++;
        if
        :: now < tok[p] -> uns[p] = now + L
        :: else -> skip
        fi
       }
    :: atomic {
        phase == RUN && WRITES && !ext ->
        /* @step extend: the handler moves its deadline to until.max(token), fenced by each
           token it may hold in turn (one statement each; here, one step)
           @code consuming/form/lease.rs::extend @code TableSql::extend */
        ext = 1;
        if
        :: (tok[p] != 0 && lu[r] == tok[p]) || (uns[p] != 0 && lu[r] == uns[p]) ->
            assert(holder[r] == me);                            /* I2 */
            if
            :: tok[p] < now + L + 1 -> lu[r] = now + L + 1
            :: else -> lu[r] = tok[p]
            fi;
            tok[p] = lu[r]; uns[p] = 0
        :: else -> skip                                         /* LeaseLost */
        fi
       }
    :: atomic {
        phase == RUN && WRITES && !cp ->
        /* @step checkpoint: the handler saves its progress, fenced by each token it may hold
           in turn; the token that matched becomes the one held
           @code consuming/form/lease.rs::checkpoint @code TableSql::checkpoint_write */
        cp = 1;
        if
        :: tok[p] != 0 && lu[r] == tok[p] -> assert(holder[r] == me)
        :: uns[p] != 0 && lu[r] == uns[p] ->
            assert(holder[r] == me);                            /* I2 */
            tok[p] = uns[p]; uns[p] = 0
        :: else -> skip                                         /* LeaseLost */
        fi
       }
    :: atomic {
        phase == RUN ->
        /* @step outcome: the handler returns: ack (or cancel, which ends the row as the ack
           does), retry (a failure too) or dead letter */
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
        /* @step settle: the outcome's statement, fenced by the token held
           @code consuming/form/lease.rs::settle @code consuming/form/lease.rs::fenced
           @code consuming/form/lease.rs::fenced_on @code consuming/form/lease.rs::ack
           @code consuming/form/lease.rs::write_cells @code Dialect::lease_ack_many
           @code TableSql::ack @code TableSql::retry @code TableSql::dead
           @code TableSql::cancel_held @code TableSql::unclaim */
        fenced(tok[p]);
        if
        :: ok && lost < MAXLOST ->
            /* @step settle_lost: committed, the answer lost: run again on a new connection
               (FIX_RERUN: not a statement that leaves the row claimable) */
            lost++;
            if
            :: FIX_RERUN && (out == RETRY || out == UNCLAIM) -> forget()
            :: else -> phase = AGAIN
            fi
        :: ok -> forget()
        :: !ok -> phase = NEXT
        fi
       }
    :: atomic {
        phase == AGAIN ->
        /* @step settle_again: the same statement, same token, on a new connection
           @code consuming/form/lease.rs::fenced_on @code consuming/form/lease.rs::ack_alone */
        fenced(tok[p]);
        if
        :: ok -> forget()
        :: else -> phase = NEXT
        fi
       }
    :: atomic {
        phase == NEXT ->
        /* @step settle_unsure: then with the token of a renewal whose answer was lost
           @code consuming/form/lease.rs::tokens_of @code consuming/form/lease.rs::fenced_on */
        if
        :: uns[p] != 0 -> fenced(uns[p])
        :: else -> skip
        fi;
        forget()
       }
    od
    } unless {
        /* @step crash: the process dies; its leases stay until they end */
        atomic { crash[p] -> crash[p] = 0; forget(); me = me + 2 }
    };
    if
    :: !fin[p] && phase == IDLE && rounds == ROUNDS -> skip
    :: else -> goto life
    fi;
    atomic { fin[p] = 1; done++ }
}

/*
 * The operator's cancel of row 0: remove it if it is not leased, else mark it; between the
 * two a lease may begin or end, so the pair runs again (twice here; the code: up to eight
 * times, then a transient error). Each round compares leases with the time it read first.
 * @step cancel @code operating/jobs.rs::cancel_lease
 */
active proctype canceller() {
    byte c, i;
    bit ok;
    i = 2 - 2 * CANCELS;
    do
    :: i == 2 -> break
    :: i < 2 ->
        atomic {
            /* @step cancel_remove: deletes the row (live or dead-lettered) if it is not
               leased
               @code TableSql::cancel_remove @code operating/jobs.rs::remove */
            i++;
            c = now;
            if
            :: exists(0) && (lu[0] == 0 || lu[0] <= c) ->
                st[0] = GONE; lu[0] = 0; cancelled[0] = 1; ok = 1
            :: else -> ok = 0
            fi
        }
        if
        :: ok -> break
        :: else -> skip
        fi;
        atomic {
            /* @step cancel_mark: marks a live, leased row
               @code TableSql::cancel_mark */
            if
            :: st[0] == LIVE && lu[0] > c -> cr[0] = 1; cancelled[0] = 1; ok = 1
            :: else -> ok = 0
            fi
        }
        if
        :: ok -> break
        /* @step cancel_lookup: gone or completed: false; else again
           @code TableSql::job */
        :: !exists(0) -> break
        :: else -> skip
        fi
    od;
    cdone = 1
}

/* I6: once the claimers and the cancel have stopped, no row is stranded. */
active proctype checker() {
    done == 2 && cdone;
    atomic {
        assert(hrow[1] == 0 && hrow[2] == 0);
        /* a live row is free once its lease ends: nothing renews it any more */
        assert(st[0] != LIVE || !cr[0] || lu[0] != 0);
        assert(st[1] != LIVE || !cr[1] || lu[1] != 0)
    }
}

init {
    atomic {
        run claimer(1);
        run claimer(2)
    }
}
