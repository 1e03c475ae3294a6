/* The serving replica's follower end to end (serve/sv_follow.h, docs/serving.md "The replica
 * and its follower"): ps-server processes on loopback, a replica (sv_sparse) kept up to date by
 * sv_follow while a client pushes:
 *  - two servers, pushes going on while the follower runs: once the pushes stop and the follower
 *    is caught up (sv_follow_caught_up with the servers' uids and heads), the replica's checksum
 *    of every row equals the same checksum over the servers' rows (a scan of every part of each
 *    server), and lookups of pushed and never-pushed keys equal the servers' Lookup (rows and
 *    found); a table with capacity_rows evicts on the servers and the evicted keys go away in
 *    the replica; the speed of catching up after a burst of pushes is printed; a new follower
 *    of the same replica from the positions it holds applies deltas only;
 *  - a tiny ring (--delta-log-entries=64): the follower falls behind, rescans, converges;
 *  - kill -9 of a server: the replica keeps answering that server's keys from its last rows and
 *    reports it down; the server restarted on the same port holds a new (empty) table: the
 *    follower rescans it and converges again;
 *  - a replica loaded from the servers' checkpoints (read-only) follows from the checkpointed
 *    uids and log positions: the changes after the cut arrive by the stream, with no rescan;
 *  - map changes (docs/serving.md "After a map change"), through a replica as ps-serve runs it
 *    (sv_serve, ticked by a thread): two replicated servers (server 0 the coordinator) under
 *    pushes, `psctl reshard add` of a third server, then kill -9 of server 1 (its backups
 *    promoted); after each, once the pushes stop, the replica's rows equal the primaries' (the
 *    checksum of every row, lookups of every key) and it follows the servers' map version, with
 *    one new layout swapped in per change (without them, the moved slots' rows stay as they
 *    were at the move and the checksums differ);
 *  - a table created on the servers (psctl create) after the replica started: followed within
 *    tables_poll_ms, its rows equal the servers', the rows held before kept; dropped and
 *    created at once with another dim, the replica follows the new one (it kept the old dim
 *    before); dropped again (psctl drop), it goes from the replica;
 *  - a map change (SIGHUP) while a table the replica keeps is dropped on the servers: the new
 *    layout carries that table's last rows and swaps in.
 * argv[1] is the ps-server binary (psctl beside it). Every wait is bounded. */
#include "proc_util.h"
#include "table_check.h"
#include "cluster_check.h"

#include "emberps/psclient.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "ps_ckpt.h"
#include "sv_follow.h"
#include "sv_serve.h"
#include "sv_sparse.h"

#include <pthread.h>
#include <stdatomic.h>

enum { SCAN_CAP = 1 << 16 };

static const char *k_emb = "name=emb,dim=8,optimizer=adagrad,shards=4";
static const char *k_cap = "name=cap,dim=4,optimizer=sgd,capacity_rows=300,shards=2,missing=zeros";

typedef struct cluster {
    int n;
    int port[2], grpc[2];
    pid_t pid[2];
    char dir[256], map[256], maparg[300], tables[300], logarg[64];
    char ckdir[2][300], ckarg[2][320]; /* with checkpoints: each server's --ckpt-dir */
} cluster_t;

static void start_server(cluster_t *k, int i) {
    const char *extra[] = {k->maparg, k->tables, k->logarg, k->ckarg[i][0] ? k->ckarg[i] : NULL,
                           NULL};
    k->pid[i] = pu_spawn(k->port[i], k->dir, extra, &k->grpc[i]);
}

static void cluster_up2(cluster_t *k, int n, const char *tag, const char *log_entries, bool ckpt) {
    memset(k, 0, sizeof *k);
    k->n = n;
    tc_tmpdir(k->dir, sizeof k->dir, tag);
    for (int i = 0; ckpt && i < n; i++) {
        snprintf(k->ckdir[i], sizeof k->ckdir[i], "%s/ck-%d", k->dir, i);
        snprintf(k->ckarg[i], sizeof k->ckarg[i], "--ckpt-dir=%s", k->ckdir[i]);
    }
    for (int i = 0; i < n; i++)
        k->port[i] = pu_free_port();
    if (n == 2)
        snprintf(k->map, sizeof k->map,
                 "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1",
                 k->port[0], k->port[1]);
    else
        snprintf(k->map, sizeof k->map, "version=1;servers=127.0.0.1:%d;slots=0-16383:0",
                 k->port[0]);
    snprintf(k->maparg, sizeof k->maparg, "--cluster-map=%s", k->map);
    snprintf(k->tables, sizeof k->tables, "--tables=%s;%s", k_emb, k_cap);
    snprintf(k->logarg, sizeof k->logarg, "--delta-log-entries=%s", log_entries);
    for (int i = 0; i < n; i++)
        start_server(k, i);
}

static void cluster_up(cluster_t *k, int n, const char *tag, const char *log_entries) {
    cluster_up2(k, n, tag, log_entries, false);
}

static void cluster_down(cluster_t *k) {
    for (int i = 0; i < k->n; i++)
        if (k->pid[i] > 0)
            pu_stop(k->pid[i]);
    tc_rmdir(k->dir);
}

