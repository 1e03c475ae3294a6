/* ps_repl.c: replicas and failover (see ps_repl.h; docs/server.md "Replicas and failover").
 *
 * DESIGN
 * - Map versions are keys `cluster/map/<20-digit version>` (zero-padded, so the coordinator's
 *   sorted listing ends with the newest); a change is "read the newest, derive the next, write it
 *   if absent". Losing that race is normal: the loser reads again and acts on the winner's map.
 *   Old versions stay (a few per failure; listing takes the last of PS_COORD_LIST_MAX).
 * - A server is "lost" when its alive key is absent and either this server saw it alive before
 *   or lease_ms x 3 have passed since this server started (a peer still starting is not lost).
 * - Leases: the controller sends the renewal at t0 and, on success, lets the data plane take
 *   pushes until t0 + 3/4 lease_ms. A renewal that failed or came too late (the process was
 *   stopped) marks the lease lapsed; then writes stay refused until a map version written by
 *   this server (the newest, unchanged, with the next version number) is won while it is still
 *   a primary there. A backup that promotes itself writes that same next version, so of a
 *   stale primary coming back and its successor exactly one wins.
 * - The follower keeps one libpsclient connection per primary (to that server only), sources per
 *   (primary, table) with the uid and position applied. A source scans when it starts, when the
 *   primary answers PC_ERANGE (fell behind its ring) or PC_ESTATE (the table was replaced), and
 *   when the map gives this server new slots of that primary: it first erases its own rows of
 *   those slots (rows the primary erased or evicted meanwhile must not come back on promotion),
 *   then loads every part with optimizer state. Caught up, it asks again after 200 us doubling
 *   to 2 ms: a push waits for the backup's next DELTAS, so that wait is the sync cost.
 */
#include "ps_repl.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pc_hist.h"
#include "pc_time.h"
#include "ps_table.h"
#include "psclient_repl.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAP_PREFIX   "cluster/map/"
#define ALIVE_PREFIX "cluster/alive/"
#define MAP_TEXT_MAX (256u << 10)
#define CALL_ROWS    16384u /* rows one DELTAS or scan part brings at most */
#define SCAN_PARTS   16u    /* a scan's first split; doubled while a part is larger */
#define MAX_TABLES   64u

typedef struct source {
    char table[PS_TABLE_NAME_MAX];
    uint64_t uid, pos;
    bool need_scan;
    uint32_t parts; /* the split its last scan needed */
} source_t;

typedef struct primary {
    uint32_t server;
    psc_t *c;
    source_t src[MAX_TABLES];
    size_t nsrc;
    uint64_t map_version; /* the map its slots of this server were last computed under */
} primary_t;

struct ps_repl {
    ps_coord_store_t store;
    ps_catalog_t *cat;
    ps_dp_t *dp;
    ps_repl_opts_t o;
    char token[256], ca[512], cert[512], key[512];
    char self_addr[PC_ADDR_MAX];
    pthread_t ctl, fol;
    atomic_bool stop;
    uint64_t start_ns;
    pthread_mutex_t mu; /* map */
    pc_cluster_map_t *map;
    pc_cluster_map_t *initial;
    bool lapsed;
    bool *seen; /* per server index: its alive key was seen */
    uint64_t lease_until;
    atomic_uint_least64_t version, promotions, drops, rejoins, rows_copied, rows_streamed;
    atomic_uint_least64_t lapses, scans;
    primary_t *prim; /* follower thread only */
    size_t nprim;
};

