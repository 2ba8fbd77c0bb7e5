/*
** Dense layers: linear, layernorm (its rows' kernels are the normalisations',
** layers_norm.c), embedding and position embedding. Linear acts on the last
** dimension of its input, so a (tokens x features) sample is handled as
** `tokens` rows.
*/
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "layers_impl.h"

static inline int last_dim(const rp_shape *s) { return s->dim[s->ndim - 1]; }

/* rows of the last dimension in B samples */
static inline int rows_of(const rp_shape *s, int B) {
    return (int)(rp_shape_size(s) / (size_t)last_dim(s)) * B;
}

/* in: (R, D); out: (R, N); W (N, D); b (N) or NULL: out = in W^T + b */
void rpi_linear_rows(const float *in, float *out, const float *W, const float *b, int R, int D,
                     int N) {
    if (b)
        for (int r = 0; r < R; r++)
            memcpy(out + (size_t)r * N, b, sizeof(float) * N);
    rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, N, D, 1.0f, in, D, W, D,
                b ? 1.0f : 0.0f, out, N);
}

/* dout: (R, N); dW (N, D) += dout^T in and db (N) += its column sums (or
** overwritten when !accumulate; db NULL: no bias); din (R, D) = dout W */
RP_HOT
void rpi_linear_rows_backward(const float *in, const float *dout, const float *W, float *dW,
                              float *db, float *din, bool accumulate, int R, int D, int N) {
    if (dW)
        rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, D, R, 1.0f, dout, N, in, D,
                    accumulate ? 1.0f : 0.0f, dW, D);
    if (dW && db && !accumulate)
        memset(db, 0, sizeof(float) * N);
    if (dW && db)
        for (int r = 0; r < R; r++) {
            const float *g = dout + (size_t)r * N;
            for (int n = 0; n < N; n++)
                db[n] += g[n];
        }
    if (din)
        rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, D, N, 1.0f, dout, N, W, D,
                    0.0f, din, D);
}

/* in: (R, D) rows, R = B x the sample's leading dims; weight (N, D), then bias (N) */
void rpi_linear_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    int D = last_dim(&L->in), N = L->units;
    rpi_linear_rows(a->in, a->out, a->w, L->bias && !L->tp_skip_bias ? a->w + (size_t)N * D : NULL,
                    rows_of(&L->in, a->B), D, N);
}

void rpi_linear_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int D = last_dim(&L->in), N = L->units;
    float *dw = a->part == RPI_BACK_INPUT ? NULL : a->dw;
    rpi_linear_rows_backward(a->in, dout, a->w, dw, L->bias ? a->dw + (size_t)N * D : NULL,
                             a->part == RPI_BACK_WEIGHT ? NULL : din, a->accumulate,
                             rows_of(&L->in, a->B), D, N);
}

/* over the last dimension; gain then bias (D) each */
void rpi_layernorm_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    int D = last_dim(&L->in);
    rpi_layernorm_rows(a->in, a->out, a->w, a->w + D, a->aux, rows_of(&L->in, a->B), D, L->eps);
}

void rpi_layernorm_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int D = last_dim(&L->in);
    rpi_layernorm_rows_backward(a->in, dout, a->w, a->aux,
                                a->part == RPI_BACK_INPUT ? NULL : a->dw, a->dw + D,
                                a->part == RPI_BACK_WEIGHT ? NULL : din, false, a->accumulate,
                                rows_of(&L->in, a->B), D);
}

/* The table is processed as ctx->embedding_blocks row blocks, one after
** another (embedding_serialization_factor): a token is looked up, or its
** gradient added, while its block is processed. Tokens keep their order
** within a block, so the sums per row are the same as without blocks. */
static int blocks_of(const layer_args *a) {
    int n = a->ctx->embedding_blocks;
    return n > 1 ? n : 1;
}

/* in: (B, T) token ids as floats; out: (B, T, Dm); table (vocab, Dm). A
** table split by vocabulary holds rows [tp_vocab_first, + vocab) of
** tp_vocab, and writes zeros for the tokens it does not hold (the tensor
** group's all-reduce then gives every row from the one rank holding it). */
rp_status rpi_embedding_forward(const layer_args *a, rp_error *err) {
    const rp_layer *L = a->L;
    int T = L->in.dim[0], Dm = L->dim, V = L->tp_vocab ? L->tp_vocab : L->vocab;
    int first = L->tp_vocab_first;
    for (int r = 0; r < a->B * T; r++) {
        float f = a->in[r];
        int id = (int)f;
        if (!(f >= 0) || f != (float)id || id >= V)
            return rp_fail(err, RP_ERR_INVALID,
                           "layer %d (embedding, line %d): token id %g is not an integer in "
                           "[0, %d)",
                           a->index, L->line, f, V);
        if (id < first || id >= first + L->vocab)
            memset(a->out + (size_t)r * Dm, 0, sizeof(float) * Dm);
    }
    int nb = blocks_of(a), rows = L->vocab / nb;
    for (int b = 0; b < nb; b++) {
        int lo = first + b * rows, hi = b == nb - 1 ? first + L->vocab : lo + rows;
        for (int r = 0; r < a->B * T; r++) {
            int id = (int)a->in[r];
            if (id >= lo && id < hi)
                memcpy(a->out + (size_t)r * Dm, a->w + (size_t)(id - first) * Dm,
                       sizeof(float) * Dm);
        }
    }
    return RP_OK;
}

/* dout: (B, T, Dm) added into the rows of the table's gradient (of a split
** table, the rows it holds); no din (ids) */
void rpi_embedding_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int T = L->in.dim[0], Dm = L->dim;
    if (din && a->part != RPI_BACK_WEIGHT) /* token ids have no gradient */
        memset(din, 0, sizeof(float) * (size_t)a->B * T);
    if (a->part == RPI_BACK_INPUT)
        return;
    if (!a->accumulate)
        memset(a->dw, 0, sizeof(float) * L->param_count);
    int nb = blocks_of(a), rows = L->vocab / nb, first = L->tp_vocab_first;
    for (int b = 0; b < nb; b++) {
        int lo = first + b * rows, hi = b == nb - 1 ? first + L->vocab : lo + rows;
        for (int r = 0; r < a->B * T; r++) {
            int id = (int)a->in[r];
            if (id < lo || id >= hi)
                continue;
            float *row = a->dw + (size_t)(id - first) * Dm;
            const float *g = dout + (size_t)r * Dm;
            for (int d = 0; d < Dm; d++)
                row[d] += g[d];
        }
    }
}

/* in, out: (B, T, C); positions (T, C), added to every sample */
void rpi_position_forward(const layer_args *a) {
    size_t n = rp_shape_size(&a->L->in);
    for (int b = 0; b < a->B; b++) {
        const float *x = a->in + (size_t)b * n;
        float *y = a->out + (size_t)b * n;
        for (size_t e = 0; e < n; e++)
            y[e] = x[e] + a->w[e];
    }
}

/* dout: (B, T, C); dpositions (T, C) += the sum over samples; din = dout */
void rpi_position_backward(const layer_args *a, const float *dout, float *din) {
    size_t n = rp_shape_size(&a->L->in);
    if (a->part != RPI_BACK_INPUT && !a->accumulate)
        memset(a->dw, 0, sizeof(float) * n);
    if (a->part != RPI_BACK_INPUT)
        for (int b = 0; b < a->B; b++)
            for (size_t e = 0; e < n; e++)
                a->dw[e] += dout[(size_t)b * n + e];
    if (din && a->part != RPI_BACK_WEIGHT)
        memcpy(din, dout, sizeof(float) * n * a->B);
}