static psc_t *connect_to(const char *servers) {
    psc_opts_t o = {.servers = servers, .timeout_ms = 5000, .retries = 4};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

/* A replica of the cluster's tables and its follower (not started). */
static sv_sparse_t *replica(const cluster_t *k, sv_follow_t **f) {
    char map[4096], tables[8192], why[512];
    int rc = sv_follow_discover(k->map, NULL, 5000, map, sizeof map, tables, sizeof tables, why,
                                sizeof why);
    if (rc)
        fail_msg("discover: %s: %s", pc_err_name(rc), why);
    sv_sparse_t *s;
    assert_int_equal(sv_sparse_create(map, &s, why, sizeof why), 0);
    assert_int_equal(sv_sparse_servers(s), (size_t)k->n);
    rc = sv_sparse_add_tables(s, tables, "emb,cap", why, sizeof why);
    if (rc)
        fail_msg("add tables: %s", why);
    sv_follow_opts_t o;
    sv_follow_opts_defaults(&o);
    o.timeout_ms = 1000;
    assert_int_equal(sv_follow_create(s, &o, NULL, NULL, 0, f), 0);
    return s;
}

/* ---- the servers' side ---- */

typedef struct scanbuf {
    uint64_t keys[SCAN_CAP];
    uint8_t found[SCAN_CAP];
    float rows[SCAN_CAP * 8];
} scanbuf_t;

static scanbuf_t g_buf;

/* Server `srv`'s table: uid and head now (a scan of one small part). */
static void server_state(psc_t *c, uint32_t srv, const char *table, uint32_t dim, uint64_t *uid,
                         uint64_t *head) {
    psc_stream_req_t q = {.server = srv,
                          .table = table,
                          .dim = dim,
                          .part = 0,
                          .parts = 4096,
                          .cap = SCAN_CAP,
                          .keys = g_buf.keys,
                          .found = g_buf.found,
                          .rows = g_buf.rows};
    psc_stream_t out;
    char why[600];
    int rc = psc_scan(c, &q, &out, why, sizeof why);
    if (rc)
        fail_msg("scan of server %u: %s: %s", srv, pc_err_name(rc), why);
    *uid = out.uid;
    *head = out.next;
}

/* sv_sparse_checksum's figure over the servers' rows: every part of every server scanned that
 * is primary of some slot in c's map (a replicated server's scan carries its primary slots). */
static void server_checksum(psc_t *c, int nsrv, const char *table, uint32_t dim, uint64_t *sum,
                            uint64_t *rows) {
    *sum = *rows = 0;
    char text[4096];
    pc_cluster_map_t *m;
    psc_map_text(c, text, sizeof text);
    assert_int_equal(pc_cmap_parse(text, &m, NULL, 0), 0);
    for (int srv = 0; srv < nsrv; srv++) {
        for (uint32_t p = 0; p < 4 && pc_cmap_server_slots(m, (uint32_t)srv); p++) {
            psc_stream_req_t q = {.server = (uint32_t)srv,
                                  .table = table,
                                  .dim = dim,
                                  .part = p,
                                  .parts = 4,
                                  .cap = SCAN_CAP,
                                  .keys = g_buf.keys,
                                  .found = g_buf.found,
                                  .rows = g_buf.rows};
            psc_stream_t out;
            char why[600];
            int rc = psc_scan(c, &q, &out, why, sizeof why);
            if (rc)
                fail_msg("scan: %s: %s", pc_err_name(rc), why);
            for (uint32_t i = 0; i < out.n; i++) {
                if (!g_buf.found[i])
                    continue;
                *sum += sv_sparse_row_hash(g_buf.keys[i], g_buf.rows + (size_t)i * dim, dim);
                ++*rows;
            }
        }
    }
    pc_cmap_destroy(m);
}

/* Wait (bounded) until the follower is at least at the servers' present state of `table`;
 * returns the seconds it took. */
static double wait_caught_up(sv_follow_t *f, psc_t *c, int nsrv, const char *table, uint32_t dim,
                             double limit) {
    uint64_t uids[2], heads[2];
    for (int i = 0; i < nsrv; i++)
        server_state(c, (uint32_t)i, table, dim, &uids[i], &heads[i]);
    const double t0 = pu_now();
    while (!sv_follow_caught_up(f, table, uids, heads, (size_t)nsrv)) {
        if (pu_now() - t0 > limit) {
            sv_follow_source_t st[8];
            size_t n = sv_follow_status(f, st, 8);
            for (size_t i = 0; i < n && i < 8; i++)
                print_message("  %s %s: %s uid %016llx pos %llu head %llu (%s)\n", st[i].addr,
                              st[i].table, sv_source_state_name(st[i].state),
                              (unsigned long long)st[i].uid, (unsigned long long)st[i].position,
                              (unsigned long long)st[i].head, st[i].last_error);
            fail_msg("the follower did not catch up on %s within %.0f s", table, limit);
        }
        usleep(1000);
    }
    return pu_now() - t0;
}

/* The replica's checksum of `table` equals the servers'. */
static void assert_same_rows(sv_sparse_t *s, psc_t *c, int nsrv, const char *table, uint32_t dim) {
    uint64_t a, ar, b, br;
    server_checksum(c, nsrv, table, dim, &a, &ar);
    assert_int_equal(sv_sparse_checksum(s, table, &b, &br), 0);
    print_message("%s: %llu rows at the servers, %llu in the replica, checksums %016llx %016llx\n",
                  table, (unsigned long long)ar, (unsigned long long)br, (unsigned long long)a,
                  (unsigned long long)b);
    assert_int_equal(ar, br);
    assert_true(a == b);
}

/* Lookups of keys[0..n) answer the same rows and found flags from the replica as from the
 * servers; returns how many were found. */
static size_t assert_same_lookups(sv_sparse_t *s, psc_t *c, const char *table, uint32_t dim,
                                  const uint64_t *keys, size_t n) {
    float *a = malloc(n * dim * 4), *b = malloc(n * dim * 4);
    uint8_t *fa = malloc(n), *fb = malloc(n);
    assert_int_equal(psc_lookup(c, table, keys, n, dim, a, fa), 0);
    assert_int_equal(sv_sparse_lookup(s, table, keys, n, b, n * dim, fb), 0);
    size_t present = 0;
    for (size_t i = 0; i < n; i++) {
        if (fa[i] != fb[i])
            fail_msg("%s key %zu: found %d at the servers, %d in the replica", table, i, fa[i],
                     fb[i]);
        if (memcmp(a + i * dim, b + i * dim, dim * 4))
            fail_msg("%s key %zu (found %d): rows differ", table, i, fa[i]);
        present += fa[i];
    }
    free(a);
    free(b);
    free(fa);
    free(fb);
    return present;
}

/* ---- pushes ---- */

static uint64_t pool_key(uint64_t i) {
    return (i + 1) * 0x9E3779B97F4A7C15ULL;
}

/* One push of n keys drawn from pool keys [0, pool) to table (dim), seeded by r. */
static int push_round(psc_t *c, const char *table, uint32_t dim, uint64_t r, int n, uint64_t pool) {
    uint64_t *keys = malloc((size_t)n * 8);
    float *g = malloc((size_t)n * dim * 4);
    uint64_t rng = 77 + r;
    for (int i = 0; i < n; i++) {
        keys[i] = pool_key(tu_rand(&rng) % pool);
        for (uint32_t e = 0; e < dim; e++)
            g[(size_t)i * dim + e] = tu_gauss(&rng) * 0.1f;
    }
    int rc = psc_push(c, table, keys, (size_t)n, dim, g, NULL);
    free(keys);
    free(g);
    return rc;
}

typedef struct pusher {
    psc_t *c;
    bool tolerant; /* failures are counted, not the end (a server is killed meanwhile) */
    atomic_bool stop;
    uint64_t rounds, rows, failed;
    int rc; /* the first failure (cmocka's asserts belong to the main thread) */
} pusher_t;

static void *push_main(void *arg) {
    pusher_t *p = arg;
    while (!atomic_load(&p->stop) && !p->rc) {
        int rc = push_round(p->c, "emb", 8, 1000 + p->rounds, 500, 20000);
        if (!rc)
            rc = push_round(p->c, "cap", 4, 5000 + p->rounds, 50, 2000);
        if (rc && p->tolerant)
            p->failed++;
        else
            p->rc = rc;
        p->rounds++;
        p->rows += 550;
        usleep(2000);
    }
    return NULL;
}

/* ---- tests ---- */

static void test_follow_while_pushing(void **state) {
    (void)state;
    cluster_t k;
    cluster_up(&k, 2, "follow", "1Mi");
    psc_t *c = connect_to(k.map);
    for (int r = 0; r < 5; r++) /* rows before the follower starts: its first scan */
        assert_int_equal(push_round(c, "emb", 8, (uint64_t)r, 2000, 20000), 0);
    sv_follow_t *f;
    sv_sparse_t *s = replica(&k, &f);
    assert_int_equal(sv_follow_start(f), 0);
    pusher_t p = {.c = c};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, push_main, &p), 0);
    const double t0 = pu_now();
    uint64_t lookups = 0;
    float rows[64 * 8];
    uint8_t found[64];
    uint64_t keys[64];
    while (pu_now() - t0 < 2.0) { /* serve lookups meanwhile */
        for (int i = 0; i < 64; i++)
            keys[i] = pool_key((lookups * 64 + (uint64_t)i) % 20000);
        assert_int_equal(sv_sparse_lookup(s, "emb", keys, 64, rows, 64 * 8, found), 0);
        lookups++;
        usleep(500);
    }
    atomic_store(&p.stop, true);
    pthread_join(th, NULL);
    assert_int_equal(p.rc, 0);
    print_message("%llu push rounds (%llu rows) while following; %llu lookups served\n",
                  (unsigned long long)p.rounds, (unsigned long long)p.rows,
                  (unsigned long long)lookups);
    double took = wait_caught_up(f, c, 2, "emb", 8, 20);
    took += wait_caught_up(f, c, 2, "cap", 4, 20);
    print_message("caught up %.1f ms after the pushes stopped\n", took * 1e3);
    assert_same_rows(s, c, 2, "emb", 8);
    assert_same_rows(s, c, 2, "cap", 4);
    /* every pool key: pushed or not, present or evicted, the same answer */
    static uint64_t all[20000];
    for (uint64_t i = 0; i < 20000; i++)
        all[i] = pool_key(i);
    size_t present = assert_same_lookups(s, c, "emb", 8, all, 20000);
    size_t kept = assert_same_lookups(s, c, "cap", 4, all, 2000);
    print_message("emb: %zu of 20000 keys present; cap: %zu of 2000 (the rest evicted or never "
                  "pushed, absent in both)\n",
                  present, kept);
    assert_true(present > 10000);
    assert_true(kept > 0 && kept <= 700); /* capacity_rows=300 per server */
    /* never-pushed keys: the table's initial rows (emb) or zeros (cap), found 0 */
    for (uint64_t i = 0; i < 1000; i++)
        all[i] = pool_key(1000000 + i);
    assert_int_equal(assert_same_lookups(s, c, "emb", 8, all, 1000), 0);
    assert_int_equal(assert_same_lookups(s, c, "cap", 4, all, 1000), 0);
    sv_follow_source_t st[4];
    assert_int_equal(sv_follow_status(f, st, 4), 4);
    for (int i = 0; i < 4; i++) {
        print_message("  %s %s: %s, %llu rows applied, %llu DELTAS, %llu rescans, lag %llu ms\n",
                      st[i].addr, st[i].table, sv_source_state_name(st[i].state),
                      (unsigned long long)st[i].rows_applied,
                      (unsigned long long)st[i].deltas_calls, (unsigned long long)st[i].rescans,
                      (unsigned long long)st[i].lag_ms);
        assert_int_equal(st[i].state, SV_SOURCE_FOLLOWING);
        assert_int_equal(st[i].rescans, 0);
        assert_int_equal(st[i].lag_entries, 0);
    }
    /* catching up after a burst: 40 pushes of 5000 distinct keys as fast as the client goes */
    double b0 = pu_now();
    for (int r = 0; r < 40; r++)
        assert_int_equal(push_round(c, "emb", 8, 90000 + (uint64_t)r, 5000, 1000000), 0);
    const double pushed = pu_now() - b0;
    const double behind = wait_caught_up(f, c, 2, "emb", 8, 30);
    print_message("burst: 200000 rows pushed in %.1f ms (%.0f rows/s); the replica caught up "
                  "%.1f ms after the last push (%.0f rows/s end to end)\n",
                  pushed * 1e3, 200000 / pushed, behind * 1e3, 200000 / (pu_now() - b0));
    assert_same_rows(s, c, 2, "emb", 8);
    uint64_t uids[2], pos[2];
    assert_int_equal(sv_follow_positions(f, "emb", uids, pos, 2), 2);
    assert_true(uids[0] && uids[1] && uids[0] != uids[1]);
    /* a new follower of the same replica from the positions it holds: no scan, no rescan */
    sv_sparse_start_t starts[4];
    for (int i = 0; i < 2; i++) {
        starts[i] = (sv_sparse_start_t){.server = (uint32_t)i, .uid = uids[i], .position = pos[i]};
        snprintf(starts[i].table, sizeof starts[i].table, "emb");
    }
    assert_int_equal(sv_follow_positions(f, "cap", uids, pos, 2), 2);
    for (int i = 0; i < 2; i++) {
        starts[2 + i] =
            (sv_sparse_start_t){.server = (uint32_t)i, .uid = uids[i], .position = pos[i]};
        snprintf(starts[2 + i].table, sizeof starts[2 + i].table, "cap");
    }
    sv_follow_destroy(f);
    for (int r = 0; r < 10; r++) {
        assert_int_equal(push_round(c, "emb", 8, 95000 + (uint64_t)r, 1000, 1000000), 0);
        assert_int_equal(push_round(c, "cap", 4, 96000 + (uint64_t)r, 100, 2000), 0);
    }
    sv_follow_opts_t o;
    sv_follow_opts_defaults(&o);
    assert_int_equal(sv_follow_create(s, &o, NULL, starts, 4, &f), 0);
    assert_int_equal(sv_follow_start(f), 0);
    wait_caught_up(f, c, 2, "emb", 8, 20);
    wait_caught_up(f, c, 2, "cap", 4, 20);
    assert_same_rows(s, c, 2, "emb", 8);
    assert_same_rows(s, c, 2, "cap", 4);
    assert_int_equal(sv_follow_status(f, st, 4), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(st[i].rescans, 0);
        assert_true(st[i].rows_applied > 0 && st[i].rows_applied < 20000); /* deltas only */
    }
    sv_follow_destroy(f);
    sv_sparse_destroy(s);
    psc_close(c);
    cluster_down(&k);
}

