/* pw_coord_client.c: see pw_coord_client.h.
 *
 * DESIGN: a thin layer over a coordinator store (ps_coord_remote.h opens the one the address
 * names: a ps-server's Coordinator service, or an etcd cluster), the same stores a ps-server and
 * psctl use. */
#include "pw_coord_client.h"

#include "pc_error.h"
#include "ps_coord_remote.h"

#include <stdbool.h>
#include <stdlib.h>

struct pw_coord {
    ps_coord_store_t st;
    uint32_t kv_lease_ms; /* the lease of keys set through pw_coord_kv (0: none) */
};

int pw_coord_open(const char *addr, const psg_opts_t *sec, int timeout_ms, pw_coord_t **out) {
    if (!addr || !out || timeout_ms < 1)
        return PC_EINVAL;
    pw_coord_t *c = calloc(1, sizeof *c);
    if (!c)
        return PC_ENOMEM;
    int rc = ps_coord_store_open(addr, sec, timeout_ms, &c->st);
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
    c->st.destroy(c->st.ctx);
    free(c);
}

int pw_coord_set(pw_coord_t *c, const char *key, const void *value, size_t len) {
    return c->st.set(c->st.ctx, key, value, len, false, 0);
}

int pw_coord_set_if_absent(pw_coord_t *c, const char *key, const void *value, size_t len) {
    return c->st.set(c->st.ctx, key, value, len, true, 0);
}

int pw_coord_set_lease(pw_coord_t *c, const char *key, const void *value, size_t len,
                       uint32_t lease_ms) {
    return c->st.set(c->st.ctx, key, value, len, false, lease_ms);
}

int pw_coord_set_lease_if_absent(pw_coord_t *c, const char *key, const void *value, size_t len,
                                 uint32_t lease_ms) {
    return c->st.set(c->st.ctx, key, value, len, true, lease_ms);
}

int pw_coord_get(pw_coord_t *c, const char *key, void **value, size_t *len) {
    return c->st.get(c->st.ctx, key, value, len);
}

int pw_coord_get_rev(pw_coord_t *c, const char *key, void **value, size_t *len,
                     uint64_t *revision) {
    return c->st.get_rev(c->st.ctx, key, value, len, revision);
}

int pw_coord_set_if(pw_coord_t *c, const char *key, const void *value, size_t len,
                    uint64_t revision, uint32_t lease_ms) {
    return c->st.set_if(c->st.ctx, key, value, len, revision, lease_ms);
}

int pw_coord_list(pw_coord_t *c, const char *prefix, uint32_t limit, pc_kv_entry_t **out,
                  size_t *n) {
    bool truncated = false;
    int rc = c->st.list(c->st.ctx, prefix, limit ? limit : PS_COORD_LIST_MAX, out, n, &truncated);
    if (!rc && truncated && !limit) {
        pc_kv_entries_free(*out, *n);
        *out = NULL;
        *n = 0;
        rc = PC_ETOOBIG;
    }
    return rc;
}

static int kv_set(void *ctx, const char *key, const void *value, size_t len) {
    pw_coord_t *c = ctx;
    return pw_coord_set_lease(c, key, value, len, c->kv_lease_ms);
}

static int kv_get(void *ctx, const char *key, void **value, size_t *len) {
    return pw_coord_get(ctx, key, value, len);
}

pw_kv_t pw_coord_kv(pw_coord_t *c, uint32_t lease_ms) {
    c->kv_lease_ms = lease_ms;
    return (pw_kv_t){c, kv_set, kv_get};
}
