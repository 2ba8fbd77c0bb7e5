/*
** Model specs, optimizers, weight files, IDX files, the sample stream and a
** net's layer clock.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <time.h>

#include "repipe/data.h"
#include "repipe/layers.h"
#include "repipe/net.h"
#include "repipe/weights.h"
#include "test.h"

static rp_status parse(const char *spec, rp_model **m, rp_error *err) {
    return rp_model_parse(m, spec, strlen(spec), "m.model", err);
}

static void test_examples(void) {
    rp_model *m;
    rp_error err;
    CHECK(parse("input 1 28 28\nflatten\nlinear 512\nrelu\nlinear 512\nrelu\nlinear 10\n"
                "softmax_cross_entropy\n", &m, &err) == RP_OK);
    /* 784*512+512 + 512*512+512 + 512*10+10 */
    CHECK_INT(m->num_params, 669706);
    CHECK_INT(m->num_layers, 7);
    CHECK_INT(m->num_vars, 6);
    CHECK_INT(m->num_classes, 10);
    CHECK(strcmp(m->vars[2].name, "3.weight") == 0);
    rp_model_free(m);
    CHECK(parse("# CNN\ninput 1 28 28\nconv2d 16 kernel=3 pad=1  # same size\nrelu\n"
                "maxpool2d 2\nconv2d 32 kernel=3 pad=1\nrelu\nmaxpool2d 2\nflatten\nlinear 10\n"
                "softmax_cross_entropy\n", &m, &err) == RP_OK);
    /* 16*9+16 + 32*16*9+32 + 1568*10+10 */
    CHECK_INT(m->num_params, 20490);
    CHECK_INT(m->layers[2].out.dim[1], 14);
    CHECK_INT(m->layers[5].out.dim[0], 32);
    CHECK_INT(m->layers[5].out.dim[2], 7);
    CHECK_INT(m->layers[6].out.dim[0], 1568);
    CHECK_INT(m->layers[0].line, 3);
    rp_model_free(m);
    CHECK(parse("input 12\nembedding 100 8 group_size=1\nlayernorm eps=1e-6\nlinear 4\nflatten\n"
                "dropout p=0.1\nlinear 3\nsoftmax_cross_entropy\n", &m, &err) == RP_OK);
    CHECK_INT(m->layers[0].group_size, 1);
    CHECK_INT(m->layers[2].out.dim[1], 4);
    CHECK_INT(m->layers[3].out.dim[0], 48);
    CHECK(m->layers[4].p == 0.1f);
    rp_model_free(m);
    /* tokens and their positions: (T x C) after the embedding, a (T, C) table */
    CHECK(parse("input 6\nembedding 10 4\nposition_embedding\nflatten\nlinear 10\n"
                "softmax_cross_entropy\n", &m, &err) == RP_OK);
    CHECK_INT(m->layers[1].out.ndim, 2);
    CHECK_INT(m->vars[1].shape.dim[0], 6);
    CHECK_INT(m->vars[1].shape.dim[1], 4);
    CHECK(strcmp(m->vars[1].name, "1.weight") == 0);
    CHECK_INT(m->num_params, 10 * 4 + 6 * 4 + 24 * 10 + 10);
    rp_model_free(m);
    /* a block: 12 named tensors, GPT-2's 12 C^2 + 13 C parameters at mlp=4, the
    ** input's shape out */
    CHECK(parse("input 5 8\ntransformer_block heads=2 dropout=0.1\n"
                "transformer_block heads=4 mlp=2 gelu=erf\n", &m, &err) == RP_OK);
    CHECK_INT(m->num_vars, 24);
    CHECK_INT(m->layers[0].param_count, 12 * 64 + 13 * 8);
    CHECK_INT(m->layers[1].param_count, 4 * 64 + 2 * 128 + 2 * 16 + 24 + 8 + 16 + 8);
    CHECK_INT(m->layers[1].out.dim[0], 5);
    CHECK_INT(m->layers[1].out.dim[1], 8);
    CHECK(m->layers[0].p == 0.1f && !m->layers[0].gelu_erf && m->layers[1].gelu_erf);
    CHECK(strcmp(m->vars[2].name, "0.attn.qkv.weight") == 0);
    CHECK_INT(m->vars[2].shape.dim[0], 24);
    CHECK(strcmp(m->vars[12 + 11].name, "1.mlp.proj.bias") == 0);
    CHECK_INT(m->vars[12 + 10].shape.dim[1], 16);
    /* GPT-2's initialisation: LN ones and zeros, biases zero, the projections
    ** into the residual stream 0.02 / sqrt(2 x 2 blocks) */
    float *w = malloc(sizeof(float) * m->num_params);
    rp_model_init_params(m, 0, 2, 7, NULL, w);
    CHECK(w[0] == 1.0f && w[8] == 0.0f && w[m->vars[3].offset] == 0.0f);
    double ss[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const rp_variable *v = &m->vars[k ? 10 : 8]; /* mlp.fc, then mlp.proj: 256 each */
        for (size_t e = 0; e < v->count; e++)
            ss[k] += (double)w[v->offset + e] * w[v->offset + e] / v->count;
    }
    CHECK_CLOSE(sqrt(ss[0]), 0.02, 0.15); /* 256 draws: a standard error of 4.4 % */
    CHECK_CLOSE(sqrt(ss[1]), 0.01, 0.15);
    free(w);
    rp_model_free(m);
    /* a tied head starts as its embedding's table, drawn with the table's std */
    CHECK(parse("input 4\nembedding 9 6 std=0.02\nlinear 9 bias=false tie=0\n"
                "softmax_cross_entropy\n", &m, &err) == RP_OK);
    CHECK_INT(m->layers[1].tie, 1);
    w = malloc(sizeof(float) * m->num_params);
    rp_model_init_params(m, 0, 3, 11, NULL, w);
    CHECK(memcmp(w, w + 54, sizeof(float) * 54) == 0);
    double sq = 0;
    for (int e = 0; e < 54; e++)
        sq += (double)w[e] * w[e] / 54;
    CHECK_CLOSE(sqrt(sq), 0.02, 0.25); /* 54 draws */
    free(w);
    rp_model_free(m);
}

