/* ps_coord.c: the in-process coordinator store (see ps_coord.h): a chained hash table under one
 * mutex (the coordinator's traffic is a few calls per worker step at most). Expired keys are
 * removed when met (get, set, list) and all at once when the store would otherwise be full. */
#include "ps_coord.h"

#include "pc_error.h"
#include "pc_hash.h"
#include "pc_time.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define NBUCKETS 4096

typedef struct entry {
    struct entry *next;
    char *key;
    void *value;
    size_t len;
    uint64_t expires_ns; /* CLOCK_MONOTONIC; 0: never */
    uint64_t revision;   /* mem_t.sets when it was last set */
} entry_t;

typedef struct mem {
    pthread_mutex_t mu;
    entry_t *b[NBUCKETS];
    size_t n, bytes;
    uint64_t sets; /* every set so far: the entries' revisions */
} mem_t;

static entry_t **slot(mem_t *m, const char *key) {
    entry_t **e = &m->b[pc_hash64(key, strlen(key), 0) % NBUCKETS];
    while (*e && strcmp((*e)->key, key) != 0)
        e = &(*e)->next;
    return e;
}

static bool expired(const entry_t *e, uint64_t now) {
    return e->expires_ns && now >= e->expires_ns;
}

/* Unlink and free *e (the caller holds the mutex). */
static void drop(mem_t *m, entry_t **e) {
    entry_t *x = *e;
    *e = x->next;
    m->n--;
    m->bytes -= strlen(x->key) + x->len;
    free(x->key);
    free(x->value);
    free(x);
}

/* *slot(key), with an expired entry there removed first (then the link at the chain's end: the
 * link that held it now holds the next entry, another key). */
static entry_t **live_slot(mem_t *m, const char *key, uint64_t now) {
    entry_t **e = slot(m, key);
    if (*e && expired(*e, now)) {
        drop(m, e);
        e = slot(m, key);
    }
    return e;
}

static void purge(mem_t *m, uint64_t now) {
    for (size_t i = 0; i < NBUCKETS; i++)
        for (entry_t **e = &m->b[i]; *e;)
            if (expired(*e, now))
                drop(m, e);
            else
                e = &(*e)->next;
}

/* Whether adding `grow` bytes (and a key when `add`) stays within the limits. */
static bool fits(const mem_t *m, size_t grow, bool add) {
    return m->bytes + grow <= PS_COORD_BYTES_MAX && (!add || m->n < PS_COORD_KEYS_MAX);
}

/* The condition of a set: any, only when absent, or only at a revision. */
typedef struct cond {
    bool if_absent;
    uint64_t revision; /* > 0: only when the key's revision is this */
} cond_t;

