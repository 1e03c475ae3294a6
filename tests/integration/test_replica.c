/* Replicas and failover (docs/server.md "Replicas and failover") with real ps-server processes
 * on loopback: server 0 is also the coordinator (in memory; the cluster map and leases live
 * there), server 1 reaches it over gRPC; every slot has one backup.
 * - test_failover_keeps_acked_pushes: pushes go on while server 1 is killed with -9; its backup
 *   (server 0) takes its slots, the client follows the new map, and every acknowledged push is
 *   in the optimizer's state: Adam's per-row step count t (read back with the rows' state over
 *   the delta stream) is at least the pushes acknowledged for the key and at most those plus the
 *   ones whose answer was lost. Server 1 restarted joins again as a backup.
 * - test_stale_primary_refuses_pushes: server 1 stopped (SIGSTOP) past its lease is replaced;
 *   woken (SIGCONT), a push already on its connection is refused, and its rows never change.
 */
#include "test_util.h"

#include "emberps/psclient.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_wire.h"
#include "proc_util.h"
#include "psclient_repl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIM   8
#define NKEYS 2000
#define LEASE "--lease-ms=600"

static char g_dir[256];

typedef struct cluster {
    int p0, p1, grpc0;
    pid_t s0, s1;
    char map[256], maparg[300], coordarg[64];
} cluster_t;

static const char *k_tables = "--tables=name=emb,dim=8,optimizer=adam,lr=0.01";

static void start1(cluster_t *c) {
    const char *e1[] = {c->maparg, k_tables, c->coordarg, LEASE, NULL};
    c->s1 = pu_spawn(c->p1, g_dir, e1, NULL);
}

static void cluster_up(cluster_t *c) {
    memset(c, 0, sizeof *c);
    c->p0 = pu_free_port();
    c->p1 = pu_free_port();
    snprintf(c->map, sizeof c->map,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", c->p0,
             c->p1);
    snprintf(c->maparg, sizeof c->maparg, "--cluster-map=%s", c->map);
    const char *e0[] = {c->maparg, k_tables, "--coordinator", "--cluster-coordinator=self",
                        LEASE,     NULL};
    c->s0 = pu_spawn(c->p0, g_dir, e0, &c->grpc0);
    snprintf(c->coordarg, sizeof c->coordarg, "--cluster-coordinator=127.0.0.1:%d", c->grpc0);
    start1(c);
}

static psc_t *connect_to(int port) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = addr, .timeout_ms = 3000, .retries = 5};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

/* Wait (bounded) until the client's map names a backup (the servers published the replicated
 * map and the client saw it). */
static void wait_replicated(psc_t *c) {
    char text[1024];
    for (double t0 = pu_now(); pu_now() - t0 < 15; usleep(50000)) {
        psc_map_text(c, text, sizeof text);
        if (strchr(text, '/'))
            return;
        uint64_t k = 1;
        float row[DIM];
        psc_pull(c, "emb", &k, 1, DIM, row); /* a reply carries a newer map version */
    }
    fail_msg("the cluster map never named backups: %s", text);
}

/* Adam's step count t of each key at server `server` (its whole table, with state). */
static void read_steps(psc_t *c, uint32_t server, const uint64_t *keys, size_t n, uint32_t *t) {
    const uint32_t stride = DIM + 2 * DIM + 1;
    uint64_t *k = calloc(65536, 8);
    uint8_t *f = calloc(65536, 1);
    float *rows = calloc((size_t)65536 * stride, 4);
    memset(t, 0, n * sizeof *t);
    for (uint32_t part = 0; part < 4; part++) {
        psc_stream_req_t q = {.server = server,
                              .table = "emb",
                              .dim = stride,
                              .part = part,
                              .parts = 4,
                              .cap = 65536,
                              .keys = k,
                              .found = f,
                              .rows = rows};
        psc_stream_t out;
        char why[256];
        int rc = psc__stream(c, true, &q, PC_STREAM_STATE, &out, why, sizeof why);
        if (rc)
            fail_msg("scan with state: %s: %s", pc_strerror(rc), why);
        for (uint32_t i = 0; i < out.n; i++)
            for (size_t j = 0; j < n; j++)
                if (keys[j] == k[i]) {
                    memcpy(&t[j], &rows[(size_t)i * stride + 3 * DIM], 4);
                    break;
                }
    }
    free(k);
    free(f);
    free(rows);
}

