/* bench_ha.c: `ps-bench ha`: replicas and failover (docs/server.md "Replicas and failover").
 *
 * Two ps-server processes (one event loop each, pinned to the first CPU by bench_spawn), server 0
 * also the coordinator holding the cluster map and the leases (in memory), every slot with one
 * backup (--replicas=1, sync), leases of the product's default 2000 ms (--smoke: 600 ms). The
 * client (this process, pinned to the second CPU) pushes from two threads, each its own half of
 * an Adam table's keys (dim 16, batches of 256 consecutive keys), counting per key the pushes
 * answered and those that failed.
 * - Failover: after a warm-up, server 1 is killed with SIGKILL; pushes go on until 2 s after
 *   they are answered again (at most 20 s). failover_stall_s: the longest gap between two
 *   answered pushes from the kill on; the baseline beside it is the longest gap before the kill.
 *   lost_acked_pushes: over every key, the pushes answered for it that are not in Adam's step
 *   count t of its row on server 0 (primary of every slot by then, rows read with their
 *   optimizer state over the delta stream); the goal is 0. Pushes that failed may or may not be
 *   in t (applied and never confirmed), so t may exceed the answered count.
 * - Replication cost: push rows/s (4 threads, batches of 1000 keys, dim 64, Adagrad, 100k keys;
 *   --quick 50k, --smoke 5k) against the same two servers with backups (sync) and without
 *   (no coordinator: a fixed map), alternating, fresh servers each, two pairs;
 *   replication_push_cost = the R=1 / R=0 ratio of the pairs' means (goal >= 0.7);
 *   replication_push_cost_split the same with server 1 on the second CPU (beside the client)
 *   instead of beside server 0, R=0 and R=1 alike: what sharing one CPU costs the ratio.
 * - Live migration (docs/server.md "Live resharding"): the same two servers with backups (a dim-16
 *   table), a ps-worker (unpinned, --step-log) training on ps-datagen data (200k rows; --smoke
 *   20k; epochs until stopped); after 50 steps and a measured window, `psctl reshard add` lists a
 *   third server (started then, on CPU 0 too) which takes a third of the slots: copied, caught
 *   up, handed over, released. migrate_rows_per_s: the rows the third server holds as primary at
 *   the end over the seconds from psctl's call to the map matching the target (one `psctl
 *   reshard wait`, which polls the coordinator every 20 ms); migrate_train_dip: the worker's
 * samples/s (steps that ended) during the move over the window before it (goal >= 0.7).
 * - A rejoining backup's copy: rows pushed (dim 16, Adagrad), server 1 killed with -9 and server
 *   0 primary of every slot, server 1 started again: rejoin_copy_rows_per_s, the rows over the
 *   seconds from its start until the map has it in sync (lease 600 ms: the mark is cleared at a
 *   controller tick, 150 ms), for a RAM-only table and (cold_rejoin_copy_rows_per_s) a cold one
 *   with a tenth of the rows in RAM, whose copy walks server 0's RocksDB store; cold_copy_vs_ram
 *   their ratio.
 * - The etcd leader's death: the failover run again with the servers' map and leases in a
 *   3-member etcd on loopback (tests/support/etcd_cluster.sh), whose leader is killed with -9
 *   instead of a server. etcd_leader_kill_stall_s: the longest gap between answered pushes from
 *   the kill on; acknowledged pushes lost are counted as above, over both servers' tables. Null
 *   without etcd installed.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "emberps/psclient.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_time.h"
#include "psclient_repl.h"
#include "pw_datagen.h"

#define HA_DIM   16
#define HA_BATCH 256
#define NT       4 /* pushing threads of the replication cost */

static double now_s(void) {
    return (double)pc_time_mono_ns() * 1e-9;
}

typedef struct cluster {
    int pid0, pid1, p0, p1, g0;
    /* server 1's flags, for a restart (start1) */
    char maparg[300], coord[600], tables[200], lease[40], tier1[320];
    bool split; /* server 1 on the second CPU (the client's), not on the first with server 0 */
} cluster_t;

/* Server 1 (again) on port p1 with the cluster's flags. */
static int start1(const bench_opts_t *o, const char *dir, bool ha, cluster_t *c) {
    const char *e1[6] = {c->maparg, c->tables};
    int n = 2;
    if (c->tier1[0])
        e1[n++] = c->tier1;
    if (ha) {
        e1[n++] = c->coord;
        e1[n++] = c->lease;
    }
    bench_opts_t o1 = *o; /* bench_spawn pins to the first CPU of o's list */
    if (c->split && o->ncpu > 1)
        o1.cpu[0] = o->cpu[1];
    c->pid1 =
        bench_ps_server_at(&o1, "ha", dir, "s1", c->p1, (const char *const *)e1, &c->p1, NULL);
    return c->pid1 < 0 ? -1 : 0;
}

/* Two servers with `tables` (with `cold`, each with a cold tier of its own under dir); with
 * backups when ha, the map and leases in server 0's coordinator (in memory), or in etcd when
 * etcd_url is not NULL (etcd://...). */
