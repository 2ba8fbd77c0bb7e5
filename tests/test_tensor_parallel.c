/*
** Tensor parallelism (Megatron-LM's): every layout of tensor groups t in
** {2, 4}, stages P in {1, 2}, replicas R in {1, 2}, stage replication
** [2, 1], accumulation 1 and 4, with gradient clipping, on a LLaMA-family
** block (RMSNorm, grouped-query attention with rotary embeddings, SwiGLU)
** and a GPT-2 block written as a graph (LayerNorm, attention, GELU MLP,
** dropout, a tied head), trains to the weights of one worker on the same
** samples within 1e-5; every replica's copy of the weights comes back bit
** for bit the same; a trace shows exactly two all-reduces of the tensor
** group per block and micro-batch in forward and two in backward; a
** training state written at t = 2 resumes at t = 1 and t = 4 within 1e-5
** of an uninterrupted run, and at t = 2 bit for bit. The split itself:
** each rank's slice of a fused Q, K, V weight is its heads' rows; widths
** not divisible by t and split inputs read by whole layers are refused,
** naming the line.
**
**   test_tensor_parallel          local backend: everything
**   test_tensor_parallel --mpi    under mpirun -np W: the cases of W workers
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/checkpoint.h"
#include "repipe/data.h"
#include "repipe/session.h"
#include "run/session_impl.h"
#include "support.h"
#include "test.h"

/* 8 query heads on 4 key and value heads of size 2: t = 4 leaves each
** rank 2 query heads sharing 1 key and value head */
static const char LLAMA[] = "input 8\nx = embedding 13 16 std=0.3\nrmsnorm\nlinear 32 bias=false\n"
                           "attention heads=8 kv_heads=4 rope_theta=10000\n"
                           "o = linear 16 bias=false\nx1 = add < o x\nn2 = rmsnorm\n"
                           "linear 24 bias=false\ng = silu\nu = linear 24 bias=false < n2\n"
                           "mul < g u\nd = linear 16 bias=false\nadd < d x1\nrmsnorm\n"
                           "linear 13 bias=false\nsoftmax_cross_entropy\n";
static const char GPT[] = "input 8\nembedding 13 16 std=0.3\nx = position_embedding\nlayernorm\n"
                         "linear 48\nattention heads=4\nlinear 16\no = dropout 0.1\n"
                         "x1 = add < o x\nlayernorm\nlinear 32\ngelu\nlinear 16\nm = dropout 0.1\n"
                         "add < m x1\nlayernorm\nlinear 13 bias=false tie=0\n"
                         "softmax_cross_entropy\n";
/* The same GPT-2 blocks fused, as examples/gpt-kjv.model writes them: two,
** so that a pipeline of two stages cuts between them */
static const char FUSED[] = "input 8\nembedding 13 16 std=0.3\nposition_embedding\n"
                           "transformer_block heads=4 mlp=2 dropout=0.1\n"
                           "transformer_block heads=4 mlp=2 dropout=0.1\nlayernorm\n"
                           "linear 13 bias=false tie=0\nsoftmax_cross_entropy\n";
static const char *const MODELS[] = {LLAMA, GPT, FUSED};
static const char *const NAMES[] = {"llama", "gpt", "fused gpt"};
#define NMODELS 3

static rp_comm *mpi;

typedef struct tcase {
    int T, P, R, r[2], GA;
    const char *extra;
} tcase;

static const tcase CASES[] = {
    {2, 1, 1, {1, 1}, 1, ""},
    {2, 1, 1, {1, 1}, 4, ""},
    {2, 2, 1, {1, 1}, 4, ""},
    {2, 1, 2, {1, 1}, 1, ""},
    {2, 2, 2, {1, 1}, 4, ""},
    {2, 2, 1, {2, 1}, 4, ""},
    {2, 2, 1, {1, 1}, 4, ", \"gradient_clipping\": 0.05"},
    {2, 2, 1, {1, 1}, 4, ", \"schedule\": \"zb-h1\""},
    {2, 1, 2, {1, 1}, 4, ", \"replicated_tensor_sharding\": true"},
    {2, 2, 1, {1, 1}, 4, ", \"recompute_checkpoint_every_layer\": true"},
    {4, 1, 1, {1, 1}, 1, ""},
    {4, 1, 1, {1, 1}, 4, ", \"gradient_clipping\": 0.05"},
    {4, 2, 1, {1, 1}, 4, ""},
    {4, 1, 2, {1, 1}, 4, ""},
    {4, 2, 1, {2, 1}, 1, ""},
    {2, 2, 2, {1, 1}, 4, ", \"vocab_parallel\": false"},
    {4, 2, 1, {1, 1}, 4, ", \"vocab_parallel\": false"},
};

