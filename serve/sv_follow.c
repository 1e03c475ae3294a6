/* sv_follow.c: the replica's follower of the training servers' delta streams (sv_follow.h).
 *
 * Costs to the training server: a caught-up follower sends one DELTAS per table every poll_ms
 * (2 ms by default: about 500 small requests a second, each answered from the change log's
 * bounds without touching the table), and one per batch_rows keys changed while behind; a scan
 * in a power of two of parts (replies of about scan_bytes) costs the server's loop one pass over
 * the table in all (each part walks its own lock shards), and happens only when the follower
 * starts, fell behind the ring, or the table was replaced.
 *
 * DESIGN
 * - One thread per training server that is primary of some slot in the replica's map (srvf_t;
 *   the others hold nothing a lookup reads), each with its own libpsclient client connected to
 *   that server's address only (the client adopts the server's map on HELLO; the server's index
 *   in it must be the replica's index: a server keeps its index in every map). A client that
 *   connected once reconnects by itself; one that never did is connected again on the next try.
 * - The map (docs/serving.md "After a map change"). A follower follows one layout, the map it
 *   was created with: a server's stream carries only the slots it is primary of, and rows that
 *   reach a new primary (a promoted backup, a resharding's copy) are not in its stream. So the
 *   follower notes every newer map the servers name (each client asks a server whose reply names
 *   a newer version for it; the scans' PC_EWRONGSLOT carries it) and marks its layout stale from
 *   the first one that gives a slot another primary or skips a version: the owner (sv_serve)
 *   then builds a follower of the new map aside and swaps it in. A scan is a copy under one map
 *   version only (PC_STREAM_SAME_MAP): the newest noted while it has the layout's primaries,
 *   else the layout's own. A server that has not adopted that map yet, or has a newer one,
 *   answers PC_EWRONGSLOT (with its map, noted) and the source retries after its backoff, so no
 *   scan takes a server's rows under another layout than the replica routes by, and a map that
 *   changed backups only after the layout was made does not hold the scans back.
 * - A source (source_t) per (server, table). Its working fields (uid, pos, need_scan, backoff,
 *   retry time) belong to its server's thread; what sv_follow_status and the watermark readers
 *   see is written by that thread under f->mu, the one lock, taken once per call to a server.
 * - Applying a reply: the present rows are compacted to the front of the reply buffers and
 *   loaded with one ps_table_load (fresh optimizer state), the absent keys erased with one
 *   ps_table_erase. A key twice in one reply carries the same row both times, or, when the table
 *   changed while the reply was filled, the change's own log entry comes later: order within a
 *   reply does not matter.
 * - A rescan fills a staging table (sv_sparse_staging_create) part by part and swaps it in with
 *   sv_sparse_swap_in: a lookup sees the old rows until the new ones are complete. The first
 *   part is asked with uid 0 (whatever table has the name) and the rest with the uid it gave, so
 *   a table replaced mid-scan starts the scan over. PC_ETOOBIG doubles the parts and starts over.
 * - Waits (poll, backoff) are timed waits on f->cv, which sv_follow_stop broadcasts; a call in
 *   flight ends within timeout_ms.
 */
#include "sv_follow.h"

#include "emberps/psclient.h"
#include "pc_error.h"
#include "psclient_repl.h"
#include "pc_log.h"
#include "pc_time.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UID_HISTORY   8     /* uids a source followed before its current one */
#define PARTS_MAX     65536 /* a scan in more parts than this gives up (PC_ETOOBIG) */
#define SCAN_ROWS_MAX (1u << 22)
#define BACKOFF_MIN   10 /* ms */
#define MAP_TEXT_MAX  (1u << 20)

/* ==== settings ============================================================================== */

#define T sv_follow_opts_t
static const pc_setting_t k_settings[] = {
    PC_SETTING_INT(T, poll_ms, 1, 60000, "2",
                   "a caught-up follower asks each training server again after this long"),
    PC_SETTING_INT(T, batch_rows, 1, 1 << 20, "4096", "keys per DELTAS request"),
    PC_SETTING_INT(T, scan_bytes, 1 << 16, 1 << 30, "16Mi",
                   "a rescan's parts are sized to replies of about this many bytes"),
    PC_SETTING_INT(T, timeout_ms, 100, 600000, "5000",
                   "one call to a training server (bounds how long a stop waits)"),
    PC_SETTING_INT(T, backoff_max_ms, 10, 600000, "1000",
                   "a training server that is down is retried after 10 ms doubling to this"),
    PC_SETTING_INT(T, tables_poll_ms, 0, 3600000, "5000",
                   "the training servers are asked this often for tables created since (a new "
                   "one is then followed; 0: never)"),
};
#undef T

const pc_setting_t *sv_follow_settings(size_t *n) {
    *n = sizeof k_settings / sizeof k_settings[0];
    return k_settings;
}

void sv_follow_opts_defaults(sv_follow_opts_t *o) {
    size_t n;
    const pc_setting_t *tab = sv_follow_settings(&n);
    pc_settings_defaults(tab, n, o);
}

/* ==== types ================================================================================= */

typedef struct source {
    char table[PS_TABLE_NAME_MAX];
    uint32_t dim;
    /* the thread's own */
    bool need_scan;
    bool behind;         /* need_scan because it fell behind the ring, the same table: the rows held
                          * are as of pos still (a rescan brings newer ones, never older) */
    bool scanned;        /* no DELTAS answered since its last scan */
    uint64_t slow_scans; /* scans the ring outran before their first DELTAS */
    uint64_t backoff_ms, retry_ns;
    /* written by the thread under f->mu; read by the status functions under it */
    sv_source_state_t state;
    uint64_t uid, pos, head;
    uint64_t caught_ns; /* when it was last caught up (0: never: start_ns counts) */
    uint64_t applied, rescans, calls;
    int last_rc;
    char last_error[320];
    uint64_t seen[UID_HISTORY]; /* uids followed before, newest last */
    unsigned nseen;
} source_t;