static void test_behind_ring(void **state) {
    (void)state;
    cluster_t k;
    cluster_up(&k, 1, "followring", "64");
    psc_t *c = connect_to(k.map);
    sv_follow_t *f;
    sv_sparse_t *s = replica(&k, &f);
    assert_int_equal(sv_follow_start(f), 0);
    for (int r = 0; r < 20; r++) { /* 300 keys a push: over the ring of 64 each time */
        assert_int_equal(push_round(c, "emb", 8, 300 + (uint64_t)r, 300, 1000), 0);
        usleep(5000);
    }
    wait_caught_up(f, c, 1, "emb", 8, 20);
    wait_caught_up(f, c, 1, "cap", 4, 20);
    assert_same_rows(s, c, 1, "emb", 8);
    sv_follow_source_t st[2];
    assert_int_equal(sv_follow_status(f, st, 2), 2);
    const sv_follow_source_t *e = strcmp(st[0].table, "emb") == 0 ? &st[0] : &st[1];
    print_message("emb: %llu rescans, %llu rows applied; last: %s\n",
                  (unsigned long long)e->rescans, (unsigned long long)e->rows_applied,
                  e->last_error);
    assert_true(e->rescans >= 1);
    assert_int_equal(e->last_rc, PC_ERANGE);
    assert_int_equal(e->state, SV_SOURCE_FOLLOWING);
    static uint64_t all[1000];
    for (uint64_t i = 0; i < 1000; i++)
        all[i] = pool_key(i);
    assert_true(assert_same_lookups(s, c, "emb", 8, all, 1000) > 500);
    sv_follow_destroy(f);
    sv_sparse_destroy(s);
    psc_close(c);
    cluster_down(&k);
}

