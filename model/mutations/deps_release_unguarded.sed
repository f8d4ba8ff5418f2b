# model: deps
# defect: the release does not check that the child still waits (`run_at` at the latest time
# and no `dead_at`): an `after` child dead-lettered when one parent failed is released by the
# other parent's ack, and a dead letter runs (D2).
s/:: rel\[c\] && cst\[c\] == WAITING -> release(c)/:: rel[c] -> release(c)/
