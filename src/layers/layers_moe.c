/*
** moe: a mixture of E SwiGLU experts on (T x C) samples (or C features, T =
** 1), each token sent to K of them by a router,
**
**     s = Wr x                        (E scores; Wr is E x C)
**     u = softmax(s), or sigmoid(s)   (gate=softmax: Mixtral's, Qwen3's;
**                                      gate=sigmoid: DeepSeek-V3's)
**     S = the K largest u, best first (ties: the lower expert)
**     g_i = u_i / sum_{j in S} u_j    (norm=false: g_i = u_i), i in S
**     out = sum_{i in S} g_i W2_i (silu(W1_i x) * (W3_i x))
**
** and, where balance=alpha > 0, DeepSeek-V3's sequence-wise balance loss
** (its report's eqs. 17-20), one a sample of T tokens:
**
**     f_i = E / (K T) x (tokens of the sample that chose i)
**     P_i = 1 / T x sum_t u'_it,  u'_t = u_t / sum_j u_jt
**     L   = alpha sum_i f_i P_i
**
** added to the step's objective with the loss's weight (loss_scale: one
** over the update's samples), so that an update is still the mean over its
** samples and splitting them into micro-batches or replicas changes no sum.
** The loss is in the gradients, not in the reported loss (Megatron-LM too
** logs its balance loss apart from the language model's).
**
** The router runs in double precision (Megatron-LM's --moe-router-dtype
** fp64): which experts a token chooses is a comparison of scores, and float
** rounding alone should not move a token from one expert to another between
** two runs that differ only in how their rows were grouped. The experts run
** in float through BLAS, one product per expert over the tokens it was
** given, gathered in token order.
**
** Parameters: the router (E x C), then each expert's w1 (F x C), w3 (F x C)
** and w2 (C x F): an expert's are contiguous, so a range of experts is a
** range of the layer's parameters.
**
** Expert parallelism (a->ep_size = G > 1): member j of the group owns
** experts [j E / G, (j + 1) E / G). A member routes its own tokens, sends
** each (token, expert) pair's row and gate to the expert's owner (one
** all-to-all), the owner runs its experts over the rows of every member,
** in member order, and sends the outputs back (a second); backward sends
** the outputs' gradients to the owners and the inputs' and gates'
** gradients back the same way. Rows are padded to the most a member can
** send (every pair to one owner): no token is dropped. An owner's expert
** sees the group's rows in the order one worker would see them were the
** members' micro-batches one, so its products are the same sums; its
** weights' gradients hold every member's tokens, the others' copies of them
** zeros, and the replicas' all-reduce makes them whole everywhere.
*/
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "layers_impl.h"

typedef struct moe_dims {
    int E, K, F, C, T;
    size_t N;  /* tokens: rows x T */
    int G, El; /* the expert-parallel group's members, the experts of one */
    size_t SD; /* floats of a dispatched block: a count, then rows of x, gate, expert */
} moe_dims;

static moe_dims dims_of(const rp_layer *L, int B, int G) {
    moe_dims d = {L->experts, L->top_k, L->ffn, L->in.dim[L->in.ndim - 1],
                  L->in.ndim == 2 ? L->in.dim[0] : 1, 0, G > 1 ? G : 1, 0, 0};
    d.N = (size_t)B * d.T;
    d.El = d.E / d.G;
    d.SD = 1 + d.N * d.K * ((size_t)d.C + 2);
    return d;
}

/* The aux state, in this order: the scores u (N x E doubles), the gates
** (N x K doubles), the chosen experts (N x K ints), the (token, slot)
** pairs ordered by expert (N x K), where each expert's start (E + 1), and
** w1 x and w3 x of each row an expert ran (G N K x F floats each). With
** expert parallelism, the rows received (G blocks of SD floats), and the
** owner's rows by local expert (G N K ints: member x N K + row) and each
** local expert's start (El + 1). */
typedef struct moe_state {
    double *u, *gate;
    int *chosen, *pairs, *start;
    float *a, *b, *recv;
    int *orow, *ostart;
} moe_state;