static int cluster_up_on(const bench_opts_t *o, const char *dir, const char *tables, bool ha,
                         bool cold, bool split, const char *lease, const char *etcd_url,
                         cluster_t *c) {
    char map[256], tier0[320];
    memset(c, 0, sizeof *c);
    c->split = split;
    const int q0 = bench_free_port();
    c->p1 = bench_free_port();
    snprintf(map, sizeof map,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", q0, c->p1);
    snprintf(c->maparg, sizeof c->maparg, "--cluster-map=%s", map);
    snprintf(c->tables, sizeof c->tables, "%s", tables);
    snprintf(c->lease, sizeof c->lease, "%s", lease);
    snprintf(tier0, sizeof tier0, "--tier-dir=%s/tier0", dir);
    if (cold)
        snprintf(c->tier1, sizeof c->tier1, "--tier-dir=%s/tier1", dir);
    if (etcd_url)
        snprintf(c->coord, sizeof c->coord, "--cluster-coordinator=%s", etcd_url);
    const char *e0[7] = {c->maparg, tables};
    int n = 2;
    if (cold)
        e0[n++] = tier0;
    if (ha) { /* without: the map and tables only */
        e0[n++] = "--coordinator";
        e0[n++] = etcd_url ? c->coord : "--cluster-coordinator=self";
        e0[n++] = lease;
    }
    c->pid0 = bench_ps_server_at(o, "ha", dir, "s0", q0, e0, &c->p0, &c->g0);
    if (c->pid0 < 0)
        return -1;
    if (!etcd_url)
        snprintf(c->coord, sizeof c->coord, "--cluster-coordinator=127.0.0.1:%d", c->g0);
    if (start1(o, dir, ha, c)) {
        bench_stop(c->pid0);
        return -1;
    }
    return 0;
}

static int cluster_up(const bench_opts_t *o, const char *dir, const char *tables, bool ha,
                      const char *lease, cluster_t *c) {
    return cluster_up_on(o, dir, tables, ha, false, false, lease, NULL, c);
}

static void cluster_down(cluster_t *c) {
    bench_stop(c->pid1);
    bench_stop(c->pid0);
}

static psc_t *client_of(int port) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_opts_t po = {.servers = addr, .timeout_ms = 3000, .retries = 5};
    psc_t *c = NULL;
    return psc_connect(&po, &c) ? NULL : c;
}

/* Wait (bounded) until server 0's map names backups and gives server 1 its half. */
static bool wait_replicated(int port) {
    for (double t0 = now_s(); now_s() - t0 < 20; usleep(50000)) {
        psc_t *c = client_of(port);
        char text[1024] = "";
        if (c) {
            psc_map_text(c, text, sizeof text);
            psc_close(c);
        }
        pc_cluster_map_t *m;
        if (pc_cmap_parse(text, &m, NULL, 0))
            continue;
        const bool ok = pc_cmap_replicated(m) && pc_cmap_server_slots(m, 1) == PC_NSLOTS / 2;
        pc_cmap_destroy(m);
        if (ok)
            return true;
    }
    return false;
}

/* ==== failover ============================================================================= */

typedef struct pusher {
    psc_t *c;
    const uint64_t *keys;
    uint32_t n, *acked, *unsure;
    _Atomic bool *stop;
    _Atomic uint64_t *last_ok_ns, *kill_ns, *gap_before_ns, *gap_after_ns, *answered_after;
} pusher_t;

static void gap_note(pusher_t *p) {
    const uint64_t now = pc_time_mono_ns(), prev = atomic_exchange(p->last_ok_ns, now);
    const uint64_t kill = atomic_load(p->kill_ns);
    _Atomic uint64_t *gap = kill && now > kill ? p->gap_after_ns : p->gap_before_ns;
    const uint64_t g = now > prev ? now - prev : 0;
    for (uint64_t cur = atomic_load(gap); g > cur && !atomic_compare_exchange_weak(gap, &cur, g);)
        ;
    if (kill && now > kill)
        atomic_fetch_add(p->answered_after, 1);
}

static void *push_loop(void *arg) {
    pusher_t *p = arg;
    float g[HA_BATCH * HA_DIM];
    for (int i = 0; i < HA_BATCH * HA_DIM; i++)
        g[i] = 0.01f * (float)((i % 7) - 3);
    for (uint32_t at = 0; !atomic_load(p->stop); at = (at + HA_BATCH) % (p->n - HA_BATCH)) {
        const int rc = psc_push(p->c, "emb", p->keys + at, HA_BATCH, HA_DIM, g, NULL);
        for (uint32_t i = 0; i < HA_BATCH; i++)
            (rc ? p->unsure : p->acked)[at + i]++;
        if (rc)
            usleep(20000);
        else
            gap_note(p);
    }
    return NULL;
}

typedef struct key_at {
    uint64_t key;
    uint32_t i;
} key_at_t;

static int cmp_key(const void *a, const void *b) {
    const uint64_t x = ((const key_at_t *)a)->key, y = ((const key_at_t *)b)->key;
    return (x > y) - (x < y);
}