static int mem_put(mem_t *m, const char *key, const void *value, size_t len, cond_t c,
                   uint32_t lease_ms) {
    const int bad = ps_coord_key_check(key, len);
    if (bad)
        return bad;
    const size_t kl = strlen(key);
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return PC_ENOMEM;
    if (len)
        memcpy(copy, value, len);
    pthread_mutex_lock(&m->mu);
    const uint64_t now = pc_time_mono_ns();
    const uint64_t expires = lease_ms ? now + (uint64_t)lease_ms * 1000000u : 0;
    entry_t **e = live_slot(m, key, now);
    const size_t grow = *e ? (len > (*e)->len ? len - (*e)->len : 0) : kl + len;
    if (!fits(m, grow, !*e)) {
        purge(m, now);
        e = slot(m, key); /* the purge may have moved the chain */
    }
    int rc = 0;
    if ((*e && c.if_absent) || (c.revision && (!*e || (*e)->revision != c.revision))) {
        rc = PC_EEXIST;
    } else if (!fits(m, grow, !*e)) {
        rc = PC_EFULL;
    } else if (*e) {
        m->bytes = m->bytes - (*e)->len + len;
        free((*e)->value);
        (*e)->value = copy;
        (*e)->len = len;
        (*e)->expires_ns = expires;
        (*e)->revision = ++m->sets;
    } else {
        entry_t *ne = malloc(sizeof *ne);
        char *k = strdup(key);
        if (!ne || !k) {
            free(ne);
            free(k);
            rc = PC_ENOMEM;
        } else {
            *ne = (entry_t){NULL, k, copy, len, expires, ++m->sets};
            *e = ne;
            m->n++;
            m->bytes += kl + len;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (rc)
        free(copy);
    return rc;
}

static int mem_set(void *ctx, const char *key, const void *value, size_t len, bool if_absent,
                   uint32_t lease_ms) {
    return mem_put(ctx, key, value, len, (cond_t){if_absent, 0}, lease_ms);
}

static int mem_set_if(void *ctx, const char *key, const void *value, size_t len, uint64_t revision,
                      uint32_t lease_ms) {
    return mem_put(ctx, key, value, len, (cond_t){revision == 0, revision}, lease_ms);
}

static int mem_get_rev(void *ctx, const char *key, void **value, size_t *len, uint64_t *revision) {
    mem_t *m = ctx;
    pthread_mutex_lock(&m->mu);
    entry_t *e = *live_slot(m, key, pc_time_mono_ns());
    int rc = PC_ENOTFOUND;
    if (e) {
        *value = pc_kv_dup(e->value, e->len);
        rc = *value ? 0 : PC_ENOMEM;
        if (!rc)
            *len = e->len;
        if (!rc && revision)
            *revision = e->revision;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int mem_get(void *ctx, const char *key, void **value, size_t *len) {
    return mem_get_rev(ctx, key, value, len, NULL);
}

static int by_entry_key(const void *a, const void *b) {
    return strcmp((*(const entry_t *const *)a)->key, (*(const entry_t *const *)b)->key);
}

/* Under the mutex: the live entries under the prefix are collected as pointers and sorted, and
 * only the first max of them (and at most PS_COORD_LIST_BYTES of values) are copied. */
static int mem_list(void *ctx, const char *prefix, size_t max, pc_kv_entry_t **out, size_t *n,
                    bool *truncated) {
    mem_t *m = ctx;
    const size_t pl = strlen(prefix);
    pthread_mutex_lock(&m->mu);
    const uint64_t now = pc_time_mono_ns();
    purge(m, now);
    entry_t **hits = malloc((m->n ? m->n : 1) * sizeof *hits);
    pc_kv_entry_t *v = NULL;
    size_t nh = 0, k = 0, bytes = 0;
    int rc = hits ? 0 : PC_ENOMEM;
    for (size_t i = 0; i < NBUCKETS && !rc; i++)
        for (entry_t *e = m->b[i]; e; e = e->next)
            if (strncmp(e->key, prefix, pl) == 0)
                hits[nh++] = e;
    if (!rc) {
        qsort(hits, nh, sizeof *hits, by_entry_key);
        v = calloc(nh < max ? (nh ? nh : 1) : (max ? max : 1), sizeof *v);
        rc = v ? 0 : PC_ENOMEM;
    }
    for (; !rc && k < nh && k < max && bytes + hits[k]->len <= PS_COORD_LIST_BYTES; k++) {
        const entry_t *e = hits[k];
        rc = pc_kv_entry_fill(&v[k], e->key, strlen(e->key), e->value, e->len);
        bytes += e->len;
        v[k].revision = e->revision;
        if (e->expires_ns) {
            const uint64_t left = (e->expires_ns - now + 999999u) / 1000000u;
            v[k].lease_left_ms = left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
        }
    }
    pthread_mutex_unlock(&m->mu);
    free(hits);
    if (rc) {
        pc_kv_entries_free(v, k); /* k counts the entry that failed too */
        return rc;
    }
    *truncated = k < nh;
    *out = v;
    *n = k;
    return 0;
}

static void mem_destroy(void *ctx) {
    mem_t *m = ctx;
    for (size_t i = 0; i < NBUCKETS; i++)
        for (entry_t *e = m->b[i], *nx; e; e = nx) {
            nx = e->next;
            free(e->key);
            free(e->value);
            free(e);
        }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int ps_coord_store_memory(ps_coord_store_t *out) {
    mem_t *m = calloc(1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    pthread_mutex_init(&m->mu, NULL);
    /* revisions go on from a random point in [2^60, 2^61): a coordinator started again (empty)
     * gives a revision a client may still hold from before (its compare-and-set would match)
     * with a chance of its sets in 2^60. They went on from the wall clock's nanoseconds, which
     * a clock stepped back (NTP, a VM restored) would give again. */
    uint64_t r;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = pc_time_wall_ns() ^ pc_time_mono_ns() << 20 ^ (uint64_t)getpid() << 40;
    m->sets = (r >> 4) | (UINT64_C(1) << 60);
    *out = (ps_coord_store_t){.ctx = m,
                              .set = mem_set,
                              .get = mem_get,
                              .get_rev = mem_get_rev,
                              .set_if = mem_set_if,
                              .list = mem_list,
                              .destroy = mem_destroy};
    return 0;
}
