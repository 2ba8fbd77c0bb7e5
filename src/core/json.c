/*
** cJSON, opened on first use (json.h says why).
**
** Opened RTLD_LOCAL, as OpenBLAS is: its names stay out of the process's
** global scope, and a program that links cJSON itself gets the same copy
** (the loader opens a soname once).
*/
#include "json.h"

#include "dlib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[512]; /* the loader's message when it failed */
static bool loaded;

static struct {
#define RPI_CJSON_POINTER(ret, name, params, args, fail) ret(*name) params;
    RPI_CJSON_FUNCTIONS(RPI_CJSON_POINTER)
#undef RPI_CJSON_POINTER
    void (*Delete)(cJSON *item);
    void (*free)(void *p);
} f;

/* A function pointer from a data pointer, as POSIX has dlsym return it. */
#define FIND(h, slot, symbol) (*(void **)&(slot) = dlsym((h), (symbol)), (slot) != NULL)

static bool bind_cjson(void *h) {
    bool all = FIND(h, f.Delete, "cJSON_Delete") && FIND(h, f.free, "cJSON_free");
#define RPI_CJSON_FIND(ret, name, params, args, fail) all = all && FIND(h, f.name, "cJSON_" #name);
    RPI_CJSON_FUNCTIONS(RPI_CJSON_FIND)
#undef RPI_CJSON_FIND
    return all;
}

static void load(void) {
    const char *names[] = {getenv("REPIPE_CJSON_LIBRARY"), "libcjson.so.1",
#ifdef REPIPE_CJSON_FILE
                           REPIPE_CJSON_FILE, /* where the build found it */
#endif
                           "libcjson.so"};
    loaded = rpi_library_open(names, sizeof names / sizeof *names, bind_cjson,
                              "lacks a function repipe calls (cJSON 1.7.13 or later has them "
                              "all)", why, sizeof why) != NULL;
}

static bool ready(void) {
    pthread_once(&once, load);
    return loaded;
}

rp_status rpi_json_load(rp_error *err) {
    if (ready())
        return RP_OK;
    const char *named = getenv("REPIPE_CJSON_LIBRARY");
    return rp_fail(err, RP_ERR_IO, "cannot load the cJSON library %s: %s (install cJSON: "
                   "Debian's libcjson1, or set REPIPE_CJSON_LIBRARY to its file)",
                   named && named[0] ? named : "libcjson.so.1", why);
}

rp_status rpi_json_nomem(const char *what, rp_error *err) {
    rp_status s = rpi_json_load(err);
    if (s)
        return s;
    return rp_fail(err, RP_ERR_NOMEM, "out of memory for %s", what);
}

#define RPI_CJSON_WRAP(ret, name, params, args, fail) \
    ret rpi_cJSON_##name params { return ready() ? f.name args : (fail); }
RPI_CJSON_FUNCTIONS(RPI_CJSON_WRAP)
#undef RPI_CJSON_WRAP

void rpi_cJSON_Delete(cJSON *item) {
    if (ready())
        f.Delete(item);
}

void rpi_cJSON_free(void *p) {
    if (ready())
        f.free(p);
}
