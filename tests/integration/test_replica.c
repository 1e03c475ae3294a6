/* Replicas and failover (docs/server.md "Replicas and failover") with real ps-server processes
 * on loopback: server 0 is also the coordinator (in memory; the cluster map and leases live
 * there), server 1 reaches it over gRPC; every slot has one backup, leases of 600 ms.
 * - test_failover_keeps_acked_pushes: pushes go on while server 1 is killed with -9; its backup
 *   (server 0) takes its slots, the client follows the new map, and every acknowledged push is
 *   in the optimizer's state: Adam's per-row step count t (read back with the rows' state over
 *   the delta stream) is at least the pushes acknowledged for the key and at most those plus the
 *   ones whose answer was lost. Server 1 restarted joins again as a backup, marked catching up
 *   in the map, and clears the mark itself once it copied and caught up (docs/server.md "Which
 *   backup is promoted").
 * - test_quick_restart_keeps_acked_pushes: server 1 killed and started again at once, before
 *   its lease ran out, comes back with an empty table while the map still names it primary;
 *   its backup, whose copy holds the rows, takes its slots, and the same count holds.
 * - test_stale_primary_refuses_pushes: server 1 stopped (SIGSTOP) past its lease is replaced;
 *   a push written to its socket while it is stopped is refused when it wakes (SIGCONT), before
 *   it could learn the new map, and its pushed-rows counter does not move.
 * - test_unclean_promotion: two failures in a row leave only a backup still catching up; it is
 *   promoted, and the map's count of such slots reaches the client with the lost rows.
 * - test_sole_holder_restart: server 0, the only holder of every slot once server 1 died,
 *   stops cleanly and starts again from its exit checkpoint: nothing went back and the map
 *   counts nothing; then it is killed with -9 and starts again from that same checkpoint: the
 *   pushes since are lost, and the map counts every slot unclean (its run record said the last
 *   run did not end at that checkpoint); a start that fails late puts the record back, so the
 *   next one counts nothing more.
 * - test_reshard_add_remove (docs/server.md "Live resharding"): one client pulls and pushes in
 *   a fixed order while `psctl reshard add` brings in a third server (which takes a third of
 *   the slots) and `psctl reshard remove` takes it out again; no call fails, and the rows every
 *   pull saw and the whole table at the end (weights and Adam's state, bit for bit) equal those
 *   of the same calls on a cluster that was never resharded.
 * - test_reshard_absent_server: a target naming a server that never starts moves nothing and
 *   writes no map version; the same add run again says the target again; a second server added
 *   meanwhile keeps the first one's share in the target; removing both reaches the target.
 * - test_cold_failover, test_cold_reshard_add_remove: a cold table (200 rows in RAM, most rows
 *   in each server's RocksDB tier) through a primary's kill -9 (every acknowledged push kept), a
 *   rejoined backup's copy (the primary's rows bit for bit, served after the primary's kill -9
 *   too) and a live resharding (the table sums of a cluster never resharded).
 */
#include "test_util.h"

#include "emberps/psclient.h"
#include "emberps/psgrpc.h"
#include "emberps.pb-c.h"
#include "ps_api.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_wire.h"
#include "proc_util.h"
#include "psclient_repl.h"
#include "cluster_check.h"
#include "raw_frame.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DIM   8
#define NKEYS 2000
#define BATCH 200
#define LEASE "--lease-ms=600"
static const char *g_lease = LEASE; /* servers 0 and 1's (a test may take a longer one) */

static char g_dir[256];
static char g_psctl[600]; /* the psctl binary, next to ps-server */

typedef struct cluster {
    int p0, p1, grpc0, grpc1, metrics0, metrics1;
    pid_t s0, s1;
    char map[256], maparg[300], coordarg[64], extra0[320];
} cluster_t;

static const char *k_tables = "--tables=name=emb,dim=8,optimizer=adam,lr=0.01";
/* The cold tests' table: 200 rows in RAM, the rest (most of NKEYS) in each server's tier. */
static const char *k_cold_tables =
    "--tables=name=emb,dim=8,optimizer=adam,lr=0.01,capacity_rows=200,cold=true";
static const char *g_tables; /* the servers' tables: k_tables or k_cold_tables */
static char g_tier[3][400];  /* with k_cold_tables, --tier-dir= of servers 0, 1, 2 ("": none) */
/* with k_cold_tables, replies of 16 KiB at most (about 150 rows with Adam's state): a copy walks
 * the cold store in many pages and splits its parts of RAM rows further */
static const char *k_cold_reply = "--max-reply-bytes=16384";

/* Append server i's cold-table flags to argv at *n (none with the RAM-only tables). */
static void cold_args(const char **argv, int *n, int i) {
    if (!g_tier[i][0])
        return;
    argv[(*n)++] = g_tier[i];
    argv[(*n)++] = k_cold_reply;
}

static void start1(cluster_t *c) {
    const char *e1[8] = {c->maparg, g_tables, c->coordarg, g_lease};
    int n = 4;
    cold_args(e1, &n, 1);
    c->s1 = pu_spawn(c->p1, g_dir, e1, &c->grpc1);
    c->metrics1 = pu_last_metrics_port;
}

static void cluster_up(cluster_t *c) {
    memset(c, 0, sizeof *c);
    cc_two_servers(&c->p0, &c->p1, c->map, sizeof c->map, c->maparg, sizeof c->maparg);
    const char *e0[8] = {c->maparg, g_tables, "--coordinator", "--cluster-coordinator=self",
                         g_lease};
    int n = 5;
    cold_args(e0, &n, 0);
    c->s0 = pu_spawn(c->p0, g_dir, e0, &c->grpc0);
    c->metrics0 = pu_last_metrics_port;
    snprintf(c->coordarg, sizeof c->coordarg, "--cluster-coordinator=127.0.0.1:%d", c->grpc0);
    start1(c);
}

/* Server 0 with the cluster's flags (and extra0), started again with the same ones. */
static void start0(cluster_t *c) {
    const char *e0[8] = {c->maparg, g_tables, c->coordarg, g_lease};
    int n = 4;
    if (c->extra0[0])
        e0[n++] = c->extra0;
    cold_args(e0, &n, 0);
    c->s0 = pu_spawn(c->p0, g_dir, e0, &c->grpc0);
    c->metrics0 = pu_last_metrics_port;
}

static psc_t *connect_to(int port) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = addr, .timeout_ms = 3000, .retries = 5};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

typedef bool (*map_ok_fn)(const pc_cluster_map_t *m, long arg);

/* Wait (at most secs) until the map the server on data-plane `port` serves passes ok(m, arg);
 * whether it did. */
static bool map_until_at(int port, double secs, map_ok_fn ok, long arg) {
    for (double t0 = pu_now(); pu_now() - t0 < secs; usleep(20000)) {
        pc_cluster_map_t *m = cc_map_of(port);
        const bool yes = ok(m, arg);
        pc_cmap_destroy(m);
        if (yes)
            return true;
    }
    return false;
}

/* The same for server 0's map. */
static bool map_until(const cluster_t *cl, double secs, map_ok_fn ok, long arg) {
    return map_until_at(cl->p0, secs, ok, arg);
}

/* Backups named, server 1 the primary of its half: the replicated map published and confirmed. */
static bool replicated(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    return pc_cmap_replicated(m) && pc_cmap_server_slots(m, 1) == PC_NSLOTS / 2;
}

static void wait_replicated(const cluster_t *cl) {
    if (!map_until(cl, 15, replicated, 0))
        fail_msg("the cluster map never named backups");
}

/* The two servers with the map and the leases in a third ps-server, a coordinator outside this
 * cluster, so that either can fail (server 0 gets extra0 too: NULL for none). Returns that
 * coordinator's pid; the map is replicated when this returns. */
