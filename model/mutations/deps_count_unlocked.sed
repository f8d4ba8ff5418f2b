# model: deps
# defect: the child's count read and taken down without its row lock: two settlements of its
# two parents each read the count as committed (2) and write 1, neither sees 0, and the child
# waits for ever once both parents settled (D3).
s/(cl\[c\] == 0) ->$/true ->/
s/cl\[c\] = me; mine\[c\] = cnt\[c\] - 1/mine[c] = cnt[c] - 1/
