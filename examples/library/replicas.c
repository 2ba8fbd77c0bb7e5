/*
** repipe as a library: two replicas of a small model train on a synthetic
** dataset, the weights are read back and saved, the model is predicted on,
** and a profile is planned for 2 servers of 4 devices. Build it against an
** installed repipe:
**
**   cc replicas.c $(pkg-config --cflags --libs repipe) -o replicas
**
** See docs/library.md, which walks through it.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <repipe/repipe.h>

static const char MODEL[] = "input 1 8 8\n"
                            "flatten\n"
                            "linear 32\n"
                            "relu\n"
                            "linear 4\n"
                            "softmax_cross_entropy\n";

static const char CONFIG[] = "{\"replication_factor\": 2, \"micro_batch_size\": 8,"
                             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9}}";

static const char PROFILE[] =
    "node0 -- Input0 -- forward_compute_time=0, backward_compute_time=0, "
    "activation_size=256, parameter_size=0\n"
    "node1 -- Linear -- forward_compute_time=4, backward_compute_time=8, "
    "activation_size=128, parameter_size=8320\n"
    "node2 -- Linear -- forward_compute_time=1, backward_compute_time=2, "
    "activation_size=16, parameter_size=132\n"
    "\tnode0 -- node1\n\tnode1 -- node2\n";

/* Every call returns a status; on failure err.msg says what and where. */
#define CHECK(call)                                                                       \
    do {                                                                                  \
        if ((call) != RP_OK) {                                                            \
            fprintf(stderr, "replicas: %s\n", err.msg);                                   \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

int main(void) {
    rp_error err;
    rp_model *m;
    rp_config cfg;
    rp_dataset *data;
    CHECK(rp_model_parse(&m, MODEL, strlen(MODEL), "model", &err));
    CHECK(rp_config_load_string(&cfg, CONFIG, strlen(CONFIG), "config", &err));
    rp_shape sample = {3, {1, 8, 8}};
    CHECK(rp_dataset_synthetic(&data, 512, sample, 4, 1, &err));

    /* Two replicas on threads. The model must outlive the session. */
    rp_session *s;
    CHECK(rp_session_create(m, &cfg, &s, &err));
    long long per = rp_session_samples_per_call(s); /* B * GA * R * D */
    int64_t *ids = malloc(sizeof(int64_t) * per);
    double first = 0, last = 0;
    for (int u = 0; u < 200; u++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (u * per + i) % data->n;
        rp_result r; /* the session owns r.losses until the next call */
        CHECK(rp_session_run_samples(s, data, ids, &r, &err));
        double loss = 0;
        for (int i = 0; i < r.count; i++)
            loss += r.losses[i] / r.count;
        if (u == 0)
            first = loss;
        last = loss;
    }
    printf("%d workers, loss %.3f after 1 update, %.3f after 200\n", rp_session_workers(s),
           first, last);

    /* The weights, one copy per replica group; the caller frees them. */
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err));
    CHECK(rp_weights_save(w, "replicas.rpw", &err));
    printf("%d tensors written to replicas.rpw\n", w->num_tensors);
    rp_weights_free(w);

    /* Predictions on the first 64 samples. */
    int32_t pred[64];
    CHECK(rp_session_predict(s, data->x, 64, pred, &err));
    int right = 0;
    for (int i = 0; i < 64; i++)
        right += pred[i] == data->labels[i];
    printf("accuracy on 64 samples: %.2f\n", right / 64.0);

    /* A plan: the profile's layers over 2 servers of 4 devices. */
    rp_profile *prof;
    rp_plan_options po;
    rp_plan *plan;
    CHECK(rp_profile_parse(&prof, PROFILE, strlen(PROFILE), "profile", &err));
    rp_plan_options_default(&po);
    po.num_levels = 2;
    po.machines[0] = 4, po.machines[1] = 2; /* innermost first */
    po.bandwidth[0] = 10e9, po.bandwidth[1] = 1e9;
    CHECK(rp_plan_compute(prof, &po, &plan, &err));
    printf("plan: %d stages on %d workers, %.2fx one machine\n", plan->num_stages,
           plan->num_workers, plan->speedup_vs_single);

    rp_plan_free(plan);
    rp_profile_free(prof);
    free(ids);
    rp_session_free(s);
    rp_dataset_free(data);
    rp_model_free(m);
    return 0;
}