/* Adam's t of keys[0..n) on servers 0 .. nservers - 1 (their whole tables, with state, each key
 * from its primary) into t (0: no row). */
static int read_steps(psc_t *c, uint32_t nservers, const uint64_t *keys, uint32_t n, uint32_t *t) {
    const uint32_t stride = HA_DIM + 2 * HA_DIM + 1, cap = 65536;
    uint64_t *k = malloc((size_t)cap * 8);
    uint8_t *f = malloc(cap);
    float *rows = malloc((size_t)cap * stride * 4);
    key_at_t *idx = malloc((size_t)n * sizeof *idx);
    int rc = k && f && rows && idx ? 0 : PC_ENOMEM;
    for (uint32_t i = 0; !rc && i < n; i++)
        idx[i] = (key_at_t){keys[i], i};
    if (!rc)
        qsort(idx, n, sizeof *idx, cmp_key);
    memset(t, 0, (size_t)n * sizeof *t);
    for (uint32_t part = 0; !rc && part < 16 * nservers; part++) {
        psc_stream_req_t q = {.server = part / 16,
                              .table = "emb",
                              .dim = stride,
                              .part = part % 16,
                              .parts = 16,
                              .cap = cap,
                              .keys = k,
                              .found = f,
                              .rows = rows};
        psc_stream_t out;
        char why[256];
        if ((rc = psc__stream(c, true, &q, PC_STREAM_STATE, 0, 0, &out, why, sizeof why))) {
            fprintf(stderr, "ps-bench ha: reading the rows' state: %s\n", why);
            break;
        }
        for (uint32_t i = 0; i < out.n; i++) {
            const key_at_t want = {k[i], 0};
            const key_at_t *at = bsearch(&want, idx, n, sizeof *idx, cmp_key);
            if (at)
                memcpy(&t[at->i], &rows[(size_t)i * stride + 3 * HA_DIM], 4);
        }
    }
    free(k);
    free(f);
    free(rows);
    free(idx);
    return rc;
}

typedef struct failover {
    double stall_s, gap_before_s;
    long long lost, checked, failed_pushes, extra_in_t;
} failover_t;

/* What a failover run breaks: fn(ctx, cluster) (after the warm-up); `survivors` servers are left
 * (their tables read back). */
typedef struct fault {
    void (*fn)(void *ctx, cluster_t *cl);
    void *ctx;
    uint32_t survivors;
    const char *etcd_url; /* the servers' coordinator (NULL: server 0's) */
    double watch_s;       /* pushes go on at least this long after it */
} fault_t;

static void kill_server1(void *ctx, cluster_t *cl) {
    (void)ctx;
    kill(cl->pid1, SIGKILL);
    waitpid(cl->pid1, NULL, 0);
    cl->pid1 = -1;
}

static int run_failover(const bench_opts_t *o, const char *dir, const char *lease, uint32_t nkeys,
                        const fault_t *fault, failover_t *r) {
    cluster_t cl;
    if (cluster_up_on(o, dir, "--tables=name=emb,dim=16,optimizer=adam,lr=0.01", true, false, false,
                      lease, fault->etcd_url, &cl))
        return -1;
    int rc = wait_replicated(cl.p0) ? 0 : -1;
    if (rc)
        fprintf(stderr, "ps-bench ha: the servers never published a replicated map\n");
    uint64_t *keys = malloc((size_t)nkeys * 8);
    uint32_t *acked = calloc(nkeys, 4), *unsure = calloc(nkeys, 4), *t = calloc(nkeys, 4);
    for (uint32_t i = 0; i < nkeys; i++)
        keys[i] = bench_key(i);
    _Atomic bool stop = false;
    _Atomic uint64_t last_ok = pc_time_mono_ns(), kill_ns = 0, gb = 0, ga = 0, after = 0;
    psc_t *c = rc ? NULL : client_of(cl.p0);
    pthread_t th[2];
    pusher_t p[2];
    for (int i = 0; c && i < 2; i++) {
        p[i] = (pusher_t){c,
                          keys + i * (nkeys / 2),
                          nkeys / 2,
                          acked + i * (nkeys / 2),
                          unsure + i * (nkeys / 2),
                          &stop,
                          &last_ok,
                          &kill_ns,
                          &gb,
                          &ga,
                          &after};
        pthread_create(&th[i], NULL, push_loop, &p[i]);
    }
    if (c) {
        sleep(o->smoke ? 1 : 3); /* warm: both halves written and replicated */
        /* the baseline's gaps from a steady window: not the connect nor the first pushes, which
         * created the rows */
        atomic_store(&gb, 0);
        usleep(o->smoke ? 500000 : 2000000);
        fault->fn(fault->ctx, &cl);
        atomic_store(&kill_ns, pc_time_mono_ns());
        const double t_kill = now_s();
        double back = 0;
        while (now_s() - t_kill < 20 &&
               (!back || now_s() - back < 2 || now_s() - t_kill < fault->watch_s)) {
            if (!back && atomic_load(&after) > 0)
                back = now_s();
            usleep(10000);
        }
        atomic_store(&stop, true);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        if (!back) {
            fprintf(stderr, "ps-bench ha: no push was answered in 20 s after the kill\n");
            rc = -1;
        }
    }
    if (!rc && c && (rc = read_steps(c, fault->survivors, keys, nkeys, t)) != 0)
        rc = -1;
    memset(r, 0, sizeof *r);
    for (uint32_t i = 0; !rc && i < nkeys; i++) {
        if (!acked[i] && !unsure[i])
            continue;
        r->checked++;
        if (t[i] < acked[i])
            r->lost += acked[i] - t[i];
        else
            r->extra_in_t += t[i] - acked[i];
        r->failed_pushes += unsure[i];
    }
    r->failed_pushes /= HA_BATCH;
    r->stall_s = (double)atomic_load(&ga) * 1e-9;
    r->gap_before_s = (double)atomic_load(&gb) * 1e-9;
    if (c)
        psc_close(c);
    if (cl.pid1 > 0)
        bench_stop(cl.pid1);
    bench_stop(cl.pid0);
    free(keys);
    free(acked);
    free(unsure);
    free(t);
    return rc;
}