/* The GPT trains with SGD: its keys' bias has a gradient of zero but for
** rounding (softmax ignores what adds to every score of a query), which
** Adam would scale up to full steps, different for every order of sums. */
static bool sgd;

static rp_config config(int T, int P, int R, const int *r, int GA, const char *extra) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 3, \"micro_batch_size\": 2, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s, \"stage_replication\": %s, "
             "\"tensor_parallel\": %d, \"output_mode\": \"all\", \"optimizer\": %s%s}",
             GA, R, P == 1 ? "[-1]" : "[-1, -1]",
             P == 1 ? "[1]" : r[0] == 2 ? "[2, 1]" : "[1, 1]", T,
             sgd ? "{\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9, \"weight_decay\": 0.01}"
                 : "{\"type\": \"adamw\", \"lr\": 0.01, \"weight_decay\": 0.1}",
             extra);
    return test_config(json);
}

/* The tokens of sample i, and its targets: a fixed function of i. */
static void tokens(long long per, int call, float *x, int32_t *y, int64_t *ids) {
    for (long long i = 0; i < per; i++) {
        ids[i] = i + call * per;
        for (int t = 0; t < 8; t++) {
            int tok = (int)((ids[i] * 5 + t * 3 + ids[i] * t) % 13);
            x[i * 8 + t] = (float)tok;
            y[i * 8 + t] = (tok * 7 + 2 + t) % 13;
        }
    }
}

/* `calls` host calls from session s; its weights, one per replica. */
static rp_weights *run(rp_session *s, int from, int calls) {
    rp_error err;
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * 8);
    int32_t *y = malloc(sizeof(int32_t) * per * 8);
    for (int call = from; call < from + calls; call++) {
        tokens(per, call, x, y, ids);
        rp_result r;
        CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
    }
    rp_weights *w = NULL;
    CHECK_OK(rp_session_get_weights(s, RP_ALL_REPLICAS, &w, &err), err);
    free(ids), free(x), free(y);
    return w;
}

/* Every worker's slice against every other copy of it (the workers of
** one stage and tensor rank, across replicas and stage replicas): the
** same bits, read from the workers themselves. The pairs compared. */
static int shards_agree(const rp_session *s, const char *what) {
    int pairs = 0;
    for (int i = 0; i < s->nlocal; i++)
        for (int j = i + 1; j < s->nlocal; j++) {
            const worker *a = &s->w[i], *b = &s->w[j];
            if (a->stage != b->stage || a->tensor_rank != b->tensor_rank)
                continue;
            size_t n = rp_net_num_params(a->net);
            CHECKF(n == rp_net_num_params(b->net) &&
                   !memcmp(rp_net_params(a->net), rp_net_params(b->net), sizeof(float) * n),
                   "%s: workers %d and %d (stage %d, tensor rank %d) hold different slices",
                   what, a->id, b->id, a->stage, a->tensor_rank);
            pairs++;
        }
    return pairs;
}

static rp_weights *train(const rp_model *m, const rp_config *c, bool use_mpi, int *pairs) {
    rp_session *s = test_session(m, c, use_mpi ? mpi : NULL);
    if (!s) {
        test_failures++;
        return NULL;
    }
    rp_weights *w = run(s, 0, 3);
    if (pairs && !use_mpi)
        *pairs += shards_agree(s, "layout");
    rp_session_free(s);
    return w;
}

/* Every replica's copy of every tensor: the same bits. */
static bool replicas_agree(const rp_weights *w, int R) {
    for (int t = 0; w && t < w->num_tensors; t++) {
        size_t n = rp_shape_size(&w->tensors[t].shape);
        for (int c = 1; c < R; c++)
            if (memcmp(w->tensors[t].data, w->tensors[t].data + c * n, sizeof(float) * n))
                return false;
    }
    return w != NULL;
}