static pid_t cluster_up_apart(cluster_t *cl, const char *extra0) {
    memset(cl, 0, sizeof *cl);
    char cmaparg[128];
    const int pc = pu_free_port();
    snprintf(cmaparg, sizeof cmaparg,
             "--cluster-map=version=1;servers=127.0.0.1:%d;slots=0-16383:0", pc);
    const char *ec[] = {cmaparg, "--coordinator", NULL};
    int gc = 0;
    const pid_t sc = pu_spawn(pc, g_dir, ec, &gc);
    cc_two_servers(&cl->p0, &cl->p1, cl->map, sizeof cl->map, cl->maparg, sizeof cl->maparg);
    snprintf(cl->coordarg, sizeof cl->coordarg, "--cluster-coordinator=127.0.0.1:%d", gc);
    snprintf(cl->extra0, sizeof cl->extra0, "%s", extra0 ? extra0 : "");
    start0(cl);
    start1(cl);
    wait_replicated(cl);
    return sc;
}

#define STRIDE (DIM + 2 * DIM + 1) /* Adam's row: weights, m, v, t */

typedef struct steps {
    const uint64_t *keys;
    size_t n;
    uint32_t *t;
} steps_t;

static void steps_of(void *ctx, const uint64_t *keys, const float *rows, uint32_t n,
                     uint32_t stride) {
    steps_t *x = ctx;
    (void)stride;
    for (uint32_t i = 0; i < n; i++)
        for (size_t j = 0; j < x->n; j++)
            if (x->keys[j] == keys[i]) {
                memcpy(&x->t[j], &rows[(size_t)i * STRIDE + 3 * DIM], 4);
                break;
            }
}

/* Adam's step count t of each key at server `server` (its whole table, with state). */
static void read_steps(psc_t *c, uint32_t server, const uint64_t *keys, size_t n, uint32_t *t) {
    memset(t, 0, n * sizeof *t);
    steps_t x = {.keys = keys, .n = n, .t = t};
    cc_scan_state(c, server, "emb", STRIDE, steps_of, &x);
}

static uint64_t g_keys[NKEYS];

/* Push batches of g_keys through the cluster (via server 0's client c), calling fault() after
 * 100 rounds, until 200 pushes after it were answered; then check every key's Adam t on server
 * 0 (primary of everything by then) against the pushes acknowledged and left unanswered. */
static void push_through_fault(cluster_t *cl, psc_t *c, void (*fault)(cluster_t *)) {
    static uint32_t acked[NKEYS], unsure[NKEYS], steps[NKEYS];
    memset(acked, 0, sizeof acked);
    memset(unsure, 0, sizeof unsure);
    for (int i = 0; i < NKEYS; i++)
        g_keys[i] = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    float *grads = malloc(sizeof(float) * BATCH * DIM);
    for (int i = 0; i < BATCH * DIM; i++)
        grads[i] = 0.01f * (float)((i % 7) - 3);
    int failed = 0, ok_after = 0;
    double t_fault = 0, last_ok = pu_now(), stall = 0;
    for (int round = 0; ok_after < 200 && (!t_fault || pu_now() - t_fault < 30); round++) {
        if (round == 100) {
            fault(cl);
            t_fault = pu_now();
        }
        const int first = (round * 37) % (NKEYS - BATCH);
        const int rc = psc_push(c, "emb", g_keys + first, BATCH, DIM, grads, NULL);
        for (int i = 0; i < BATCH; i++)
            (rc == 0 ? acked : unsure)[first + i]++;
        if (rc) {
            failed++;
            usleep(20000);
            continue;
        }
        if (t_fault) {
            ok_after++;
            if (pu_now() - last_ok > stall)
                stall = pu_now() - last_ok; /* the longest gap between answered pushes */
        }
        last_ok = pu_now();
    }
    assert_true(ok_after >= 200); /* pushes are answered again after the fault */
    print_message("longest gap between answered pushes around the fault: %.2f s (%d failed)\n",
                  stall, failed);
    pc_cluster_map_t *m = cc_map_of(cl->p0);
    assert_int_equal(pc_cmap_server_slots(m, 0), PC_NSLOTS); /* server 0 took every slot */
    assert_int_equal(pc_cmap_unclean(m), 0);                 /* from a backup in sync */
    pc_cmap_destroy(m);
    read_steps(c, 0, g_keys, NKEYS, steps);
    int checked = 0, of_server1 = 0;
    for (int i = 0; i < NKEYS; i++) {
        if (!acked[i] && !unsure[i])
            continue;
        if (steps[i] < acked[i] || steps[i] > acked[i] + unsure[i])
            fail_msg("key %d: Adam's t is %u, %u pushes acknowledged, %u unanswered", i, steps[i],
                     acked[i], unsure[i]);
        checked++;
        of_server1 += pc_key_slot(g_keys[i]) >= PC_NSLOTS / 2 && acked[i];
    }
    assert_true(checked > NKEYS / 2);
    assert_true(of_server1 > NKEYS / 4); /* the count covers the taken-over half */
    free(grads);
}

static void kill_server1(cluster_t *cl) {
    kill(cl->s1, SIGKILL);
    pu_reap(cl->s1, 5);
}

static void restart_server1(cluster_t *cl) {
    kill_server1(cl);
    start1(cl); /* well within its 600 ms lease: the map still names it primary */
}

/* Server 1 is the backup of server 0's first slot (it joined again). */
static bool backed_up_by_1(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    uint32_t b[PC_MAX_BACKUPS];
    return pc_cmap_slot_backups(m, 0, b) == 1 && b[0] == 1;
}

/* Server 1 backs up every slot of server 0 in sync (its mark cleared). */
static bool in_sync_1(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (!pc_cmap_is_backup(m, s, 1) || pc_cmap_backup_syncing(m, s, 1))
            return false;
    return true;
}

/* Server 0 is the primary of slot `slot`. */
static bool slot_of_0(const pc_cluster_map_t *m, long slot) {
    return pc_cmap_slot_owner(m, (uint32_t)slot) == 0;
}

static void test_failover_keeps_acked_pushes(void **state) {
    (void)state;
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    psc_t *c = connect_to(cl.p0);
    push_through_fault(&cl, c, kill_server1);
    /* Server 1 comes back and joins as a backup again. */
    start1(&cl);
    assert_true(map_until(&cl, 15, backed_up_by_1, 0));
    /* and pushes are answered with it as the backup (copying, then acknowledging them) */
    float g[50 * DIM] = {0.1f};
    for (int i = 0; i < 20; i++)
        assert_int_equal(psc_push(c, "emb", g_keys + i * 50, 50, DIM, g, NULL), 0);
    assert_true(map_until(&cl, 15, in_sync_1, 0));
    /* it was marked on rejoining, and cleared the mark itself (not a map that never had one) */
    assert_true(metric(cl.metrics1, "emberps_replication_caught_up_total") >= 1);
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

static void test_quick_restart_keeps_acked_pushes(void **state) {
    (void)state;
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    psc_t *c = connect_to(cl.p0);
    push_through_fault(&cl, c, restart_server1);
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

/* n keys spread by the multiplier, and a gradient gv for every weight of them. */
static void keys_and_grads(uint64_t *keys, float *g, size_t n, uint64_t mul, float gv) {
    for (size_t i = 0; i < n; i++)
        keys[i] = mul * (uint64_t)(i + 1);
    for (size_t i = 0; i < n * DIM; i++)
        g[i] = gv;
}

/* Server 0 is the primary of every slot; with `arg` 1, server 1 is instead, the map counting
 * them unclean (server 1 was promoted while catching up). */
static bool all_of(const pc_cluster_map_t *m, long arg) {
    return pc_cmap_server_slots(m, (uint32_t)arg) == PC_NSLOTS &&
           pc_cmap_unclean(m) == (arg ? PC_NSLOTS : 0);
}

/* Two failures in a row (docs/server.md "Which backup is promoted"), with the map and the leases
 * in a third ps-server, a coordinator outside this cluster, so that either data server can fail:
 * server 1 is killed (server 0 takes its slots), server 0 is stopped (SIGSTOP) and server 1
 * started again. Server 1 joins as a backup catching up and cannot copy a row from the stopped
 * server 0; once server 0's lease ran out it is promoted anyway: an unclean promotion. The map
 * counts it (unclean=16384 in its text, carried by later versions), a client that follows the
 * map reports it (psc_map_unclean_slots), and the pushed rows are back at their initial
 * values, as the count warns. */
static void test_unclean_promotion(void **state) {
    (void)state;
    cluster_t cl;
    const pid_t sc = cluster_up_apart(&cl, NULL);
    psc_t *c = connect_to(cl.p0);
    enum { N = 400 };
    uint64_t keys[N];
    static float init[N * DIM], pushed[N * DIM], after[N * DIM], g[N * DIM];
    keys_and_grads(keys, g, N, 0x9E3779B97F4A7C15ull, 0.5f);
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, init), 0); /* initial rows */
    for (int r = 0; r < 5; r++)
        assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, pushed), 0);
    assert_true(memcmp(init, pushed, sizeof init) != 0);
    assert_int_equal(psc_map_unclean_slots(c), 0);
    kill_server1(&cl);
    assert_true(map_until(&cl, 15, all_of, 0)); /* a clean promotion: the count stays 0 */
    /* the client follows it, and every pushed row is there; server 0 is now its only
     * connection, so it must find server 1 again below by itself */
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, after), 0);
    assert_memory_equal(after, pushed, sizeof pushed);
    assert_int_equal(psc_map_unclean_slots(c), 0);
    assert_int_equal(kill(cl.s0, SIGSTOP), 0);
    start1(&cl);
    const double t0 = pu_now();
    bool promoted = false;
    while (!promoted && pu_now() - t0 < 20) { /* server 1's map: the coordinator's newest */
        usleep(50000);
        pc_cluster_map_t *m = cc_map_of(cl.p1);
        promoted = all_of(m, 1);
        pc_cmap_destroy(m);
    }
    assert_true(promoted);
    print_message("server 1 promoted while catching up %.2f s after it started again\n",
                  pu_now() - t0);
    kill(cl.s0, SIGKILL);
    pu_reap(cl.s0, 5);
    /* the client follows the new map (server 0 is gone) and reports the count */
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, after), 0);
    assert_int_equal(psc_map_unclean_slots(c), PC_NSLOTS);
    char text[4096];
    psc_map_text(c, text, sizeof text);
    assert_non_null(strstr(text, ";unclean=16384;"));
    assert_true(metric(cl.metrics1, "emberps_replication_map_unclean_slots") == PC_NSLOTS);
    assert_memory_equal(after, init, sizeof init); /* the pushes are gone, as the count says */
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(sc);
}