static void test_server_restart(void **state) {
    (void)state;
    cluster_t k;
    cluster_up(&k, 2, "followkill", "1Mi");
    psc_t *c = connect_to(k.map);
    for (int r = 0; r < 4; r++)
        assert_int_equal(push_round(c, "emb", 8, 700 + (uint64_t)r, 2000, 5000), 0);
    sv_follow_t *f;
    sv_sparse_t *s = replica(&k, &f);
    assert_int_equal(sv_follow_start(f), 0);
    wait_caught_up(f, c, 2, "emb", 8, 20);
    assert_same_rows(s, c, 2, "emb", 8);
    static uint64_t all[5000];
    static float before[5000 * 8], during[5000 * 8];
    static uint8_t fb[5000], fd[5000];
    for (uint64_t i = 0; i < 5000; i++)
        all[i] = pool_key(i);
    assert_int_equal(sv_sparse_lookup(s, "emb", all, 5000, before, 5000 * 8, fb), 0);
    uint64_t uids[2], pos[2];
    assert_int_equal(sv_follow_positions(f, "emb", uids, pos, 2), 2);
    /* server 1 dies: its rows stay served as they were, and it is reported down */
    kill(k.pid[1], SIGKILL);
    assert_int_equal(pu_reap(k.pid[1], 10), 128 + SIGKILL);
    k.pid[1] = 0;
    const double t0 = pu_now();
    sv_follow_source_t st[4];
    for (;;) {
        assert_int_equal(sv_follow_status(f, st, 4), 4);
        bool down = false;
        for (int i = 0; i < 4; i++)
            down = down || (st[i].server == 1 && st[i].state == SV_SOURCE_DOWN);
        if (down)
            break;
        if (pu_now() - t0 > 15)
            fail_msg("server 1 was not reported down");
        usleep(10000);
    }
    for (int i = 0; i < 4; i++)
        if (st[i].server == 1)
            print_message("server 1 %s: %s (%s) after %.0f ms\n", st[i].table,
                          sv_source_state_name(st[i].state), st[i].last_error,
                          (pu_now() - t0) * 1e3);
    assert_int_equal(sv_sparse_lookup(s, "emb", all, 5000, during, 5000 * 8, fd), 0);
    assert_memory_equal(before, during, sizeof before);
    assert_memory_equal(fb, fd, sizeof fb);
    usleep(300000); /* a few retries while it is down */
    assert_int_equal(sv_sparse_lookup(s, "emb", all, 5000, during, 5000 * 8, fd), 0);
    assert_memory_equal(before, during, sizeof before);
    /* back on the same port with an empty table (nothing checkpointed): a new uid, a rescan */
    start_server(&k, 1);
    assert_int_equal(push_round(c, "emb", 8, 800, 2000, 5000), 0);
    wait_caught_up(f, c, 2, "emb", 8, 20);
    assert_same_rows(s, c, 2, "emb", 8);
    assert_same_lookups(s, c, "emb", 8, all, 5000);
    uint64_t uids2[2], pos2[2];
    assert_int_equal(sv_follow_positions(f, "emb", uids2, pos2, 2), 2);
    assert_true(uids2[0] == uids[0] && uids2[1] != uids[1]);
    /* the old table of server 1 was followed before: anything paired with it is satisfied */
    assert_true(sv_follow_caught_up(f, "emb", uids, pos, 2));
    uint64_t unknown[2] = {uids[0], 12345};
    assert_false(sv_follow_caught_up(f, "emb", unknown, pos, 2));
    /* a follower of a new layout from this one's rows (as a relayout makes it) keeps that
     * history: the model paired with the old table is not held back for good */
    sv_sparse_start_t starts[4];
    const size_t ns = sv_follow_unmoved(f, sv_follow_map_version(f), starts, 4);
    assert_int_equal(ns, 4); /* both tables on both servers */
    sv_follow_opts_t o2;
    sv_follow_opts_defaults(&o2);
    sv_follow_t *f2;
    assert_int_equal(sv_follow_create(s, &o2, NULL, starts, ns, &f2), 0);
    assert_true(sv_follow_caught_up(f2, "emb", uids2, pos2, 2));
    assert_false(sv_follow_caught_up(f2, "emb", uids, pos, 2));
    sv_follow_inherit(f2, f);
    assert_true(sv_follow_caught_up(f2, "emb", uids, pos, 2));
    assert_false(sv_follow_caught_up(f2, "emb", unknown, pos, 2));
    sv_follow_destroy(f2);
    assert_int_equal(sv_follow_status(f, st, 4), 4);
    for (int i = 0; i < 4; i++) {
        print_message("  %s %s: %s, %llu rescans (%s)\n", st[i].addr, st[i].table,
                      sv_source_state_name(st[i].state), (unsigned long long)st[i].rescans,
                      st[i].last_error);
        assert_int_equal(st[i].state, SV_SOURCE_FOLLOWING);
        assert_int_equal(st[i].rescans, st[i].server == 1 ? 1 : 0);
    }
    sv_follow_destroy(f);
    sv_sparse_destroy(s);
    psc_close(c);
    cluster_down(&k);
}

