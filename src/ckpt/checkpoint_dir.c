/*
** Checkpoint directories (repipe/checkpoint.h): one run a directory, held
** by a lock; its checkpoints named by update and told apart by run.
**
** Names alone cannot say whose a checkpoint is: a new run in a directory
** of an earlier, longer run would take the higher names for the newest and
** prune its own checkpoints as it writes them, and a run resumed past a
** damaged newest file would keep that one and prune the one it resumed
** from. So every checkpoint names its run, pruning reads the names, and a
** directory holding another run's checkpoints is refused before any work.
*/
#define _DEFAULT_SOURCE /* flock, gethostname */
#include "repipe/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/util.h"
#include "checkpoint_impl.h"

#define PREFIX RPI_CKPT_PREFIX
#define SUFFIX RPI_CKPT_SUFFIX
#define LOCK_NAME "repipe.lock"

struct rp_checkpoint_dir {
    char dir[RP_PATH_MAX];
    char run[RP_RUN_ID_MAX];
    char from[RP_PATH_MAX]; /* the file name resumed from, or "" */
    char lock[RP_PATH_MAX + 32];
    int fd; /* the lock, held while open */
};

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The checkpoints of dir, oldest first (their names sort by update). */
static int list(const char *dir, char ***out) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0, cap = 16;
    char **names = malloc(sizeof(char *) * cap);
    for (struct dirent *e; names && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) != 0 || l < strlen(SUFFIX) ||
            strcmp(e->d_name + l - strlen(SUFFIX), SUFFIX) != 0)
            continue;
        if (n == cap) {
            char **more = realloc(names, sizeof(char *) * (cap *= 2));
            if (!more)
                break;
            names = more;
        }
        if ((names[n] = strdup(e->d_name)))
            n++;
    }
    closedir(d);
    if (!names)
        return -1;
    qsort(names, n, sizeof(char *), by_name);
    *out = names;
    return n;
}

static void free_list(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Temporary files a killed writer left (a checkpoint's name, then ".tmp"):
** the lock makes this run the directory's only writer. */
static void remove_orphans(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) == 0 &&
            strstr(e->d_name, SUFFIX ".tmp")) {
            char path[RP_PATH_MAX * 2];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
}

/* 128 random bits in hexadecimal; from the clock and the process where
** the system has no random source. */
static void new_run(char *out) {
    unsigned char b[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, b, sizeof b) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)sizeof b) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^
                     (uint64_t)getpid() << 40;
        for (int i = 0; i < 16; i++) { /* splitmix64 */
            x += 0x9e3779b97f4a7c15ull;
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            b[i] = (unsigned char)(z ^ (z >> 31));
        }
    }
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

const char *rp_checkpoint_dir_run(const rp_checkpoint_dir *d) { return d->run; }

/* Who holds the lock, as its file says. */
static void holder(int fd, char *out, size_t cap) {
    char text[512];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    char run[64] = "?", host[256] = "?";
    long pid = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        sscanf(line, "run %63s", run);
        sscanf(line, "host %255s", host);
        sscanf(line, "pid %ld", &pid);
    }
    snprintf(out, cap, "run %s, pid %ld on host %s", run, pid, host);
}

/* The lock file goes with its holder; one that opens it meanwhile finds,
** once it holds the lock, that the name no longer leads to its file, and
** starts again (lock_file). */
void rp_checkpoint_dir_close(rp_checkpoint_dir *d) {
    if (!d)
        return;
    if (d->fd >= 0 && d->run[0])
        unlink(d->lock);
    if (d->fd >= 0)
        close(d->fd); /* and with it the lock */
    free(d);
}

