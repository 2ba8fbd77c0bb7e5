/*
** cJSON, opened on first use.
**
** Every shared library a program links is opened, mapped and relocated at
** each start, and libcjson (36 symbol lookups of its own) was a twentieth
** of `repipe plan`'s whole run and more of `repipe --version`'s: commands
** that read and print no JSON paid for it. So the library links no cJSON
** and opens libcjson.so.1 (or the file the build found, or the one
** REPIPE_CJSON_LIBRARY names) the first time a JSON function is called, as
** it opens OpenBLAS (blas.h).
**
** Files of the library include this header in place of <cJSON.h>: it has
** cJSON's types and macros, and renames each function the library calls to
** a wrapper here (rpi_cJSON_Parse for cJSON_Parse, and so on), so the code
** reads as plain cJSON. Where the library cannot be opened, each wrapper
** fails as cJSON fails when out of memory (NULL, false, 0) and
** rpi_json_load() says why: rp_json_parse(), which reads every JSON file,
** calls it first, and a writer whose text came back NULL reports through
** rpi_json_nomem(), so that a missing library is reported as one.
**
** A program that calls cJSON itself (the tests, the benches) links it as
** usual; the wrappers then open that same copy.
*/
#ifndef REPIPE_JSON_H
#define REPIPE_JSON_H

#include <cJSON.h>
#include <stddef.h>

#include "repipe/core.h"

/* Opens libcjson if it is not yet open; an error that names it and the
** loader's message if it cannot be. */
rp_status rpi_json_load(rp_error *err);

/* For a writer whose cJSON call gave nothing: the library's absence where it
** could not be opened, else "out of memory for WHAT". */
rp_status rpi_json_nomem(const char *what, rp_error *err);

/* The functions the library calls: X(return type, name, parameters,
** arguments, value on failure). */
#define RPI_CJSON_FUNCTIONS(X)                                                                  \
    X(cJSON *, Parse, (const char *v), (v), NULL)                                              \
    X(cJSON *, ParseWithLength, (const char *v, size_t n), (v, n), NULL)                       \
    X(cJSON *, ParseWithLengthOpts, (const char *v, size_t n, const char **end, cJSON_bool z), \
      (v, n, end, z), NULL)                                                                    \
    X(char *, Print, (const cJSON *i), (i), NULL)                                              \
    X(char *, PrintUnformatted, (const cJSON *i), (i), NULL)                                   \
    X(int, GetArraySize, (const cJSON *a), (a), 0)                                             \
    X(cJSON *, GetArrayItem, (const cJSON *a, int k), (a, k), NULL)                            \
    X(cJSON *, GetObjectItem, (const cJSON *const o, const char *const s), (o, s), NULL)       \
    X(cJSON *, GetObjectItemCaseSensitive, (const cJSON *const o, const char *const s),        \
      (o, s), NULL)                                                                            \
    X(cJSON_bool, IsFalse, (const cJSON *const i), (i), 0)                                     \
    X(cJSON_bool, IsTrue, (const cJSON *const i), (i), 0)                                      \
    X(cJSON_bool, IsBool, (const cJSON *const i), (i), 0)                                      \
    X(cJSON_bool, IsNull, (const cJSON *const i), (i), 0)                                      \
    X(cJSON_bool, IsNumber, (const cJSON *const i), (i), 0)                                    \
    X(cJSON_bool, IsString, (const cJSON *const i), (i), 0)                                    \
    X(cJSON_bool, IsArray, (const cJSON *const i), (i), 0)                                     \
    X(cJSON_bool, IsObject, (const cJSON *const i), (i), 0)                                    \
    X(cJSON *, CreateNull, (void), (), NULL)                                                   \
    X(cJSON *, CreateNumber, (double x), (x), NULL)                                            \
    X(cJSON *, CreateString, (const char *s), (s), NULL)                                       \
    X(cJSON *, CreateArray, (void), (), NULL)                                                  \
    X(cJSON *, CreateObject, (void), (), NULL)                                                 \
    X(cJSON *, CreateIntArray, (const int *x, int n), (x, n), NULL)                            \
    X(cJSON *, CreateDoubleArray, (const double *x, int n), (x, n), NULL)                      \
    X(cJSON_bool, AddItemToArray, (cJSON * a, cJSON *i), (a, i), 0)                            \
    X(cJSON_bool, AddItemToObject, (cJSON * o, const char *s, cJSON *i), (o, s, i), 0)         \
    X(cJSON *, DetachItemViaPointer, (cJSON * p, cJSON *const i), (p, i), NULL)                \
    X(cJSON *, AddNullToObject, (cJSON *const o, const char *const s), (o, s), NULL)           \
    X(cJSON *, AddBoolToObject, (cJSON *const o, const char *const s, const cJSON_bool b),     \
      (o, s, b), NULL)                                                                         \
    X(cJSON *, AddNumberToObject, (cJSON *const o, const char *const s, const double x),       \
      (o, s, x), NULL)                                                                         \
    X(cJSON *, AddStringToObject, (cJSON *const o, const char *const s, const char *const v),  \
      (o, s, v), NULL)                                                                         \
    X(cJSON *, AddObjectToObject, (cJSON *const o, const char *const s), (o, s), NULL)         \
    X(cJSON *, AddArrayToObject, (cJSON *const o, const char *const s), (o, s), NULL)