#define ALIGN8(n) (((n) + 7) & ~(size_t)7)

static size_t int_bytes(const moe_dims *d) {
    size_t NK = d->N * d->K;
    return ALIGN8(sizeof(int) * (2 * NK + d->E + 1 + (d->G > 1 ? d->G * NK + d->El + 1 : 0)));
}

size_t rpi_moe_aux_bytes(const rp_layer *L, int B, int G) {
    moe_dims d = dims_of(L, B, G);
    size_t NK = d.N * d.K;
    return sizeof(double) * (d.N * d.E + NK) + int_bytes(&d) +
           sizeof(float) * (2 * d.G * NK * d.F + (d.G > 1 ? d.G * d.SD : 0));
}

static moe_state state_of(const moe_dims *d, void *aux) {
    size_t NK = d->N * d->K;
    moe_state s;
    s.u = aux;
    s.gate = s.u + d->N * d->E;
    s.chosen = (int *)(s.gate + NK);
    s.pairs = s.chosen + NK;
    s.start = s.pairs + NK;
    s.orow = s.start + d->E + 1;
    s.ostart = s.orow + d->G * NK;
    s.a = (float *)((char *)s.chosen + int_bytes(d));
    s.b = s.a + d->G * NK * d->F;
    s.recv = s.b + d->G * NK * d->F;
    return s;
}

/* Scratch: backward's gates' and scores' gradients (doubles), an expert's
** gathered rows and its products (at most every token of the group, as a
** token goes to an expert once), and the all-to-alls' two buffers. */
static size_t expert_scratch(const moe_dims *d) { /* rows_of's for the most rows */
    return d->G * d->N * (2 * (size_t)d->C + 3 * (size_t)d->F + 3) + 8;
}

size_t rpi_moe_scratch(const rp_layer *L, int B, int G) {
    moe_dims d = dims_of(L, B, G);
    return 2 * d.N * ((size_t)d.E + d.K) + expert_scratch(&d) + (d.G > 1 ? 2 * d.G * d.SD : 0);
}

void rpi_moe_route(const rp_layer *L, const double *s, size_t R, double *u, int *chosen,
                   double *gate) {
    int E = L->experts, K = L->top_k;
    for (size_t r = 0; r < R; r++) {
        const double *z = s + r * E;
        double *p = u + r * E;
        if (L->gate_sigmoid) {
            for (int i = 0; i < E; i++)
                p[i] = 1.0 / (1.0 + exp(-z[i]));
        } else {
            double m = z[0], sum = 0;
            for (int i = 1; i < E; i++)
                m = z[i] > m ? z[i] : m;
            for (int i = 0; i < E; i++)
                sum += p[i] = exp(z[i] - m);
            for (int i = 0; i < E; i++)
                p[i] /= sum;
        }
        /* the K best by repeated selection: K is small, and ties go to the
        ** lower expert whatever the order of the search */
        int *c = chosen + r * K;
        double *g = gate + r * K, total = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int i = 0; i < E; i++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken = taken || c[j] == i;
                if (!taken && (best < 0 || p[i] > p[best]))
                    best = i;
            }
            c[k] = best;
            total += g[k] = p[best];
        }
        for (int k = 0; L->gate_norm && k < K; k++)
            g[k] /= total;
    }
}

/* Over each sample's T tokens: how many chose each expert (E ints). */
static void choices(const rp_layer *L, const int *chosen, int T, int *count) {
    memset(count, 0, sizeof(int) * L->experts);
    for (size_t i = 0; i < (size_t)T * L->top_k; i++)
        count[chosen[i]]++;
}

/* u'_it: the scores over their sum (a softmax's sum to one already). */
static double normalised(const rp_layer *L, const double *p, int i) {
    if (!L->gate_sigmoid)
        return p[i];
    double sum = 0;
    for (int j = 0; j < L->experts; j++)
        sum += p[j];
    return p[i] / sum;
}

