/*
** Internal helpers shared by the library's modules (not part of the API).
*/
#ifndef REPIPE_UTIL_H
#define REPIPE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "repipe/core.h"

/* Reads a whole file a user named into a NUL-terminated heap buffer (*out,
** *len): a regular file, or a pipe or FIFO (a shell's `<(...)`), to the
** memory available; a device, a directory or a socket is refused. */
rp_status rp_read_file(const char *path, char **out, size_t *len, rp_error *err);
/* The same for a file found in a directory (a checkpoint, a cache entry):
** only a regular file is read, so that nothing found can block or never
** end. */
rp_status rp_read_regular_file(const char *path, char **out, size_t *len, rp_error *err);
/* What a file's text is handed to: parses text (len bytes, NUL after them)
** read from path into out. */
typedef rp_status (*rp_text_parser)(const char *text, size_t len, const char *path, void *out,
                                    rp_error *err);
/* The one way a file is loaded: read as rp_read_file reads it (or as
** rp_read_regular_file, where `regular_only`), handed to parse, freed. */
rp_status rp_parse_file(const char *path, bool regular_only, rp_text_parser parse, void *out,
                        rp_error *err);
/* Fails, naming what path is, unless it is a regular file. */
rp_status rp_check_regular(const char *path, rp_error *err);

/* Writes len bytes to path through a temporary file that is fsynced and
** renamed over path, so a reader never sees a half-written file. */
rp_status rp_write_file_atomic(const char *path, const char *data, size_t len, rp_error *err);
/* Writes n files, each as rp_write_file_atomic does, and all or none: every
** temporary file is written and synced before the first is renamed, so a
** failure on any leaves every path as it was. */
rp_status rp_write_files_atomic(int n, const char *const *paths, const char *const *texts,
                                rp_error *err);
/* Closes f, an open_memstream of *text and *len built for path, and writes
** what it holds with rp_write_file_atomic; frees *text either way. `what`
** names the contents in an out-of-memory error ("the trace"). */
rp_status rp_write_memstream_atomic(FILE *f, char **text, size_t *len, const char *path,
                                    const char *what, rp_error *err);

/* Line and column (1-based) of byte offset `at` in text. */
void rp_text_position(const char *text, size_t at, int *line, int *col);

/* The candidate closest to `word` by edit distance, or NULL when none is
** close enough to be a plausible typo. */
const char *rp_closest_word(const char *word, const char *const *candidates, int n);

/* The names in directory `dir` that end with `suffix`, sorted, at most max
** (each malloc'd; the caller frees them). Returns their number, or -1 when
** the directory cannot be read. */
int rp_list_dir(const char *dir, const char *suffix, char **names, int max);

/* CRC-32 (zlib's) of n bytes, continuing crc (0 to start), over any
** length: zlib's crc32 takes 32-bit lengths, so 4 GiB and more went
** unchecked past len mod 2^32. */
uint32_t rp_crc32(uint32_t crc, const void *p, size_t n);

/* strtod, with its result to the bit, where a plain decimal (digits, a
** point, at most 15 significant digits and 22 after the point) takes a
** shortcut: its digits are exactly a double, and so is the power of ten, so
** one correctly rounded division is strtod's answer (Clinger's fast path).
** A profile is a few hundred such numbers; glibc's strtod spends about 500
** instructions on each, a tenth of a small plan's own work. */
double rp_strtod(const char *s, char **end);

/* Seconds on the monotonic clock. */
double rp_now(void);

/* Bytes this process can still allocate without swapping: the kernel's
** MemAvailable, or less where a cgroup's memory.max is nearer; physical
** memory when neither can be read. */
double rp_memory_available(void);

/* A waiter with a core to itself spins this many pauses (tens of
** microseconds) before sleeping: a hand-over that comes within that time
** then costs no wake-up, and an oversubscribed one soon yields the core. */
#define RP_SPIN_LIMIT 4000

static inline void rp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* qsort comparison of doubles, ascending. */
int rp_cmp_double(const void *a, const void *b);

/* The library computes on the caller's thread with flush-to-zero on (as its
** worker threads always do) and gives the caller its own mode back:
** saved = rpi_fpu_enter(); ...; rpi_fpu_leave(saved). */
unsigned rpi_fpu_enter(void);
void rpi_fpu_leave(unsigned saved);

#endif /* REPIPE_UTIL_H */
