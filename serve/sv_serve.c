/* sv_serve.c: see sv_serve.h. The served object and its reference count, the live state
 * (sparse rows, follower, the newest dense model taken), versions loaded aside and swapped in,
 * new layouts of the live rows after the training servers' map changed.
 *
 * DESIGN
 * - Two references are the replica's own: `cur` (what requests get) and `live` (the live state's
 *   object, also while a version is pinned); they may be the same object. Every other reference
 *   is a request's. Whoever drops an object's last reference puts it in the graveyard; the
 *   owner's tick frees it on a nice-19 thread. A pinned object owns its sparse state, a live one
 *   borrows the replica's.
 * - swap_mu serializes the swaps (tick, pin, follow): loads run under it but never under `mu`,
 *   which requests take only to copy a pointer and count.
 * - The live watermark: a live object's positions are the follower's at the moment a request
 *   reads them (before it reads rows), so a reply's positions are a lower bound of what its rows
 *   reflect.
 * - Live rows (live_rows_t: a replica in one layout and its follower) are counted: the
 *   replica's current ones and every live object hold a reference. When the follower says its
 *   layout is stale (sv_follow_stale: a failover or a resharding gave slots other primaries),
 *   the tick builds rows of the newest map aside (`next`: a replica with the rows of servers
 *   whose slots did not move copied from the current one and followed from the same positions,
 *   sv_follow_unmoved, and a follower that scans the other primaries), starts over when that
 *   map is stale in turn, and once they hold every row
 *   (sv_follow_ready; a table no server has any more gets the current rows of it, carry_gone)
 *   swaps in a live object of the same dense model over them. The old rows
 *   keep following and serving until then, and are freed (their follower stopped) with the last
 *   object that reads them. A published model waits for rows of the current layout.
 */
#include "sv_serve.h"

#include "pc_error.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_metrics.h"
#include "pc_time.h"
#include "ps_ckpt.h"
#include "sv_follow.h"
#include "sv_sparse.h"
#include "sv_version.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Live rows: a replica of the training servers in one layout and its follower (see DESIGN). */
typedef struct live_rows {
    sv_sparse_t *sparse;
    sv_follow_t *follower;
    atomic_int refs;
} live_rows_t;

struct sv_served {
    int refs;            /* under the replica's mu */
    sv_model_t *model;   /* a reference */
    sv_sparse_t *sparse; /* owned when pinned; live: rows->sparse */
    live_rows_t *rows;   /* live: a reference */
    bool pinned;
    size_t npos;
    uint64_t *pos; /* pinned: the version's positions per server */
    sv_serve_t *owner;
    sv_served_t *next_dead; /* in the replica's graveyard */
};

struct sv_serve {
    char name[128], follow[4096], publish_dir[SV_PATH_MAX], versions_dir[SV_PATH_MAX];
    char token[256], tls_ca[SV_PATH_MAX], tls_cert[SV_PATH_MAX], tls_key[SV_PATH_MAX];
    int evaluators, max_batch, timeout_ms;
    pw_backend_t *be;
    pthread_mutex_t device_mu; /* every model's use of a device backend (sv_model_opts_t) */
    sv_follow_opts_t fo;

    pthread_mutex_t mu; /* cur, live, the reference counts, the graveyard */
    sv_served_t *cur, *live;
    sv_served_t *graveyard; /* objects no one holds, freed by the owner's tick */

    pthread_mutex_t swap_mu; /* one swap at a time; what follows is under it */
    live_rows_t *rows;       /* the live rows (a reference); NULL: not following */
    live_rows_t *next;       /* rows of a new layout being built (a reference), NULL */
    live_rows_t *dropped;    /* a new layout given up, released once swap_mu is let go (its
                              * follower's threads are joined: up to --timeout-ms) */
    uint64_t next_since_ns, next_said_ns; /* next waited since (0: not yet looked), said then */
    /* (rows, next, tables_next_ns: written by the tick only, under swap_mu; the tick reads them
     * without it) */
    uint64_t live_seen;         /* newest published step looked at (taken or refused) */
    uint64_t pub_taken;         /* the published step served (0: none; a version's is not) */
    sv_dir_id_t pub_dir;        /* its directory when it was taken (ino 0: unknown) */
    int back_ticks;             /* ticks in a row that found every published step older */
    uint64_t relayout_retry_ns; /* a new layout that failed to start is tried again then */
    uint64_t tables_next_ns;    /* fetch_tables asks the servers again then */
    uint64_t tables_seen_ns;    /* the servers' tables last answered with no new layout coming */
    bool said_unreadable;       /* said that a line of the servers' tables could not be read */
    uint64_t absent_step;       /* a published step whose table the replica lacks, and since */
    uint64_t absent_since_ns;   /* when (refused once the servers' tables answered since) */
    atomic_uint_least64_t relayouts, map_version;

    atomic_uint_least64_t predictions, swaps, refused;
    pthread_mutex_t refusal_mu;
    char last_refusal[256];
};

/* ---- live rows ----------------------------------------------------------------------------- */
static live_rows_t *rows_ref(live_rows_t *r) {
    if (r)
        atomic_fetch_add(&r->refs, 1);
    return r;
}

/* Drop a reference; the last stops the follower (bounded by its timeout_ms) and frees. */
static void rows_unref(live_rows_t *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) > 1)
        return;
    sv_follow_destroy(r->follower);
    sv_sparse_destroy(r->sparse);
    free(r);
}

static sv_follow_auth_t auth_of(const sv_serve_t *s) {
    return (sv_follow_auth_t){
        .token = s->token, .tls_ca = s->tls_ca, .tls_cert = s->tls_cert, .tls_key = s->tls_key};
}

/* Live rows over `sparse` (taken, also on failure), followed from starts[0..n) (none: scans),
 * the follower started. */
