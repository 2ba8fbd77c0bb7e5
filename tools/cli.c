/*
** Option tables to getopt_long and to --help.
*/
#define _GNU_SOURCE
#include "cli.h"
#include "repipe/checkpoint.h"
#include "repipe/simulate.h"
#include "../src/core/util.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_help(FILE *f, const cli_cmd *cmd) {
    fprintf(f, "usage: repipe %s %s\n\n%s\n", cmd->name, cmd->usage, cmd->summary);
    if (cmd->opts && cmd->opts[0].name) {
        fprintf(f, "\noptions:\n");
        for (const cli_opt *o = cmd->opts; o->name; o++) {
            char left[80];
            int n = 0;
            if (o->short_name)
                n = snprintf(left, sizeof left, "-%c, ", o->short_name);
            snprintf(left + n, sizeof left - n, "--%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
            fprintf(f, "  %-30s %s\n", left, o->help);
        }
        fprintf(f, "  %-30s %s\n", "-h, --help", "show this help and exit");
    }
    if (cmd->details)
        fprintf(f, "\n%s\n", cmd->details);
}

bool cli_error(const cli_cmd *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "repipe %s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return false;
}

int cli_next(const cli_cmd *cmd, int argc, char **argv, const char **arg, bool *help_shown) {
    struct option longs[64];
    char shorts[160];
    int n = 0, s = 0;
    shorts[s++] = '+'; /* stop at the first non-option: values of lists follow */
    shorts[s++] = ':';
    for (const cli_opt *o = cmd->opts; o && o->name && n < 62; o++, n++) {
        longs[n].name = o->name;
        longs[n].has_arg = o->metavar ? required_argument : no_argument;
        longs[n].flag = NULL;
        longs[n].val = 1000 + n;
        if (o->short_name) {
            shorts[s++] = (char)o->short_name;
            if (o->metavar)
                shorts[s++] = ':';
        }
    }
    longs[n] = (struct option){"help", no_argument, NULL, 'h'};
    longs[n + 1] = (struct option){0, 0, 0, 0};
    shorts[s++] = 'h';
    shorts[s] = '\0';
    *help_shown = false;
    opterr = 0;
    int c = getopt_long(argc, argv, shorts, longs, NULL);
    *arg = optarg;
    if (c == -1)
        return -1;
    if (c == 'h') {
        cli_help(stdout, cmd);
        *help_shown = true;
        return -2;
    }
    if (c >= 1000)
        return c - 1000;
    for (int i = 0; i < n; i++)
        if (cmd->opts[i].short_name == c)
            return i;
    if (c == ':')
        cli_error(cmd, "option '%s' needs a value (see 'repipe %s --help')", argv[optind - 1],
                  cmd->name);
    else {
        /* "--bandwith" -> "did you mean '--bandwidth'?", as for configuration keys */
        const char *given = argv[optind - 1], *names[64];
        for (int i = 0; i < n; i++)
            names[i] = cmd->opts[i].name;
        char word[128];
        snprintf(word, sizeof word, "%s", given + strspn(given, "-"));
        word[strcspn(word, "=")] = '\0';
        const char *near = given[0] == '-' && given[1] == '-' ? rp_closest_word(word, names, n)
                                                                : NULL;
        if (near)
            cli_error(cmd, "unknown option '%s': did you mean '--%s'? (see 'repipe %s --help')",
                      given, near, cmd->name);
        else
            cli_error(cmd, "unknown option '%s' (see 'repipe %s --help')", given, cmd->name);
    }
    return -2;
}

int cli_next_option(const cli_cmd *cmd, int argc, char **argv, const char **arg,
                    bool *help_shown) {
    int o = cli_next(cmd, argc, argv, arg, help_shown);
    if (o == -1 && optind < argc) {
        cli_error(cmd, "unexpected argument '%s' (see 'repipe %s --help')", argv[optind],
                  cmd->name);
        *help_shown = false;
        return -2;
    }
    return o;
}

int cli_next_arg(const cli_cmd *cmd, int argc, char **argv, const char **arg, bool *help_shown,
                 const char **pos, int *npos, int max) {
    for (;;) {
        int o = cli_next(cmd, argc, argv, arg, help_shown);
        if (o != -1 || optind >= argc)
            return o;
        if (*npos == max) {
            cli_error(cmd, "too many arguments");
            *help_shown = false;
            return -2;
        }
        pos[(*npos)++] = argv[optind++];
    }
}

