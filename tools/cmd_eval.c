/*
** repipe eval: inference on the test set with saved weights.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "cli.h"
#include "repipe/repipe.h"

enum { OPT_MODEL, OPT_CONFIG, OPT_LOAD, OPT_DATA, OPT_OUT, OPT_BACKEND, OPT_ALLOW_NONFINITE, OPT_POD_TYPE };

static const cli_opt OPTS[] = {
    [OPT_MODEL] = {"model", 'm', "FILE", "model spec (required)"},
    [OPT_CONFIG] = {"config", 'c', "FILE", "execution configuration (required)"},
    [OPT_LOAD] = {"load", 'l', "FILE", "weights to evaluate (required)"},
    [OPT_DATA] = {"data", 'd', "DIR", "IDX dataset directory [" RP_FASHION_MNIST_DIR "]"},
    [OPT_OUT] = {"out", 'o', "FILE", "write one prediction per test sample, in sample order (CSV)"},
    [OPT_BACKEND] = {"backend", 'b', "local|mpi", "replicas as threads, or as MPI ranks under mpirun [local]"},
    [OPT_ALLOW_NONFINITE] = {"allow-nonfinite", 0, NULL, "evaluate weights holding NaN or infinity too"},
    [OPT_POD_TYPE] = {"pod-type", 0, "POD", "an IPUConfig of Optimum Graphcore 0.2.1-0.6.0: the pod type (pod4, pod16, ...) whose values to take [the file's pod_type, else \"default\"]"},
    {NULL, 0, NULL, NULL},
};

/* What the command line asked for. */
typedef struct eval_opts {
    const char *model_path, *config_path, *load, *out, *data, *pod_type;
    bool use_mpi, allow_nonfinite;
} eval_opts;

/* Reads the options into o; -1 to go on, else the exit code. */
static int parse_options(const cli_cmd *cmd, int argc, char **argv, eval_opts *o) {
    *o = (eval_opts){.data = RP_FASHION_MNIST_DIR};
    bool help;
    const char *arg;
    for (int i; (i = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        switch (i) {
        case -2: return help ? 0 : 2;
        case OPT_MODEL: o->model_path = arg; break;
        case OPT_CONFIG: o->config_path = arg; break;
        case OPT_LOAD: o->load = arg; break;
        case OPT_DATA: o->data = arg; break;
        case OPT_OUT: o->out = arg; break;
        case OPT_ALLOW_NONFINITE: o->allow_nonfinite = true; break;
        case OPT_POD_TYPE: o->pod_type = arg; break;
        case OPT_BACKEND:
            if (!cli_backend(cmd, arg, &o->use_mpi))
                return 2;
            break;
        }
    }
    if (!o->model_path || !o->config_path || !o->load) {
        cli_error(cmd, "--model, --config and --load are required (see 'repipe eval --help')");
        return 2;
    }
    return -1;
}

/* The model, the configuration, the test set and the weights, checked
** against each other; under MPI, every rank agreeing on them before the
** first collective (ranks running other jobs would hang in it). */
static rp_status load_inputs(const eval_opts *o, cli_job *j, rp_config *cfg, rp_weights **w,
                             rp_error *err) {
    if (rp_model_load(&j->m, o->model_path, err) ||
        rp_config_load_file_opts(cfg, o->config_path,
                                 &(rp_config_load_options){.pod_type = o->pod_type}, err) ||
        rp_dataset_load_idx(&j->test, o->data, false, err) ||
        cli_load_model_weights(o->load, j->m, w, err) ||
        (!o->allow_nonfinite && rp_weights_check_finite(*w, o->load, err)))
        return RP_ERR_INVALID;
    char what[600];
    snprintf(what, sizeof what, "the test set of %s", o->data);
    if (rp_dataset_fits(j->test, j->m, what, err))
        return RP_ERR_INVALID;
    if (!j->comm)
        return RP_OK;
    const char *agree[] = {"repipe's version", "the model", "the configuration",
                           "the test data", "the weights"};
    uint32_t digest[] = {rp_crc32(0, rp_version(), strlen(rp_version())),
                         rp_model_fingerprint(j->m), cli_config_digest(cfg),
                         cli_dataset_digest(j->test), cli_weights_digest(*w)};
    return rp_comm_agree(j->comm, agree, digest, 5, err);
}

/* The predictions, one a test sample in sample order, to --out (a CSV);
** rank 0 writes them. */
static rp_status write_predictions(const char *out, const rp_dataset *test, const int32_t *pred,
                                   rp_error *err) {
    FILE *f = fopen(out, "w");
    if (!f)
        return rp_fail(err, RP_ERR_IO, "%s: cannot write", out);
    fprintf(f, "sample,prediction,label\n");
    for (int i = 0; i < test->n; i++)
        fprintf(f, "%d,%d,%d\n", i, pred[i], test->labels[i]);
    if ((ferror(f) | fclose(f)) != 0) /* both, always: the file is closed */
        return rp_fail(err, RP_ERR_IO, "%s: write failed", out);
    return RP_OK;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    eval_opts o;
    int rc = parse_options(cmd, argc, argv, &o);
    if (rc >= 0)
        return rc;
    rp_error err;
    rp_config cfg;
    cli_job j = {0};
    rp_weights *w = NULL;
    int32_t *pred = NULL;
    if (!cli_mpi_start(cmd, o.use_mpi, &argc, &argv, &j.comm, &j.lead))
        return 1;
    rp_status st = load_inputs(&o, &j, &cfg, &w, &err);
    if (!st)
        st = j.comm ? rp_session_create_mpi(j.m, &cfg, j.comm, &j.s, &err)
                    : rp_session_create(j.m, &cfg, &j.s, &err);
    if (!st)
        st = rp_session_set_weights(j.s, w, RP_ONE_PER_GROUP, &err);
    if (!st && !(pred = malloc(sizeof(int32_t) * j.test->n)))
        st = rp_fail(&err, RP_ERR_NOMEM, "out of memory");
    if (!st) /* collective under MPI */
        st = rp_session_predict(j.s, j.test->x, j.test->n, pred, &err);
    int right = 0;
    for (int i = 0; !st && i < j.test->n; i++)
        right += pred[i] == j.test->labels[i];
    if (!st && o.out && j.lead)
        st = write_predictions(o.out, j.test, pred, &err);
    if (!st && j.lead)
        printf("%d samples, %d right\ntest accuracy: %.4f\n", j.test->n, right,
               (double)right / j.test->n);
    if (st)
        cli_job_fail(cmd, &j, &err);
    free(pred);
    rp_weights_free(w);
    return cli_job_end(&j, st ? 1 : 0);
}

const cli_cmd cmd_eval = {
    "eval",
    "evaluate saved weights on the test set and write the predictions",
    "--model FILE --config FILE --load FILE [--data DIR] [--out predictions.csv] [--backend B]",
    "Predictions come out one per test sample, in sample order, whatever the\n"
    "replication; with replica groupings, replica 0's group is evaluated.\n"
    "With --backend mpi, start it as 'mpirun -np R repipe eval ... --backend mpi',\n"
    "R being the workers the configuration needs for training; the\n"
    "inference_replication_factor ranks share the rows.",
    OPTS,
    run,
};
