# model: row_lock
# defect: a claim that counts the attempt in the wrong place: the row lock claim commits the
# count at claim (as the lease form does), so a crash, a lost session or a hand-back spends
# an attempt the rollback should have undone (I3).
s/^            lk\[r\] = p;$/            lk[r] = p; att[r]++;/