/* ==== replication cost ===================================================================== */

typedef struct rate_ctx {
    psc_t *c;
    uint64_t first, n;
    double secs;
    uint64_t rows;
    int rc;
} rate_ctx_t;

static void *rate_loop(void *arg) {
    rate_ctx_t *x = arg;
    enum { B = 1000, D = 64 };
    float *g = malloc(sizeof(float) * B * D);
    uint64_t *k = malloc(B * 8);
    for (int i = 0; i < B * D; i++)
        g[i] = 0.001f;
    const double t0 = now_s();
    for (uint64_t at = 0; now_s() - t0 < x->secs && !x->rc; at = (at + B) % (x->n - B)) {
        for (int i = 0; i < B; i++)
            k[i] = bench_key(x->first + at + (uint64_t)i);
        x->rc = psc_push(x->c, "emb", k, B, D, g, NULL);
        x->rows += B;
    }
    free(k);
    free(g);
    return NULL;
}

/* Push rows/s of 4 threads against two fresh servers, with backups (ha) or without. */
static double push_rate(const bench_opts_t *o, const char *dir, bool ha, bool split,
                        const char *lease, uint64_t nkeys, double secs) {
    cluster_t cl;
    if (cluster_up_on(o, dir, "--tables=name=emb,dim=64,optimizer=adagrad", ha, false, split, lease,
                      NULL, &cl))
        return -1;
    if (ha && !wait_replicated(cl.p0)) {
        cluster_down(&cl);
        return -1;
    }
    psc_t *c = client_of(cl.p0);
    double rate = -1;
    if (c) {
        rate_ctx_t x[NT];
        pthread_t th[NT];
        for (int i = 0; i < NT; i++) { /* a first pass creates the rows (and their copies) */
            x[i] = (rate_ctx_t){c, (uint64_t)i * (nkeys / NT), nkeys / NT, secs / 4, 0, 0};
            pthread_create(&th[i], NULL, rate_loop, &x[i]);
        }
        for (int i = 0; i < NT; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < NT; i++) {
            x[i] = (rate_ctx_t){c, (uint64_t)i * (nkeys / NT), nkeys / NT, secs, 0, 0};
            pthread_create(&th[i], NULL, rate_loop, &x[i]);
        }
        uint64_t rows = 0;
        int rc = 0;
        const double t0 = now_s();
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            rows += x[i].rows;
            rc = rc ? rc : x[i].rc;
        }
        rate = rc ? -1 : (double)rows / (now_s() - t0);
        if (rc)
            fprintf(stderr, "ps-bench ha: a push failed: %s\n", pc_strerror(rc));
        psc_close(c);
    }
    cluster_down(&cl);
    return rate;
}

/* ==== live migration ====================================================================== */

/* The ends of the steps a --step-log holds (ns, CLOCK_MONOTONIC) into *ends (malloc'ed); their
 * count. */
static size_t step_ends(const char *log, uint64_t **ends) {
    FILE *f = fopen(log, "r");
    size_t n = 0, cap = 0;
    *ends = NULL;
    int rank;
    unsigned long long round, ns;
    char what[8];
    while (f && fscanf(f, "%d %llu %7s %llu", &rank, &round, what, &ns) == 4) {
        if (strcmp(what, "end"))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            uint64_t *e = realloc(*ends, cap * sizeof *e);
            if (!e)
                break;
            *ends = e;
        }
        (*ends)[n++] = ns;
    }
    if (f)
        fclose(f);
    return n;
}

/* Steps that ended in [t0, t1) (ns) per second. */
static double steps_per_s(const uint64_t *ends, size_t n, uint64_t t0, uint64_t t1) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ends[i] >= t0 && ends[i] < t1;
    return t1 > t0 ? (double)k / ((double)(t1 - t0) * 1e-9) : 0;
}