typedef struct srvf {
    sv_follow_t *f;
    uint32_t idx;
    char addr[PC_ADDR_MAX];
    bool active; /* primary of some slot in the replica's map: followed (a thread) */
    pthread_t th;
    bool running;
    psc_t *c;
    uint64_t refreshes; /* the client's map refreshes when its map was last looked at */
    source_t *src;
    size_t nsrc;
    uint32_t cap, scan_cap; /* rows of the buffers; rows of a scan part */
    uint64_t *keys, *erase;
    uint8_t *found;
    float *rows;
} srvf_t;

struct sv_follow {
    sv_sparse_t *s;
    const pc_cluster_map_t *map; /* the replica's map (borrowed): the layout followed */
    sv_follow_opts_t o;
    char token[256], ca[1024], cert[1024], key[1024], name[256];
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; broadcast by stop */
    bool stop, started;
    uint64_t start_ns;
    pc_cluster_map_t *newest;   /* under mu: the newest map a server named (map at first) */
    bool skipped;               /* under mu: versions were skipped on the way to newest */
    bool moved[PC_MAX_SERVERS]; /* under mu: primary of a slot that moved since map */
    srvf_t *srv;
    size_t nsrv;
};

const char *sv_source_state_name(sv_source_state_t st) {
    static const char *const names[] = {"starting", "following", "scanning", "down"};
    return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "unknown";
}

/* ==== helpers =============================================================================== */

static bool stopping(sv_follow_t *f) {
    pthread_mutex_lock(&f->mu);
    const bool s = f->stop;
    pthread_mutex_unlock(&f->mu);
    return s;
}

/* Wait up to ms (or until stop). */
static void wait_ms(sv_follow_t *f, uint64_t ms) {
    const struct timespec dl = pc_time_mono_ts(pc_time_mono_ns() + ms * 1000000u);
    pthread_mutex_lock(&f->mu);
    while (!f->stop && pthread_cond_timedwait(&f->cv, &f->mu, &dl) == 0) {
    }
    pthread_mutex_unlock(&f->mu);
}

/* Whether rc says the server (not the table) is unreachable: every source of it waits. */
static bool transport_error(int rc) {
    return rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT || rc == PC_ECLOSED || rc == PC_ECANCELED ||
           rc == PC_ETLS || rc == PC_EAUTH;
}

/* Source x failed with rc (why: the line): down, retried after its backoff. Thread only. */
static void source_down(srvf_t *sf, source_t *x, int rc, const char *why) {
    sv_follow_t *f = sf->f;
    x->backoff_ms = x->backoff_ms ? x->backoff_ms * 2 : BACKOFF_MIN;
    if (x->backoff_ms > (uint64_t)f->o.backoff_max_ms)
        x->backoff_ms = (uint64_t)f->o.backoff_max_ms;
    x->retry_ns = pc_time_mono_ns() + x->backoff_ms * 1000000u;
    pthread_mutex_lock(&f->mu);
    const bool was_down = x->state == SV_SOURCE_DOWN;
    x->state = SV_SOURCE_DOWN;
    x->last_rc = rc;
    if (why && why[0])
        snprintf(x->last_error, sizeof x->last_error, "%s", why);
    else
        snprintf(x->last_error, sizeof x->last_error, "%s: %s", sf->addr, pc_strerror(rc));
    pthread_mutex_unlock(&f->mu);
    if (!was_down)
        PC_WARN("serve: follower of %s table %s: %s (%s); its rows stay as they are, retrying",
                sf->addr, x->table, pc_err_name(rc), x->last_error);
}

/* A successful call: the source is up again. Caller holds f->mu. */
static void source_up(srvf_t *sf, source_t *x, sv_source_state_t st) {
    if (x->state == SV_SOURCE_DOWN)
        PC_INFO("serve: follower of %s table %s: the server answers again", sf->addr, x->table);
    x->state = st;
    x->backoff_ms = 0;
}

/* Where uid is in x's history (x->nseen: not there). */
static unsigned seen_index(const source_t *x, uint64_t uid) {
    unsigned k = 0;
    while (k < x->nseen && x->seen[k] != uid)
        k++;
    return k;
}

/* Add uid to x's history as its newest (an earlier copy moved, the oldest dropped when full);
 * not 0 or x's own uid. Caller holds mu. */
static void seen_add(source_t *x, uint64_t uid) {
    if (!uid || uid == x->uid)
        return;
    unsigned k = seen_index(x, uid);
    if (k == x->nseen && x->nseen == UID_HISTORY)
        k = 0; /* the oldest goes */
    if (k < x->nseen) {
        memmove(x->seen + k, x->seen + k + 1, (x->nseen - k - 1) * sizeof x->seen[0]);
        x->nseen--;
    }
    x->seen[x->nseen++] = uid;
}

/* Note the uid followed from now on (the previous one goes to the history). Caller holds mu. */
static void set_uid(source_t *x, uint64_t uid) {
    const uint64_t prev = x->uid;
    x->uid = uid;
    seen_add(x, prev);
}

