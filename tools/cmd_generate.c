/*
** repipe generate: samples text from a trained token model.
*/
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"model", 'm', "FILE", "a token model spec (required)"},
    {"load", 'l', "FILE", "its weights: a weight file or a checkpoint (required)"},
    {"prompt", 'p', "TEXT", "the text to continue [a newline]"},
    {"tokens", 'n', "N", "how many tokens to add [256]"},
    {"temperature", 't', "T", "divides the scores; 0 takes the most likely token [1]"},
    {"top-k", 'k', "K", "draw among the K most likely tokens only; 0: all [40]"},
    {"seed", 's', "S", "the draws' seed; a seed gives the same text [1]"},
    {NULL, 0, NULL, NULL},
};

/* The model's text after the prompt: n tokens (bytes) drawn at the
** temperature from the top_k most likely, printed with the prompt. */
static int sample(const cli_cmd *cmd, const char *model_path, const char *load,
                  const char *prompt, long long n, double temperature, int top_k,
                  uint64_t seed) {
    rp_error err;
    rp_model *m = NULL;
    rp_weights *w = NULL;
    float *params = NULL;
    int32_t *tokens = NULL;
    int len = (int)strlen(prompt), rc = 1;
    if (rp_model_load(&m, model_path, &err) || rp_model_check_tokens(m, "generate", &err) ||
        cli_load_model_weights(load, m, &w, &err))
        goto fail;
    if (m->num_classes > 256) {
        rp_fail(&err, RP_ERR_INVALID,
                "%s: a vocabulary of %d tokens; generate writes bytes (a vocabulary of 256)",
                model_path, m->num_classes);
        goto fail;
    }
    params = malloc(sizeof(float) * (m->num_params ? m->num_params : 1));
    tokens = malloc(sizeof(int32_t) * ((size_t)len + (size_t)n));
    if (!params || !tokens) {
        rp_fail(&err, RP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < len; i++)
        tokens[i] = (unsigned char)prompt[i];
    if (rp_weights_to_params(m, w, 0, params, &err) ||
        rp_model_generate(m, params, tokens, len, (int)n, temperature, top_k, seed, &err))
        goto fail;
    for (long long i = 0; i < len + n; i++)
        putchar(tokens[i]);
    if (len + n > 0 && tokens[len + n - 1] != '\n')
        putchar('\n');
    rc = 0;
fail:
    if (rc)
        cli_error(cmd, "%s", err.msg);
    free(params), free(tokens);
    rp_weights_free(w);
    rp_model_free(m);
    return rc;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *model_path = NULL, *load = NULL, *prompt = "\n";
    long long n = 256, top_k = 40, seed = 1;
    double temperature = 1;
    bool help;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if ((o == 3 && !cli_int("tokens", arg, 0, 1 << 24, &n)) ||
            (o == 4 && !cli_double("temperature", arg, &temperature)) ||
            (o == 5 && !cli_int("top-k", arg, 0, 1 << 30, &top_k)) ||
            (o == 6 && !cli_int("seed", arg, 0, 1LL << 62, &seed)))
            return 2;
        if (o == 0)
            model_path = arg;
        if (o == 1)
            load = arg;
        if (o == 2)
            prompt = arg;
    }
    if (!model_path || !load) {
        cli_error(cmd, "--model and --load are required (see 'repipe generate --help')");
        return 2;
    }
    if (!(temperature >= 0)) {
        cli_error(cmd, "--temperature: '%g' is not a number >= 0", temperature);
        return 2;
    }
    if (!*prompt) {
        cli_error(cmd, "--prompt: give at least one character");
        return 2;
    }
    return sample(cmd, model_path, load, prompt, n, temperature, (int)top_k, (uint64_t)seed);
}

const cli_cmd cmd_generate = {
    "generate",
    "sample text from a trained token model",
    "--model FILE --load W [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]",
    "Prints the prompt and its continuation. Each new token is drawn from the\n"
    "model's distribution for the position after the last T tokens; the model's\n"
    "tokens are bytes (train it with 'repipe train --text').",
    OPTS,
    run,
};
