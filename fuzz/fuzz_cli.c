/*
** Fuzz target: the command line. The input is an argument vector, its
** arguments separated by NUL bytes, the first naming one of the commands
** that run no model (plan, config, groups, weights, checkpoint). The command must do
** what it says or fail with a message, and return 0, 1 or 2; it must not
** exit, crash or leak.
**
** (libFuzzer writes what it finds into the directory the process is in:
** give -artifact_prefix, as the command may be running in the scratch
** directory then.)
**
** It runs in a scratch directory that holds, afresh for every input, a
** profile `p`, a configuration `c` and an empty file `e`; arguments with a
** '/' are dropped, so nothing outside the directory is read or written,
** and what a command wrote there is removed after it.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tools/cli.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPORTS_TO_SAVED_STDERR 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define REPORTS_TO_SAVED_STDERR 1
#endif
#ifdef REPORTS_TO_SAVED_STDERR
void __sanitizer_set_report_fd(void *fd);
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const cli_cmd *const COMMANDS[] = {&cmd_plan, &cmd_config, &cmd_groups, &cmd_weights,
                                          &cmd_checkpoint};

static const char PROFILE[] =
    "node0 -- Input0 micro_batch=16 -- forward_compute_time=0, backward_compute_time=0, "
    "activation_size=4096, parameter_size=0\n"
    "node1 -- Linear(in_features=64) -- forward_compute_time=1.5, backward_compute_time=3, "
    "activation_size=2048, parameter_size=16640\n"
    "node2 -- ReLU() -- forward_compute_time=0.1, backward_compute_time=0.2, "
    "activation_size=2048, parameter_size=0\n"
    "node3 -- Linear(in_features=32) -- forward_compute_time=0.8, backward_compute_time=1.6, "
    "activation_size=640, parameter_size=1320\n"
    "\tnode0 -- node1\n\tnode1 -- node2\n\tnode2 -- node3\n";

static const char CONFIG[] = "{\"micro_batch_size\": 4, \"gradient_accumulation_steps\": 2, "
                             "\"layers_per_stage\": [2, -1]}\n";

static char scratch[64];
static int home = -1;

static void put(const char *name, const char *text) {
    FILE *f = fopen(name, "w");
    if (!f)
        abort();
    fputs(text, f);
    fclose(f);
}

/* Empties the scratch directory (the current one). */
static void clean(void) {
    DIR *d = opendir(".");
    if (!d)
        abort();
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlink(e->d_name);
    closedir(d);
}

static void remove_scratch(void) {
    if (chdir(scratch) == 0) {
        clean();
        if (fchdir(home) == 0)
            rmdir(scratch);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (home < 0) {
        strcpy(scratch, "/tmp/repipe-fuzz-cli-XXXXXX");
        if (!mkdtemp(scratch) || (home = open(".", O_RDONLY | O_DIRECTORY)) < 0)
            abort();
        atexit(remove_scratch);
#ifdef REPORTS_TO_SAVED_STDERR
        /* the commands' stderr is discarded, the sanitizers' reports are not */
        __sanitizer_set_report_fd((void *)(intptr_t)dup(2));
#endif
    }
    if (size == 0 || size > 4096)
        return 0;
    /* the arguments: NUL-separated, at most 32, none with a '/' */
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    char *argv[34];
    int argc = 0;
    for (size_t at = 0; at <= size && argc < 33;) {
        char *a = text + at;
        size_t n = strlen(a);
        if (!strchr(a, '/'))
            argv[argc++] = a;
        at += n + 1;
    }
    argv[argc] = NULL;
    const cli_cmd *cmd = NULL;
    for (size_t i = 0; argc > 0 && i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (strcmp(argv[0], COMMANDS[i]->name) == 0)
            cmd = COMMANDS[i];
    if (!cmd) {
        free(text);
        return 0;
    }
    /* run it in the scratch directory, its output discarded */
    fflush(stdout), fflush(stderr);
    int out = dup(1), errfd = dup(2), null = open("/dev/null", O_WRONLY);
    if (out < 0 || errfd < 0 || null < 0 || chdir(scratch) != 0)
        abort();
    dup2(null, 1), dup2(null, 2);
    close(null);
    put("p", PROFILE);
    put("c", CONFIG);
    put("e", "");
    optind = 0; /* getopt starts afresh */
    int rc = cmd->run(cmd, argc, argv);
    fflush(stdout), fflush(stderr);
    clean();
    if (fchdir(home) != 0)
        abort();
    dup2(out, 1), dup2(errfd, 2);
    close(out), close(errfd);
    free(text);
    if (rc < 0 || rc > 2)
        abort();
    return 0;
}