static void sleep_ms(uint64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void sleep_us(uint64_t us) {
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

/* A copy of the current map (NULL on ENOMEM). */
static pc_cluster_map_t *map_get(ps_repl_t *r) {
    pc_cluster_map_t *m = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->map)
        pc_cmap_copy(r->map, &m);
    pthread_mutex_unlock(&r->mu);
    return m;
}

/* ==== the map in the coordinator =========================================================== */

/* The newest map version there (*out NULL: none). */
static int newest_map(ps_repl_t *r, pc_cluster_map_t **out) {
    *out = NULL;
    pc_kv_entry_t *e = NULL;
    size_t n = 0;
    bool trunc = false;
    int rc = r->store.list(r->store.ctx, MAP_PREFIX, PS_COORD_LIST_MAX, &e, &n, &trunc);
    if (rc)
        return rc;
    if (n) {
        char err[160];
        char *text = malloc(e[n - 1].len + 1);
        if (!text) {
            rc = PC_ENOMEM;
        } else {
            memcpy(text, e[n - 1].value, e[n - 1].len);
            text[e[n - 1].len] = '\0';
            if ((rc = pc_cmap_parse(text, out, err, sizeof err)))
                PC_ERROR("replication: the coordinator's map %s is bad: %s", e[n - 1].key, err);
            free(text);
        }
    }
    pc_kv_entries_free(e, n);
    return rc;
}

/* Write m under its version if no one has: 0, PC_EEXIST (another won), or the store's error. */
static int put_map(ps_repl_t *r, const pc_cluster_map_t *m) {
    char key[64];
    snprintf(key, sizeof key, MAP_PREFIX "%020" PRIu64, pc_cmap_version(m));
    const size_t len = pc_cmap_format(m, NULL, 0);
    char *text = malloc(len + 1);
    if (!text)
        return PC_ENOMEM;
    pc_cmap_format(m, text, len + 1);
    int rc = r->store.set(r->store.ctx, key, text, len, true, 0);
    free(text);
    return rc;
}

/* Adopt m (taken) as the current map when newer. */
static void adopt(ps_repl_t *r, pc_cluster_map_t *m) {
    pthread_mutex_lock(&r->mu);
    if (r->map && pc_cmap_version(m) <= pc_cmap_version(r->map)) {
        pthread_mutex_unlock(&r->mu);
        pc_cmap_destroy(m);
        return;
    }
    if (pc_cmap_nservers(m) <= r->o.self || strcmp(pc_cmap_addr(m, r->o.self), r->self_addr) != 0) {
        pthread_mutex_unlock(&r->mu);
        PC_ERROR("replication: map version %" PRIu64 " does not have this server (%s) as server "
                 "%u: not adopted",
                 pc_cmap_version(m), r->self_addr, r->o.self);
        pc_cmap_destroy(m);
        return;
    }
    pc_cmap_destroy(r->map);
    r->map = m;
    ps_dp_set_map(r->dp, m);
    atomic_store(&r->version, pc_cmap_version(m));
    pthread_mutex_unlock(&r->mu);
    char text[512];
    pc_cmap_format(m, text, sizeof text);
    PC_INFO("replication: map version %" PRIu64 ": %s%s", pc_cmap_version(m), text,
            pc_cmap_format(m, NULL, 0) >= sizeof text ? "..." : "");
}

/* Write `next` (derived from the newest map) and adopt it when won; PC_EEXIST when lost (the
 * newest map is adopted instead). */
static int change_map(ps_repl_t *r, pc_cluster_map_t *next, const char *what) {
    int rc = put_map(r, next);
    if (rc == 0) {
        PC_INFO("replication: wrote map version %" PRIu64 " (%s)", pc_cmap_version(next), what);
        adopt(r, next);
        return 0;
    }
    pc_cmap_destroy(next);
    pc_cluster_map_t *m;
    if (newest_map(r, &m) == 0 && m)
        adopt(r, m);
    return rc;
}

int ps_repl_publish(ps_repl_t *r, const pc_cluster_map_t *m) {
    pc_cluster_map_t *c;
    int rc = pc_cmap_copy(m, &c);
    return rc ? rc : change_map(r, c, "published by this server");
}

/* ==== the controller ======================================================================= */

static bool alive(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t s, bool *known) {
    char key[PC_ADDR_MAX + 32];
    snprintf(key, sizeof key, ALIVE_PREFIX "%s", pc_cmap_addr(m, s));
    void *v = NULL;
    size_t len = 0;
    int rc = r->store.get(r->store.ctx, key, &v, &len);
    free(v);
    *known = rc == 0 || rc == PC_ENOTFOUND;
    if (rc == 0 && s < PC_MAX_SERVERS)
        r->seen[s] = true;
    return rc == 0;
}

/* Whether server s is lost (see DESIGN); false when the coordinator did not answer. */
static bool lost(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t s) {
    bool known;
    if (alive(r, m, s, &known) || !known)
        return false;
    return r->seen[s] || pc_time_mono_ns() - r->start_ns > 3ull * r->o.lease_ms * 1000000ull;
}

static void renew(ps_repl_t *r) {
    char key[PC_ADDR_MAX + 32];
    snprintf(key, sizeof key, ALIVE_PREFIX "%s", r->self_addr);
    const uint64_t t0 = pc_time_mono_ns(), until = t0 + r->o.lease_ms * 750000ull;
    const int rc = r->store.set(r->store.ctx, key, "1", 1, false, r->o.lease_ms);
    const uint64_t now = pc_time_mono_ns();
    if (rc || now >= r->lease_until) { /* failed, or renewed after the last one had run out */
        if (!r->lapsed && r->lease_until) {
            atomic_fetch_add(&r->lapses, 1);
            PC_WARN("replication: this server's lease lapsed (%s): no pushes until it is "
                    "confirmed in a new map version",
                    rc ? pc_strerror(rc) : "renewed too late");
        }
        r->lapsed = true;
        ps_dp_set_write_until(r->dp, 0);
    }
    if (!rc) {
        r->lease_until = until;
        if (!r->lapsed)
            ps_dp_set_write_until(r->dp, until);
    }
}

/* After a lapse: win the next map version unchanged while still a primary in it. */
static void confirm(ps_repl_t *r) {
    pc_cluster_map_t *m;
    if (newest_map(r, &m) || !m)
        return;
    if (!pc_cmap_server_slots(m, r->o.self)) { /* no primary of anything: nothing to fence */
        adopt(r, m);
        r->lapsed = false;
        ps_dp_set_write_until(r->dp, r->lease_until);
        return;
    }
    if (pc_cmap_bump(m, pc_cmap_version(m) + 1) == 0 &&
        change_map(r, m, "this server confirmed as primary after its lease lapsed") == 0) {
        r->lapsed = false;
        ps_dp_set_write_until(r->dp, r->lease_until);
    }
}

/* One look at the other servers: promote over a lost primary, drop a lost backup, join again. */
static void watch(ps_repl_t *r) {
    pc_cluster_map_t *m = map_get(r);
    if (!m)
        return;
    const uint32_t n = (uint32_t)pc_cmap_nservers(m), me = r->o.self;
    bool *prim_of_me = calloc(n, 1), *bk_of_me = calloc(n, 1);
    bool role = false;
    for (uint32_t s = 0; prim_of_me && bk_of_me && s < PC_NSLOTS; s++) {
        uint32_t b[PC_MAX_BACKUPS];
        const uint32_t owner = pc_cmap_slot_owner(m, s), nb = pc_cmap_slot_backups(m, s, b);
        if (owner == me) {
            role = true;
            for (uint32_t j = 0; j < nb; j++)
                bk_of_me[b[j]] = true;
        } else if (pc_cmap_is_backup(m, s, me)) {
            role = true;
            prim_of_me[owner] = true;
        }
    }
    for (uint32_t s = 0; prim_of_me && bk_of_me && s < n; s++) {
        if (s == me || !(prim_of_me[s] || bk_of_me[s]) || !lost(r, m, s))
            continue;
        pc_cluster_map_t *next;
        if (newest_map(r, &next) || !next)
            break;
        if (pc_cmap_version(next) != pc_cmap_version(m)) { /* moved on: look again next tick */
            adopt(r, next);
            break;
        }
        uint32_t promoted = 0, orphaned = 0;
        pc_cmap_fail_server(next, s, pc_cmap_version(m) + 1, &promoted, &orphaned);
        char what[256];
        snprintf(what, sizeof what,
                 "%s lost its lease: %u slots to their backups, %u slots with none left, and it "
                 "backs up nothing",
                 pc_cmap_addr(m, s), promoted, orphaned);
        if (change_map(r, next, what) == 0) {
            if (prim_of_me[s])
                atomic_fetch_add(&r->promotions, 1);
            else
                atomic_fetch_add(&r->drops, 1);
            if (orphaned)
                PC_ERROR("replication: %u slots of %s had no backup: their rows are lost", orphaned,
                         pc_cmap_addr(m, s));
        }
        break; /* one change per tick: the map moved */
    }
    if (!role && r->o.replicas && n > 1) { /* restarted after being replaced: back up again */
        pc_cluster_map_t *next;
        uint32_t added = 0;
        if (newest_map(r, &next) == 0 && next) {
            if (pc_cmap_version(next) == pc_cmap_version(m) &&
                pc_cmap_add_backup(next, me, r->o.replicas, pc_cmap_version(m) + 1, &added) == 0 &&
                added) {
                char what[96];
                snprintf(what, sizeof what, "this server joins again as a backup of %u slots",
                         added);
                if (change_map(r, next, what) == 0)
                    atomic_fetch_add(&r->rejoins, 1);
            } else {
                adopt(r, next);
            }
        }
    }
    free(prim_of_me);
    free(bk_of_me);
    pc_cmap_destroy(m);
}

static void *ctl_main(void *arg) {
    ps_repl_t *r = arg;
    const uint64_t tick = r->o.lease_ms / 4 < 50 ? 50 : r->o.lease_ms / 4;
    while (!atomic_load(&r->stop)) {
        renew(r);
        pc_cluster_map_t *m;
        if (newest_map(r, &m) == 0 && m)
            adopt(r, m);
        if (r->lapsed)
            confirm(r);
        else
            watch(r);
        for (uint64_t t = 0; t < tick && !atomic_load(&r->stop); t += 10)
            sleep_ms(10);
    }
    return NULL;
}

/* ==== the follower ========================================================================= */

/* Whether this server backs up `slot` of primary p under m. */
static bool backs_up(const pc_cluster_map_t *m, uint32_t me, uint32_t p, uint32_t slot) {
    return pc_cmap_slot_owner(m, slot) == p && pc_cmap_is_backup(m, slot, me);
}

typedef struct erase_ctx {
    const pc_cluster_map_t *m;
    uint32_t me, p;
    uint64_t *keys;
    size_t n, cap;
} erase_ctx_t;

static int erase_collect(void *ctx, const ps_row_view_t *rows, size_t n) {
    erase_ctx_t *x = ctx;
    for (size_t i = 0; i < n; i++) {
        if (!backs_up(x->m, x->me, x->p, pc_key_slot(rows[i].key)))
            continue;
        if (x->n == x->cap) {
            const size_t cap = x->cap ? 2 * x->cap : 4096;
            uint64_t *k = realloc(x->keys, cap * sizeof *k);
            if (!k)
                return 1;
            x->keys = k;
            x->cap = cap;
        }
        x->keys[x->n++] = rows[i].key;
    }
    return 0;
}

/* Load a stream reply's rows (with state) into t: present ones loaded, absent ones erased, keys
 * of slots this server does not back up of p skipped. */
static int apply(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t p, ps_table_t *t,
                 const psc_stream_req_t *q, size_t n) {
    const uint32_t dim = ps_table_dim(t), sl = ps_table_state_len(t), stride = dim + sl;
    size_t nl = 0, ne = 0;
    uint64_t *lk = malloc(n * sizeof *lk + 1), *ek = malloc(n * sizeof *ek + 1);
    float *w = malloc((size_t)n * dim * 4 + 4), *st = malloc((size_t)n * sl * 4 + 4);
    int rc = lk && ek && w && st ? 0 : PC_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        if (!backs_up(m, r->o.self, p, pc_key_slot(q->keys[i])))
            continue;
        if (!q->found[i]) {
            ek[ne++] = q->keys[i];
            continue;
        }
        memcpy(w + nl * dim, q->rows + i * stride, dim * 4);
        memcpy(st + nl * sl, q->rows + i * stride + dim, sl * 4);
        lk[nl++] = q->keys[i];
    }
    if (!rc && nl)
        rc = ps_table_load(t, nl, lk, w, sl ? st : NULL, NULL, NULL);
    if (!rc && ne)
        rc = ps_table_erase(t, ek, ne, NULL);
    atomic_fetch_add(&r->rows_streamed, nl + ne);
    free(lk);
    free(ek);
    free(w);
    free(st);
    return rc;
}

