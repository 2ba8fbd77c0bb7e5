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
*/
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "layers_impl.h"

typedef struct moe_dims {
    int E, K, F, C, T;
    size_t N; /* tokens: rows x T */
} moe_dims;

static moe_dims dims_of(const rp_layer *L, int B) {
    moe_dims d = {L->experts, L->top_k, L->ffn, L->in.dim[L->in.ndim - 1],
                  L->in.ndim == 2 ? L->in.dim[0] : 1, 0};
    d.N = (size_t)B * d.T;
    return d;
}

/* The aux state, in this order: the scores u (N x E doubles), the gates
** (N x K doubles), the chosen experts (N x K ints), the (token, slot)
** pairs ordered by expert (N x K), where each expert's start (E + 1), and
** w1 x and w3 x of each pair in that order (N K x F floats each). */
typedef struct moe_state {
    double *u, *gate;
    int *chosen, *pairs, *start;
    float *a, *b;
} moe_state;

#define ALIGN8(n) (((n) + 7) & ~(size_t)7)

size_t rpi_moe_aux_bytes(const rp_layer *L, int B) {
    moe_dims d = dims_of(L, B);
    size_t NK = d.N * d.K;
    return sizeof(double) * (d.N * d.E + NK) + ALIGN8(sizeof(int) * (2 * NK + d.E + 1)) +
           sizeof(float) * 2 * NK * d.F;
}

static moe_state state_of(const rp_layer *L, int B, void *aux) {
    moe_dims d = dims_of(L, B);
    size_t NK = d.N * d.K;
    moe_state s;
    s.u = aux;
    s.gate = s.u + d.N * d.E;
    s.chosen = (int *)(s.gate + NK);
    s.pairs = s.chosen + NK;
    s.start = s.pairs + NK;
    s.a = (float *)((char *)s.chosen + ALIGN8(sizeof(int) * (2 * NK + d.E + 1)));
    s.b = s.a + NK * d.F;
    return s;
}

/* Scratch: an expert's gathered rows and its products (at most every
** token, as a token goes to an expert once), and backward's scores'
** gradients. */
size_t rpi_moe_scratch(const rp_layer *L, int B) {
    moe_dims d = dims_of(L, B);
    return d.N * (2 * (size_t)d.C + 3 * (size_t)d.F) + 2 * d.N * ((size_t)d.E + d.K);
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

void rpi_moe_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    moe_dims d = dims_of(L, a->B);
    moe_state s = state_of(L, a->B, a->aux);
    /* the router: scores in double, into u's room first */
    for (size_t t = 0; t < d.N; t++)
        for (int i = 0; i < d.E; i++) {
            const float *x = a->in + t * d.C, *wr = a->w + (size_t)i * d.C;
            double z = 0;
            for (int c = 0; c < d.C; c++)
                z += (double)x[c] * wr[c];
            s.u[t * d.E + i] = z;
        }
    rpi_moe_route(L, s.u, d.N, s.u, s.chosen, s.gate); /* row by row: reads z before writing */
    order_pairs(&d, &s);
    memset(a->out, 0, sizeof(float) * d.N * d.C);
    float *x = a->tmp, *h = x + d.N * d.C, *y = h + d.N * d.F;
    for (int e = 0; e < d.E; e++) {
        int first = s.start[e], n = s.start[e + 1] - first;
        if (n == 0)
            continue;
        const int *pr = s.pairs + first;
        for (int j = 0; j < n; j++)
            memcpy(x + (size_t)j * d.C, a->in + (size_t)(pr[j] / d.K) * d.C,
                   sizeof(float) * d.C);
        const float *w1 = expert_weights(&d, a->w, e), *w3 = w1 + (size_t)d.F * d.C,
                    *w2 = w3 + (size_t)d.F * d.C;
        float *A = s.a + (size_t)first * d.F, *Bm = s.b + (size_t)first * d.F;
        rpi_linear_rows(x, A, w1, NULL, n, d.C, d.F);
        rpi_linear_rows(x, Bm, w3, NULL, n, d.C, d.F);
        rpi_silu_forward(A, h, (size_t)n * d.F);
        for (size_t i = 0; i < (size_t)n * d.F; i++)
            h[i] *= Bm[i];
        rpi_linear_rows(h, y, w2, NULL, n, d.F, d.C);
        for (int j = 0; j < n; j++) {
            float g = (float)s.gate[pr[j]], *o = a->out + (size_t)(pr[j] / d.K) * d.C;
            const float *yj = y + (size_t)j * d.C;
            for (int c = 0; c < d.C; c++)
                o[c] += g * yj[c];
        }
    }
}

