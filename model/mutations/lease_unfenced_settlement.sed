# model: lease
# defect: the unfenced lease settlement: ack and retry match the row by its id alone, not by
# the token the delivery holds. A handler whose lease expired settles the claim that took the
# row after it (I2; then two handlers at once, I1).
/^inline fenced(tk)/,/^}/ s/^    :: tk != 0 && lu\[r\] == tk ->/    :: (tk != 0 \&\& lu[r] == tk) || ((out == ACK || out == RETRY) \&\& exists(r)) ->/