/* Copy table src->table of primary p afresh: erase this server's rows of the slots it backs up
 * of p, then load every part of the primary's scan. */
static int rescan(ps_repl_t *r, primary_t *pr, source_t *src, const pc_cluster_map_t *m,
                  ps_table_t *t, psc_stream_req_t *q, char *why, size_t whycap) {
    erase_ctx_t x = {.m = m, .me = r->o.self, .p = pr->server};
    int rc = ps_table_scan(t, PS_SCAN_ALL, erase_collect, &x) ? PC_ENOMEM : 0;
    if (!rc && x.n)
        rc = ps_table_erase(t, x.keys, x.n, NULL);
    free(x.keys);
    uint64_t next = 0, uid = 0;
    if (src->parts < SCAN_PARTS)
        src->parts = SCAN_PARTS;
    for (uint32_t part = 0; !rc && part < src->parts; part++) {
        q->part = part;
        q->parts = src->parts;
        q->uid = 0;
        psc_stream_t out;
        rc = psc__stream(pr->c, true, q, PC_STREAM_STATE, &out, why, whycap);
        if (rc == PC_ETOOBIG && src->parts < 4096) { /* a part over the buffers: split finer */
            src->parts *= 2;
            part = UINT32_MAX; /* the loop's ++ starts again at 0 */
            rc = 0;
            continue;
        }
        if (!rc && part && out.uid != uid)
            rc = PC_ESTATE; /* replaced during the scan: again */
        if (!rc) {
            rc = apply(r, m, pr->server, t, q, out.n);
            atomic_fetch_add(&r->rows_copied, out.n);
        }
        if (!part) {
            next = out.next;
            uid = out.uid;
        }
    }
    if (!rc) {
        src->uid = uid;
        src->pos = next;
        src->need_scan = false;
        atomic_fetch_add(&r->scans, 1);
        PC_INFO("replication: copied table %s of %s (uid %016" PRIx64 "), following from %" PRIu64,
                src->table, pc_cmap_addr(m, pr->server), uid, next);
    }
    return rc;
}

