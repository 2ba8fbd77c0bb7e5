/*
** safetensors files and Meta's LLaMA names.
**
** The reader against files the format's own package wrote (its samples:
** the values -3 .. 2 as F32, F16 and F64, and a file of every integer type,
** which repipe refuses by name), against files built here byte by byte
** (BF16, a scalar, and each way the format's rules can be broken), and in a
** round trip. Then a LLaMA-family model from PyTorch: the state_dict of
** tests/torch/make_llama_safetensors.py (Meta's names, PyTorch's
** initialisation) imported into tests/fixtures/llama/tiny.model takes
** PyTorch's losses through three AdamW updates, and exported again gives
** the file's tensors bit for bit; the same weights under Hugging Face's
** names and rotary row order (tiny_hf.safetensors) give the same
** parameters bit for bit.
**
**   test_safetensors FIXTURES_DIR
*/
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

static char dir[4096];

static const char *fixture(const char *name) {
    static char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* A file of one header and data, as bytes. */
static size_t build(unsigned char *buf, const char *header, const void *data, size_t n) {
    uint64_t h = strlen(header);
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, h);
    memcpy(buf + 8 + h, data, n);
    return 8 + h + n;
}

static void samples(void) {
    const char *names[] = {"safetensors/f.safetensors", "safetensors/e.safetensors",
                           "safetensors/d.safetensors"};
    const char *tensor[] = {"f", "e", "d"};
    for (int k = 0; k < 3; k++) {
        rp_weights *w;
        rp_error err;
        CHECK_OK(rp_safetensors_load(&w, fixture(names[k]), &err), err);
        if (!w)
            continue;
        CHECK_INT(w->num_tensors, 1); /* __metadata__ is not a tensor */
        CHECK(strcmp(w->tensors[0].name, tensor[k]) == 0);
        CHECK_INT(w->tensors[0].shape.ndim, 1);
        CHECK_INT(w->tensors[0].shape.dim[0], 6);
        for (int i = 0; i < 6; i++)
            CHECKF(w->tensors[0].data[i] == (float)(i - 3), "%s[%d] = %g", names[k], i,
                   w->tensors[0].data[i]);
        /* round trip: written by repipe, read back the same, header aligned */
        unsigned char *b;
        size_t len;
        rp_weights *back;
        CHECK_OK(rp_safetensors_serialize(w, &b, &len, &err), err);
        uint64_t h;
        memcpy(&h, b, 8);
        CHECK(h % 8 == 0 && len == 8 + h + 24);
        CHECK_OK(rp_safetensors_parse(&back, b, len, "round trip", &err), err);
        CHECK(back && back->num_tensors == 1 &&
              memcmp(back->tensors[0].data, w->tensors[0].data, 24) == 0);
        free(b);
        rp_weights_free(back);
        rp_weights_free(w);
    }
    rp_weights *w;
    rp_error err;
    CHECK(rp_safetensors_load(&w, fixture("safetensors/overall.safetensors"), &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "tensor 'B' is U8");
    CHECK(rp_safetensors_load(&w, fixture("safetensors/i.safetensors"), &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "tensor 'i' is I32");
}

static void built(void) {
    static unsigned char buf[4096];
    const uint16_t bf16[6] = {0xC040, 0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000}; /* -3 .. 2 */
    const float one = 1.5f;
    float six[6] = {0};
    rp_weights *w;
    rp_error err;
    size_t n = build(buf, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
                     bf16, 12);
    CHECK_OK(rp_safetensors_parse(&w, buf, n, "bf16", &err), err);
    if (w) {
        CHECK(w->tensors[0].shape.ndim == 2 && w->tensors[0].shape.dim[1] == 3);
        for (int i = 0; i < 6; i++)
            CHECK(w->tensors[0].data[i] == (float)(i - 3));
        rp_weights_free(w);
    }
    n = build(buf, "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}   ", &one,
              4);
    CHECK_OK(rp_safetensors_parse(&w, buf, n, "scalar", &err), err);
    if (w) {
        CHECK(w->tensors[0].shape.ndim == 1 && w->tensors[0].shape.dim[0] == 1 &&
              w->tensors[0].data[0] == 1.5f);
        rp_weights_free(w);
    }
    static const struct {
        const char *header;
        size_t data;
        const char *says;
    } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]}}",
         24, "must tile the data"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
         "the tensors end at byte 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
         "3 values of F32 take 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "appears twice"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,80]}}", 8,
         "outside the file's 8 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "is empty"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "\"data_offsets\": [begin, end]"},
        {"[1, 2]", 0, "not a JSON object"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        n = build(buf, bad[k].header, six, bad[k].data);
        CHECK(rp_safetensors_parse(&w, buf, n, "bad.safetensors", &err) != RP_OK);
        CHECK_STR_HAS(err.msg, bad[k].says);
        CHECK_STR_HAS(err.msg, "bad.safetensors");
    }
    uint64_t huge = 1u << 20;
    memcpy(buf, &huge, 8);
    CHECK(rp_safetensors_parse(&w, buf, 64, "short", &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "not a safetensors file");
}

