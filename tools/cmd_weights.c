/*
** repipe weights show|compare|import-llmc|export-llmc|import-safetensors|
** export-safetensors: inspects weight files, and converts llm.c's GPT-2
** checkpoints and PyTorch's safetensors state_dicts to them and back.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"rtol", 0, "X", "compare: largest relative difference allowed per tensor [1e-5]"},
    {"model", 'm', "FILE", "import-*, export-*: the model the weights are for"},
    {"out", 'o', "FILE", "import-*, export-*: the file to write"},
    {"names", 0, "N", "import-safetensors, export-safetensors: the tensors' names: repipe "
                      "(\"0.weight\"), meta (LLaMA's tok_embeddings.weight ...) or hf (Hugging "
                      "Face's model.embed_tokens.weight ...) [import: by the file's embedding; "
                      "export: repipe]"},
    {NULL, 0, NULL, NULL},
};

static int show(const cli_cmd *cmd, const char *path) {
    rp_weights *w;
    rp_error err;
    if (cli_load_weights(path, &w, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    size_t total = 0;
    printf("%-20s %-16s %6s %10s %12s %12s\n", "tensor", "shape", "groups", "values", "mean",
           "std");
    for (int i = 0; i < w->num_tensors; i++) {
        const rp_tensor *t = &w->tensors[i];
        size_t n = rp_shape_size(&t->shape) * t->groups;
        double s = 0, s2 = 0;
        for (size_t e = 0; e < n; e++) {
            s += t->data[e];
            s2 += (double)t->data[e] * t->data[e];
        }
        double mean = s / n, var = s2 / n - mean * mean;
        char shape[64];
        printf("%-20s %-16s %6d %10zu %12.6g %12.6g\n", t->name,
               rp_shape_to_string(&t->shape, shape, sizeof shape), t->groups, n, mean,
               sqrt(var > 0 ? var : 0));
        total += n;
    }
    printf("%d tensors, %zu values\n", w->num_tensors, total);
    rp_weights_free(w);
    return 0;
}

static int compare(const cli_cmd *cmd, const char *pa, const char *pb, double rtol) {
    rp_weights *a, *b;
    rp_error err;
    if (cli_load_weights(pa, &a, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 2;
    }
    if (cli_load_weights(pb, &b, &err)) {
        rp_weights_free(a);
        cli_error(cmd, "%s", err.msg);
        return 2;
    }
    int bad = 0;
    printf("%-20s %6s %14s\n", "tensor", "group", "rel. diff");
    for (int i = 0; i < a->num_tensors; i++) {
        const rp_tensor *ta = &a->tensors[i], *tb = rp_weights_find(b, ta->name);
        if (!tb) {
            printf("%-20s only in %s\n", ta->name, pa);
            bad++;
            continue;
        }
        if (ta->shape.ndim != tb->shape.ndim ||
            memcmp(ta->shape.dim, tb->shape.dim, sizeof(int) * ta->shape.ndim) != 0 ||
            ta->groups != tb->groups) {
            char sa[64], sb[64];
            printf("%-20s shapes differ: %s x %d groups vs %s x %d groups\n", ta->name,
                   rp_shape_to_string(&ta->shape, sa, sizeof sa), ta->groups,
                   rp_shape_to_string(&tb->shape, sb, sizeof sb), tb->groups);
            bad++;
            continue;
        }
        size_t n = rp_shape_size(&ta->shape);
        for (int g = 0; g < ta->groups; g++) {
            double d = rp_tensor_rel_diff(ta->data + g * n, tb->data + g * n, n);
            bool ok = d <= rtol;
            bad += !ok;
            printf("%-20s %6d %14.3e%s\n", ta->name, g, d, ok ? "" : "  > rtol");
        }
    }
    for (int i = 0; i < b->num_tensors; i++)
        if (!rp_weights_find(a, b->tensors[i].name)) {
            printf("%-20s only in %s\n", b->tensors[i].name, pb);
            bad++;
        }
    printf("%s: %d tensor%s outside rtol %g\n", bad ? "DIFFERENT" : "same", bad,
           bad == 1 ? "" : "s", rtol);
    rp_weights_free(a);
    rp_weights_free(b);
    return bad ? 1 : 0;
}

/* The model of a conversion, and room for its parameters. */
/* What a conversion holds: the model, its parameters, the weights read
** and made, the bytes read or written. */
typedef struct conversion {
    rp_model *m;
    float *params;
    rp_weights *w, *made;
    char *data;
    rp_error err;
} conversion;