/* psctl (next to ps-bench) with args; its stdout into out; its exit status. */
static int run_psctl(const char *args, char *out, size_t cap) {
    char bin[512], cmd[1600];
    bench_sibling("psctl", bin, sizeof bin);
    snprintf(cmd, sizeof cmd, "'%s' --timeout-ms=5000 %s", bin, args);
    return bench_run_output(cmd, out, cap);
}

typedef struct migrate {
    double rows_per_s, dip, secs, before, during;
    uint64_t rows;
} migrate_t;

static int run_migrate(const bench_opts_t *o, const char *dir, const char *lease, uint64_t nrows,
                       double secs, migrate_t *r) {
    enum { BATCH = 256 };
    char tr[300], log[300], wbin[512], cmd[2048], args[600], out[8192] = "", coord[64];
    snprintf(tr, sizeof tr, "%s/migrate.tsv", dir);
    snprintf(log, sizeof log, "%s/migrate.steps", dir);
    pw_datagen_opts_t go;
    pw_datagen_defaults(&go);
    go.rows = (int64_t)nrows;
    go.test_rows = 0;
    FILE *ft = fopen(tr, "w");
    if (!ft || pw_datagen_run(&go, ft, NULL, NULL)) {
        if (ft)
            fclose(ft);
        fprintf(stderr, "ps-bench ha: cannot write the training data\n");
        return -1;
    }
    fclose(ft);
    cluster_t cl;
    const char *tables = "--tables=name=emb,dim=16";
    if (cluster_up(o, dir, tables, true, lease, &cl))
        return -1;
    int rc = wait_replicated(cl.p0) ? 0 : -1, pid2 = -1, p2 = 0, g2 = 0, w = -1;
    bench_sibling("ps-worker", wbin, sizeof wbin);
    snprintf(cmd, sizeof cmd,
             "exec '%s' --servers=127.0.0.1:%d --train='%s' --epochs=1000 --batch=%d "
             "--step-log='%s' --log-level=error --progress-every=0 > /dev/null",
             wbin, cl.p0, tr, BATCH, log);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    const bench_opts_t unpinned = {.pin = false};
    if (!rc)
        w = bench_spawn(&unpinned, argv);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", cl.g0);
    uint64_t t_add = 0, t_done = 0;
    if (w > 0) {
        uint64_t *e = NULL;
        for (double t0 = now_s(); step_ends(log, &e) < 50 && now_s() - t0 < 60; free(e))
            usleep(50000); /* warm: the rows created */
        free(e);
        usleep((useconds_t)(secs * 1e6)); /* the window before */
        const int q2 = bench_free_port();
        snprintf(args, sizeof args, "%s --json reshard add 127.0.0.1:%d", coord, q2);
        t_add = pc_time_mono_ns();
        char *mp = run_psctl(args, out, sizeof out) == 0 ? strstr(out, "\"map\":\"") : NULL;
        char maparg[1200], ccoord[64];
        if (mp && strchr(mp + 7, '"')) {
            *strchr(mp + 7, '"') = '\0';
            snprintf(maparg, sizeof maparg, "--cluster-map=%s", mp + 7);
            snprintf(ccoord, sizeof ccoord, "--cluster-coordinator=127.0.0.1:%d", cl.g0);
            const char *e2[] = {maparg, tables, ccoord, lease, NULL};
            pid2 = bench_ps_server_at(o, "ha", dir, "s2", q2, e2, &p2, &g2);
        }
        /* one psctl that polls the coordinator in-process, every 20 ms (not a psctl started
         * every 20 ms: each took about 18 ms of CPU) */
        snprintf(args, sizeof args, "%s --json reshard wait 60", coord);
        const bool done =
            pid2 > 0 && run_psctl(args, out, sizeof out) == 0 && strstr(out, "\"done\":true");
        t_done = pc_time_mono_ns();
        rc = done ? 0 : -1;
        if (!done)
            fprintf(stderr, "ps-bench ha: the migration did not finish in 60 s: %s\n", out);
        usleep(200000);
        if (waitpid(w, NULL, WNOHANG) != 0) {
            fprintf(stderr, "ps-bench ha: the worker stopped during the migration\n");
            rc = -1;
            w = -1;
        }
    }
    if (w > 0)
        bench_stop(w);
    uint64_t *ends = NULL;
    const size_t ne = step_ends(log, &ends);
    const uint64_t win = (uint64_t)(secs * 1e9);
    r->before = steps_per_s(ends, ne, t_add - win, t_add) * BATCH;
    r->during = steps_per_s(ends, ne, t_add, t_done) * BATCH;
    r->secs = (double)(t_done - t_add) * 1e-9;
    free(ends);
    if (!rc) { /* the rows the third server holds (all as primary: it backs up nothing) */
        snprintf(args, sizeof args, "--server=127.0.0.1:%d --json stats emb", g2);
        const char *at = run_psctl(args, out, sizeof out) == 0 ? strstr(out, "\"rows\":") : NULL;
        r->rows = at ? strtoull(at + 7, NULL, 10) : 0;
        rc = r->rows ? 0 : -1;
    }
    if (pid2 > 0)
        bench_stop(pid2);
    cluster_down(&cl);
    r->dip = r->before > 0 ? r->during / r->before : 0;
    r->rows_per_s = r->secs > 0 ? (double)r->rows / r->secs : 0;
    return rc;
}

