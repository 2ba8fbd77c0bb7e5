/*
** Fuzz target: llm.c token files and the samples cut from them. Any input
** must either load or fail with a message; what loads makes samples whose
** labels are the tokens after them.
*/
#include <stdint.h>
#include <stdlib.h>

#include "repipe/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int llmc = 0; llmc < 2; llmc++) {
        int32_t *tok;
        size_t n;
        int vocab;
        rp_error err;
        if (rp_tokens_parse(data, size, llmc, "fuzz", &tok, &n, &vocab, &err) != RP_OK) {
            if (err.msg[0] == '\0')
                abort(); /* every failure must say why */
            continue;
        }
        rp_dataset *d;
        if (rp_dataset_from_tokens(tok, n, 4, vocab, "fuzz", &d, &err) == RP_OK) {
            for (int i = 0; i < d->n * 4; i++)
                if (d->labels[i] != tok[i + 1] || d->labels[i] >= vocab)
                    abort();
            rp_dataset_free(d);
        } else if (err.msg[0] == '\0') {
            abort();
        }
        free(tok);
    }
    return 0;
}
