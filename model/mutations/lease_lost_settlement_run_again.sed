# model: lease
# defect: finding F1: a retry or hand-back whose answer was lost is run again on a new
# connection; it committed and left the row claimable, a claim in the same second wrote the
# same token, and the second run clears that claim's lease while its handler runs (I1, I2).
s/^#define FIX_RERUN 1 .*/#define FIX_RERUN 0/