/* ==== a backup's copy when it rejoins ====================================================== */

/* The map server `port` serves (NULL when it cannot be read). */
static pc_cluster_map_t *map_of(int port) {
    psc_t *c = client_of(port);
    char text[1024] = "";
    if (c) {
        psc_map_text(c, text, sizeof text);
        psc_close(c);
    }
    pc_cluster_map_t *m = NULL;
    return pc_cmap_parse(text, &m, NULL, 0) ? NULL : m;
}

/* Server 0 is the primary of every slot (want 0), or server 1 backs up every slot in sync (want
 * 1: it copied and caught up, and cleared its mark). */
static bool map_is(int port, int want) {
    pc_cluster_map_t *m = map_of(port);
    bool ok = m != NULL;
    for (uint32_t s = 0; ok && s < PC_NSLOTS; s++)
        ok = want ? pc_cmap_is_backup(m, s, 1) && !pc_cmap_backup_syncing(m, s, 1)
                  : pc_cmap_slot_owner(m, s) == 0;
    pc_cmap_destroy(m);
    return ok;
}

/* Rows per second of a rejoining backup's copy: nkeys rows pushed (dim 16, Adagrad; with cold,
 * a RAM budget of a tenth of them on each server, the rest in its tier), server 1 killed with -9
 * and server 0 primary of every slot, then server 1 started again (its tier starts empty): the
 * rows over the seconds from its start until the map has it in sync (copied, caught up, its
 * mark cleared: a controller tick, lease / 4). */
static double rejoin_rate(const bench_opts_t *o, const char *dir, bool cold, uint64_t nkeys) {
    enum { B = 1000, D = 16 };
    char tables[200];
    snprintf(tables, sizeof tables, "--tables=name=emb,dim=%d,optimizer=adagrad%s", D,
             cold ? ",cold=true" : "");
    if (cold)
        snprintf(tables + strlen(tables), sizeof tables - strlen(tables), ",capacity_rows=%llu",
                 (unsigned long long)(nkeys / 10));
    cluster_t cl;
    if (cluster_up_on(o, dir, tables, true, cold, false, "--lease-ms=600", NULL, &cl))
        return -1;
    double rate = -1;
    psc_t *c = wait_replicated(cl.p0) ? client_of(cl.p0) : NULL;
    static uint64_t keys[B];
    static float g[B * D];
    for (int i = 0; i < B * D; i++)
        g[i] = 0.01f * (float)((i % 7) - 3);
    int rc = c ? 0 : -1;
    for (uint64_t at = 0; !rc && at < nkeys; at += B) {
        for (int i = 0; i < B; i++)
            keys[i] = bench_key(at + (uint64_t)i);
        rc = psc_push(c, "emb", keys, B, D, g, NULL);
    }
    if (c)
        psc_close(c);
    if (!rc) {
        kill(cl.pid1, SIGKILL);
        waitpid(cl.pid1, NULL, 0);
        cl.pid1 = -1;
        for (double t0 = now_s(); !map_is(cl.p0, 0) && now_s() - t0 < 20;)
            usleep(20000);
        const double t0 = now_s();
        rc = map_is(cl.p0, 0) ? start1(o, dir, true, &cl) : -1;
        while (!rc && !map_is(cl.p0, 1) && now_s() - t0 < 120)
            usleep(20000);
        if (!rc && map_is(cl.p0, 1))
            rate = (double)nkeys / (now_s() - t0);
    }
    if (rate < 0)
        fprintf(stderr, "ps-bench ha: the %s table's rejoin copy did not finish\n",
                cold ? "cold" : "RAM");
    if (cl.pid1 > 0)
        bench_stop(cl.pid1);
    bench_stop(cl.pid0);
    return rate;
}

/* ==== the etcd leader's death ============================================================== */

/* tests/support/etcd_cluster.sh (the checkout's: EMBER_SOURCE_DIR) with args; its stdout into
 * out (may be NULL); its exit status. */
static int etcd_sh(const char *args, char *out, size_t cap) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "bash '%s/tests/support/etcd_cluster.sh' %s", EMBER_SOURCE_DIR, args);
    return bench_run_output(cmd, out, cap);
}

static void kill_etcd_leader(void *ctx, cluster_t *cl) {
    (void)cl;
    const char *edir = ctx;
    char args[600], out[64] = "";
    snprintf(args, sizeof args, "leader '%s'", edir);
    if (etcd_sh(args, out, sizeof out) == 0) {
        snprintf(args, sizeof args, "kill '%s' %d", edir, atoi(out));
        etcd_sh(args, NULL, 0);
    } else {
        fprintf(stderr, "ps-bench ha: no etcd leader to kill\n");
    }
}

