/*
** Replica groupings against PopXL and PopART: every (replicas <= 64, stride,
** group size), each also not given, against what PopXL's own code gave
** (tests/fixtures/popxl/groupings.txt.gz), the vectors of PopART's and
** PopXL's unit tests (unit_vectors.json), the seed's tables and an
** enumeration of the definition.
*/
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../src/core/util.h"
#include "repipe/grouping.h"
#include "test.h"

/* Checks every group of g against the expected member lists. */
static void check_table(const rp_grouping *g, const int *expected, int groups, int size) {
    CHECK_INT(rp_grouping_num_groups(g), groups);
    int m[64];
    for (int k = 0; k < groups; k++) {
        rp_grouping_members(g, k, m);
        for (int i = 0; i < size; i++)
            CHECK_INT(m[i], expected[k * size + i]);
    }
}

static void test_seed_tables(void) {
    rp_grouping g;
    rp_error err;
    CHECK_OK(rp_grouping_init(&g, 16, 4, 1, &err), err);
    static const int t1[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    check_table(&g, t1, 4, 4);
    CHECK_OK(rp_grouping_init(&g, 16, 4, 4, &err), err);
    static const int t2[] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    check_table(&g, t2, 4, 4);
    CHECK_OK(rp_grouping_init(&g, 16, 1, 1, &err), err);
    check_table(&g, t1, 16, 1);
}

/* Enumerates the groups the way the definition reads: blocks of s*g
** replicas, and inside a block s interleaved groups with members s apart. */
static void check_against_enumeration(const rp_grouping *g) {
    int R = g->replicas, s = g->stride, gsz = g->group_size, seen[64] = {0};
    for (int b = 0; b < R / (s * gsz); b++)
        for (int o = 0; o < s; o++) {
            int k = o + s * b;
            CHECK_INT(rp_grouping_first(g, k), b * s * gsz + o);
            for (int i = 0; i < gsz; i++) {
                int r = b * s * gsz + o + i * s;
                CHECK_INT(rp_grouping_member(g, k, i), r);
                CHECK_INT(rp_grouping_group_of(g, r), k);
                CHECK_INT(rp_grouping_index_in_group(g, r), i);
                seen[r]++;
            }
        }
    for (int r = 0; r < R; r++)
        CHECK_INT(seen[r], 1);
}

/* zlib's CRC-32 of a list written "0,1,0,1". */
static unsigned long list_crc(const int *v, int n) {
    char buf[512];
    size_t at = 0;
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%d", i ? "," : "", v[i]);
    return crc32(0L, (const Bytef *)buf, (uInt)at);
}

/* Every line of PopXL's results: the same refusal or the same grouping, its
** groups, and its transpose. */
static void test_popxl(const char *dir) {
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/groupings.txt.gz", dir);
    gzFile f = gzopen(path, "rb");
    CHECKF(f != NULL, "cannot read %s", path);
    if (!f)
        return;
    int lines = 0, valid = 0, same = 0;
    while (gzgets(f, line, sizeof line)) {
        if (line[0] == '#')
            continue;
        char st[16], gt[16], what[64], tk[16] = "", tg[16] = "";
        int R, os = 0, og = 0, G = 0;
        unsigned long acrc = 0, tcrc = 0;
        int n = sscanf(line, "%d %15s %15s %63s %d %d %d %lx %15s %15s %lx", &R, st, gt, what, &os,
                       &og, &G, &acrc, tk, tg, &tcrc);
        if (strcmp(tk, "assignment") == 0) /* no stride: one field fewer */
            n = sscanf(line, "%d %15s %15s %63s %d %d %d %lx %15s %lx", &R, st, gt, what, &os,
                       &og, &G, &acrc, tk, &tcrc);
        CHECKF(n >= 4, "unreadable line: %s", line);
        lines++;
        int s = atoi(st), g = atoi(gt);
        rp_grouping rg;
        rp_error err;
        bool ok = rp_grouping_popxl(&rg, R, st[0] == '-' ? NULL : &s, gt[0] == '-' ? NULL : &g,
                                    &err) == RP_OK;
        bool popxl_ok = strcmp(what, "ok") == 0;
        bool agree = ok == popxl_ok;
        CHECKF(ok == popxl_ok, "R=%d stride=%s group_size=%s: PopXL %s, repipe %s", R, st, gt,
               what, ok ? "accepts" : err.msg);
        if (!ok && !popxl_ok) { /* refused for the same rule */
            const char *rule = strcmp(what, "stride_factor") == 0 ? "a factor"
                               : strcmp(what, "group_range") == 0 ? "group size must be"
                               : strcmp(what, "not_divisible") == 0 ? "a multiple"
                                                                    : "stride must be at least";
            agree = strstr(err.msg, rule) != NULL;
            CHECKF(agree, "R=%d stride=%s group_size=%s: PopXL %s, repipe: %s", R, st, gt, what,
                   err.msg);
        }
        if (ok && popxl_ok) {
            valid++;
            int a[64], t[64];
            for (int r = 0; r < R; r++)
                a[r] = rp_grouping_group_of(&rg, r);
            rp_grouping_transpose_assignment(&rg, t);
            rp_grouping tr;
            bool tconst = rp_grouping_transpose(&rg, &tr, &err) == RP_OK;
            bool popxl_tconst = strcmp(tk, "assignment") != 0;
            agree = rg.stride == os && rg.group_size == og && rp_grouping_num_groups(&rg) == G &&
                    list_crc(a, R) == acrc && list_crc(t, R) == tcrc && tconst == popxl_tconst &&
                    (!tconst || (tr.stride == atoi(tk) && tr.group_size == atoi(tg)));
            CHECKF(agree, "R=%d stride=%s group_size=%s: PopXL (%d, %d, %d groups, transpose %s "
                   "%s), repipe (%d, %d, %d groups, transpose %s)", R, st, gt, os, og, G, tk, tg,
                   rg.stride, rg.group_size, rp_grouping_num_groups(&rg),
                   tconst ? "with a stride" : "without");
            check_against_enumeration(&rg);
        }
        same += agree;
    }
    gzclose(f);
    printf("PopXL: %d of %d (replicas, stride, group size) agree; %d valid\n", same, lines,
           valid);
    CHECK_INT(lines, 102496);
}

/* The file's text, NUL-terminated; NULL when it cannot be read. */
static char *slurp(const char *path) {
    char *text;
    size_t len;
    rp_error err;
    return rp_read_file(path, &text, &len, &err) ? NULL : text;
}

static int at(const cJSON *a, int i) { return cJSON_GetArrayItem(a, i)->valueint; }

/* (R, stride, group_size) of a vector, as PopART's constructor takes them. */
static rp_status make(const cJSON *v, rp_grouping *g, rp_error *err) {
    return rp_grouping_init(g, at(v, 0), at(v, 2), at(v, 1), err);
}

static void test_unit_vectors(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/unit_vectors.json", dir);
    char *text = slurp(path);
    cJSON *u = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECKF(u != NULL, "cannot read %s", path);
    rp_grouping g, t;
    rp_error err;
    const cJSON *v;
    int checked = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_invalid")) {
        CHECKF(make(v, &g, &err) == RP_ERR_INVALID, "PopART refuses (%d, %d, %d)", at(v, 0),
               at(v, 1), at(v, 2));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_stride")) {
        CHECK(make(cJSON_GetArrayItem(v, 0), &g, &err) == RP_OK && g.stride == at(v, 1));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_num_groups")) {
        CHECK(make(cJSON_GetArrayItem(v, 0), &g, &err) == RP_OK &&
              rp_grouping_num_groups(&g) == at(v, 1));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_group_at")) {
        CHECK_OK(make(cJSON_GetArrayItem(v, 0), &g, &err), err);
        for (int r = 0; r < g.replicas; r++)
            CHECK_INT(rp_grouping_group_of(&g, r), at(cJSON_GetArrayItem(v, 1), r));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_index_in_group")) {
        CHECK_OK(make(cJSON_GetArrayItem(v, 0), &g, &err), err);
        for (int r = 0; r < g.replicas; r++)
            CHECK_INT(rp_grouping_index_in_group(&g, r), at(cJSON_GetArrayItem(v, 1), r));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_replicas_at")) {
        CHECK_OK(make(cJSON_GetArrayItem(v, 0), &g, &err), err);
        const cJSON *groups = cJSON_GetArrayItem(v, 1);
        CHECK_INT(rp_grouping_num_groups(&g), cJSON_GetArraySize(groups));
        for (int k = 0; k < cJSON_GetArraySize(groups); k++)
            for (int i = 0; i < g.group_size; i++)
                CHECK_INT(rp_grouping_member(&g, k, i), at(cJSON_GetArrayItem(groups, k), i));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_transpose")) {
        rp_grouping want;
        CHECK_OK(make(cJSON_GetArrayItem(v, 0), &g, &err), err);
        CHECK_OK(make(cJSON_GetArrayItem(v, 1), &want, &err), err);
        CHECK(rp_grouping_transpose(&g, &t, &err) == RP_OK && rp_grouping_equal(&t, &want));
        CHECK(rp_grouping_transpose(&want, &t, &err) == RP_OK && rp_grouping_equal(&t, &g));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_transpose_invalid")) {
        CHECK_OK(make(v, &g, &err), err);
        CHECK(rp_grouping_transpose(&g, &t, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "its transpose has no stride");
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popart_equal")) {
        rp_grouping b;
        CHECK_OK(make(cJSON_GetArrayItem(v, 0), &g, &err), err);
        CHECK_OK(make(cJSON_GetArrayItem(v, 1), &b, &err), err);
        CHECK(rp_grouping_equal(&g, &b) == cJSON_IsTrue(cJSON_GetArrayItem(v, 2)));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popxl_construct")) {
        CHECK_OK(rp_grouping_init(&g, at(v, 0), at(v, 2), at(v, 1), &err), err);
        for (int r = 0; r < g.replicas; r++)
            CHECK_INT(rp_grouping_group_of(&g, r), at(cJSON_GetArrayItem(v, 3), r));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popxl_defaults")) {
        const cJSON *s = cJSON_GetArrayItem(v, 1), *gs = cJSON_GetArrayItem(v, 2);
        int sv = s->valueint, gv = gs->valueint;
        CHECK_OK(rp_grouping_popxl(&g, at(v, 0), cJSON_IsNull(s) ? NULL : &sv,
                                   cJSON_IsNull(gs) ? NULL : &gv, &err), err);
        CHECK(g.stride == at(v, 3) && g.group_size == at(v, 4));
        checked++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popxl_transpose")) {
        CHECK_OK(rp_grouping_init(&g, at(v, 0), at(v, 2), at(v, 1), &err), err);
        CHECK(rp_grouping_transpose(&g, &t, &err) == RP_OK && t.stride == at(v, 3) &&
              t.group_size == at(v, 4));
        for (int r = 0; r < g.replicas; r++)
            CHECK_INT(rp_grouping_group_of(&t, r), at(cJSON_GetArrayItem(v, 5), r));
        checked++;
    }
    /* transposes without a stride, as PopXL's assignments: of the pair, the
    ** one with a stride is a grouping, and its transpose is the other */
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(u, "popxl_transpose_from_assignment")) {
        int found = 0;
        for (int side = 0; side < 2 && !found; side++) {
            const cJSON *a = cJSON_GetArrayItem(v, side), *want = cJSON_GetArrayItem(v, !side);
            int R = cJSON_GetArraySize(a);
            for (int s = 1; s <= R && !found; s++)
                for (int gs = 1; gs <= R && !found; gs++) {
                    if (rp_grouping_init(&g, R, gs, s, &err))
                        continue;
                    bool same = true;
                    for (int r = 0; r < R; r++)
                        same &= rp_grouping_group_of(&g, r) == at(a, r);
                    if (!same)
                        continue;
                    found = 1;
                    int tr[64];
                    rp_grouping_transpose_assignment(&g, tr);
                    for (int r = 0; r < R; r++)
                        CHECK_INT(tr[r], at(want, r));
                }
        }
        CHECK(found);
        checked++;
    }
    CHECK_INT(checked, 61);
    cJSON_Delete(u);
}

