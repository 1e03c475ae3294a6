/* ps_mapstore.c: see ps_mapstore.h. */
#include "ps_mapstore.h"

#include "pc_error.h"
#include "pc_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAP_PREFIX PS_COORD_CLUSTER_PREFIX "map/"
#define MAP_HINT   PS_COORD_CLUSTER_PREFIX "map-newest"
#define TARGET     PS_COORD_CLUSTER_PREFIX "target"
#define RUN_PREFIX PS_COORD_CLUSTER_PREFIX "run/"
#define RUNNING    "running"
#define STOPPED    "stopped"

/* The map under key: 0, PC_ENOTFOUND, PC_EPARSE or the store's error. */
static int get_text(const ps_coord_store_t *st, const char *key, pc_cluster_map_t **out,
                    uint64_t *revision) {
    char err[160];
    void *val = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    int rc = st->get_rev(st->ctx, key, &val, &len, &rev);
    if (revision)
        *revision = rc ? 0 : rev ? rev : PS_MAPSTORE_UNVERSIONED;
    char *text = rc ? NULL : malloc(len + 1);
    if (!rc && !text)
        rc = PC_ENOMEM;
    if (!rc) {
        memcpy(text, val, len);
        text[len] = '\0';
        if ((rc = pc_cmap_parse(text, out, err, sizeof err)))
            PC_ERROR("cluster map: the coordinator's %s is bad: %s", key, err);
    }
    free(text);
    free(val);
    return rc;
}

/* Write m's text under key: if absent (revision 0), or compare-and-set at revision, or
 * whatever is there (PS_MAPSTORE_UNVERSIONED). */
static int put_text(const ps_coord_store_t *st, const char *key, const pc_cluster_map_t *m,
                    uint64_t revision) {
    const size_t len = pc_cmap_format(m, NULL, 0);
    char *text = malloc(len + 1);
    if (!text)
        return PC_ENOMEM;
    pc_cmap_format(m, text, len + 1);
    int rc = revision == PS_MAPSTORE_UNVERSIONED ? st->set(st->ctx, key, text, len, false, 0)
                                                 : st->set_if(st->ctx, key, text, len, revision, 0);
    free(text);
    return rc;
}

int ps_mapstore_get(const ps_coord_store_t *st, uint64_t v, pc_cluster_map_t **out) {
    char key[64];
    snprintf(key, sizeof key, MAP_PREFIX "%020" PRIu64, v);
    return get_text(st, key, out, NULL);
}

int ps_mapstore_newest(const ps_coord_store_t *st, uint64_t from, uint64_t guess,
                       pc_cluster_map_t **out) {
    *out = NULL;
    if (!from) {
        void *val = NULL;
        size_t len = 0;
        char text[32] = "";
        int rc = st->get(st->ctx, MAP_HINT, &val, &len);
        if (rc && rc != PC_ENOTFOUND)
            return rc;
        if (!rc)
            memcpy(text, val, len < sizeof text - 1 ? len : sizeof text - 1);
        free(val);
        const uint64_t hint = strtoull(text, NULL, 10);
        /* the larger of the hint and the guess, then the smaller: a hint ahead of its map
         * (never written), or a guess ahead of the store (a server configured with a later
         * version than the store holds: it wrote its own there, and the servers that followed
         * the store's versions one by one never saw it), then version 1 (no hint yet) */
        const uint64_t lo = hint < guess ? hint : guess, hi = hint > guess ? hint : guess;
        const uint64_t tries[3] = {hi, lo, 1};
        rc = PC_ENOTFOUND;
        for (int k = 0; k < 3 && rc == PC_ENOTFOUND; k++) {
            bool asked = !tries[k]; /* (0: none; each version asked once) */
            for (int j = 0; j < k; j++)
                asked = asked || tries[j] == tries[k];
            if (!asked)
                rc = ps_mapstore_get(st, from = tries[k], out);
        }
        if (rc == PC_ENOTFOUND)
            return 0; /* none yet */
        if (rc)
            return rc;
    }
    for (;;) { /* the versions after it, each written once and never removed */
        pc_cluster_map_t *next;
        int rc = ps_mapstore_get(st, from + 1, &next);
        if (rc == PC_ENOTFOUND)
            break;
        if (rc) {
            pc_cmap_destroy(*out);
            *out = NULL;
            return rc;
        }
        pc_cmap_destroy(*out);
        *out = next;
        from++;
    }
    return 0;
}

