/*
** repipe weights show|compare: inspects weight files.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"rtol", 0, "X", "compare: largest relative difference allowed per tensor [1e-5]"},
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

static int run(const cli_cmd *cmd, int argc, char **argv) {
    double rtol = 1e-5;
    const char *pos[4];
    int npos = 0;
    bool help;
    const char *arg;
    for (int o; (o = cli_next_arg(cmd, argc, argv, &arg, &help, pos, &npos, 4)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if (o == 0 && !cli_double("rtol", arg, &rtol))
            return 2;
        if (o == 0 && !(rtol >= 0)) {
            cli_error(cmd, "--rtol: '%s' is not a relative difference >= 0", arg);
            return 2;
        }
    }
    if (npos == 2 && strcmp(pos[0], "show") == 0)
        return show(cmd, pos[1]);
    if (npos == 3 && strcmp(pos[0], "compare") == 0)
        return compare(cmd, pos[1], pos[2], rtol);
    cli_error(cmd, "expected 'show FILE' or 'compare A B' (see 'repipe weights --help')");
    return 2;
}

const cli_cmd cmd_weights = {
    "weights",
    "show a weight file, or compare two",
    "show FILE | compare A B [--rtol X]",
    "compare prints, for every tensor (and replica group), the largest difference\n"
    "relative to the tensor's scale, max|a - b| / max(max|a|, max|b|), and exits 0\n"
    "only when every one is within --rtol and both files hold the same tensors.",
    OPTS,
    run,
};