/* The failover run with the servers' map and leases in a 3-member etcd whose leader is killed
 * (-9): 1 without etcd installed (said), -1 on a failure. */
static int run_etcd_kill(const bench_opts_t *o, const char *dir, const char *lease, uint32_t nkeys,
                         failover_t *r) {
    if (system("command -v etcd >/dev/null 2>&1")) {
        printf("etcd is not installed (deploy/install-deps.sh): etcd_leader_kill_stall_s not "
               "measured\n");
        return 1;
    }
    char edir[300], args[600], eps[512] = "", url[600], path[400];
    snprintf(edir, sizeof edir, "%s/etcd", dir);
    snprintf(args, sizeof args, "start '%s' 3", edir);
    if (etcd_sh(args, NULL, 0)) {
        fprintf(stderr, "ps-bench ha: etcd did not start\n");
        return -1;
    }
    snprintf(path, sizeof path, "%s/endpoints", edir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(eps, sizeof eps, f))
            eps[0] = '\0';
        fclose(f);
    }
    eps[strcspn(eps, "\n")] = '\0';
    snprintf(url, sizeof url, "etcd://%s/ps-bench-ha", eps);
    /* a lease can lapse through the election: watched for three leases */
    const fault_t fault = {kill_etcd_leader, edir, 2, url, o->smoke ? 2.0 : 6.0};
    const int rc = eps[0] ? run_failover(o, dir, lease, nkeys, &fault, r) : -1;
    snprintf(args, sizeof args, "stop '%s'", edir);
    etcd_sh(args, NULL, 0);
    return rc;
}

