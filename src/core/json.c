/*
** JSON: cJSON, opened on first use (json.h says why), and the strict
** readers every JSON file of the library goes through.
**
** Opened RTLD_LOCAL, as OpenBLAS is: its names stay out of the process's
** global scope, and a program that links cJSON itself gets the same copy
** (the loader opens a soname once).
*/
#include "json.h"

#include "dlib.h"
#include "util.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Keys given twice in one object, found by sorting its keys rather than
** comparing each with every earlier one: a safetensors header may hold
** 100 000 tensors and 100 MB, where pairs would take hours. */
typedef struct key_at {
    const char *key;
    int index;
} key_at;

static int cmp_key_at(const void *a, const void *b) {
    const key_at *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* mark[i]: whether the object's i-th item shares its key with an earlier
** item (later = false) or with a later one (later = true). NULL when out of
** memory, or when the object has no items (*n = 0). */
static bool *sibling_marks(const cJSON *obj, bool later, int *n) {
    *n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        (*n)++;
    if (*n == 0)
        return NULL;
    key_at *keys = malloc(sizeof *keys * (size_t)*n);
    bool *mark = calloc((size_t)*n, sizeof *mark);
    if (!keys || !mark) {
        free(keys), free(mark);
        *n = -1;
        return NULL;
    }
    int i = 0;
    for (const cJSON *c = obj->child; c; c = c->next, i++)
        keys[i] = (key_at){c->string ? c->string : "", i};
    qsort(keys, (size_t)*n, sizeof *keys, cmp_key_at);
    for (i = 0; i + 1 < *n; i++)
        if (strcmp(keys[i].key, keys[i + 1].key) == 0)
            mark[later ? keys[i].index : keys[i + 1].index] = true;
    free(keys);
    return mark;
}

/* The first key given twice in an object of the tree, its path in `path`:
** 1, or 0 when none is, or -1 out of memory. */
static int duplicate_key(const cJSON *v, char *path, size_t cap, size_t at) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return 0;
    int count = 0;
    bool *again = cJSON_IsObject(v) ? sibling_marks(v, false, &count) : NULL;
    if (count < 0)
        return -1;
    int index = 0, found = 0;
    for (const cJSON *c = v->child; c && !found; c = c->next, index++) {
        size_t n = at;
        if (cJSON_IsObject(v))
            n += (size_t)snprintf(path + at, cap - at, "%s%s", at ? "." : "", c->string);
        else
            n += (size_t)snprintf(path + at, cap - at, "[%d]", index);
        if (n >= cap)
            n = cap - 1;
        if (again && again[index])
            found = 1;
        else if ((found = duplicate_key(c, path, cap, n)) == 0)
            path[at] = '\0';
    }
    free(again);
    return found;
}

/* A syntax error or trailing text, with the line and column. */
static rp_status parse_document(const char *text, size_t len, const char *name, cJSON **out,
                                rp_error *err) {
    *out = NULL;
    rp_status s = rpi_json_load(err);
    if (s)
        return s;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t at = end && end >= text ? (size_t)(end - text) : 0;
    if (at > len)
        at = len;
    int line = 1, col = 1;
    if (!root) {
        rp_text_position(text, at, &line, &col);
        return rp_fail(err, RP_ERR_PARSE, "%s:%d:%d: not valid JSON", name, line, col);
    }
    while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' ||
                        text[at] == '\r'))
        at++;
    if (at < len) {
        cJSON_Delete(root);
        rp_text_position(text, at, &line, &col);
        return rp_fail(err, RP_ERR_PARSE, "%s:%d:%d: %s after the JSON document", name, line,
                       col, text[at] == '\0' ? "a NUL byte" : "more text");
    }
    *out = root;
    return RP_OK;
}

rp_status rp_json_parse(const char *text, size_t len, const char *name, cJSON **out,
                        rp_error *err) {
    cJSON *root;
    rp_status s = parse_document(text, len, name, &root, err);
    if (s)
        return s;
    char path[256] = "";
    int dup = duplicate_key(root, path, sizeof path, 0);
    if (dup) {
        cJSON_Delete(root);
        return dup < 0 ? rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name)
                       : rp_fail(err, RP_ERR_PARSE, "%s: key '%s' appears twice", name, path);
    }
    *out = root;
    return RP_OK;
}

/* Marks, in document order, the numbers of the tree that the text writes
** with a fraction or an exponent. cJSON keeps only the double, so the text
** is scanned again: outside strings, every number token is one number item,
** and cJSON links items in the order it read them. */
static const char *mark_numbers(cJSON *v, const char *p, const char *end) {
    for (; v; v = v->next) {
        if (cJSON_IsNumber(v)) {
            while (p < end) { /* to the next number token outside a string */
                if (*p == '"') {
                    for (p++; p < end && *p != '"'; p++)
                        if (*p == '\\')
                            p++;
                    p++;
                } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
                    break;
                } else {
                    p++;
                }
            }
            bool fraction = false;
            for (; p < end && *p && strchr("+-0123456789.eE", *p); p++)
                fraction |= *p == '.' || *p == 'e' || *p == 'E';
            if (fraction)
                v->type |= RP_JSON_FRACTION;
        }
        if (v->child)
            p = mark_numbers(v->child, p, end);
    }
    return p;
}

/* Removes, in the whole tree, every item of an object that a later item of
** the same key replaces; false when out of memory. */
static bool drop_replaced(cJSON *v, int *count, char *first, size_t cap, const char *at) {
    int n = 0;
    bool *replaced = cJSON_IsObject(v) ? sibling_marks(v, true, &n) : NULL;
    if (n < 0)
        return false;
    bool ok = true;
    int index = 0;
    for (cJSON *c = v->child; c && ok; index++) {
        cJSON *next = c->next;
        char path[256];
        if (cJSON_IsObject(v))
            snprintf(path, sizeof path, "%s%s%s", at, at[0] ? "." : "", c->string);
        else
            snprintf(path, sizeof path, "%s", at);
        if (replaced && replaced[index]) {
            if ((*count)++ == 0 && cap)
                snprintf(first, cap, "%s", path);
            cJSON_Delete(cJSON_DetachItemViaPointer(v, c));
        } else {
            ok = drop_replaced(c, count, first, cap, path);
        }
        c = next;
    }
    free(replaced);
    return ok;
}

rp_status rp_json_parse_config(const char *text, size_t len, const char *name, cJSON **out,
                               int *duplicates, char *first_duplicate, size_t cap,
                               rp_error *err) {
    *duplicates = 0;
    if (cap)
        first_duplicate[0] = '\0';
    rp_status s = parse_document(text, len, name, out, err);
    if (s)
        return s;
    mark_numbers(*out, text, text + len);
    if (!drop_replaced(*out, duplicates, first_duplicate, cap, "")) {
        cJSON_Delete(*out);
        *out = NULL;
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    }
    return RP_OK;
}

static rp_status parse_json(const char *text, size_t len, const char *path, void *out,
                            rp_error *err) {
    return rp_json_parse(text, len, path, out, err);
}

rp_status rp_json_read(const char *path, cJSON **out, rp_error *err) {
    return rp_parse_file(path, true, parse_json, out, err);
}