double rpi_moe_balance_loss(const rp_layer *L, const double *u, const int *chosen, size_t R,
                            int T) {
    int E = L->experts, K = L->top_k, count[1 << 12];
    double loss = 0;
    for (size_t b = 0; b < R / T; b++) {
        choices(L, chosen + b * T * K, T, count);
        for (int i = 0; i < E; i++) {
            double P = 0;
            for (int t = 0; t < T; t++)
                P += normalised(L, u + (b * T + t) * E, i) / T;
            loss += L->balance * ((double)E / ((double)K * T) * count[i]) * P;
        }
    }
    return loss;
}

void rpi_moe_route_backward(const rp_layer *L, const double *u, const int *chosen,
                            const double *gate, const double *dgate, double weight, size_t R,
                            int T, double *ds) {
    int E = L->experts, K = L->top_k, count[1 << 12];
    for (size_t r = 0; r < R; r++) {
        const double *p = u + r * E, *g = gate + r * K, *dg = dgate + r * K;
        const int *c = chosen + r * K;
        double *du = ds + r * E; /* the scores' gradient first, then the logits' in place */
        memset(du, 0, sizeof(double) * E);
        /* the gates: g_k = u_k / Z over the chosen, or u_k */
        double z = 0, gdg = 0;
        for (int k = 0; k < K; k++)
            z += p[c[k]], gdg += g[k] * dg[k];
        for (int k = 0; k < K; k++)
            du[c[k]] += L->gate_norm ? (dg[k] - gdg) / z : dg[k];
        /* the balance loss: dL/du'_i = weight alpha f_i / T */
        if (L->balance > 0) {
            if (r % T == 0)
                choices(L, chosen + r * K, T, count);
            double w = 0, sum = 0, da[1 << 12];
            for (int i = 0; i < E; i++)
                da[i] = weight * L->balance * ((double)E / ((double)K * T) * count[i]) / T;
            for (int i = 0; L->gate_sigmoid && i < E; i++)
                sum += p[i], w += da[i] * p[i];
            for (int i = 0; i < E; i++)
                du[i] += L->gate_sigmoid ? (da[i] - w / sum) / sum : da[i];
        }
        if (L->gate_sigmoid) {
            for (int i = 0; i < E; i++)
                du[i] *= p[i] * (1 - p[i]);
        } else {
            double pdu = 0;
            for (int i = 0; i < E; i++)
                pdu += p[i] * du[i];
            for (int i = 0; i < E; i++)
                du[i] = p[i] * (du[i] - pdu);
        }
    }
}

/* The (token, slot) pairs by expert, tokens in order within each: a
** counting sort. */
static void order_pairs(const moe_dims *d, moe_state *s) {
    size_t NK = d->N * d->K;
    int at[1 << 12];
    memset(s->start, 0, sizeof(int) * (d->E + 1));
    for (size_t i = 0; i < NK; i++)
        s->start[s->chosen[i] + 1]++;
    for (int e = 0; e < d->E; e++)
        s->start[e + 1] += s->start[e];
    memcpy(at, s->start, sizeof(int) * d->E);
    for (size_t i = 0; i < NK; i++)
        s->pairs[at[s->chosen[i]]++] = (int)i;
}

static const float *expert_weights(const moe_dims *d, const float *w, int e) {
    return w + (size_t)d->E * d->C + (size_t)e * 3 * d->F * d->C;
}

/* Expert e over n gathered rows x: w1 x and w3 x into A and Bm (kept for
** backward), the output into y; h is scratch (n x F). */
static void expert_forward(const moe_dims *d, const float *w, int e, int n, const float *x,
                           float *A, float *Bm, float *h, float *y) {
    const float *w1 = expert_weights(d, w, e), *w3 = w1 + (size_t)d->F * d->C,
                *w2 = w3 + (size_t)d->F * d->C;
    rpi_linear_rows(x, A, w1, NULL, n, d->C, d->F);
    rpi_linear_rows(x, Bm, w3, NULL, n, d->C, d->F);
    rpi_silu_forward(A, h, (size_t)n * d->F);
    for (size_t i = 0; i < (size_t)n * d->F; i++)
        h[i] *= Bm[i];
    rpi_linear_rows(h, y, w2, NULL, n, d->F, d->C);
}