int bench_ha_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "ha", &o);
    bench_pin(&o, 1);
    char dir[256];
    bench_tmpdir("ha", dir, sizeof dir);
    const char *lease = o.smoke ? "--lease-ms=600" : "--lease-ms=2000";
    const uint32_t fkeys = o.smoke ? 4096 : 32768;
    const uint64_t rkeys = o.keys ? (uint64_t)o.keys : o.smoke ? 5000 : o.quick ? 50000 : 100000;
    const double secs = o.seconds > 0 ? o.seconds : o.smoke ? 0.5 : o.quick ? 2 : 4;
    printf("ps-bench ha: 2 servers on CPU 0 (one event loop each), this client on CPU 1, %s\n",
           lease + 2);

    failover_t f, e;
    const fault_t kill1 = {kill_server1, NULL, 1, NULL, 0};
    const int frc = run_failover(&o, dir, lease, fkeys, &kill1, &f);
    if (!frc) {
        printf("failover (kill -9 of a primary, pushes from 2 threads):\n"
               "  failover_stall_s     %.2f s longest gap between answered pushes "
               "(before the kill: %.3f s)\n"
               "  lost_acked_pushes    %lld over %lld keys (failed pushes %lld; steps beyond the "
               "answered ones: %lld)\n",
               f.stall_s, f.gap_before_s, f.lost, f.checked, f.failed_pushes, f.extra_in_t);
    }

    /* [split]: 0 both servers on CPU 0, 1 server 1 on CPU 1 with the client */
    double r0[2][2] = {{-1, -1}, {-1, -1}}, r1[2][2] = {{-1, -1}, {-1, -1}};
    for (int sp = 0; sp < 2; sp++)
        for (int pair = 0; pair < 2; pair++) { /* alternating: R=0, R=1, R=1, R=0 */
            if (pair == 0) {
                r0[sp][0] = push_rate(&o, dir, false, sp, lease, rkeys, secs);
                r1[sp][0] = push_rate(&o, dir, true, sp, lease, rkeys, secs);
            } else {
                r1[sp][1] = push_rate(&o, dir, true, sp, lease, rkeys, secs);
                r0[sp][1] = push_rate(&o, dir, false, sp, lease, rkeys, secs);
            }
        }
    const bool rok = r0[0][0] > 0 && r0[0][1] > 0 && r1[0][0] > 0 && r1[0][1] > 0;
    const bool sok = r0[1][0] > 0 && r0[1][1] > 0 && r1[1][0] > 0 && r1[1][1] > 0;
    const double m0 = (r0[0][0] + r0[0][1]) / 2, m1 = (r1[0][0] + r1[0][1]) / 2;
    const double s0 = (r0[1][0] + r0[1][1]) / 2, s1 = (r1[1][0] + r1[1][1]) / 2;
    if (rok)
        printf("replication cost (push, dim 64, batches of 1000, 4 threads, %llu keys):\n"
               "  R=1 sync  %.2fM rows/s (%.2f, %.2f)\n"
               "  R=0       %.2fM rows/s (%.2f, %.2f)   replication_push_cost %.2f\n",
               (unsigned long long)rkeys, m1 / 1e6, r1[0][0] / 1e6, r1[0][1] / 1e6, m0 / 1e6,
               r0[0][0] / 1e6, r0[0][1] / 1e6, m1 / m0);
    if (sok)
        printf("  the same with server 1 on CPU 1 (beside the client), not beside server 0:\n"
               "  R=1 sync  %.2fM rows/s, R=0 %.2fM   replication_push_cost_split %.2f\n",
               s1 / 1e6, s0 / 1e6, s1 / s0);
    migrate_t mg = {0};
    const uint64_t mrows = o.smoke ? 20000 : o.quick ? 200000 : 500000;
    const int mrc = run_migrate(&o, dir, lease, mrows, secs, &mg);
    if (!mrc)
        printf("live migration (psctl reshard add of a third server while a ps-worker trains):\n"
               "  migrate_rows_per_s   %.0f rows/s (%llu rows in %.2f s, to the map matching the "
               "target)\n"
               "  migrate_train_dip    %.2f (the worker's samples/s during the move %.0f, in the "
               "%.1f s before %.0f)\n",
               mg.rows_per_s, (unsigned long long)mg.rows, mg.secs, mg.dip, mg.during, secs,
               mg.before);
    const int erc = run_etcd_kill(&o, dir, lease, fkeys, &e);
    if (!erc)
        printf("the etcd leader's death (servers' map and leases in 3 etcd members, kill -9 of "
               "the leader):\n"
               "  etcd_leader_kill_stall_s %.2f s longest gap between answered pushes (before: "
               "%.3f s); acknowledged pushes lost %lld, failed %lld\n",
               e.stall_s, e.gap_before_s, e.lost, e.failed_pushes);
    const uint64_t ckeys = o.smoke ? 20000 : o.quick ? 200000 : 500000;
    const double cram = rejoin_rate(&o, dir, false, ckeys),
                 ccold = rejoin_rate(&o, dir, true, ckeys);
    const bool cok = cram > 0 && ccold > 0;
    if (cok)
        printf("a rejoining backup's copy (%llu rows, dim 16, Adagrad; the cold table keeps a "
               "tenth in RAM):\n"
               "  rejoin_copy_rows_per_s      %.0f rows/s (a RAM-only table)\n"
               "  cold_rejoin_copy_rows_per_s %.0f rows/s   cold_copy_vs_ram %.2f\n",
               (unsigned long long)ckeys, cram, ccold, ccold / cram);

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "ha");
    cJSON_AddNumberToObject(root, "lease_ms", o.smoke ? 600 : 2000);
    if (!frc) {
        cJSON_AddNumberToObject(root, "failover_stall_s", f.stall_s);
        cJSON_AddNumberToObject(root, "gap_before_kill_s", f.gap_before_s);
        cJSON_AddNumberToObject(root, "lost_acked_pushes", (double)f.lost);
        cJSON_AddNumberToObject(root, "keys_checked", (double)f.checked);
        cJSON_AddNumberToObject(root, "failed_pushes", (double)f.failed_pushes);
    } else {
        cJSON_AddNullToObject(root, "failover_stall_s");
        cJSON_AddNullToObject(root, "lost_acked_pushes");
    }
    if (rok) {
        cJSON_AddNumberToObject(root, "push_rows_per_s_r1", m1);
        cJSON_AddNumberToObject(root, "push_rows_per_s_r0", m0);
        cJSON_AddNumberToObject(root, "replication_push_cost", m1 / m0);
    } else {
        cJSON_AddNullToObject(root, "replication_push_cost");
    }
    if (sok) {
        cJSON_AddNumberToObject(root, "push_rows_per_s_r1_split", s1);
        cJSON_AddNumberToObject(root, "push_rows_per_s_r0_split", s0);
        cJSON_AddNumberToObject(root, "replication_push_cost_split", s1 / s0);
    } else {
        cJSON_AddNullToObject(root, "replication_push_cost_split");
    }
    if (!mrc) {
        cJSON_AddNumberToObject(root, "migrate_rows_per_s", mg.rows_per_s);
        cJSON_AddNumberToObject(root, "migrate_train_dip", mg.dip);
        cJSON_AddNumberToObject(root, "migrate_rows", (double)mg.rows);
        cJSON_AddNumberToObject(root, "migrate_s", mg.secs);
    } else {
        cJSON_AddNullToObject(root, "migrate_rows_per_s");
        cJSON_AddNullToObject(root, "migrate_train_dip");
    }
    if (!erc) {
        cJSON_AddNumberToObject(root, "etcd_leader_kill_stall_s", e.stall_s);
        cJSON_AddNumberToObject(root, "etcd_lost_acked_pushes", (double)e.lost);
    } else {
        cJSON_AddNullToObject(root, "etcd_leader_kill_stall_s");
    }
    if (cok) {
        cJSON_AddNumberToObject(root, "rejoin_copy_rows_per_s", cram);
        cJSON_AddNumberToObject(root, "cold_rejoin_copy_rows_per_s", ccold);
        cJSON_AddNumberToObject(root, "cold_copy_vs_ram", ccold / cram);
    } else {
        cJSON_AddNullToObject(root, "cold_copy_vs_ram");
    }
    bench_emit_json(&o, root);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
    return frc || !rok || mrc || erc < 0 || !cok ? 1 : 0;
}
