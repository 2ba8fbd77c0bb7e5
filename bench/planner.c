/*
** bench/planner: repipe's planner beside PipeDream's optimizer.
**
** For every fixture in FIXTURE_DIR/expected it reads the profile and plans
** it in-process (best of several runs) and prints that time beside the
** fixture's reference_seconds, PipeDream's own run on this machine, and the
** ratio; given the repipe binary, also the whole `repipe plan` process
** beside a process that does nothing (/bin/true), the floor of any
** command, and `repipe --version`, the floor of this one. Then it times synthetic profiles (a long chain, residual blocks)
** for several sizes, to show how the cost grows with states and machines.
** Usage: bench_planner [FIXTURE_DIR [REPIPE]]
*/
#define _POSIX_C_SOURCE 200809L
#include <cJSON.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "repipe/planner.h"

/* Best wall time of `reps` runs of read (or parse) + plan. */
static double time_plan(const char *path, const char *text, const rp_plan_options *o, int reps,
                        int *states) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        rp_error err;
        rp_profile *p;
        rp_plan *plan;
        double t0 = rp_now();
        rp_status s = path ? rp_profile_read(&p, path, &err)
                           : rp_profile_parse(&p, text, strlen(text), "synthetic", &err);
        if (s == RP_OK) {
            s = rp_plan_compute(p, o, &plan, &err);
            rp_profile_free(p);
        }
        double dt = rp_now() - t0;
        if (s) {
            fprintf(stderr, "bench_planner: %s\n", err.msg);
            return -1;
        }
        *states = plan->num_states;
        rp_plan_free(plan);
        if (dt < best)
            best = dt;
        if (dt > 0.5)
            break; /* slow enough to time once */
    }
    return best;
}

extern char **environ;

/* Best wall time of 15 runs of a command, its output discarded; -1 when it
** fails. */
static double time_process(char **argv) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    double best = 1e30;
    for (int r = 0; r < 15; r++) {
        pid_t pid;
        int status;
        double t0 = rp_now();
        if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) != 0 ||
            waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            best = -1;
            break;
        }
        double dt = rp_now() - t0;
        if (dt < best)
            best = dt;
    }
    posix_spawn_file_actions_destroy(&fa);
    return best;
}

/* `repipe plan` with the fixture's options, timed as a process. */
static double time_command(const char *repipe, const char *profile, const rp_plan_options *o) {
    char args[32][64], *argv[40];
    int n = 0;
    argv[n++] = (char *)repipe;
    argv[n++] = "plan";
    argv[n++] = "--profile";
    argv[n++] = (char *)profile;
    argv[n++] = "--machines";
    for (int l = 0; l < o->num_levels; l++) {
        snprintf(args[l], sizeof args[l], "%d", o->machines[l]);
        argv[n++] = args[l];
    }
    argv[n++] = "--bandwidth";
    for (int l = 0; l < o->num_levels; l++) {
        snprintf(args[8 + l], sizeof args[0], "%.17g", o->bandwidth[l]);
        argv[n++] = args[8 + l];
    }
    argv[n++] = "--memory-size";
    snprintf(args[16], sizeof args[0], "%.17g", o->memory_size);
    argv[n++] = args[16];
    if (o->memory_constraint)
        argv[n++] = "--memory-constraint";
    if (o->straight)
        argv[n++] = "--straight";
    if (o->fewer_machines)
        argv[n++] = "--fewer-machines";
    if (o->activation_compression > 0) {
        argv[n++] = "--activation-compression";
        snprintf(args[17], sizeof args[0], "%.17g", o->activation_compression);
        argv[n++] = args[17];
    }
    argv[n] = NULL;
    return time_process(argv);
}

/* One line: the plan in-process and as a whole process, against ref. */
static void bench_row(const char *label, const char *path, const rp_plan_options *o, double ref,
                      const char *repipe, double floor_s) {
    int states = 0;
    double t = time_plan(path, NULL, o, 7, &states);
    if (t <= 0)
        return;
    printf("%-34s %7d %12.3f %14.3f %9.0fx", label, states, t * 1e3, ref, ref / t);
    double tp = repipe ? time_command(repipe, path, o) : 0;
    if (tp > 0)
        printf(" %14.3f %9.0fx %9.0fx", tp * 1e3, ref / tp, ref / floor_s);
    else if (repipe)
        printf(" %14s", "failed");
    printf("\n");
}

