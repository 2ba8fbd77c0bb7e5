/*
** The MPI backend's allreduce over servers (rp_comm_set_servers): ranks in
** consecutive runs of k share a server's fast links, and the link between
** servers is the slow one. A flat ring moves 2 (m - 1) / m of the buffer
** each way across it; this moves it once each way, and the two ways at
** once:
**
**   1. inside each server, member r gathers chunk r of its server's k
**      buffers (fast links);
**   2. along the servers, chunk r's owner on server j adds its server's k
**      values, in rank order, to the partial sum server j - 1 sent, and sends
**      the result on; the last server's sums are the totals, sent back down
**      the chain. Both go in pieces, so that one piece's total travels back
**      while the next one's partial travels forward;
**   3. inside each server, the owners all-gather their chunks.
**
** Each element is summed in rank order, ((g_0 + g_1) + g_2) + ..., the local
** backend's order: an MPI run with servers gives the bits of the same run on
** threads (a flat MPI_Allreduce of more than two ranks groups its sums its
** own way).
*/
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_impl.h"

/* Floats a piece of the chain carries: small enough that the pipeline
** fills in a few pieces (64 KB crosses a 100 Mbit link in 5 ms), large
** enough that its messages' overhead stays small. */
enum { PIECE = 16384 };

/* Room for the scratch floats and requests of a call; kept between calls
** (a run's reductions repeat their sizes: allocated by the first). */
static rp_status reserve(mpi_servers *h, size_t floats, int reqs, rp_error *err) {
    if (floats > h->nbuf) {
        float *b = realloc(h->buf, sizeof(float) * floats);
        if (!b)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for a reduction over servers");
        h->buf = b, h->nbuf = floats;
    }
    if (reqs > h->nreq) {
        MPI_Request *q = realloc(h->req, sizeof(MPI_Request) * reqs);
        if (!q)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for a reduction over servers");
        h->req = q, h->nreq = reqs;
    }
    return RP_OK;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

rp_status rpi_mpi_servers_allreduce(MPI_Comm x, int size, int rank, mpi_servers *h, float *buf,
                                    size_t n, rp_error *err) {
    int k = h->per_server, q = size / k, j = rank / k, r = rank % k, rc = MPI_SUCCESS;
    size_t cs = (n + (size_t)k - 1) / (size_t)k;
    size_t lo = min_size((size_t)r * cs, n), len = min_size(lo + cs, n) - lo;
    size_t pieces = (len + PIECE - 1) / PIECE;
    /* the others' chunk r, then the partial sums received and sent */
    float *other = NULL, *in = NULL, *out = NULL;
    rp_status st = reserve(h, (size_t)(k + 1) * (cs ? cs : 1), (int)(2 * k + 4 * pieces), err);
    if (st)
        return st;
    other = h->buf, in = other + (size_t)(k - 1) * cs, out = in + cs;
    MPI_Request *req = h->req;
    int nr = 0;
    /* 1: chunk r of every buffer of this server, here */
    for (int t = 0; t < k && rc == MPI_SUCCESS; t++) {
        if (t == r)
            continue;
        size_t tlo = min_size((size_t)t * cs, n), tlen = min_size(tlo + cs, n) - tlo;
        float *slot = other + (size_t)(t < r ? t : t - 1) * cs;
        rc = MPI_Irecv(slot, (int)len, MPI_FLOAT, j * k + t, 1, x, &req[nr++]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(buf + tlo, (int)tlen, MPI_FLOAT, j * k + t, 1, x, &req[nr++]);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Waitall(nr, req, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
        return rpi_mpi_error(rc, "gather inside a server", err);
    /* 2: the chain; receives posted first, tags 2 forward and 3 back */
    int down = (j - 1) * k + r, up = (j + 1) * k + r;
    MPI_Request *fwd = req, *back = req + pieces, *sent = req + 2 * pieces;
    int nsent = 0;
    for (size_t p = 0; p < pieces && rc == MPI_SUCCESS; p++) {
        size_t at = p * PIECE, m = min_size(len - at, PIECE);
        fwd[p] = back[p] = MPI_REQUEST_NULL;
        if (j > 0)
            rc = MPI_Irecv(in + at, (int)m, MPI_FLOAT, down, 2, x, &fwd[p]);
        if (rc == MPI_SUCCESS && j < q - 1)
            rc = MPI_Irecv(buf + lo + at, (int)m, MPI_FLOAT, up, 3, x, &back[p]);
    }
    float *const mine = buf + lo;
    for (size_t p = 0; p < pieces && rc == MPI_SUCCESS; p++) {
        size_t at = p * PIECE, m = min_size(len - at, PIECE);
        if (j > 0 && (rc = MPI_Wait(&fwd[p], MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            break;
        /* this server's values in rank order, after the servers' below */
        float *acc = j < q - 1 ? out + at : mine + at; /* the last server's are the totals */
        for (size_t e = 0; e < m; e++) {
            float v = j > 0 ? in[at + e] : (r == 0 ? mine[at + e] : other[at + e]);
            for (int t = j > 0 ? 0 : 1; t < k; t++)
                v += t == r ? mine[at + e] : other[(size_t)(t < r ? t : t - 1) * cs + at + e];
            acc[e] = v;
        }
        if (j < q - 1)
            rc = MPI_Isend(acc, (int)m, MPI_FLOAT, up, 2, x, &sent[nsent++]);
        else if (j > 0)
            rc = MPI_Isend(acc, (int)m, MPI_FLOAT, down, 3, x, &sent[nsent++]);
    }
    /* the totals coming back, passed on down */
    for (size_t p = 0; p < pieces && rc == MPI_SUCCESS && j < q - 1; p++) {
        size_t at = p * PIECE, m = min_size(len - at, PIECE);
        if ((rc = MPI_Wait(&back[p], MPI_STATUS_IGNORE)) == MPI_SUCCESS && j > 0)
            rc = MPI_Isend(mine + at, (int)m, MPI_FLOAT, down, 3, x, &sent[nsent++]);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Waitall(nsent, sent, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
        return rpi_mpi_error(rc, "sum between servers", err);
    /* 3: every owner's totals to the others of its server */
    nr = 0;
    for (int t = 0; t < k && rc == MPI_SUCCESS; t++) {
        if (t == r)
            continue;
        size_t tlo = min_size((size_t)t * cs, n), tlen = min_size(tlo + cs, n) - tlo;
        rc = MPI_Irecv(buf + tlo, (int)tlen, MPI_FLOAT, j * k + t, 4, x, &req[nr++]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(mine, (int)len, MPI_FLOAT, j * k + t, 4, x, &req[nr++]);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Waitall(nr, req, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "all-gather inside a server", err);
}
