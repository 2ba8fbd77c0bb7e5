/*
** repipe eval: inference on the test set with saved weights.
*/
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

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *model_path = NULL, *config_path = NULL, *load = NULL, *out = NULL;
    const char *data = RP_FASHION_MNIST_DIR, *pod_type = NULL;
    bool help, use_mpi = false, allow_nonfinite = false;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        switch (o) {
        case -2: return help ? 0 : 2;
        case OPT_MODEL: model_path = arg; break;
        case OPT_CONFIG: config_path = arg; break;
        case OPT_LOAD: load = arg; break;
        case OPT_DATA: data = arg; break;
        case OPT_OUT: out = arg; break;
        case OPT_ALLOW_NONFINITE: allow_nonfinite = true; break;
        case OPT_POD_TYPE: pod_type = arg; break;
        case OPT_BACKEND:
            if (!cli_backend(cmd, arg, &use_mpi))
                return 2;
            break;
        }
    }
    if (!model_path || !config_path || !load) {
        cli_error(cmd, "--model, --config and --load are required (see 'repipe eval --help')");
        return 2;
    }
    rp_error err;
    rp_model *m = NULL;
    rp_config cfg;
    rp_dataset *test = NULL;
    rp_session *s = NULL;
    rp_weights *w = NULL;
    int32_t *pred = NULL;
    rp_comm *comm;
    int rc = 1;
    bool lead; /* prints and writes: rank 0 under MPI */
    if (!cli_mpi_start(cmd, use_mpi, &argc, &argv, &comm, &lead))
        return 1;
    if (rp_model_load(&m, model_path, &err) || rp_config_load_file_opts(&cfg, config_path, &(rp_config_load_options){.pod_type = pod_type}, &err) ||
        rp_dataset_load_idx(&test, data, false, &err) ||
        cli_load_model_weights(load, m, &w, &err) ||
        (!allow_nonfinite && rp_weights_check_finite(w, load, &err)))
        goto fail;
    char what[600];
    snprintf(what, sizeof what, "the test set of %s", data);
    if (rp_dataset_fits(test, m, what, &err))
        goto fail;
    if (comm) { /* before the first collective: ranks running other jobs would hang in it */
        const char *agree[] = {"repipe's version", "the model", "the configuration",
                               "the test data", "the weights"};
        uint32_t digest[] = {rp_crc32(0, rp_version(), strlen(rp_version())),
                             rp_model_fingerprint(m), cli_config_digest(&cfg),
                             cli_dataset_digest(test), cli_weights_digest(w)};
        if (rp_comm_agree(comm, agree, digest, 5, &err))
            goto fail;
    }
    if ((comm ? rp_session_create_mpi(m, &cfg, comm, &s, &err)
              : rp_session_create(m, &cfg, &s, &err)) ||
        rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err))
        goto fail;
    pred = malloc(sizeof(int32_t) * test->n);
    if (!pred) {
        rp_fail(&err, RP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (rp_session_predict(s, test->x, test->n, pred, &err)) /* collective under MPI */
        goto fail;
    int right = 0;
    for (int i = 0; i < test->n; i++)
        right += pred[i] == test->labels[i];
    if (out && lead) {
        FILE *f = fopen(out, "w");
        if (!f) {
            rp_fail(&err, RP_ERR_IO, "%s: cannot write", out);
            goto fail;
        }
        fprintf(f, "sample,prediction,label\n");
        for (int i = 0; i < test->n; i++)
            fprintf(f, "%d,%d,%d\n", i, pred[i], test->labels[i]);
        if ((ferror(f) | fclose(f)) != 0) { /* both, always: the file is closed */
            rp_fail(&err, RP_ERR_IO, "%s: write failed", out);
            goto fail;
        }
    }
    if (lead)
        printf("%d samples, %d right\ntest accuracy: %.4f\n", test->n, right,
               (double)right / test->n);
    rc = 0;
    goto done;
fail:
    cli_error(cmd, "%s", err.msg);
    cli_mpi_abort(comm, err.msg);
done:
    free(pred);
    rp_weights_free(w);
    rp_session_free(s);
    rp_dataset_free(test);
    rp_model_free(m);
    if (comm)
        rp_comm_mpi_finalize(comm);
    return rc;
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
