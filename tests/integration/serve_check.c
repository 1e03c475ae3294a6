/* serve_check: does a ps-serve replica hold exactly the training servers' rows?
 *
 *   serve_check SERVERS REPLICA_GRPC TABLE
 *
 * Scans every row of TABLE on every training server (libpsclient psc_scan, in parts), looks the
 * same keys up on the replica (gRPC /emberps.ParameterServer/Lookup, which ps-serve answers from
 * its replica), and compares: every key found there with bit-equal rows, and the replica's row
 * count (ServeStatus.rows) equal to the servers' total. Prints one line ("rows N: equal, checksum
 * C") and exits 0, or names the first difference and exits 1 (2: bad usage or a failed call).
 * The checksum is an order-independent sum of a hash of (key, row bytes), for the log.
 * Used by tests/integration/serve_e2e.sh after training stopped and the replica's lag is 0.
 */
#include "emberps.pb-c.h"
#include "emberps/psclient.h"
#include "emberps/psgrpc.h"
#include "pc_error.h"
#include "pc_hash.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 65536

static int lookup_replica(psg_t *g, const char *table, uint64_t *keys, size_t n, uint32_t dim,
                          const float *want, uint64_t *checksum) {
    Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
    q.table = (char *)table;
    q.n_keys = n;
    q.keys = keys;
    const size_t rl = protobuf_c_message_get_packed_size(&q.base);
    uint8_t *rb = malloc(rl + 1), *resp = NULL;
    size_t len = 0;
    char msg[256];
    protobuf_c_message_pack(&q.base, rb);
    int rc = psg_request(g, "/emberps.ParameterServer/Lookup", rb, rl, 30000, &resp, &len, NULL,
                         msg, sizeof msg);
    free(rb);
    if (rc) {
        fprintf(stderr, "serve_check: replica Lookup: %s: %s\n", psc_err_name(rc), msg);
        return 2;
    }
    Emberps__LookupResponse *p = emberps__lookup_response__unpack(NULL, len, resp);
    free(resp);
    if (!p || p->dim != dim || p->rows.len != n * dim * sizeof(float) || p->found.len != n) {
        fprintf(stderr, "serve_check: replica Lookup: malformed or wrong-sized reply\n");
        return 2;
    }
    int out = 0;
    for (size_t i = 0; i < n && !out; i++) {
        if (!p->found.data[i]) {
            fprintf(stderr, "serve_check: key %" PRIu64 " is on the server, not on the replica\n",
                    keys[i]);
            out = 1;
        } else if (memcmp(p->rows.data + i * dim * sizeof(float), want + i * dim,
                          dim * sizeof(float)) != 0) {
            float got;
            memcpy(&got, p->rows.data + i * dim * sizeof(float), sizeof got);
            fprintf(stderr,
                    "serve_check: key %" PRIu64 ": the replica's row differs (first value %.9g, "
                    "server %.9g)\n",
                    keys[i], got, want[i * dim]);
            out = 1;
        }
        *checksum += XXH3_64bits_withSeed(want + i * dim, dim * sizeof(float), keys[i]);
    }
    emberps__lookup_response__free_unpacked(p, NULL);
    return out;
}

/* The replica's row count from ServeStatus. */
static int replica_rows(psg_t *g, uint64_t *rows) {
    Emberps__ServeStatusRequest q = EMBERPS__SERVE_STATUS_REQUEST__INIT;
    uint8_t rb[16], *resp = NULL;
    size_t len = 0;
    const size_t rl = protobuf_c_message_pack(&q.base, rb);
    char msg[256];
    int rc = psg_request(g, "/emberps.Serving/ServeStatus", rb, rl, 30000, &resp, &len, NULL, msg,
                         sizeof msg);
    if (rc) {
        fprintf(stderr, "serve_check: ServeStatus: %s: %s\n", psc_err_name(rc), msg);
        return 2;
    }
    Emberps__ServeStatusResponse *p = emberps__serve_status_response__unpack(NULL, len, resp);
    free(resp);
    if (!p)
        return 2;
    *rows = p->rows;
    emberps__serve_status_response__free_unpacked(p, NULL);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: serve_check SERVERS REPLICA_GRPC TABLE\n");
        return 2;
    }
    const char *table = argv[3];
    psc_opts_t po = {.servers = argv[1], .timeout_ms = 30000};
    psc_t *c = NULL;
    psg_opts_t go = {.addr = argv[2]};
    psg_t *g = NULL;
    if (psc_connect(&po, &c) || psg_create(&go, &g)) {
        fprintf(stderr, "serve_check: cannot connect\n");
        return 2;
    }
    char map[65536];
    psc_map_text(c, map, sizeof map);
    size_t nservers = 1;
    for (const char *p = strstr(map, "servers="); p && *p && *p != ';'; p++)
        nservers += *p == ',';
    /* the table's dim, from the servers' table settings */
    char tables[65536];
    size_t tl = 0;
    uint32_t dim = 0;
    if (psc_tables(c, tables, sizeof tables, &tl) == 0) {
        char want[80];
        snprintf(want, sizeof want, "name=%s,", table);
        const char *t = strstr(tables, want), *d = t ? strstr(t, "dim=") : NULL;
        dim = d ? (uint32_t)strtoul(d + 4, NULL, 10) : 0;
    }
    if (!dim) {
        fprintf(stderr, "serve_check: no table %s on the servers\n", table);
        return 2;
    }
    uint64_t *keys = malloc(CAP * sizeof *keys), total = 0, checksum = 0;
    uint8_t *found = malloc(CAP);
    float *rows = malloc((size_t)CAP * dim * sizeof *rows);
    int rc = 0;
    for (uint32_t s = 0; !rc && s < nservers; s++) {
        for (uint32_t parts = 1;;) {
            uint32_t part = 0;
            for (; part < parts && !rc; part++) {
                psc_stream_req_t q = {.server = s,
                                      .table = table,
                                      .dim = dim,
                                      .part = part,
                                      .parts = parts,
                                      .cap = CAP,
                                      .keys = keys,
                                      .found = found,
                                      .rows = rows};
                psc_stream_t out;
                char why[256];
                int e = psc_scan(c, &q, &out, why, sizeof why);
                if (e == PC_ETOOBIG && part == 0) {
                    parts *= 4;
                    part = UINT32_MAX; /* start over with more parts */
                    break;
                }
                if (e) {
                    fprintf(stderr, "serve_check: scan of server %u: %s: %s\n", s, psc_err_name(e),
                            why);
                    rc = 2;
                    break;
                }
                total += out.n;
                rc = lookup_replica(g, table, keys, out.n, dim, rows, &checksum);
            }
            if (part != UINT32_MAX)
                break;
        }
    }
    uint64_t held = 0;
    if (!rc && !(rc = replica_rows(g, &held)) && held != total) {
        fprintf(stderr,
                "serve_check: the replica holds %" PRIu64 " rows, the servers %" PRIu64 "\n", held,
                total);
        rc = 1;
    }
    if (!rc)
        printf("rows %" PRIu64 ": equal, checksum %016" PRIx64 "\n", total, checksum);
    free(keys);
    free(found);
    free(rows);
    psg_destroy(g);
    psc_close(c);
    return rc;
}