/* Expert e's backward over n gathered rows: x, the output's gradient dy
** (before the gate; spent), each row's gate, A and Bm from forward. Adds to
** the expert's weights' gradients in dw, writes each row's gate gradient
** and (dx not NULL) its input's gradient; t is scratch (3 n F floats). */
static void expert_backward(const moe_dims *d, const float *w, float *dw, int e, int n,
                            const float *x, float *dy, const float *gate, const float *A,
                            const float *Bm, float *t, double *dgate, float *dx) {
    size_t nF = (size_t)n * d->F;
    float *t1 = t, *dh = t1 + nF, *db = dh + nF;
    const float *w1 = expert_weights(d, w, e), *w3 = w1 + (size_t)d->F * d->C,
                *w2 = w3 + (size_t)d->F * d->C;
    float *dw1 = dw + (w1 - w), *dw3 = dw1 + (size_t)d->F * d->C, *dw2 = dw3 + (size_t)d->F * d->C;
    /* h = silu(A) * B again; dh' = dy W2, the gradient of the expert's output
    ** before its gate: the gate's gradient is dh' . h */
    rpi_silu_forward(A, t1, nF);
    for (size_t i = 0; i < nF; i++)
        t1[i] *= Bm[i];
    rpi_linear_rows_backward(NULL, dy, w2, NULL, NULL, dh, true, n, d->F, d->C);
    for (int j = 0; j < n; j++) {
        double g = 0;
        for (int f = 0; f < d->F; f++)
            g += (double)dh[(size_t)j * d->F + f] * t1[(size_t)j * d->F + f];
        dgate[j] = g;
        for (int c = 0; c < d->C; c++)
            dy[(size_t)j * d->C + c] *= gate[j];
        for (int f = 0; f < d->F; f++)
            dh[(size_t)j * d->F + f] *= gate[j];
    }
    rpi_linear_rows_backward(t1, dy, w2, dw2, NULL, NULL, true, n, d->F, d->C);
    /* h = silu(A) B: dB = dh silu(A), dA = silu'(A) dh B */
    rpi_silu_forward(A, t1, nF);
    for (size_t i = 0; i < nF; i++) {
        db[i] = dh[i] * t1[i];
        dh[i] *= Bm[i];
    }
    rpi_silu_backward(A, dh, t1, nF); /* t1: dA */
    rpi_linear_rows_backward(x, t1, w1, dw1, NULL, dx, true, n, d->C, d->F);
    rpi_linear_rows_backward(x, db, w3, dw3, NULL, NULL, true, n, d->C, d->F);
    if (dx)
        rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d->C, d->F, 1.0f, db, d->F, w3,
                  d->C, 1.0f, dx, d->C);
}

/* The router's scores in double, routed: chosen experts, gates, pairs. */
static void route(const layer_args *a, const moe_dims *d, moe_state *s) {
    for (size_t t = 0; t < d->N; t++)
        for (int i = 0; i < d->E; i++) {
            const float *x = a->in + t * d->C, *wr = a->w + (size_t)i * d->C;
            double z = 0;
            for (int c = 0; c < d->C; c++)
                z += (double)x[c] * wr[c];
            s->u[t * d->E + i] = z;
        }
    rpi_moe_route(a->L, s->u, d->N, s->u, s->chosen, s->gate); /* reads a row before writing */
    order_pairs(d, s);
}

/* The token rows of pairs pr[0, n) into x (n x C). */
static void gather(const moe_dims *d, const float *rows, const int *pr, int n, float *x) {
    for (int j = 0; j < n; j++)
        memcpy(x + (size_t)j * d->C, rows + (size_t)(pr[j] / d->K) * d->C, sizeof(float) * d->C);
}

