/*
** Text as data: a file's bytes, or llm.c's token files, cut into samples of
** T tokens whose targets are the tokens after them.
**
** llm.c's token file: a header of 256 little-endian int32, [20240520, 1,
** count, ...], then count uint16 tokens.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "repipe/data.h"

#define LLMC_MAGIC 20240520

rp_status rp_tokens_parse(const unsigned char *b, size_t len, bool llmc, const char *name,
                          int32_t **tokens, size_t *count, int *vocab, rp_error *err) {
    *tokens = NULL, *count = 0, *vocab = 0;
    size_t n = len, first = 0;
    if (llmc) {
        int32_t head[3];
        if (len < 1024)
            return rp_fail(err, RP_ERR_PARSE,
                           "%s: %zu bytes, less than llm.c's 1024-byte header", name, len);
        memcpy(head, b, sizeof head);
        if (head[0] != LLMC_MAGIC || head[1] != 1)
            return rp_fail(err, RP_ERR_PARSE,
                           "%s: not an llm.c token file (magic %d, version %d; expected %d, 1)",
                           name, head[0], head[1], LLMC_MAGIC);
        if (head[2] < 0 || (size_t)head[2] != (len - 1024) / 2 || (len - 1024) % 2)
            return rp_fail(err, RP_ERR_PARSE,
                           "%s: the header counts %d tokens but %zu bytes follow it", name,
                           head[2], len - 1024);
        n = (size_t)head[2];
        first = 1024;
    }
    int32_t *t = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!t)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for %zu tokens", name, n);
    int most = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t u = 0;
        if (llmc)
            memcpy(&u, b + first + 2 * i, 2);
        t[i] = llmc ? u : b[i];
        most = t[i] > most ? t[i] : most;
    }
    *tokens = t, *count = n;
    *vocab = llmc ? most + 1 : 256;
    return RP_OK;
}

/* A token file's parse: its kind and where its tokens go. */
struct tokens_file {
    bool llmc;
    int32_t **tokens;
    size_t *count;
    int *vocab;
};

static rp_status parse_tokens(const char *data, size_t len, const char *path, void *out,
                              rp_error *err) {
    const struct tokens_file *f = out;
    return rp_tokens_parse((const unsigned char *)data, len, f->llmc, path, f->tokens, f->count,
                           f->vocab, err);
}

rp_status rp_tokens_read(const char *path, bool llmc, int32_t **tokens, size_t *count,
                         int *vocab, rp_error *err) {
    struct tokens_file f = {llmc, tokens, count, vocab};
    return rp_parse_file(path, false, parse_tokens, &f, err);
}

rp_status rp_dataset_from_tokens(const int32_t *tokens, size_t count, int T, int vocab,
                                 const char *what, rp_dataset **out, rp_error *err) {
    *out = NULL;
    if (T < 1 || count < (size_t)T + 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: %zu tokens, fewer than one sample of %d and its next token", what,
                       count, T);
    size_t n = (count - 1) / (size_t)T;
    if (n > (size_t)RP_MAX_SAMPLES || n > 0x7fffffff)
        return rp_fail(err, RP_ERR_INVALID, "%s: %zu samples are too many", what, n);
    rp_dataset *d = calloc(1, sizeof *d);
    if (d) {
        d->x = malloc(sizeof(float) * n * T);
        d->labels = malloc(sizeof(int32_t) * n * T);
    }
    if (!d || !d->x || !d->labels) {
        rp_dataset_free(d);
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for %zu samples", what, n);
    }
    /* sample i: tokens iT .. iT + T - 1, its targets one further */
    for (size_t i = 0; i < n * T; i++) {
        d->x[i] = (float)tokens[i];
        d->labels[i] = tokens[i + 1];
    }
    d->n = (int)n;
    d->sample = (rp_shape){1, {T}};
    d->label_count = T;
    d->num_classes = vocab;
    *out = d;
    return RP_OK;
}