/* The fixture's windows and PyTorch's losses. */
enum { T = 8, B = 4, UPDATES = 3 };
static float xs[B * T];
static int32_t ys[B * T];
static double want[UPDATES + 1];

static void read_losses(void) {
    char *text;
    size_t len;
    rp_error err;
    CHECK_OK(rp_read_file(fixture("llama/tiny_losses.txt"), &text, &len, &err), err);
    if (!text)
        return;
    int losses, windows = test_read_windows(text, T, B, xs, ys, want, UPDATES + 1, &losses);
    free(text);
    CHECK_INT(windows, B);
    CHECK_INT(losses, UPDATES + 1);
}

static void llama(void) {
    rp_model *m;
    rp_weights *file, *w = NULL, *back = NULL;
    rp_error err;
    read_losses();
    CHECK_OK(rp_model_load(&m, fixture("llama/tiny.model"), &err), err);
    CHECK_OK(rp_safetensors_load(&file, fixture("llama/tiny.safetensors"), &err), err);
    if (!m || !file)
        return;
    float *params = calloc(m->num_params, sizeof(float));
    CHECK_OK(rp_llama_import(m, file, RP_LLAMA_META, "tiny.safetensors", params, &err), err);
    CHECK_OK(rp_weights_from_params(m, params, &w, &err), err);
    rp_config c = test_config("{\"micro_batch_size\": 4, \"optimizer\": {\"type\": \"adamw\", "
                              "\"lr\": 0.01, \"beta1\": 0.9, \"beta2\": 0.999, \"eps\": 1e-8, "
                              "\"weight_decay\": 0.1}}");
    rp_session *s = test_session(m, &c, NULL);
    CHECK(s != NULL);
    double worst = 0;
    if (s) {
        CHECK_OK(rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err), err);
        for (int u = 0; u < UPDATES; u++) {
            int64_t ids[B] = {0, 1, 2, 3};
            rp_result r;
            CHECK_OK(rp_session_run(s, xs, ys, ids, &r, &err), err);
            double d = fabs(r.losses[r.count - 1] - want[u]);
            worst = d > worst ? d : worst;
        }
        double last;
        CHECK_OK(rp_session_loss(s, xs, ys, B, &last, &err), err);
        worst = fabs(last - want[UPDATES]) > worst ? fabs(last - want[UPDATES]) : worst;
        rp_session_free(s);
    }
    CHECKF(worst <= 1e-5, "losses from PyTorch's weights off PyTorch's by %g", worst);
    printf("PyTorch's LLaMA state_dict: %d losses within %.2g of PyTorch's\n", UPDATES + 1,
           worst);

    /* back to Meta's names: the file's tensors, bit for bit, in its order */
    CHECK_OK(rp_llama_export(m, params, RP_LLAMA_META, &back, &err), err);
    if (back) {
        CHECK_INT(back->num_tensors, file->num_tensors);
        for (int i = 0; i < back->num_tensors && i < file->num_tensors; i++) {
            const rp_tensor *a = &back->tensors[i], *b = &file->tensors[i];
            size_t n = rp_shape_size(&a->shape);
            CHECKF(strcmp(a->name, b->name) == 0 && n == rp_shape_size(&b->shape) &&
                       memcmp(a->data, b->data, sizeof(float) * n) == 0,
                   "exported %s differs from the file's %s", a->name, b->name);
        }
    }

    /* the same weights under Hugging Face's names, its Q and K rows in its
    ** rotary order: the same parameters bit for bit, and back the same file */
    rp_weights *hf, *hf_back = NULL;
    float *hf_params = calloc(m->num_params, sizeof(float));
    CHECK_OK(rp_safetensors_load(&hf, fixture("llama/tiny_hf.safetensors"), &err), err);
    if (hf) {
        CHECK_OK(rp_llama_import(m, hf, RP_LLAMA_HF, "tiny_hf.safetensors", hf_params, &err),
                 err);
        CHECKF(memcmp(hf_params, params, sizeof(float) * m->num_params) == 0,
               "Hugging Face's file gives other parameters than Meta's");
        CHECK_OK(rp_llama_export(m, params, RP_LLAMA_HF, &hf_back, &err), err);
        CHECK(hf_back && hf_back->num_tensors == hf->num_tensors);
        for (int i = 0; hf_back && i < hf_back->num_tensors && i < hf->num_tensors; i++) {
            const rp_tensor *a = &hf_back->tensors[i], *b = &hf->tensors[i];
            size_t n = rp_shape_size(&a->shape);
            CHECKF(strcmp(a->name, b->name) == 0 && n == rp_shape_size(&b->shape) &&
                       memcmp(a->data, b->data, sizeof(float) * n) == 0,
                   "exported %s differs from Hugging Face's %s", a->name, b->name);
        }
        /* a tied checkpoint has no lm_head: this untied model says what to do */
        hf->num_tensors--;
        CHECK(rp_llama_import(m, hf, RP_LLAMA_HF, "tiny_hf.safetensors", hf_params, &err) !=
              RP_OK);
        CHECK_STR_HAS(err.msg, "no tensor 'lm_head.weight'");
        CHECK_STR_HAS(err.msg, "give the model's head tie=0");
        hf->num_tensors++;
        /* Meta's names are not Hugging Face's */
        CHECK(rp_llama_import(m, file, RP_LLAMA_HF, "tiny.safetensors", hf_params, &err) !=
              RP_OK);
        CHECK_STR_HAS(err.msg, "no tensor 'model.embed_tokens.weight'");
    }
    free(hf_params);
    rp_weights_free(hf_back);
    rp_weights_free(hf);

    /* the model with its head tied to the embedding: Hugging Face's file
    ** has no lm_head, Meta's keeps output.weight, and both come back */
    char *tied_spec;
    size_t tied_len;
    rp_model *tied = NULL;
    CHECK_OK(rp_read_file(fixture("llama/tiny.model"), &tied_spec, &tied_len, &err), err);
    char *last = tied_spec ? strstr(tied_spec, "linear 32 bias=false\nsoftmax") : NULL;
    CHECK(last != NULL);
    if (last) {
        char spec[4096];
        snprintf(spec, sizeof spec, "%.*slinear 32 bias=false tie=0\nsoftmax_cross_entropy\n",
                 (int)(last - tied_spec), tied_spec);
        CHECK_OK(rp_model_parse(&tied, spec, strlen(spec), "tied", &err), err);
    }
    free(tied_spec);
    if (tied) {
        float *tp = calloc(tied->num_params, sizeof(float)), *back_p = calloc(tied->num_params,
                                                                               sizeof(float));
        rp_weights *tw = NULL, *meta_w = NULL;
        const rp_variable *emb = &tied->vars[0], *out = &tied->vars[tied->num_vars - 1];
        /* the untied file's output.weight is not its embedding */
        CHECK(rp_llama_import(tied, file, RP_LLAMA_META, "tiny", tp, &err) != RP_OK);
        CHECK_STR_HAS(err.msg, "output.weight differs from tok_embeddings.weight");
        for (int v = 0; v < tied->num_vars; v++) /* take the untied import's values */
            memcpy(tp + tied->vars[v].offset, params + m->vars[v].offset,
                   sizeof(float) * tied->vars[v].count);
        memcpy(tp + out->offset, tp + emb->offset, sizeof(float) * emb->count);
        CHECK_OK(rp_llama_export(tied, tp, RP_LLAMA_HF, &tw, &err), err);
        CHECK(tw && tw->num_tensors == file->num_tensors - 1 &&
              !rp_weights_find(tw, "lm_head.weight"));
        if (tw)
            CHECK_OK(rp_llama_import(tied, tw, RP_LLAMA_HF, "tied", back_p, &err), err);
        CHECK(memcmp(back_p, tp, sizeof(float) * tied->num_params) == 0);
        CHECK_OK(rp_llama_export(tied, tp, RP_LLAMA_META, &meta_w, &err), err);
        CHECK(meta_w && rp_weights_find(meta_w, "output.weight"));
        rp_weights_free(tw), rp_weights_free(meta_w);
        free(tp), free(back_p);
        rp_model_free(tied);
    }

    /* what does not fit is refused by name */
    file->num_tensors--; /* output.weight gone */
    CHECK(rp_llama_import(m, file, RP_LLAMA_META, "tiny.safetensors", params, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "no tensor 'output.weight'");
    file->num_tensors++;
    rp_tensor more[64]; /* the file's tensors and one of a third block */
    CHECK(file->num_tensors < 64);
    memcpy(more, file->tensors, sizeof(rp_tensor) * (size_t)file->num_tensors);
    more[file->num_tensors] = file->tensors[1];
    snprintf(more[file->num_tensors].name, RP_NAME_MAX, "layers.2.ffn_norm.weight");
    rp_weights extra = {file->num_tensors + 1, more};
    CHECK(rp_llama_import(m, &extra, RP_LLAMA_META, "tiny.safetensors", params, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "tensor 'layers.2.ffn_norm.weight' has no place in this model");
    more[file->num_tensors] = file->tensors[1];
    snprintf(more[file->num_tensors].name, RP_NAME_MAX, "rope.freqs"); /* Meta's buffer */
    CHECK_OK(rp_llama_import(m, &extra, RP_LLAMA_META, "tiny.safetensors", params, &err), err);
    rp_tensor *norm = (rp_tensor *)rp_weights_find(file, "layers.0.attention_norm.weight");
    rp_tensor *wk = (rp_tensor *)rp_weights_find(file, "layers.1.attention.wk.weight");
    CHECK(norm && wk);
    if (norm && wk) {
        norm->shape.dim[0]--;
        CHECK(rp_llama_import(m, file, RP_LLAMA_META, "tiny.safetensors", params, &err) != RP_OK);
        CHECK_STR_HAS(err.msg, "'layers.0.attention_norm.weight' is 15; this model's is 16");
        norm->shape.dim[0]++;
        wk->shape.dim[0] = 16, wk->shape.dim[1] = 8; /* the values transposed */
        CHECK(rp_llama_import(m, file, RP_LLAMA_META, "tiny.safetensors", params, &err) != RP_OK);
        CHECK_STR_HAS(err.msg, "'layers.1.attention.wk.weight' is 16x8; this model's is 8x16");
        wk->shape.dim[0] = 8, wk->shape.dim[1] = 16;
    }
    rp_model *gpt;
    const char *spec = "input 8\nembedding 32 16\nposition_embedding\n"
                       "transformer_block heads=4\nlayernorm\nlinear 32 bias=false\n"
                       "softmax_cross_entropy\n";
    CHECK_OK(rp_model_parse(&gpt, spec, strlen(spec), "gpt", &err), err);
    if (gpt) {
        CHECK(rp_llama_import(gpt, file, RP_LLAMA_META, "tiny.safetensors", params, &err) != RP_OK);
        CHECK_STR_HAS(err.msg, "not a LLaMA-family model");
        rp_model_free(gpt);
    }
    free(params);
    rp_weights_free(back);
    rp_weights_free(w);
    rp_weights_free(file);
    rp_model_free(m);
}

/* A header of 100 000 one-value tensors (7 MB, as the format allows far
** more): read, and refused when its last key repeats the first, in about
** half a second each here. Comparing each key with every earlier one took
** 52 s at 80 000; the 5 s bound leaves room for a loaded machine and
** sanitizers. */
static void many_tensors(void) {
    enum { N = 100000 };
    size_t cap = (size_t)N * 80 + 64, at = 0;
    char *header = malloc(cap);
    float *data = calloc(N, sizeof *data);
    unsigned char *buf = malloc(cap + 8 + sizeof(float) * N);
    CHECK(header && data && buf);
    if (!header || !data || !buf) {
        free(header), free(data), free(buf);
        return;
    }
    for (int twice = 0; twice < 2; twice++) {
        at = (size_t)snprintf(header, cap, "{");
        for (int i = 0; i < N; i++) {
            int name = twice && i == N - 1 ? 0 : i;
            data[i] = (float)i;
            at += (size_t)snprintf(header + at, cap - at,
                                   "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],"
                                   "\"data_offsets\":[%d,%d]}",
                                   i ? "," : "", name, 4 * i, 4 * i + 4);
        }
        snprintf(header + at, cap - at, "}");
        size_t n = build(buf, header, data, sizeof(float) * N);
        rp_weights *w = NULL;
        rp_error err;
        double t0 = rp_now();
        rp_status st = rp_safetensors_parse(&w, buf, n, "many.safetensors", &err);
        double took = rp_now() - t0;
        if (!twice) {
            CHECK_OK(st, err);
            CHECK(w && w->num_tensors == N);
            if (w)
                rp_weights_free(w);
        } else {
            CHECK(st == RP_ERR_PARSE && strstr(err.msg, "key 't0' appears twice"));
        }
        CHECK(took < 5.0); /* minutes when pairwise; room for a loaded machine */
        if (took >= 5.0)
            fprintf(stderr, "  %s 100 000 tensors in %.2f s\n", twice ? "refusing" : "reading",
                    took);
    }
    free(header), free(data), free(buf);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_safetensors FIXTURES_DIR\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    samples();
    built();
    many_tensors();
    llama();
    return test_finish("test_safetensors");
}
