# model: limits
# defect: a concurrency slot given back when the row is taken rather than after its
# settlement: another claim takes the slot and a second row of the key while the first is
# still in work (C1).
s/:: st\[r\] == LIVE -> att\[r\]++; wrow\[p\] = r + 1; phase = RUN/:: st[r] == LIVE -> att[r]++; wrow[p] = r + 1; free_slots(); phase = RUN/
