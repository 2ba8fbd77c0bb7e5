/*
** A simulation's result written out: as a drawing (SVG, a row per worker)
** and as JSON. The drawing is built in memory and renamed into place, so a
** run that stops half-way leaves the last drawing whole.
*/
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include "../core/json.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "repipe/schedule.h"
#include "repipe/simulate.h"

/* The operations drawn as boxes: those that compute, and the reduction. */
static bool drawn(int k) {
    return k == RP_OP_FORWARD || k == RP_OP_BACKWARD || k == RP_OP_STEP ||
           k == RP_OP_BACKWARD_INPUT || k == RP_OP_BACKWARD_WEIGHT || k == RP_OP_REDUCE;
}

/* Text in an element: a title may name a file with '&' or '<' in it. */
static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++)
        if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else
            fputc(*s, f);
}

rp_status rp_sim_svg(const rp_sim_result *r, const char *title, const char *path,
                     rp_error *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for the drawing", path);
    /* a row per worker: its operations above, its micro-batches in flight
    ** below as a step line scaled to the most any worker holds */
    int row = 40, box = 22, left = 110, width = 900, top = 40, most = 1;
    for (int w = 0; w < r->workers; w++)
        most = r->in_flight && r->in_flight[w] > most ? r->in_flight[w] : most;
    double scale = r->update_time > 0 ? width / r->update_time : 1;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"10\" y=\"20\" font-size=\"14\">",
            left + width + 20, top + row * r->workers + 30);
    put_escaped(f, title);
    fprintf(f, ": %.3f ms per update</text>\n", r->update_time * 1e3);
    for (int w = 0; w < r->workers; w++)
        fprintf(f, "<text x=\"10\" y=\"%d\">worker %d</text>\n", top + w * row + 15, w);
    static const char *const colors[] = {"#dddddd", "#4e79a7", "#dddddd", "#dddddd", "#59a14f",
                                         "#dddddd", "#dddddd", "#f28e2b", "#9c755f", "#8cd17d",
                                         "#b07aa1"};
    _Static_assert(sizeof colors / sizeof colors[0] == RP_OP_COUNT, "a colour per operation");
    for (int i = 0; i < r->num_events; i++) {
        const rp_sim_event *e = &r->events[i];
        if (!drawn(e->kind))
            continue;
        double x = left + e->t0 * scale, wpx = (e->t1 - e->t0) * scale;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                "stroke=\"white\"><title>%s %d</title></rect>\n",
                x, top + e->worker * row, wpx > 0.5 ? wpx : 0.5, box, colors[e->kind],
                rp_op_name((rp_op_kind)e->kind), e->mb);
        if (e->mb >= 0 && wpx > 12)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"white\">%s%d</text>\n", x + 2,
                    top + e->worker * row + 15,
                    e->kind == RP_OP_FORWARD ? "F" : e->kind == RP_OP_BACKWARD_WEIGHT ? "W" : "B",
                    e->mb);
    }
    /* in flight: up at a forward's start, down at its backward's end */
    int lane = row - box - 4;
    for (int w = 0; w < r->workers; w++) {
        int base = top + w * row + box + lane + 1, held = 0;
        fprintf(f, "<polyline fill=\"none\" stroke=\"#e15759\" points=\"%d,%d", left, base);
        for (int i = 0; i < r->num_events; i++) {
            const rp_sim_event *e = &r->events[i];
            if (e->worker != w || (e->kind != RP_OP_FORWARD && e->kind != RP_OP_BACKWARD &&
                                   e->kind != RP_OP_BACKWARD_WEIGHT))
                continue;
            double x = left + (e->kind == RP_OP_FORWARD ? e->t0 : e->t1) * scale;
            int y0 = base - held * lane / most;
            held += e->kind == RP_OP_FORWARD ? 1 : -1;
            fprintf(f, " %.1f,%d %.1f,%d", x, y0, x, base - held * lane / most);
        }
        fprintf(f, " %d,%d\"><title>worker %d: micro-batches in flight (at most %d)</title>"
                   "</polyline>\n",
                left + width, base, w, r->in_flight ? r->in_flight[w] : 0);
    }
    fprintf(f,
            "<text x=\"%d\" y=\"%d\">blue: forward, green: backward (light: its input's "
            "half), purple: its weights' half, orange: reduce, brown: step; red line: "
            "micro-batches in flight (full height %d)</text>\n</svg>\n",
            left, top + row * r->workers + 20, most);
    return rp_write_memstream_atomic(f, &text, &len, path, "the drawing", err);
}

rp_status rp_sim_to_json(const rp_sim_result *r, const rp_config *cfg, char **out,
                         rp_error *err) {
    *out = NULL;
    rp_derived d;
    rp_config_derive(cfg, &d);
    cJSON *root = cJSON_CreateObject(), *ws = cJSON_CreateArray(), *comm = cJSON_CreateArray();
    if (!root || !ws || !comm) {
        cJSON_Delete(root), cJSON_Delete(ws), cJSON_Delete(comm);
        return rpi_json_nomem("the simulation's JSON", err);
    }
    cJSON_AddNumberToObject(root, "seconds_per_update", r->update_time);
    cJSON_AddNumberToObject(root, "samples_per_update", (double)d.samples_per_update);
    cJSON_AddNumberToObject(root, "samples_per_second",
                            r->update_time > 0 ? d.samples_per_update / r->update_time : 0);
    cJSON_AddNumberToObject(root, "bubble_fraction", r->bubble_fraction);
    if (r->steady_update_time > 0) {
        cJSON_AddNumberToObject(root, "steady_seconds_per_update", r->steady_update_time);
        cJSON_AddNumberToObject(root, "steady_bubble_fraction", r->steady_bubble_fraction);
    }
    cJSON_AddNumberToObject(root, "workers", r->workers);
    cJSON_AddNumberToObject(root, "stages", r->stages);
    for (int l = 0; l < r->num_levels; l++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "level", l + 1);
        cJSON_AddNumberToObject(c, "seconds", r->comm_seconds[l]);
        cJSON_AddItemToArray(comm, c);
    }
    cJSON_AddItemToObject(root, "communication_by_level", comm);
    cJSON *mem = cJSON_CreateArray(); /* what each stage's worker holds, estimated */
    for (int k = 0; mem && k < r->stages; k++)
        cJSON_AddItemToArray(mem, cJSON_CreateNumber(r->stage_bytes[k]));
    cJSON_AddItemToObject(root, "stage_memory_bytes", mem);
    for (int w = 0; w < r->workers; w++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "worker", w);
        cJSON_AddNumberToObject(o, "stage", r->stage_of[w]);
        cJSON_AddNumberToObject(o, "busy_fraction", r->busy[w]);
        cJSON_AddNumberToObject(o, "in_flight", r->in_flight[w]);
        cJSON_AddItemToArray(ws, o);
    }
    cJSON_AddItemToObject(root, "per_worker", ws);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation's JSON");
    /* the caller frees with free(), whatever allocator cJSON was given */
    size_t n = strlen(text);
    if ((*out = malloc(n + 2))) {
        memcpy(*out, text, n);
        memcpy(*out + n, "\n", 2);
    }
    cJSON_free(text);
    return *out ? RP_OK : rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation's JSON");
}
