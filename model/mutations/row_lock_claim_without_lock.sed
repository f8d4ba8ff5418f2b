# model: row_lock
# defect: a claim that selects without FOR UPDATE: a plain SELECT reserves nothing, so two
# claims take the same row and both handlers run (I1).
s/ && due\[0\] && lk\[0\] == 0 -> r = 0/ \&\& due[0] -> r = 0/
s/ && due\[1\] && lk\[1\] == 0 -> r = 1/ \&\& due[1] -> r = 1/
s/^            lk\[r\] = p;$/            skip;/
s/^            assert(lk\[r\] == p);  *\/\* I2 \*\/$/            skip;/
