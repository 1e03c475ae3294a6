/* ps_catalog.c: named tables with reference counts (see ps_catalog.h).
 *
 * DESIGN: a mutex-protected array of entries {table, refs, dropped}. The mutex guards only the
 * name space and the counts; table operations run outside it. A dropped entry stays in the array
 * (invisible to lookups) until its last reference goes.
 */
#include "ps_catalog.h"

#include "pc_error.h"
#include "pc_log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    ps_table_t *t;
    size_t refs;
    bool dropped;
} entry_t;

struct ps_catalog {
    pthread_mutex_t mu;
    entry_t *e;
    size_t n, cap;
    ps_catalog_hooks_t hooks;
    bool has_hooks;
    /* tables attached but not put yet (restore, import): put does not attach them again */
    ps_table_t **pending;
    size_t npending, pending_cap;
};

void ps_catalog_set_hooks(ps_catalog_t *c, const ps_catalog_hooks_t *h) {
    c->hooks = *h;
    c->has_hooks = true;
}

/* Remove t from the pending list; true if it was there. */
static bool unpend(ps_catalog_t *c, ps_table_t *t) {
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->npending; i++) {
        if (c->pending[i] == t) {
            c->pending[i] = c->pending[--c->npending];
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

int ps_catalog_attach(ps_catalog_t *c, ps_table_t *t, bool keep) {
    if (!c->has_hooks) {
        if (ps_table_config(t)->cold) {
            PC_ERROR("table %s: cold=true needs a server with a cold tier",
                     ps_table_config(t)->name);
            return PC_EINVAL;
        }
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->npending == c->pending_cap) {
        size_t ncap = c->pending_cap ? 2 * c->pending_cap : 8;
        ps_table_t **p = realloc(c->pending, ncap * sizeof *p);
        if (!p)
            rc = PC_ENOMEM;
        else {
            c->pending = p;
            c->pending_cap = ncap;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (!rc)
        rc = c->hooks.attach(c->hooks.ctx, t, keep);
    if (!rc) {
        pthread_mutex_lock(&c->mu);
        c->pending[c->npending++] = t;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

/* Destroy a table that leaves for good. */
static void destroy_table(ps_catalog_t *c, ps_table_t *t) {
    if (t && c->has_hooks)
        c->hooks.detach(c->hooks.ctx, t);
    ps_table_destroy(t);
}

void ps_catalog_discard(ps_catalog_t *c, ps_table_t *t) {
    if (!t)
        return;
    unpend(c, t);
    destroy_table(c, t);
}

int ps_catalog_create(ps_catalog_t **out) {
    ps_catalog_t *c = calloc(1, sizeof *c);
    if (!c)
        return PC_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

void ps_catalog_destroy(ps_catalog_t *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        destroy_table(c, c->e[i].t);
    for (size_t i = 0; i < c->npending; i++)
        destroy_table(c, c->pending[i]);
    free(c->pending);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Live entry named `name`, or NULL. Caller holds mu. */
static entry_t *find_live(ps_catalog_t *c, const char *name) {
    for (size_t i = 0; i < c->n; i++)
        if (!c->e[i].dropped && strcmp(ps_table_config(c->e[i].t)->name, name) == 0)
            return &c->e[i];
    return NULL;
}

/* Remove entry i (caller holds mu) and return its table for destruction outside the lock. */
static ps_table_t *take_entry(ps_catalog_t *c, size_t i) {
    ps_table_t *t = c->e[i].t;
    c->e[i] = c->e[--c->n];
    return t;
}

int ps_catalog_add(ps_catalog_t *c, const ps_table_config_t *cfg) {
    if (!c || !cfg)
        return PC_EINVAL;
    ps_table_t *t;
    int rc = ps_table_create(cfg, &t);
    if (rc)
        return rc;
    return ps_catalog_put(c, t);
}

int ps_catalog_put(ps_catalog_t *c, ps_table_t *t) {
    if (!c || !t) {
        ps_table_destroy(t);
        return PC_EINVAL;
    }
    int rc = 0;
    if (!unpend(c, t)) { /* not attached by the caller: attach now */
        rc = ps_catalog_attach(c, t, false);
        if (!rc)
            unpend(c, t);
    }
    if (rc) {
        destroy_table(c, t);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    if (find_live(c, ps_table_config(t)->name)) {
        rc = PC_EEXIST;
    } else if (c->n == c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 8;
        entry_t *e = realloc(c->e, ncap * sizeof *e);
        if (!e)
            rc = PC_ENOMEM;
        else {
            c->e = e;
            c->cap = ncap;
        }
    }
    if (!rc)
        c->e[c->n++] = (entry_t){t, 0, false};
    pthread_mutex_unlock(&c->mu);
    if (rc)
        destroy_table(c, t);
    return rc;
}

int ps_catalog_acquire(ps_catalog_t *c, const char *name, ps_table_t **out) {
    if (!c || !name || !out)
        return PC_EINVAL;
    pthread_mutex_lock(&c->mu);
    entry_t *e = find_live(c, name);
    if (e) {
        e->refs++;
        *out = e->t;
    }
    pthread_mutex_unlock(&c->mu);
    return e ? 0 : PC_ENOTFOUND;
}

void ps_catalog_release(ps_catalog_t *c, ps_table_t *t) {
    if (!c || !t)
        return;
    ps_table_t *dead = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        if (c->e[i].t == t) {
            if (--c->e[i].refs == 0 && c->e[i].dropped)
                dead = take_entry(c, i);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    destroy_table(c, dead);
}

int ps_catalog_drop(ps_catalog_t *c, const char *name) {
    if (!c || !name)
        return PC_EINVAL;
    ps_table_t *dead = NULL;
    int rc = PC_ENOTFOUND;
    pthread_mutex_lock(&c->mu);
    entry_t *e = find_live(c, name);
    if (e) {
        rc = 0;
        e->dropped = true;
        if (e->refs == 0)
            dead = take_entry(c, (size_t)(e - c->e));
    }
    pthread_mutex_unlock(&c->mu);
    destroy_table(c, dead);
    return rc;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(a, b);
}

size_t ps_catalog_list(ps_catalog_t *c, char (*names)[PS_TABLE_NAME_MAX], size_t cap) {
    size_t total = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        if (c->e[i].dropped)
            continue;
        if (total < cap)
            memcpy(names[total], ps_table_config(c->e[i].t)->name, PS_TABLE_NAME_MAX);
        total++;
    }
    pthread_mutex_unlock(&c->mu);
    qsort(names, total < cap ? total : cap, PS_TABLE_NAME_MAX, cmp_name);
    return total;
}