/* The follower's buffers: CALL_ROWS keys, found flags and rows of up to `stride` floats. */
typedef struct bufs {
    uint64_t *keys;
    uint8_t *found;
    float *rows;
    uint32_t stride;
} bufs_t;

static int bufs_fit(bufs_t *b, uint32_t stride) {
    if (!b->keys && !(b->keys = malloc(CALL_ROWS * sizeof *b->keys)))
        return PC_ENOMEM;
    if (!b->found && !(b->found = malloc(CALL_ROWS)))
        return PC_ENOMEM;
    if (stride > b->stride) {
        float *rows = realloc(b->rows, (size_t)CALL_ROWS * stride * sizeof *rows);
        if (!rows)
            return PC_ENOMEM;
        b->rows = rows;
        b->stride = stride;
    }
    return 0;
}

/* One round over primary pr's tables; returns rows applied, or a negative error. */
static long follow_round(ps_repl_t *r, primary_t *pr, const pc_cluster_map_t *m, bufs_t *b) {
    long total = 0;
    char why[320];
    for (size_t i = 0; i < pr->nsrc && !atomic_load(&r->stop); i++) {
        source_t *src = &pr->src[i];
        ps_table_t *t;
        if (ps_catalog_acquire(r->cat, src->table, &t))
            continue;
        const uint32_t stride = ps_table_dim(t) + ps_table_state_len(t);
        int rc = bufs_fit(b, stride);
        psc_stream_req_t q = {.server = pr->server,
                              .table = src->table,
                              .dim = stride,
                              .cap = CALL_ROWS,
                              .keys = b->keys,
                              .found = b->found,
                              .rows = b->rows};
        if (!rc && src->need_scan)
            rc = rescan(r, pr, src, m, t, &q, why, sizeof why);
        if (!rc) {
            psc_stream_t out;
            q.uid = src->uid;
            q.from = src->pos;
            q.part = r->o.self;
            q.parts = 0;
            rc = psc__stream(pr->c, false, &q, PC_STREAM_STATE | PC_STREAM_ACK, &out, why,
                             sizeof why);
            if (!rc && (rc = apply(r, m, pr->server, t, &q, out.n)) == 0) {
                src->pos = out.next;
                total += (long)out.n;
            }
        }
        ps_catalog_release(r->cat, t);
        if (rc == PC_ERANGE || rc == PC_ESTATE) {
            PC_INFO("replication: table %s of %s: %s: copying it again", src->table,
                    pc_cmap_addr(m, pr->server), why);
            src->need_scan = true;
        } else if (rc) {
            return rc;
        }
    }
    return total;
}

