/*
** Command-line plumbing shared by the subcommands. Each subcommand declares
** one option table; the parser (getopt_long) and the --help text are both
** generated from it, so they cannot drift apart.
*/
#ifndef REPIPE_CLI_H
#define REPIPE_CLI_H

#include <stdbool.h>
#include <getopt.h> /* optind */
#include <stdio.h>

#include "repipe/comm.h"
#include "repipe/core.h"
#include "repipe/data.h"
#include "repipe/layers.h"
#include "repipe/net.h"
#include "repipe/session.h"
#include "repipe/weights.h"

typedef struct cli_opt {
    const char *name;    /* long name, without the dashes */
    int short_name;      /* 0 if none */
    const char *metavar; /* NULL for a flag without argument */
    const char *help;
} cli_opt;

typedef struct cli_cmd {
    const char *name;
    const char *summary; /* one line for `repipe --help` */
    const char *usage;   /* arguments after the command name */
    const char *details; /* paragraph after the options, or NULL */
    const cli_opt *opts; /* terminated by an entry with name == NULL */
    int (*run)(const struct cli_cmd *cmd, int argc, char **argv);
} cli_cmd;

/* Prints `repipe NAME USAGE`, the summary, the option table and details. */
void cli_help(FILE *f, const cli_cmd *cmd);

/* getopt_long over the command's table; returns the index of the option in
** the table, -1 at the end of options, or -2 after printing an error (or
** help, with *help_shown set). Non-option arguments are left at optind. */
int cli_next(const cli_cmd *cmd, int argc, char **argv, const char **arg, bool *help_shown);

/* cli_next for commands without positional arguments: one is an error
** (-2, after printing it). */
int cli_next_option(const cli_cmd *cmd, int argc, char **argv, const char **arg,
                    bool *help_shown);

/* cli_next for commands with positional arguments: they are kept in
** pos[*npos] as they come, at most max (one more is an error, -2). */
int cli_next_arg(const cli_cmd *cmd, int argc, char **argv, const char **arg, bool *help_shown,
                 const char **pos, int *npos, int max);

/* Parses a whole number or a real number; prints an error naming the option
** and returns false when the text is not one. */
bool cli_int(const char *opt, const char *text, long long lo, long long hi, long long *out);
bool cli_double(const char *opt, const char *text, double *out);

/* Parses --backend: "local" or "mpi" (sets *mpi); prints an error and
** returns false otherwise. */
bool cli_backend(const cli_cmd *cmd, const char *text, bool *mpi);

/* With --backend mpi: MPI_Init and the world communicator in *comm (NULL
** otherwise); *lead says whether this process prints, rank 0 under MPI.
** Returns false, the error printed, when MPI cannot start. */
bool cli_mpi_start(const cli_cmd *cmd, bool use_mpi, int *argc, char ***argv, rp_comm **comm,
                   bool *lead);
/* After an error that was printed: ends every rank, since the others may be
** waiting for this one. Nothing without MPI. */
void cli_mpi_abort(rp_comm *comm, const char *msg);

/* What a command that runs a session holds from its start to its end. */
typedef struct cli_job {
    rp_model *m;
    rp_dataset *train, *test;
    rp_session *s;
    rp_comm *comm; /* NULL: threads (cli_mpi_start) */
    bool lead;     /* this process prints: rank 0 under MPI */
} cli_job;
/* Says err's message and, under MPI, ends the other ranks. */
void cli_job_fail(const cli_cmd *cmd, cli_job *j, const rp_error *err);
/* Frees what j holds, ends MPI where it was started; returns rc. */
int cli_job_end(cli_job *j, int rc);

/* Digests for rp_comm_agree (CRC-32, rp_crc32 of src/core/util.h): a
** configuration as it will run, a dataset (its shape and every value) and
** weights. */
uint32_t cli_config_digest(const rp_config *cfg);
uint32_t cli_dataset_digest(const rp_dataset *d);
uint32_t cli_weights_digest(const rp_weights *w);

/* Consumes the numbers that follow a multi-valued option (`--machines 8 2`):
** first is optarg; more are taken from argv while they parse as numbers. */
int cli_double_list(const char *opt, const char *first, int argc, char **argv, double *out,
                    int max);

/* --machines N1 [N2 ...], innermost level first: whole numbers from 1 to
** 4096 into out; returns how many, or -1 after printing an error. */
int cli_machines(const cli_cmd *cmd, const char *first, int argc, char **argv, int *out,
                 int max);
/* An option's values per machine (--speed, --memory-size: v, n of them)
** as one a device of the machines (levels innermost first): n of the
** outermost level's machines (one a server), or one a machine. Sets *out
** (the caller frees it); false, having said why, where n fits neither or a
** value is not positive. */
bool cli_per_machine(const cli_cmd *cmd, const char *opt, const double *v, int n,
                     const int *machines, int levels, double **out);
/* --bandwidth gives one value per level of --machines, or none. */
bool cli_levels_match(const cli_cmd *cmd, int machines, int bandwidths);
/* Tensor parallelism in the simulator and the planner: what tensor_parallel
** t (0: any) does to each of the L layers of the model in `path`
** (RP_SIM_TP_* flags, *flags malloc'd) under rp_model_tensor_split's
** `split` flags, and with t 0 the degrees 2, 4, 8 its heads and widths
** allow (bit d of *degrees). false, with the message on stderr, when the
** model cannot be read, has another number of layers than the profile, or
** cannot be split t ways. */
bool cli_tensor_split(const cli_cmd *cmd, const char *path, int L, int t, unsigned split,
                      unsigned char **flags, unsigned *degrees);
/* A weight file, the weights of a checkpoint (repipe/checkpoint.h), or a
** safetensors file (a name ending in .safetensors; its tensors as named). */
rp_status cli_load_weights(const char *path, rp_weights **out, rp_error *err);
/* The same for model m: a state_dict of a LLaMA-family model under Meta's or
** Hugging Face's names (docs/training.md) comes back under m's own. */
rp_status cli_load_model_weights(const char *path, const rp_model *m, rp_weights **out,
                                 rp_error *err);

/* One line: the hierarchy innermost first, as --machines takes it. */
void cli_print_machines(FILE *f, const int *machines, const double *bandwidth, int levels);

/* Prints "repipe NAME: message" to stderr; false, so that a check that
** fails can return it. */
bool cli_error(const cli_cmd *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

extern const cli_cmd cmd_groups;
extern const cli_cmd cmd_config;
extern const cli_cmd cmd_plan;
extern const cli_cmd cmd_train;
extern const cli_cmd cmd_eval;
extern const cli_cmd cmd_profile;
extern const cli_cmd cmd_generate;
extern const cli_cmd cmd_simulate;
extern const cli_cmd cmd_weights;
extern const cli_cmd cmd_checkpoint;

#endif /* REPIPE_CLI_H */