/* Apply n rows of a reply in sf's buffers to t: present ones loaded, absent ones erased. */
static int apply(srvf_t *sf, ps_table_t *t, uint32_t dim, uint32_t n) {
    uint32_t m = 0, e = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!sf->found[i]) {
            sf->erase[e++] = sf->keys[i];
            continue;
        }
        if (m != i) {
            sf->keys[m] = sf->keys[i];
            memcpy(sf->rows + (size_t)m * dim, sf->rows + (size_t)i * dim, dim * sizeof(float));
        }
        m++;
    }
    int rc = m ? ps_table_load(t, m, sf->keys, sf->rows, NULL, NULL, NULL) : 0;
    if (!rc && e)
        rc = ps_table_erase(t, sf->erase, e, NULL);
    return rc;
}

/* ==== the cluster map ======================================================================= */

/* Whether some slot has another primary (by address) in b than in a; both primaries of each
 * such slot are marked in f->moved (server indexes are the same in every map). Caller holds
 * f->mu. */
static bool mark_moved(sv_follow_t *f, const pc_cluster_map_t *a, const pc_cluster_map_t *b) {
    bool any = false;
    for (uint32_t slot = 0; slot < PC_NSLOTS; slot++) {
        const uint32_t x = pc_cmap_slot_owner(a, slot), y = pc_cmap_slot_owner(b, slot);
        if (strcmp(pc_cmap_addr(a, x), pc_cmap_addr(b, y)) != 0) {
            f->moved[x] = f->moved[y] = true;
            any = true;
        }
    }
    return any;
}

/* Whether newest needs another layout (sv_follow_stale): versions skipped, or a slot moved.
 * Caller holds f->mu. */
static bool stale_locked(const sv_follow_t *f) {
    bool any = f->skipped;
    for (size_t i = 0; !any && i < pc_cmap_nservers(f->newest); i++)
        any = f->moved[i];
    return any;
}

/* Note map m (taken), which a server's client adopted. A newer one than any seen becomes
 * `newest`; the layout is stale from the first one in which a slot has another primary than in
 * the one seen before it, or whose version skips one (a slot may have moved and come back in
 * the version not seen). */
static void note_map(sv_follow_t *f, pc_cluster_map_t *m) {
    pthread_mutex_lock(&f->mu);
    const uint64_t v = pc_cmap_version(m), was = pc_cmap_version(f->newest);
    if (v > was) {
        const bool stale = stale_locked(f);
        f->skipped = f->skipped || v != was + 1;
        const bool moved = mark_moved(f, f->newest, m) || v != was + 1;
        if (moved && !stale)
            PC_INFO("serve: the training servers' map version %" PRIu64 " (the replica's: %" PRIu64
                    ") %s: the replica needs a new layout",
                    v, pc_cmap_version(f->map),
                    v != was + 1 ? "skipped versions" : "gave slots another primary");
        pc_cmap_destroy(f->newest);
        f->newest = m;
        m = NULL;
    }
    pthread_mutex_unlock(&f->mu);
    pc_cmap_destroy(m);
}

/* Note sf's client's map when the client adopted another since the last look. The count is
 * read before the text (libpsclient counts a map after its text is in place), so the text is
 * at least the map counted; a look that fails is made again. */
static void observe_map(srvf_t *sf) {
    psc_stats_t st;
    psc_stats(sf->c, &st);
    if (st.map_refreshes == sf->refreshes)
        return;
    char *text = malloc(MAP_TEXT_MAX);
    pc_cluster_map_t *m;
    if (text && psc_map_text(sf->c, text, MAP_TEXT_MAX) < MAP_TEXT_MAX &&
        pc_cmap_parse(text, &m, NULL, 0) == 0) {
        note_map(sf->f, m);
        sf->refreshes = st.map_refreshes;
    }
    free(text);
}

/* ==== connecting ============================================================================ */

static int connect_server(srvf_t *sf, char *why, size_t cap) {
    sv_follow_t *f = sf->f;
    psc_opts_t po = {.servers = sf->addr,
                     .token = f->token[0] ? f->token : NULL,
                     .timeout_ms = (int)f->o.timeout_ms,
                     .connect_timeout_ms = (int)f->o.timeout_ms,
                     .retries = -1}; /* the follower's own backoff retries */
    psc_tls_opts_t tls = {.ca = f->ca,
                          .cert = f->cert[0] ? f->cert : NULL,
                          .key = f->key[0] ? f->key : NULL,
                          .server_name = f->name[0] ? f->name : NULL};
    psc_t *c;
    int rc = psc_connect2(&po, f->ca[0] ? &tls : NULL, why, cap, &c);
    if (rc)
        return rc;
    psc_stats_t st; /* the count before the text: see observe_map */
    psc_stats(c, &st);
    char *text = malloc(MAP_TEXT_MAX);
    if (!text) {
        psc_close(c);
        return PC_ENOMEM;
    }
    psc_map_text(c, text, MAP_TEXT_MAX);
    pc_cluster_map_t *m;
    char err[128];
    rc = pc_cmap_parse(text, &m, err, sizeof err);
    free(text);
    if (rc) {
        snprintf(why, cap, "%s: its cluster map: %s", sf->addr, err);
    } else {
        const int at = pc_cmap_find(m, sf->addr); /* a server keeps its index in every map */
        if (at != (int)sf->idx) {
            rc = PC_ESTATE;
            snprintf(why, cap,
                     "%s: its cluster map (version %" PRIu64 ") has it as server %d, the "
                     "replica's as server %u: another cluster",
                     sf->addr, pc_cmap_version(m), at, sf->idx);
            pc_cmap_destroy(m);
        } else {
            note_map(f, m);
        }
    }
    if (rc) {
        psc_close(c);
        return rc;
    }
    sf->c = c;
    sf->refreshes = st.map_refreshes;
    return 0;
}

