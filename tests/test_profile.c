/*
** graph.txt reader and writer: the accepted forms, every error with its
** line, and write -> read round trips; the reader's numbers equal
** strtod's to the bit.
*/
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "repipe/profile.h"
#include "test.h"

#define N(id) id " -- Conv2d(3, 64) -- forward_compute_time=1.500, backward_compute_time=2.000, " \
                 "activation_size=100.0, parameter_size=50.000\n"

static rp_status parse(const char *text, rp_profile **p, rp_error *err) {
    return rp_profile_parse(p, text, strlen(text), "g.txt", err);
}

static void test_accepts(void) {
    rp_profile *p;
    rp_error err;
    const char *text =
        "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
        "activation_size=0.0, parameter_size=0.000\n"
        "node2 -- LSTM(1024) -- x -- forward_compute_time=3.25, backward_compute_time=4.0, "
        "activation_size=[1.0; 2.5; 3.5], parameter_size=8.0 -- stage_id=1\r\n"
        "\n" N("node3") "\tnode1 -- node2\n\tnode2 -- node3\n\tnode1 -- node3\n";
    CHECK(parse(text, &p, &err) == RP_OK);
    if (!p)
        return;
    CHECK_INT(p->num_nodes, 3);
    CHECK_INT(p->num_edges, 3);
    CHECK(strcmp(p->nodes[1].desc, "LSTM(1024) -- x") == 0);
    CHECK(p->nodes[1].activation_bytes == 7.0);
    CHECK(p->nodes[1].forward_ms == 3.25);
    CHECK_INT(p->nodes[1].stage_id, 1);
    CHECK_INT(p->nodes[2].stage_id, -1);
    CHECK_INT(p->nodes[2].line, 4);
    CHECK_INT(p->edges[2].from, 0);
    CHECK_INT(p->edges[2].to, 2);
    CHECK_INT(rp_profile_find(p, "node3"), 2);
    CHECK_INT(rp_profile_find(p, "node9"), -1);
    /* write -> read gives the same graph; stage ids can be overridden */
    int stages[3] = {0, 0, 1};
    char *out;
    CHECK(rp_profile_to_string(p, stages, &out, &err) == RP_OK);
    CHECK_STR_HAS(out, "node3 -- Conv2d(3, 64) -- forward_compute_time=1.500, "
                       "backward_compute_time=2.000, activation_size=100.000, "
                       "parameter_size=50.000 -- stage_id=1\n");
    CHECK_STR_HAS(out, "\tnode1 -- node3\n");
    rp_profile *q;
    CHECK(parse(out, &q, &err) == RP_OK);
    if (q) {
        CHECK_INT(q->num_nodes, 3);
        CHECK_INT(q->num_edges, 3);
        for (int i = 0; i < 3; i++) {
            CHECK(strcmp(q->nodes[i].id, p->nodes[i].id) == 0);
            CHECK(strcmp(q->nodes[i].desc, p->nodes[i].desc) == 0);
            CHECK(q->nodes[i].forward_ms == p->nodes[i].forward_ms);
            CHECK(q->nodes[i].activation_bytes == p->nodes[i].activation_bytes);
            CHECK_INT(q->nodes[i].stage_id, stages[i]);
        }
        rp_profile_free(q);
    }
    free(out);
    rp_profile_free(p);
}

static void test_errors(void) {
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"", "no nodes: the profile is empty"},
        {"\n\n", "no nodes"},
        {N("a") N("a"), "g.txt:2: node id 'a' already defined on line 1"},
        {N("a") "\ta -- b\n", "g.txt:2: the edge names an unknown node 'b'"},
        {N("a") N("b") "\ta -- b\n\tb -- a\n", "g.txt: the graph has no source"},
        {N("a") N("b") N("c") "\ta -- b\n\tb -- c\n\tc -- b\n", "g.txt:5: the edge b -- c lies on a cycle"},
        {N("a") "\ta -- a\n", "g.txt:2: the edge a -- a lies on a cycle"},
        {N("a") "\ta b\n", "g.txt:2: an edge line must read 'FROM -- TO'"},
        {"a -- A -- forward_compute_time=x, backward_compute_time=0, activation_size=0, "
         "parameter_size=0\n",
         "g.txt:1: forward_compute_time: 'x' is not a non-negative number"},
        {"a -- A -- forward_compute_time=-1, backward_compute_time=0, activation_size=0, "
         "parameter_size=0\n",
         "'-1' is not a non-negative number"},
        {"a -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=[1; z], "
         "parameter_size=0\n",
         "activation_size list has a bad number 'z'"},
        {"a -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=[1; 2, "
         "parameter_size=0\n",
         "lacks its closing ']'"},
        {"a -- A -- forward_compute_time=1, backward_compute_time=0, parameter_size=0\n",
         "expected 'activation_size=..., '"},
        {"a -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=1, "
         "parameter_size=0 -- stage=2\n",
         "only ' -- stage_id=N' may follow"},
        {"a -- forward_compute_time=1, backward_compute_time=0, activation_size=1, "
         "parameter_size=0\n",
         "g.txt:1: expected 'ID -- DESCRIPTION"},
        {"just some words\n", "g.txt:1: expected 'ID -- DESCRIPTION"},
        {" -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=1, "
         "parameter_size=0\n",
         "g.txt:1: expected 'ID -- DESCRIPTION"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rp_profile *p = NULL;
        rp_error err;
        rp_status s = parse(cases[i].text, &p, &err);
        CHECK(s != RP_OK);
        CHECK(p == NULL);
        if (s != RP_OK)
            CHECK_STR_HAS(err.msg, cases[i].msg);
    }
    rp_profile *p;
    rp_error err;
    CHECK(rp_profile_read(&p, "/nonexistent/graph.txt", &err) == RP_ERR_IO);
    CHECK_STR_HAS(err.msg, "/nonexistent/graph.txt");
}