static void test_spec_errors(void) {
    static const struct {
        const char *spec, *msg;
    } cases[] = {
        {"", "no 'input' line"},
        {"linear 3\n", "m.model:1: the first line must declare the input shape"},
        {"input 4\n", "the model has no layers"},
        {"input 4\ninput 4\n", "m.model:2: a second 'input' line"},
        {"input 0\n", "m.model:1: input dimension: '0' is not a whole number"},
        {"input 4\nlinaer 3\n", "m.model:2: unknown layer 'linaer' (did you mean 'linear'?)"},
        {"input 4\nlinear\n", "m.model:2: linear takes 1 argument"},
        {"input 4\nlinear x\n", "m.model:2: output features: 'x' is not a whole number"},
        {"input 4\nlinear 3 bias=maybe\n", "bias: 'maybe' is not true or false"},
        {"input 4\nlinear 3 kernel=2\n", "m.model:2: linear takes no option 'kernel'"},
        {"input 4\nconv2d 3 kernel=3\n",
         "m.model:2: conv2d needs a 3-dimensional input (channels x height x width), but its "
         "input has shape 4"},
        {"input 1 2 2\nconv2d 3 kernel=5\n", "but its input has shape 1x2x2"},
        {"input 1 4 4\nconv2d 3\n", "m.model:2: conv2d needs kernel=K"},
        {"input 1 4 4\nmaxpool2d 2\nlinear 3\nsoftmax_cross_entropy\n",
         "softmax_cross_entropy needs a 1-dimensional input of class scores, or 2-dimensional "
         "(tokens x classes) (flatten first), but its input has shape 1x2x3"},
        {"input 4\nsoftmax_cross_entropy\nlinear 2\n",
         "m.model:3: softmax_cross_entropy (line 2) must be the last layer"},
        {"input 4\ndropout 1.5\n", "dropout probability '1.5' is not a number in [0, 1)"},
        {"input 2 3\nembedding 5 4\n", "embedding needs a 1-dimensional input of token ids"},
        {"input 6\nposition_embedding\n",
         "position_embedding needs a 2-dimensional input (positions x features)"},
        {"input 4\nlayernorm eps=0\n", "eps: '0' is not a number > 0"},
        {"input 4 6\ntransformer_block\n", "m.model:2: transformer_block needs heads=H"},
        {"input 4\nembedding 9 6\nlinear 9 tie=1\n",
         "m.model:3: tie=1: layer 1 is not an embedding before this layer"},
        {"input 4\nembedding 9 6\nlinear 8 tie=0\n",
         "m.model:3: tie=0: the embedding's table is 9 x 6, but this layer's weight is 8 x 6"},
        {"input 4\nembedding 9 6 std=-1\n", "std: '-1' is not a number in (0, 1000]"},
        {"input 4 6\ntransformer_block heads=4\n",
         "transformer_block needs features divisible by its 4 heads, but its input has shape 4x6"},
        {"input 24\ntransformer_block heads=2\n",
         "transformer_block needs a 2-dimensional input (positions x features)"},
        {"input 4 6\ntransformer_block heads=2 gelu=relu\n", "gelu: 'relu' is not tanh or erf"},
        {"input 4 6\ntransformer_block heads=2 dropout=1\n", "dropout: '1' is not a number in [0, 1)"},
        {"input 4 6\ntransformer_block heads=2 kernel=3\n",
         "transformer_block takes no option 'kernel' (it takes: heads mlp dropout gelu group_size )"},
        {"input 4\nrelu extra\n", "relu takes 0 arguments"},
        {"input 4\nlinear 3 stride\n", "m.model:2: linear takes 1 argument before its options, not 2"},
        {"input 4\nlinear 3 bias=true extra\n", "m.model:2: unexpected 'extra'"},
        /* graphs: a cycle (a name read before its line), an unknown name, a name
        ** given twice, shapes add and concat cannot join, what nothing reads */
        {"x = input 4\na = linear 4 < b\nb = linear 4 < a\n",
         "m.model:2: 'b' is not the name of an earlier line (names are defined before they are "
         "read)"},
        {"x = input 4\nlinear 4\nadd < x y\n", "m.model:3: 'y' is not the name of an earlier line"},
        {"x = input 4\nx = linear 4\n", "m.model:2: the name 'x' is taken (line 1)"},
        {"input 4\na = relu\na = relu\n", "m.model:3: the name 'a' is taken (line 2)"},
        {"x = input 4\na = linear 3\nadd < a x\n",
         "m.model:3: add: input 2 has shape 4, input 1 3 (its inputs need one shape)"},
        {"x = input 4\nmul < x x x\n", "m.model:2: mul reads two inputs ('mul < a b'), not 3"},
        {"x = input 2 4 4\na = conv2d 3 kernel=3\nconcat < a x\n",
         "m.model:3: concat: input 2 has shape 2x4x4, input 1 3x2x2"},
        {"x = input 4\na = linear 3\nlinear 2 < x\n",
         "m.model:2: nothing reads the output of this linear"},
        {"x = input 4\nadd < x\n", "m.model:2: add reads two or more, not 1 inputs"},
        {"x = input 4\nlinear 2 < x x\n", "m.model:2: linear reads one input, not 2 inputs"},
        {"input 4\nconcat\n", "m.model:2: concat needs two or more inputs ('concat < a b')"},
        {"x = input 4\nlinear 4 <\n", "m.model:2: '<' names no input"},
        {"input 4\nb1=linear 4\n", "a name is given with spaces around '='"},
        {"input 4\n1b = linear 4\n", "m.model:2: '1b' is not a name"},
        {"input 4\nx = input 4\n", "m.model:2: a second 'input' line"},
        {"x = input 4\nrelu\nrelu < x\n", "m.model:2: nothing reads the output of this relu"},
        {"input 3 6 6\nconv2d 4 kernel=3 groups=2\n",
         "conv2d needs input and output channels divisible by its 2 groups"},
        {"input 4 6 6\nconv2d 3 kernel=3 groups=2\n",
         "m.model:2: conv2d: 3 output channels are not divisible by its 2 groups"},
        {"input 4\nbatchnorm2d\n", "batchnorm2d needs a 3-dimensional input"},
        {"input 4\nbatchnorm1d momentum=0\n", "momentum: '0' is not a number in (0, 1]"},
        {"input 1 6 6\nmaxpool2d 2 pad=2\n", "maxpool2d: pad=2 is more than half its kernel 2"},
        {"input 1 6 6\nadaptive_avgpool2d 1 2\n", "adaptive_avgpool2d takes one output size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rp_model *m = NULL;
        rp_error err;
        CHECK(parse(cases[i].spec, &m, &err) != RP_OK);
        CHECK(m == NULL);
        CHECK_STR_HAS(err.msg, cases[i].msg);
    }
}

static void test_optimizers(void) {
    /* worked by hand: p = 1, g = 0.5 twice */
    rp_optimizer_config sgd = {RP_OPT_SGD, 0.1, 0.9, 0.01, 0.9, 0.999, 1e-8};
    float p = 1, g = 0.5f, st[2] = {0, 0};
    rp_optimizer_step(&sgd, 1, &p, &g, st, 1);
    CHECK_CLOSE(p, 0.949, 1e-6); /* v = 0.5 + 0.01 = 0.51 */
    rp_optimizer_step(&sgd, 2, &p, &g, st, 1);
    CHECK_CLOSE(p, 0.852151, 1e-6); /* v = 0.9*0.51 + 0.5 + 0.00949 */
    CHECK_INT(rp_optimizer_state_per_param(&sgd), 1);
    sgd.momentum = 0;
    CHECK_INT(rp_optimizer_state_per_param(&sgd), 0);
    rp_optimizer_config adam = {RP_OPT_ADAM, 0.1, 0, 0, 0.9, 0.999, 1e-8};
    p = 1;
    st[0] = st[1] = 0;
    rp_optimizer_step(&adam, 1, &p, &g, st, 1);
    CHECK_CLOSE(p, 0.9, 1e-6); /* m^ = 0.5, v^ = 0.25: step 0.1 */
    rp_optimizer_step(&adam, 2, &p, &g, st, 1);
    CHECK_CLOSE(p, 0.8, 1e-5); /* float32 moments: 2e-6 off */
    rp_optimizer_config adamw = {RP_OPT_ADAMW, 0.1, 0, 0.1, 0.9, 0.999, 1e-8};
    p = 1;
    st[0] = st[1] = 0;
    rp_optimizer_step(&adamw, 1, &p, &g, st, 1);
    CHECK_CLOSE(p, 0.89, 1e-6); /* 1 * (1 - 0.01) - 0.1 */
    CHECK_INT(rp_optimizer_state_per_param(&adamw), 2);
}

static void test_weight_files(void) {
    rp_model *m;
    rp_error err;
    CHECK(parse("input 3\nlinear 2\nlayernorm\nsoftmax_cross_entropy\n", &m, &err) == RP_OK);
    float p[16];
    for (int i = 0; i < (int)m->num_params; i++)
        p[i] = 0.25f * i - 1;
    rp_weights *w, *back;
    CHECK(rp_weights_from_params(m, p, &w, &err) == RP_OK);
    char path[] = "/tmp/repipe-w-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(rp_weights_save(w, path, &err) == RP_OK);
    CHECK(rp_weights_load(&back, path, &err) == RP_OK);
    float q[16] = {0};
    CHECK(rp_weights_to_params(m, back, 0, q, &err) == RP_OK);
    CHECK(memcmp(p, q, sizeof(float) * m->num_params) == 0);
    CHECK(rp_tensor_rel_diff(p, q, m->num_params) == 0);
    rp_weights_free(back);
    /* every damaged byte is caught */
    FILE *f = fopen(path, "rb");
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    int caught = 0;
    for (size_t i = 0; i < n; i++) {
        buf[i] ^= 0x10;
        if (rp_weights_parse(&back, buf, n, "damaged", &err) != RP_OK)
            caught++;
        else
            rp_weights_free(back);
        buf[i] ^= 0x10;
    }
    CHECK_INT(caught, (long long)n);
    CHECK(rp_weights_parse(&back, buf, n - 7, "short", &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "short: checksum mismatch");
    CHECK(rp_weights_parse(&back, (const unsigned char *)"hello", 5, "x", &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "bad magic");
    /* a shape that does not fit the model */
    rp_model *m2;
    CHECK(parse("input 4\nlinear 2\nlayernorm\nsoftmax_cross_entropy\n", &m2, &err) == RP_OK);
    CHECK(rp_weights_to_params(m2, w, 0, q, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "'0.weight' has shape 2x3 in the file but 2x4 in the model");
    rp_model_free(m2);
    /* a file holding NaN loads, and is named as such by the check */
    CHECK(rp_weights_check_finite(w, path, &err) == RP_OK);
    w->tensors[1].data[1] = NAN;
    CHECK(rp_weights_save(w, path, &err) == RP_OK);
    CHECK(rp_weights_load(&back, path, &err) == RP_OK);
    CHECK(rp_weights_check_finite(back, "nan.rpw", &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "nan.rpw: tensor '0.bias' holds nan at element 1");
    /* and differs from itself: NaN is never "the same" */
    CHECK(rp_tensor_rel_diff(back->tensors[1].data, back->tensors[1].data, 2) > 1);
    rp_weights_free(back);
    remove(path);
    rp_weights_free(w);
    rp_model_free(m);
    /* relative difference: to the scale of the tensor */
    float a[3] = {1, -2, 0}, b[3] = {1, -2.002f, 0};
    CHECK_CLOSE(rp_tensor_rel_diff(a, b, 3), 0.002 / 2.002, 1e-4);
}

static void test_idx(void) {
    unsigned char img[4 + 12 + 2 * 3 * 2] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2};
    for (int i = 0; i < 12; i++)
        img[16 + i] = (unsigned char)(i * 20);
    int nd, dims[4];
    const unsigned char *v;
    rp_error err;
    CHECK(rp_idx_parse(img, sizeof img, "i", &nd, dims, &v, &err) == RP_OK);
    CHECK_INT(nd, 3);
    CHECK_INT(dims[1], 3);
    CHECK_INT(v[11], 220);
    CHECK(rp_idx_parse(img, sizeof img - 1, "i", &nd, dims, &v, &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "i: truncated: the header promises 12 values but 11 are present");
    img[2] = 0x0d;
    CHECK(rp_idx_parse(img, sizeof img, "i", &nd, dims, &v, &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "element type 0x0d");
    img[2] = 8;
    img[0] = 1;
    CHECK(rp_idx_parse(img, sizeof img, "i", &nd, dims, &v, &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "bad magic");
    rp_dataset *d;
    CHECK(rp_dataset_load_idx(&d, "/nonexistent", true, &err) == RP_ERR_IO);
    CHECK_STR_HAS(err.msg, "/nonexistent/train-images-idx3-ubyte");
}

static void test_stream(void) {
    rp_stream a, b;
    rp_error err;
    CHECK(rp_stream_init(&a, 7, 100, 30, &err) == RP_OK);
    CHECK(rp_stream_init(&b, 7, 100, 30, &err) == RP_OK);
    CHECK_INT(rp_stream_updates_per_epoch(&a), 3);
    int64_t ia[30], ib[30];
    int seen[100] = {0};
    for (int u = 0; u < 3; u++) {
        CHECK(rp_stream_update(&a, u, ia, &err) == RP_OK);
        for (int i = 0; i < 30; i++)
            seen[ia[i]]++;
    }
    int once = 0;
    for (int i = 0; i < 100; i++)
        once += seen[i] == 1;
    CHECK_INT(once, 90); /* an epoch visits distinct samples; 10 left over */
    CHECK(rp_stream_update(&a, 4, ia, &err) == RP_OK);
    /* b jumps straight to epoch 1's second update */
    CHECK(rp_stream_update(&b, 1, ib, &err) == RP_OK);
    CHECK(rp_stream_update(&b, 4, ib, &err) == RP_OK);
    CHECK(memcmp(ia, ib, sizeof ia) == 0);
    CHECK(rp_stream_update(&b, 1, ib, &err) == RP_OK);
    CHECK(memcmp(ia, ib, sizeof ia) != 0); /* epochs are shuffled differently */
    /* before the first update: refused (it read before the permutation) */
    CHECK(rp_stream_update(&a, -1, ia, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "update -1; updates count from 0");
    rp_stream_free(&a);
    rp_stream_free(&b);
    /* sequential: every epoch front to back */
    rp_stream q;
    CHECK(rp_stream_init(&q, 7, 100, 30, &err) == RP_OK);
    q.sequential = true;
    int64_t qi[30];
    /* epoch 1 (3 updates an epoch), its second update */
    CHECK(rp_stream_update(&q, 4, qi, &err) == RP_OK);
    for (int i = 0; i < 30; i++)
        CHECK_INT(qi[i], 30 + i);
    rp_stream_free(&q);
    CHECK(rp_stream_init(&a, 7, 10, 30, &err) == RP_ERR_INVALID);
}

/* Sampling: a model whose next token is (this + 1) mod 5 for certain, by
** construction of its table, continues any prompt by counting, also past
** its window of T = 4; draws are a function of the seed. */
static void test_generate(void) {
    rp_model *m;
    rp_error err;
    CHECK(parse("input 4\nembedding 5 5\nposition_embedding\nsoftmax_cross_entropy\n", &m,
                &err) == RP_OK);
    float *w = calloc(m->num_params, sizeof(float)); /* positions stay 0 */
    for (int v = 0; v < 5; v++)
        w[v * 5 + (v + 1) % 5] = 40; /* the scores of token v: 40 at v + 1 */
    int32_t t[12] = {2};
    CHECK_OK(rp_model_generate(m, w, t, 1, 11, 0, 0, 1, &err), err);
    for (int i = 1; i < 12; i++)
        CHECK_INT(t[i], (2 + i) % 5);
    int32_t u[12] = {4, 0, 3}; /* a prompt of 3: continue after the 3 */
    CHECK_OK(rp_model_generate(m, w, u, 3, 9, 1.0, 2, 9, &err), err);
    for (int i = 3; i < 12; i++)
        CHECK_INT(u[i], (3 + i - 2) % 5);
    /* even odds between two tokens: the seed decides, and decides the same way again */
    for (int v = 0; v < 5; v++)
        w[v * 5 + (v + 2) % 5] = 40;
    int32_t a[40] = {0}, b[40] = {0}, c[40] = {0};
    CHECK_OK(rp_model_generate(m, w, a, 1, 39, 1.0, 0, 7, &err), err);
    CHECK_OK(rp_model_generate(m, w, b, 1, 39, 1.0, 0, 7, &err), err);
    CHECK_OK(rp_model_generate(m, w, c, 1, 39, 1.0, 0, 8, &err), err);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    int ones = 0;
    for (int i = 1; i < 40; i++) {
        int step = (a[i] - a[i - 1] + 5) % 5;
        CHECK(step == 1 || step == 2);
        ones += step == 1;
    }
    CHECK(ones > 5 && ones < 34); /* 39 fair coins */
    int32_t bad[2] = {7};
    CHECK(rp_model_generate(m, w, bad, 1, 1, 1.0, 0, 1, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "prompt token 0 is 7, outside the vocabulary [0, 5)");
    free(w);
    rp_model_free(m);
    CHECK(parse("input 6\nlinear 3\nsoftmax_cross_entropy\n", &m, &err) == RP_OK);
    CHECK(rp_model_generate(m, NULL, bad, 1, 1, 1.0, 0, 1, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "generate needs a token model");
    rp_model_free(m);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* rp_net_time_layers: each layer's time lands in its own slot and pass,
** the slots add up to no more than the passes took, and nothing is counted
** once the clock is off. */
static void test_layer_clock(void) {
    rp_model *m;
    rp_error err;
    CHECK(parse("input 1 8 8\nflatten\nlinear 256\nrelu\nlinear 256\nrelu\nlinear 10\n"
                "softmax_cross_entropy\n", &m, &err) == RP_OK);
    int B = 32, L = m->num_layers;
    rp_net_options o = {.split_backward = true};
    rp_net *net;
    rp_acts *acts;
    CHECK(rp_net_create_with(m, 0, L, B, &o, &net, &err) == RP_OK);
    CHECK(rp_acts_create(net, B, &acts, &err) == RP_OK);
    rp_model_init_params(m, 0, L, 1, NULL, rp_net_params(net));
    float *x = calloc((size_t)B * 64, sizeof(float));
    int32_t labels[32] = {0};
    int64_t ids[32] = {0};
    double *ms = calloc(3 * (size_t)L, sizeof(double));
    rp_step_ctx ctx = {.training = true, .sample_id = ids, .labels = labels, .loss_scale = 1.0};
    rp_net_time_layers(net, ms);
    double t0 = now();
    CHECK(rp_net_forward(net, acts, x, B, &ctx, NULL) != NULL);
    double t1 = now();
    double fsum = 0;
    for (int l = 0; l < L; l++) {
        fsum += ms[3 * l];
        CHECK(ms[3 * l + 1] == 0 && ms[3 * l + 2] == 0); /* no backward yet */
    }
    CHECK(ms[0] == 0); /* the flatten is its input, read in place: no pass */
    for (int l = 1; l < L; l++)
        CHECK(ms[3 * l] > 0);
    CHECK(fsum <= t1 - t0);
    rp_net_backward_input(net, acts, NULL, &ctx, false);
    for (int l = 1; l < L; l++)
        CHECK(ms[3 * l + 1] > 0 && ms[3 * l + 2] == 0);
    rp_net_backward_weight(net, acts, &ctx);
    for (int l = 1; l < L; l++) /* the linears have a weights' half, the rest none */
        CHECK((ms[3 * l + 2] > 0) == (m->layers[l].param_count > 0));
    double before[24];
    memcpy(before, ms, sizeof(double) * 3 * L);
    rp_net_time_layers(net, NULL);
    CHECK(rp_net_forward(net, acts, x, B, &ctx, NULL) != NULL);
    rp_net_backward(net, acts, NULL, &ctx, false);
    CHECK(memcmp(before, ms, sizeof(double) * 3 * L) == 0);
    free(x), free(ms);
    rp_acts_free(acts);
    rp_net_free(net);
    rp_model_free(m);
}

int main(void) {
    test_examples();
    test_spec_errors();
    test_optimizers();
    test_weight_files();
    test_idx();
    test_stream();
    test_generate();
    test_layer_clock();
    return test_finish("test_model");
}
