/*
** repipe simulate: predicts an update's time from a profile and draws the
** schedule; with --model, also measures it.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"config", 'c', "FILE", "execution configuration, e.g. from 'repipe plan --config-out'"},
    {"plan", 'p', "FILE", "a plan ('repipe plan --json'): its stages and replication"},
    {"profile", 'f', "FILE", "per-layer profile, e.g. from 'repipe profile' (required)"},
    {"profile-batch", 'b', "B", "micro-batch the profile was measured on [the config's]"},
    {"svg", 's', "FILE", "draw the schedule: one row per worker"},
    {"model", 'm', "FILE", "also run the configuration with this model and measure it"},
    {"cores", 0, "N", "cores the workers share [this machine's]; fewer than workers slows them"},
    {NULL, 0, NULL, NULL},
};

/* Median time of an update over a few host calls of Fashion-MNIST samples
** (the median, as the profile's times are). */
static rp_status measure(const char *model_path, const rp_config *cfg, double *best,
                         rp_error *err) {
    rp_model *m = NULL;
    rp_dataset *d = NULL;
    rp_session *s = NULL;
    rp_status st;
    if ((st = rp_model_load(&m, model_path, err)) ||
        (st = rp_dataset_load_idx(&d, RP_FASHION_MNIST_DIR, true, err)) ||
        (st = rp_session_create(m, cfg, &s, err)))
        goto done;
    long long per = rp_session_samples_per_call(s);
    size_t in = rp_shape_size(&d->sample);
    float *x = malloc(sizeof(float) * per * in);
    int32_t *y = malloc(sizeof(int32_t) * per);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    if (!x || !y || !ids) {
        free(x), free(y), free(ids);
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (long long i = 0; i < per; i++)
        ids[i] = i % d->n;
    rp_dataset_gather(d, ids, (int)per, x, y);
    double times[25];
    int nt = 0;
    for (int k = 0; k < 25 && !st; k++) {
        rp_result r;
        double t = rp_now();
        st = rp_session_run(s, x, y, ids, &r, err);
        t = (rp_now() - t) / cfg->device_iterations;
        if (k >= 3)
            times[nt++] = t;
    }
    qsort(times, nt, sizeof(double), rp_cmp_double);
    *best = nt ? times[nt / 2] : 0;
    free(x), free(y), free(ids);
done:
    rp_session_free(s);
    rp_dataset_free(d);
    rp_model_free(m);
    return st;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *config_path = NULL, *profile_path = NULL, *svg = NULL, *model = NULL;
    const char *plan = NULL;
    long long pbatch = 0, cores = sysconf(_SC_NPROCESSORS_ONLN);
    bool help;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if ((o == 3 && !cli_int("profile-batch", arg, 1, 1 << 20, &pbatch)) ||
            (o == 6 && !cli_int("cores", arg, 1, 1 << 20, &cores)))
            return 2;
        if (o == 6)
            continue;
        const char **dst[] = {&config_path, &plan, &profile_path, NULL, &svg, &model};
        if (dst[o])
            *dst[o] = arg;
    }
    if ((!config_path && !plan) || !profile_path) {
        cli_error(cmd, "--profile and --config or --plan are required (see 'repipe simulate --help')");
        return 2;
    }
    rp_error err;
    rp_config cfg;
    rp_profile *p;
    rp_config_default(&cfg);
    if ((config_path && rp_config_load_file(&cfg, config_path, &err)) ||
        rp_profile_read(&p, profile_path, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    if (plan) {
        char *text;
        size_t len;
        rp_status ps = rp_read_file(plan, &text, &len, &err);
        if (!ps) {
            ps = rp_config_apply_plan(&cfg, text, len, plan, &err);
            free(text);
        }
        if (ps) {
            cli_error(cmd, "%s", err.msg);
            rp_profile_free(p);
            return 1;
        }
        if (!config_path)
            config_path = plan;
    }
    int L = 0;
    double *fw = NULL, *bw = NULL, *ob = NULL, *pb = NULL;
    int rc = 1;
    if (rp_profile_layers(p, &fw, &bw, &ob, &pb, NULL, &L, &err)) {
        cli_error(cmd, "%s", err.msg);
        goto done;
    }
    rp_derived d;
    rp_config_derive(&cfg, &d);
    double share = cores > 0 && d.workers > cores ? (double)d.workers / cores : 1;
    rp_sim_options opt = {pbatch ? (double)pbatch : cfg.micro_batch_size, 1e10, 2e-5, share};
    rp_sim_result res;
    if (rp_simulate(&cfg, fw, bw, ob, pb, L, &opt, &res, &err)) {
        cli_error(cmd, "%s", err.msg);
        goto done;
    }
    printf("%s: %d workers, %d stages, %d micro-batches of %d per replica\n", config_path,
           d.workers, d.stages, cfg.gradient_accumulation_steps, cfg.micro_batch_size);
    printf("predicted time per update   %.3f ms  (%.0f samples/s)%s\n", res.update_time * 1e3,
           d.samples_per_update / res.update_time,
           share > 1 ? "  (workers share the cores: compute stretched)" : "");
    if (svg) {
        if (rp_sim_svg(&res, config_path, svg, &err)) {
            cli_error(cmd, "%s", err.msg);
            rp_sim_result_free(&res);
            goto done;
        }
        printf("timeline written to %s\n", svg);
    }
    if (model) {
        double t = 0;
        if (measure(model, &cfg, &t, &err)) {
            cli_error(cmd, "%s", err.msg);
            rp_sim_result_free(&res);
            goto done;
        }
        printf("measured time per update    %.3f ms  (%.0f samples/s): prediction %+.1f %%\n",
               t * 1e3, d.samples_per_update / t, 100 * (res.update_time - t) / t);
    }
    rp_sim_result_free(&res);
    rc = 0;
done:
    free(fw), free(bw), free(ob), free(pb);
    rp_profile_free(p);
    return rc;
}

const cli_cmd cmd_simulate = {
    "simulate",
    "predict a configuration's time per update from a profile, and draw its schedule",
    "--profile FILE (--config FILE | --plan FILE [--config FILE]) [--svg F] [--model FILE]",
    "--plan takes the stages and replication of a plan written by 'repipe plan\n"
    "--json'; --config adds the batch, accumulation and schedule (or gives all).\n"
    "Every worker's checked operation list is played on its own clock: compute\n"
    "takes the profile's time (scaled to the micro-batch), a receive waits for\n"
    "its send, a reduction for its group. Each worker is assumed to have a core\n"
    "of its own. With --model the configuration is also run on Fashion-MNIST and\n"
    "the measured time per update printed beside the prediction.",
    OPTS,
    run,
};