/* The model at path and room for its parameters. */
static rp_status conversion_open(conversion *c, const char *path) {
    rp_status st = rp_model_load(&c->m, path, &c->err);
    size_t n = st ? 0 : c->m->num_params;
    if (!st && !(c->params = malloc(sizeof(float) * (n ? n : 1))))
        st = rp_fail(&c->err, RP_ERR_NOMEM, "out of memory for %zu parameters", n);
    return st;
}

/* The weight file at path, read into the parameters. */
static rp_status conversion_read_weights(conversion *c, const char *path) {
    rp_status st = cli_load_weights(path, &c->w, &c->err);
    return st ? st : rp_weights_to_params(c->m, c->w, 0, c->params, &c->err);
}

/* Says the error where rc is not 0, frees what c holds; rc. */
static int conversion_close(const cli_cmd *cmd, conversion *c, int rc) {
    if (rc)
        cli_error(cmd, "%s", c->err.msg);
    free(c->data), free(c->params);
    rp_weights_free(c->w);
    rp_weights_free(c->made);
    rp_model_free(c->m);
    return rc;
}

/* llm.c checkpoint -> weight file (to_llmc false), or back */
static int llmc(const cli_cmd *cmd, const char *in, const char *model, const char *out,
                bool to_llmc) {
    if (!model || !out) {
        cli_error(cmd, "%s needs --model and --out", to_llmc ? "export-llmc" : "import-llmc");
        return 2;
    }
    conversion c = {0};
    size_t len = 0;
    int rc = 1;
    if (conversion_open(&c, model))
        goto done;
    if (to_llmc) {
        unsigned char *b = NULL;
        if (conversion_read_weights(&c, in) ||
            rp_llmc_export(c.m, c.params, &b, &len, &c.err))
            goto done;
        c.data = (char *)b;
        if (rp_write_file_atomic(out, c.data, len, &c.err))
            goto done;
    } else {
        if (rp_read_file(in, &c.data, &len, &c.err) ||
            rp_llmc_import(c.m, (const unsigned char *)c.data, len, in, c.params, &c.err) ||
            rp_weights_from_params(c.m, c.params, &c.made, &c.err) ||
            rp_weights_save(c.made, out, &c.err))
            goto done;
    }
    printf("%s written to %s\n", to_llmc ? "llm.c checkpoint" : "weights", out);
    rc = 0;
done:
    return conversion_close(cmd, &c, rc);
}

