# model: lease
# defect: a cancel that deletes a queued row but not one claimed ahead: a leased row is not
# marked, cancel still says true, and the claim after its hand-back runs it (I4).
s/:: st\[0\] == LIVE && lu\[0\] > c -> cr\[0\] = 1; cancelled\[0\] = 1; ok = 1/:: st[0] == LIVE \&\& lu[0] > c -> cancelled[0] = 1; ok = 1/
