/*
** repipe plan's words for a plan (plan_print.h).
*/
#define _XOPEN_SOURCE 700 /* realpath */
#include "plan_print.h"

#include "cli.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "ranks 0–6 and 8–14": runs of consecutive ranks, joined in words. */
static void print_ranks(const rp_plan *p, int s) {
    int runs[4096][2], n = 0;
    for (int r = 0; r < p->num_workers; r++) {
        if (p->worker_stage[r] != s)
            continue;
        if (n && runs[n - 1][1] == r - 1)
            runs[n - 1][1] = r;
        else if (n < 4096) {
            runs[n][0] = runs[n][1] = r;
            n++;
        }
    }
    int count = p->stage_num_ranks[s];
    printf("  stage %d: %d worker%s \u2014 rank%s ", s, count, count == 1 ? "" : "s",
           count == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        if (i)
            printf(i == n - 1 ? " and " : ", ");
        if (runs[i][0] == runs[i][1])
            printf("%d", runs[i][0]);
        else
            printf("%d\u2013%d", runs[i][0], runs[i][1]);
    }
    printf("\n");
}

/* The name PipeDream's scripts take for the model: the profile's directory
** (profiles/vgg16/graph.txt: vgg16), else its file name, as an identifier. */
static void arch_name(const char *path, char *out, size_t cap) {
    const char *end = strrchr(path, '/'), *start = path;
    if (end && strcmp(end + 1, "graph.txt") == 0) { /* the directory */
        start = end;
        while (start > path && start[-1] != '/')
            start--;
    } else {
        start = end ? end + 1 : path;
        end = strchr(start, '.');
        if (!end)
            end = start + strlen(start);
    }
    size_t n = 0;
    for (const char *c = start; c < end && n + 1 < cap; c++)
        out[n++] = (char)(isalnum((unsigned char)*c) ? *c : '_');
    if (n > 0 && isdigit((unsigned char)out[0]) && n + 1 < cap) /* a Python name */
        memmove(out + 1, out, n++);
    if (n == 0 || isdigit((unsigned char)out[0]))
        out[0] = 'm', n = n ? n : 1;
    out[n < cap ? n : cap - 1] = '\0';
}

/* The ranks of each stage in words, from a rank -> stage table. */
static void print_layout(const int *rank_stage, int workers, int stages) {
    for (int s = 0; s < stages; s++) {
        printf("%sstage %d: ", s ? ", " : "", s);
        int n = 0;
        for (int r = 0; r < workers; r++) {
            if (rank_stage[r] != s || (r > 0 && rank_stage[r - 1] == s))
                continue;
            int e = r;
            while (e + 1 < workers && rank_stage[e + 1] == s)
                e++;
            printf(e == r ? "%s%d" : "%s%d\u2013%d", n++ ? " and " : "ranks ", r, e);
        }
    }
}

