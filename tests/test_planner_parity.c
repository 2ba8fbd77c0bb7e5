#define _POSIX_C_SOURCE 200809L
/*
** Parity with PipeDream's optimizer on its own profiles: every fixture of
** tests/fixtures/pipedream/expected (the outputs of
** optimizer_graph_hierarchical.py) must give the same number of states,
** the same times and speed-ups within 1e-9 relative, and, where the
** fixture's plan is unique, the same stage tables and node stages. A
** fixture with a pipedream_profile holds PipeDream's answer on the profile
** compressed by hand; repipe must give it on the profile as measured.
** Usage: test_planner_parity FIXTURE_DIR (fails when it is absent).
*/
#include <cJSON.h>
#include <stdlib.h>

#include "../src/core/util.h"
#include "repipe/planner.h"
#include "test.h"

#define RTOL 1e-9

static void check_fixture(const char *dir, const char *name) {
    char path[2048];
    snprintf(path, sizeof path, "%s/expected/%s", dir, name);
    char *text;
    size_t len;
    rp_error err;
    CHECK(rp_read_file(path, &text, &len, &err) == RP_OK);
    cJSON *fx = cJSON_Parse(text);
    rp_plan_options o;
    CHECK(rp_plan_options_from_json(&o, text, len, name, &err) == RP_OK);
    free(text);
    CHECK(fx != NULL);
    if (!fx)
        return;

    snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetObjectItem(fx, "profile")->valuestring);
    rp_profile *prof;
    CHECK(rp_profile_read(&prof, path, &err) == RP_OK);
    rp_plan *plan = NULL, *again = NULL;
    CHECK(rp_plan_compute(prof, &o, &plan, &err) == RP_OK);
    if (!plan) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        rp_profile_free(prof);
        cJSON_Delete(fx);
        return;
    }
    int before = test_failures;
    /* a profile PipeDream plans only compressed by hand: the same answer
    ** from the profile as measured and from PipeDream's compressed file */
    const cJSON *cn = cJSON_GetObjectItem(fx, "compressed_nodes");
    CHECK_INT(plan->compressed_nodes, cn ? cn->valueint : 0);
    const cJSON *pd = cJSON_GetObjectItem(fx, "pipedream_profile");
    if (pd) {
        snprintf(path, sizeof path, "%s/%s", dir, pd->valuestring);
        rp_profile *hand;
        rp_plan *hp = NULL;
        CHECK(rp_profile_read(&hand, path, &err) == RP_OK);
        CHECK(rp_plan_compute(hand, &o, &hp, &err) == RP_OK);
        if (hp) {
            CHECK_INT(hp->compressed_nodes, 0);
            CHECK_INT(hp->num_states, plan->num_states);
            CHECK(hp->pipeline_time == plan->pipeline_time);
            CHECK(hp->single_stage_time == plan->single_stage_time);
            CHECK(hp->data_parallel_time == plan->data_parallel_time);
        }
        rp_plan_free(hp);
        rp_profile_free(hand);
    }
    CHECK_INT(plan->num_states, cJSON_GetObjectItem(fx, "num_states")->valueint);
    CHECK_CLOSE(plan->single_stage_time, cJSON_GetObjectItem(fx, "single_stage_time")->valuedouble,
                RTOL);
    CHECK_CLOSE(plan->pipeline_time, cJSON_GetObjectItem(fx, "pipeline_time")->valuedouble, RTOL);
    CHECK_CLOSE(plan->speedup_vs_single,
                cJSON_GetObjectItem(fx, "speedup_vs_single")->valuedouble, RTOL);
    CHECK_CLOSE(plan->dp_speedup_vs_single,
                cJSON_GetObjectItem(fx, "dp_speedup_vs_single")->valuedouble, RTOL);
    CHECK_CLOSE(plan->speedup_vs_dp, cJSON_GetObjectItem(fx, "speedup_vs_dp")->valuedouble, RTOL);
    if (cJSON_IsTrue(cJSON_GetObjectItem(fx, "plan_is_unique"))) {
        const cJSON *levels = cJSON_GetObjectItem(fx, "levels");
        CHECK_INT(cJSON_GetArraySize(levels), plan->num_levels);
        int l = 0;
        const cJSON *lv;
        cJSON_ArrayForEach(lv, levels) {
            if (l >= plan->num_levels)
                break;
            const rp_plan_level *pl = &plan->levels[l++];
            CHECK_INT(pl->level, cJSON_GetObjectItem(lv, "level")->valueint);
            const cJSON *stages = cJSON_GetObjectItem(lv, "stages");
            CHECK_INT(pl->num_stages, cJSON_GetArraySize(stages));
            int k = 0;
            const cJSON *sg;
            cJSON_ArrayForEach(sg, stages) {
                if (k >= pl->num_stages)
                    break;
                const rp_plan_stage *ps = &pl->stages[k++];
                CHECK_INT(ps->start, cJSON_GetObjectItem(sg, "start")->valueint);
                CHECK_INT(ps->end, cJSON_GetObjectItem(sg, "end")->valueint);
                CHECK_INT(ps->replication, cJSON_GetObjectItem(sg, "replication")->valueint);
                CHECK_CLOSE(ps->compute_time,
                            cJSON_GetObjectItem(sg, "compute_time")->valuedouble, RTOL);
            }
        }
        const cJSON *ns = cJSON_GetObjectItem(fx, "node_stage");
        int assigned = 0;
        for (int i = 0; i < prof->num_nodes; i++)
            if (plan->node_stage[i] >= 0) {
                assigned++;
                const cJSON *v = cJSON_GetObjectItem(ns, prof->nodes[i].id);
                CHECK(v != NULL);
                if (v)
                    CHECK_INT(plan->node_stage[i], v->valueint);
            }
        CHECK_INT(assigned, cJSON_GetArraySize(ns));
    }
    /* The same output on every run. */
    CHECK(rp_plan_compute(prof, &o, &again, &err) == RP_OK);
    if (again) {
        CHECK(again->pipeline_time == plan->pipeline_time);
        CHECK_INT(again->num_workers, plan->num_workers);
        for (int r = 0; r < plan->num_workers && r < again->num_workers; r++)
            CHECK_INT(again->worker_stage[r], plan->worker_stage[r]);
    }
    printf("%-24s %s  states %d  pipeline %.9g s\n", name,
           test_failures == before ? "ok" : "MISMATCH", plan->num_states, plan->pipeline_time);
    rp_plan_free(again);
    rp_plan_free(plan);
    rp_profile_free(prof);
    cJSON_Delete(fx);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures/pipedream";
    char exp[2048];
    snprintf(exp, sizeof exp, "%s/expected", dir);
    char *names[256];
    int n = rp_list_dir(exp, ".json", names, 256);
    if (n < 0) {
        fprintf(stderr, "no PipeDream fixtures at %s\n", exp);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        check_fixture(dir, names[i]);
        free(names[i]);
    }
    CHECK(n >= 13);
    return test_finish("test_planner_parity");
}
