/* pw_coord_client.c: see pw_coord_client.h.
 *
 * DESIGN: two backends behind the same calls. A ps-server's Coordinator service is called
 * through psgrpc (KvSet, KvGet, KvList); an etcd cluster ("etcd://...") through the coordinator
 * store that talks to it (ps_coord_etcd.h), the same code a ps-server uses to keep its
 * Coordinator service's state in etcd. */
#include "pw_coord_client.h"

#include "emberps.pb-c.h"
#include "emberps/psgrpc.h"
#include "pc_error.h"
#include "ps_coord_etcd.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct pw_coord {
    psg_t *g;            /* a ps-server's Coordinator service, or */
    ps_coord_store_t st; /* (st.ctx set) an etcd cluster */
    int timeout_ms;
};

int pw_coord_open(const char *addr, const psg_opts_t *sec, int timeout_ms, pw_coord_t **out) {
    if (!addr || !out || timeout_ms < 1)
        return PC_EINVAL;
    pw_coord_t *c = calloc(1, sizeof *c);
    if (!c)
        return PC_ENOMEM;
    c->timeout_ms = timeout_ms;
    if (ps_coord_is_etcd(addr)) {
        int rc = ps_coord_store_etcd(addr, sec, timeout_ms, &c->st);
        if (rc) {
            free(c);
            return rc;
        }
        *out = c;
        return 0;
    }
    psg_opts_t o = {0};
    if (sec)
        o = *sec;
    o.addr = addr;
    o.max_message = 4u << 20;
    int rc = psg_create(&o, &c->g);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void pw_coord_close(pw_coord_t *c) {
    if (!c)
        return;
    if (c->st.ctx)
        c->st.destroy(c->st.ctx);
    psg_destroy(c->g);
    free(c);
}

static int call(pw_coord_t *c, const char *method, const ProtobufCMessage *m, uint8_t **resp,
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

static int kv_put(pw_coord_t *c, const char *key, const void *value, size_t len, bool if_absent,
                  uint32_t lease_ms) {
    if (c->st.ctx)
        return c->st.set(c->st.ctx, key, value, len, if_absent, lease_ms);
    Emberps__KvSetRequest q = EMBERPS__KV_SET_REQUEST__INIT;
    q.key = (char *)key;
    q.value.data = (uint8_t *)value;
    q.value.len = len;
    q.if_absent = if_absent;
    q.lease_ms = lease_ms;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(c, "/emberps.Coordinator/KvSet", &q.base, &resp, &rlen);
    free(resp);
    return rc;
}

int pw_coord_set(pw_coord_t *c, const char *key, const void *value, size_t len) {
    return kv_put(c, key, value, len, false, 0);
}

int pw_coord_set_if_absent(pw_coord_t *c, const char *key, const void *value, size_t len) {
    return kv_put(c, key, value, len, true, 0);
}

int pw_coord_set_lease(pw_coord_t *c, const char *key, const void *value, size_t len,
                       uint32_t lease_ms) {
    return kv_put(c, key, value, len, false, lease_ms);
}

int pw_coord_set_lease_if_absent(pw_coord_t *c, const char *key, const void *value, size_t len,
                                 uint32_t lease_ms) {
    return kv_put(c, key, value, len, true, lease_ms);
}

int pw_coord_get(pw_coord_t *c, const char *key, void **value, size_t *len) {
    if (c->st.ctx)
        return c->st.get(c->st.ctx, key, value, len);
    Emberps__KvGetRequest q = EMBERPS__KV_GET_REQUEST__INIT;
    q.key = (char *)key;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(c, "/emberps.Coordinator/KvGet", &q.base, &resp, &rlen);
    if (rc)
        return rc;
    Emberps__KvGetResponse *r = emberps__kv_get_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!r)
        return PC_ECORRUPT;
    *value = malloc(r->value.len ? r->value.len : 1);
    if (*value) {
        memcpy(*value, r->value.data, r->value.len);
        *len = r->value.len;
    }
    emberps__kv_get_response__free_unpacked(r, NULL);
    return *value ? 0 : PC_ENOMEM;
}

int pw_coord_list(pw_coord_t *c, const char *prefix, uint32_t limit, pc_kv_entry_t **out,
                  size_t *n) {
    if (c->st.ctx) {
        bool truncated;
        return c->st.list(c->st.ctx, prefix, limit ? limit : PS_COORD_LIST_MAX, out, n, &truncated);
    }
    Emberps__KvListRequest q = EMBERPS__KV_LIST_REQUEST__INIT;
    q.prefix = (char *)prefix;
    q.limit = limit;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(c, "/emberps.Coordinator/KvList", &q.base, &resp, &rlen);
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
        d->key = strdup(e->key);
        d->value = malloc(e->value.len + 1); /* NUL-terminated: values are often text */
        if (!d->key || !d->value) {
            rc = PC_ENOMEM;
            break;
        }
        memcpy(d->value, e->value.data, e->value.len);
        ((char *)d->value)[e->value.len] = '\0';
        d->len = e->value.len;
        d->lease_left_ms = e->lease_left_ms;
    }
    emberps__kv_list_response__free_unpacked(r, NULL);
    if (rc) {
        pc_kv_entries_free(v, k);
        return rc;
    }
    *out = v;
    *n = k;
    return 0;
}

static int kv_set(void *ctx, const char *key, const void *value, size_t len) {
    return pw_coord_set(ctx, key, value, len);
}

static int kv_get(void *ctx, const char *key, void **value, size_t *len) {
    return pw_coord_get(ctx, key, value, len);
}

pw_kv_t pw_coord_kv(pw_coord_t *c) {
    return (pw_kv_t){c, kv_set, kv_get};
}