/* The map server 0 serves is newer than version `arg` and counts no unclean slot (arg >= 0:
 * a clean restart confirmed), or (arg < 0) counts every slot. */
static bool confirmed_after(const pc_cluster_map_t *m, long arg) {
    if (arg < 0)
        return pc_cmap_unclean(m) == PC_NSLOTS;
    return pc_cmap_version(m) > (uint64_t)arg && pc_cmap_unclean(m) == 0;
}

static uint64_t version_of(int port) {
    pc_cluster_map_t *m = cc_map_of(port);
    const uint64_t v = pc_cmap_version(m);
    pc_cmap_destroy(m);
    return v;
}

static void test_sole_holder_restart(void **state) {
    (void)state;
    cluster_t cl;
    char ckarg[300];
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s/sole-ck0", g_dir);
    const pid_t sc = cluster_up_apart(&cl, ckarg);
    psc_t *c = connect_to(cl.p0);
    enum { N = 400 };
    uint64_t keys[N];
    static float pushed[N * DIM], later[N * DIM], after[N * DIM], g[N * DIM];
    keys_and_grads(keys, g, N, 0xC2B2AE3D27D4EB4Full, 0.25f);
    for (int r = 0; r < 5; r++)
        assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, pushed), 0);
    kill_server1(&cl);
    assert_true(map_until(&cl, 15, all_of, 0)); /* server 0 holds every slot, alone */
    /* a clean stop and start: the exit checkpoint holds every acknowledged push */
    uint64_t v = version_of(cl.p0);
    pu_stop(cl.s0);
    start0(&cl);
    assert_true(map_until(&cl, 15, confirmed_after, (long)v));
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, after), 0);
    assert_memory_equal(after, pushed, sizeof pushed);
    assert_int_equal(psc_map_unclean_slots(c), 0);
    /* more pushes, then a crash: they are lost, and the map says so */
    for (int r = 0; r < 3; r++)
        assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, later), 0);
    assert_true(memcmp(later, pushed, sizeof pushed) != 0);
    kill(cl.s0, SIGKILL);
    pu_reap(cl.s0, 5);
    start0(&cl);
    const int metrics0 = pu_last_metrics_port;
    assert_true(map_until(&cl, 15, confirmed_after, -1));
    assert_int_equal(psc_pull(c, "emb", keys, N, DIM, after), 0);
    assert_memory_equal(after, pushed, sizeof pushed); /* back at the exit checkpoint */
    assert_int_equal(psc_map_unclean_slots(c), PC_NSLOTS);
    assert_true(metric(metrics0, "emberps_replication_restart_unclean_slots_total") == PC_NSLOTS);
    /* psctl runs: the count, and both servers' last runs (server 1 was killed: running) */
    char out[4096], want[128];
    const char *args[] = {"--json", "runs", NULL};
    assert_int_equal(pu_psctl(g_psctl, atoi(strrchr(cl.coordarg, ':') + 1), out, sizeof out, args),
                     0);
    assert_non_null(strstr(out, "\"unclean\":16384"));
    snprintf(want, sizeof want, "\"server\":\"127.0.0.1:%d\",\"record\":\"running\"", cl.p1);
    assert_non_null(strstr(out, want));
    /* a clean stop again, then a start that fails late (its metrics port taken, after the
     * replication started): the record goes back to the clean stop, and the start after counts
     * nothing more */
    v = version_of(cl.p0);
    pu_stop(cl.s0);
    const int busy = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(busy, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(busy, 1), 0);
    getsockname(busy, (struct sockaddr *)&a, &al);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "timeout 30 '%s' --port=%d --grpc-port=0 --metrics-port=%d --log-level=error "
             "'%s' '%s' '%s' '%s' '%s' >/dev/null 2>&1",
             pu_bin, cl.p0, ntohs(a.sin_port), cl.maparg, g_tables, cl.coordarg, LEASE, cl.extra0);
    const int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1); /* it failed, and by itself */
    close(busy);
    start0(&cl);
    pc_cluster_map_t *m = NULL;
    for (double t0 = pu_now(); pu_now() - t0 < 15 && (!m || pc_cmap_version(m) <= v);
         usleep(20000)) {
        pc_cmap_destroy(m);
        m = cc_map_of(cl.p0);
    }
    assert_true(pc_cmap_version(m) > v);
    assert_int_equal(pc_cmap_unclean(m), PC_NSLOTS);
    pc_cmap_destroy(m);
    psc_close(c);
    pu_stop(cl.s0);
    pu_stop(sc);
}

/* A PUSH frame of one key of `dim` gradients 0.5 for table emb into out; its length. */
static uint32_t push_body(uint64_t key, uint8_t *out) {
    const size_t hl = pc_wire_batch_head_encode_typed("emb", 1, DIM, PC_WIRE_F32, out);
    memcpy(out + hl, &key, 8);
    for (int i = 0; i < DIM; i++) {
        const float g = 0.5f;
        memcpy(out + hl + 8 + 4 * i, &g, 4);
    }
    return (uint32_t)(hl + 8 + 4 * DIM);
}

