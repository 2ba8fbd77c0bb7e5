/*
** repipe groups: prints the groups of a replica grouping.
*/
#include <stdlib.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"replicas", 'r', "R", "number of replicas (required)"},
    {"group-size", 'g', "G", "replicas per group [all of them]"},
    {"stride", 's', "S", "distance between members of a group [1]"},
    {"json", 0, NULL, "print JSON instead of a table"},
    {NULL, 0, NULL, NULL},
};

static int run(const cli_cmd *cmd, int argc, char **argv) {
    long long replicas = 0, group_size = 0, stride = 1;
    bool json = false, help;
    const char *arg;
    int o;
    while ((o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1) {
        if (o == -2)
            return help ? 0 : 2;
        const char *name = OPTS[o].name;
        if ((o == 0 && !cli_int(name, arg, 1, 1 << 20, &replicas)) ||
            (o == 1 && !cli_int(name, arg, -(1 << 20), 1 << 20, &group_size)) ||
            (o == 2 && !cli_int(name, arg, -(1 << 20), 1 << 20, &stride)))
            return 2;
        if (o == 3)
            json = true;
    }
    if (replicas == 0) {
        cli_error(cmd, "--replicas is required");
        return 2;
    }
    if (group_size == 0)
        group_size = replicas;
    rp_grouping g;
    rp_error err;
    if (rp_grouping_init(&g, (int)replicas, (int)group_size, (int)stride, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    int groups = rp_grouping_num_groups(&g);
    int *members = malloc(sizeof(int) * g.group_size);
    if (!members)
        return 1;
    if (json) {
        printf("{\"replicas\":%d,\"group_size\":%d,\"stride\":%d,\"num_groups\":%d,\"groups\":[",
               g.replicas, g.group_size, g.stride, groups);
        for (int k = 0; k < groups; k++) {
            rp_grouping_members(&g, k, members);
            printf("%s[", k ? "," : "");
            for (int i = 0; i < g.group_size; i++)
                printf("%s%d", i ? "," : "", members[i]);
            printf("]");
        }
        printf("]}\n");
    } else {
        printf("Group  Replicas\n");
        for (int k = 0; k < groups; k++) {
            rp_grouping_members(&g, k, members);
            printf("%-5d  ", k);
            for (int i = 0; i < g.group_size; i++)
                printf("%s%d", i ? ", " : "", members[i]);
            printf("\n");
        }
    }
    free(members);
    return 0;
}

const cli_cmd cmd_groups = {
    "groups",
    "print which replicas share a variable under a replica grouping",
    "--replicas R [--group-size G] [--stride S] [--json]",
    "A grouping is valid when R is a multiple of stride * group_size; with\n"
    "group size 1 the stride is ignored. Groups are numbered as in PopXL:\n"
    "group(r) = r mod S + S * floor(r / (S * G)).",
    OPTS,
    run,
};
