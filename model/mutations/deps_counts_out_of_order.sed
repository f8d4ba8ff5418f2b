# model: deps
# defect: a settlement locks the counts of the jobs waiting on its job in another order than
# (table, id) (here parent 1's settlement takes them last first): two settlements of the two
# parents of two waiting children each hold one count and wait for the other's, for ever (a
# deadlock, spin's invalid end state; the database would abort one of them at once).
s/^        count(0); count(1);$/        if :: i == 0 -> count(0); count(1) :: else -> count(1); count(0) fi;/