static void test_stale_primary_refuses_pushes(void **state) {
    (void)state;
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    psc_t *c = connect_to(cl.p0);
    uint64_t key = 1; /* a key of server 1's slots */
    while (pc_key_slot(key) < PC_NSLOTS / 2)
        key++;
    _Alignas(8) uint8_t body[256], reply[4096];
    const uint32_t len = push_body(key, body);
    int fd = raw_connect(cl.p1);
    send_frame(fd, PC_OP_HELLO, 1, NULL, 0);
    assert_int_equal(recv_frame(fd, 1, reply, sizeof reply).status, 0);
    int st = -1; /* the primary takes it once its lease is confirmed (bounded wait) */
    for (double t0 = pu_now(); st && pu_now() - t0 < 10; usleep(st ? 50000 : 0)) {
        send_frame(fd, PC_OP_PUSH, 2, body, len);
        st = recv_frame(fd, 2, reply, sizeof reply).status;
    }
    assert_int_equal(st, 0);
    const char *pushed = "emberps_dataplane_rows_total{op=\"push\"}";
    const double before = metric(cl.metrics1, pushed);
    assert_true(before >= 1);
    /* a gRPC Push to the same primary is refused: only the data plane answers a push once its
     * backups hold it (and fences it by the lease); applied before, answered at once */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", cl.grpc1);
    psg_t *g;
    assert_int_equal(psg_create(&(psg_opts_t){.addr = addr}, &g), 0);
    float grads[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    Emberps__PushRequest sq = EMBERPS__PUSH_REQUEST__INIT;
    sq.table = "emb";
    sq.keys = &key;
    sq.n_keys = 1;
    sq.grads = (ProtobufCBinaryData){sizeof grads, (uint8_t *)grads};
    uint8_t req[128], *resp = NULL;
    size_t rlen = protobuf_c_message_pack(&sq.base, req);
    char why[256] = "";
    const int grc = psg_request(g, ps_api_path(PS_API_PUSH), req, rlen, 5000, &resp, &rlen, NULL,
                                why, sizeof why);
    print_message("gRPC Push to a replicated primary: %s: %s\n", pc_err_name(grc), why);
    assert_int_equal(grc, PC_EUNSUPPORTED);
    free(resp);
    psg_destroy(g);
    assert_true(metric(cl.metrics1, pushed) == before);
    pu_stop_signal(cl.s1);
    /* server 0 takes over once server 1's lease (600 ms) is gone */
    assert_true(map_until(&cl, 15, slot_of_0, (long)pc_key_slot(key)));
    send_frame(fd, PC_OP_PUSH, 3, body, len); /* waits in its socket while it is stopped */
    kill(cl.s1, SIGCONT);
    const pc_wire_hdr_t h = recv_frame(fd, 3, reply, sizeof reply);
    /* refused by the lease's clock (PC_EUNAVAIL), or by the new map should it have learnt it
     * first; never taken (0), nor applied and left unconfirmed (PC_ETIMEDOUT) */
    if (h.status != PC_EUNAVAIL && h.status != PC_EWRONGSLOT)
        fail_msg("the stale primary answered a push with %d (%s): %s", h.status,
                 pc_strerror(h.status), (const char *)reply);
    assert_true(metric(cl.metrics1, pushed) == before); /* nothing was applied there */
    close(fd);
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

/* ---- cold tables ---- */

/* Use the cold tables (true: every server with a tier of its own, server 2 with dir tier2) or
 * the RAM-only ones. */
static void use_cold(bool cold) {
    g_tables = cold ? k_cold_tables : k_tables;
    for (int i = 0; i < 3; i++)
        if (cold)
            snprintf(g_tier[i], sizeof g_tier[i], "--tier-dir=%s/tier%d", g_dir, i);
        else
            g_tier[i][0] = '\0';
}

static bool all_of_1(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    return m && pc_cmap_server_slots(m, 1) == PC_NSLOTS && pc_cmap_unclean(m) == 0;
}

/* A cold table (200 rows in RAM, about 1800 of each server's in its RocksDB tier) is replicated
 * as a RAM-only one: pushes go on through server 1's kill -9 with every acknowledged push in
 * server 0's rows (the backup's copy of them came through the delta stream, whose rows the
 * primary reads from its cold store once spilled). Server 1 started again joins as a backup and
 * copies server 0's whole table, its parts of RAM rows and then pages of its cold store; in sync,
 * it holds exactly server 0's rows (weights and Adam's state, bit for bit, and as many rows), and
 * server 0 killed with -9, server 1 is promoted cleanly and serves them. */
static void test_cold_failover(void **state) {
    (void)state;
    use_cold(true);
    cluster_t cl;
    const pid_t sc = cluster_up_apart(&cl, NULL);
    psc_t *c = connect_to(cl.p0);
    push_through_fault(&cl, c, kill_server1);
    start1(&cl); /* (its tier starts empty: working storage) */
    const int metrics1 = cl.metrics1;
    assert_true(map_until(&cl, 15, backed_up_by_1, 0));
    float g[50 * DIM] = {0.1f};
    for (int i = 0; i < 20; i++) /* answered while server 1 copies */
        assert_int_equal(psc_push(c, "emb", g_keys + i * 50, 50, DIM, g, NULL), 0);
    assert_true(map_until(&cl, 20, in_sync_1, 0));
    cc_sum_t before = {0, 0};
    cc_scan_state(c, 0, "emb", STRIDE, cc_sum_rows, &before);
    assert_true(before.n >= NKEYS * 9 / 10);
    psc_close(c);
    /* server 1 spilled most of what it copied */
    const double spilled = metric(metrics1, "emberps_table_spilled_total{table=\"emb\"}");
    print_message("server 0: %zu rows; server 1 spilled %.0f while copying and following\n",
                  before.n, spilled);
    assert_true(spilled > NKEYS / 2);
    kill(cl.s0, SIGKILL);
    pu_reap(cl.s0, 5);
    assert_true(map_until_at(cl.p1, 15, all_of_1, 0));
    c = connect_to(cl.p1);
    cc_sum_t after = {0, 0};
    cc_scan_state(c, 1, "emb", STRIDE, cc_sum_rows, &after);
    print_message("server 1 after the failover: %zu rows\n", after.n);
    assert_int_equal(after.n, before.n);
    assert_true(after.sum == before.sum);
    psc_close(c);
    pu_stop(cl.s1);
    kill(sc, SIGKILL);
    pu_reap(sc, 5);
    use_cold(false);
}

/* ---- tables replaced while their servers run ---- */

/* Metric `name` of server 0 is v0 and server 1's is v1 within 10 s. */
static bool metrics_become(const cluster_t *cl, const char *name, double v0, double v1) {
    for (double t0 = pu_now(); pu_now() - t0 < 10; usleep(20000))
        if (metric(cl->metrics0, name) == v0 && metric(cl->metrics1, name) == v1)
            return true;
    print_message("%s: server 0 %.0f (want %.0f), server 1 %.0f (want %.0f)\n", name,
                  metric(cl->metrics0, name), v0, metric(cl->metrics1, name), v1);
    return false;
}

/* Rows of emb at the servers (each counts its own slots and those it backs up) are n0 and n1
 * within 10 s. */
static bool rows_become(const cluster_t *cl, double n0, double n1) {
    return metrics_become(cl, "emberps_table_rows{table=\"emb\"}", n0, n1);
}

static bool halves_as_before(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    return pc_cmap_server_slots(m, 0) == PC_NSLOTS / 2 &&
           pc_cmap_server_slots(m, 1) == PC_NSLOTS / 2;
}

/* No backup is marked catching up. */
static bool all_in_sync(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (pc_cmap_backup_syncing(m, s, 0) || pc_cmap_backup_syncing(m, s, 1))
            return false;
    return true;
}

/* A table replaced while its servers run is no restart: a reset on server 0 alone (psctl reset)
 * moves no slot (its backup took its slots over before: the reset table, another uid, looked
 * like a primary restarted with older rows), server 1 erases its copy of server 0's rows and
 * server 0 copies server 1's rows again into its new table; a fresh claim on every server (a
 * new job's start) empties both; pushes after it are replicated again. */
static void test_reset_is_no_failover(void **state) {
    (void)state;
    use_cold(false);
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    enum { N = 512 };
    static uint64_t keys[N];
    static float g[N * DIM];
    keys_and_grads(keys, g, N, 0x9E3779B97F4A7C15ull, 0.01f);
    double of1 = 0; /* keys in server 1's slots */
    for (int i = 0; i < N; i++)
        of1 += pc_key_slot(keys[i]) >= PC_NSLOTS / 2;
    psc_t *c = connect_to(cl.p0);
    assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_true(rows_become(&cl, N, N));
    char out[1024];
    const char *reset[] = {"reset", "emb", NULL};
    assert_int_equal(pu_psctl(g_psctl, cl.grpc0, out, sizeof out, reset), 0);
    assert_true(rows_become(&cl, of1, of1));
    pc_cluster_map_t *m = cc_map_of(cl.p1);
    assert_true(halves_as_before(m, 0));
    pc_cmap_destroy(m);
    /* each fell behind the other (its own table replaced; the primary's replaced in its run) */
    assert_true(metric(cl.metrics0, "emberps_replication_fell_behind_total") >= 1);
    assert_true(metric(cl.metrics1, "emberps_replication_fell_behind_total") >= 1);
    assert_true(map_until(&cl, 10, all_in_sync, 0)); /* marks they may have set are cleared */
    psc_claim_t cr;
    assert_int_equal(psc_claim(c, "emb", "", PSC_CLAIM_FRESH, &cr), 0);
    assert_true(rows_become(&cl, 0, 0));
    assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_true(rows_become(&cl, N, N));
    m = cc_map_of(cl.p1);
    assert_true(halves_as_before(m, 0) && pc_cmap_replicated(m));
    pc_cmap_destroy(m);
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

/* Whether every key of keys[0..n) in server `half`'s slots (0: the lower half, 1: the upper) has
 * the same row in x and y. */
static bool half_equal(const uint64_t *keys, int n, int half, const float *x, const float *y) {
    for (int i = 0; i < n; i++)
        if ((pc_key_slot(keys[i]) >= PC_NSLOTS / 2) == half &&
            memcmp(x + (size_t)i * DIM, y + (size_t)i * DIM, DIM * sizeof *x))
            return false;
    return true;
}

/* Wait (at most 10 s) until the metric `name` of the server at metrics port `port` passes `was`. */
static bool metric_above(int port, const char *name, double was) {
    for (double t0 = pu_now(); pu_now() - t0 < 10; usleep(20000))
        if (metric(port, name) > was)
            return true;
    return false;
}

/* Wait (at most 2 s) until that metric is `want`; whether it was. */
static bool metric_becomes(int port, const char *name, double want) {
    for (double t0 = pu_now(); pu_now() - t0 < 2; usleep(20000))
        if (metric(port, name) == want)
            return true;
    return false;
}

/* The keys of the tests below and their rows: a (checkpointed), b (pushed last), now (pulled). */
enum { RN = 512 };
static uint64_t g_rkeys[RN];
static float g_ra[RN * DIM], g_rb[RN * DIM], g_rnow[RN * DIM];

/* Whether both servers are caught up with every primary they back up (as a failover written then
 * would count it) within 10 s. */
static bool both_caught_up(const cluster_t *cl) {
    return metrics_become(cl, "emberps_replication_behind_primaries", 0, 0);
}

/* The other ways a table is replaced while its server runs are no restart either. A live restore
 * of server 0 (psctl restore of a checkpoint it took in this run) moves no slot and its restored
 * rows are what its half answers (a takeover would answer the newer rows server 1 holds); both
 * servers copy the other's table again. */
static void test_live_restore_is_no_failover(void **state) {
    (void)state;
    use_cold(false);
    cluster_t cl;
    char ckarg[300];
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s/restore-ck0", g_dir);
    const pid_t sc = cluster_up_apart(&cl, ckarg);
    psc_t *c = connect_to(cl.p0);
    static float g[RN * DIM];
    keys_and_grads(g_rkeys, g, RN, 0xD6E8FEB86659FD93ull, 0.05f);
    assert_int_equal(psc_push(c, "emb", g_rkeys, RN, DIM, g, NULL), 0);
    assert_int_equal(psc_pull(c, "emb", g_rkeys, RN, DIM, g_ra), 0);
    char out[1024];
    const char *ck[] = {"checkpoint", NULL};
    assert_int_equal(pu_psctl(g_psctl, cl.grpc0, out, sizeof out, ck), 0);
    char id[32];
    assert_int_equal(sscanf(out, "checkpoint %31[0-9]", id), 1);
    assert_int_equal(psc_push(c, "emb", g_rkeys, RN, DIM, g, NULL), 0);
    assert_int_equal(psc_pull(c, "emb", g_rkeys, RN, DIM, g_rb), 0);
    assert_false(half_equal(g_rkeys, RN, 0, g_ra, g_rb));
    const char *copies = "emberps_replication_copies_total";
    assert_true(metric_above(cl.metrics0, copies, 0) && metric_above(cl.metrics1, copies, 0));
    const double c0 = metric(cl.metrics0, copies), c1 = metric(cl.metrics1, copies);
    const char *restore[] = {"restore", id, NULL};
    assert_int_equal(pu_psctl(g_psctl, cl.grpc0, out, sizeof out, restore), 0);
    assert_true(metric_above(cl.metrics1, copies, c1)); /* server 0's restored table */
    assert_true(metric_above(cl.metrics0, copies, c0)); /* server 1's rows into it */
    assert_true(both_caught_up(&cl));
    assert_true(map_until(&cl, 10, all_in_sync, 0));
    pc_cluster_map_t *m = cc_map_of(cl.p1);
    assert_true(halves_as_before(m, 0));
    pc_cmap_destroy(m);
    assert_int_equal(psc_pull(c, "emb", g_rkeys, RN, DIM, g_rnow), 0);
    assert_true(half_equal(g_rkeys, RN, 0, g_rnow, g_ra)); /* server 0's half: restored */
    assert_true(half_equal(g_rkeys, RN, 1, g_rnow, g_rb));
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
    pu_stop(sc);
}

/* A drop and create on server 0 moves no slot: server 0 copies server 1's rows again into its
 * new table, and server 1 erases its copy of server 0's rows, those of a cold table in its
 * RocksDB tier too (512 rows, 200 in RAM). RAM-only: server 1 killed, server 0 is promoted clean
 * and answers server 1's half with server 1's rows. Cold: server 0 killed, server 1 is promoted
 * clean and holds exactly its own half's rows (those it backed up are erased, the cold ones
 * with them). */
static void recreate_is_no_failover(bool cold) {
    use_cold(cold);
    cluster_t cl;
    const pid_t sc = cluster_up_apart(&cl, NULL);
    psc_t *c = connect_to(cl.p0);
    static float g[RN * DIM];
    keys_and_grads(g_rkeys, g, RN, 0x94D049BB133111EBull, 0.05f);
    size_t of1 = 0;
    for (int i = 0; i < RN; i++)
        of1 += pc_key_slot(g_rkeys[i]) >= PC_NSLOTS / 2;
    assert_int_equal(psc_push(c, "emb", g_rkeys, RN, DIM, g, NULL), 0); /* sync: both hold it */
    assert_int_equal(psc_pull(c, "emb", g_rkeys, RN, DIM, g_rb), 0);
    const char *copies = "emberps_replication_copies_total"; /* the first copies ended: */
    assert_true(metric_above(cl.metrics0, copies, 0) && metric_above(cl.metrics1, copies, 0));
    const double c0 = metric(cl.metrics0, copies), c1 = metric(cl.metrics1, copies);
    char out[1024];
    const char *drop[] = {"drop", "emb", NULL};
    const char *create[] = {"create", g_tables + strlen("--tables="), NULL};
    assert_int_equal(pu_psctl(g_psctl, cl.grpc0, out, sizeof out, drop), 0);
    int rc = 1; /* (a dropped cold table held by a call in flight keeps its tier a moment) */
    for (double t0 = pu_now(); rc && pu_now() - t0 < 5; usleep(rc ? 20000 : 0))
        rc = pu_psctl(g_psctl, cl.grpc0, out, sizeof out, create);
    if (rc)
        fail_msg("psctl create: %s", out);
    assert_true(metric_above(cl.metrics1, copies, c1)); /* server 0's new table */
    assert_true(metric_above(cl.metrics0, copies, c0)); /* server 1's rows into it */
    assert_true(both_caught_up(&cl));                   /* (a failover before counts unclean) */
    assert_true(map_until(&cl, 10, all_in_sync, 0));
    pc_cluster_map_t *m = cc_map_of(cl.p1);
    assert_true(halves_as_before(m, 0));
    pc_cmap_destroy(m);
    if (!cold) {
        kill_server1(&cl);
        assert_true(map_until(&cl, 15, all_of, 0)); /* clean */
        assert_int_equal(psc_pull(c, "emb", g_rkeys, RN, DIM, g_rnow), 0);
        assert_true(half_equal(g_rkeys, RN, 1, g_rnow, g_rb));
        psc_close(c);
        pu_stop(cl.s0);
    } else {
        psc_close(c);
        kill(cl.s0, SIGKILL);
        pu_reap(cl.s0, 5);
        assert_true(map_until_at(cl.p1, 15, all_of_1, 0));
        c = connect_to(cl.p1);
        cc_sum_t after = {0, 0};
        cc_scan_state(c, 1, "emb", STRIDE, cc_sum_rows, &after);
        print_message("server 1 after the failover: %zu rows, %zu of its own half pushed\n",
                      after.n, of1);
        assert_int_equal(after.n, of1);
        assert_int_equal(psc_pull(c, "emb", g_rkeys, RN, DIM, g_rnow), 0);
        assert_true(half_equal(g_rkeys, RN, 1, g_rnow, g_rb));
        psc_close(c);
        pu_stop(cl.s1);
    }
    pu_stop(sc);
    use_cold(false);
}

static void test_recreate_is_no_failover(void **state) {
    (void)state;
    recreate_is_no_failover(false);
}

static void test_cold_recreate_is_no_failover(void **state) {
    (void)state;
    recreate_is_no_failover(true);
}

/* A table made on a backup before its primary has it (psctl create server by server) stops
 * nothing: server 0 has a table `aux` (followed first: its name sorts before emb) that server 1
 * lacks, and pushes to emb's rows on server 1, which wait for server 0, are answered (before:
 * the follower took the refusal for server 1 being down and followed none of its tables, and
 * they timed out); both servers count themselves caught up. Then server 1 makes it too, and
 * rows pushed to it are on both servers. */
static void test_table_on_backup_first(void **state) {
    (void)state;
    use_cold(false);
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    char out[1024];
    const char *create[] = {"create", "name=aux,dim=4", NULL};
    assert_int_equal(pu_psctl(g_psctl, cl.grpc0, out, sizeof out, create), 0);
    usleep(1200000); /* server 0's follower lists its tables every second: aux is a source now */
    enum { N = 256 };
    static uint64_t keys[N];
    static float g[N * DIM];
    keys_and_grads(keys, g, N, 0xBF58476D1CE4E5B9ull, 0.1f);
    psc_t *c = connect_to(cl.p0);
    for (int r = 0; r < 3; r++)
        assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_true(rows_become(&cl, N, N));
    assert_true(both_caught_up(&cl));
    /* server 1 makes it too: followed from then on, both hold every row pushed to it */
    assert_int_equal(pu_psctl(g_psctl, cl.grpc1, out, sizeof out, create), 0);
    static float ga[N * 4];
    for (int i = 0; i < N * 4; i++)
        ga[i] = 0.1f;
    assert_int_equal(psc_push(c, "aux", keys, N, 4, ga, NULL), 0);
    assert_true(metrics_become(&cl, "emberps_table_rows{table=\"aux\"}", N, N));
    assert_true(both_caught_up(&cl));
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

/* A backup whose own table was replaced holds none of its primary's rows until it copied them
 * again: server 1 stopped (SIGSTOP, so no copy can come), then psctl reset on server 0, its
 * backup; once server 1's lease ran out, server 0's promotion over it is counted unclean (its
 * rows are back at their initial values), where the map still had server 0 in sync: a clean
 * promotion before, the pushes silently gone. */
static bool half_unclean_of_0(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    return pc_cmap_server_slots(m, 0) == PC_NSLOTS && pc_cmap_unclean(m) > 0;
}

static void test_backup_reset_then_failover(void **state) {
    (void)state;
    use_cold(false);
    g_lease = "--lease-ms=3000"; /* time to see server 0 count itself behind before the failover */
    cluster_t cl;
    const pid_t sc = cluster_up_apart(&cl, NULL);
    psc_t *c = connect_to(cl.p0);
    enum { N = 400 };
    uint64_t keys[N];
    static float g[N * DIM];
    keys_and_grads(keys, g, N, 0x2545F4914F6CDD1Dull, 0.25f);
    assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0);
    assert_true(rows_become(&cl, N, N));
    assert_true(map_until(&cl, 10, all_in_sync, 0));
    assert_true(both_caught_up(&cl));
    assert_int_equal(kill(cl.s1, SIGSTOP), 0);
    char out[1024];
    const char *reset[] = {"reset", "emb", NULL};
    assert_int_equal(pu_psctl(g_psctl, cl.grpc0, out, sizeof out, reset), 0);
    /* its follower cannot reach server 1, but its table was replaced since it last caught up */
    const char *behind = "emberps_replication_behind_primaries";
    assert_true(metric_becomes(cl.metrics0, behind, 1));
    assert_true(map_until(&cl, 15, half_unclean_of_0, 0));
    pc_cluster_map_t *m = cc_map_of(cl.p0);
    assert_int_equal(pc_cmap_unclean(m), PC_NSLOTS / 2); /* server 1's half */
    pc_cmap_destroy(m);
    assert_true(metric(cl.metrics0, "emberps_replication_unclean_promoted_slots_total") ==
                PC_NSLOTS / 2);
    assert_true(metric_becomes(cl.metrics0, behind, 0)); /* it backs up no one now */
    kill(cl.s1, SIGKILL);
    pu_reap(cl.s1, 5);
    psc_close(c);
    pu_stop(cl.s0);
    pu_stop(sc);
}

/* A client that pipelines pushes while server 0's backup is stopped (SIGSTOP: it keeps its lease,
 * a long one here, and acknowledges nothing): their replies wait for the backup, and what they
 * hold counts against the connection's reply queue (64 KiB), so server 0 stops reading that
 * connection after a few of them; before, it applied and parked every push the client sent.
 * Once the backup goes on, every parked push is confirmed and answered. */
static void test_parked_replies_bounded(void **state) {
    (void)state;
    g_lease = "--lease-ms=30000";
    cluster_t cl;
    const pid_t sc = cluster_up_apart(&cl, "--reply-queue-bytes=64Ki");
    assert_true(map_until(&cl, 10, all_in_sync, 0));
    enum { N = 2048, COUNT = 40 };
    static uint64_t keys[N];
    static float g[N * DIM];
    uint64_t k = 1;
    for (int i = 0; i < N; k++) /* server 0's slots */
        if (pc_key_slot(k * 0x9E3779B97F4A7C15ull) < PC_NSLOTS / 2)
            keys[i++] = k * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N * DIM; i++)
        g[i] = 0.01f;
    psc_t *c = connect_to(cl.p0);
    assert_int_equal(psc_push(c, "emb", keys, N, DIM, g, NULL), 0); /* the backup confirms it */
    psc_close(c);
    assert_int_equal(kill(cl.s1, SIGSTOP), 0);
    static uint8_t body[1 << 20];
    const uint32_t len = (uint32_t)pc_wire_batch_body_len(PC_OP_PUSH, 3, N, DIM);
    assert_true(len <= sizeof body);
    size_t off = pc_wire_batch_head_encode("emb", N, DIM, body);
    memcpy(body + off, keys, sizeof keys);
    memcpy(body + off + sizeof keys, g, sizeof g);
    const int fd = raw_connect(cl.p0);
    struct timeval tv = {0, 200000}; /* blocking sends: the server stops reading at its cap */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int sent = 0;
    for (; sent < COUNT; sent++) {
        uint8_t h[PC_WIRE_HDR];
        pc_wire_hdr_t hd = {.op = PC_OP_PUSH, .id = 1 + (uint64_t)sent, .body_len = len};
        pc_wire_hdr_encode(&hd, h);
        if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
            send(fd, body, len, MSG_NOSIGNAL) != (ssize_t)len)
            break;
    }
    double waiting = 0, paused = 0;
    for (double t0 = pu_now(); pu_now() - t0 < 3; usleep(50000)) {
        const double w = metric(cl.metrics0, "emberps_replication_waiting_pushes");
        waiting = w > waiting ? w : waiting;
        paused = metric(cl.metrics0, "emberps_dataplane_paused_connections");
    }
    print_message("%d pushes of %d keys sent to a server whose backup is stopped: at most %.0f "
                  "waited for it, %.0f connection paused\n",
                  sent, N, waiting, paused);
    assert_true(waiting >= 1 && waiting <= 6); /* 64 KiB: 3 of 16 KiB and more, and one over */
    assert_true(paused >= 1);
    assert_int_equal(kill(cl.s1, SIGCONT), 0);
    struct timeval rt = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
    bool answered[COUNT] = {false};
    for (int i = 0; i < sent; i++) { /* every push answered 0, once (released in any order) */
        uint8_t h[PC_WIRE_HDR], reply[256];
        recv_all(fd, h, sizeof h);
        pc_wire_hdr_t hd;
        assert_int_equal(pc_wire_hdr_decode(h, 1u << 30, &hd), 0);
        assert_true(hd.body_len <= sizeof reply && hd.id >= 1 && hd.id <= (uint64_t)sent);
        recv_all(fd, reply, hd.body_len);
        assert_int_equal(hd.status, 0);
        assert_false(answered[hd.id - 1]);
        answered[hd.id - 1] = true;
    }
    close(fd);
    assert_true(metric(cl.metrics0, "emberps_replication_waiting_pushes") == 0);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
    pu_stop(sc);
}

/* Teardown of a test that took a longer lease: the next ones get the usual one, pass or fail. */
static int usual_lease(void **state) {
    (void)state;
    g_lease = LEASE;
    return 0;
}

/* ---- live resharding ---- */

/* table_sum over both servers, then the client closed and the cluster stopped. */
static uint64_t table_sum_down(cluster_t *cl, psc_t *c, size_t *rows) {
    const uint64_t sum = cc_table_sum(c, 2, "emb", STRIDE, rows);
    psc_close(c);
    pu_stop(cl->s1);
    pu_stop(cl->s0);
    return sum;
}

/* The rows each round pulled, per run (0 resharded, 1 never): a mismatch names the first. */
#define LOG_ROUNDS 4096
static float g_pulls[2][LOG_ROUNDS][BATCH * DIM];
static int g_run;

/* Round k: a pull of BATCH keys (hashed into *pulled) and a push of fixed gradients. */
static void reshard_round(psc_t *c, int k, uint64_t *pulled) {
    static float buf[BATCH * DIM], grads[BATCH * DIM];
    float *rows = k < LOG_ROUNDS ? g_pulls[g_run][k] : buf;
    const int first = (k * 37) % (NKEYS - BATCH);
    for (int i = 0; i < BATCH * DIM; i++)
        grads[i] = 0.01f * (float)(((i + k) % 7) - 3);
    int rc = psc_pull(c, "emb", g_keys + first, BATCH, DIM, rows);
    if (rc)
        fail_msg("round %d: pull: %s", k, pc_strerror(rc));
    *pulled = cc_fnv(*pulled, rows, sizeof buf);
    if ((rc = psc_push(c, "emb", g_keys + first, BATCH, DIM, grads, NULL)))
        fail_msg("round %d: push: %s", k, pc_strerror(rc));
}

/* The first round whose pull differs between the runs, its first key and both rows, and where
 * it stands among the phases (marks: the rounds at which the add started, the map reached the
 * target, the remove started, the map reached it again). */
static void first_pull_diff(int rounds, const int marks[4]) {
    for (int k = 0; k < rounds && k < LOG_ROUNDS; k++)
        for (int i = 0; i < BATCH; i++) {
            const float *a = g_pulls[0][k] + i * DIM, *b = g_pulls[1][k] + i * DIM;
            if (!memcmp(a, b, DIM * sizeof *a))
                continue;
            const uint64_t key = g_keys[(k * 37) % (NKEYS - BATCH) + i];
            print_message("first differing pull: round %d (add %d..%d, remove %d..%d), key "
                          "%016llx (slot %u): %g %g %g .. against %g %g %g ..\n",
                          k, marks[0], marks[1], marks[2], marks[3], (unsigned long long)key,
                          pc_key_slot(key), a[0], a[1], a[2], b[0], b[1], b[2]);
            return;
        }
}

static bool server2_primary(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    return pc_cmap_server_slots(m, 2) > 0;
}

static bool server2_gone(const pc_cluster_map_t *m, long arg) {
    (void)arg;
    return !pc_cmap_has_role(m, 2) && pc_cmap_replicated(m);
}

/* Rounds (20 between looks, from *k on) until the map is the resharding target (30 s at most),
 * then until server 0 serves a map in which server 2 is primary of `want` slots or more (want
 * 1), or has no role (want 0); that count. */
static uint32_t rounds_until_moved(cluster_t *cl, psc_t *c, int *k, uint64_t *pulled, int want) {
    for (double t0 = pu_now(); !cc_reshard_done(g_psctl, cl->grpc0) && pu_now() - t0 < 30;)
        for (int j = 0; j < 20; j++, (*k)++)
            reshard_round(c, *k, pulled);
    assert_true(cc_reshard_done(g_psctl, cl->grpc0));
    if (!map_until(cl, 5, want ? server2_primary : server2_gone, 0))
        fail_msg("server 0 never served the target map");
    pc_cluster_map_t *m = cc_map_of(cl->p0);
    const uint32_t n = pc_cmap_server_slots(m, 2);
    pc_cmap_destroy(m);
    return n;
}

static void reshard_add_remove(bool cold) {
    use_cold(cold);
    for (int i = 0; i < NKEYS; i++)
        g_keys[i] = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    psc_t *c = connect_to(cl.p0);
    uint64_t pulled = CC_FNV_START;
    int k = 0, marks[4];
    g_run = 0;
    for (; k < 100; k++)
        reshard_round(c, k, &pulled);
    const char *copies = "emberps_replication_copies_total";
    const double copies1 = metric(cl.metrics1, copies);
    /* add a third server: psctl lists it in a new map version and writes the target */
    const int p2 = pu_free_port();
    char maparg[1024];
    cc_reshard_add(g_psctl, cl.grpc0, p2, maparg, sizeof maparg);
    const char *e2[8] = {maparg, g_tables, cl.coordarg, LEASE};
    int n2 = 4;
    cold_args(e2, &n2, 2);
    const pid_t s2 = pu_spawn(p2, g_dir, e2, NULL);
    const double t0 = pu_now();
    marks[0] = k;
    const uint32_t third = rounds_until_moved(&cl, c, &k, &pulled, 1);
    marks[1] = k;
    print_message("added: server 2 is primary of %u slots after %.1f s (%d rounds)\n", third,
                  pu_now() - t0, k);
    assert_true(third > PC_NSLOTS / 4 && third < PC_NSLOTS / 2);
    /* server 1 backed up server 0's slots that moved, and is no backup of them now: released */
    const char *released = "emberps_resharding_rows_released_total";
    double rel = 0;
    for (double t2 = pu_now(); pu_now() - t2 < 5 && (rel = metric(cl.metrics1, released)) <= 0;)
        usleep(20000);
    print_message("server 1 released %.0f rows\n", rel);
    assert_true(rel > 0);
    /* server 1 backs up the slots it handed over, following the new primary's log from where
     * it stood before the handover: no copy (the table sums below check the rows), a cold table
     * too (its capacity spills: the new primary drops none of the rows it took) */
    const double copies_now = metric(cl.metrics1, copies);
    print_message("server 1's copies: %.0f before the move, %.0f after\n", copies1, copies_now);
    assert_true(copies1 >= 1 && copies_now == copies1);
    for (int j = 0; j < 50; j++, k++) /* some with the third server primary */
        reshard_round(c, k, &pulled);
    /* and remove it again */
    const double t1 = pu_now();
    cc_reshard_remove(g_psctl, cl.grpc0, p2);
    marks[2] = k;
    rounds_until_moved(&cl, c, &k, &pulled, 0);
    marks[3] = k;
    print_message("removed after %.1f s; %d rounds in all\n", pu_now() - t1, k);
    pu_stop(s2);
    for (int j = 0; j < 50; j++, k++)
        reshard_round(c, k, &pulled);
    size_t rows, rows0;
    const uint64_t sum = table_sum_down(&cl, c, &rows);
    /* the same calls on a cluster never resharded */
    cluster_up(&cl);
    wait_replicated(&cl);
    c = connect_to(cl.p0);
    uint64_t pulled0 = CC_FNV_START;
    g_run = 1;
    for (int j = 0; j < k; j++)
        reshard_round(c, j, &pulled0);
    const uint64_t sum0 = table_sum_down(&cl, c, &rows0);
    print_message("rows %zu (never resharded: %zu), table hash %016llx (%016llx), pulls %016llx "
                  "(%016llx)\n",
                  rows, rows0, (unsigned long long)sum, (unsigned long long)sum0,
                  (unsigned long long)pulled, (unsigned long long)pulled0);
    assert_int_equal(rows, rows0);
    if (pulled != pulled0)
        first_pull_diff(k, marks);
    assert_true(pulled == pulled0);
    assert_true(sum == sum0);
    use_cold(false);
}

static void test_reshard_add_remove(void **state) {
    (void)state;
    reshard_add_remove(false);
}

/* The same with the cold tables (most rows in each server's tier): releases erase cold rows
 * too, and copies walk the cold stores. */
static void test_cold_reshard_add_remove(void **state) {
    (void)state;
    reshard_add_remove(true);
}

/* A resharding target naming a server that never starts: nothing moves and the map does not
 * churn (the server is not added as a backup while its lease is absent); removing it again
 * reaches the target at once. */
/* `psctl --json reshard add` of 127.0.0.1:port: the target it printed (exit 0). */
static pc_cluster_map_t *reshard_add_target(int grpc_port, int port) {
    char addr[64], out[8192];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *args[] = {"--json", "reshard", "add", addr, NULL};
    const int rc = pu_psctl(g_psctl, grpc_port, out, sizeof out, args);
    if (rc)
        fail_msg("psctl reshard add %s: exit %d: %s", addr, rc, out);
    char *tp = strstr(out, "\"target\":\"");
    assert_non_null(tp);
    tp += 10;
    char *end = strchr(tp, '"');
    assert_non_null(end);
    *end = '\0';
    pc_cluster_map_t *t = NULL;
    char err[200];
    if (pc_cmap_parse(tp, &t, err, sizeof err))
        fail_msg("target %s: %s", tp, err);
    return t;
}

/* `psctl reshard add` of port, run from a thread (its exit code kept: the test's thread
 * asserts). */
typedef struct concurrent_add {
    int grpc_port, port, rc;
    pthread_t th;
} concurrent_add_t;

static void *add_thread(void *arg) {
    concurrent_add_t *a = arg;
    char addr[64], out[8192];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a->port);
    const char *args[] = {"reshard", "add", addr, NULL};
    a->rc = pu_psctl(g_psctl, a->grpc_port, out, sizeof out, args);
    return NULL;
}

