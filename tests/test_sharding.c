/*
** Replicated tensor sharding (ZeRO stage 1) and offchip optimizer state:
** with the state sharded over the workers that share a variable, streamed
** from a file, or both, training gives the same weights as without (bit for
** bit on the local backend: the shards' sums are the allreduce's, and the
** arithmetic is the same), and each worker holds its share of the state.
**
**   test_sharding          local backend
**   test_sharding --mpi    under mpirun -np 4: R = 4 and R = 2 x P = 2
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/data.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

static const char *MLP = "input 1 28 28\nflatten\nlinear 400\nrelu\nlinear 37\nrelu\n"
                         "linear 10\nsoftmax_cross_entropy\n";

static rp_dataset *data;
static rp_comm *mpi;

static rp_config config(const char *shape, const char *opt, bool rts, bool offchip) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 4, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": 3, %s, "
             "\"replicated_tensor_sharding\": %s, \"optimizer_state_offchip\": %s, "
             "\"optimizer\": %s}",
             shape, rts ? "true" : "false", offchip ? "true" : "false", opt);
    rp_config c;
    rp_error err;
    if (rp_config_load_string(&c, json, strlen(json), "test", &err) != RP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return c;
}

static rp_weights *train(const rp_model *m, const rp_config *c, rp_memory *mem) {
    rp_session *s;
    rp_error err;
    rp_status st = mpi ? rp_session_create_mpi(m, c, mpi, &s, &err) : rp_session_create(m, c, &s, &err);
    if (st) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    CHECK(rp_session_memory(s, 0, mem, &err) == RP_OK);
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * 784);
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (int k = 0; k < 3; k++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (k * per + i) % data->n;
        rp_dataset_gather(data, ids, (int)per, x, y);
        rp_result r;
        CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
    }
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ALL_REPLICAS, &w, &err) == RP_OK);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return w;
}

static void compare(const char *shape, int sharers, int workers) {
    /* Adam's eps as in test_training.c: under MPI the reduce-scatter and the
    ** allreduce sum in different orders, which eps = 1e-8 would amplify */
    static const char *opts[] = {"{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
                                 "{\"type\": \"adam\", \"lr\": 0.001, \"eps\": 1e-5}"};
    if (mpi && workers != rp_comm_size(mpi))
        return;
    rp_model *m = test_model(MLP);
    for (int o = 0; o < 2; o++) {
        rp_config off = config(shape, opts[o], false, false), on = config(shape, opts[o], true, false);
        rp_config chip = config(shape, opts[o], false, true), both = config(shape, opts[o], true, true);
        rp_memory mo, mn, mc, mb;
        rp_weights *a = train(m, &off, &mo), *b = train(m, &on, &mn), *c = train(m, &chip, &mc),
                   *e = train(m, &both, &mb);
        rp_weights *variants[3] = {b, c, e};
        for (int k = 0; k < 3; k++) {
            double worst = 0;
            for (int t = 0; t < a->num_tensors; t++) {
                size_t n = rp_shape_size(&a->tensors[t].shape) * a->tensors[t].groups;
                double d = rp_tensor_rel_diff(a->tensors[t].data, variants[k]->tensors[t].data, n);
                worst = d > worst ? d : worst;
            }
            test_checks++;
            if (!(mpi ? worst <= 1e-5 : worst == 0)) {
                fprintf(stderr, "%s, optimizer %d, variant %d (sharded, offchip, both): differs "
                                "by %g\n", shape, o, k, worst);
                test_failures++;
            }
        }
        /* offchip: one chunk of state in memory at most */
        CHECK(mc.optimizer <= mo.optimizer);
        CHECK(mb.optimizer <= mn.optimizer);
        rp_weights_free(c), rp_weights_free(e);
        /* a worker of stage 0 keeps ceil(n / sharers) of each run's state */
        CHECK(mo.optimizer > 0);
        CHECK(mn.optimizer * sharers <= mo.optimizer + (size_t)sharers * 64 * sizeof(float));
        CHECK(mn.optimizer * sharers >= mo.optimizer);
        rp_weights_free(a), rp_weights_free(b);
    }
    rp_model_free(m);
}

/* embedding_serialization_factor: the table as row blocks, the same weights
** bit for bit; a vocabulary the factor does not divide is refused. */
static void embedding_blocks(void) {
    rp_model *m = test_model("input 12\nembedding 60 8\nlayernorm\nflatten\nlinear 10\n"
                             "softmax_cross_entropy\n");
    rp_weights *w[3] = {0};
    static const int factors[3] = {1, 4, 3};
    for (int k = 0; k < 3; k++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"seed\": 2, \"micro_batch_size\": 4, \"replication_factor\": 2, "
                 "\"embedding_serialization_factor\": %d, \"optimizer\": {\"type\": \"adam\"}}",
                 factors[k]);
        rp_config c;
        rp_error err;
        rp_session *s;
        CHECK(rp_config_load_string(&c, json, strlen(json), "t", &err) == RP_OK);
        CHECK(rp_session_create(m, &c, &s, &err) == RP_OK);
        float x[8 * 12];
        int32_t y[8];
        int64_t ids[8];
        for (int call = 0; call < 2; call++) {
            for (int i = 0; i < 8; i++) {
                ids[i] = call * 8 + i;
                y[i] = (i * 3 + call) % 10;
                for (int t = 0; t < 12; t++) /* repeated tokens too */
                    x[i * 12 + t] = (float)((i * 7 + t * 5 + call) % 60);
            }
            rp_result r;
            CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
        }
        CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w[k], &err) == RP_OK);
        rp_session_free(s);
    }
    for (int k = 1; k < 3; k++)
        for (int t = 0; t < w[0]->num_tensors; t++)
            CHECK(memcmp(w[0]->tensors[t].data, w[k]->tensors[t].data,
                         sizeof(float) * rp_shape_size(&w[0]->tensors[t].shape)) == 0);
    for (int k = 0; k < 3; k++)
        rp_weights_free(w[k]);
    const char *bad = "{\"embedding_serialization_factor\": 7}";
    rp_config c;
    rp_error err;
    rp_session *s;
    CHECK(rp_config_load_string(&c, bad, strlen(bad), "t", &err) == RP_OK);
    CHECK(rp_session_create(m, &c, &s, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "embedding_serialization_factor 7: the vocabulary of layer 0 "
                           "(embedding, line 2) has 60 rows, not a multiple of 7");
    rp_model_free(m);
}

int main(int argc, char **argv) {
    rp_error err;
    rp_shape shape = {3, {1, 28, 28}};
    if (rp_dataset_synthetic(&data, 256, shape, 10, 2, &err) != RP_OK)
        return 1;
    if (argc > 1 && strcmp(argv[1], "--mpi") == 0 && rp_comm_mpi_init(&argc, &argv, &mpi, &err))
        return 1;
    compare("\"replication_factor\": 4", 4, 4);
    compare("\"replication_factor\": 2, \"layers_per_stage\": [3, -1]", 2, 4);
    compare("\"replication_factor\": 2, \"layers_per_stage\": [3, -1], "
            "\"stage_replication\": [2, 1]", 4, 6);
    compare("\"replication_factor\": 4, \"replica_grouping\": {\"group_size\": 2}", 2, 4);
    if (!mpi)
        embedding_blocks();
    char name[64];
    snprintf(name, sizeof name, "test_sharding (%s)", mpi ? "mpi" : "local");
    int rc = test_finish(name);
    rp_dataset_free(data);
    if (mpi)
        rp_comm_mpi_finalize(mpi);
    return rc;
}