static void fixtures(const char *dir, const char *repipe) {
    char exp[2048];
    snprintf(exp, sizeof exp, "%s/expected", dir);
    char *names[256];
    int n = rp_list_dir(exp, ".json", names, 256);
    if (n < 0) {
        printf("no fixtures at %s: skipping the comparison with PipeDream\n\n", exp);
        return;
    }
    double floor_s = 0;
    if (repipe) {
        char *argv[] = {"/bin/true", NULL}, *version[] = {(char *)repipe, "--version", NULL};
        floor_s = time_process(argv);
        double start = time_process(version);
        printf("a process that does nothing (/bin/true) takes %.3f ms here, best of 15: no "
               "command can be more than %.0fx faster than a PipeDream run of 1 s; "
               "'repipe --version' (the loading of the program and its libraries) takes "
               "%.3f ms\n", floor_s * 1e3, 1 / floor_s, start * 1e3);
        printf("bound: PipeDream's time over /bin/true's, the most any process could reach\n\n");
    }
    printf("%-34s %7s %12s %14s %10s", "fixture", "states", "repipe (ms)", "PipeDream (s)",
           "ratio");
    if (repipe)
        printf(" %14s %10s %10s", "process (ms)", "ratio", "bound");
    printf("\n");
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", exp, names[i]);
        char *text;
        size_t len;
        rp_error err;
        if (rp_read_file(path, &text, &len, &err))
            continue;
        cJSON *fx = cJSON_Parse(text);
        rp_plan_options o;
        rp_status st = rp_plan_options_from_json(&o, text, len, names[i], &err);
        free(text);
        if (!fx || st)
            continue;
        double ref = cJSON_GetObjectItem(fx, "reference_seconds")->valuedouble;
        /* PipeDream's input first (a profile it planned only compressed by
        ** hand), then, where that differs, the profile as measured */
        const cJSON *hand = cJSON_GetObjectItem(fx, "pipedream_profile");
        const char *profiles[2] = {hand ? hand->valuestring : NULL,
                                   cJSON_GetObjectItem(fx, "profile")->valuestring};
        for (int k = hand ? 0 : 1; k < 2; k++) {
            char label[64];
            snprintf(label, sizeof label, "%.*s%s", (int)strlen(names[i]) - 5, names[i],
                     !hand ? "" : k ? " (as measured)" : " (compressed)");
            snprintf(path, sizeof path, "%s/%s", dir, profiles[k]);
            bench_row(label, path, &o, ref, repipe, floor_s);
        }
        cJSON_Delete(fx);
        free(names[i]);
    }
    printf("\n");
}

/* A chain of n layers, or n residual blocks (conv, relu, conv, add with a
** skip), with varied costs. */
static char *synthetic(int n, bool residual) {
    size_t cap = (size_t)(n * 4 + 4) * 200;
    char *s = malloc(cap);
    size_t len = 0;
    int nodes = residual ? 4 * n + 1 : n;
    for (int i = 0; i < nodes; i++)
        len += snprintf(s + len, cap - len,
                        "n%d -- L%d -- forward_compute_time=%.3f, backward_compute_time=%.3f, "
                        "activation_size=%d.0, parameter_size=%d.0\n",
                        i, i, 0.5 + (i * 37 % 11) * 0.25, 1.0 + (i * 53 % 7) * 0.5,
                        1000000 * (1 + i % 5), 400000 * (i % 3));
    if (!residual) {
        for (int i = 1; i < nodes; i++)
            len += snprintf(s + len, cap - len, "\tn%d -- n%d\n", i - 1, i);
    } else {
        for (int b = 0; b < n; b++) {
            int x = 4 * b; /* block input; x+1 conv, x+2 relu, x+3 conv, x+4 add */
            len += snprintf(s + len, cap - len,
                            "\tn%d -- n%d\n\tn%d -- n%d\n\tn%d -- n%d\n\tn%d -- n%d\n\tn%d -- "
                            "n%d\n",
                            x, x + 1, x + 1, x + 2, x + 2, x + 3, x + 3, x + 4, x, x + 4);
        }
    }
    return s;
}

static void scaling(void) {
    static const struct {
        const char *name;
        int levels, m[2];
    } machines[] = {{"8", 1, {8, 0}}, {"16", 1, {16, 0}}, {"4x4", 2, {4, 4}}, {"8x2", 2, {8, 2}}};
    printf("synthetic profiles: planning time in ms (states in brackets)\n");
    printf("%-26s", "profile");
    for (int k = 0; k < 4; k++)
        printf(" %10s", machines[k].name);
    printf("\n");
    static const struct {
        int n;
        bool residual;
    } shapes[] = {{250, false}, {500, false}, {1000, false}, {2000, false},
                  {50, true},   {100, true},  {200, true}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        char *text = synthetic(shapes[s].n, shapes[s].residual);
        char label[64];
        int states = 0;
        snprintf(label, sizeof label, "%s %d", shapes[s].residual ? "residual blocks" : "chain",
                 shapes[s].n);
        printf("%-18s", label);
        bool first = true;
        for (int k = 0; k < 4; k++) {
            rp_plan_options o;
            rp_plan_options_default(&o);
            o.num_levels = machines[k].levels;
            o.machines[0] = machines[k].m[0];
            o.machines[1] = machines[k].m[1];
            double t = time_plan(NULL, text, &o, 3, &states);
            if (first) {
                printf("[%5d] ", states);
                first = false;
            }
            printf(" %10.1f", t * 1e3);
            fflush(stdout);
        }
        printf("\n");
        free(text);
    }
}

int main(int argc, char **argv) {
    fixtures(argc > 1 ? argv[1] : "tests/fixtures/pipedream", argc > 2 ? argv[2] : NULL);
    scaling();
    return 0;
}