/* One replica's tensors of a weight set of R. */
static rp_weights *first_replica(const rp_weights *w) {
    rp_weights *o = calloc(1, sizeof *o);
    o->tensors = calloc(w->num_tensors, sizeof(rp_tensor));
    for (int t = 0; t < w->num_tensors; t++) {
        o->tensors[t] = w->tensors[t];
        o->tensors[t].groups = 1;
        size_t n = rp_shape_size(&w->tensors[t].shape);
        o->tensors[t].data = malloc(sizeof(float) * n);
        memcpy(o->tensors[t].data, w->tensors[t].data, sizeof(float) * n);
        o->num_tensors++;
    }
    return o;
}

static void layouts(bool use_mpi, int only_workers) {
    int runs = 0, pairs = 0;
    for (int mi = 0; mi < NMODELS; mi++) {
        rp_model *m = test_model(MODELS[mi]);
        sgd = mi > 0;
        for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
            const tcase *tc = &CASES[k];
            int workers = test_workers(tc->P, tc->r, tc->R) * tc->T;
            if (only_workers && workers != only_workers)
                continue;
            if (mi > 0 && strstr(tc->extra, "sharding")) /* a tie is never sharded */
                continue;
            /* one worker on the same samples: R * GA micro-batches of B */
            int one[2] = {1, 1};
            rp_config c1 = config(1, 1, 1, one, tc->GA * tc->R,
                                  strstr(tc->extra, "clipping") ? ", \"gradient_clipping\": 0.05"
                                                                : "");
            rp_weights *want = train(m, &c1, false, NULL);
            rp_config c = config(tc->T, tc->P, tc->R, tc->r, tc->GA, tc->extra);
            rp_weights *got = train(m, &c, use_mpi, &pairs);
            rp_weights *got1 = got ? first_replica(got) : NULL;
            double d = want && got1 ? test_weights_diff(want, got1) : INFINITY;
            CHECKF(d <= 1e-5, "%s t=%d P=%d R=%d r=[%d,%d] GA=%d%s: weights %g from one "
                   "worker's", NAMES[mi], tc->T, tc->P, tc->R, tc->r[0], tc->r[1], tc->GA,
                   tc->extra, d);
            CHECKF(replicas_agree(got, tc->R), "%s t=%d P=%d R=%d%s: the replicas' weights "
                   "differ", NAMES[mi], tc->T, tc->P, tc->R, tc->extra);
            rp_weights_free(want), rp_weights_free(got), rp_weights_free(got1);
            runs++;
        }
        rp_model_free(m);
    }
    CHECK(runs > 0);
    CHECK(use_mpi || pairs > 0);
    printf("%d tensor-parallel layouts within 1e-5 of one worker; %d pairs of a slice's copies "
           "the same bits\n", runs, pairs);
}

/* A state of 2 updates at t = 2 (R 2, P 2, sharded optimizer state where
** the model allows it) resumed at t = 1, 2 and 4 for 2 more: the run of 4
** updates at t = 2, within 1e-5, and at t = 2 bit for bit. */
static void resume(void) {
    static const int T[] = {1, 2, 4};
    int one[2] = {1, 1};
    for (int mi = 0; mi < NMODELS; mi++) {
        rp_model *m = test_model(MODELS[mi]);
        sgd = mi > 0;
        const char *extra = mi ? "" : ", \"replicated_tensor_sharding\": true";
        rp_config a = config(2, 2, 2, one, 2, extra);
        rp_error err;
        rp_session *s = test_session(m, &a, NULL);
        rp_weights *straight = s ? run(s, 0, 4) : NULL;
        rp_session_free(s);
        s = test_session(m, &a, NULL);
        rp_train_state half = {0};
        if (s) {
            rp_weights_free(run(s, 0, 2));
            CHECK_OK(rp_session_get_state(s, &half, &err), err);
        }
        rp_session_free(s);
        for (int i = 0; i < 3 && straight; i++) {
            rp_config b = config(T[i], T[i] == 4 ? 1 : 2, 2, one, 2, T[i] == 2 ? extra : "");
            rp_session *r = test_session(m, &b, NULL);
            rp_weights *rest = NULL;
            if (r && !rp_session_set_state(r, &half, &err))
                rest = run(r, 2, 2);
            else if (r)
                CHECKF(0, "set_state at t=%d: %s", T[i], err.msg);
            double d = rest ? test_weights_diff(straight, rest) : INFINITY;
            if (T[i] == 2)
                CHECKF(d == 0, "%s: resumed at t=2, weights %g from the straight run's",
                       NAMES[mi], d);
            else
                CHECKF(d <= 1e-5, "%s: written at t=2, resumed at t=%d: weights %g from the "
                       "straight run's", NAMES[mi], T[i], d);
            rp_weights_free(rest);
            rp_session_free(r);
        }
        rp_train_state_free(&half);
        rp_weights_free(straight);
        rp_model_free(m);
    }
}