static void test_failover_keeps_acked_pushes(void **state) {
    (void)state;
    cluster_t cl;
    cluster_up(&cl);
    psc_t *c = connect_to(cl.p0);
    wait_replicated(c);
    static uint64_t keys[NKEYS];
    static uint32_t acked[NKEYS], unsure[NKEYS], steps[NKEYS];
    for (int i = 0; i < NKEYS; i++)
        keys[i] = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    float *grads = malloc(sizeof(float) * 200 * DIM);
    for (int i = 0; i < 200 * DIM; i++)
        grads[i] = 0.01f * (float)((i % 7) - 3);
    int killed_at = -1, failed = 0, ok_after = 0;
    double t_kill = 0, t_back = 0;
    for (int round = 0; round < 2000 && pu_now() - (t_kill ? t_kill : pu_now()) < 30; round++) {
        const int first = (round * 37) % (NKEYS - 200);
        int rc = psc_push(c, "emb", keys + first, 200, DIM, grads, NULL);
        for (int i = 0; i < 200; i++)
            (rc == 0 ? acked : unsure)[first + i]++;
        if (rc)
            failed++;
        if (round == 100) {
            kill(cl.s1, SIGKILL);
            pu_reap(cl.s1, 5);
            killed_at = round;
            t_kill = pu_now();
        }
        if (killed_at >= 0 && rc == 0 && ++ok_after == 1)
            t_back = pu_now();
        if (ok_after >= 200)
            break;
        if (killed_at >= 0 && rc)
            usleep(20000);
    }
    assert_true(ok_after >= 200); /* pushes work again after the failover */
    print_message("failover: pushes answered again %.2f s after the kill -9 (%d failed)\n",
                  t_back - t_kill, failed);
    char text[1024];
    psc_map_text(c, text, sizeof text);
    pc_cluster_map_t *m;
    assert_int_equal(pc_cmap_parse(text, &m, NULL, 0), 0);
    assert_int_equal(pc_cmap_server_slots(m, 0), PC_NSLOTS); /* server 0 took every slot */
    assert_true(pc_cmap_version(m) > 2);
    pc_cmap_destroy(m);
    read_steps(c, 0, keys, NKEYS, steps);
    int checked = 0;
    for (int i = 0; i < NKEYS; i++) {
        if (!acked[i] && !unsure[i])
            continue;
        if (steps[i] < acked[i] || steps[i] > acked[i] + unsure[i])
            fail_msg("key %d: Adam's t is %u, %u pushes acknowledged, %u unanswered", i, steps[i],
                     acked[i], unsure[i]);
        checked++;
    }
    assert_true(checked > NKEYS / 2);
    /* Server 1 comes back and joins as a backup again. */
    start1(&cl);
    bool rejoined = false;
    for (double t0 = pu_now(); !rejoined && pu_now() - t0 < 15; usleep(100000)) {
        psc_t *fresh = connect_to(cl.p0); /* server 0's map, as its HELLO gives it */
        psc_map_text(fresh, text, sizeof text);
        psc_close(fresh);
        rejoined = strstr(text, ":0/1") != NULL;
    }
    assert_true(rejoined);
    /* and pushes are answered with it as the backup (they wait for its copy) */
    for (int i = 0; i < 20; i++)
        assert_int_equal(psc_push(c, "emb", keys + i * 50, 50, DIM, grads, NULL), 0);
    psc_close(c);
    free(grads);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

/* A raw data-plane connection to port that has said HELLO. */
static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t h[PC_WIRE_HDR];
    pc_wire_hdr_t hh = {.op = PC_OP_HELLO, .id = 1};
    pc_wire_hdr_encode(&hh, h);
    assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
    pc_wire_hdr_t rh;
    uint8_t body[4096];
    assert_int_equal(read(fd, h, sizeof h), (ssize_t)sizeof h);
    assert_int_equal(pc_wire_hdr_decode(h, UINT32_MAX, &rh), 0);
    assert_true(rh.body_len < sizeof body);
    assert_int_equal(read(fd, body, rh.body_len), (ssize_t)rh.body_len);
    return fd;
}

