/*
** The Zero Bubble paper's bubble rates from its pass times: for each of
** its twelve settings (tests/fixtures/zero-bubble, README there) a profile
** of p nodes with the setting's F, B and W and no parameters, p machines
** whose links delay a transfer by T_comm, and 1f1b, zb-h1 and zb-h2
** simulated; each steady bubble rate (rp_simulate_steady) must be the
** table's to 1e-4 (the table rounds to 4 places; the paper's claim is
** checked to its printed digits).
**
** usage: test_zbpaper FIXTURE_DIR
*/
#include <stdio.h>
#include <stdlib.h>

#include "repipe/profile.h"
#include "repipe/simulate.h"
#include "support.h"
#include "test.h"

#define MAX_P 32

/* A profile of p stages as repipe profile writes one: an input node, then a
** node a stage with its halves, in milliseconds; no activation bytes, so
** that a transfer costs the links' latency alone, as the paper counts it. */
static rp_profile *paper_profile(int p, double F, double B, double W) {
    static char text[16384];
    int n = snprintf(text, sizeof text,
                     "node0 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
                     "activation_size=0.000, parameter_size=0.000\n");
    for (int i = 0; i < p; i++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "node%d -- stage%d backward_input_time=%.3f backward_weight_time=%.3f -- "
                      "forward_compute_time=%.3f, backward_compute_time=%.3f, "
                      "activation_size=0.000, parameter_size=0.000\n",
                      i + 1, i, B / 1e3, W / 1e3, F / 1e3, (B + W) / 1e3);
    for (int i = 0; i < p; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "\tnode%d -- node%d\n", i, i + 1);
    rp_profile *prof = NULL;
    rp_error err;
    CHECK_OK(rp_profile_parse(&prof, text, (size_t)n, "zero-bubble.txt", &err), err);
    return prof;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_zbpaper FIXTURE_DIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/bubble_rates.txt", argv[1]);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    static const char *schedules[] = {"1f1b", "zb-h1", "zb-h2"};
    char line[512];
    int rows = 0;
    double worst = 0, first_h2 = 0;
    while (fgets(line, sizeof line, f)) {
        int p, m;
        double F, B, W, c, paper[5];
        if (line[0] == '#' || sscanf(line, "%d %d %lf %lf %lf %lf %lf %lf %lf %lf %lf", &p, &m,
                                     &F, &B, &W, &c, &paper[0], &paper[1], &paper[2], &paper[3],
                                     &paper[4]) != 11)
            continue;
        CHECK(p >= 2 && p <= MAX_P);
        rp_profile *prof = paper_profile(p, F, B, W);
        double *fw, *bw, *ob, *pb, *b, *w;
        int *node, L;
        rp_error err;
        CHECK_OK(rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err), err);
        CHECK_OK(rp_profile_split_ms(prof, node, L, &b, &w, &err), err);
        CHECK_INT(L, p);
        rp_sim_options o;
        rp_sim_options_default(&o);
        o.num_levels = 1, o.machines[0] = p, o.bandwidth[0] = 1e15, o.latency = c * 1e-6;
        o.bwd_input_ms = b, o.bwd_weight_ms = w;
        for (int k = 0; k < 3; k++) {
            char json[512], layers[128];
            snprintf(json, sizeof json,
                     "{\"micro_batch_size\": 1, \"gradient_accumulation_steps\": %d, "
                     "\"schedule\": \"%s\", \"layers_per_stage\": %s}", m, schedules[k],
                     test_ones(layers, sizeof layers, p));
            rp_config cfg = test_config(json);
            rp_sim_result r;
            CHECK_OK(rp_simulate(&cfg, fw, bw, ob, pb, L, &o, &r, &err), err);
            CHECK_OK(rp_simulate_steady(&cfg, fw, bw, ob, pb, L, &o, &r, &err), err);
            double d = fabs(r.steady_bubble_fraction - paper[k]);
            CHECKF(d <= 1e-4, "p %d, m %d, %s: bubble %.4f, the paper's %.4f", p, m,
                   schedules[k], r.steady_bubble_fraction, paper[k]);
            worst = d > worst ? d : worst;
            /* the first update alone: the same where the first stage ends last */
            if (k < 2)
                CHECK_CLOSE(r.bubble_fraction, r.steady_bubble_fraction, 1e-9);
            else if (fabs(r.bubble_fraction - paper[k]) > first_h2)
                first_h2 = fabs(r.bubble_fraction - paper[k]);
            rp_sim_result_free(&r);
        }
        free(fw), free(bw), free(ob), free(pb), free(node), free(b), free(w);
        rp_profile_free(prof);
        rows++;
    }
    fclose(f);
    CHECK_INT(rows, 12);
    /* zb-h2's next update starts on the first stages while the last drain:
    ** its first update alone misses the table by far more than the bound */
    CHECK(first_h2 > 0.02);
    printf("%d settings x 3 schedules: worst |bubble - the paper's| %.1e (zb-h2's first update "
           "alone: %.4f)\n", rows, worst, first_h2);
    printf("%d checks, %d failures\n", test_checks, test_failures);
    return test_failures != 0;
}