static void test_reshard_absent_server(void **state) {
    (void)state;
    cluster_t cl;
    cluster_up(&cl);
    wait_replicated(&cl);
    char maparg[1024];
    const int p2 = pu_free_port();
    cc_reshard_add(g_psctl, cl.grpc0, p2, maparg, sizeof maparg); /* and never started */
    usleep(300000);
    pc_cluster_map_t *m = cc_map_of(cl.p0);
    const uint64_t v0 = pc_cmap_version(m);
    pc_cmap_destroy(m);
    usleep(2000000); /* many controller ticks */
    m = cc_map_of(cl.p0);
    const uint64_t v1 = pc_cmap_version(m);
    assert_false(pc_cmap_has_role(m, 2));
    pc_cmap_destroy(m);
    print_message("map versions while the target waits for an absent server: %llu, then %llu\n",
                  (unsigned long long)v0, (unsigned long long)v1);
    assert_true(v1 == v0);
    assert_false(cc_reshard_done(g_psctl, cl.grpc0));
    /* the same add again (psctl killed, run again): the target said again, exit 0 */
    pc_cluster_map_t *t = reshard_add_target(cl.grpc0, p2);
    assert_true(pc_cmap_has_role(t, 2));
    pc_cmap_destroy(t);
    /* another server added while that one is pending: the target gives both their share (it
     * was planned from the map, and the pending add was cancelled) */
    const int p3 = pu_free_port();
    t = reshard_add_target(cl.grpc0, p3);
    const bool both = pc_cmap_has_role(t, 2) && pc_cmap_has_role(t, 3);
    pc_cmap_destroy(t);
    assert_true(both);
    /* two psctl adding two servers at once (two operators): the target gives all four theirs
     * (each writes by compare-and-set on the target it read; the last plain write won before,
     * and the other's server had no slots while its psctl said it had) */
    concurrent_add_t ca[2] = {{.grpc_port = cl.grpc0, .port = pu_free_port(), .rc = -1},
                              {.grpc_port = cl.grpc0, .port = pu_free_port(), .rc = -1}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&ca[i].th, NULL, add_thread, &ca[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(ca[i].th, NULL);
        assert_int_equal(ca[i].rc, 0);
    }
    t = reshard_add_target(cl.grpc0, ca[1].port); /* (said again: the target as it is) */
    const int added[] = {p2, p3, ca[0].port, ca[1].port};
    for (int i = 0; i < 4; i++) {
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", added[i]);
        const int idx = pc_cmap_find(t, addr);
        if (idx < 0 || !pc_cmap_has_role(t, (uint32_t)idx))
            fail_msg("%s has no role in the target after two adds at once", addr);
    }
    pc_cmap_destroy(t);
    { /* a server that holds slots already is not added again (exit 1, said at once: the
       * refusal's code was taken for a lost compare-and-set, planned again 20 times), pending
       * target or not */
        char addr[64], out[8192];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", cl.p1);
        const char *args[] = {"reshard", "add", addr, NULL};
        assert_int_equal(pu_psctl_run(g_psctl, cl.grpc0, out, sizeof out, args, true), 1);
        if (!strstr(out, "has a role in the map already") || strstr(out, "kept changing"))
            fail_msg("psctl reshard add of a server with slots said: %s", out);
    }
    for (int i = 3; i >= 0; i--) {
        cc_reshard_remove(g_psctl, cl.grpc0, added[i]);
        if (i == 3) { /* the adds still pending are said again (the remove's target keeps their
                       * list; before, it had none and the add was refused, exit 1) */
            t = reshard_add_target(cl.grpc0, p2);
            assert_true(pc_cmap_has_role(t, 2));
            pc_cmap_destroy(t);
        }
    }
    for (double t0 = pu_now(); !cc_reshard_done(g_psctl, cl.grpc0) && pu_now() - t0 < 10;)
        usleep(50000);
    assert_true(cc_reshard_done(g_psctl, cl.grpc0));
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PS_SERVER\n", argv[0]);
        return 2;
    }
    pu_bin = argv[1];
    const char *slash = strrchr(pu_bin, '/');
    snprintf(g_psctl, sizeof g_psctl, "%.*spsctl", slash ? (int)(slash - pu_bin + 1) : 0, pu_bin);
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-replica-%d", (int)getpid());
    mkdir(g_dir, 0755);
    signal(SIGPIPE, SIG_IGN);
    g_tables = k_tables;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover_keeps_acked_pushes),
        cmocka_unit_test(test_quick_restart_keeps_acked_pushes),
        cmocka_unit_test(test_stale_primary_refuses_pushes),
        cmocka_unit_test(test_unclean_promotion),
        cmocka_unit_test(test_sole_holder_restart),
        cmocka_unit_test(test_reset_is_no_failover),
        cmocka_unit_test_teardown(test_backup_reset_then_failover, usual_lease),
        cmocka_unit_test_teardown(test_parked_replies_bounded, usual_lease),
        cmocka_unit_test(test_table_on_backup_first),
        cmocka_unit_test(test_live_restore_is_no_failover),
        cmocka_unit_test(test_recreate_is_no_failover),
        cmocka_unit_test(test_cold_recreate_is_no_failover),
        cmocka_unit_test(test_reshard_add_remove),
        cmocka_unit_test(test_reshard_absent_server),
        cmocka_unit_test(test_cold_failover),
        cmocka_unit_test(test_cold_reshard_add_remove),
    };
    if (argc > 2) /* a test name pattern (cmocka's * and ?), to run one */
        cmocka_set_test_filter(argv[2]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {
    }
    return rc;
}