bool cli_int(const char *opt, const char *text, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "repipe: option '--%s': '%s' is not a whole number between %lld and %lld\n",
                opt, text, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool cli_double(const char *opt, const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v)) {
        fprintf(stderr, "repipe: option '--%s': '%s' is not a number\n", opt, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_backend(const cli_cmd *cmd, const char *text, bool *mpi) {
    if (strcmp(text, "mpi") != 0 && strcmp(text, "local") != 0) {
        cli_error(cmd, "--backend: '%s' is not 'local' or 'mpi'", text);
        return false;
    }
    *mpi = strcmp(text, "mpi") == 0;
    return true;
}

/* The MPI backend, loaded where it is asked for: the command links no MPI
** library (plan, config and the others start light), and librepipe_mpi.so,
** beside it in the build tree or in the library directory installed,
** brings Open MPI with it. */
typedef rp_status (*mpi_init_fn)(int *, char ***, rp_comm **, rp_error *);

static rp_status mpi_init(int *argc, char ***argv, rp_comm **out, rp_error *err) {
    char exe[4096], path[4200], tried[2][4200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    void *h = NULL;
    const char *where[2] = {"", "/" REPIPE_BIN_TO_LIB};
    for (int i = 0; i < 2 && !h; i++) {
        snprintf(path, sizeof path, "%s%s/librepipe_mpi.so", slash ? exe : ".", where[i]);
        snprintf(tried[i], sizeof tried[i], "%s", path);
        h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    }
    if (!h)
        h = dlopen("librepipe_mpi.so", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return rp_fail(err, RP_ERR_IO, "--backend mpi: the MPI backend librepipe_mpi.so is not "
                       "at %s or %s, nor on the library path (%s)", tried[0], tried[1],
                       dlerror());
    mpi_init_fn init;
    *(void **)&init = dlsym(h, "rp_comm_mpi_init");
    if (!init)
        return rp_fail(err, RP_ERR_IO, "--backend mpi: %s has no rp_comm_mpi_init", path);
    return init(argc, argv, out, err);
}

bool cli_mpi_start(const cli_cmd *cmd, bool use_mpi, int *argc, char ***argv, rp_comm **comm,
                   bool *lead) {
    rp_error err;
    *comm = NULL;
    *lead = true;
    if (!use_mpi) {
        /* mpirun starts N copies: without --backend mpi each would train
        ** alone, N times over */
        const char *ranks = getenv("OMPI_COMM_WORLD_SIZE");
        if (!ranks)
            ranks = getenv("PMI_SIZE");
        if (ranks && atoi(ranks) > 1) {
            cli_error(cmd, "started by mpirun as one of %s processes, but with the local backend "
                           "each would run alone: add --backend mpi",
                      ranks);
            return false;
        }
        return true;
    }
    if (mpi_init(argc, argv, comm, &err)) {
        cli_error(cmd, "%s", err.msg);
        return false;
    }
    *lead = rp_comm_rank(*comm) == 0;
    if (*lead && rp_comm_mpi_defaults())
        fprintf(stderr, "note: %s\n", rp_comm_mpi_defaults());
    return true;
}

void cli_mpi_abort(rp_comm *comm, const char *msg) {
    if (!comm)
        return;
    fflush(stderr);
    rp_comm_fail(comm, msg);
}

void cli_job_fail(const cli_cmd *cmd, cli_job *j, const rp_error *err) {
    cli_error(cmd, "%s", err->msg);
    cli_mpi_abort(j->comm, err->msg);
}

int cli_job_end(cli_job *j, int rc) {
    rp_session_free(j->s);
    rp_dataset_free(j->train);
    rp_dataset_free(j->test);
    rp_model_free(j->m);
    if (j->comm)
        rp_comm_mpi_finalize(j->comm);
    return rc;
}

int cli_double_list(const char *opt, const char *first, int argc, char **argv, double *out,
                    int max) {
    int n = 0;
    if (!cli_double(opt, first, &out[n++]))
        return -1;
    while (optind < argc && argv[optind][0] != '-') {
        char *end;
        double v = strtod(argv[optind], &end);
        if (end == argv[optind] || *end)
            break;
        if (n == max) {
            fprintf(stderr, "repipe: option '--%s' takes at most %d values\n", opt, max);
            return -1;
        }
        out[n++] = v;
        optind++;
    }
    return n;
}

bool cli_per_machine(const cli_cmd *cmd, const char *opt, const double *v, int n,
                     const int *machines, int levels, double **out) {
    int total = 1, outer = levels > 0 ? machines[levels - 1] : 0;
    for (int l = 0; l < levels; l++)
        total *= machines[l];
    if (levels == 0 || (n != outer && n != total)) {
        cli_error(cmd, "--%s: %d values for %d machines in %d level%s: give one a machine of "
                       "the outermost level (%d) or one a machine (%d), after --machines",
                  opt, n, total, levels, levels == 1 ? "" : "s", outer, total);
        return false;
    }
    for (int k = 0; k < n; k++)
        if (!(v[k] > 0) || isinf(v[k])) {
            cli_error(cmd, "--%s: '%g' is not a positive number", opt, v[k]);
            return false;
        }
    if (!(*out = malloc(sizeof(double) * total))) {
        cli_error(cmd, "out of memory");
        return false;
    }
    for (int d = 0; d < total; d++) /* rank order: a server's machines one after another */
        (*out)[d] = v[n == total ? d : d / (total / outer)];
    return true;
}

int cli_machines(const cli_cmd *cmd, const char *first, int argc, char **argv, int *out,
                 int max) {
    double v[64];
    int n = cli_double_list("machines", first, argc, argv, v, max < 64 ? max : 64);
    for (int k = 0; k < n; k++) {
        if (v[k] != floor(v[k]) || v[k] < 1 || v[k] > 4096) {
            cli_error(cmd, "--machines: '%g' is not a whole number from 1 to 4096", v[k]);
            return -1;
        }
        out[k] = (int)v[k];
    }
    return n;
}

bool cli_levels_match(const cli_cmd *cmd, int machines, int bandwidths) {
    if (!bandwidths || bandwidths == machines)
        return true;
    cli_error(cmd, "--bandwidth has %d value%s but --machines has %d level%s", bandwidths,
              bandwidths == 1 ? "" : "s", machines, machines == 1 ? "" : "s");
    return false;
}

void cli_print_machines(FILE *f, const int *machines, const double *bandwidth, int levels) {
    fprintf(f, "machines ");
    for (int l = 0; l < levels; l++)
        fprintf(f, "%s%d", l ? " x " : "", machines[l]);
    fprintf(f, " (innermost level first, as --machines takes them):");
    long long n = 1;
    for (int l = 0; l < levels; l++) {
        n *= machines[l];
        fprintf(f, "%s level %d, %d %s at %.3g GB/s", l ? ";" : "", l + 1, machines[l],
               l == 0 ? "workers" : "units of the level below", bandwidth[l] / 1e9);
    }
    fprintf(f, "; %lld workers in all\n", n);
}

rp_status cli_load_weights(const char *path, rp_weights **out, rp_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    char magic[8] = {0};
    bool checkpoint = f && fread(magic, 1, 8, f) == 8 && memcmp(magic, "RPCHKPT1", 8) == 0;
    if (f)
        fclose(f);
    size_t n = strlen(path);
    if (!checkpoint && n > 12 && strcmp(path + n - 12, ".safetensors") == 0)
        return rp_safetensors_load(out, path, err);
    if (!checkpoint)
        return rp_weights_load(out, path, err);
    rp_checkpoint c;
    rp_status st = rp_checkpoint_load(&c, path, err);
    if (st)
        return st;
    *out = c.state.weights; /* taken from the checkpoint */
    c.state.weights = NULL;
    rp_checkpoint_free(&c);
    return RP_OK;
}

rp_status cli_load_model_weights(const char *path, const rp_model *m, rp_weights **out,
                                 rp_error *err) {
    rp_status st = cli_load_weights(path, out, err);
    if (st || m->num_vars == 0 || rp_weights_find(*out, m->vars[0].name))
        return st;
    rp_llama_names scheme; /* a LLaMA-family state_dict under Meta's or Hugging Face's names */
    if (!rp_llama_names_of(*out, &scheme))
        return RP_OK; /* the caller names what is missing */
    float *params = malloc(sizeof(float) * m->num_params);
    rp_weights *ours = NULL;
    st = params ? rp_llama_import(m, *out, scheme, path, params, err)
                : rp_fail(err, RP_ERR_NOMEM, "out of memory for %zu parameters", m->num_params);
    if (!st)
        st = rp_weights_from_params(m, params, &ours, err);
    free(params);
    rp_weights_free(*out);
    *out = ours;
    return st;
}

uint32_t cli_config_digest(const rp_config *cfg) {
    char *json = NULL;
    rp_error err;
    if (rp_config_to_json(cfg, &json, &err))
        return 0;
    uint32_t h = rp_crc32(0, json, strlen(json));
    free(json);
    return h;
}

uint32_t cli_dataset_digest(const rp_dataset *d) {
    int head[4] = {d->n, d->label_count, d->num_classes, d->sample.ndim};
    uint32_t h = rp_crc32(0, head, sizeof head);
    h = rp_crc32(h, d->sample.dim, sizeof(int) * d->sample.ndim);
    h = rp_crc32(h, d->x, sizeof(float) * rp_shape_size(&d->sample) * d->n);
    return rp_crc32(h, d->labels, sizeof(int32_t) * d->label_count * d->n);
}

uint32_t cli_weights_digest(const rp_weights *w) {
    uint32_t h = 0;
    for (int i = 0; w && i < w->num_tensors; i++) {
        const rp_tensor *t = &w->tensors[i];
        h = rp_crc32(h, t->name, strlen(t->name));
        h = rp_crc32(h, t->data, sizeof(float) * rp_shape_size(&t->shape) * t->groups);
    }
    return h;
}


bool cli_tensor_split(const cli_cmd *cmd, const char *path, int L, int t, unsigned split,
                      unsigned char **flags,
                      unsigned *degrees) {
    rp_model *m = NULL;
    rp_error err;
    *flags = NULL, *degrees = 0;
    if (rp_model_load(&m, path, &err)) {
        cli_error(cmd, "%s", err.msg);
        return false;
    }
    if (m->num_layers != L) {
        cli_error(cmd, "--tensor-split %s has %d layers, the profile %d", path, m->num_layers, L);
        rp_model_free(m);
        return false;
    }
    if (!(*flags = calloc(L, 1))) {
        cli_error(cmd, "out of memory");
        rp_model_free(m);
        return false;
    }
    /* t's split, or the degrees 8, 4, 2 (the flags are the same for every t
    ** that divides the model) */
    for (int d = t > 1 ? t : 8; d >= 2; d = t > 1 ? 0 : d / 2) {
        rp_model *lm;
        size_t *map;
        if (rp_model_tensor_split(m, d, 0, split, &lm, &map, &err)) {
            if (t > 1) {
                cli_error(cmd, "%s", err.msg);
                free(*flags), *flags = NULL;
                rp_model_free(m);
                return false;
            }
            continue;
        }
        *degrees |= d < 32 ? 1u << d : 0;
        for (int l = 0; l < L; l++) {
            const rp_layer *a = &m->layers[l], *b = &lm->layers[l];
            bool block = b->tp_ranks > 1 && b->type == RP_LAYER_TRANSFORMER_BLOCK;
            /* a split loss gathers 3 floats a row: priced as its output's all-reduce */
            bool loss = b->tp_ranks > 1 && b->type == RP_LAYER_SOFTMAX_CE;
            (*flags)[l] = (rp_shape_size(&a->in) != rp_shape_size(&b->in) ||
                                   rp_shape_size(&a->out) != rp_shape_size(&b->out) ||
                                   a->param_count != b->param_count
                               ? RP_SIM_TP_SPLIT
                               : 0) |
                          (b->tp_reduce & RP_TP_REDUCE_OUTPUT || block || loss
                               ? RP_SIM_TP_REDUCE_OUTPUT
                               : 0) |
                          (b->tp_reduce & RP_TP_REDUCE_GRAD || block ? RP_SIM_TP_REDUCE_GRAD : 0) |
                          (block ? RP_SIM_TP_TWICE : 0);
        }
        rp_model_free(lm), free(map);
    }
    rp_model_free(m);
    return true;
}
