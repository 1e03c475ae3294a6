/* libFuzzer target: the data plane's frame decoders on arbitrary byte streams. The input is cut
 * into frames the way a server reads a connection (header, then body_len bytes); every batch
 * body is decoded with small limits and the decoded arrays are read in full, so ASan catches
 * any pointer outside the body; CLAIM bodies are decoded as requests and as replies; a MAP body
 * (a server's cluster map, also what a wrong slot's reply carries) is parsed as it comes and
 * after a fixed "version=...;servers=...;slots=" head (so that the slot ranges, backups and
 * their in-sync marks are reached), and a map that parses must print, parse again and print the
 * same text, with valid roles. Never crashes, never reads outside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_half.h"
#include "pc_wire.h"

/* Parse text as a cluster map; one that parses round-trips through its text with valid roles. */
static void map_check(const char *text) {
    pc_cluster_map_t *m, *again;
    char err[160];
    if (pc_cmap_parse(text, &m, err, sizeof err))
        return;
    const size_t len = pc_cmap_format(m, NULL, 0);
    char *a = malloc(len + 1), *b = malloc(len + 1);
    pc_cmap_format(m, a, len + 1);
    if (pc_cmap_parse(a, &again, err, sizeof err) || pc_cmap_format(again, b, len + 1) != len ||
        strcmp(a, b) != 0)
        abort();
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        uint32_t bk[PC_MAX_BACKUPS];
        const uint32_t o = pc_cmap_slot_owner(m, s), nb = pc_cmap_slot_backups(m, s, bk);
        if (o >= pc_cmap_nservers(m) || pc_cmap_backup_syncing(m, s, o))
            abort();
        for (uint32_t j = 0; j < nb; j++)
            if (bk[j] == o || bk[j] >= pc_cmap_nservers(m) ||
                pc_cmap_backup_syncing(m, s, bk[j]) != pc_cmap_backup_syncing(again, s, bk[j]))
                abort();
    }
    pc_cmap_destroy(again);
    pc_cmap_destroy(m);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const pc_wire_limits_t lim = {1u << 16, 4096, 1u << 20};
    size_t off = 0;
    while (size - off >= PC_WIRE_HDR) {
        pc_wire_hdr_t h;
        int rc = pc_wire_hdr_decode(data + off, lim.max_body, &h);
        off += PC_WIRE_HDR;
        if (rc && rc != PC_ETOOBIG) /* an oversized body is skipped, as a server does */
            return 0;
        if (h.body_len > size - off)
            return 0;
        if (!rc && (h.op == PC_OP_PULL || h.op == PC_OP_PUSH || h.op == PC_OP_LOOKUP)) {
            uint8_t *body = malloc(h.body_len ? h.body_len : 1); /* aligned, exact size */
            memcpy(body, data + off, h.body_len);
            pc_wire_batch_t b;
            if (pc_wire_batch_decode((pc_wire_op_t)h.op, body, h.body_len, &lim, &b) == 0) {
                volatile uint64_t sink = 0;
                for (uint32_t i = 0; i < b.n; i++)
                    sink += b.keys[i];
                if (b.vals) {
                    volatile float fs = 0;
                    for (uint64_t i = 0; i < (uint64_t)b.n * b.dim; i++)
                        fs += b.vals[i];
                }
                if (b.vals16) { /* converted as a server does (pc_half.h) */
                    const size_t nv = (size_t)b.n * b.dim;
                    float *f = malloc(nv ? nv * sizeof *f : 1);
                    const pc_half_kernels_t *k = pc_half_kernels(NULL);
                    (b.dtype == PC_WIRE_BF16 ? k->from_bf16 : k->from_f16)(b.vals16, f, nv);
                    free(f);
                }
                (void)sink;
            }
            free(body);
        } else if (!rc && h.op == PC_OP_CLAIM) { /* as a request, then as a reply */
            uint8_t *body = malloc(h.body_len ? h.body_len : 1);
            memcpy(body, data + off, h.body_len);
            pc_wire_claim_t q;
            pc_wire_claim_reply_t r;
            if (pc_wire_claim_decode(body, h.body_len, &q) == 0 &&
                (strlen(q.name) > PC_WIRE_NAME_MAX || strlen(q.job) > PC_WIRE_JOB_MAX))
                abort();
            if (pc_wire_claim_reply_decode(body, h.body_len, &r) == 0 &&
                (strlen(r.previous) > PC_WIRE_JOB_MAX || strlen(r.config) > PC_WIRE_CFG_MAX))
                abort();
            free(body);
        } else if (!rc && h.op == PC_OP_MAP) {
            static const char head[] = "version=3;servers=a:1,b:2,c:3;slots=";
            char *text = malloc(sizeof head + h.body_len);
            memcpy(text, data + off, h.body_len);
            text[h.body_len] = '\0';
            map_check(text);
            memcpy(text, head, sizeof head - 1);
            memcpy(text + sizeof head - 1, data + off, h.body_len);
            text[sizeof head - 1 + h.body_len] = '\0';
            map_check(text);
            free(text);
        } else if (!rc && (h.op == PC_OP_DELTAS || h.op == PC_OP_SCAN)) { /* request, reply */
            uint8_t *body = malloc(h.body_len ? h.body_len : 1);
            memcpy(body, data + off, h.body_len);
            pc_wire_stream_t q;
            pc_wire_stream_reply_t r;
            if (pc_wire_stream_decode(body, h.body_len, &q) == 0 &&
                (!q.name[0] || strlen(q.name) > PC_WIRE_NAME_MAX))
                abort();
            if (pc_wire_stream_reply_decode(body, h.body_len, &r) == 0) {
                if (pc_wire_stream_reply_len(r.n, r.dim) != h.body_len)
                    abort();
                volatile uint8_t sink = 0; /* every array inside the body */
                for (uint32_t i = 0; i < r.n; i++)
                    sink ^= body[pc_wire_stream_found_off(r.n) + i];
                (void)sink;
            }
            free(body);
        }
        off += h.body_len;
    }
    return 0;
}