/* ==== scans ================================================================================= */

/* Scan every part of x's table into a staging table and swap it in; then DELTAS go on from the
 * first part's position. 0, PC_ECANCELED (stopped), or the failure (why says it). */
static int rescan(srvf_t *sf, source_t *x, char *why, size_t cap) {
    sv_follow_t *f = sf->f;
    pthread_mutex_lock(&f->mu);
    x->state = x->state == SV_SOURCE_DOWN ? SV_SOURCE_DOWN : SV_SOURCE_SCANNING;
    pthread_mutex_unlock(&f->mu);
    /* parts from the rows held now (the previous copy of this server's table) */
    ps_catalog_t *cat = sv_sparse_catalog(f->s, sf->idx);
    ps_table_t *live;
    uint64_t held = 0;
    if (!ps_catalog_acquire(cat, x->table, &live)) {
        held = ps_table_count(live);
        ps_catalog_release(cat, live);
    }
    uint32_t parts = 1; /* a power of two: each part walks only its share of the table */
    while (parts < PARTS_MAX && (uint64_t)parts * sf->scan_cap < held + held / 2)
        parts *= 2;
    const uint64_t t0 = pc_time_mono_ns();
    /* the map version to copy under: the newest noted while it has the layout's primaries (a
     * change of backups only), else the layout's own (a server that moved on refuses: the rows
     * held stay, stale, until the new layout replaces them, rather than rows of another one) */
    pthread_mutex_lock(&f->mu);
    const uint64_t mv = pc_cmap_version(stale_locked(f) ? f->map : f->newest);
    pthread_mutex_unlock(&f->mu);
    for (int attempt = 0; attempt < 32; attempt++) {
        ps_table_t *st;
        int rc = sv_sparse_staging_create(f->s, x->table, &st);
        if (rc) {
            snprintf(why, cap, "table %s: cannot create its staging table: %s", x->table,
                     pc_strerror(rc));
            return rc;
        }
        uint64_t uid = 0, next = 0, rows = 0;
        uint32_t p = 0;
        for (; p < parts && !rc; p++) {
            if (stopping(f)) {
                rc = PC_ECANCELED;
                break;
            }
            psc_stream_req_t q = {.server = sf->idx,
                                  .table = x->table,
                                  .dim = x->dim,
                                  .uid = uid,
                                  .part = p,
                                  .parts = parts,
                                  .cap = sf->scan_cap,
                                  .keys = sf->keys,
                                  .found = sf->found,
                                  .rows = sf->rows};
            psc_stream_t out; /* a copy under the replica's map only (see DESIGN) */
            rc = psc__stream(sf->c, true, &q, PC_STREAM_SAME_MAP, mv, 0, &out, why, cap);
            if (rc == PC_EWRONGSLOT) {
                observe_map(sf); /* the reply carried the server's map */
                snprintf(why, cap,
                         "%s: table %s: its cluster map is not version %" PRIu64
                         " (the replica's layout): the scan waits for the servers to agree on "
                         "it, or the replica for its next layout",
                         sf->addr, x->table, mv);
            }
            if (rc)
                break;
            if (p == 0) {
                uid = out.uid;
                next = out.next; /* the head before any part: DELTAS from here cover the rest */
            } else if (out.uid != uid) { /* asked with part 0's uid: another is not ours */
                snprintf(why, cap,
                         "table %s: a malformed scan reply (part %u of uid %016" PRIx64
                         ", part 0's %016" PRIx64 ")",
                         x->table, p, out.uid, uid);
                rc = PC_EPARSE;
                break;
            }
            rc = apply(sf, st, x->dim, out.n);
            rows += out.n;
            if (rc)
                snprintf(why, cap, "table %s: loading scanned rows: %s", x->table, pc_strerror(rc));
        }
        if (!rc) {
            rc = sv_sparse_swap_in(f->s, sf->idx, st);
            if (rc) {
                snprintf(why, cap, "table %s: swapping in the scanned rows: %s", x->table,
                         pc_strerror(rc));
                return rc;
            }
            pthread_mutex_lock(&f->mu);
            set_uid(x, uid);
            x->pos = x->head = next; /* the next DELTAS says the head since */
            x->applied += rows;
            source_up(sf, x, SV_SOURCE_FOLLOWING);
            x->need_scan = x->behind = false; /* under mu: sv_follow_caught_up reads them */
            x->scanned = true;
            pthread_mutex_unlock(&f->mu);
            PC_INFO("serve: %s table %s: scanned %" PRIu64 " rows in %u parts (%.3f s), uid "
                    "%016" PRIx64 ", following from position %" PRIu64,
                    sf->addr, x->table, rows, parts, pc_time_sec_since(t0), uid, next);
            return 0;
        }
        ps_table_destroy(st);
        if (rc == PC_ETOOBIG && parts < PARTS_MAX) {
            parts *= 2; /* a part held more than the buffers or a reply: more, smaller parts */
            continue;
        }
        if (rc == PC_ESTATE && p > 0)
            continue; /* replaced during the scan: start over with the new table */
        return rc;
    }
    snprintf(why, cap, "table %s: the scan did not complete in 32 attempts", x->table);
    return PC_EAGAIN;
}

/* ==== following ============================================================================= */

/* One step of source x: a rescan when one is due, else one DELTAS applied. *more: not caught
 * up yet (ask again at once). 0 or the failure (why says it). */
