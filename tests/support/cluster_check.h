/* cluster_check.h: helpers for tests of a running cluster of ps-server processes: every row of a
 * table with its optimizer state read back from the servers (over the delta stream's SCAN, each
 * key from its primary), a table's order-free hash, and live resharding driven through psctl
 * (docs/server.md "Live resharding"). */
#ifndef CLUSTER_CHECK_H
#define CLUSTER_CHECK_H

#include "proc_util.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "emberps/psclient.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "psclient_repl.h"

/* Two free data ports and the map that gives each server half of the slots (no backups: a
 * server with --cluster-coordinator adds them), as text and as "--cluster-map=...". */
static inline void cc_two_servers(int *p0, int *p1, char *map, size_t mcap, char *maparg,
                                  size_t acap) {
    *p0 = pu_free_port();
    *p1 = pu_free_port();
    snprintf(map, mcap, "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1",
             *p0, *p1);
    snprintf(maparg, acap, "--cluster-map=%s", map);
}

/* The cluster map the server at data port `port` serves now (a fresh client's, from its HELLO). */
static inline pc_cluster_map_t *cc_map_of(int port) {
    char addr[64], text[4096];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = addr, .timeout_ms = 3000, .retries = 5};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    psc_map_text(c, text, sizeof text);
    psc_close(c);
    pc_cluster_map_t *m;
    assert_int_equal(pc_cmap_parse(text, &m, NULL, 0), 0);
    return m;
}

typedef void (*cc_rows_fn)(void *ctx, const uint64_t *keys, const float *rows, uint32_t n,
                           uint32_t stride);

static inline int cc_cmp_key(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Every row of `table` at server `server` (a map index) with its state (stride floats a row),
 * a batch at a time, to fn; fails the test on an error. A cold table's cold store is walked too
 * (PC_STREAM_COLD), each key given once (a promoted row is in RAM and in the cold store). */
static inline void cc_scan_state(psc_t *c, uint32_t server, const char *table, uint32_t stride,
                                 cc_rows_fn fn, void *ctx) {
    enum { CAP = 65536, PARTS = 4, PAGE = 100 }; /* (small pages: a walk of many) */
    uint64_t *k = calloc(CAP, 8), *seen = NULL, start = 0;
    size_t nseen = 0;
    uint8_t *f = calloc(CAP, 1);
    float *rows = calloc((size_t)CAP * stride, 4);
    assert_true(k && f && rows);
    for (uint32_t part = 0; part <= PARTS; part++) {
        psc_stream_req_t q = {.server = server,
                              .table = table,
                              .dim = stride,
                              .part = part,
                              .parts = PARTS,
                              .cap = part < PARTS ? CAP : PAGE,
                              .keys = k,
                              .found = f,
                              .rows = rows};
        psc_stream_t out;
        char why[256];
        int rc = psc__stream(c, true, &q, PC_STREAM_STATE | PC_STREAM_COLD, 0, start, &out, why,
                             sizeof why);
        if (rc)
            fail_msg("scan of server %u with state: %s: %s", server, pc_strerror(rc), why);
        uint32_t n = 0;
        for (uint32_t i = 0; i < out.n; i++) {
            if (part == PARTS && bsearch(&k[i], seen, nseen, 8, cc_cmp_key))
                continue; /* (given from RAM) */
            if (n != i) {
                k[n] = k[i];
                memmove(rows + (size_t)n * stride, rows + (size_t)i * stride, (size_t)stride * 4);
            }
            n++;
        }
        if (part < PARTS) { /* the RAM rows' keys, for the walk */
            assert_non_null(seen = realloc(seen, (nseen + n + 1) * 8));
            memcpy(seen + nseen, k, (size_t)n * 8);
            nseen += n;
            if (part == PARTS - 1)
                qsort(seen, nseen, 8, cc_cmp_key);
        }
        fn(ctx, k, rows, n, stride);
        if (part == PARTS && (start = out.from))
            part--; /* the next page of the walk */
    }
    free(seen);
    free(k);
    free(f);
    free(rows);
}

/* FNV-1a over n bytes, from h. */
static inline uint64_t cc_fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define CC_FNV_START 0xcbf29ce484222325ull

typedef struct cc_sum {
    uint64_t sum;
    size_t n;
} cc_sum_t;

static inline void cc_sum_rows(void *ctx, const uint64_t *keys, const float *rows, uint32_t n,
                               uint32_t stride) {
    cc_sum_t *x = ctx;
    for (uint32_t i = 0; i < n; i++)
        x->sum += cc_fnv(cc_fnv(CC_FNV_START, &keys[i], 8), rows + (size_t)i * stride,
                         (size_t)stride * 4);
    x->n += n;
}

/* The rows of `table` with their state at servers 0 .. nservers - 1 (each key from its primary):
 * a sum of per-row hashes (order-free, bit-exact) and the count. */
static inline uint64_t cc_table_sum(psc_t *c, uint32_t nservers, const char *table, uint32_t stride,
                                    size_t *rows) {
    cc_sum_t x = {0, 0};
    for (uint32_t s = 0; s < nservers; s++)
        cc_scan_state(c, s, table, stride, cc_sum_rows, &x);
    *rows = x.n;
    return x.sum;
}

/* `psctl reshard add 127.0.0.1:port` through the coordinator at grpc_port: the map to start
 * that server with, "--cluster-map=..." into maparg. */
static inline void cc_reshard_add(const char *psctl, int grpc_port, int port, char *maparg,
                                  size_t cap) {
    char addr[64], out[4096];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *args[] = {"--json", "reshard", "add", addr, NULL};
    assert_int_equal(pu_psctl(psctl, grpc_port, out, sizeof out, args), 0);
    char *mp = strstr(out, "\"map\":\"");
    assert_non_null(mp);
    mp += 7;
    char *end = strchr(mp, '"');
    assert_non_null(end);
    *end = '\0';
    snprintf(maparg, cap, "--cluster-map=%s", mp);
}

static inline void cc_reshard_remove(const char *psctl, int grpc_port, int port) {
    char addr[64], out[4096];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *args[] = {"reshard", "remove", addr, NULL};
    assert_int_equal(pu_psctl(psctl, grpc_port, out, sizeof out, args), 0);
}

/* Whether the map in the coordinator is the resharding target (`psctl reshard status`). */
static inline bool cc_reshard_done(const char *psctl, int grpc_port) {
    char out[4096];
    const char *args[] = {"--json", "reshard", "status", NULL};
    assert_int_equal(pu_psctl(psctl, grpc_port, out, sizeof out, args), 0);
    return strstr(out, "\"done\":true") != NULL;
}

#endif
