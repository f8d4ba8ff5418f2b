# model: limits
# defect: a key found holding no slot above a lowered max is noted clean at once, while a
# claim of another process that read the record before the change may still take a slot
# above the max (the code keeps the note only once its broker has known the record twice
# CLAIM_STALE): later claims skip the count and a claim by the new max takes a row while as
# many rows as the new max hold slots (C7).
s/:: rv\[p\] == ver + 1 && no_old_reading -> cleanv\[p\] = rv\[p\]/:: rv[p] == ver + 1 -> cleanv[p] = rv[p]/
