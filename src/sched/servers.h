/*
** One rule, used by the engine and the simulator: when a reduction sums
** over servers (workers_per_server, rp_comm_set_servers).
*/
#ifndef REPIPE_SERVERS_H
#define REPIPE_SERVERS_H

/* A reduction's members (ascending worker ids) on servers of per_server
** consecutive workers: the members each server holds when every server of
** theirs holds as many, two or more, on two servers or more (the
** allreduce over servers applies); else 0 (flat). */
static inline int rpi_per_server(const int *members, int n, int per_server) {
    if (per_server < 1)
        return 0;
    int k = 0, q = 0; /* members a server, the same on each; servers */
    for (int i = 0, run = 0; i < n; i++) {
        run++;
        if (i + 1 == n || members[i + 1] / per_server != members[i] / per_server) {
            if (k && run != k)
                return 0;
            k = run, run = 0, q++;
        }
    }
    return q > 1 && k > 1 ? k : 0;
}

#endif /* REPIPE_SERVERS_H */
