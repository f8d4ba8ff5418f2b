# model: lease
# defect: a claim that counts the attempt in the wrong place: the lease claim leaves the
# count to the retry and dead letter (as the row lock form does), so a crash spends nothing
# and a poison row that kills its process is never dead-lettered (I3).
s/^            att\[r\]++;  *\/\* counted at claim \*\/$/            skip;/
s/^        :: out == RETRY ->  /        :: out == RETRY -> att[r]++;/
s/^        :: out == DEADL -> st\[r\] = DEAD /        :: out == DEADL -> st[r] = DEAD; att[r]++ /
