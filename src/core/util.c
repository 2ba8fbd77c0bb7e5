/*
** File and text helpers.
*/
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* What a path that is not a regular file is, for messages. */
static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

rp_status rp_check_regular(const char *path, rp_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return rp_fail(err, RP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return rp_fail(err, RP_ERR_IO, "%s: %s, not a file: only regular files are read", path,
                       file_kind(sb.st_mode));
    return RP_OK;
}

/* Reads what fd holds to its end, growing the buffer, to the memory this
** process has left: a pipe's. */
static rp_status read_stream(int fd, const char *path, char **out, size_t *len, rp_error *err) {
    size_t cap = 1 << 16, n = 0;
    double most = rp_memory_available();
    char *buf = malloc(cap);
    for (;;) {
        if (!buf)
            return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", path);
        if (n + 1 >= cap) {
            if ((double)cap * 2 > most) {
                free(buf);
                return rp_fail(err, RP_ERR_NOMEM, "%s: more than the %.3g GB of memory "
                                                  "available", path, most / 1e9);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb, cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            free(buf);
            return rp_fail(err, RP_ERR_IO, "%s: read error: %s", path, strerror(errno));
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    *out = buf, *len = n;
    return RP_OK;
}

/* A regular file of `size` bytes when opened, read as far as it reaches
** (a file cut while read gives what is there); refused before its buffer
** when larger than the memory this process has left. */
static rp_status read_regular(int fd, size_t size, const char *path, char **out, size_t *len,
                              rp_error *err) {
    /* Asking the kernel and the cgroup what is left opens and reads two more
    ** files, a cost in every small command's start; a file under 64 MiB that
    ** does not fit is told by malloc below. */
    if (size >= ((size_t)64 << 20) && (double)size > rp_memory_available())
        return rp_fail(err, RP_ERR_NOMEM, "%s: %.3g GB, more than the %.3g GB of memory "
                       "available", path, (double)size / 1e9, rp_memory_available() / 1e9);
    char *buf = malloc(size + 1);
    if (!buf)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for its %zu bytes", path, size);
    size_t n = 0;
    while (n < size) {
        ssize_t got = read(fd, buf + n, size - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            rp_status s = rp_fail(err, RP_ERR_IO, "%s: read error: %s", path, strerror(errno));
            free(buf);
            return s;
        }
        if (got == 0)
            break; /* cut while read: what is there */
        n += (size_t)got;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return RP_OK;
}

/* A regular file is read as far as it reached when opened, and refused
** before its buffer when larger than the memory this process has left. A
** pipe (a shell's `<(...)`) or a FIFO is read to its end where `streams`
** (a FIFO waits for its writer, as cat does); a device (a link to
** /dev/zero would never end), a directory or a socket never is. The file
** is opened without blocking, so that a FIFO is told apart before anything
** waits on it. */
static rp_status read_file(const char *path, bool streams, char **out, size_t *len,
                           rp_error *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return rp_fail(err, RP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rp_status s = rp_fail(err, RP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(sb.st_mode) && !(streams && S_ISFIFO(sb.st_mode))) {
        rp_status s = rp_fail(err, RP_ERR_IO, "%s: %s, not a file: only regular files%s are read",
                              path, file_kind(sb.st_mode), streams ? " and pipes" : "");
        close(fd);
        return s;
    }
    if (S_ISFIFO(sb.st_mode)) {
        close(fd); /* again, blocking: a FIFO's writer may not have opened it yet */
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return rp_fail(err, RP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        rp_status s = read_stream(fd, path, out, len, err);
        close(fd);
        return s;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    rp_status s = read_regular(fd, (size_t)sb.st_size, path, out, len, err);
    close(fd);
    return s;
}

rp_status rp_read_file(const char *path, char **out, size_t *len, rp_error *err) {
    return read_file(path, true, out, len, err);
}

rp_status rp_read_regular_file(const char *path, char **out, size_t *len, rp_error *err) {
    return read_file(path, false, out, len, err);
}

rp_status rp_parse_file(const char *path, bool regular_only, rp_text_parser parse, void *out,
                        rp_error *err) {
    char *text;
    size_t len;
    rp_status s = read_file(path, !regular_only, &text, &len, err);
    if (s)
        return s;
    s = parse(text, len, path, out, err);
    free(text);
    return s;
}

/* Writes data to a new temporary file beside path (its name into *tmp,
** which the caller frees), synced. */
static rp_status write_temporary(const char *path, const char *data, size_t len, char **tmp,
                                 rp_error *err) {
    size_t plen = strlen(path);
    *tmp = malloc(plen + 16);
    if (!*tmp)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", path);
    snprintf(*tmp, plen + 16, "%s.tmpXXXXXX", path);
    int fd = mkstemp(*tmp);
    if (fd < 0) {
        rp_status s = rp_fail(err, RP_ERR_IO, "%s: cannot create a temporary file beside it: %s",
                              path, strerror(errno));
        free(*tmp);
        *tmp = NULL;
        return s;
    }
    fchmod(fd, 0644); /* mkstemp creates 0600; the file is an ordinary output */
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        done += (size_t)w;
    }
    int e = done == len ? 0 : errno;
    if (!e && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    if (e) {
        rp_status s = rp_fail(err, RP_ERR_IO, "%s: write failed: %s", path, strerror(e));
        unlink(*tmp);
        free(*tmp);
        *tmp = NULL;
        return s;
    }
    return RP_OK;
}

rp_status rp_write_file_atomic(const char *path, const char *data, size_t len, rp_error *err) {
    char *tmp;
    rp_status st = write_temporary(path, data, len, &tmp, err);
    if (st)
        return st;
    if (rename(tmp, path) != 0) {
        st = rp_fail(err, RP_ERR_IO, "%s: cannot replace it: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

rp_status rp_write_files_atomic(int n, const char *const *paths, const char *const *texts,
                                rp_error *err) {
    char *tmp[16] = {0};
    if (n > 16)
        return rp_fail(err, RP_ERR_INVALID, "at most 16 files at once, not %d", n);
    rp_status st = RP_OK;
    for (int i = 0; i < n; i++) { /* what a rename would refuse, refused before any */
        struct stat sb;
        if (stat(paths[i], &sb) == 0 && S_ISDIR(sb.st_mode))
            return rp_fail(err, RP_ERR_IO, "%s: is a directory", paths[i]);
    }
    for (int k = 0; k < n && !st; k++)
        st = write_temporary(paths[k], texts[k], strlen(texts[k]), &tmp[k], err);
    for (int i = 0; i < n && !st; i++)
        if (rename(tmp[i], paths[i]) != 0) {
            st = rp_fail(err, RP_ERR_IO, "%s: cannot replace it: %s", paths[i], strerror(errno));
            break;
        } else {
            free(tmp[i]);
            tmp[i] = NULL;
        }
    for (int i = 0; i < n; i++)
        if (tmp[i])
            unlink(tmp[i]), free(tmp[i]);
    return st;
}

rp_status rp_write_memstream_atomic(FILE *f, char **text, size_t *len, const char *path,
                                    const char *what, rp_error *err) {
    rp_status st = fclose(f) != 0 || !*text
                       ? rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for %s", path, what)
                       : rp_write_file_atomic(path, *text, *len, err);
    free(*text);
    *text = NULL;
    return st;
}

void rp_text_position(const char *text, size_t at, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < at && text[i]; i++) {
        if (text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 1 << 20;
    int prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

const char *rp_closest_word(const char *word, const char *const *candidates, int n) {
    const char *best = NULL;
    int best_d = 1 << 20;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    /* A typo changes a few characters: allow up to a third of the word. */
    int limit = (int)strlen(word) / 3;
    if (limit < 2)
        limit = 2;
    return best_d <= limit ? best : NULL;
}

double rp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The number after `key` in a file of "key value" lines, or -1. */
static double read_figure(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    double v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) {
            char *end;
            v = strtod(line + n, &end);
            if (end == line + n)
                v = -1;
            break;
        }
    fclose(f);
    return v;
}

double rp_strtod(const char *s, char **end) {
    static const double pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                     1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const char *p = s;
    uint64_t mant = 0;
    int digits = 0, frac = -1; /* frac: digits after the point; -1 before it */
    for (;; p++) {
        if (*p >= '0' && *p <= '9') {
            if (mant || *p != '0')
                digits++;
            mant = mant * 10 + (uint64_t)(*p - '0');
            if (frac >= 0)
                frac++;
            if (digits > 15 || frac > 22)
                break;
        } else if (*p == '.' && frac < 0) {
            frac = 0;
        } else {
            break;
        }
    }
    /* anything else (a sign, an exponent, hex, more digits) is strtod's */
    bool plain = p > s && (p - s > 1 || frac < 0) && digits <= 15 && frac <= 22 &&
                 *p != 'e' && *p != 'E' && !(*p >= '0' && *p <= '9') && *p != '.' &&
                 *p != 'x' && *p != 'X';
    if (!plain)
        return strtod(s, end);
    if (end)
        *end = (char *)p;
    return frac > 0 ? (double)mant / pow10[frac] : (double)mant;
}

double rp_memory_available(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double avail = pages > 0 && page > 0 ? (double)pages * page : INFINITY;
    double kb = read_figure("/proc/meminfo", "MemAvailable:");
    if (kb >= 0 && kb * 1024 < avail)
        avail = kb * 1024;
    /* cgroup v2: "max" reads as no figure */
    double max = read_figure("/sys/fs/cgroup/memory.max", "");
    double cur = read_figure("/sys/fs/cgroup/memory.current", "");
    if (max >= 0 && cur >= 0 && max - cur < avail)
        avail = max > cur ? max - cur : 0;
    return avail;
}

int rp_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int rp_list_dir(const char *dir, const char *suffix, char **names, int max) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    size_t k = strlen(suffix);
    struct dirent *de;
    while (n < max && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len >= k && strcmp(de->d_name + len - k, suffix) == 0 && (names[n] = strdup(de->d_name)))
            n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_name);
    return n;
}

uint32_t rp_crc32(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    uLong c = crc;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, b, k);
        b += k, n -= k;
    }
    return (uint32_t)c;
}

