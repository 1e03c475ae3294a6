/* ps_catalog.c: named tables with reference counts, and which job owns each (ps_catalog.h).
 *
 * DESIGN: a mutex-protected array of entries {table, refs, dropped}. The mutex guards only the
 * name space and the counts; table operations run outside it. A dropped entry stays in the array
 * (invisible to lookups) until its last reference goes. Claims hold `claim_mu` from reading the
 * owner to writing it (or swapping in the reset table), so two workers of one job racing with
 * --fresh reset the table once: the second finds its own job as the owner; drops and installs
 * (create, replace, a live restore) take it too, so a claim's owner lands on the table it read,
 * never on one dropped or replaced meanwhile (order: claim_mu, then mu). A reset swaps the new
 * table into the old one's entry under `mu` in one step: a caller sees the old or the new table,
 * never no table.
 */
#include "ps_catalog.h"

#include "pc_error.h"
#include "pc_log.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    ps_table_t *t;
    size_t refs;
    bool dropped;
} entry_t;

struct ps_catalog {
    pthread_mutex_t mu;
    pthread_mutex_t claim_mu; /* serializes claims; taken before mu */
    entry_t *e;
    size_t n, cap;
    ps_catalog_hooks_t hooks;
    bool has_hooks;
    size_t log_entries; /* capacity of a change log a follower starts (0: none is started) */
    atomic_uint_least64_t changes; /* ps_catalog_changes */
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

void ps_catalog_set_changelog(ps_catalog_t *c, size_t entries) {
    pthread_mutex_lock(&c->mu);
    c->log_entries = entries;
    pthread_mutex_unlock(&c->mu);
}

int ps_catalog_changelog_start(ps_catalog_t *c, ps_table_t *t, ps_changelog_t **out,
                               bool *started) {
    if (started)
        *started = false;
    *out = ps_table_changelog(t);
    if (*out)
        return 0;
    pthread_mutex_lock(&c->mu);
    const size_t entries = c->log_entries;
    pthread_mutex_unlock(&c->mu);
    return entries ? ps_table_changelog_start(t, entries, out, started) : PC_EUNSUPPORTED;
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
    if (!rc) /* its place is taken now: attaches that run meanwhile see the array fuller */
        c->pending[c->npending++] = t;
    pthread_mutex_unlock(&c->mu);
    if (!rc && (rc = c->hooks.attach(c->hooks.ctx, t, keep)))
        unpend(c, t);
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
    pthread_mutex_init(&c->claim_mu, NULL);
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
    pthread_mutex_destroy(&c->claim_mu);
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

int ps_catalog_spec_parse(const char *spec, ps_table_config_t *cfg, char *err, size_t errlen) {
    size_t n;
    const pc_setting_t *tab = ps_table_settings(&n);
    ps_table_config_t tmp;
    char msg[256];
    ps_table_config_defaults(&tmp);
    tmp.name[0] = '\0'; /* a served table has no default name: the spec gives it */
    int rc = pc_settings_parse_list(tab, n, &tmp, spec, msg, sizeof msg);
    if (!rc && !tmp.name[0]) {
        snprintf(msg, sizeof msg, "name= is required");
        rc = PC_EINVAL;
    }
    if (!rc)
        rc = ps_table_config_check(&tmp, msg, sizeof msg);
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "table spec '%s': %s", spec ? spec : "", msg);
        return PC_EINVAL;
    }
    *cfg = tmp;
    return 0;
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

/* Take t for c (put, replace): attached now unless the caller attached it, no longer pending.
 * On failure t is destroyed. */
static int adopt(ps_catalog_t *c, ps_table_t *t) {
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
    if (rc)
        destroy_table(c, t);
    return rc;
}

/* Room for one more entry (under c->mu); *e (an entry, or NULL) kept pointing at the same
 * entry. */
/* Room for one more entry; with `limited`, a new name (e NULL) only below PS_CATALOG_TABLES_MAX
 * live tables. */
static int room_for_one(ps_catalog_t *c, entry_t **e, bool limited) {
    size_t live = 0;
    for (size_t i = 0; limited && !*e && i < c->n; i++)
        live += !c->e[i].dropped;
    if (live >= PS_CATALOG_TABLES_MAX)
        return PC_ETOOBIG;
    if (c->n < c->cap)
        return 0;
    const size_t ncap = c->cap ? 2 * c->cap : 8;
    entry_t *ne = realloc(c->e, ncap * sizeof *ne);
    if (!ne)
        return PC_ENOMEM;
    if (*e)
        *e = ne + (*e - c->e);
    c->e = ne;
    c->cap = ncap;
    return 0;
}

/* A table installed over `old` of the same owner keeps the higher generation fence of the two:
 * a live restore of an older checkpoint must not let the job's left-behind generations push
 * again. */
static void keep_fence(const ps_table_t *old, ps_table_t *t) {
    char a[PS_OWNER_MAX], b[PS_OWNER_MAX];
    ps_table_owner(old, a, sizeof a);
    ps_table_owner(t, b, sizeof b);
    if (a[0] && strcmp(a, b) == 0)
        ps_table_raise_fence(t, ps_table_fence(old));
}

/* t under its name: in place of the live table of that name (may_replace: in one step, an
 * acquire sees the old table or t, never none; the old one is destroyed once its last holder
 * releases it) or as a new one (may_add). Takes ownership of t (destroyed on failure).
 * PC_EEXIST, PC_ENOTFOUND (the case not allowed), PC_ETOOBIG (a new name with `limited`, and
 * the catalog full), PC_ENOMEM. */
static int install(ps_catalog_t *c, ps_table_t *t, bool may_replace, bool may_add, bool limited) {
    int rc = adopt(c, t);
    if (rc)
        return rc;
    ps_table_t *dead = NULL;
    pthread_mutex_lock(&c->claim_mu); /* a claim's owner goes on the table it read */
    pthread_mutex_lock(&c->mu);
    entry_t *e = find_live(c, ps_table_config(t)->name);
    if (e ? !may_replace : !may_add)
        rc = e ? PC_EEXIST : PC_ENOTFOUND;
    else
        rc = room_for_one(c, &e, limited);
    if (!rc) {
        if (e) {
            e->dropped = true;
            keep_fence(e->t, t);
        }
        c->e[c->n++] = (entry_t){t, 0, false};
        atomic_fetch_add(&c->changes, 1);
        if (e && e->refs == 0)
            dead = take_entry(c, (size_t)(e - c->e));
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->claim_mu);
    destroy_table(c, rc ? t : dead);
    return rc;
}

int ps_catalog_put(ps_catalog_t *c, ps_table_t *t) {
    return install(c, t, false, true, true);
}

int ps_catalog_set(ps_catalog_t *c, ps_table_t *t) {
    return install(c, t, true, true, false); /* (a restore: every table it has) */
}

int ps_catalog_reserve(ps_catalog_t *c, size_t more) {
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->n + more > c->cap) {
        size_t ncap = c->cap ? c->cap : 8;
        while (ncap < c->n + more)
            ncap *= 2;
        entry_t *ne = realloc(c->e, ncap * sizeof *ne);
        if (ne) {
            c->e = ne;
            c->cap = ncap;
        } else {
            rc = PC_ENOMEM;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uint64_t ps_catalog_changes(ps_catalog_t *c) {
    return atomic_load(&c->changes);
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
    pthread_mutex_lock(&c->claim_mu); /* as install's */
    pthread_mutex_lock(&c->mu);
    entry_t *e = find_live(c, name);
    if (e) {
        rc = 0;
        e->dropped = true;
        atomic_fetch_add(&c->changes, 1);
        if (e->refs == 0)
            dead = take_entry(c, (size_t)(e - c->e));
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->claim_mu);
    destroy_table(c, dead);
    return rc;
}

/* ==== claims ================================================================================ */

const char *ps_claim_action_name(ps_claim_action_t a) {
    static const char *const names[] = {"new", "continued", "warm_started", "reset", "none"};
    return (unsigned)a < sizeof names / sizeof names[0] ? names[a] : "unknown";
}

/* Replace `old` (acquired by the caller, who still releases it) by an empty table of the same
 * settings owned by `job`. */
static int reset_table(ps_catalog_t *c, ps_table_t *old, const char *job, char *err,
                       size_t errlen) {
    const ps_table_config_t *cfg = ps_table_config(old);
    if (cfg->cold) {
        snprintf(err, errlen,
                 "table %s spills to the cold tier and cannot be reset while serving: drop it "
                 "and create it again",
                 cfg->name);
        return PC_ESTATE;
    }
    ps_table_t *t;
    int rc = ps_table_create(cfg, &t);
    if (!rc && (rc = ps_table_set_owner(t, job)))
        ps_table_destroy(t);
    if (!rc && (rc = ps_catalog_attach(c, t, false)))
        ps_table_destroy(t);
    if (rc) {
        snprintf(err, errlen, "table %s: cannot create its empty replacement: %s", cfg->name,
                 pc_strerror(rc));
        return rc;
    }
    unpend(c, t);
    pthread_mutex_lock(&c->mu);
    entry_t *e = NULL;
    for (size_t i = 0; i < c->n && !e; i++)
        if (c->e[i].t == old && !c->e[i].dropped)
            e = &c->e[i];
    if (e)
        rc = room_for_one(c, &e, true);
    if (!e && !rc)
        rc = PC_ENOTFOUND; /* dropped meanwhile */
    if (!rc) {
        e->dropped = true; /* the caller's reference keeps it until released */
        c->e[c->n++] = (entry_t){t, 0, false};
        atomic_fetch_add(&c->changes, 1);
    }
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        destroy_table(c, t);
        snprintf(err, errlen, "table %s: reset failed: %s", cfg->name, pc_strerror(rc));
    }
    return rc;
}

int ps_catalog_claim(ps_catalog_t *c, const char *name, const char *job, ps_claim_mode_t mode,
                     uint32_t epoch, ps_claim_result_t *out, char *err, size_t errlen) {
    if (!c || !name || !job || !out || strlen(job) >= PS_OWNER_MAX ||
        (!job[0] && mode != PS_CLAIM_FRESH && mode != PS_CLAIM_INSPECT) ||
        (unsigned)mode > PS_CLAIM_FENCE || (mode == PS_CLAIM_FENCE) != (epoch != 0)) {
        snprintf(err, errlen, "bad claim of table %s", name ? name : "(null)");
        return PC_EINVAL;
    }
    pthread_mutex_lock(&c->claim_mu);
    ps_table_t *t;
    int rc = ps_catalog_acquire(c, name, &t);
    if (rc) {
        pthread_mutex_unlock(&c->claim_mu);
        snprintf(err, errlen, "no table %s", name);
        return rc;
    }
    memset(out, 0, sizeof *out);
    ps_table_owner(t, out->previous, sizeof out->previous);
    out->rows = ps_table_count(t);
    out->version = ps_table_version(t);
    if (mode == PS_CLAIM_INSPECT) {
        out->action = PS_CLAIMED_NONE;
    } else if (mode == PS_CLAIM_FENCE) {
        out->action = PS_CLAIMED_CONTINUED;
        const uint32_t at = ps_table_fence(t);
        if (strcmp(out->previous, job)) {
            rc = PC_EOWNED;
            snprintf(err, errlen, "table %s holds rows of job '%s', not of '%s' that fences it",
                     name, out->previous, job);
        } else if (epoch < at) { /* a left-behind generation, or generations counted again */
            rc = PC_EFENCED;
            snprintf(err, errlen, "table %s is fenced at generation epoch %u, above %u", name, at,
                     epoch);
        } else {
            ps_table_raise_fence(t, epoch);
        }
    } else if (job[0] && strcmp(out->previous, job) == 0) {
        out->action = PS_CLAIMED_CONTINUED;
    } else if (mode == PS_CLAIM_FRESH) {
        out->action = PS_CLAIMED_RESET;
        rc = reset_table(c, t, job, err, errlen);
    } else if (mode == PS_CLAIM_WARM_START || (!out->previous[0] && out->version == 0)) {
        out->action = mode == PS_CLAIM_WARM_START ? PS_CLAIMED_WARM_STARTED : PS_CLAIMED_NEW;
        rc = ps_table_set_owner(t, job);
    } else {
        rc = PC_EOWNED;
        if (out->previous[0])
            snprintf(err, errlen,
                     "table %s holds rows of job '%s' (%" PRIu64 " rows, %" PRIu64 " pushes)", name,
                     out->previous, out->rows, out->version);
        else
            snprintf(err, errlen,
                     "table %s holds rows that a client which claimed no job trained (%" PRIu64
                     " rows, %" PRIu64 " pushes)",
                     name, out->rows, out->version);
    }
    ps_catalog_release(c, t);
    pthread_mutex_unlock(&c->claim_mu);
    if (!rc && out->action != PS_CLAIMED_CONTINUED && out->action != PS_CLAIMED_NONE)
        PC_INFO("table %s: claimed by %s (%s; before: owner '%s', %" PRIu64 " rows, %" PRIu64
                " pushes)",
                name, job[0] ? job : "nobody", ps_claim_action_name(out->action), out->previous,
                out->rows, out->version);
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
    if (cap)
        qsort(names, total < cap ? total : cap, PS_TABLE_NAME_MAX, cmp_name);
    return total;
}

int ps_catalog_each(ps_catalog_t *c, int (*fn)(void *ctx, ps_table_t *t), void *ctx) {
    size_t n = ps_catalog_list(c, NULL, 0);
    char(*names)[PS_TABLE_NAME_MAX] = n ? calloc(n, sizeof *names) : NULL;
    if (n && !names)
        return PC_ENOMEM;
    const size_t got = ps_catalog_list(c, names, n); /* tables added meanwhile: not this pass */
    int rc = 0;
    for (size_t i = 0; !rc && i < got && i < n; i++) {
        ps_table_t *t;
        if (ps_catalog_acquire(c, names[i], &t))
            continue; /* dropped meanwhile */
        rc = fn(ctx, t);
        ps_catalog_release(c, t);
    }
    free(names);
    return rc;
}

int ps_catalog_replace(ps_catalog_t *c, ps_table_t *t) {
    return install(c, t, true, false, true);
}