/* out (zeroed) += each pair's gate x its expert's row of y, in pair order. */
static void combine(const moe_dims *d, const moe_state *s, const int *pr, int n, const float *y,
                    size_t stride, float *out) {
    for (int j = 0; j < n; j++) {
        float g = (float)s->gate[pr[j]], *o = out + (size_t)(pr[j] / d->K) * d->C;
        const float *yj = y + (size_t)j * stride;
        for (int c = 0; c < d->C; c++)
            o[c] += g * yj[c];
    }
}

static void forward_local(const layer_args *a, const moe_dims *d, moe_state *s) {
    float *x = (float *)((double *)a->tmp + d->N * ((size_t)d->E + d->K));
    float *h = x + d->N * d->C, *y = h + d->N * d->F;
    for (int e = 0; e < d->E; e++) {
        int first = s->start[e], n = s->start[e + 1] - first;
        if (n == 0)
            continue;
        gather(d, a->in, s->pairs + first, n, x);
        expert_forward(d, a->w, e, n, x, s->a + (size_t)first * d->F,
                       s->b + (size_t)first * d->F, h, y);
        combine(d, s, s->pairs + first, n, y, d->C, a->out);
    }
}

/* The owner's rows by local expert, members in order and each member's rows
** in the order it sent them. */
static void order_rows(const moe_dims *d, const layer_args *a, moe_state *s) {
    size_t NK = d->N * d->K;
    int at[1 << 12];
    memset(s->ostart, 0, sizeof(int) * (d->El + 1));
    for (int p = 0; p < d->G; p++) {
        const float *blk = s->recv + p * d->SD;
        for (int r = 0; r < (int)blk[0]; r++)
            s->ostart[(int)blk[1 + (size_t)r * (d->C + 2) + d->C + 1] - a->ep_rank * d->El + 1]++;
    }
    for (int e = 0; e < d->El; e++)
        s->ostart[e + 1] += s->ostart[e];
    memcpy(at, s->ostart, sizeof(int) * d->El);
    for (int p = 0; p < d->G; p++) {
        const float *blk = s->recv + p * d->SD;
        for (int r = 0; r < (int)blk[0]; r++) {
            int e = (int)blk[1 + (size_t)r * (d->C + 2) + d->C + 1] - a->ep_rank * d->El;
            s->orow[at[e]++] = (int)(p * NK + r);
        }
    }
}

/* Row j of the owner's expert: where it was received. */
static const float *received(const moe_dims *d, const moe_state *s, int row) {
    size_t NK = d->N * d->K;
    return s->recv + (row / NK) * d->SD + 1 + (row % NK) * ((size_t)d->C + 2);
}

/* Each member's pairs to owner q: pairs[start[q El], start[(q + 1) El]). */
static const int *owned_pairs(const moe_dims *d, const moe_state *s, int q, int *n) {
    *n = s->start[(q + 1) * d->El] - s->start[q * d->El];
    return s->pairs + s->start[q * d->El];
}

static void forward_parallel(const layer_args *a, const moe_dims *d, moe_state *s) {
    size_t NK = d->N * d->K;
    float *x = (float *)((double *)a->tmp + d->N * ((size_t)d->E + d->K));
    size_t rows = d->G * d->N;
    float *h = x + rows * d->C, *y = h + rows * d->F, *b1 = x + expert_scratch(d),
          *b2 = b1 + d->G * d->SD;
    for (int q = 0; q < d->G; q++) { /* dispatch: [count][x, gate, expert]... */
        int n;
        const int *pr = owned_pairs(d, s, q, &n);
        float *blk = b1 + q * d->SD;
        blk[0] = (float)n;
        for (int j = 0; j < n; j++) {
            float *row = blk + 1 + (size_t)j * (d->C + 2);
            memcpy(row, a->in + (size_t)(pr[j] / d->K) * d->C, sizeof(float) * d->C);
            row[d->C] = (float)s->gate[pr[j]];
            row[d->C + 1] = (float)s->chosen[pr[j]];
        }
    }
    a->ep_alltoall(a->ep_ctx, b1, d->SD, s->recv);
    order_rows(d, a, s);
    for (int e = 0; e < d->El; e++) { /* the owner's experts; outputs back where rows came from */
        int first = s->ostart[e], n = s->ostart[e + 1] - first;
        for (int j = 0; j < n; j++)
            memcpy(x + (size_t)j * d->C, received(d, s, s->orow[first + j]), sizeof(float) * d->C);
        if (n)
            expert_forward(d, a->w, a->ep_rank * d->El + e, n, x, s->a + (size_t)first * d->F,
                           s->b + (size_t)first * d->F, h, y);
        for (int j = 0; j < n; j++)
            memcpy(b1 + (size_t)s->orow[first + j] * d->C, y + (size_t)j * d->C,
                   sizeof(float) * d->C);
    }
    a->ep_alltoall(a->ep_ctx, b1, NK * d->C, b2);
    for (int q = 0; q < d->G; q++) {
        int n;
        const int *pr = owned_pairs(d, s, q, &n);
        combine(d, s, pr, n, b2 + q * NK * d->C, d->C, a->out);
    }
}

