/*
** repipe: the command-line tool. Dispatches to one subcommand per file.
*/
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_cmd *const COMMANDS[] = {&cmd_train, &cmd_eval, &cmd_generate, &cmd_profile, &cmd_plan, &cmd_simulate, &cmd_config, &cmd_groups, &cmd_weights, &cmd_checkpoint};
#define NUM_COMMANDS ((int)(sizeof COMMANDS / sizeof COMMANDS[0]))

static void usage(FILE *f) {
    fprintf(f,
            "usage: repipe COMMAND [OPTIONS]\n\n"
            "repipe plans, configures and runs replicated, pipelined neural-network\n"
            "training on many workers.\n\ncommands:\n");
    for (int i = 0; i < NUM_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", COMMANDS[i]->name, COMMANDS[i]->summary);
    fprintf(f, "\n'repipe COMMAND --help' describes a command's options.\n"
               "'repipe --version' prints the version.\n");
}

int main(int argc, char **argv) {
    /* Workers run their products on one BLAS thread each, so OpenBLAS's own
    ** pool of threads is never used; after a failed allocation its threads
    ** retry and hang the exit. The library opens OpenBLAS on first use, which
    ** reads this then: unless the user chose a count, it starts no pool. */
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("repipe %s\n", rp_version());
        return 0;
    }
    bool help = strcmp(name, "help") == 0;
    if (help) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        name = argv[2];
    }
    for (int i = 0; i < NUM_COMMANDS; i++) {
        if (strcmp(COMMANDS[i]->name, name) == 0) {
            if (help) {
                cli_help(stdout, COMMANDS[i]);
                return 0;
            }
            optind = 1;
            return COMMANDS[i]->run(COMMANDS[i], argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "repipe: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
