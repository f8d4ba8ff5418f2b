# model: fifo
# defect: the FIFO lease claim in one statement (or a take that checks only the row itself,
# not that it is still its group's head with no row of the group leased): a claim of the same
# group committed between its snapshot and its group lock, with publishes committed out of id
# order, leads to a second row of the group in work (F1) out of order (F2).
/phase == TAKE ->/,/F2/ s/:: claimable(r) ->/:: live(r) \&\& free(r) ->/