/* A path as one word of a shell command: single-quoted unless it is plain. */
static const char *shell_word(const char *path, char *buf, size_t cap) {
    if (strspn(path, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._=+-") ==
        strlen(path))
        return path;
    size_t n = 0;
    buf[n++] = '\'';
    for (const char *c = path; *c && n + 5 < cap; c++) {
        if (*c == '\'') { /* close, an escaped quote, reopen */
            memcpy(buf + n, "'\\''", 4);
            n += 4;
        } else {
            buf[n++] = *c;
        }
    }
    buf[n++] = '\'';
    buf[n] = '\0';
    return buf;
}

/* PipeDream's own commands for the plan: its code generator, with the stage
** map in the form it parses, and its runtime on every rank. The names -n and
** -a come from `name`: --arch's, or the profile's path (its directory for a
** .../graph.txt, as PipeDream's profiles are laid out, else its file name). */
void plan_print_pipedream(const rp_plan *p, const char *name, const char *graph_out,
                            const char *conf, long long batch) {
    char arch[64], map[4096], gq[2 * PATH_MAX], cq[2 * PATH_MAX];
    arch_name(name, arch, sizeof arch);
    if (graph_out)
        graph_out = shell_word(graph_out, gq, sizeof gq);
    if (conf)
        conf = shell_word(conf, cq, sizeof cq);
    if (rp_plan_pipedream_stage_map(p, map, sizeof map) >= sizeof map)
        snprintf(map, sizeof map, "MAP");
    int W = p->num_workers;
    printf("\nPipeDream (msr-fiddle/pipedream) for this plan\n");
    printf("  in optimizer/:\n    python convert_graph_to_model.py -f %s -n %c%sPartitioned -a %s "
           "-o ../runtime/image_classification/models/%s/gpus=%d --stage_to_num_ranks_map %s\n",
           graph_out ? graph_out : "GRAPH", toupper((unsigned char)arch[0]), arch + 1, arch,
           arch, W, map);
    printf("  in runtime/image_classification/, for every rank R of 0-%d (L: R's index on its "
           "server):\n    python main_with_runtime.py --module models.%s.gpus=%d -b ", W - 1,
           arch, W);
    if (batch > 0)
        printf("%lld", batch);
    else
        printf("B");
    printf(" --data_dir DATA --rank R --local_rank L --master_addr MASTER --config_path %s "
           "--distributed_backend gloo\n", conf ? conf : "CONF");
    if (!graph_out)
        printf("  GRAPH: the profile with each node's stage_id, as --graph-out FILE writes it\n");
    if (batch <= 0)
        printf("  B: the micro-batch the profile was measured on (--profile-batch)\n");
    /* the layout convert_graph_to_model.py writes, against the plan's */
    int *contiguous = malloc(sizeof(int) * (size_t)(W > 0 ? W : 1));
    if (!contiguous)
        return;
    bool same = true;
    for (int s = 0, r = 0; s < p->num_stages; s++)
        for (int k = 0; k < p->stage_num_ranks[s]; k++, r++) {
            contiguous[r] = s;
            same &= p->worker_stage[r] == s;
        }
    if (same) {
        printf("  %s: models/%s/gpus=%d/hybrid_conf.json as convert_graph_to_model.py writes "
               "it, whose ranks are this plan's%s\n", conf ? "--config_path" : "CONF", arch, W,
               conf ? " (--pipedream-conf wrote the same)" : "");
    } else {
        printf("  %s: the hybrid_conf.json of --pipedream-conf FILE, not convert_graph_to_model"
               ".py's: that one numbers each stage's ranks after the stage before it (",
               conf ? "--config_path" : "CONF");
        print_layout(contiguous, W, p->num_stages);
        printf("), so that a replica's stages straddle the outer machines; this plan keeps "
               "each copy of an outer stage on consecutive ranks (");
        print_layout(p->worker_stage, W, p->num_stages);
        printf(")\n");
    }
    free(contiguous);
}

void plan_print(const rp_plan *p, const char *profile_path, const rp_profile *prof) {
    const rp_plan_options *o = &p->options;
    if (p->compressed_nodes)
        printf("profile   %s (%d nodes; with PipeDream's branch compression %d nodes, %d "
               "states)\n", profile_path, prof->num_nodes, p->compressed_nodes, p->num_states);
    else
        printf("profile   %s (%d nodes, %d states)\n", profile_path, prof->num_nodes,
               p->num_states);
    cli_print_machines(stdout, o->machines, o->bandwidth, o->num_levels);
    for (int l = 0; l < p->num_levels; l++) {
        const rp_plan_level *lv = &p->levels[l];
        printf("\nlevel %d: %d machine%s%s, %.3g GB/s\n", lv->level, lv->machines,
               lv->machines == 1 ? "" : "s", l ? " inside each of the level above" : "",
               lv->bandwidth / 1e9);
        printf("  %-6s %-12s %-14s %-12s %s\n", "stage", "states", "compute (s)",
               "replication", l ? "within" : "");
        for (int s = 0; s < lv->num_stages; s++) {
            const rp_plan_stage *ps = &lv->stages[s];
            char states[32];
            snprintf(states, sizeof states, "%d-%d", ps->start, ps->end);
            printf("  %-6d %-12s %-14.6f %-12d", s, states, ps->compute_time, ps->replication);
            if (ps->parent >= 0)
                printf(" stage %d above", ps->parent);
            printf("\n");
        }
    }
    printf("\nworkers (%d, replica-major: each copy of an outer stage on consecutive ranks)\n",
           p->num_workers);
    /* each final stage's layers, named by the profile's descriptions */
    double *fw = NULL, *bw = NULL, *ob = NULL, *pb = NULL;
    int *node = NULL, L = 0;
    rp_error err;
    bool named = rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err) == RP_OK;
    for (int s = 0; s < p->num_stages; s++) {
        print_ranks(p, s);
        int first = -1, last = -1, n = 0;
        for (int k = 0; named && k < L; k++)
            if (p->node_stage[node[k]] == s) {
                first = first < 0 ? node[k] : first;
                last = node[k];
                n++;
            }
        if (first >= 0 && n == 1)
            printf("    1 layer: %.*s\n", plan_node_name_len(prof->nodes[first].desc),
                   prof->nodes[first].desc);
        else if (first >= 0)
            printf("    %d layers: %.*s ... %.*s\n", n,
                   plan_node_name_len(prof->nodes[first].desc), prof->nodes[first].desc,
                   plan_node_name_len(prof->nodes[last].desc), prof->nodes[last].desc);
    }
    free(fw), free(bw), free(ob), free(pb), free(node);
    if (p->machines_used < p->machines_available)
        printf("  %d machine%s left unused\n", p->machines_available - p->machines_used,
               p->machines_available - p->machines_used == 1 ? "" : "s");
    char dp[48];
    snprintf(dp, sizeof dp, "data parallel (%d)", p->machines_available);
    printf("\npredicted time per step\n");
    printf("  %-22s %.6f s\n", "one machine", p->single_stage_time);
    if (!(p->single_stage_time > 0)) { /* a ratio of zero times says nothing */
        printf("  %-22s %.6f s\n", dp, p->data_parallel_time);
        printf("  %-22s %.6f s  (the profile's times are all zero: no speed-up to give)\n",
               "this plan", p->pipeline_time);
        return;
    }
    printf("  %-22s %.6f s  %.2fx one machine\n", dp, p->data_parallel_time,
           p->dp_speedup_vs_single);
    printf("  %-22s %.6f s  %.2fx one machine, %.2fx data parallel\n", "this plan",
           p->pipeline_time, p->speedup_vs_single, p->speedup_vs_dp);
}

int plan_node_name_len(const char *desc) {
    /* the name ends where the tags repipe profile adds begin, " key=value"
    ** outside parentheses (PipeDream's "Conv2d(3, 64, kernel_size=(3, 3))"
    ** keeps its own) */
    int depth = 0;
    for (const char *at = desc; *at; at++) {
        depth += (*at == '(') - (*at == ')');
        if (*at != ' ' || depth > 0)
            continue;
        const char *k = at + 1;
        while (*k == '_' || (*k >= 'a' && *k <= 'z'))
            k++;
        if (k > at + 1 && *k == '=')
            return (int)(at - desc);
    }
    return (int)strlen(desc);
}
