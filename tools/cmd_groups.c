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
    {"transpose", 't', NULL, "print the transpose: one replica of every group in each group"},
    {NULL, 0, NULL, NULL},
};

/* A transpose with no stride: its groups as PopXL lists them, by
** assignment; 0, or 1 out of memory. */
static int print_assigned(const rp_grouping *g, bool json) {
    int *a = malloc(sizeof(int) * g->replicas);
    if (!a)
        return 1;
    rp_grouping_transpose_assignment(g, a);
    int groups = g->group_size, size = rp_grouping_num_groups(g);
    if (json)
        printf("{\"replicas\":%d,\"group_size\":%d,\"stride\":null,\"num_groups\":%d,"
               "\"groups\":[", g->replicas, size, groups);
    else
        printf("The transpose of stride %d, group size %d has no stride; PopXL holds it "
               "as a list of groups, which collectives cannot use.\nGroup  Replicas\n",
               g->stride, g->group_size);
    for (int k = 0; k < groups; k++) {
        if (json)
            printf("%s[", k ? "," : "");
        else
            printf("%-5d  ", k);
        for (int r = 0, n = 0; r < g->replicas; r++)
            if (a[r] == k)
                printf("%s%d", n++ ? (json ? "," : ", ") : "", r);
        printf(json ? "]" : "\n");
    }
    if (json)
        printf("]}\n");
    free(a);
    return 0;
}

/* A grouping's groups, a table or JSON; 0, or 1 out of memory. */
static int print_groups(const rp_grouping *g, bool json) {
    int groups = rp_grouping_num_groups(g);
    int *members = malloc(sizeof(int) * g->group_size);
    if (!members)
        return 1;
    if (json)
        printf("{\"replicas\":%d,\"group_size\":%d,\"stride\":%d,\"num_groups\":%d,\"groups\":[",
               g->replicas, g->group_size, g->stride, groups);
    else
        printf("Group  Replicas\n");
    for (int k = 0; k < groups; k++) {
        rp_grouping_members(g, k, members);
        if (json)
            printf("%s[", k ? "," : "");
        else
            printf("%-5d  ", k);
        for (int i = 0; i < g->group_size; i++)
            printf("%s%d", i ? (json ? "," : ", ") : "", members[i]);
        printf(json ? "]" : "\n");
    }
    if (json)
        printf("]}\n");
    free(members);
    return 0;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    long long replicas = 0, group_size = 0, stride = 1;
    bool json = false, help, has_size = false, has_stride = false, transpose = false;
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
        has_size |= o == 1;
        has_stride |= o == 2;
        json |= o == 3;
        transpose |= o == 4;
    }
    if (replicas == 0) {
        cli_error(cmd, "--replicas is required");
        return 2;
    }
    rp_grouping g, t;
    rp_error err;
    int gs = (int)group_size, st = (int)stride;
    if (rp_grouping_popxl(&g, (int)replicas, has_stride ? &st : NULL, has_size ? &gs : NULL,
                          &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    if (!transpose)
        return print_groups(&g, json);
    if (rp_grouping_transpose(&g, &t, &err) == RP_OK)
        return print_groups(&t, json);
    return print_assigned(&g, json); /* no stride */
}

const cli_cmd cmd_groups = {
    "groups",
    "print which replicas share a variable under a replica grouping",
    "--replicas R [--group-size G] [--stride S] [--transpose] [--json]",
    "As PopXL's ir.replica_grouping(stride, group_size): the stride is 1 to R and\n"
    "divides R, the group size is 1 to R, R is a multiple of stride * group size;\n"
    "with group size 1 the stride is 1. Not given, the stride is 1 and the group\n"
    "size R / stride. Groups are numbered as in PopXL:\n"
    "group(r) = r mod S + S * floor(r / (S * G)).",
    OPTS,
    run,
};