static int step(srvf_t *sf, source_t *x, bool *more, char *why, size_t cap) {
    sv_follow_t *f = sf->f;
    *more = false;
    if (x->need_scan) {
        int rc = rescan(sf, x, why, cap);
        *more = !rc;
        return rc;
    }
    psc_stream_req_t q = {.server = sf->idx,
                          .table = x->table,
                          .dim = x->dim,
                          .uid = x->uid,
                          .from = x->pos,
                          .cap = sf->cap,
                          .keys = sf->keys,
                          .found = sf->found,
                          .rows = sf->rows};
    psc_stream_t out;
    int rc = psc_deltas(sf->c, &q, &out, why, cap);
    if (rc == PC_ERANGE || rc == PC_ESTATE) {
        /* fell behind the ring (or the DELTAS just started the log), or a new table */
        if (rc == PC_ERANGE && x->scanned && (++x->slow_scans == 1 || x->slow_scans % 10 == 0))
            PC_WARN("serve: %s table %s: the change log moved past this replica's position "
                    "while it scanned (%llu times): the scan takes longer than the server's "
                    "--delta-log-entries cover; give the training servers a larger log",
                    sf->addr, x->table, (unsigned long long)x->slow_scans);
        pthread_mutex_lock(&f->mu);
        x->need_scan = true;
        x->behind = rc == PC_ERANGE;
        x->rescans++;
        x->last_rc = rc;
        snprintf(x->last_error, sizeof x->last_error, "%s", why);
        pthread_mutex_unlock(&f->mu);
        PC_INFO("serve: table %s: %s: rescanning", x->table, why);
        *more = true;
        return 0;
    }
    if (rc)
        return rc;
    if ((x->uid && out.uid != x->uid) || out.next < x->pos || out.next > out.head) { /* not ours */
        snprintf(why, cap,
                 "table %s: a malformed DELTAS reply (uid %llu, next %llu, head %llu, "
                 "from %llu)",
                 x->table, (unsigned long long)out.uid, (unsigned long long)out.next,
                 (unsigned long long)out.head, (unsigned long long)x->pos);
        return PC_EPARSE;
    }
    ps_catalog_t *cat = sv_sparse_catalog(f->s, sf->idx);
    ps_table_t *t;
    rc = ps_catalog_acquire(cat, x->table, &t);
    if (!rc) {
        rc = apply(sf, t, x->dim, out.n);
        ps_catalog_release(cat, t);
    }
    if (rc) {
        snprintf(why, cap, "table %s: applying %u rows: %s", x->table, out.n, pc_strerror(rc));
        return rc;
    }
    const uint64_t now = pc_time_mono_ns();
    pthread_mutex_lock(&f->mu);
    x->pos = out.next;
    x->head = out.head;
    x->applied += out.n;
    x->calls++;
    x->scanned = false; /* (the thread's own: set under mu with what it follows) */
    if (out.next >= out.head)
        x->caught_ns = now;
    source_up(sf, x, SV_SOURCE_FOLLOWING);
    pthread_mutex_unlock(&f->mu);
    *more = out.next < out.head;
    return 0;
}

static void *server_main(void *arg) {
    srvf_t *sf = arg;
    sv_follow_t *f = sf->f;
    char why[PC_ADDR_MAX + 512];
    uint64_t conn_backoff = 0;
    while (!stopping(f)) {
        if (!sf->c) {
            why[0] = '\0';
            int rc = connect_server(sf, why, sizeof why);
            if (rc) {
                for (size_t i = 0; i < sf->nsrc; i++)
                    source_down(sf, &sf->src[i], rc, why);
                conn_backoff = conn_backoff ? 2 * conn_backoff : BACKOFF_MIN;
                if (conn_backoff > (uint64_t)f->o.backoff_max_ms)
                    conn_backoff = (uint64_t)f->o.backoff_max_ms;
                wait_ms(f, conn_backoff);
                continue;
            }
            conn_backoff = 0;
        }
        bool more = false;
        uint64_t next_ns = UINT64_MAX; /* the earliest retry of a source that is down */
        for (size_t i = 0; i < sf->nsrc && !stopping(f); i++) {
            source_t *x = &sf->src[i];
            const uint64_t now = pc_time_mono_ns();
            if (x->retry_ns > now) {
                next_ns = x->retry_ns < next_ns ? x->retry_ns : next_ns;
                continue;
            }
            bool m = false;
            why[0] = '\0';
            const int rc = step(sf, x, &m, why, sizeof why);
            observe_map(sf); /* a reply may have named a newer map: the client asked for it */
            if (rc == PC_ECANCELED && stopping(f))
                break;
            if (rc && transport_error(rc)) {           /* the server, not the table: all wait */
                if (rc == PC_EAUTH || rc == PC_ETLS) { /* the client gave up on it: anew */
                    psc_close(sf->c);
                    sf->c = NULL;
                }
                for (size_t j = 0; j < sf->nsrc; j++) {
                    source_down(sf, &sf->src[j], rc, why);
                    next_ns = sf->src[j].retry_ns < next_ns ? sf->src[j].retry_ns : next_ns;
                }
                break;
            }
            if (rc) {
                source_down(sf, x, rc, why);
                next_ns = x->retry_ns < next_ns ? x->retry_ns : next_ns;
                continue;
            }
            x->retry_ns = 0;
            more = more || m;
        }
        if (more)
            continue;
        uint64_t wait = (uint64_t)f->o.poll_ms;
        const uint64_t now = pc_time_mono_ns();
        if (next_ns != UINT64_MAX) { /* a source down is retried sooner than the poll */
            const uint64_t until = next_ns > now ? (next_ns - now + 999999) / 1000000 : 0;
            wait = until < wait ? until : wait;
        }
        if (wait)
            wait_ms(f, wait);
    }
    return NULL;
}

/* ==== lifecycle ============================================================================= */

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

