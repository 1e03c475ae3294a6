/* ps_coord_remote.c: a ps-server's Coordinator service as a coordinator store (see
 * ps_coord_remote.h): each store call is one unary gRPC call through psgrpc. */
#include "ps_coord_remote.h"

#include "emberps.pb-c.h"
#include "pc_error.h"
#include "ps_coord_etcd.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct remote {
    psg_t *g;
    int timeout_ms;
} remote_t;

static int call(remote_t *c, const char *method, const ProtobufCMessage *m, uint8_t **resp,
                size_t *rlen) {
    const size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *req = malloc(n ? n : 1);
    if (!req)
        return PC_ENOMEM;
    protobuf_c_message_pack(m, req);
    int rc = psg_request(c->g, method, req, n, c->timeout_ms, resp, rlen, NULL, NULL, 0);
    free(req);
    return rc;
}

/* One KvSet: its condition (if_absent, or at a revision) and lease. */
static int r_put(void *ctx, const char *key, const void *value, size_t len, bool if_absent,
                 uint32_t lease_ms, uint64_t revision) {
    Emberps__KvSetRequest q = EMBERPS__KV_SET_REQUEST__INIT;
    q.key = (char *)key;
    q.value.data = (uint8_t *)(uintptr_t)value;
    q.value.len = len;
    q.if_absent = if_absent;
    q.lease_ms = lease_ms;
    q.if_revision = revision;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(ctx, "/emberps.Coordinator/KvSet", &q.base, &resp, &rlen);
    free(resp);
    return rc;
}

static int r_set(void *ctx, const char *key, const void *value, size_t len, bool if_absent,
                 uint32_t lease_ms) {
    return r_put(ctx, key, value, len, if_absent, lease_ms, 0);
}

static int r_set_if(void *ctx, const char *key, const void *value, size_t len, uint64_t revision,
                    uint32_t lease_ms) {
    return r_put(ctx, key, value, len, revision == 0, lease_ms, revision); /* 0: when absent */
}

static int r_get_rev(void *ctx, const char *key, void **value, size_t *len, uint64_t *revision) {
    Emberps__KvGetRequest q = EMBERPS__KV_GET_REQUEST__INIT;
    q.key = (char *)key;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(ctx, "/emberps.Coordinator/KvGet", &q.base, &resp, &rlen);
    if (rc)
        return rc;
    Emberps__KvGetResponse *r = emberps__kv_get_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!r)
        return PC_ECORRUPT;
    if ((*value = pc_kv_dup(r->value.data, r->value.len)))
        *len = r->value.len;
    if (revision) /* (0 from a server older than the field: it cannot compare-and-set) */
        *revision = r->revision;
    emberps__kv_get_response__free_unpacked(r, NULL);
    return *value ? 0 : PC_ENOMEM;
}

static int r_get(void *ctx, const char *key, void **value, size_t *len) {
    return r_get_rev(ctx, key, value, len, NULL);
}

static int r_list(void *ctx, const char *prefix, size_t max, pc_kv_entry_t **out, size_t *n,
                  bool *truncated) {
    Emberps__KvListRequest q = EMBERPS__KV_LIST_REQUEST__INIT;
    q.prefix = (char *)(prefix ? prefix : "");
    q.limit = max > PS_COORD_LIST_MAX ? PS_COORD_LIST_MAX : (uint32_t)max;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    *out = NULL;
    *n = 0;
    *truncated = false;
    if (!max)
        return 0;
    int rc = call(ctx, "/emberps.Coordinator/KvList", &q.base, &resp, &rlen);
    if (rc)
        return rc;
    Emberps__KvListResponse *r = emberps__kv_list_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!r)
        return PC_ECORRUPT;
    pc_kv_entry_t *v = calloc(r->n_entries ? r->n_entries : 1, sizeof *v);
    size_t k = 0; /* entries filled (or partly filled: freed on failure) */
    rc = v ? 0 : PC_ENOMEM;
    while (!rc && k < r->n_entries) {
        const Emberps__KvEntry *e = r->entries[k];
        pc_kv_entry_t *d = &v[k++];
        if ((rc = pc_kv_entry_fill(d, e->key, strlen(e->key), e->value.data, e->value.len)))
            break;
        d->lease_left_ms = e->lease_left_ms;
        d->revision = e->revision;
    }
    *truncated = r->truncated;
    emberps__kv_list_response__free_unpacked(r, NULL);
    if (rc) {
        pc_kv_entries_free(v, k);
        return rc;
    }
    *out = v;
    *n = k;
    return 0;
}

static void r_destroy(void *ctx) {
    remote_t *c = ctx;
    if (!c)
        return;
    psg_destroy(c->g);
    free(c);
}

int ps_coord_store_remote(const char *addr, const psg_opts_t *sec, int timeout_ms,
                          ps_coord_store_t *out) {
    if (!addr || !out || timeout_ms < 1)
        return PC_EINVAL;
    remote_t *c = calloc(1, sizeof *c);
    if (!c)
        return PC_ENOMEM;
    c->timeout_ms = timeout_ms;
    psg_opts_t o = {0};
    if (sec)
        o = *sec;
    o.addr = addr;
    o.max_message = 8u << 20;
    int rc = psg_create(&o, &c->g);
    if (rc) {
        free(c);
        return rc;
    }
    *out = (ps_coord_store_t){.ctx = c,
                              .set = r_set,
                              .get = r_get,
                              .get_rev = r_get_rev,
                              .set_if = r_set_if,
                              .list = r_list,
                              .destroy = r_destroy};
    return 0;
}

int ps_coord_store_open(const char *addr, const psg_opts_t *sec, int timeout_ms,
                        ps_coord_store_t *out) {
    return ps_coord_is_etcd(addr) ? ps_coord_store_etcd(addr, sec, timeout_ms, out)
                                  : ps_coord_store_remote(addr, sec, timeout_ms, out);
}
