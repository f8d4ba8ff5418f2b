# model: limits
# defect: finding F2: the renewer renews a lease that has ended (its row unclaimed), after a
# claim counted the key's rows in work without it: the key has more rows in work than its max.
s/^#define TIMELY_RENEWAL 1/#define TIMELY_RENEWAL 0/