void rpi_moe_forward(const layer_args *a) {
    int G = a->ep_size > 1 && a->ctx->training ? a->ep_size : 1;
    moe_dims d = dims_of(a->L, a->B, G);
    moe_state s = state_of(&d, a->aux);
    route(a, &d, &s);
    memset(a->out, 0, sizeof(float) * d.N * d.C);
    if (G > 1)
        forward_parallel(a, &d, &s);
    else
        forward_local(a, &d, &s);
}

/* An expert's scratch for n rows in backward: x, dy, expert_backward's
** three, the gates (float) and their gradients (double). */
typedef struct rows_scratch {
    float *x, *dy, *t, *g;
    double *dg;
} rows_scratch;

static rows_scratch rows_of(const moe_dims *d, float *base, int n) {
    rows_scratch r;
    r.x = base;
    r.dy = r.x + (size_t)n * d->C;
    r.t = r.dy + (size_t)n * d->C;
    r.g = r.t + 3 * (size_t)n * d->F;
    r.dg = (double *)((char *)base + ALIGN8(((char *)(r.g + n) - (char *)base)));
    return r;
}

static void backward_local(const layer_args *a, const moe_dims *d, const moe_state *s,
                           const float *dout, float *din, double *dgate, float *scratch) {
    for (int e = 0; e < d->E; e++) {
        int first = s->start[e], n = s->start[e + 1] - first;
        const int *pr = s->pairs + first;
        if (n == 0)
            continue;
        rows_scratch r = rows_of(d, scratch, n);
        gather(d, a->in, pr, n, r.x);
        gather(d, dout, pr, n, r.dy);
        for (int j = 0; j < n; j++)
            r.g[j] = (float)s->gate[pr[j]];
        expert_backward(d, a->w, a->dw, e, n, r.x, r.dy, r.g, s->a + (size_t)first * d->F,
                        s->b + (size_t)first * d->F, r.t, r.dg, din ? r.dy : NULL);
        for (int j = 0; j < n; j++)
            dgate[pr[j]] = r.dg[j];
        for (int j = 0; din && j < n; j++) {
            float *o = din + (size_t)(pr[j] / d->K) * d->C;
            for (int c = 0; c < d->C; c++)
                o[c] += r.dy[(size_t)j * d->C + c];
        }
    }
}