int ps_mapstore_put(const ps_coord_store_t *st, const pc_cluster_map_t *m) {
    char key[64];
    snprintf(key, sizeof key, MAP_PREFIX "%020" PRIu64, pc_cmap_version(m));
    int rc = put_text(st, key, m, 0);
    if (!rc) { /* the hint: best effort (readers walk forward from any version) */
        char v[32];
        const int n = snprintf(v, sizeof v, "%" PRIu64, pc_cmap_version(m));
        st->set(st->ctx, MAP_HINT, v, (size_t)n, false, 0);
    }
    return rc;
}

int ps_mapstore_get_target(const ps_coord_store_t *st, pc_cluster_map_t **out, uint64_t *revision) {
    return get_text(st, TARGET, out, revision);
}

int ps_mapstore_put_target(const ps_coord_store_t *st, const pc_cluster_map_t *target,
                           uint64_t revision) {
    return put_text(st, TARGET, target, revision);
}

/* The run record's key of addr. */
static void run_key(char *key, size_t cap, const char *addr) {
    snprintf(key, cap, RUN_PREFIX "%s", addr);
}

/* The record of a stop with exactly checkpoint id's rows. */
static void stopped_at(char *text, size_t cap, uint64_t id) {
    snprintf(text, cap, STOPPED " checkpoint=%" PRIu64, id);
}

/* Write text as the run record of addr. */
static int run_put(const ps_coord_store_t *st, const char *addr, const char *text) {
    char key[PC_ADDR_MAX + 32];
    run_key(key, sizeof key, addr);
    return st->set(st->ctx, key, text, strlen(text), false, 0);
}

int ps_mapstore_run_read(const ps_coord_store_t *st, const char *addr, uint64_t restored,
                         bool *went_back, char *last, size_t cap) {
    char key[PC_ADDR_MAX + 32], text[64] = "none", clean[64];
    run_key(key, sizeof key, addr);
    void *val = NULL;
    size_t len = 0;
    *went_back = false;
    int rc = st->get(st->ctx, key, &val, &len);
    if (rc && rc != PC_ENOTFOUND)
        return rc;
    if (!rc) {
        const size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
        memcpy(text, val, n);
        text[n] = '\0';
        free(val);
        stopped_at(clean, sizeof clean, restored);
        *went_back = strcmp(text, clean) != 0;
    }
    snprintf(last, cap, "%s", text);
    return 0;
}

int ps_mapstore_run_start(const ps_coord_store_t *st, const char *addr) {
    return run_put(st, addr, RUNNING);
}

int ps_mapstore_run_end(const ps_coord_store_t *st, const char *addr, bool at_ckpt, uint64_t ckpt) {
    char text[64];
    if (at_ckpt)
        stopped_at(text, sizeof text, ckpt);
    else
        snprintf(text, sizeof text, STOPPED);
    return run_put(st, addr, text);
}

int ps_mapstore_run_restore(const ps_coord_store_t *st, const char *addr, const char *last) {
    return run_put(st, addr, last);
}

int ps_mapstore_runs(const ps_coord_store_t *st, pc_kv_entry_t **out, size_t *n) {
    bool truncated;
    int rc = st->list(st->ctx, RUN_PREFIX, PS_COORD_LIST_MAX, out, n, &truncated);
    for (size_t i = 0; !rc && i < *n; i++) /* the address: the key after the prefix */
        memmove((*out)[i].key, (*out)[i].key + strlen(RUN_PREFIX),
                strlen((*out)[i].key) - strlen(RUN_PREFIX) + 1);
    return rc;
}
