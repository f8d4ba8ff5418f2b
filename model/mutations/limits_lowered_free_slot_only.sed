# model: limits
# defect: after a max is lowered, the room check looks only for a free slot below the new max
# and does not count the slots held above it (the code's defect before the slot space: max 4
# with four rows in work lowered to 2, each ack let a new claim in): a claim by the new max
# takes a row while as many rows as the new max hold slots (C7).
s/:: rspace > room(rmax) && cleanv\[p\] != rv\[p\] ->/:: false ->/