/* A skip: node a is read by b and by d, so the cuts before c and d carry
** a beside what is in front of them; file order is the layers' order even
** where another topological order exists (d's branch listed last). */
static void test_cuts(void) {
#define NODE(id, act) id " -- x -- forward_compute_time=1, backward_compute_time=1, " \
                      "activation_size=" act ", parameter_size=0\n"
    const char *text = NODE("in", "1") NODE("a", "10") NODE("b", "100") NODE("c", "1000")
        NODE("d", "10000") NODE("e", "5")
        "\tin -- a\n\ta -- b\n\tb -- c\n\tc -- e\n\ta -- d\n\td -- e\n";
#undef NODE
    rp_profile *p;
    rp_error err;
    CHECK(rp_profile_parse(&p, text, strlen(text), "cuts", &err) == RP_OK);
    double *fw, *bw, *ob, *pb, *cut;
    int *node, L;
    CHECK(rp_profile_layers(p, &fw, &bw, &ob, &pb, &node, &L, &err) == RP_OK);
    CHECK(rp_profile_cut_bytes(p, node, L, &cut, &err) == RP_OK);
    /* no Input source: six layers, in file order */
    CHECK_INT(L, 6);
    for (int k = 0; k < L; k++)
        CHECK_INT(node[k], k);
    /* cut k: before layer k. 1: in; 2: a; 3: a + b; 4: a + c; 5: c + d */
    CHECK(cut[1] == 1 && cut[2] == 10 && cut[3] == 110 && cut[4] == 1010 && cut[5] == 11000);
    free(fw), free(bw), free(ob), free(pb), free(node), free(cut);
    rp_profile_free(p);
}

/* rp_strtod's shortcut against glibc's strtod, bit for bit and to the same
** end: random decimals of 1 to 18 digits with the point anywhere (or none),
** leading zeros, and what may follow a number in a file. */
static void test_strtod(void) {
    static const char *tails[] = {"", ",", " ", "e5", "E-3", "x", ".", "]", ";"};
    uint64_t r = 0x9e3779b97f4a7c15u;
    int bad = 0;
    for (int k = 0; k < 200000; k++) {
        char text[64];
        int n = 0, digits = 1 + (int)(r % 18), point = (int)((r >> 8) % (digits + 2)) - 1;
        int zeros = (int)((r >> 16) % 4) == 0 ? (int)((r >> 20) % 6) : 0;
        for (int z = 0; z < zeros; z++)
            text[n++] = '0';
        for (int d = 0; d < digits; d++) {
            if (d == point)
                text[n++] = '.';
            r = r * 6364136223846793005u + 1442695040888963407u;
            text[n++] = (char)('0' + (r >> 33) % 10);
        }
        if (point == digits)
            text[n++] = '.';
        snprintf(text + n, sizeof text - (size_t)n, "%s", tails[(r >> 40) % 9]);
        r = r * 6364136223846793005u + 1442695040888963407u;
        char *e1, *e2;
        double a = rp_strtod(text, &e1), b = strtod(text, &e2);
        if (memcmp(&a, &b, sizeof a) != 0 || e1 != e2) {
            if (bad++ < 5)
                CHECKF(false, "rp_strtod(\"%s\") = %.17g (end %d), strtod %.17g (end %d)", text,
                       a, (int)(e1 - text), b, (int)(e2 - text));
        }
    }
    CHECK_INT(bad, 0);
    /* and the forms it leaves to strtod */
    const char *others[] = {"", ".", "-1.5", "+2", " 3", "inf", "nan", "0x1p3", "1e400",
                            "0.1234567890123456789", "12345678901234567890"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        char *e1, *e2;
        double a = rp_strtod(others[i], &e1), b = strtod(others[i], &e2);
        CHECKF((a == b || (a != a && b != b)) && e1 == e2, "rp_strtod(\"%s\")", others[i]);
    }
}

int main(void) {
    test_strtod();
    test_accepts();
    test_cuts();
    test_errors();
    return test_finish("test_profile");
}