int sv_follow_create(sv_sparse_t *s, const sv_follow_opts_t *o, const sv_follow_auth_t *auth,
                     const sv_sparse_start_t *starts, size_t n, sv_follow_t **out) {
    if (!s || !out || (n && !starts))
        return PC_EINVAL;
    sv_follow_t *f = calloc(1, sizeof *f);
    if (!f)
        return PC_ENOMEM;
    f->s = s;
    if (o)
        f->o = *o;
    else
        sv_follow_opts_defaults(&f->o);
    if (auth) {
        copy_str(f->token, sizeof f->token, auth->token);
        copy_str(f->ca, sizeof f->ca, auth->tls_ca);
        copy_str(f->cert, sizeof f->cert, auth->tls_cert);
        copy_str(f->key, sizeof f->key, auth->tls_key);
        copy_str(f->name, sizeof f->name, auth->tls_server_name);
    }
    pthread_mutex_init(&f->mu, NULL);
    pc_cond_init_mono(&f->cv);
    const size_t ntab = sv_sparse_tables(s, NULL, 0);
    char(*names)[PS_TABLE_NAME_MAX] = calloc(ntab ? ntab : 1, sizeof *names);
    f->nsrv = sv_sparse_servers(s);
    f->srv = calloc(f->nsrv, sizeof *f->srv);
    f->map = sv_sparse_map(s);
    int rc = names && f->srv ? pc_cmap_copy(f->map, &f->newest) : PC_ENOMEM;
    const size_t nt = rc ? 0 : sv_sparse_tables(s, names, ntab);
    uint32_t maxdim = 1;
    ps_table_config_t cfg;
    for (size_t t = 0; t < nt; t++)
        if (!sv_sparse_table_config(s, names[t], &cfg) && (uint32_t)cfg.dim > maxdim)
            maxdim = (uint32_t)cfg.dim;
    uint64_t scan_cap = (uint64_t)f->o.scan_bytes / (9 + 4 * (uint64_t)maxdim);
    if (scan_cap < (uint64_t)f->o.batch_rows)
        scan_cap = (uint64_t)f->o.batch_rows;
    if (scan_cap > SCAN_ROWS_MAX)
        scan_cap = SCAN_ROWS_MAX;
    for (size_t i = 0; !rc && i < f->nsrv; i++) {
        srvf_t *sf = &f->srv[i];
        sf->f = f;
        sf->idx = (uint32_t)i;
        copy_str(sf->addr, sizeof sf->addr, sv_sparse_server_addr(s, (uint32_t)i));
        sf->active = pc_cmap_server_slots(f->map, (uint32_t)i) > 0;
        sf->cap = (uint32_t)f->o.batch_rows;
        sf->scan_cap = (uint32_t)scan_cap;
        sf->nsrc = nt;
        sf->src = calloc(nt ? nt : 1, sizeof *sf->src);
        if (sf->active) { /* the buffers of a server followed */
            sf->keys = malloc(scan_cap * sizeof *sf->keys);
            sf->erase = malloc(scan_cap * sizeof *sf->erase);
            sf->found = malloc(scan_cap);
            sf->rows = malloc(scan_cap * maxdim * sizeof *sf->rows);
        }
        if (!sf->src || (sf->active && (!sf->keys || !sf->erase || !sf->found || !sf->rows))) {
            rc = PC_ENOMEM;
            break;
        }
        for (size_t t = 0; t < nt; t++) {
            source_t *x = &sf->src[t];
            copy_str(x->table, sizeof x->table, names[t]);
            sv_sparse_table_config(s, names[t], &cfg);
            x->dim = (uint32_t)cfg.dim;
            x->need_scan = true;
            for (size_t k = 0; k < n; k++) {
                if (starts[k].server == i && strcmp(starts[k].table, names[t]) == 0 &&
                    starts[k].position != UINT64_MAX && starts[k].uid) {
                    x->uid = starts[k].uid;
                    x->pos = x->head = starts[k].position;
                    x->need_scan = false;
                }
            }
        }
    }
    free(names);
    if (rc) {
        sv_follow_destroy(f);
        return rc;
    }
    *out = f;
    return 0;
}

int sv_follow_start(sv_follow_t *f) {
    if (!f)
        return PC_EINVAL;
    if (f->started)
        return PC_ESTATE;
    f->started = true;
    f->stop = false;
    f->start_ns = pc_time_mono_ns();
    for (size_t i = 0; i < f->nsrv; i++) {
        if (!f->srv[i].active)
            continue;
        if (pthread_create(&f->srv[i].th, NULL, server_main, &f->srv[i])) {
            PC_ERROR("serve: cannot start the follower thread of %s", f->srv[i].addr);
            sv_follow_stop(f);
            return PC_ESYS;
        }
        f->srv[i].running = true;
    }
    return 0;
}

void sv_follow_stop(sv_follow_t *f) {
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (size_t i = 0; f->srv && i < f->nsrv; i++) { /* srv NULL: its allocation failed */
        if (f->srv[i].running) {
            pthread_join(f->srv[i].th, NULL);
            f->srv[i].running = false;
        }
        psc_close(f->srv[i].c);
        f->srv[i].c = NULL;
    }
    f->started = false;
}

