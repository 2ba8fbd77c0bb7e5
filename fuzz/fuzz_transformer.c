/*
** Fuzz target: transformer shapes and the files that price them. The first
** byte says what the rest is: a shape ("llama3-8b,seq=4096", KEY=VALUE text),
** a device's JSON, a cluster's JSON, or a Hugging Face config.json. Every
** input must be read or refused with a message; a shape read must write
** back to itself, and price (its FLOPs finite, its profile whole, a small
** cluster's plan found or refused cleanly) on a device or cluster read.
*/
#define _DEFAULT_SOURCE /* mkstemp */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "repipe/planner.h"
#include "repipe/transformer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a file (the device, cluster and config readers take paths). */
static int as_file(const uint8_t *data, size_t size, char *path, size_t cap) {
    snprintf(path, cap, "/tmp/repipe-fuzz-XXXXXX.json");
    int fd = mkstemps(path, 5);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    close(fd);
    return done == size ? 0 : -1;
}

/* A shape priced on the cluster: its counts finite, its profile whole (as
** many edges as layers and more), a plan of a few devices found or refused. */
static void price(const rp_transformer *m, const rp_cluster *c) {
    rp_error err;
    if (!isfinite(rp_transformer_flops_megatron(m, 1, 2)) ||
        !isfinite(rp_transformer_flops_eq3(m, 2)) || !isfinite(rp_transformer_flops_6n(m, 2)) ||
        !isfinite(rp_transformer_parameters(m)))
        abort();
    if (m->layers > 2000) /* (a profile is written a line a layer: the bound is the parser's) */
        return;
    rp_transformer_run r;
    rp_transformer_run_default(&r);
    char *text;
    if (rp_transformer_profile(m, c, &r, &text, &err) == RP_OK) {
        int edges = 0;
        for (const char *p = text; (p = strchr(p, '\t')); p++)
            edges++;
        if (edges != m->layers + 2)
            abort();
        free(text);
    } else if (err.msg[0] == '\0') {
        abort();
    }
    if (m->layers > 200)
        return;
    rp_scale_options o;
    rp_scale_options_default(&o);
    o.devices = 16, o.global_batch = 32;
    rp_scale_plan plan;
    if (rp_scale_plan_compute(m, c, &o, &plan, &err) != RP_OK && err.msg[0] == '\0')
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536)
        return 0;
    int kind = data[0] % 4;
    rp_error err;
    rp_transformer m;
    rp_cluster c;
    if (rp_cluster_get("dgx-h100", &c, &err) != RP_OK)
        abort();
    if (kind == 0) { /* a shape */
        char *spec = malloc(size);
        if (!spec)
            return 0;
        memcpy(spec, data + 1, size - 1);
        spec[size - 1] = '\0';
        if (rp_transformer_parse(spec, &m, &err) == RP_OK) {
            char text[512];
            rp_transformer back;
            rp_transformer_format(&m, text, sizeof text);
            if (rp_transformer_parse(text, &back, &err) != RP_OK || memcmp(&m, &back, sizeof m))
                abort();
            price(&m, &c);
        } else if (err.msg[0] == '\0') {
            abort();
        }
        free(spec);
        return 0;
    }
    char path[64];
    if (as_file(data + 1, size - 1, path, sizeof path))
        return 0;
    rp_transformer_parse("layers=4,hidden=256,heads=4,kv_heads=2,seq=128,vocab=1000,mlp=swiglu",
                         &m, &err);
    if (kind == 1) { /* a device */
        if (rp_device_get(path, &c.device, &err) == RP_OK)
            price(&m, &c);
        else if (err.msg[0] == '\0')
            abort();
    } else if (kind == 2) { /* a cluster */
        if (rp_cluster_get(path, &c, &err) == RP_OK)
            price(&m, &c);
        else if (err.msg[0] == '\0')
            abort();
    } else { /* a config.json */
        char *unknown = NULL;
        if (rp_transformer_from_config(path, "seq=256", &m, &unknown, &err) == RP_OK)
            price(&m, &c);
        else if (err.msg[0] == '\0')
            abort();
        free(unknown);
    }
    unlink(path);
    return 0;
}