/* Published checkpoints in dir. */
static size_t count_ckpts(const char *dir) {
    size_t n = 0;
    if (ps_ckpt_list(dir, NULL, 0, &n))
        return 0;
    return n;
}

static void test_start_from_checkpoint(void **state) {
    (void)state;
    cluster_t k;
    cluster_up2(&k, 2, "followckpt", "1Mi", true);
    psc_t *c = connect_to(k.map);
    /* a follower (here: one DELTAS each) started the logs before the checkpoint */
    for (uint32_t i = 0; i < 2; i++) {
        for (int t = 0; t < 2; t++) {
            psc_stream_req_t q = {.server = i,
                                  .table = t ? "cap" : "emb",
                                  .dim = t ? 4 : 8,
                                  .cap = SCAN_CAP,
                                  .keys = g_buf.keys,
                                  .found = g_buf.found,
                                  .rows = g_buf.rows};
            psc_stream_t out;
            assert_int_equal(psc_deltas(c, &q, &out, NULL, 0), PC_ERANGE);
        }
    }
    for (int r = 0; r < 10; r++) {
        assert_int_equal(push_round(c, "emb", 8, 3000 + (uint64_t)r, 2000, 30000), 0);
        assert_int_equal(push_round(c, "cap", 4, 4000 + (uint64_t)r, 100, 2000), 0);
    }
    for (int i = 0; i < 2; i++)
        kill(k.pid[i], SIGUSR1); /* checkpoint now */
    for (double t0 = pu_now(); pu_now() - t0 < 10; usleep(10000))
        if (count_ckpts(k.ckdir[0]) && count_ckpts(k.ckdir[1]))
            break;
    assert_int_equal(count_ckpts(k.ckdir[0]), 1);
    assert_int_equal(count_ckpts(k.ckdir[1]), 1);
    for (int r = 0; r < 5; r++) /* changes after the cut: the stream brings them */
        assert_int_equal(push_round(c, "emb", 8, 3100 + (uint64_t)r, 2000, 30000), 0);
    sv_follow_t *f;
    sv_sparse_t *s = replica(&k, &f);
    sv_follow_destroy(f);
    /* a load refused: one directory lacking, a directory without checkpoints */
    char why[512];
    const char *bad[2] = {k.ckdir[0], k.dir};
    sv_sparse_start_t *starts = NULL;
    size_t ns = 0;
    uint64_t restored[2];
    assert_int_equal(
        sv_sparse_load_checkpoints(s, bad, NULL, 1, NULL, &starts, &ns, why, sizeof why),
        PC_EINVAL);
    assert_int_equal(
        sv_sparse_load_checkpoints(s, bad, NULL, 2, NULL, &starts, &ns, why, sizeof why),
        PC_ENOTFOUND);
    print_message("refused: %s\n", why);
    assert_int_equal(sv_sparse_rows(s), 0); /* nothing replaced */
    const char *dirs[2] = {k.ckdir[0], k.ckdir[1]};
    const double t0 = pu_now();
    int rc = sv_sparse_load_checkpoints(s, dirs, NULL, 2, restored, &starts, &ns, why, sizeof why);
    if (rc)
        fail_msg("load: %s", why);
    const uint64_t loaded = sv_sparse_rows(s);
    print_message("loaded %llu rows from checkpoints %llu and %llu in %.1f ms\n",
                  (unsigned long long)loaded, (unsigned long long)restored[0],
                  (unsigned long long)restored[1], (pu_now() - t0) * 1e3);
    assert_int_equal(ns, 4);
    assert_true(loaded > 10000);
    for (int i = 0; i < 4; i++)
        assert_true(starts[i].uid && starts[i].position != UINT64_MAX);
    sv_follow_opts_t o;
    sv_follow_opts_defaults(&o);
    assert_int_equal(sv_follow_create(s, &o, NULL, starts, ns, &f), 0);
    free(starts);
    assert_int_equal(sv_follow_start(f), 0);
    wait_caught_up(f, c, 2, "emb", 8, 20);
    wait_caught_up(f, c, 2, "cap", 4, 20);
    assert_same_rows(s, c, 2, "emb", 8);
    assert_same_rows(s, c, 2, "cap", 4);
    sv_follow_source_t st[4];
    assert_int_equal(sv_follow_status(f, st, 4), 4);
    for (int i = 0; i < 4; i++) {
        print_message("  %s %s: %llu rows applied by the stream, %llu rescans\n", st[i].addr,
                      st[i].table, (unsigned long long)st[i].rows_applied,
                      (unsigned long long)st[i].rescans);
        assert_int_equal(st[i].rescans, 0);
        assert_int_equal(st[i].state, SV_SOURCE_FOLLOWING);
    }
    sv_follow_destroy(f);
    sv_sparse_destroy(s);
    psc_close(c);
    cluster_down(&k);
}

/* ---- map changes ---- */

static char g_psctl[600];

typedef struct ticker {
    sv_serve_t *sv;
    atomic_bool stop;
} ticker_t;

static void *tick_main(void *arg) { /* ps-serve's main loop, faster */
    ticker_t *t = arg;
    while (!atomic_load(&t->stop)) {
        sv_serve_tick(t->sv);
        usleep(20000);
    }
    return NULL;
}

static psc_t *connect_port(int port) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    return connect_to(addr);
}

/* Wait (bounded) until the replica's rows of `table` equal the primaries' (checksums of every
 * row) and every pool key looks up the same; the seconds it took. */
