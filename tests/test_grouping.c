/*
** Replica groupings: the seed's tables, every valid grouping of 8 replicas
** against a direct enumeration, the rejected ones and transposes.
*/
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
    CHECK(rp_grouping_init(&g, 16, 4, 1, &err) == RP_OK);
    static const int t1[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    check_table(&g, t1, 4, 4);
    CHECK(rp_grouping_init(&g, 16, 4, 4, &err) == RP_OK);
    static const int t2[] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    check_table(&g, t2, 4, 4);
    CHECK(rp_grouping_init(&g, 16, 1, 1, &err) == RP_OK);
    check_table(&g, t1, 16, 1);
}

/* Enumerates the groups the way the definition reads: blocks of s*g
** replicas, and inside a block s interleaved groups with members s apart. */
static void check_against_enumeration(int R, int s, int gsz) {
    rp_grouping g;
    rp_error err;
    CHECK(rp_grouping_init(&g, R, gsz, s, &err) == RP_OK);
    if (gsz == 1)
        s = 1;
    int seen[64] = {0};
    for (int b = 0; b < R / (s * gsz); b++) {
        for (int o = 0; o < s; o++) {
            int k = o + s * b;
            CHECK_INT(rp_grouping_first(&g, k), b * s * gsz + o);
            for (int i = 0; i < gsz; i++) {
                int r = b * s * gsz + o + i * s;
                CHECK_INT(rp_grouping_member(&g, k, i), r);
                CHECK_INT(rp_grouping_group_of(&g, r), k);
                CHECK_INT(rp_grouping_index_in_group(&g, r), i);
                seen[r]++;
            }
        }
    }
    for (int r = 0; r < R; r++)
        CHECK_INT(seen[r], 1);
}

static void test_all_valid_for_8(void) {
    int valid = 0;
    for (int s = 1; s <= 8; s++)
        for (int gsz = 1; gsz <= 8; gsz++) {
            rp_grouping g;
            rp_error err;
            bool ok = rp_grouping_init(&g, 8, gsz, s, &err) == RP_OK;
            bool expect = gsz == 1 || 8 % (s * gsz) == 0;
            CHECK(ok == expect);
            if (ok && (gsz > 1 || s == 1)) {
                valid++;
                check_against_enumeration(8, s, gsz);
            }
        }
    /* g=1; g=2 with s=1,2,4; g=4 with s=1,2; g=8 with s=1 */
    CHECK_INT(valid, 7);
    rp_grouping g;
    rp_error err;
    CHECK(rp_grouping_init(&g, 8, 2, 2, &err) == RP_OK);
    static const int t[] = {0, 2, 1, 3, 4, 6, 5, 7};
    check_table(&g, t, 4, 2);
    /* g == 1 normalises the stride */
    CHECK(rp_grouping_init(&g, 8, 1, 3, &err) == RP_OK);
    CHECK_INT(g.stride, 1);
}

static void test_rejects(void) {
    rp_grouping g;
    rp_error err;
    CHECK(rp_grouping_init(&g, 8, 3, 1, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "replicas=8, stride=1, group_size=3");
    CHECK_STR_HAS(err.msg, "multiple of stride * group_size");
    CHECK(rp_grouping_init(&g, 8, 2, 0, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "stride must be >= 1");
    CHECK(rp_grouping_init(&g, 8, 0, 1, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "group_size must be >= 1");
    CHECK(rp_grouping_init(&g, 12, 2, 4, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "stride * group_size=8");
    CHECK(rp_grouping_init(&g, 0, 1, 1, &err) == RP_ERR_INVALID);
}

static void check_transpose(int R, int s, int gsz, int ts, int tg) {
    rp_grouping g, t, back;
    rp_error err;
    CHECK(rp_grouping_init(&g, R, gsz, s, &err) == RP_OK);
    CHECK(rp_grouping_transpose(&g, &t, &err) == RP_OK);
    CHECK_INT(t.stride, ts);
    CHECK_INT(t.group_size, tg);
    /* The transpose takes exactly one replica of every group of g. */
    int m[64];
    for (int k = 0; k < rp_grouping_num_groups(&t); k++) {
        rp_grouping_members(&t, k, m);
        int hit[64] = {0};
        for (int i = 0; i < t.group_size; i++)
            hit[rp_grouping_group_of(&g, m[i])]++;
        for (int j = 0; j < rp_grouping_num_groups(&g); j++)
            CHECK_INT(hit[j], 1);
    }
    CHECK(rp_grouping_transpose(&t, &back, &err) == RP_OK);
    CHECK(rp_grouping_equal(&back, &g));
}

static void test_transpose(void) {
    check_transpose(16, 1, 4, 4, 4);
    check_transpose(16, 4, 4, 1, 4);
    check_transpose(16, 2, 8, 1, 2);
    check_transpose(16, 1, 2, 2, 8);
    rp_grouping g, t;
    rp_error err;
    CHECK(rp_grouping_init(&g, 12, 2, 3, &err) == RP_OK);
    CHECK(rp_grouping_transpose(&g, &t, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "has no transpose");
    char buf[96];
    CHECK_STR_HAS(rp_grouping_to_string(&g, buf, sizeof buf), "group_size=2 stride=3");
    rp_grouping all = rp_grouping_all(6);
    CHECK_INT(rp_grouping_num_groups(&all), 1);
    CHECK_INT(rp_grouping_member(&all, 0, 5), 5);
}

int main(void) {
    test_seed_tables();
    test_all_valid_for_8();
    test_rejects();
    test_transpose();
    return test_finish("test_grouping");
}