/* Set up the primaries this server backs up under m (connections made on first use). */
static void primaries_sync(ps_repl_t *r, const pc_cluster_map_t *m) {
    const uint32_t n = (uint32_t)pc_cmap_nservers(m);
    bool *want = calloc(n, 1);
    if (!want)
        return;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (pc_cmap_is_backup(m, s, r->o.self))
            want[pc_cmap_slot_owner(m, s)] = true;
    for (size_t i = 0; i < r->nprim;) { /* drop primaries no longer backed up */
        primary_t *p = &r->prim[i];
        if (p->server < n && want[p->server]) {
            want[p->server] = false;
            if (p->map_version != pc_cmap_version(m)) { /* slots may have been added: copy */
                for (size_t k = 0; k < p->nsrc; k++)
                    p->src[k].need_scan = true;
                p->map_version = pc_cmap_version(m);
            }
            i++;
            continue;
        }
        PC_INFO("replication: no longer a backup of %s", pc_cmap_addr(m, p->server));
        psc_close(p->c);
        r->prim[i] = r->prim[--r->nprim];
    }
    char(*names)[PS_TABLE_NAME_MAX] = calloc(MAX_TABLES, PS_TABLE_NAME_MAX);
    const size_t nt = names ? ps_catalog_list(r->cat, names, MAX_TABLES) : 0;
    for (uint32_t s = 0; s < n; s++) {
        if (!want[s])
            continue;
        primary_t *np = realloc(r->prim, (r->nprim + 1) * sizeof *np);
        if (!np)
            break;
        r->prim = np;
        primary_t *p = &r->prim[r->nprim++];
        memset(p, 0, sizeof *p);
        p->server = s;
        p->map_version = pc_cmap_version(m);
        for (size_t k = 0; k < nt && k < MAX_TABLES; k++) {
            snprintf(p->src[k].table, sizeof p->src[k].table, "%s", names[k]);
            p->src[k].need_scan = true;
        }
        p->nsrc = nt < MAX_TABLES ? nt : MAX_TABLES;
        PC_INFO("replication: backing up %s (%zu tables)", pc_cmap_addr(m, s), p->nsrc);
    }
    free(names);
    free(want);
}

