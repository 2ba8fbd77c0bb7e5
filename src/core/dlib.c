/*
** Libraries opened on first use (dlib.h says why).
*/
#include "dlib.h"

#include <dlfcn.h>
#include <stdio.h>

void *rpi_library_open(const char *const *names, size_t n, bool (*bind)(void *handle),
                       const char *lacks, char *why, size_t cap) {
    bool named = names[0] && names[0][0];
    for (size_t i = named ? 0 : 1; i < (named ? 1 : n); i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            if (!why[0]) {
                const char *e = dlerror();
                snprintf(why, cap, "%s", e ? e : names[i]);
            }
            continue;
        }
        if (bind(h))
            return h;
        snprintf(why, cap, "%s %s", names[i], lacks);
        dlclose(h);
    }
    return NULL;
}
