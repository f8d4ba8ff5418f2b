# model: deps
# defect: a settlement takes the waiting child's count down by two: the first parent's
# settlement releases the child while the other parent is still live (D2), or a count taken
# below 0 leaves the child waiting for ever (D3).
s/cl\[c\] = me; mine\[c\] = cnt\[c\] - 1/cl[c] = me; mine[c] = cnt[c] - 2/