static int connect_primary(ps_repl_t *r, primary_t *p, const pc_cluster_map_t *m, char *why,
                           size_t cap) {
    psc_opts_t po = {.servers = pc_cmap_addr(m, p->server),
                     .token = r->token[0] ? r->token : NULL,
                     .timeout_ms = 5000,
                     .retries = -1,
                     .connect_timeout_ms = 2000};
    psc_tls_opts_t tls = {
        .ca = r->ca, .cert = r->cert[0] ? r->cert : NULL, .key = r->key[0] ? r->key : NULL};
    return psc_connect2(&po, r->ca[0] ? &tls : NULL, why, cap, &p->c);
}

static void *fol_main(void *arg) {
    ps_repl_t *r = arg;
    bufs_t b = {0};
    uint64_t idle_us = 200;
    uint64_t seen_version = 0;
    while (!atomic_load(&r->stop)) {
        pc_cluster_map_t *m = map_get(r);
        if (!m) {
            sleep_ms(50);
            continue;
        }
        if (pc_cmap_version(m) != seen_version) {
            primaries_sync(r, m);
            seen_version = pc_cmap_version(m);
        }
        long applied = 0;
        for (size_t i = 0; i < r->nprim && !atomic_load(&r->stop); i++) {
            primary_t *p = &r->prim[i];
            char why[320];
            if (!p->c && connect_primary(r, p, m, why, sizeof why)) {
                p->c = NULL;
                continue; /* down: the controller replaces it once its lease is gone */
            }
            long got = follow_round(r, p, m, &b);
            if (got < 0) {
                PC_WARN("replication: following %s: %s", pc_cmap_addr(m, p->server),
                        pc_strerror((int)got));
                psc_close(p->c);
                p->c = NULL;
                for (size_t k = 0; k < p->nsrc; k++)
                    p->src[k].need_scan = true; /* its table may be new when it is back */
            } else {
                applied += got;
            }
        }
        pc_cmap_destroy(m);
        if (applied) {
            idle_us = 200;
        } else {
            sleep_us(idle_us);
            idle_us = idle_us * 2 > 2000 ? 2000 : idle_us * 2;
        }
    }
    for (size_t i = 0; i < r->nprim; i++)
        psc_close(r->prim[i].c);
    free(r->prim);
    r->prim = NULL;
    r->nprim = 0;
    free(b.keys);
    free(b.found);
    free(b.rows);
    return NULL;
}