static double wait_same_rows(sv_serve_t *sv, int port0, int nsrv, const char *table, uint32_t dim,
                             uint64_t pool) {
    const double t0 = pu_now();
    uint64_t a = 0, ar = 0, b = 0, br = 0;
    for (;;) {
        psc_t *c = connect_port(port0); /* the servers' newest map */
        server_checksum(c, nsrv, table, dim, &a, &ar);
        sv_served_t *x = sv_serve_acquire(sv);
        const int rc = sv_sparse_checksum(sv_served_sparse(x), table, &b, &br);
        if (!rc && a == b && ar == br) {
            static uint64_t keys[20000];
            for (uint64_t i = 0; i < pool; i++)
                keys[i] = pool_key(i);
            const size_t present =
                assert_same_lookups(sv_served_sparse(x), c, table, dim, keys, pool);
            sv_serve_release(sv, x);
            psc_close(c);
            print_message("%s: the replica holds the primaries' %llu rows (%zu of %llu pool keys "
                          "present) %.2f s after the pushes stopped\n",
                          table, (unsigned long long)ar, present, (unsigned long long)pool,
                          pu_now() - t0);
            return pu_now() - t0;
        }
        sv_serve_release(sv, x);
        psc_close(c);
        if (pu_now() - t0 > 30)
            fail_msg("%s: the replica's rows never equalled the primaries': %llu rows, checksum "
                     "%016llx at the servers; %llu, %016llx in the replica",
                     table, (unsigned long long)ar, (unsigned long long)a, (unsigned long long)br,
                     (unsigned long long)b);
        usleep(50000);
    }
}

/* The replica follows a layout of the servers' map (the newest, or an older one with the same
 * primaries: versions that changed backups only need none): both tables of every primary
 * there, every source following; `more` new ones swapped in since *relayouts at least
 * (*relayouts: the count now). */
static void assert_layout(sv_serve_t *sv, int port0, uint64_t *relayouts, uint64_t more) {
    pc_cluster_map_t *m = cc_map_of(port0);
    sv_serve_status_t st;
    sv_source_status_t src[16];
    sv_serve_status(sv, &st, src, 16);
    print_message("map version %llu at the servers, %llu in the replica; %llu new layouts; %zu "
                  "sources\n",
                  (unsigned long long)pc_cmap_version(m), (unsigned long long)st.map_version,
                  (unsigned long long)st.relayouts, st.nsources);
    assert_true(st.map_version > 1 && st.map_version <= pc_cmap_version(m));
    assert_true(st.relayouts >= *relayouts + more);
    *relayouts = st.relayouts;
    size_t primaries = 0;
    for (uint32_t i = 0; i < pc_cmap_nservers(m); i++)
        primaries += pc_cmap_server_slots(m, i) > 0;
    assert_int_equal(st.nsources, 2 * primaries);
    for (size_t i = 0; i < st.nsources; i++)
        assert_string_equal(src[i].state, "following");
    pc_cmap_destroy(m);
}

/* Pushes a little longer, then stopped (thread th; some went through); the replica's rows of
 * both tables equal the primaries' and its layout is the servers' (assert_layout's relayouts
 * and more). */
static void settle(sv_serve_t *sv, int port0, pusher_t *p, pthread_t th, uint64_t *relayouts,
                   uint64_t more) {
    usleep(300000);
    atomic_store(&p->stop, true);
    pthread_join(th, NULL);
    assert_int_equal(p->rc, 0);
    print_message("%llu push rounds, %llu failed\n", (unsigned long long)(p->rounds % 100000),
                  (unsigned long long)p->failed);
    assert_true(p->failed < p->rounds % 100000);
    wait_same_rows(sv, port0, 3, "emb", 8, 20000);
    wait_same_rows(sv, port0, 3, "cap", 4, 2000);
    assert_layout(sv, port0, relayouts, more);
    /* and the map settles: no version a controller tick (a resharding target naming a server
     * that died since made its backups flap: added, dropped for the lease, added again) */
    pc_cluster_map_t *m = cc_map_of(port0);
    const uint64_t v0 = pc_cmap_version(m);
    pc_cmap_destroy(m);
    usleep(1000000);
    m = cc_map_of(port0);
    const uint64_t v1 = pc_cmap_version(m);
    pc_cmap_destroy(m);
    print_message("map versions %llu, then %llu a second later\n", (unsigned long long)v0,
                  (unsigned long long)v1);
    assert_true(v1 - v0 <= 2);
}

static bool server_has_slots(int port0, uint32_t server, bool want) {
    pc_cluster_map_t *m = cc_map_of(port0);
    const bool yes = pc_cmap_replicated(m) && (pc_cmap_server_slots(m, server) > 0) == want;
    pc_cmap_destroy(m);
    return yes;
}

static void test_follow_map_changes(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], tables[300], coordarg[64], maparg2[1024];
    tc_tmpdir(dir, sizeof dir, "followmap");
    int port[3], grpc0 = 0;
    pid_t pid[3];
    cc_two_servers(&port[0], &port[1], map, sizeof map, maparg, sizeof maparg);
    snprintf(tables, sizeof tables, "--tables=%s;%s", k_emb, k_cap);
    const char *e0[] = {maparg,           tables, "--coordinator", "--cluster-coordinator=self",
                        "--lease-ms=600", NULL};
    pid[0] = pu_spawn(port[0], dir, e0, &grpc0);
    snprintf(coordarg, sizeof coordarg, "--cluster-coordinator=127.0.0.1:%d", grpc0);
    const char *e1[] = {maparg, tables, coordarg, "--lease-ms=600", NULL};
    pid[1] = pu_spawn(port[1], dir, e1, NULL);
    for (double t0 = pu_now(); !server_has_slots(port[0], 1, true); usleep(20000))
        if (pu_now() - t0 > 15)
            fail_msg("the cluster map never named backups");
    psc_t *c = connect_port(port[0]);
    for (int r = 0; r < 3; r++) /* (a slow machine's leases lapse: maps may still move now) */
        for (double t0 = pu_now(); push_round(c, "emb", 8, (uint64_t)r, 2000, 20000);)
            if (pu_now() - t0 > 20)
                fail_msg("the first pushes never went through");
    sv_follow_opts_t fo;
    sv_follow_opts_defaults(&fo);
    fo.timeout_ms = 1000;
    char follow[64];
    snprintf(follow, sizeof follow, "127.0.0.1:%d", port[0]);
    const sv_serve_opts_t so = {
        .name = "m", .follow = follow, .evaluators = 1, .max_batch = 1, .fo = &fo};
    sv_serve_t *sv;
    assert_int_equal(sv_serve_create(&so, &sv), 0);
    ticker_t tk = {.sv = sv};
    pthread_t tth, pth;
    assert_int_equal(pthread_create(&tth, NULL, tick_main, &tk), 0);
    /* a third server added while pushes go on */
    pusher_t p = {.c = c, .tolerant = true};
    assert_int_equal(pthread_create(&pth, NULL, push_main, &p), 0);
    usleep(300000);
    port[2] = pu_free_port();
    cc_reshard_add(g_psctl, grpc0, port[2], maparg2, sizeof maparg2);
    const char *e2[] = {maparg2, tables, coordarg, "--lease-ms=600", NULL};
    pid[2] = pu_spawn(port[2], dir, e2, NULL);
    double t0 = pu_now();
    while (!cc_reshard_done(g_psctl, grpc0) || !server_has_slots(port[0], 2, true)) {
        if (pu_now() - t0 > 30)
            fail_msg("the third server never took its slots");
        usleep(50000);
    }
    print_message("server 2 took its slots after %.1f s\n", pu_now() - t0);
    uint64_t relayouts = 0;
    settle(sv, port[0], &p, pth, &relayouts, 1);
    /* server 1 killed while pushes go on: its slots' backups are promoted */
    pusher_t p2 = {.c = c, .tolerant = true, .rounds = 100000};
    assert_int_equal(pthread_create(&pth, NULL, push_main, &p2), 0);
    usleep(200000);
    const bool still_primary = server_has_slots(port[0], 1, true);
    kill(pid[1], SIGKILL);
    assert_int_equal(pu_reap(pid[1], 10), 128 + SIGKILL);
    t0 = pu_now();
    while (!server_has_slots(port[0], 1, false)) {
        if (pu_now() - t0 > 15)
            fail_msg("server 1's slots were never promoted");
        usleep(20000);
    }
    print_message("server 1's slots promoted %.1f s after its kill\n", pu_now() - t0);
    settle(sv, port[0], &p2, pth, &relayouts, still_primary); /* (a slow machine may have lost
                                                               * its lease before the kill) */
    atomic_store(&tk.stop, true);
    pthread_join(tth, NULL);
    sv_serve_destroy(sv);
    psc_close(c);
    pu_stop(pid[2]);
    pu_stop(pid[0]);
    tc_rmdir(dir);
}