/* Send a PUSH of one key over fd and return the reply's status. */
static int raw_push(int fd, uint64_t key) {
    uint8_t frame[PC_WIRE_HDR + 256] __attribute__((aligned(8)));
    uint8_t *b = frame + PC_WIRE_HDR;
    size_t hl = pc_wire_batch_head_encode_typed("emb", 1, DIM, PC_WIRE_F32, b);
    memcpy(b + hl, &key, 8);
    float g[DIM];
    for (int i = 0; i < DIM; i++)
        g[i] = 0.5f;
    memcpy(b + hl + 8, g, sizeof g);
    const size_t blen = hl + 8 + sizeof g;
    pc_wire_hdr_t h = {.op = PC_OP_PUSH, .id = 7, .body_len = (uint32_t)blen};
    pc_wire_hdr_encode(&h, frame);
    assert_int_equal(write(fd, frame, PC_WIRE_HDR + blen), (ssize_t)(PC_WIRE_HDR + blen));
    uint8_t rb[PC_WIRE_HDR];
    assert_int_equal(read(fd, rb, sizeof rb), (ssize_t)sizeof rb);
    pc_wire_hdr_t rh;
    assert_int_equal(pc_wire_hdr_decode(rb, UINT32_MAX, &rh), 0);
    static uint8_t body[1 << 16];
    size_t got = 0;
    while (got < rh.body_len) {
        ssize_t n = read(fd, body + got, rh.body_len - got);
        assert_true(n > 0);
        got += (size_t)n;
    }
    return rh.status;
}

static void test_stale_primary_refuses_pushes(void **state) {
    (void)state;
    cluster_t cl;
    cluster_up(&cl);
    psc_t *c = connect_to(cl.p0);
    wait_replicated(c);
    /* a key of server 1's slots, pushed once so both copies have it */
    uint64_t key = 1;
    while (pc_key_slot(key) < 8192)
        key++;
    float g[DIM] = {0.1f};
    assert_int_equal(psc_push(c, "emb", &key, 1, DIM, g, NULL), 0);
    int fd = raw_connect(cl.p1);
    assert_int_equal(raw_push(fd, key), 0); /* server 1 is the primary: taken */
    pu_stop_signal(cl.s1);
    /* server 0 takes over once server 1's lease (600 ms) is gone */
    char text[1024];
    bool moved = false;
    for (double t0 = pu_now(); !moved && pu_now() - t0 < 15; usleep(50000)) {
        psc_push(c, "emb", &key, 1, DIM, g, NULL);
        psc_map_text(c, text, sizeof text);
        pc_cluster_map_t *m;
        if (pc_cmap_parse(text, &m, NULL, 0) == 0) {
            moved = pc_cmap_slot_owner(m, pc_key_slot(key)) == 0;
            pc_cmap_destroy(m);
        }
    }
    assert_true(moved);
    uint32_t t_before, t_after;
    read_steps(c, 0, &key, 1, &t_before);
    kill(cl.s1, SIGCONT);
    const int st = raw_push(fd, key); /* queued before server 1 runs anything else */
    if (st != PC_EUNAVAIL && st != PC_EWRONGSLOT && st != PC_ETIMEDOUT)
        fail_msg("the stale primary answered a push with %d (%s)", st, pc_strerror(st));
    close(fd);
    usleep(500000);
    read_steps(c, 0, &key, 1, &t_after);
    assert_int_equal(t_after, t_before); /* the new primary's row did not move */
    psc_close(c);
    pu_stop(cl.s1);
    pu_stop(cl.s0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PS_SERVER\n", argv[0]);
        return 2;
    }
    pu_bin = argv[1];
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-replica-%d", (int)getpid());
    mkdir(g_dir, 0755);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover_keeps_acked_pushes),
        cmocka_unit_test(test_stale_primary_refuses_pushes),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {
    }
    return rc;
}