/* Counts of a traced update's tensor-group collectives, per worker (4) and
** micro-batch (4): all-reduces in forward and backward, all-gathers. */
typedef struct tp_counts {
    int fwd[4][4], bwd[4][4], gather[4][4];
} tp_counts;

static void traced_update(const rp_model *m, const rp_config *c, tp_counts *n) {
    memset(n, 0, sizeof *n);
    rp_error err;
    rp_session *s = test_session(m, c, NULL);
    if (!s) {
        test_failures++;
        return;
    }
    CHECK_OK(rp_session_trace(s, true, &err), err);
    rp_weights_free(run(s, 0, 1));
    const char *path = "test_tensor_parallel.trace.json";
    CHECK_OK(rp_session_write_trace(s, path, &err), err);
    rp_session_free(s);
    static char text[1 << 20];
    CHECK(test_take_file(path, text, sizeof text) > 0);
    static const char *const KIND = "\"name\":\"tensor all-";
    for (char *p = text; (p = strstr(p, KIND)); p++) {
        char *q = p + strlen(KIND); /* "reduce (forward) 3" or "gather (loss) 3" */
        char *mb = strchr(q, ')') + 2, *tid = strstr(p, "\"tid\":");
        int b = atoi(mb), w = tid ? atoi(tid + 6) : -1;
        if (w < 0 || w >= 4 || b < 0 || b >= 4)
            continue;
        int(*to)[4] = strncmp(q, "gather", 6) == 0         ? n->gather
                      : strncmp(q, "reduce (forward)", 16) == 0 ? n->fwd
                                                              : n->bwd;
        to[w][b]++;
    }
}

/* The traces of an update at t = 2: for every micro-batch, two all-reduces
** of the tensor group per block in forward and two in backward; with the
** vocabulary split, one more in forward (the embedding's lookups), one more
** in backward (the head's input) and the loss's one all-gather.
**
** The LLaMA model has one block, cut after its second norm: stage 0 sums
** the embedding's lookups and the attention's output in forward and, in
** backward, the gradients of both norms' outputs (a tensor's gradient is
** summed where the tensor is made); stage 1 the MLP's output in forward,
** the final norm's gradient in backward, and gathers the loss's sums. The
** fused GPT's two blocks on one stage make their own four each. */
static void trace(void) {
    int one[2] = {1, 1};
    rp_model *m = test_model(LLAMA);
    sgd = false;
    rp_config c = config(2, 2, 1, one, 4, "");
    c.layers_per_stage.layers[0] = 7, c.layers_per_stage.layers[1] = -1;
    tp_counts n;
    traced_update(m, &c, &n);
    for (int w = 0; w < 4; w++) /* workers 0 and 1 run stage 0 */
        for (int b = 0; b < 4; b++)
            CHECKF(n.fwd[w][b] == (w < 2 ? 2 : 1) && n.bwd[w][b] == (w < 2 ? 2 : 1) &&
                       n.gather[w][b] == (w < 2 ? 0 : 1),
                   "llama, worker %d, micro-batch %d: %d all-reduces in forward, %d in "
                   "backward, %d all-gathers", w, b, n.fwd[w][b], n.bwd[w][b], n.gather[w][b]);
    c.vocab_parallel = false; /* the blocks' alone */
    traced_update(m, &c, &n);
    for (int w = 0; w < 4; w++)
        for (int b = 0; b < 4; b++)
            CHECKF(n.fwd[w][b] == 1 && n.bwd[w][b] == (w < 2 ? 2 : 0) && n.gather[w][b] == 0,
                   "llama, whole vocabulary, worker %d, micro-batch %d: %d all-reduces in "
                   "forward, %d in backward, %d all-gathers", w, b, n.fwd[w][b], n.bwd[w][b],
                   n.gather[w][b]);
    rp_model_free(m);
    m = test_model(FUSED);
    sgd = true;
    c = config(2, 1, 1, one, 4, "");
    traced_update(m, &c, &n);
    for (int w = 0; w < 2; w++)
        for (int b = 0; b < 4; b++)
            CHECKF(n.fwd[w][b] == 2 * 2 + 1 && n.bwd[w][b] == 2 * 2 + 1 && n.gather[w][b] == 1,
                   "fused gpt, worker %d, micro-batch %d: %d all-reduces in forward, %d in "
                   "backward, %d all-gathers", w, b, n.fwd[w][b], n.bwd[w][b], n.gather[w][b]);
    rp_model_free(m);
}