/* safetensors file -> weight file (export false), or back; names "repipe",
** "meta" or "hf" (NULL: on import, the scheme whose embedding the file
** has, else repipe's) */
static int safetensors(const cli_cmd *cmd, const char *in, const char *model, const char *out,
                       const char *names, bool export) {
    if (!model || !out) {
        cli_error(cmd, "%s needs --model and --out",
                  export ? "export-safetensors" : "import-safetensors");
        return 2;
    }
    if (names && strcmp(names, "repipe") != 0 && strcmp(names, "meta") != 0 &&
        strcmp(names, "hf") != 0) {
        cli_error(cmd, "--names: '%s' is not repipe, meta or hf", names);
        return 2;
    }
    conversion c = {0};
    int rc = 1;
    if (conversion_open(&c, model))
        goto done;
    /* -1: repipe's names, else a LLaMA scheme */
    int scheme = !names || strcmp(names, "repipe") == 0 ? -1
                 : strcmp(names, "meta") == 0         ? RP_LLAMA_META
                                                      : RP_LLAMA_HF;
    if (export) {
        if (conversion_read_weights(&c, in) ||
            (scheme >= 0
                 ? rp_llama_export(c.m, c.params, (rp_llama_names)scheme, &c.made, &c.err)
                 : rp_weights_from_params(c.m, c.params, &c.made, &c.err)) ||
            rp_safetensors_save(c.made, out, &c.err))
            goto done;
    } else {
        if (rp_safetensors_load(&c.w, in, &c.err))
            goto done;
        rp_llama_names found;
        if (!names)
            scheme = rp_llama_names_of(c.w, &found) ? (int)found : -1;
        if ((scheme >= 0 ? rp_llama_import(c.m, c.w, (rp_llama_names)scheme, in, c.params, &c.err)
                         : rp_weights_to_params(c.m, c.w, 0, c.params, &c.err)) ||
            rp_weights_from_params(c.m, c.params, &c.made, &c.err) ||
            rp_weights_check_finite(c.made, in, &c.err) || rp_weights_save(c.made, out, &c.err))
            goto done;
    }
    printf("%s written to %s\n", export ? "safetensors file" : "weights", out);
    rc = 0;
done:
    return conversion_close(cmd, &c, rc);
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    double rtol = 1e-5;
    const char *model = NULL, *out = NULL, *names = NULL;
    const char *pos[4];
    int npos = 0;
    bool help;
    const char *arg;
    for (int o; (o = cli_next_arg(cmd, argc, argv, &arg, &help, pos, &npos, 4)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if (o == 0 && !cli_double("rtol", arg, &rtol))
            return 2;
        if (o == 1)
            model = arg;
        if (o == 2)
            out = arg;
        if (o == 3)
            names = arg;
        if (o == 0 && !(rtol >= 0)) {
            cli_error(cmd, "--rtol: '%s' is not a relative difference >= 0", arg);
            return 2;
        }
    }
    if (npos == 2 && strcmp(pos[0], "show") == 0)
        return show(cmd, pos[1]);
    if (npos == 3 && strcmp(pos[0], "compare") == 0)
        return compare(cmd, pos[1], pos[2], rtol);
    if (npos == 2 && (strcmp(pos[0], "import-llmc") == 0 || strcmp(pos[0], "export-llmc") == 0))
        return llmc(cmd, pos[1], model, out, pos[0][0] == 'e');
    if (npos == 2 && (strcmp(pos[0], "import-safetensors") == 0 ||
                      strcmp(pos[0], "export-safetensors") == 0))
        return safetensors(cmd, pos[1], model, out, names, pos[0][0] == 'e');
    cli_error(cmd, "expected 'show FILE', 'compare A B', 'import-llmc FILE.bin', "
                   "'export-llmc W', 'import-safetensors FILE' or 'export-safetensors W' (see "
                   "'repipe weights --help')");
    return 2;
}

const cli_cmd cmd_weights = {
    "weights",
    "show a weight file, compare two, or convert llm.c's checkpoints",
    "show FILE | compare A B [--rtol X] | import-llmc FILE.bin --model M --out W |\n"
    "       export-llmc W --model M --out FILE.bin |\n"
    "       import-safetensors FILE --model M --out W [--names repipe|meta|hf] |\n"
    "       export-safetensors W --model M --out FILE [--names repipe|meta|hf]",
    "compare prints, for every tensor (and replica group), the largest difference\n"
    "relative to the tensor's scale, max|a - b| / max(max|a|, max|b|), and exits 0\n"
    "only when every one is within --rtol and both files hold the same tensors.\n"
    "import-llmc reads llm.c's GPT-2 checkpoint (train_gpt2.c's format) into a\n"
    "weight file for a model of llm.c's shape (see docs/training.md); export-llmc\n"
    "writes one back. import-safetensors reads a PyTorch state_dict saved as\n"
    "safetensors (F32, F16, BF16 or F64) under repipe's names, or for a\n"
    "LLaMA-family model under Meta's or Hugging Face's (docs/training.md,\n"
    "\"Weights from PyTorch\"); export-safetensors writes float32 under any of\n"
    "them. FILE, A and B may also be .safetensors files of repipe's names.",
    OPTS,
    run,
};
