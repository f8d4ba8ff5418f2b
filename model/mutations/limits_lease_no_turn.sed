# model: limits
# defect: a lease claim of a limited table that decides on its first count alone, without
# the table's turn and the count after it: two claims each count what the other has not yet
# committed, and the key has two rows in work with room for one (C7, C1).
s/:: count_at(c) + 1 > room(max) -> rollback(); forget()/:: false -> rollback(); forget()/