/* Wait (20 s at most) until the replica serves table `name` with `dim` (0: not at all). */
static void wait_served_dim(sv_serve_t *sv, const char *name, uint32_t dim, const char *what) {
    const double t0 = pu_now();
    for (bool wrong = true; wrong; usleep(20000)) {
        sv_served_t *x = sv_serve_acquire(sv);
        wrong = sv_served_dim(x, name) != dim;
        sv_serve_release(sv, x);
        if (wrong && pu_now() - t0 > 20)
            fail_msg("%s", what);
    }
}

/* A table created on the servers after the replica started is followed (tables_poll_ms): its
 * rows reach the replica, equal to the servers', and the rows it held go on. */
static void test_follow_new_table(void **state) {
    (void)state;
    cluster_t k;
    cluster_up(&k, 2, "follownew", "1Mi");
    psc_t *c = connect_to(k.map);
    assert_int_equal(push_round(c, "emb", 8, 1, 2000, 20000), 0);
    sv_follow_opts_t fo;
    sv_follow_opts_defaults(&fo);
    fo.timeout_ms = 1000;
    fo.tables_poll_ms = 100;
    const sv_serve_opts_t so = {
        .name = "m", .follow = k.map, .evaluators = 1, .max_batch = 1, .fo = &fo};
    sv_serve_t *sv;
    assert_int_equal(sv_serve_create(&so, &sv), 0);
    ticker_t tk = {.sv = sv};
    pthread_t tth;
    assert_int_equal(pthread_create(&tth, NULL, tick_main, &tk), 0);
    wait_same_rows(sv, k.port[0], 2, "emb", 8, 20000);
    for (int i = 0; i < 2; i++) { /* psctl create on each server */
        char out[512];
        const char *args[] = {"create", "name=late,dim=4,optimizer=sgd,missing=zeros", NULL};
        assert_int_equal(pu_psctl(g_psctl, k.grpc[i], out, sizeof out, args), 0);
    }
    for (int r = 0; r < 5; r++) {
        assert_int_equal(push_round(c, "late", 4, 10 + (uint64_t)r, 1000, 5000), 0);
        assert_int_equal(push_round(c, "emb", 8, 20 + (uint64_t)r, 1000, 20000), 0);
    }
    wait_same_rows(sv, k.port[0], 2, "late", 4, 5000);
    wait_same_rows(sv, k.port[0], 2, "emb", 8, 20000);
    sv_serve_status_t st;
    sv_source_status_t src[8];
    sv_serve_status(sv, &st, src, 8);
    print_message("%llu new layouts; %zu sources\n", (unsigned long long)st.relayouts, st.nsources);
    assert_true(st.relayouts >= 1);
    assert_int_equal(st.nsources, 6); /* emb, cap and late on each server */
    for (size_t i = 0; i < st.nsources; i++)
        assert_string_equal(src[i].state, "following");
    for (int i = 0; i < 2; i++) { /* created again at once, with another dim */
        char out[512];
        const char *drop[] = {"drop", "late", NULL};
        const char *args[] = {"create", "name=late,dim=6,optimizer=sgd,missing=zeros", NULL};
        assert_int_equal(pu_psctl(g_psctl, k.grpc[i], out, sizeof out, drop), 0);
        assert_int_equal(pu_psctl(g_psctl, k.grpc[i], out, sizeof out, args), 0);
    }
    for (int r = 0; r < 3; r++)
        assert_int_equal(push_round(c, "late", 6, 30 + (uint64_t)r, 1000, 5000), 0);
    const double t1 = pu_now();
    wait_served_dim(sv, "late", 6, "the table created again with dim 6 kept its old dim");
    wait_same_rows(sv, k.port[0], 2, "late", 6, 5000);
    print_message("created again with another dim: followed after %.2f s\n", pu_now() - t1);
    for (int i = 0; i < 2; i++) { /* and dropped again */
        char out[512];
        const char *args[] = {"drop", "late", NULL};
        assert_int_equal(pu_psctl(g_psctl, k.grpc[i], out, sizeof out, args), 0);
    }
    const double t0 = pu_now();
    wait_served_dim(sv, "late", 0, "the dropped table stayed in the replica");
    sv_serve_status(sv, &st, src, 8);
    print_message("dropped: gone after %.2f s; %zu sources\n", pu_now() - t0, st.nsources);
    assert_int_equal(st.nsources, 4);
    wait_same_rows(sv, k.port[0], 2, "emb", 8, 20000);
    atomic_store(&tk.stop, true);
    pthread_join(tth, NULL);
    sv_serve_destroy(sv);
    psc_close(c);
    cluster_down(&k);
}