void sv_follow_destroy(sv_follow_t *f) {
    if (!f)
        return;
    sv_follow_stop(f);
    for (size_t i = 0; f->srv && i < f->nsrv; i++) {
        free(f->srv[i].src);
        free(f->srv[i].keys);
        free(f->srv[i].erase);
        free(f->srv[i].found);
        free(f->srv[i].rows);
    }
    free(f->srv);
    pc_cmap_destroy(f->newest);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

/* ==== status ================================================================================ */

size_t sv_follow_status(sv_follow_t *f, sv_follow_source_t *out, size_t cap) {
    size_t k = 0;
    const uint64_t now = pc_time_mono_ns();
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nsrv; i++) {
        const srvf_t *sf = &f->srv[i];
        for (size_t t = 0; sf->active && t < sf->nsrc; t++, k++) {
            if (k >= cap)
                continue;
            const source_t *x = &sf->src[t];
            sv_follow_source_t *o = &out[k];
            memset(o, 0, sizeof *o);
            o->server = sf->idx;
            copy_str(o->addr, sizeof o->addr, sf->addr);
            copy_str(o->table, sizeof o->table, x->table);
            o->state = x->state;
            o->uid = x->uid;
            o->position = x->pos;
            o->head = x->head;
            o->lag_entries = x->head > x->pos ? x->head - x->pos : 0;
            const uint64_t since = x->caught_ns ? x->caught_ns : f->start_ns;
            o->lag_ms = since && now > since ? (now - since) / 1000000u : 0;
            o->rows_applied = x->applied;
            o->rescans = x->rescans;
            o->deltas_calls = x->calls;
            o->last_rc = x->last_rc;
            copy_str(o->last_error, sizeof o->last_error, x->last_error);
        }
    }
    pthread_mutex_unlock(&f->mu);
    return k;
}

/* Index of `table` among the sources (the same in every server), or -1. */
static long source_index(const sv_follow_t *f, const char *table) {
    if (!f->nsrv)
        return -1;
    for (size_t t = 0; t < f->srv[0].nsrc; t++)
        if (strcmp(f->srv[0].src[t].table, table) == 0)
            return (long)t;
    return -1;
}

int sv_follow_positions(sv_follow_t *f, const char *table, uint64_t *uids, uint64_t *positions,
                        size_t cap) {
    if (!f || !table)
        return PC_EINVAL;
    const long t = source_index(f, table);
    if (t < 0)
        return PC_ENOTFOUND;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nsrv && i < cap; i++) {
        const bool on = f->srv[i].active;
        if (uids)
            uids[i] = on ? f->srv[i].src[t].uid : 0;
        if (positions)
            positions[i] = on ? f->srv[i].src[t].pos : 0;
    }
    pthread_mutex_unlock(&f->mu);
    return (int)f->nsrv;
}

bool sv_follow_caught_up(sv_follow_t *f, const char *table, const uint64_t *uids,
                         const uint64_t *heads, size_t n) {
    if (!f || !table || (n && (!uids || !heads)))
        return false;
    const long t = source_index(f, table);
    if (t < 0)
        return false;
    pthread_mutex_lock(&f->mu);
    bool ok = !stale_locked(f); /* moved slots' rows are frozen until the new layout is in */
    for (size_t i = 0; i < n && ok; i++) {
        if (!uids[i])
            continue;
        if (i >= f->nsrv || !f->srv[i].active) {
            /* a server the replica does not follow: primary of nothing in the newest map seen,
             * which has the replica's primaries (not stale), so its rows are at their primaries
             * (moved there, with every change acknowledged before, ahead of the replica's scan) */
            ok = i < pc_cmap_nservers(f->newest) &&
                 pc_cmap_server_slots(f->newest, (uint32_t)i) == 0;
            continue;
        }
        const source_t *x = &f->srv[i].src[t];
        if (x->uid == uids[i]) { /* (rescanning a new table: not caught up, nor "before";
                                  * behind the ring, the same table: its rows are as of pos) */
            ok = (!x->need_scan || x->behind) && x->pos >= heads[i];
            continue;
        }
        ok = seen_index(x, uids[i]) < x->nseen; /* followed before: what it holds is newer */
    }
    pthread_mutex_unlock(&f->mu);
    return ok;
}

/* The newest map's text (malloc'ed, NULL on ENOMEM). Caller holds f->mu. */
static char *newest_text(const sv_follow_t *f) {
    const size_t len = pc_cmap_format(f->newest, NULL, 0) + 1;
    char *t = malloc(len);
    if (t)
        pc_cmap_format(f->newest, t, len);
    return t;
}

bool sv_follow_stale(sv_follow_t *f, char **map_text) {
    if (map_text)
        *map_text = NULL;
    pthread_mutex_lock(&f->mu);
    const bool stale = stale_locked(f);
    if (stale && map_text)
        *map_text = newest_text(f);
    pthread_mutex_unlock(&f->mu);
    return stale;
}

char *sv_follow_newest_map(sv_follow_t *f) {
    pthread_mutex_lock(&f->mu);
    char *t = newest_text(f);
    pthread_mutex_unlock(&f->mu);
    return t;
}

/* The uids source x (of `to`) followed before, merged with those its predecessor y (of `from`)
 * followed and y's own: oldest first, without 0, x's own uid or repeats, the newest
 * UID_HISTORY kept. When y followed x's uid before (it saw the table replaced after x started
 * from its rows), only the uids older than x's are taken: x holds no newer table's rows yet.
 * Callers hold both locks. */
static void merge_seen(source_t *x, const source_t *y) {
    uint64_t own[UID_HISTORY];
    const unsigned nown = x->nseen;
    memcpy(own, x->seen, sizeof own);
    x->nseen = 0;
    const unsigned older = x->uid ? seen_index(y, x->uid) : y->nseen;
    for (unsigned k = 0; k < older; k++)
        seen_add(x, y->seen[k]);
    if (older == y->nseen)
        seen_add(x, y->uid);
    for (unsigned k = 0; k < nown; k++)
        seen_add(x, own[k]);
}