/* Rank k's slice of a fused Q, K, V weight (8 query heads, 4 key and value
** heads of 2 rows each, 16 inputs): at t = 2, rank 1's first row is the
** whole weight's query row 8, its 9th row key row 4 (row 16 + 4), its 13th
** value row 4 (row 24 + 4); its output projection's first row starts at
** column 8. And what cannot be split is refused, naming the line. */
static void split(void) {
    rp_model *m = test_model(LLAMA), *lm;
    size_t *map;
    rp_error err;
    CHECK_OK(rp_model_tensor_split(m, 2, 1, 0, &lm, &map, &err), err);
    const rp_variable *q = &m->vars[2], *lq = &lm->vars[2], *o = &m->vars[3], *lo = &lm->vars[3];
    CHECK(lq->count * 2 == q->count && lq->split && lm->vars[1].split == false);
    CHECK(map[lq->offset] == q->offset + 8 * 16);
    CHECK(map[lq->offset + 8 * 16] == q->offset + 20 * 16);
    CHECK(map[lq->offset + 12 * 16 + 3] == q->offset + 28 * 16 + 3);
    CHECK(map[lo->offset] == o->offset + 8 && map[lo->offset + 8] == o->offset + 16 + 8);
    CHECK(lm->layers[3].heads == 4 && lm->layers[3].kv_heads == 2);
    CHECK(lm->layers[4].tp_reduce == RP_TP_REDUCE_OUTPUT && lm->layers[1].tp_reduce == RP_TP_REDUCE_GRAD);
    CHECK(lm->layers[6].tp_reduce == RP_TP_REDUCE_GRAD && lm->layers[11].tp_reduce == RP_TP_REDUCE_OUTPUT);
    CHECK(lm->layers[0].vocab == 13 && lm->layers[14].units == 13 && !lm->vars[0].split);
    rp_model_free(lm), free(map);
    /* by vocabulary, 13 rows over 2: rank 1 holds rows 6 to 12 of the
    ** table and of the head, 4 ranks hold 3, 3, 3 and 4 */
    CHECK_OK(rp_model_tensor_split(m, 2, 1, RP_TP_VOCAB, &lm, &map, &err), err);
    const rp_variable *e = &m->vars[0], *le = &lm->vars[0];
    const rp_variable *h = &m->vars[m->num_vars - 1], *lh = &lm->vars[lm->num_vars - 1];
    CHECK(lm->layers[0].vocab == 7 && lm->layers[0].tp_vocab == 13 &&
          lm->layers[0].tp_vocab_first == 6 && le->split && le->count == 7 * 16);
    CHECK(map[le->offset] == e->offset + 6 * 16 && map[le->offset + 7 * 16 - 1] == e->offset + 13 * 16 - 1);
    CHECK(lm->layers[14].units == 7 && lh->split && map[lh->offset + 16 + 2] == h->offset + 7 * 16 + 2);
    CHECK(lm->layers[15].tp_vocab_first == 6 && lm->layers[15].in.dim[1] == 7 &&
          lm->layers[15].tp_ranks == 2);
    CHECK((lm->layers[0].tp_reduce & RP_TP_REDUCE_OUTPUT) && (lm->layers[13].tp_reduce & RP_TP_REDUCE_GRAD));
    rp_model_free(lm), free(map);
    for (int k = 0; k < 4; k++) {
        CHECK_OK(rp_model_tensor_split(m, 4, k, RP_TP_VOCAB, &lm, &map, &err), err);
        CHECKF(lm->layers[0].vocab == (k < 3 ? 3 : 4) && lm->layers[0].tp_vocab_first == 3 * k,
               "t=4, rank %d: rows %d from %d", k, lm->layers[0].vocab, lm->layers[0].tp_vocab_first);
        rp_model_free(lm), free(map);
    }
    /* a fused block's slices, heads 4 of 4 rows (C 16) at t = 2: rank 1's
    ** Q, K and V rows are the whole's 8, 24 and 40 onward, its output
    ** projection's columns 8 onward, its MLP's rows 16 (of 32) onward */
    rp_model *f = test_model(FUSED);
    CHECK_OK(rp_model_tensor_split(f, 2, 1, RP_TP_VOCAB, &lm, &map, &err), err);
    const rp_variable *fv = &f->vars[f->layers[3].first_var], *lv = &lm->vars[lm->layers[3].first_var];
    CHECK(lm->layers[3].heads == 2 && lm->layers[3].tp_ranks == 2 && lm->layers[3].tp_skip_bias);
    CHECK(!lv[0].split && lv[2].split && lv[2].count == 24 * 16 && !lv[5].split && lv[10].split);
    CHECK(map[lv[2].offset] == fv[2].offset + 8 * 16 && map[lv[2].offset + 8 * 16] == fv[2].offset + 24 * 16 &&
          map[lv[2].offset + 16 * 16 + 5] == fv[2].offset + 40 * 16 + 5);
    CHECK(map[lv[3].offset + 9] == fv[3].offset + 25);
    CHECK(map[lv[4].offset] == fv[4].offset + 8 && map[lv[4].offset + 8] == fv[4].offset + 16 + 8);
    CHECK(map[lv[8].offset] == fv[8].offset + 16 * 16 && map[lv[10].offset + 16] == fv[10].offset + 32 + 16);
    rp_model_free(lm), free(map), rp_model_free(f);
    /* the memory plan holds a rank's slice: of the model's 2384 parameters
    ** 1920 are in split linears (Q, K, V 512, output 256, the MLP's 3 x
    ** 384) and 416 in the table and the head (13 rows of 16 each); the
    ** plan is the largest rank's, so at t = 2 48 + 960 + 7 rows of each, at
    ** t = 4 48 + 480 + 4 */
    int one[2] = {1, 1};
    for (int t = 1; t <= 4; t *= 2) {
        for (int vocab = 0; vocab < 2; vocab++) {
            rp_config c = config(t, 1, 1, one, 1, "");
            c.vocab_parallel = vocab;
            rp_session *s = test_session(m, &c, NULL);
            rp_memory mem = {0};
            if (s)
                CHECK_OK(rp_session_memory(s, 0, &mem, &err), err);
            size_t rows = vocab ? (size_t)(13 + t - 1) / t : 13;
            CHECKF(mem.params == sizeof(float) * (48 + 1920 / t + 2 * 16 * rows),
                   "t=%d, vocab_parallel %d: %zu bytes of parameters", t, vocab, mem.params);
            rp_session_free(s);
        }
    }
    static const struct {
        const char *spec;
        int t;
        const char *want;
    } bad[] = {
        {NULL, 8, "line 5 (attention) has 4 key and value heads, not a multiple of 8"},
        {"input 4\nembedding 5 6\nlinear 6\nrelu\nlinear 6\nlinear 5\nsoftmax_cross_entropy\n", 4,
         "line 3 (linear) has 6 output features, not a multiple of 4"},
        {"input 4\nx = embedding 5 8\nlinear 8\nrelu\nl = linear 8\nb = linear 8 < x\n"
         "add < l b\nlinear 5\nsoftmax_cross_entropy\n", 2,
         "read by line 6 (linear), which is not split"},
        {"input 4\nembedding 5 8\ntransformer_block heads=2\nlinear 5\nsoftmax_cross_entropy\n", 4,
         "line 3 (transformer_block) has 2 heads, not a multiple of 4"},
        {"input 4\nlinear 6\nsigmoid\nsoftmax_cross_entropy\n", 2, "nothing to split"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rp_model *b = bad[i].spec ? test_model(bad[i].spec) : m;
        rp_status st = rp_model_tensor_split(b, bad[i].t, 0, RP_TP_VOCAB, &lm, &map, &err);
        CHECKF(st != RP_OK && strstr(err.msg, bad[i].want), "case %zu: %s", i,
               st ? err.msg : "accepted");
        if (!st)
            rp_model_free(lm), free(map);
        if (b != m)
            rp_model_free(b);
    }
    rp_model_free(m);
}

int main(int argc, char **argv) {
    rp_error err;
    if (argc > 1 && strcmp(argv[1], "--mpi") == 0 && rp_comm_mpi_init(&argc, &argv, &mpi, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (mpi) {
        layouts(true, rp_comm_size(mpi));
        char name[64];
        snprintf(name, sizeof name, "test_tensor_parallel (mpi rank %d)", rp_comm_rank(mpi));
        int rc = test_finish(name);
        rp_comm_mpi_finalize(mpi);
        return rc;
    }
    layouts(false, 0);
    resume();
    trace();
    split();
    return test_finish("test_tensor_parallel (local)");
}