/* A map change while a table the replica holds is gone from the servers (dropped; as the dense
 * model's table is kept to serve its last rows; tables_poll_ms 0 here keeps any): the new
 * layout carries that table's last rows, routed by the new map, instead of waiting for scans no
 * server can answer, and the moved slots of the other table follow the servers again. Without
 * the carry the new layout never swaps in and the moved slots' rows stay as at the move.
 * `recreated`: the table is created again at once with another dim: the replica's table of the
 * old dim is on no server either (its scans answer PC_EDIM), and is carried the same way (before,
 * only PC_ENOTFOUND counted as gone: the new layout never swapped in). */
static void relayout_dropped(bool recreated) {
    char dir[256], mf[300], mfarg[320], tables[300], map[256], idx[2][32];
    tc_tmpdir(dir, sizeof dir, "followdrop");
    int port[2] = {pu_free_port(), pu_free_port()}, grpc[2];
    pid_t pid[2];
    snprintf(mf, sizeof mf, "%s/map", dir);
    snprintf(map, sizeof map,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", port[0],
             port[1]);
    tc_write_file(mf, map);
    snprintf(mfarg, sizeof mfarg, "--cluster-map-file=%s", mf);
    snprintf(tables, sizeof tables, "--tables=%s;%s", k_emb, k_cap);
    for (int i = 0; i < 2; i++) {
        snprintf(idx[i], sizeof idx[i], "--server-index=%d", i);
        const char *e[] = {mfarg, tables, idx[i], NULL};
        pid[i] = pu_spawn(port[i], dir, e, &grpc[i]);
    }
    psc_t *c = connect_to(map);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(push_round(c, "emb", 8, 40 + (uint64_t)r, 2000, 20000), 0);
        assert_int_equal(push_round(c, "cap", 4, 50 + (uint64_t)r, 100, 2000), 0);
    }
    sv_follow_opts_t fo;
    sv_follow_opts_defaults(&fo);
    fo.timeout_ms = 1000;
    fo.backoff_max_ms = 100;
    fo.tables_poll_ms = 0;
    const sv_serve_opts_t so = {
        .name = "m", .follow = map, .evaluators = 1, .max_batch = 1, .fo = &fo};
    sv_serve_t *sv;
    assert_int_equal(sv_serve_create(&so, &sv), 0);
    ticker_t tk = {.sv = sv};
    pthread_t tth;
    assert_int_equal(pthread_create(&tth, NULL, tick_main, &tk), 0);
    wait_same_rows(sv, port[0], 2, "emb", 8, 20000);
    wait_same_rows(sv, port[0], 2, "cap", 4, 2000);
    uint64_t sum0, rows0, sum1, rows1;
    sv_served_t *x = sv_serve_acquire(sv);
    assert_int_equal(sv_sparse_checksum(sv_served_sparse(x), "cap", &sum0, &rows0), 0);
    sv_serve_release(sv, x);
    for (int i = 0; i < 2; i++) {
        char out[512];
        const char *args[] = {"drop", "cap", NULL};
        assert_int_equal(pu_psctl(g_psctl, grpc[i], out, sizeof out, args), 0);
        const char *again[] = {"create", "name=cap,dim=6,optimizer=sgd,missing=zeros", NULL};
        if (recreated)
            assert_int_equal(pu_psctl(g_psctl, grpc[i], out, sizeof out, again), 0);
    }
    /* server 1 takes slots 4096-8191 (SIGHUP rereads the map file) */
    snprintf(map, sizeof map,
             "version=2;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-4095:0,4096-16383:1", port[0],
             port[1]);
    tc_write_file(mf, map);
    kill(pid[1], SIGHUP);
    kill(pid[0], SIGHUP);
    for (double t0 = pu_now();; usleep(20000)) {
        pc_cluster_map_t *m0 = cc_map_of(port[0]), *m1 = cc_map_of(port[1]);
        const bool both = pc_cmap_version(m0) == 2 && pc_cmap_version(m1) == 2;
        pc_cmap_destroy(m0);
        pc_cmap_destroy(m1);
        if (both)
            break;
        if (pu_now() - t0 > 10)
            fail_msg("the servers never read the new map");
    }
    for (int r = 0; r < 3; r++)
        assert_int_equal(push_round(c, "emb", 8, 60 + (uint64_t)r, 2000, 20000), 0);
    /* (server 0 keeps, and scans, its rows of the slots it gave away: a static map moves no
     * rows. So the checksums agree before the new layout too; its lookups do not) */
    sv_serve_status_t st;
    sv_source_status_t src[8];
    for (double t0 = pu_now();; usleep(20000)) {
        sv_serve_status(sv, &st, src, 8);
        if (st.relayouts)
            break;
        if (pu_now() - t0 > 20)
            fail_msg("the new layout never swapped in (map version %llu)",
                     (unsigned long long)st.map_version);
    }
    wait_same_rows(sv, port[0], 2, "emb", 8, 20000);
    sv_serve_status(sv, &st, src, 8);
    print_message("map version %llu in the replica, %llu new layouts\n",
                  (unsigned long long)st.map_version, (unsigned long long)st.relayouts);
    assert_int_equal(st.map_version, 2);
    assert_int_equal(st.relayouts, 1);
    x = sv_serve_acquire(sv); /* the dropped table's last rows, all of them, in the new layout */
    assert_int_equal(sv_sparse_checksum(sv_served_sparse(x), "cap", &sum1, &rows1), 0);
    sv_serve_release(sv, x);
    assert_int_equal(rows1, rows0);
    assert_true(sum1 == sum0);
    atomic_store(&tk.stop, true);
    pthread_join(tth, NULL);
    sv_serve_destroy(sv);
    psc_close(c);
    pu_stop(pid[0]);
    pu_stop(pid[1]);
    tc_rmdir(dir);
}

static void test_follow_relayout_dropped_table(void **state) {
    (void)state;
    relayout_dropped(false);
}

static void test_follow_relayout_table_other_dim(void **state) {
    (void)state;
    relayout_dropped(true);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_follow PATH-TO-ps-server\n");
        return 2;
    }
    pu_bin = argv[1];
    const char *slash = strrchr(pu_bin, '/');
    snprintf(g_psctl, sizeof g_psctl, "%.*spsctl", slash ? (int)(slash - pu_bin + 1) : 0, pu_bin);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follow_while_pushing),
        cmocka_unit_test(test_behind_ring),
        cmocka_unit_test(test_server_restart),
        cmocka_unit_test(test_start_from_checkpoint),
        cmocka_unit_test(test_follow_map_changes),
        cmocka_unit_test(test_follow_new_table),
        cmocka_unit_test(test_follow_relayout_dropped_table),
        cmocka_unit_test(test_follow_relayout_table_other_dim),
    };
    if (argc > 2) /* a test name pattern (cmocka's * and ?), to run one */
        cmocka_set_test_filter(argv[2]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    return rc;
}
