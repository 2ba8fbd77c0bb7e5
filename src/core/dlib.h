/*
** Libraries opened on first use rather than linked (OpenBLAS: blas.h;
** cJSON: json.h): every library a program links is loaded at each start,
** and these two were most of what a small command paid for.
*/
#ifndef REPIPE_DLIB_H
#define REPIPE_DLIB_H

#include <stdbool.h>
#include <stddef.h>

/* Opens the first of names[1..n) that loads and whose functions bind()
** finds (bind takes them from the handle and says whether all were there),
** RTLD_LOCAL, so that its names stay out of the process's global scope.
** names[0] is the file the user named (an environment variable's value, or
** NULL); when set, it is the only one tried. NULL when none would do, with
** why holding the loader's first message, or "NAME " lacks where a library
** loaded without what bind() needs. */
void *rpi_library_open(const char *const *names, size_t n, bool (*bind)(void *handle),
                       const char *lacks, char *why, size_t cap);

#endif /* REPIPE_DLIB_H */