/* Messages repeat what was given, and say what a default became. */
static void test_messages(void) {
    rp_grouping g;
    rp_error err;
    int zero = 0, three = 3, eight = 8;
    CHECK(rp_grouping_popxl(&g, 8, NULL, &zero, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "replica grouping of 8 replicas, group_size=0");
    CHECK(rp_grouping_popxl(&g, 8, &three, NULL, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "stride=3 (group_size not given: replicas / stride): the stride must "
                           "be a factor");
    CHECK(rp_grouping_popxl(&g, 16, &eight, &three, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "stride=8 group_size=3");
    /* a stride alone: the group size is R / stride, as in PopXL */
    int two = 2;
    CHECK_OK(rp_grouping_popxl(&g, 8, &two, NULL, &err), err);
    CHECK(g.stride == 2 && g.group_size == 4);
    CHECK_OK(rp_grouping_popxl(&g, 8, NULL, NULL, &err), err);
    CHECK(g.stride == 1 && g.group_size == 8);
    char buf[96];
    CHECK_STR_HAS(rp_grouping_to_string(&g, buf, sizeof buf), "group_size=8 stride=1");
    rp_grouping all = rp_grouping_all(6);
    CHECK_INT(rp_grouping_num_groups(&all), 1);
    CHECK_INT(rp_grouping_member(&all, 0, 5), 5);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures/popxl";
    test_seed_tables();
    test_popxl(dir);
    test_unit_vectors(dir);
    test_messages();
    return test_finish("test_grouping");
}
