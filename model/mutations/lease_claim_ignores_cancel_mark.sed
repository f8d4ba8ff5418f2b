# model: lease
# defect: a claim that does not read the cancel mark: a row cancelled while a process that
# then died held it is run again once its lease expires (I4).
s/^            mark = cr\[r\];$/            mark = 0;/