#define RPI_CJSON_DECLARE(ret, name, params, args, fail) ret rpi_cJSON_##name params;
RPI_CJSON_FUNCTIONS(RPI_CJSON_DECLARE)
#undef RPI_CJSON_DECLARE
/* the two that return nothing: nothing to do where nothing was made */
void rpi_cJSON_Delete(cJSON *item);
void rpi_cJSON_free(void *p);

#define cJSON_Parse rpi_cJSON_Parse
#define cJSON_ParseWithLength rpi_cJSON_ParseWithLength
#define cJSON_ParseWithLengthOpts rpi_cJSON_ParseWithLengthOpts
#define cJSON_Print rpi_cJSON_Print
#define cJSON_PrintUnformatted rpi_cJSON_PrintUnformatted
#define cJSON_Delete rpi_cJSON_Delete
#define cJSON_free rpi_cJSON_free
#define cJSON_GetArraySize rpi_cJSON_GetArraySize
#define cJSON_GetArrayItem rpi_cJSON_GetArrayItem
#define cJSON_GetObjectItem rpi_cJSON_GetObjectItem
#define cJSON_GetObjectItemCaseSensitive rpi_cJSON_GetObjectItemCaseSensitive
#define cJSON_IsFalse rpi_cJSON_IsFalse
#define cJSON_IsTrue rpi_cJSON_IsTrue
#define cJSON_IsBool rpi_cJSON_IsBool
#define cJSON_IsNull rpi_cJSON_IsNull
#define cJSON_IsNumber rpi_cJSON_IsNumber
#define cJSON_IsString rpi_cJSON_IsString
#define cJSON_IsArray rpi_cJSON_IsArray
#define cJSON_IsObject rpi_cJSON_IsObject
#define cJSON_CreateNull rpi_cJSON_CreateNull
#define cJSON_CreateNumber rpi_cJSON_CreateNumber
#define cJSON_CreateString rpi_cJSON_CreateString
#define cJSON_CreateArray rpi_cJSON_CreateArray
#define cJSON_CreateObject rpi_cJSON_CreateObject
#define cJSON_CreateIntArray rpi_cJSON_CreateIntArray
#define cJSON_CreateDoubleArray rpi_cJSON_CreateDoubleArray
#define cJSON_AddItemToArray rpi_cJSON_AddItemToArray
#define cJSON_AddItemToObject rpi_cJSON_AddItemToObject
#define cJSON_DetachItemViaPointer rpi_cJSON_DetachItemViaPointer
#define cJSON_AddNullToObject rpi_cJSON_AddNullToObject
#define cJSON_AddBoolToObject rpi_cJSON_AddBoolToObject
#define cJSON_AddNumberToObject rpi_cJSON_AddNumberToObject
#define cJSON_AddStringToObject rpi_cJSON_AddStringToObject
#define cJSON_AddObjectToObject rpi_cJSON_AddObjectToObject
#define cJSON_AddArrayToObject rpi_cJSON_AddArrayToObject

/* ---- the strict readers (json.c) ---- */

/* Parses one JSON document strictly: a syntax error, anything but
** whitespace after the document (a second document, a NUL and more) and a
** key given twice in any object are refused with the file's name and the
** line and column, or the key's path. The caller frees *out with
** cJSON_Delete. */
rp_status rp_json_parse(const char *text, size_t len, const char *name, cJSON **out,
                        rp_error *err);

/* rp_json_parse() of a regular file's text (a file found, or named, that
** must not block: a device's, a model's config.json). */
rp_status rp_json_read(const char *path, cJSON **out, rp_error *err);

/* Parses a configuration's JSON as Python's json module reads it: a key
** given twice in an object keeps its last value (the earlier items are
** removed; *duplicates counts them and `first_duplicate` names the first,
** as a path), and every number written with a fraction or an exponent
** ("2.0", "1e3") carries RP_JSON_FRACTION in its type, so that a reader can
** tell 2.0 from 2 as Python does. Syntax errors and trailing text are
** refused as by rp_json_parse. The caller frees *out with cJSON_Delete. */
#define RP_JSON_FRACTION (1 << 14)
rp_status rp_json_parse_config(const char *text, size_t len, const char *name,
                               cJSON **out, int *duplicates, char *first_duplicate,
                               size_t cap, rp_error *err);

#endif /* REPIPE_JSON_H */
