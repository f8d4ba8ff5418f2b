# model: fifo
# defect: finding F2: the renewer renews a lease that has ended (its row unclaimed), after a
# claim counted the group free: two rows of one group in work.
s/^#define TIMELY_RENEWAL 1/#define TIMELY_RENEWAL 0/