/* ==== life ================================================================================= */

int ps_repl_start(const ps_coord_store_t *store, ps_catalog_t *cat, ps_dp_t *dp,
                  const pc_cluster_map_t *initial, const ps_repl_opts_t *o, ps_repl_t **out) {
    if (!store || !cat || !dp || !initial || !o || !out || o->replicas > PC_MAX_BACKUPS ||
        o->lease_ms < 200 || o->self >= pc_cmap_nservers(initial))
        return PC_EINVAL;
    ps_repl_t *r = calloc(1, sizeof *r);
    if (!r)
        return PC_ENOMEM;
    r->store = *store;
    r->cat = cat;
    r->dp = dp;
    r->o = *o;
    snprintf(r->token, sizeof r->token, "%s", o->token ? o->token : "");
    snprintf(r->ca, sizeof r->ca, "%s", o->tls_ca ? o->tls_ca : "");
    snprintf(r->cert, sizeof r->cert, "%s", o->tls_cert ? o->tls_cert : "");
    snprintf(r->key, sizeof r->key, "%s", o->tls_key ? o->tls_key : "");
    snprintf(r->self_addr, sizeof r->self_addr, "%s", pc_cmap_addr(initial, o->self));
    r->start_ns = pc_time_mono_ns();
    r->seen = calloc(PC_MAX_SERVERS, 1);
    pthread_mutex_init(&r->mu, NULL);
    int rc = r->seen ? pc_cmap_copy(initial, &r->initial) : PC_ENOMEM;
    if (!rc && r->o.replicas && !pc_cmap_replicated(r->initial) &&
        pc_cmap_nservers(r->initial) > r->o.replicas)
        rc = pc_cmap_set_replicas(r->initial, r->o.replicas);
    /* The first map: the coordinator's newest, or ours when it has none (written if absent). */
    ps_dp_set_write_until(dp, 0); /* no pushes before the lease and the map */
    pc_cluster_map_t *m = NULL;
    for (int attempt = 0; !rc && !r->map && attempt < 20; attempt++) {
        int lr = newest_map(r, &m);
        if (!lr && !m) {
            pc_cluster_map_t *c;
            if ((lr = pc_cmap_copy(r->initial, &c)) == 0) {
                lr = put_map(r, c);
                pc_cmap_destroy(c);
                if (lr == PC_EEXIST)
                    lr = 0;
                if (!lr)
                    continue; /* read it back: whoever won */
            }
        }
        if (!lr && m)
            adopt(r, m);
        else
            sleep_ms(r->o.lease_ms / 4);
    }
    if (!rc && !r->map) {
        PC_ERROR("replication: the coordinator gave no cluster map");
        rc = PC_EUNAVAIL;
    }
    r->lapsed = true; /* pushes once this server is confirmed (or is no primary) */
    if (!rc && pthread_create(&r->ctl, NULL, ctl_main, r)) {
        rc = PC_ESYS;
    } else if (!rc && pthread_create(&r->fol, NULL, fol_main, r)) {
        atomic_store(&r->stop, true);
        pthread_join(r->ctl, NULL);
        rc = PC_ESYS;
    }
    if (rc) {
        pc_cmap_destroy(r->map);
        pc_cmap_destroy(r->initial);
        free(r->seen);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void ps_repl_stop(ps_repl_t *r) {
    if (!r)
        return;
    atomic_store(&r->stop, true);
    pthread_join(r->ctl, NULL);
    pthread_join(r->fol, NULL);
    pc_cmap_destroy(r->map);
    pc_cmap_destroy(r->initial);
    free(r->seen);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

size_t ps_repl_render_metrics(ps_repl_t *r, char *buf, size_t cap, size_t len) {
    return pc_prom_appendf(
        buf, cap, len,
        "# TYPE emberps_replication_map_version gauge\n"
        "emberps_replication_map_version %llu\n"
        "# TYPE emberps_replication_promotions_total counter\n"
        "emberps_replication_promotions_total %llu\n"
        "# TYPE emberps_replication_backups_dropped_total counter\n"
        "emberps_replication_backups_dropped_total %llu\n"
        "# TYPE emberps_replication_rejoins_total counter\n"
        "emberps_replication_rejoins_total %llu\n"
        "# TYPE emberps_replication_lease_lapses_total counter\n"
        "emberps_replication_lease_lapses_total %llu\n"
        "# TYPE emberps_replication_copies_total counter\n"
        "emberps_replication_copies_total %llu\n"
        "# TYPE emberps_replication_rows_total counter\n"
        "emberps_replication_rows_total{how=\"copied\"} %llu\n"
        "emberps_replication_rows_total{how=\"streamed\"} %llu\n",
        (unsigned long long)atomic_load(&r->version),
        (unsigned long long)atomic_load(&r->promotions), (unsigned long long)atomic_load(&r->drops),
        (unsigned long long)atomic_load(&r->rejoins), (unsigned long long)atomic_load(&r->lapses),
        (unsigned long long)atomic_load(&r->scans),
        (unsigned long long)atomic_load(&r->rows_copied),
        (unsigned long long)atomic_load(&r->rows_streamed));
}