static int rows_start(sv_serve_t *s, sv_sparse_t *sparse, const sv_sparse_start_t *starts, size_t n,
                      live_rows_t **out) {
    live_rows_t *r = calloc(1, sizeof *r);
    if (!r) {
        sv_sparse_destroy(sparse);
        return PC_ENOMEM;
    }
    r->sparse = sparse;
    atomic_init(&r->refs, 1);
    const sv_follow_auth_t auth = auth_of(s);
    int rc = sv_follow_create(sparse, &s->fo, &auth, starts, n, &r->follower);
    if (!rc)
        rc = sv_follow_start(r->follower);
    if (rc) {
        rows_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* ---- served objects ----------------------------------------------------------------------------
 */
static void served_destroy(sv_served_t *x) {
    if (!x)
        return;
    sv_model_destroy(x->model);
    if (x->pinned)
        sv_sparse_destroy(x->sparse);
    rows_unref(x->rows);
    free(x->pos);
    free(x);
}

/* Drop one reference (under mu); returns the object when it was the last. */
static sv_served_t *unref_locked(sv_served_t *x) {
    return x && --x->refs == 0 ? x : NULL;
}

/* An object no one holds any more goes to the graveyard (under mu): freeing a pinned version's
 * rows takes milliseconds, which must not land on the request that happened to hold it last, nor
 * on the swap's admin call; the owner's tick frees the graveyard at low priority. */
static void bury_locked(sv_serve_t *s, sv_served_t *x) {
    if (x) {
        x->next_dead = s->graveyard;
        s->graveyard = x;
    }
}

/* Free the graveyard (its objects are unreachable: no lock needed once taken). */
static int reap(void *arg) {
    sv_serve_t *s = arg;
    pthread_mutex_lock(&s->mu);
    sv_served_t *x = s->graveyard;
    s->graveyard = NULL;
    pthread_mutex_unlock(&s->mu);
    while (x) {
        sv_served_t *next = x->next_dead;
        served_destroy(x);
        x = next;
    }
    return 0;
}

sv_served_t *sv_serve_acquire(sv_serve_t *s) {
    pthread_mutex_lock(&s->mu);
    sv_served_t *x = s->cur;
    x->refs++;
    pthread_mutex_unlock(&s->mu);
    return x;
}

void sv_serve_release(sv_serve_t *s, sv_served_t *x) {
    pthread_mutex_lock(&s->mu);
    bury_locked(s, unref_locked(x));
    pthread_mutex_unlock(&s->mu);
}

sv_model_t *sv_served_model(const sv_served_t *x) {
    return x->model;
}

bool sv_served_pinned(const sv_served_t *x) {
    return x->pinned;
}

int sv_served_lookup(sv_served_t *x, const char *table, const uint64_t *keys, size_t n, float *rows,
                     size_t rows_len, uint8_t *found) {
    return sv_sparse_lookup(x->sparse, table, keys, n, rows, rows_len, found);
}

sv_sparse_t *sv_served_sparse(sv_served_t *x) {
    return x->sparse;
}

uint32_t sv_served_dim(sv_served_t *x, const char *table) {
    ps_table_config_t c;
    return sv_sparse_table_config(x->sparse, table, &c) ? 0 : (uint32_t)c.dim;
}

size_t sv_served_positions(sv_served_t *x, uint64_t *pos, size_t cap) {
    if (x->pinned) {
        const size_t n = x->npos < cap ? x->npos : cap;
        memcpy(pos, x->pos, n * sizeof *pos);
        return n;
    }
    if (!x->model || !x->rows)
        return 0;
    uint64_t uids[SV_SERVE_SOURCES_MAX];
    const int n = sv_follow_positions(x->rows->follower, sv_model_card(x->model)->table_name, uids,
                                      pos, cap < SV_SERVE_SOURCES_MAX ? cap : SV_SERVE_SOURCES_MAX);
    return n > 0 ? (size_t)(n < (int)cap ? n : (int)cap) : 0;
}

const char *sv_serve_name(const sv_serve_t *s) {
    return s->name;
}

void sv_serve_count(sv_serve_t *s, uint64_t samples) {
    atomic_fetch_add_explicit(&s->predictions, samples, memory_order_relaxed);
}

/* Make x what requests get (and, when live, the live object); the replaced ones lose the
 * replica's reference. x arrives with one reference per role it takes. */
static void install(sv_serve_t *s, sv_served_t *cur, sv_served_t *live) {
    pthread_mutex_lock(&s->mu);
    if (cur) {
        bury_locked(s, unref_locked(s->cur));
        s->cur = cur;
    }
    if (live) {
        bury_locked(s, unref_locked(s->live));
        s->live = live;
    }
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->swaps, 1);
}

static void refuse(sv_serve_t *s, const char *what, const char *why) {
    atomic_fetch_add(&s->refused, 1);
    pthread_mutex_lock(&s->refusal_mu);
    snprintf(s->last_refusal, sizeof s->last_refusal, "%s: %s", what, why);
    pthread_mutex_unlock(&s->refusal_mu);
    PC_ERROR("serve: refused %s: %s (the current model keeps serving)", what, why);
}

/* The model of dir, checked against the rows it will read: its table in `sparse` with the
 * card's row width, and (when `like` is given) the same shape as the model served now. */
static int load_model(sv_serve_t *s, const char *dir, uint64_t step, sv_sparse_t *sparse,
                      const sv_model_t *like, sv_model_t **out, char *why, size_t cap) {
    sv_model_opts_t mo = {.dir = dir,
                          .step = step,
                          .evaluators = s->evaluators,
                          .max_batch = s->max_batch,
                          .be = s->be,
                          .device_mu = &s->device_mu};
    int rc = sv_model_load(&mo, out, why, cap);
    if (rc)
        return rc;
    const pw_model_card_t *c = sv_model_card(*out);
    ps_table_config_t tc;
    if (sv_sparse_table_config(sparse, c->table_name, &tc)) {
        snprintf(why, cap, "its table %s is not one the replica holds", c->table_name);
        rc = PC_ENOTFOUND;
    } else if (tc.dim != c->row_dim) {
        snprintf(why, cap, "its table %s has rows of %d, the replica's of %lld", c->table_name,
                 c->row_dim, (long long)tc.dim);
        rc = PC_EDIM;
    } else if (like && !sv_model_card_compatible(sv_model_card(like), c, why, cap)) {
        rc = PC_EDIM;
    }
    if (rc) {
        sv_model_destroy(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- versions
 * ------------------------------------------------------------------------------------ */
/* ---- loads at the lowest priority ------------------------------------------------------------
 * A swap's load (files read and verified, rows copied, every evaluator warmed: 0.1-0.3 s of CPU
 * for a small model) runs on a thread of its own at nice 19 while the caller waits for it, so
 * under load it takes the CPU the request threads leave and their latency does not move
 * (ps-bench serve: swap_p99_vs_steady). On an idle replica it runs at full speed. */
typedef struct niced {
    int (*fn)(void *arg);
    void *arg;
    int rc;
} niced_t;

static void *niced_main(void *p) {
    niced_t *n = p;
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19); /* this thread only */
    n->rc = n->fn(n->arg);
    return NULL;
}

static int run_niced(int (*fn)(void *), void *arg) {
    niced_t n = {.fn = fn, .arg = arg};
    pthread_t t;
    if (pthread_create(&t, NULL, niced_main, &n))
        return fn(arg); /* no thread: load at the caller's priority */
    pthread_join(t, NULL);
    return n.rc;
}

/* The tables of a server checkpoint (its manifest's settings) added to sparse, empty. */
static int add_checkpoint_tables(sv_sparse_t *sparse, const char *dir, uint64_t id, char *err,
                                 size_t cap) {
    ps_ckpt_table_info_t *t = NULL;
    size_t n = 0, got = 0;
    int rc = ps_ckpt_tables(dir, id, NULL, 0, &n); /* how many, then all of them */
    if (!rc && n)
        rc = (t = calloc(n, sizeof *t)) ? ps_ckpt_tables(dir, id, t, n, &got) : PC_ENOMEM;
    if (rc)
        snprintf(err, cap, "%s: checkpoint %" PRIu64 ": %s", dir, id, pc_strerror(rc));
    for (size_t i = 0; !rc && i < got; i++) {
        ps_table_config_t c;
        ps_table_config_defaults(&c);
        if ((rc = ps_table_config_parse(&c, t[i].config, err, cap)) == 0)
            rc = sv_sparse_add_unless_cold(sparse, &c, err, cap);
    }
    free(t);
    return rc;
}

/* Version `step` (0: newest) loaded into a pinned object of its own, once: PC_EAGAIN when its
 * directory was replaced while it loaded (its model and card may be of another write than its
 * manifest: the rows). */
static int load_version_once(sv_serve_t *s, uint64_t step, const char *followed_map,
                             const sv_model_t *like, sv_served_t **out, sv_sparse_start_t **starts,
                             size_t *nstarts, char *why, size_t cap) {
    *out = NULL;
    if (!s->versions_dir[0]) {
        snprintf(why, cap, "no versions directory (--versions)");
        return PC_ESTATE;
    }
    sv_version_t v;
    int rc = sv_version_read(s->versions_dir, step, &v, why, cap);
    if (rc)
        return rc;
    sv_served_t *x = calloc(1, sizeof *x);
    if (!x || !(x->pos = calloc(v.nservers ? v.nservers : 1, sizeof *x->pos))) {
        free(x);
        sv_version_free(&v);
        return PC_ENOMEM;
    }
    x->refs = 0;
    x->pinned = true;
    x->owner = s;
    x->npos = v.nservers;
    char err[256] = "";
    sv_sparse_start_t *st = NULL;
    size_t nst = 0;
    /* the cluster the version was cut from: its manifest's map, else the one followed (as
     * discovered at start, or the live replica's) */
    char *live_map = NULL;
    if (!v.map && !followed_map && s->rows) {
        const size_t len = sv_sparse_map_text(s->rows->sparse, NULL, 0) + 1;
        if ((live_map = malloc(len)))
            sv_sparse_map_text(s->rows->sparse, live_map, len);
    }
    const char *map = v.map ? v.map : followed_map ? followed_map : live_map;
    rc = 0;
    if (!map) {
        snprintf(err, sizeof err, "its manifest names no cluster map (follow the servers)");
        rc = PC_ECORRUPT;
    }
    if (!rc)
        rc = sv_sparse_create(map, &x->sparse, err, sizeof err);
    free(live_map);
    if (!rc && sv_sparse_servers(x->sparse) != v.nservers) {
        snprintf(err, sizeof err, "%zu servers' checkpoints for a map of %zu servers", v.nservers,
                 sv_sparse_servers(x->sparse));
        rc = PC_ECORRUPT;
    }
    if (!rc)
        rc = add_checkpoint_tables(x->sparse, v.ckpt_dirs[0], v.ckpt_ids[0], err, sizeof err);
    if (!rc)
        rc = sv_sparse_load_checkpoints(x->sparse, (const char *const *)v.ckpt_dirs, v.ckpt_ids,
                                        v.nservers, NULL, &st, &nst, err, sizeof err);
    if (rc)
        snprintf(why, cap, "version %" PRIu64 ": %s", v.step, err[0] ? err : pc_strerror(rc));
    if (!rc)
        rc = load_model(s, v.dir, v.step, x->sparse, like, &x->model, why, cap);
    if (!rc && sv_version_replaced(&v)) {
        snprintf(why, cap,
                 "version %" PRIu64 ": its directory was replaced while it loaded (the trainer "
                 "wrote the step again)",
                 v.step);
        rc = PC_EAGAIN;
    }
    if (!rc && x->model)
        for (size_t i = 0; i < nst; i++)
            if (st[i].server < x->npos &&
                strcmp(st[i].table, sv_model_card(x->model)->table_name) == 0)
                x->pos[st[i].server] = st[i].position == UINT64_MAX ? 0 : st[i].position;
    sv_version_free(&v);
    if (rc) {
        free(st);
        served_destroy(x);
        return rc;
    }
    if (starts) {
        *starts = st;
        *nstarts = nst;
    } else {
        free(st);
    }
    *out = x;
    return 0;
}

/* load_version_once, tried again (a few times) while the directory is replaced under it. */
static int load_version(sv_serve_t *s, uint64_t step, const char *followed_map,
                        const sv_model_t *like, sv_served_t **out, sv_sparse_start_t **starts,
                        size_t *nstarts, char *why, size_t cap) {
    int rc = PC_EAGAIN;
    for (int i = 0; i < 3 && rc == PC_EAGAIN; i++)
        rc = load_version_once(s, step, followed_map, like, out, starts, nstarts, why, cap);
    return rc;
}

typedef struct pin_load {
    sv_serve_t *s;
    uint64_t step;
    sv_served_t *x;
    char *why;
    size_t cap;
} pin_load_t;

static int pin_load(void *arg) {
    pin_load_t *a = arg;
    /* the model served now (stable: swaps are under swap_mu, which the caller holds): a version
     * of another shape would break its clients' requests */
    const sv_model_t *like = a->s->cur ? a->s->cur->model : NULL;
    return load_version(a->s, a->step, NULL, like, &a->x, NULL, NULL, a->why, a->cap);
}

int sv_serve_pin(sv_serve_t *s, uint64_t step, uint64_t *loaded, char *why, size_t cap) {
    pthread_mutex_lock(&s->swap_mu);
    pin_load_t a = {.s = s, .step = step, .why = why, .cap = cap};
    int rc = run_niced(pin_load, &a);
    sv_served_t *x = a.x;
    if (!rc) {
        x->refs = 1;
        *loaded = sv_model_step(x->model);
        install(s, x, NULL);
        PC_INFO("serve: version %" PRIu64 " pinned", *loaded);
    } else if (rc != PC_ESTATE && rc != PC_ENOTFOUND) {
        char what[64];
        if (step)
            snprintf(what, sizeof what, "version %" PRIu64, step);
        else
            snprintf(what, sizeof what, "the newest version");
        refuse(s, what, why);
    }
    pthread_mutex_unlock(&s->swap_mu);
    return rc;
}

int sv_serve_follow(sv_serve_t *s, uint64_t *model_step, char *why, size_t cap) {
    pthread_mutex_lock(&s->swap_mu);
    int rc = 0;
    if (!s->live) {
        snprintf(why, cap, "this replica does not follow training servers (--follow)");
        rc = PC_ESTATE;
    } else {
        pthread_mutex_lock(&s->mu);
        s->live->refs++;
        sv_served_t *x = s->live;
        pthread_mutex_unlock(&s->mu);
        *model_step = x->model ? sv_model_step(x->model) : 0;
        install(s, x, NULL);
        PC_INFO("serve: following again (dense model %" PRIu64 ")", *model_step);
    }
    pthread_mutex_unlock(&s->swap_mu);
    return rc;
}

size_t sv_serve_versions(sv_serve_t *s, sv_version_info_t *out, size_t cap) {
    uint64_t *steps = calloc(cap ? cap : 1, sizeof *steps),
             *created = calloc(cap ? cap : 1, sizeof *created);
    if (!steps || !created) {
        free(steps);
        free(created);
        return 0;
    }
    const size_t n = sv_versions_list(s->versions_dir, steps, created, cap);
    sv_served_t *x = sv_serve_acquire(s);
    const uint64_t cur = x->pinned && x->model ? sv_model_step(x->model) : UINT64_MAX;
    sv_serve_release(s, x);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = (sv_version_info_t){
            .step = steps[i], .created_unix_ns = created[i], .loaded = steps[i] == cur};
    free(steps);
    free(created);
    return n;
}

/* ---- live
 * ---------------------------------------------------------------------------------------- */
typedef struct tick_load {
    sv_serve_t *s;
    const char *dir;
    uint64_t step;
    sv_model_t *m;
    char *why;
    size_t cap;
} tick_load_t;

static int tick_load(void *arg) {
    tick_load_t *a = arg;
    return load_model(a->s, a->dir, a->step, a->s->rows->sparse, a->s->live->model, &a->m, a->why,
                      a->cap);
}

typedef struct unmoved {
    sv_serve_t *s;
    sv_sparse_t *sp;
    sv_sparse_start_t *starts;
    size_t n;
} unmoved_t;

/* rows_take_unmoved's work, at nice 19 (run_niced: the copy is no request's cost). */
static int take_unmoved(void *arg) {
    unmoved_t *a = arg;
    sv_serve_t *s = a->s;
    sv_sparse_t *sp = a->sp;
    sv_follow_t *f = s->rows->follower;
    const uint64_t v = pc_cmap_version(sv_sparse_map(sp));
    const size_t want = sv_follow_unmoved(f, v, NULL, 0);
    sv_sparse_start_t *st = want ? calloc(want, sizeof *st) : NULL;
    if (!st)
        return 0;
    const size_t got = sv_follow_unmoved(f, v, st, want);
    uint64_t rows = 0;
    size_t k = 0;
    for (size_t i = 0; i < got && i < want; i++) {
        uint64_t r = 0; /* a copy that fails is scanned instead */
        if (sv_sparse_copy_server(sp, s->rows->sparse, st[i].server, st[i].table, &r) == 0) {
            st[k++] = st[i];
            rows += r;
        }
    }
    if (k)
        PC_INFO("serve: %zu (server, table) sources of the new layout keep their rows (%" PRIu64
                " copied here) and position: their servers' slots did not move",
                k, rows);
    a->starts = st;
    a->n = k;
    return 0;
}

/* The rows of servers whose slots did not move, copied from the live rows into sp (a new
 * layout): starts for them into *out (malloc'ed), their count into *n. */
static void rows_take_unmoved(sv_serve_t *s, sv_sparse_t *sp, sv_sparse_start_t **out, size_t *n) {
    unmoved_t a = {.s = s, .sp = sp};
    run_niced(take_unmoved, &a);
    *out = a.starts;
    *n = a.n;
}

/* Whether published model dir failed (rc) for being pruned by the trainer (--publish-keep)
 * since it was listed: then a newer one is there, for the next tick, and nothing was wrong
 * with this one (not a refusal). */
static bool pruned(const char *dir, int rc, const char *what) {
    struct stat sb;
    if (rc != PC_ENOTFOUND || stat(dir, &sb) == 0)
        return false;
    PC_DEBUG("serve: %s was pruned before it loaded", what);
    return true;
}

typedef struct named {
    const char *name;
    int64_t dim;
} named_t;

static int is_named(void *ctx, const ps_table_config_t *cfg) {
    named_t *x = ctx;
    if (strcmp(cfg->name, x->name))
        return 0;
    x->dim = cfg->dim;
    return 1; /* found, stop */
}

/* Whether `tables` (psc_tables' text, a spec a line) has a table named `name` of `dim`. */
static bool lists(const char *tables, const char *name, int64_t dim) {
    named_t x = {name, 0};
    return sv_sparse_specs_each(tables, is_named, &x, NULL, 0) == 1 && x.dim == dim;
}

/* Whether `name` is the table the live dense model reads (kept while the model is: it serves
 * its last rows). Under swap_mu. */
static bool models_table(sv_serve_t *s, const char *name) {
    const sv_model_t *m = s->live ? s->live->model : NULL;
    return m && strcmp(sv_model_card(m)->table_name, name) == 0;
}

/* Whether the replica's table `name` is gone from the servers' `tables` (dropped there, or
 * created again with another dim) and may go from the replica (not the model's). Under
 * swap_mu. */
static bool gone(sv_serve_t *s, const char *tables, const char *name) {
    ps_table_config_t have;
    return sv_sparse_table_config(s->rows->sparse, name, &have) == 0 &&
           !lists(tables, name, have.dim) && !models_table(s, name);
}

/* Rows of map `map` aside in s->next: the tables of the current rows (less those gone from
 * `listed`, the servers' tables, when given) and more[0..nmore), the rows of servers whose
 * slots did not move copied, and a follower that scans the rest. */
static int rows_relayout(sv_serve_t *s, const char *map, const ps_table_config_t *more,
                         size_t nmore, const char *listed, char *why, size_t cap) {
    sv_sparse_t *sp;
    int rc = sv_sparse_create(map, &sp, why, cap);
    if (rc)
        return rc;
    for (size_t i = 0; !rc && i < nmore; i++)
        rc = sv_sparse_add_table(sp, &more[i], why, cap);
    const size_t nt = sv_sparse_tables(s->rows->sparse, NULL, 0);
    char(*names)[PS_TABLE_NAME_MAX] = rc ? NULL : calloc(nt ? nt : 1, sizeof *names);
    if (!rc && !names)
        rc = PC_ENOMEM;
    const size_t got = rc ? 0 : sv_sparse_tables(s->rows->sparse, names, nt);
    for (size_t i = 0; !rc && i < got && i < nt; i++) {
        ps_table_config_t cfg;
        if (listed && gone(s, listed, names[i]))
            continue;
        if (!(rc = sv_sparse_table_config(s->rows->sparse, names[i], &cfg)))
            rc = sv_sparse_add_table(sp, &cfg, why, cap);
    }
    free(names);
    if (rc) {
        sv_sparse_destroy(sp);
        return rc;
    }
    sv_sparse_start_t *starts;
    size_t nstarts;
    rows_take_unmoved(s, sp, &starts, &nstarts);
    if ((rc = rows_start(s, sp, starts, nstarts, &s->next)))
        snprintf(why, cap, "its follower: %s", pc_strerror(rc));
    free(starts);
    return rc;
}

/* A live object of model m (a reference, taken; dropped on failure) over the live rows becomes
 * the live one, and what requests get when they got the live one (not while pinned). Under
 * swap_mu. PC_ENOMEM. */
static int install_live(sv_serve_t *s, sv_model_t *m) {
    sv_served_t *x = calloc(1, sizeof *x);
    if (!x) {
        sv_model_destroy(m);
        return PC_ENOMEM;
    }
    x->model = m;
    x->rows = rows_ref(s->rows);
    x->sparse = s->rows->sparse;
    x->owner = s;
    pthread_mutex_lock(&s->mu);
    const bool was_cur = s->cur == s->live;
    x->refs = was_cur ? 2 : 1;
    pthread_mutex_unlock(&s->mu);
    install(s, was_cur ? x : NULL, x);
    return 0;
}

/* The live object of the current dense model over s->next, which becomes the live rows. */
static void swap_rows(sv_serve_t *s) {
    live_rows_t *old = s->rows;
    s->rows = s->next;
    if (install_live(s, sv_model_ref(s->live->model))) { /* s->live changes under swap_mu */
        s->rows = old;
        return; /* the next tick tries again */
    }
    s->next = NULL;
    s->next_since_ns = 0;
    /* the tables the old follower saw replaced still count as followed before (a watermark
     * naming one is reached); under swap_mu, as the live tick's sv_follow_caught_up */
    sv_follow_inherit(s->rows->follower, old->follower);
    rows_unref(old); /* the old live objects hold it until no request reads them */
    atomic_fetch_add(&s->relayouts, 1);
    atomic_store(&s->map_version, sv_follow_map_version(s->rows->follower));
    PC_INFO("serve: the replica follows the layout of map version %" PRIu64 " (%" PRIu64 " rows)",
            sv_follow_map_version(s->rows->follower), sv_sparse_rows(s->rows->sparse));
}

typedef struct carry {
    sv_serve_t *s;
    size_t n;
    char (*names)[PS_TABLE_NAME_MAX];
} carry_t;

/* carry_gone's copy, at nice 19 (run_niced). */
static int carry_tables(void *arg) {
    carry_t *a = arg;
    for (size_t i = 0; i < a->n; i++) {
        uint64_t rows = 0;
        const int rc =
            sv_sparse_carry_table(a->s->next->sparse, a->s->rows->sparse, a->names[i], &rows);
        if (rc == PC_ENOTFOUND || rc == PC_EDIM) { /* new to the new layout: no rows to carry */
            PC_INFO("serve: table %s is on no training server and has no rows here to carry",
                    a->names[i]);
            continue;
        }
        if (rc) {
            PC_ERROR("serve: table %s: carrying its last rows into the new layout: %s", a->names[i],
                     pc_strerror(rc));
            return rc;
        }
        PC_INFO("serve: table %s is on no training server of the new layout: its last %" PRIu64
                " rows are carried into it",
                a->names[i], rows);
    }
    return 0;
}

/* The tables of the new layout (s->next, ready) that no training server has any more (dropped:
 * the model's table keeps serving its last rows) get the current rows of them, routed by the new
 * map: their sources cannot scan them. 0; PC_EAGAIN when one came back meanwhile (its scan and
 * the carry may have mixed); another failure (the next tick tries again). Under swap_mu. */
static int carry_gone(sv_serve_t *s) {
    const size_t n = sv_follow_gone(s->next->follower, NULL, 0);
    if (!n)
        return 0;
    carry_t a = {.s = s, .names = calloc(n, PS_TABLE_NAME_MAX)};
    if (!a.names)
        return PC_ENOMEM;
    a.n = sv_follow_gone(s->next->follower, a.names, n);
    int rc = a.n <= n ? run_niced(carry_tables, &a) : PC_EAGAIN;
    /* a table created again meanwhile would be scanned into the rows just replaced: start over */
    if (!rc &&
        (sv_follow_gone(s->next->follower, NULL, 0) != a.n || !sv_follow_ready(s->next->follower)))
        rc = PC_EAGAIN;
    free(a.names);
    return rc;
}

/* Whether the new layout holds the served model's table with the model's row width (as
 * load_model checks a model against the rows). Under swap_mu. */
static bool layout_fits_model(sv_serve_t *s) {
    if (!s->live || !s->live->model)
        return true;
    const pw_model_card_t *c = sv_model_card(s->live->model);
    ps_table_config_t tc;
    return sv_sparse_table_config(s->next->sparse, c->table_name, &tc) == 0 && tc.dim == c->row_dim;
}

/* Give up the new layout being built (under swap_mu): released by unlock_swap, after the lock,
 * since stopping its follower joins threads that may be in a call (LoadVersion and Follow wait
 * on swap_mu). */
static void drop_next(sv_serve_t *s) {
    s->next_since_ns = 0;
    if (!s->next)
        return;
    rows_unref(s->dropped); /* (none: every unlock releases it) */
    s->dropped = s->next;
    s->next = NULL;
}

/* Let swap_mu go, then release a layout given up under it. */
static void unlock_swap(sv_serve_t *s) {
    live_rows_t *d = s->dropped;
    s->dropped = NULL;
    pthread_mutex_unlock(&s->swap_mu);
    rows_unref(d);
}

/* A new layout that has not become ready for a minute says, every minute, which of its sources
 * it waits for (one the replica cannot reach, a server whose follow-TLS name does not match):
 * meanwhile the moved slots' rows are frozen and no published model is taken, while the status
 * shows the old layout's sources, all following. Under swap_mu. */
static void said_waiting(sv_serve_t *s) {
    const uint64_t now = pc_time_mono_ns();
    if (!s->next_since_ns)
        s->next_since_ns = s->next_said_ns = now;
    if (now - s->next_said_ns < 60000000000ull)
        return;
    s->next_said_ns = now;
    const size_t n = sv_follow_status(s->next->follower, NULL, 0);
    sv_follow_source_t *src = calloc(n ? n : 1, sizeof *src);
    const size_t got = src ? sv_follow_status(s->next->follower, src, n) : 0;
    char waits[600] = "";
    size_t len = 0, named = 0, waiting = 0;
    for (size_t i = 0; i < got && i < n; i++) {
        if (src[i].state == SV_SOURCE_FOLLOWING && !src[i].lag_entries)
            continue; /* (one following behind its head, or rescanning, still waits) */
        waiting++;
        if (len + 200 < sizeof waits) {
            len += (size_t)snprintf(waits + len, sizeof waits - len, "%s%s %s (%s%s%.100s)",
                                    len ? ", " : "", src[i].addr, src[i].table,
                                    sv_source_state_name(src[i].state),
                                    src[i].last_error[0] ? ": " : "", src[i].last_error);
            named++;
        }
    }
    free(src);
    if (waiting > named && len + 40 < sizeof waits)
        snprintf(waits + len, sizeof waits - len, " and %zu more", waiting - named);
    PC_WARN("serve: the replica's layout of map version %" PRIu64 " has been built for %.0f s "
            "and waits for %s: the moved slots' rows are not refreshed and no newer model is "
            "taken until it is ready",
            sv_follow_map_version(s->next->follower), (double)(now - s->next_since_ns) / 1e9,
            len ? waits : "its first answers");
}

/* Follow the training servers' map (see DESIGN). Under swap_mu. */
static void relayout(sv_serve_t *s) {
    char *map = NULL, why[320] = "";
    if (s->next && !sv_follow_stale(s->next->follower, &map)) {
        if (!sv_follow_ready(s->next->follower)) {
            said_waiting(s);
            return;
        }
        const int rc = carry_gone(s);
        if (rc == PC_EAGAIN) { /* its rows may be mixed: the next tick builds it anew */
            PC_INFO("serve: a table of the new layout came back while its last rows were "
                    "carried: building the layout again");
            drop_next(s);
        } else if (rc == 0 && !layout_fits_model(s)) {
            /* the model served now reads a table the layout left out (gone from the servers when
             * it started, the model taken since), or of another width (dropped and made again):
             * built again, with it */
            PC_INFO("serve: the new layout lacks table %s of the model served now, or holds it "
                    "with rows of another width: building it again",
                    sv_model_card(s->live->model)->table_name);
            drop_next(s);
        } else if (rc == 0) {
            swap_rows(s);
        }
        return;
    }
    if (!s->next &&
        (!sv_follow_stale(s->rows->follower, &map) || pc_time_mono_ns() < s->relayout_retry_ns)) {
        free(map);
        return;
    }
    if (!map)
        return; /* out of memory: the next tick asks again */
    if (s->next)
        PC_INFO("serve: the map changed again while the replica's new layout was built: "
                "starting over");
    drop_next(s);
    const int rc = rows_relayout(s, map, NULL, 0, NULL, why, sizeof why);
    if (rc) {
        s->relayout_retry_ns = pc_time_mono_ns() + 1000000000ull;
        PC_ERROR("serve: cannot build the replica of the servers' new map: %s: %s (the rows "
                 "of moved slots are not refreshed; trying again in 1 s)",
                 pc_strerror(rc), why);
    } else {
        PC_INFO("serve: building the replica's layout of map version %" PRIu64
                " aside; the current rows serve meanwhile",
                sv_follow_map_version(s->next->follower));
    }
    free(map);
}

#define NEW_TABLES_MAX 64

typedef struct new_ctx {
    sv_serve_t *s;
    ps_table_config_t *out;
    size_t n, cap;
} new_ctx_t;

static int note_new(void *ctx, const ps_table_config_t *cfg) {
    new_ctx_t *a = ctx;
    ps_table_config_t c;
    const int rc = sv_sparse_table_config(a->s->rows->sparse, cfg->name, &c);
    const bool other_dim = rc == 0 && c.dim != cfg->dim && !models_table(a->s, cfg->name);
    if (!cfg->cold && a->n < a->cap && (rc == PC_ENOTFOUND || other_dim))
        a->out[a->n++] = *cfg;
    return 0;
}

/* The tables of a settings text (psc_tables' form, a line each) that the live rows lack, or
 * hold with another dim (created again; not the model's table), cold ones left out (a replica
 * cannot hold them): up to cap into out; returns how many. */
static size_t new_tables(sv_serve_t *s, const char *tables, ps_table_config_t *out, size_t cap) {
    new_ctx_t a = {.s = s, .out = out, .cap = cap};
    sv_sparse_specs_each(tables, note_new, &a, NULL, 0);
    return a.n;
}

/* Every tables_poll_ms, ask the servers for their tables (the tick, before it takes swap_mu:
 * the network is no admin call's wait): their text (malloc'ed), and the map asked under into
 * *servers; NULL when it is not time, a layout is being built, or the servers did not answer
 * or do not hold the same tables yet (a table created one server after another): asked again
 * at the next poll. */
static char *fetch_tables(sv_serve_t *s, char **servers) {
    *servers = NULL;
    const uint64_t now = pc_time_mono_ns();
    if (s->next || s->fo.tables_poll_ms <= 0 || now < s->tables_next_ns)
        return NULL;
    s->tables_next_ns = now + (uint64_t)s->fo.tables_poll_ms * 1000000u;
    const sv_follow_auth_t auth = auth_of(s);
    char *map = malloc(1 << 20), *tables = malloc(1 << 20), why[320] = "";
    *servers = sv_follow_newest_map(s->rows->follower);
    int rc = *servers && map && tables ? 0 : PC_ENOMEM;
    if (!rc &&
        (rc = sv_follow_discover(*servers, &auth, s->timeout_ms < 1000 ? s->timeout_ms : 1000, map,
                                 1 << 20, tables, 1 << 20, why, sizeof why)))
        PC_DEBUG("serve: asking the servers for their tables: %s (%s)", pc_err_name(rc), why);
    free(map);
    if (rc) {
        free(tables);
        return NULL;
    }
    return tables;
}

/* The servers' tables (fetch_tables) against the live rows': new ones (created since the
 * replica started) and dropped ones get a new layout of the same map (`servers`) with the
 * servers' tables: the rows held are copied over and followed on (sv_follow_unmoved), new
 * tables scanned. Under swap_mu, not while a layout is being built. */
/* Returns whether the replica's tables are the servers' (nothing new or gone, or a new layout
 * was started: its swap brings them) or cannot be made so (a line it cannot read: said), false
 * when it could not follow them (said). */
static int accept_spec(void *ctx, const ps_table_config_t *cfg) {
    (void)ctx;
    (void)cfg;
    return 0;
}

static bool apply_tables(sv_serve_t *s, const char *servers, const char *tables) {
    if (s->next)
        return true;
    char why[320] = "";
    /* Every line first: one this replica cannot read (a setting of newer servers) would end the
     * walks of new_tables and gone early, and every table listed after it would read as dropped
     * and leave the replica with its rows. */
    if (sv_sparse_specs_each(tables, accept_spec, NULL, why, sizeof why)) {
        if (!s->said_unreadable)
            PC_ERROR("serve: the training servers' tables hold a line this replica cannot read "
                     "(%s; servers newer than it?): no table is added or dropped until it can",
                     why);
        s->said_unreadable = true;
        return true; /* answered: a model of a table the replica lacks is refused, not awaited */
    }
    s->said_unreadable = false;
    ps_table_config_t *more = calloc(NEW_TABLES_MAX, sizeof *more);
    int rc = more ? 0 : PC_ENOMEM;
    const size_t n = rc ? 0 : new_tables(s, tables, more, NEW_TABLES_MAX);
    size_t ngone = 0; /* tables dropped on the servers */
    char names[NEW_TABLES_MAX][PS_TABLE_NAME_MAX];
    const size_t nt = rc ? 0 : sv_sparse_tables(s->rows->sparse, names, NEW_TABLES_MAX);
    for (size_t i = 0; i < nt && i < NEW_TABLES_MAX; i++)
        ngone += gone(s, tables, names[i]);
    if ((n || ngone) && (rc = rows_relayout(s, servers, more, n, tables, why, sizeof why)))
        PC_ERROR("serve: the training servers have %zu new tables and dropped %zu: cannot "
                 "follow that: %s (%s)",
                 n, ngone, pc_strerror(rc), why);
    else if (n || ngone)
        PC_INFO("serve: the training servers have %zu new tables%s%s and dropped %zu: "
                "building the replica's layout of their tables aside",
                n, n ? ": " : "", n ? more[0].name : "", ngone);
    free(more);
    return rc == 0;
}

void sv_serve_tick(sv_serve_t *s) {
    pthread_mutex_lock(&s->mu);
    const bool dead = s->graveyard != NULL;
    pthread_mutex_unlock(&s->mu);
    if (dead)
        run_niced(reap, s);
    if (!s->rows)
        return;
    char *servers, *tables = fetch_tables(s, &servers);
    pthread_mutex_lock(&s->swap_mu);
    relayout(s);
    /* the servers' tables answered, the replica holds them, and no new layout is coming */
    if (tables && apply_tables(s, servers, tables) && !s->next)
        s->tables_seen_ns = pc_time_mono_ns();
    free(servers);
    free(tables);
    if (!s->publish_dir[0]) {
        unlock_swap(s);
        return;
    }
    char dir[SV_PATH_MAX + 64], why[256] = "", what[64];
    uint64_t step;
    sv_watermark_t w;
    /* The published model served is gone and every one left is older, two ticks in a row (a
     * republish of one step replaces its directory: a moment without it): the trainer rolled
     * back, published its model again and pruned the abandoned ones, whose rows are gone from
     * the servers. A version served (not published) is no reason. One look at the directory
     * serves both this and the newer model below. */
    const bool any = sv_published_newest(s->publish_dir, 0, dir, sizeof dir, &step) == 0;
    if (any && s->pub_taken && step && step < s->pub_taken) {
        if (++s->back_ticks >= 2) {
            PC_WARN("serve: the newest published model is now step %" PRIu64
                    ", older than step %" PRIu64 " served (the trainer rolled back): it is served "
                    "once the rows are as its watermark says",
                    step, s->pub_taken);
            s->live_seen = step - 1;
            s->absent_step = 0;
            s->pub_taken = 0;
            s->back_ticks = 0;
        }
    } else {
        s->back_ticks = 0;
    }
    /* The step served, its directory written again since (a rollback to an earlier step, then
     * training that published this step again between two ticks): its model is another */
    const sv_dir_id_t dn = any && s->pub_taken == step ? sv_dir_id(dir) : (sv_dir_id_t){0};
    if (dn.ino && s->pub_taken && s->pub_dir.ino && !sv_dir_id_same(dn, s->pub_dir)) {
        PC_WARN("serve: published model %" PRIu64 " was written again (the trainer rolled back "
                "and published it anew): loaded again",
                step);
        s->live_seen = step - 1;
        s->pub_dir.ino = 0;
    }
    if (any && step > s->live_seen) {
        snprintf(what, sizeof what, "published model %" PRIu64, step);
        /* its directory as it is now: the trainer replaces a step's directory whole when it
         * publishes the step again (a rollback), so a load that saw two of them is not kept */
        const sv_dir_id_t d0 = sv_dir_id(dir);
        int rc = sv_watermark_read(dir, &w, why, sizeof why);
        if (!rc && w.n == 0) { /* caught_up would hold at once: nothing to pair it with */
            snprintf(why, sizeof why,
                     "its watermark names no training server (a model trained without servers, "
                     "--local): its rows are not the servers'");
            sv_watermark_free(&w);
            rc = PC_EINVAL;
        }
        if (rc) {
            s->live_seen = step;
            if (!pruned(dir, rc, what))
                refuse(s, what, why);
        } else if (sv_sparse_table_config(s->rows->sparse, w.table, &(ps_table_config_t){0})) {
            /* a table the replica does not hold: maybe one made since its last look at the
             * servers' tables (the next look and a new layout bring it: waited for), else
             * refused once the servers' tables answered since with no new layout coming */
            if (s->absent_step != step) {
                s->absent_step = step;
                s->absent_since_ns = pc_time_mono_ns();
            }
            if (s->fo.tables_poll_ms <= 0 || s->tables_seen_ns > s->absent_since_ns) {
                snprintf(why, sizeof why, "its table %.64s is not one the replica holds", w.table);
                s->live_seen = step;
                s->absent_step = 0; /* (a step looked at again after a rollback: a new wait) */
                refuse(s, what, why);
            }
            sv_watermark_free(&w);
        } else {
            const bool ready = sv_follow_caught_up(s->rows->follower, w.table, w.uid, w.head, w.n);
            char wtable[sizeof w.table];
            memcpy(wtable, w.table, sizeof wtable);
            sv_watermark_free(&w);
            sv_model_t *m = NULL;
            if (ready) { /* else: the rows are not that new yet, look again next tick */
                tick_load_t a = {.s = s, .dir = dir, .step = step, .why = why, .cap = sizeof why};
                rc = run_niced(tick_load, &a);
                m = a.m;
                if (!rc && strcmp(sv_model_card(m)->table_name, wtable) != 0) {
                    snprintf(why, sizeof why,
                             "its watermark is of table %.64s, its card's table is %.64s", wtable,
                             sv_model_card(m)->table_name);
                    sv_model_destroy(m);
                    rc = PC_ECORRUPT;
                }
                /* replaced meanwhile: the files read may be of two writes */
                const sv_dir_id_t d1 = sv_dir_id(dir);
                const bool replaced = d0.ino && d1.ino && !sv_dir_id_same(d1, d0);
                if (replaced && !rc) {
                    sv_model_destroy(m);
                    m = NULL;
                }
                /* out of memory, or a directory replaced during the load, is tried again next
                 * tick; a failure of the model's own is a refusal, and the step is passed */
                if (replaced) {
                    rc = PC_EAGAIN;
                    snprintf(why, sizeof why, "its directory was replaced while it loaded");
                }
                const bool again = rc == PC_ENOMEM || rc == PC_EAGAIN;
                if (!again)
                    s->live_seen = step;
                if (rc) {
                    if (again)
                        PC_WARN("serve: %s: %s (tried again)", what, why);
                    else if (!pruned(dir, rc, what))
                        refuse(s, what, why);
                } else if (install_live(s, m)) {
                    s->live_seen = step - 1; /* (out of memory: again next tick) */
                    PC_WARN("serve: %s: out of memory swapping it in (tried again)", what);
                } else {
                    s->pub_taken = step;
                    s->pub_dir = d0; /* (ino 0 when it was gone) */
                    PC_DEBUG("serve: dense model %" PRIu64 " in", step);
                }
            }
        }
    }
    unlock_swap(s);
}

/* The live state: the cluster's tables, rows from the newest version when there is one (then
 * its model too), the follower started. */
static int start_live(sv_serve_t *s) {
    const sv_follow_auth_t auth = auth_of(s);
    char *map = malloc(1 << 20), *tables = malloc(1 << 20), why[320] = "";
    int rc = map && tables ? 0 : PC_ENOMEM;
    if (!rc && (rc = sv_follow_discover(s->follow, &auth, s->timeout_ms, map, 1 << 20, tables,
                                        1 << 20, why, sizeof why)))
        PC_ERROR("serve: the training servers %s: %s", s->follow, why);
    sv_served_t *from = NULL;
    sv_sparse_start_t *starts = NULL;
    size_t nstarts = 0;
    /* the newest version that loads (a damaged one is skipped: refused, counted), else a scan */
    uint64_t steps[4];
    const size_t nv = rc ? 0 : sv_versions_list(s->versions_dir, NULL, NULL, 0);
    uint64_t *all = nv ? calloc(nv, sizeof *all) : NULL;
    const size_t have = all ? sv_versions_list(s->versions_dir, all, NULL, nv) : 0;
    size_t ntry = 0;
    for (size_t i = have < nv ? have : nv; i > 0 && ntry < 4; i--)
        steps[ntry++] = all[i - 1];
    free(all);
    for (size_t i = 0; i < ntry && !from; i++) {
        if (load_version(s, steps[i], map, NULL, &from, &starts, &nstarts, why, sizeof why) == 0) {
            PC_INFO("serve: starting from version %" PRIu64 ", then the delta stream", steps[i]);
        } else {
            char what[64];
            snprintf(what, sizeof what, "version %" PRIu64, steps[i]);
            refuse(s, what, why);
        }
    }
    if (!rc && !from)
        PC_INFO("serve: no version to start from: the follower scans the servers");
    sv_served_t *x = rc ? NULL : calloc(1, sizeof *x);
    if (!rc && !x)
        rc = PC_ENOMEM;
    sv_sparse_t *sparse = NULL;
    if (!rc && from) { /* its rows become the live rows: they continue in the stream */
        sparse = from->sparse;
        from->pinned = false;
        from->sparse = NULL;
        x->model = from->model;
        from->model = NULL;
        s->live_seen = sv_model_step(x->model);
        /* a version whose step was published too is that published model served: the trainer
         * rolling back past it (its directory pruned, every one left older) is seen as after
         * any published model taken */
        if (s->publish_dir[0] && sv_published_has(s->publish_dir, s->live_seen)) {
            s->pub_taken = s->live_seen;
            char pd[SV_PATH_MAX + 64]; /* its directory as it is: one published anew differs */
            snprintf(pd, sizeof pd, "%s/dense-%020" PRIu64, s->publish_dir, s->live_seen);
            s->pub_dir = sv_dir_id(pd);
        }
    } else if (!rc) {
        if (!(rc = sv_sparse_create(map, &sparse, why, sizeof why)))
            rc = sv_sparse_add_tables(sparse, tables, NULL, why, sizeof why);
        if (rc) {
            PC_ERROR("serve: the replica of %s: %s", s->follow, why);
            sv_sparse_destroy(sparse);
        }
    }
    served_destroy(from);
    if (!rc && !(rc = rows_start(s, sparse, starts, nstarts, &s->rows)))
        atomic_store(&s->map_version, sv_follow_map_version(s->rows->follower));
    free(starts);
    free(map);
    free(tables);
    if (rc) {
        if (x)
            sv_model_destroy(x->model); /* the version's, handed over above */
        free(x);
        return rc;
    }
    x->rows = rows_ref(s->rows);
    x->sparse = s->rows->sparse;
    x->owner = s;
    x->refs = 2; /* cur and live */
    s->cur = s->live = x;
    return 0;
}

int sv_serve_create(const sv_serve_opts_t *o, sv_serve_t **out) {
    *out = NULL;
    if (!o || o->evaluators < 1 || o->max_batch < 1 ||
        (!(o->follow && o->follow[0]) && !(o->versions_dir && o->versions_dir[0]))) {
        PC_ERROR("serve: give the training servers to follow (--follow) or a versions "
                 "directory (--versions)");
        return PC_EINVAL;
    }
    sv_serve_t *s = calloc(1, sizeof *s);
    if (!s)
        return PC_ENOMEM;
#define COPY(f) snprintf(s->f, sizeof s->f, "%s", o->f ? o->f : "")
    COPY(name);
    COPY(follow);
    COPY(publish_dir);
    COPY(versions_dir);
    COPY(token);
    COPY(tls_ca);
    COPY(tls_cert);
    COPY(tls_key);
#undef COPY
    s->evaluators = o->evaluators;
    s->max_batch = o->max_batch;
    s->be = o->be;
    if (o->fo)
        s->fo = *o->fo;
    else
        sv_follow_opts_defaults(&s->fo);
    s->timeout_ms = (int)s->fo.timeout_ms;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->swap_mu, NULL);
    pthread_mutex_init(&s->refusal_mu, NULL);
    pthread_mutex_init(&s->device_mu, NULL);
    int rc = 0;
    if (s->follow[0])
        rc = start_live(s);
    if (!rc && (o->pin || !s->follow[0])) {
        char why[256] = "";
        sv_served_t *x = NULL;
        if ((rc = load_version(s, o->pin, NULL, NULL, &x, NULL, NULL, why, sizeof why))) {
            PC_ERROR("serve: version %" PRIu64 " of %s: %s", o->pin, s->versions_dir, why);
        } else {
            x->refs = 1;
            if (s->cur)
                install(s, x, NULL);
            else
                s->cur = x;
        }
    }
    if (rc) {
        sv_serve_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sv_serve_destroy(sv_serve_t *s) {
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    bury_locked(s, unref_locked(s->cur));
    bury_locked(s, unref_locked(s->live));
    pthread_mutex_unlock(&s->mu);
    reap(s);
    rows_unref(s->next);
    rows_unref(s->dropped);
    rows_unref(s->rows);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->swap_mu);
    pthread_mutex_destroy(&s->refusal_mu);
    pthread_mutex_destroy(&s->device_mu);
    free(s);
}

/* ---- status
 * --------------------------------------------------------------------------------------- */
void sv_serve_status(sv_serve_t *s, sv_serve_status_t *st, sv_source_status_t *src, size_t cap) {
    memset(st, 0, sizeof *st);
    sv_served_t *x = sv_serve_acquire(s);
    st->has_model = x->model != NULL;
    st->model_step = x->model ? sv_model_step(x->model) : 0;
    st->pinned = x->pinned;
    st->rows = sv_sparse_rows(x->sparse);
    sv_serve_release(s, x);
    st->predictions = atomic_load(&s->predictions);
    st->swaps = atomic_load(&s->swaps);
    st->refused = atomic_load(&s->refused);
    pthread_mutex_lock(&s->refusal_mu);
    snprintf(st->last_refusal, sizeof st->last_refusal, "%s", s->last_refusal);
    pthread_mutex_unlock(&s->refusal_mu);
    st->map_version = atomic_load(&s->map_version);
    st->relayouts = atomic_load(&s->relayouts);
    pthread_mutex_lock(&s->mu); /* the live object (s->rows may be swapped meanwhile): held, */
    sv_served_t *lv = s->live;  /* its last release goes to the graveyard, as a request's */
    if (lv)
        lv->refs++;
    pthread_mutex_unlock(&s->mu);
    sv_follow_source_t *fs = lv && lv->rows && cap ? calloc(cap, sizeof *fs) : NULL;
    const size_t n = fs ? sv_follow_status(lv->rows->follower, fs, cap) : 0;
    if (lv)
        sv_serve_release(s, lv);
    if (!fs)
        return;
    st->nsources = n < cap ? n : cap;
    for (size_t i = 0; i < st->nsources; i++) {
        sv_source_status_t *d = &src[i];
        memset(d, 0, sizeof *d);
        snprintf(d->server, sizeof d->server, "%s/%s", fs[i].addr, fs[i].table);
        snprintf(d->state, sizeof d->state, "%s", sv_source_state_name(fs[i].state));
        d->uid = fs[i].uid;
        d->position = fs[i].position;
        d->head = fs[i].head;
        d->lag_entries = fs[i].lag_entries;
        d->lag_ms = (double)fs[i].lag_ms;
        d->rows_applied = fs[i].rows_applied;
        d->rescans = fs[i].rescans;
        snprintf(d->error, sizeof d->error, "%.*s", (int)sizeof d->error - 1, fs[i].last_error);
    }
    free(fs);
}

size_t sv_serve_render_metrics(sv_serve_t *s, char *buf, size_t cap, size_t len) {
    sv_serve_status_t st;
    sv_source_status_t src[64];
    sv_serve_status(s, &st, src, 64);
    len = pc_prom_appendf(
        buf, cap, len,
        "# TYPE emberps_serve_model_step gauge\nemberps_serve_model_step %" PRIu64 "\n"
        "# TYPE emberps_serve_pinned gauge\nemberps_serve_pinned %d\n"
        "# TYPE emberps_serve_rows gauge\nemberps_serve_rows %" PRIu64 "\n"
        "# TYPE emberps_serve_predictions_total counter\n"
        "emberps_serve_predictions_total %" PRIu64 "\n"
        "# TYPE emberps_serve_swaps_total counter\nemberps_serve_swaps_total %" PRIu64 "\n"
        "# TYPE emberps_serve_refused_total counter\nemberps_serve_refused_total %" PRIu64 "\n"
        "# TYPE emberps_serve_map_version gauge\nemberps_serve_map_version %" PRIu64 "\n"
        "# TYPE emberps_serve_relayouts_total counter\nemberps_serve_relayouts_total %" PRIu64 "\n"
        "# TYPE emberps_serve_lag_entries gauge\n# TYPE emberps_serve_lag_seconds gauge\n"
        "# TYPE emberps_serve_rescans_total counter\n",
        st.model_step, st.pinned ? 1 : 0, st.rows, st.predictions, st.swaps, st.refused,
        st.map_version, st.relayouts);
    for (size_t i = 0; i < st.nsources; i++)
        len = pc_prom_appendf(buf, cap, len,
                              "emberps_serve_lag_entries{source=\"%s\"} %" PRIu64 "\n"
                              "emberps_serve_lag_seconds{source=\"%s\"} %.3f\n"
                              "emberps_serve_rescans_total{source=\"%s\"} %" PRIu64 "\n",
                              src[i].server, src[i].lag_entries, src[i].server, src[i].lag_ms / 1e3,
                              src[i].server, src[i].rescans);
    return len;
}