/* One expert's backward over its n pairs: its weights' gradients, each
** pair's gate gradient, and (din not NULL) the tokens' gradients added. */
static void expert_backward(const layer_args *a, const moe_dims *d, const moe_state *s, int e,
                            const float *dout, float *din, double *dgate, float *scratch) {
    int first = s->start[e], n = s->start[e + 1] - first;
    const int *pr = s->pairs + first;
    size_t nC = (size_t)n * d->C, nF = (size_t)n * d->F;
    float *x = scratch, *dy = x + nC, *t1 = dy + nC, *dh = t1 + nF, *db = dh + nF;
    const float *A = s->a + (size_t)first * d->F, *Bm = s->b + (size_t)first * d->F;
    const float *w1 = expert_weights(d, a->w, e), *w3 = w1 + (size_t)d->F * d->C,
                *w2 = w3 + (size_t)d->F * d->C;
    float *dw1 = (float *)expert_weights(d, a->dw, e), *dw3 = dw1 + (size_t)d->F * d->C,
          *dw2 = dw3 + (size_t)d->F * d->C;
    for (int j = 0; j < n; j++) {
        memcpy(x + (size_t)j * d->C, a->in + (size_t)(pr[j] / d->K) * d->C, sizeof(float) * d->C);
        memcpy(dy + (size_t)j * d->C, dout + (size_t)(pr[j] / d->K) * d->C, sizeof(float) * d->C);
    }
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
        dgate[pr[j]] = g;
        float gate = (float)s->gate[pr[j]];
        for (int c = 0; c < d->C; c++)
            dy[(size_t)j * d->C + c] *= gate;
        for (int f = 0; f < d->F; f++)
            dh[(size_t)j * d->F + f] *= gate;
    }
    rpi_linear_rows_backward(t1, dy, w2, dw2, NULL, NULL, true, n, d->F, d->C);
    /* h = silu(A) B: dB = dh silu(A), dA = silu'(A) dh B */
    rpi_silu_forward(A, t1, nF);
    for (size_t i = 0; i < nF; i++) {
        db[i] = dh[i] * t1[i];
        dh[i] *= Bm[i];
    }
    rpi_silu_backward(A, dh, t1, nF); /* t1: dA */
    float *dx = din ? dy : NULL;      /* dy is spent */
    rpi_linear_rows_backward(x, t1, w1, dw1, NULL, dx, true, n, d->C, d->F);
    rpi_linear_rows_backward(x, db, w3, dw3, NULL, NULL, true, n, d->C, d->F);
    if (!din)
        return;
    rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d->C, d->F, 1.0f, db, d->F, w3, d->C,
              1.0f, dx, d->C);
    for (int j = 0; j < n; j++) {
        float *o = din + (size_t)(pr[j] / d->K) * d->C;
        for (int c = 0; c < d->C; c++)
            o[c] += dx[(size_t)j * d->C + c];
    }
}

void rpi_moe_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    moe_dims d = dims_of(L, a->B);
    moe_state s = state_of(L, a->B, a->aux);
    size_t NK = d.N * d.K;
    double *dgate = (double *)a->tmp, *ds = dgate + NK;
    float *scratch = (float *)(ds + d.N * d.E);
    if (!a->accumulate)
        memset(a->dw, 0, sizeof(float) * L->param_count);
    if (din)
        memset(din, 0, sizeof(float) * d.N * d.C);
    for (int e = 0; e < d.E; e++)
        if (s.start[e + 1] > s.start[e])
            expert_backward(a, &d, &s, e, dout, din, dgate, scratch);
    rpi_moe_route_backward(L, s.u, s.chosen, s.gate, dgate, a->ctx->loss_scale, d.N, d.T, ds);
    /* the router's weights and the tokens' share through it, in double */
    for (int i = 0; i < d.E; i++) {
        float *dwr = a->dw + (size_t)i * d.C;
        for (int c = 0; c < d.C; c++) {
            double g = 0;
            for (size_t t = 0; t < d.N; t++)
                g += ds[t * d.E + i] * a->in[t * d.C + c];
            dwr[c] += (float)g;
        }
    }
    for (size_t t = 0; din && t < d.N; t++)
        for (int c = 0; c < d.C; c++) {
            double g = 0;
            for (int i = 0; i < d.E; i++)
                g += ds[t * d.E + i] * a->w[(size_t)i * d.C + c];
            din[t * d.C + c] += (float)g;
        }
}