/* The owner's side of backward: its experts over every member's rows,
** each row's input gradient and gate gradient (a double in two floats'
** room, bit for bit) into `back` where the row came from. */
static void owner_backward(const layer_args *a, const moe_dims *d, const moe_state *s,
                           const float *dy_in, float *back, float *scratch) {
    for (int e = 0; e < d->El; e++) {
        int first = s->ostart[e], n = s->ostart[e + 1] - first;
        if (n == 0)
            continue;
        rows_scratch r = rows_of(d, scratch, n);
        for (int j = 0; j < n; j++) {
            int row = s->orow[first + j];
            const float *got = received(d, s, row);
            memcpy(r.x + (size_t)j * d->C, got, sizeof(float) * d->C);
            memcpy(r.dy + (size_t)j * d->C, dy_in + (size_t)row * d->C, sizeof(float) * d->C);
            r.g[j] = got[d->C];
        }
        expert_backward(d, a->w, a->dw, a->ep_rank * d->El + e, n, r.x, r.dy, r.g,
                        s->a + (size_t)first * d->F, s->b + (size_t)first * d->F, r.t, r.dg,
                        r.dy);
        for (int j = 0; j < n; j++) {
            float *to = back + (size_t)s->orow[first + j] * (d->C + 2);
            memcpy(to, r.dy + (size_t)j * d->C, sizeof(float) * d->C);
            memcpy(to + d->C, &r.dg[j], sizeof(double));
        }
    }
}

static void backward_parallel(const layer_args *a, const moe_dims *d, const moe_state *s,
                              const float *dout, float *din, double *dgate, float *scratch,
                              float *b1, float *b2) {
    size_t NK = d->N * d->K;
    for (int q = 0; q < d->G; q++) { /* the outputs' gradients to the owners */
        int n;
        const int *pr = owned_pairs(d, s, q, &n);
        gather(d, dout, pr, n, b1 + q * NK * d->C);
    }
    a->ep_alltoall(a->ep_ctx, b1, NK * d->C, b2);
    owner_backward(a, d, s, b2, b1, scratch);
    a->ep_alltoall(a->ep_ctx, b1, NK * (d->C + 2), b2);
    for (int q = 0; q < d->G; q++) { /* and the inputs' and gates' back, in expert order */
        int n;
        const int *pr = owned_pairs(d, s, q, &n);
        for (int j = 0; j < n; j++) {
            const float *row = b2 + q * NK * (d->C + 2) + (size_t)j * (d->C + 2);
            memcpy(&dgate[pr[j]], row + d->C, sizeof(double));
            float *o = din ? din + (size_t)(pr[j] / d->K) * d->C : NULL;
            for (int c = 0; o && c < d->C; c++)
                o[c] += row[c];
        }
    }
}

/* The router's weights' gradient and the tokens' share through it, in
** double, from the scores' gradient ds. */
static void router_backward(const layer_args *a, const moe_dims *d, const double *ds,
                            float *din) {
    for (int i = 0; i < d->E; i++) {
        float *dwr = a->dw + (size_t)i * d->C;
        for (int c = 0; c < d->C; c++) {
            double g = 0;
            for (size_t t = 0; t < d->N; t++)
                g += ds[t * d->E + i] * a->in[t * d->C + c];
            dwr[c] += (float)g;
        }
    }
    for (size_t t = 0; din && t < d->N; t++)
        for (int c = 0; c < d->C; c++) {
            double g = 0;
            for (int i = 0; i < d->E; i++)
                g += ds[t * d->E + i] * a->w[(size_t)i * d->C + c];
            din[t * d->C + c] += (float)g;
        }
}

void rpi_moe_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int G = a->ep_size > 1 && a->ctx->training ? a->ep_size : 1;
    moe_dims d = dims_of(L, a->B, G);
    moe_state s = state_of(&d, a->aux);
    size_t NK = d.N * d.K;
    double *dgate = (double *)a->tmp, *ds = dgate + NK;
    float *scratch = (float *)(ds + d.N * d.E);
    if (!a->accumulate)
        memset(a->dw, 0, sizeof(float) * L->param_count);
    if (din)
        memset(din, 0, sizeof(float) * d.N * d.C);
    if (G > 1) {
        float *b1 = scratch + expert_scratch(&d);
        backward_parallel(a, &d, &s, dout, din, dgate, scratch, b1, b1 + d.G * d.SD);
    } else {
        backward_local(a, &d, &s, dout, din, dgate, scratch);
    }
    rpi_moe_route_backward(L, s.u, s.chosen, s.gate, dgate, a->ctx->loss_scale, d.N, d.T, ds);
    router_backward(a, &d, ds, din);
}
