# model: lease
# defect: the unclaim that ignores a cancel mark: a row claimed ahead, cancelled, then handed
# back goes back into the queue unleased with its mark (I5), instead of ending as cancelled.
/:: out == UNCLAIM ->/,/fi;/ s/:: cr\[r\] -> st\[r\] = GONE/:: cr[r] -> skip/
