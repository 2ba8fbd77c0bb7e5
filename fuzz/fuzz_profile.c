/*
** Fuzz target: the graph.txt reader, and the planner on what it accepts.
** Any input must parse or fail with a message; a parsed graph must survive
** write -> read, and plan (or fail cleanly) on a small machine.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/planner.h"
#include "repipe/profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_profile *p, *q;
    rp_error err;
    if (rp_profile_parse(&p, (const char *)data, size, "fuzz", &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    char *text;
    if (rp_profile_to_string(p, NULL, &text, &err) == RP_OK) {
        if (rp_profile_parse(&q, text, strlen(text), "rewritten", &err) != RP_OK ||
            q->num_nodes != p->num_nodes || q->num_edges != p->num_edges)
            abort();
        rp_profile_free(q);
        free(text);
    }
    if (p->num_nodes <= 64) {
        rp_plan_options o;
        rp_plan_options_default(&o);
        o.num_levels = 2;
        o.machines[0] = 3;
        o.machines[1] = 2;
        o.fewer_machines = size & 1;
        o.memory_constraint = size & 2;
        o.memory_size = 1e3;
        rp_plan *plan;
        if (rp_plan_compute(p, &o, &plan, &err) == RP_OK)
            rp_plan_free(plan);
        else if (err.msg[0] == '\0')
            abort();
    }
    rp_profile_free(p);
    return 0;
}
