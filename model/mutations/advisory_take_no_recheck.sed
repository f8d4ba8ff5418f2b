# model: advisory
# defect: an advisory take that does not check again, under the key, that the row is still
# claimable: a row the previous key holder dead-lettered after this claim read its candidates
# is taken and delivered again (double delivery, I7).
/phase == TAKE ->/,/takes\[r\]++/ s/:: st\[r\] == LIVE ->/:: exists(r) ->/