/* Opens d->lock and takes it; fails naming the holder when another has it. */
static rp_status lock_file(rp_checkpoint_dir *d, rp_error *err) {
    for (int tries = 0; tries < 100; tries++) {
        /* not through a link, and never blocking on what is not a file */
        d->fd = open(d->lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        struct stat sb, now;
        if (d->fd < 0)
            return rp_fail(err, RP_ERR_IO, "%s: cannot open the directory's lock: %s", d->lock,
                           strerror(errno));
        if (fstat(d->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
            return rp_fail(err, RP_ERR_IO,
                           "%s: not a regular file, so it cannot be the directory's lock; "
                           "remove it", d->lock);
        if (flock(d->fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno != EWOULDBLOCK)
                return rp_fail(err, RP_ERR_IO, "%s: cannot lock: %s", d->lock, strerror(errno));
            char who[400];
            holder(d->fd, who, sizeof who);
            return rp_fail(err, RP_ERR_IO,
                           "%s is in use by another run (%s): a checkpoint directory serves "
                           "one run at a time; wait for it to end, or give another directory",
                           d->dir, who);
        }
        if (stat(d->lock, &now) == 0 && now.st_ino == sb.st_ino && now.st_dev == sb.st_dev)
            return RP_OK;
        close(d->fd); /* its holder removed it as we opened it */
        d->fd = -1;
    }
    return rp_fail(err, RP_ERR_IO, "%s: cannot take the lock: it keeps being replaced",
                   d->lock);
}

/* Refuses a directory that holds another run's checkpoints. */
static rp_status foreign(const rp_checkpoint_dir *d, bool fresh, rp_error *err) {
    char **names;
    int n = list(d->dir, &names);
    if (n < 0)
        return rp_fail(err, RP_ERR_IO, "%s: cannot read the checkpoint directory: %s", d->dir,
                       strerror(errno));
    rp_status st = RP_OK;
    for (int i = n - 1; i >= 0 && !st; i--) {
        char path[RP_PATH_MAX * 2], run[RP_RUN_ID_MAX] = "";
        long long update = -1;
        snprintf(path, sizeof path, "%s/%s", d->dir, names[i]);
        bool known = rpi_checkpoint_peek(path, run, sizeof run, &update);
        if (fresh)
            st = rp_fail(err, RP_ERR_INVALID,
                         "%s holds checkpoints of another run (the newest: %s%s): a new run "
                         "would mix its checkpoints with them; continue that run (--resume), "
                         "or give an empty directory",
                         d->dir, names[i], known ? "" : ", unreadable");
        else if (known && run[0] && strcmp(run, d->run) != 0)
            st = rp_fail(err, RP_ERR_INVALID,
                         "%s holds checkpoints of another run than the one resumed (%s, update "
                         "%lld, of run %s; resumed: run %s): give that run's directory, or an "
                         "empty one",
                         d->dir, names[i], update, run, d->run);
    }
    free_list(names, n);
    return st;
}

rp_status rp_checkpoint_dir_open(const char *dir, const char *run, const char *from,
                                 rp_checkpoint_dir **out, rp_error *err) {
    *out = NULL;
    struct stat sb;
    if (strlen(dir) >= RP_PATH_MAX - 32)
        return rp_fail(err, RP_ERR_INVALID, "%s: the checkpoint directory's path is too long",
                       dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return rp_fail(err, RP_ERR_IO, "%s: cannot make the checkpoint directory: %s", dir,
                       strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return rp_fail(err, RP_ERR_IO, "%s: not a directory: checkpoints go in a directory of "
                                       "their own", dir);
    if (access(dir, W_OK) != 0)
        return rp_fail(err, RP_ERR_IO, "%s: cannot write in the checkpoint directory: %s", dir,
                       strerror(errno));
    rp_checkpoint_dir *d = calloc(1, sizeof *d);
    if (!d)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    snprintf(d->dir, sizeof d->dir, "%s", dir);
    const char *base = from ? strrchr(from, '/') : NULL;
    snprintf(d->from, sizeof d->from, "%s", base ? base + 1 : from ? from : "");
    snprintf(d->lock, sizeof d->lock, "%s/" LOCK_NAME, dir);
    d->fd = -1;
    rp_status st = lock_file(d, err);
    if (!st) {
        if (run && run[0])
            snprintf(d->run, sizeof d->run, "%s", run);
        else
            new_run(d->run);
        st = foreign(d, !run, err);
    }
    if (!st) { /* who holds it, for the next one that asks */
        char host[256] = "?", text[512];
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        int n = snprintf(text, sizeof text, "run %s\nhost %s\npid %ld\n", d->run, host,
                         (long)getpid());
        if (ftruncate(d->fd, 0) != 0 || pwrite(d->fd, text, (size_t)n, 0) != n)
            st = rp_fail(err, RP_ERR_IO, "%s: cannot write: %s", d->lock, strerror(errno));
    }
    if (st) {
        rp_checkpoint_dir_close(d);
        return st;
    }
    *out = d;
    return RP_OK;
}

typedef struct own {
    char *name;
    long long update;
} own;

static int newest_first(const void *a, const void *b) {
    const own *x = a, *y = b;
    return (x->update < y->update) - (x->update > y->update);
}

rp_status rp_checkpoint_dir_write(rp_checkpoint_dir *d, const rp_checkpoint *c, int keep,
                                  char *path, size_t cap, rp_error *err) {
    if (keep < 1)
        return rp_fail(err, RP_ERR_INVALID, "checkpoints: keep at least 1 (got %d)", keep);
    remove_orphans(d->dir);
    rp_checkpoint mine = *c; /* the same state, under this run's name */
    snprintf(mine.run, sizeof mine.run, "%s", d->run);
    char name[64];
    snprintf(name, sizeof name, PREFIX "%012lld" SUFFIX, c->state.updates);
    snprintf(path, cap, "%s/%s", d->dir, name);
    rp_status st = rp_checkpoint_save(&mine, path, err);
    if (st)
        return st;
    char **names;
    int n = list(d->dir, &names);
    own *older = n > 0 ? malloc(sizeof(own) * n) : NULL;
    int k = 0;
    for (int i = 0; i < n && older; i++) {
        char p[RP_PATH_MAX * 2], run[RP_RUN_ID_MAX];
        long long update;
        snprintf(p, sizeof p, "%s/%s", d->dir, names[i]);
        if (strcmp(names[i], name) != 0 && strcmp(names[i], d->from) != 0 &&
            rpi_checkpoint_peek(p, run, sizeof run, &update) && strcmp(run, d->run) == 0 &&
            update < c->state.updates)
            older[k++] = (own){names[i], update};
    }
    if (older)
        qsort(older, k, sizeof(own), newest_first);
    for (int i = keep - 1; i < k; i++) { /* the one just written is the first kept */
        char p[RP_PATH_MAX * 2];
        snprintf(p, sizeof p, "%s/%s", d->dir, older[i].name);
        unlink(p);
    }
    free(older);
    if (n >= 0)
        free_list(names, n);
    return RP_OK;
}

rp_status rp_checkpoint_latest(const char *dir, rp_checkpoint *out, char *path, size_t cap,
                               char *note, size_t note_cap, rp_error *err) {
    memset(out, 0, sizeof *out);
    if (note_cap)
        note[0] = '\0';
    char **names;
    int n = list(dir, &names);
    if (n < 0)
        return rp_fail(err, RP_ERR_IO, "%s: cannot read the checkpoint directory: %s", dir,
                       strerror(errno));
    rp_status st = rp_fail(err, RP_ERR_IO, "%s: no checkpoint (" PREFIX "*" SUFFIX ") here",
                           dir);
    size_t used = 0;
    for (int i = n - 1; i >= 0; i--) {
        snprintf(path, cap, "%s/%s", dir, names[i]);
        rp_error why;
        if (rp_checkpoint_load(out, path, &why) == RP_OK) {
            st = RP_OK;
            break;
        }
        if (used < note_cap)
            used += (size_t)snprintf(note + used, note_cap - used, "%s%s: skipped: %s",
                                     used ? "\n" : "", names[i], why.msg);
        if (i == 0)
            st = rp_fail(err, RP_ERR_PARSE, "%s: no checkpoint here loads (the oldest: %s)", dir,
                         why.msg);
    }
    free_list(names, n);
    return st;
}