void sv_follow_inherit(sv_follow_t *to, sv_follow_t *from) {
    if (!to || !from || to == from)
        return;
    pthread_mutex_lock(&from->mu); /* (no other code holds two followers' locks) */
    pthread_mutex_lock(&to->mu);
    for (size_t i = 0; i < to->nsrv; i++) {
        srvf_t *sf = &to->srv[i];
        const srvf_t *of = NULL;
        for (size_t j = 0; j < from->nsrv && !of; j++)
            if (strcmp(from->srv[j].addr, sf->addr) == 0)
                of = &from->srv[j];
        for (size_t t = 0; of && t < sf->nsrc; t++)
            for (size_t u = 0; u < of->nsrc; u++)
                if (strcmp(of->src[u].table, sf->src[t].table) == 0)
                    merge_seen(&sf->src[t], &of->src[u]);
    }
    pthread_mutex_unlock(&to->mu);
    pthread_mutex_unlock(&from->mu);
}

size_t sv_follow_unmoved(sv_follow_t *f, uint64_t version, sv_sparse_start_t *out, size_t cap) {
    size_t k = 0;
    pthread_mutex_lock(&f->mu);
    const bool known = !f->skipped && pc_cmap_version(f->newest) == version;
    for (size_t i = 0; known && i < f->nsrv; i++) {
        const srvf_t *sf = &f->srv[i];
        for (size_t t = 0; sf->active && !f->moved[i] && t < sf->nsrc; t++) {
            const source_t *x = &sf->src[t];
            if (!x->uid || x->need_scan)
                continue; /* no rows of its own yet */
            if (k < cap) {
                out[k] = (sv_sparse_start_t){.server = sf->idx, .uid = x->uid, .position = x->pos};
                copy_str(out[k].table, sizeof out[k].table, x->table);
            }
            k++;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return k;
}

uint64_t sv_follow_map_version(const sv_follow_t *f) {
    return pc_cmap_version(f->map);
}

typedef enum { TABLE_PENDING, TABLE_HELD, TABLE_GONE } table_state_t;

/* Table t of every followed server: gone everywhere (the last call of each source answered
 * PC_ENOTFOUND or PC_EDIM: no server has it at the replica's dim, dropped, or dropped and
 * created again with another dim while the served model keeps the old one), else its rows held
 * everywhere (scanned, or started from a position), or neither yet. Caller holds f->mu. */
static table_state_t table_state_locked(const sv_follow_t *f, size_t t) {
    bool held = true, gone = true;
    for (size_t i = 0; i < f->nsrv; i++) {
        if (!f->srv[i].active)
            continue;
        const source_t *x = &f->srv[i].src[t];
        held = held && x->uid && !x->need_scan;
        gone = gone && x->state == SV_SOURCE_DOWN &&
               (x->last_rc == PC_ENOTFOUND || x->last_rc == PC_EDIM);
    }
    return gone ? TABLE_GONE : held ? TABLE_HELD : TABLE_PENDING;
}

bool sv_follow_ready(sv_follow_t *f) {
    bool ready = true;
    pthread_mutex_lock(&f->mu);
    for (size_t t = 0; f->nsrv && t < f->srv[0].nsrc && ready; t++)
        ready = table_state_locked(f, t) != TABLE_PENDING;
    pthread_mutex_unlock(&f->mu);
    return ready;
}

size_t sv_follow_gone(sv_follow_t *f, char (*names)[PS_TABLE_NAME_MAX], size_t cap) {
    size_t k = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t t = 0; f->nsrv && t < f->srv[0].nsrc; t++) {
        if (table_state_locked(f, t) != TABLE_GONE)
            continue;
        if (k < cap)
            copy_str(names[k], PS_TABLE_NAME_MAX, f->srv[0].src[t].table);
        k++;
    }
    pthread_mutex_unlock(&f->mu);
    return k;
}

/* ==== discovery ============================================================================= */

int sv_follow_discover(const char *servers, const sv_follow_auth_t *auth, int timeout_ms, char *map,
                       size_t mapcap, char *tables, size_t tablescap, char *why, size_t whycap) {
    if (why && whycap)
        why[0] = '\0';
    if (!servers || !map || !tables)
        return PC_EINVAL;
    const sv_follow_auth_t none = {0};
    if (!auth)
        auth = &none;
    psc_opts_t po = {.servers = servers,
                     .token = auth->token && auth->token[0] ? auth->token : NULL,
                     .timeout_ms = timeout_ms,
                     .connect_timeout_ms = timeout_ms};
    psc_tls_opts_t tls = {.ca = auth->tls_ca,
                          .cert = auth->tls_cert && auth->tls_cert[0] ? auth->tls_cert : NULL,
                          .key = auth->tls_key && auth->tls_key[0] ? auth->tls_key : NULL,
                          .server_name = auth->tls_server_name};
    psc_t *c;
    int rc = psc_connect2(&po, auth->tls_ca && auth->tls_ca[0] ? &tls : NULL, why, whycap, &c);
    if (rc)
        return rc;
    const size_t need = psc_map_text(c, map, mapcap);
    if (need >= mapcap) {
        rc = PC_ETOOBIG;
        if (why && whycap)
            snprintf(why, whycap, "the cluster map needs %zu bytes", need + 1);
    }
    size_t len = 0;
    if (!rc && (rc = psc_tables(c, tables, tablescap, &len)) && why && whycap)
        snprintf(why, whycap, "the servers' tables: %s%s", psc_strerror(rc),
                 rc == PC_ESTATE ? " (the servers disagree on the tables' settings)" : "");
    psc_close(c);
    return rc;
}
