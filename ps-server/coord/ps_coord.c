/* ps_coord.c: the in-process coordinator store (see ps_coord.h): a chained hash table under one
 * mutex (the coordinator's traffic is a few calls per worker step at most). */
#include "ps_coord.h"

#include "pc_error.h"
#include "pc_hash.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 4096

typedef struct entry {
    struct entry *next;
    char *key;
    void *value;
    size_t len;
} entry_t;

typedef struct mem {
    pthread_mutex_t mu;
    entry_t *b[NBUCKETS];
    size_t n, bytes;
} mem_t;

static entry_t **slot(mem_t *m, const char *key) {
    entry_t **e = &m->b[pc_hash64(key, strlen(key), 0) % NBUCKETS];
    while (*e && strcmp((*e)->key, key) != 0)
        e = &(*e)->next;
    return e;
}

static int mem_set(void *ctx, const char *key, const void *value, size_t len, bool if_absent) {
    mem_t *m = ctx;
    const size_t kl = key ? strlen(key) : 0;
    if (kl == 0)
        return PC_EINVAL;
    if (kl > PS_COORD_KEY_MAX || len > PS_COORD_VALUE_MAX)
        return PC_ETOOBIG;
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return PC_ENOMEM;
    if (len)
        memcpy(copy, value, len);
    pthread_mutex_lock(&m->mu);
    entry_t **e = slot(m, key);
    int rc = 0;
    const size_t grow = *e ? len - (*e)->len : kl + len; /* may wrap: a shrink */
    if (*e && if_absent) {
        rc = PC_EEXIST;
    } else if (m->bytes + grow > PS_COORD_BYTES_MAX && (!*e || len > (*e)->len)) {
        rc = PC_EFULL;
    } else if (*e) {
        free((*e)->value);
        (*e)->value = copy;
        (*e)->len = len;
        m->bytes += grow;
    } else if (m->n >= PS_COORD_KEYS_MAX) {
        rc = PC_EFULL;
    } else {
        entry_t *ne = malloc(sizeof *ne);
        char *k = strdup(key);
        if (!ne || !k) {
            free(ne);
            free(k);
            rc = PC_ENOMEM;
        } else {
            *ne = (entry_t){NULL, k, copy, len};
            *e = ne;
            m->n++;
            m->bytes += grow;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (rc)
        free(copy);
    return rc;
}

static int mem_get(void *ctx, const char *key, void **value, size_t *len) {
    mem_t *m = ctx;
    pthread_mutex_lock(&m->mu);
    entry_t *e = *slot(m, key);
    int rc = PC_ENOTFOUND;
    if (e) {
        *value = malloc(e->len ? e->len : 1);
        rc = *value ? 0 : PC_ENOMEM;
        if (!rc) {
            memcpy(*value, e->value, e->len);
            *len = e->len;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
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
    *out = (ps_coord_store_t){m, mem_set, mem_get, mem_destroy};
    return 0;
}
