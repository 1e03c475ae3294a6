/* The data plane end to end: ps-server processes on loopback ports, libpsclient and raw frames.
 *  - two servers with a 2-way cluster map: pulls, pushes and lookups (blocking and 8 in flight)
 *    equal an in-process table given the same calls;
 *  - a map change (SIGHUP reload): stale clients are redirected (PC_EWRONGSLOT) and resend;
 *  - kill -9 a server, restart it from its checkpoint: the client reconnects, state is exact;
 *  - a stopped server: calls end at their deadline, late replies are discarded safely;
 *  - bad input on raw connections: not-a-frame, oversized body (skipped, connection lives),
 *    malformed batch, unknown table, wrong dim, too many keys, NaN gradients;
 *  - token authentication; refusal to bind a non-loopback address without a token; a second
 *    server on a port the first holds (data plane or gRPC) exits with an error;
 *  - a PULL or LOOKUP whose reply would exceed max_reply_bytes: PC_ETOOBIG with a message that
 *    names the sizes, at once, without the server's memory growing by the reply (raw frames and
 *    libpsclient);
 *  - clients that send requests and never read: the server's unsent reply bytes stay under its
 *    per-connection and server-wide caps (a gauge and its peak in /metrics), a client that
 *    reads is still served, and everything recovers once they go;
 *  - the cluster calls: psc_tables (the same text from every server, PC_ESTATE when they differ,
 *    PC_ETOOBIG and the size for a short buffer) and psc_health (a result per server: an answer,
 *    a stopped server's "no answer" at the deadline, a killed one's connection failure);
 *  - SIGTERM: in-flight work answered, checkpoint written, exit 0;
 *  - a network that drops every packet (loopback down in a network namespace of the test's own;
 *    skipped where one cannot be made): the client's connection ends within its dead-peer time,
 *    the server's within --dead-peer-ms, and calls go on once the network is back.
 * argv[1] is the ps-server binary. Every wait is bounded. */
#include "proc_util.h"
#include "raw_frame.h"
#include "table_check.h"

#include "emberps/psclient.h"
#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_wire.h"
#include "ps_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include <pthread.h>
#include <stdatomic.h>

static const char *TABLE = "name=emb,dim=8,optimizer=adagrad,shards=4";
enum { D = 8 };

static psc_t *connect_to(const char *servers, const char *token) {
    psc_opts_t o = {.servers = servers, .token = token, .timeout_ms = 5000, .retries = 8};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

/* Random batch i: keys from a pool of 5000 (with duplicates) and gradients. */
static void batch(int i, uint64_t *keys, float *g, int n) {
    uint64_t rng = 500 + (uint64_t)i;
    for (int j = 0; j < n; j++) {
        keys[j] = tu_rand(&rng) % 5000 * 0x9E3779B97F4A7C15ULL;
        for (int e = 0; e < D; e++)
            g[j * D + e] = tu_gauss(&rng) * 0.1f;
    }
}

static void two_way_map(char *buf, size_t cap, int p0, int p1, int version) {
    snprintf(buf, cap, "version=%d;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1",
             version, p0, p1);
}

static void test_two_servers_match_local(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], tables[200];
    tc_tmpdir(dir, sizeof dir, "dp2");
    int p0 = pu_free_port(), p1 = pu_free_port();
    two_way_map(map, sizeof map, p0, p1, 1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {maparg, tables, NULL};
    pid_t s0 = pu_spawn(p0, dir, extra, NULL), s1 = pu_spawn(p1, dir, extra, NULL);
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", p0); /* the map comes from the server */
    psc_t *c = connect_to(one, NULL);
    ps_table_t *ref = tc_create(TABLE);
    enum { N = 700 };
    static uint64_t keys[N];
    static float g[N * D], x[N * D], y[N * D];
    static uint8_t fx[N], fy[N];
    for (int i = 0; i < 40; i++) {
        batch(i, keys, g, N);
        assert_int_equal(psc_pull(c, "emb", keys, N, D, x), 0);
        assert_int_equal(ps_table_pull(ref, keys, N, y, N * D), 0);
        assert_memory_equal(x, y, sizeof x);
        psc_push_result_t r;
        ps_push_result_t lr;
        assert_int_equal(psc_push(c, "emb", keys, N, D, g, &r), 0);
        assert_int_equal(ps_table_push(ref, keys, N, g, N * D, &lr), 0);
        assert_int_equal(r.applied, lr.applied);
    }
    assert_int_equal(psc_lookup(c, "emb", keys, N, D, x, fx), 0);
    assert_int_equal(ps_table_lookup(ref, keys, N, y, N * D, fy), 0);
    assert_memory_equal(x, y, sizeof x);
    assert_memory_equal(fx, fy, N);
    /* 8 pulls in flight at once, each into its own buffer. */
    static float rows[8][N * D];
    uint64_t ids[8];
    for (int k = 0; k < 8; k++)
        assert_int_equal(psc_pull_async(c, "emb", keys, N, D, rows[k], NULL, NULL, &ids[k]), 0);
    for (int k = 0; k < 8; k++) {
        assert_int_equal(psc_wait(c, ids[k]), 0);
        assert_memory_equal(rows[k], y, sizeof rows[k]);
    }
    /* Unknown table, wrong dim: errors, not rows. */
    assert_int_equal(psc_pull(c, "nope", keys, N, D, x), PC_ENOTFOUND);
    assert_int_equal(psc_pull(c, "emb", keys, 10, 4, x), PC_EDIM);
    psc_close(c);
    /* One server answers a wrong dim while the other hangs: the call waits for its deadline,
     * then says the error it has (it said PC_ETIMEDOUT, the code of the hung part). */
    psc_opts_t o = {.servers = one, .timeout_ms = 400, .retries = 1};
    assert_int_equal(psc_connect(&o, &c), 0);
    pu_stop_signal(s1);
    assert_int_equal(psc_pull(c, "emb", keys, N, 4, x), PC_EDIM);
    kill(s1, SIGCONT);
    psc_close(c);
    ps_table_destroy(ref);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

/* CPU seconds (user + system) the process has used so far, from /proc/PID/stat. */
static double cpu_seconds(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* fields after the command name: state is field 3 */
    assert_non_null(p);
    unsigned long long ut = 0, st = 0;
    assert_int_equal(
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st), 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* One server: the rows of a pull or lookup are read straight into the caller's array (psclient
 * direct_start), the found bytes of a lookup after them; the results match a local table's, for
 * keys present and absent, with 8 calls in flight into buffers side by side, and an error reply
 * (wrong dim) leaves the caller's rows untouched. With poll_us, the server's
 * event loops busy-poll after input (--poll-us): the same results, and an idle server sleeps. */
static void one_server_direct(int poll_us) {
    char dir[256], tables[200], one[64], poll[64];
    tc_tmpdir(dir, sizeof dir, "dpdir");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    snprintf(poll, sizeof poll, "--poll-us=%d", poll_us);
    const char *extra[] = {tables, poll, NULL};
    const int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one, NULL);
    ps_table_t *ref = tc_create(TABLE);
    enum { N = 3000 }; /* replies of 96 KB: several reads each */
    static uint64_t keys[2 * N];
    static float g[2 * N * D], x[8][2 * N * D], y[2 * N * D];
    static uint8_t fx[8][2 * N], fy[2 * N];
    batch(1, keys, g, 2 * N);
    for (int i = N; i < 2 * N; i++)
        keys[i] = 0xABCD000000000000ULL + (uint64_t)i; /* never pulled: not found */
    assert_int_equal(psc_pull(c, "emb", keys, N, D, x[0]), 0);
    assert_int_equal(ps_table_pull(ref, keys, N, y, N * D), 0);
    assert_memory_equal(x[0], y, N * D * sizeof(float));
    assert_int_equal(ps_table_lookup(ref, keys, 2 * N, y, 2 * N * D, fy), 0);
    uint64_t ids[8];
    memset(fx, 7, sizeof fx);
    for (int k = 0; k < 8; k++)
        assert_int_equal(
            psc_lookup_async(c, "emb", keys, 2 * N, D, x[k], fx[k], NULL, NULL, &ids[k]), 0);
    for (int k = 0; k < 8; k++) {
        assert_int_equal(psc_wait(c, ids[k]), 0);
        assert_memory_equal(x[k], y, sizeof y);
        assert_memory_equal(fx[k], fy, sizeof fy);
    }
    /* An error's body is a message: the caller's rows stay as they were. */
    for (size_t i = 0; i < 2 * N * D; i++)
        x[0][i] = 42.0f;
    assert_int_equal(psc_pull(c, "emb", keys, N, 4, x[0]), PC_EDIM);
    for (size_t i = 0; i < 2 * N * D; i++)
        assert_true(x[0][i] == 42.0f);
    /* Idle for 20 poll windows (at least 400 ms): a loop that went on polling would use about
     * all of that time; one that sleeps uses next to none. */
    const double idle = 20e-6 * poll_us > 0.4 ? 20e-6 * poll_us : 0.4;
    const double c0 = cpu_seconds(s);
    usleep((useconds_t)(idle * 1e6));
    const double used = cpu_seconds(s) - c0;
    if (used > 0.5 * idle)
        fail_msg("an idle server (--poll-us=%d) used %.3f s of CPU in %.3f s", poll_us, used, idle);
    psc_close(c);
    ps_table_destroy(ref);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_one_server_direct(void **state) {
    (void)state;
    one_server_direct(0);
}

static void test_one_server_direct_polling(void **state) {
    (void)state;
    one_server_direct(20000);
}

/* What a done callback learnt through psc_wait_detail from inside it. */
typedef struct detail_cb {
    psc_t *c;
    int rc;
    char why[1024];
    atomic_int done;
} detail_cb_t;

static void on_detail(void *ctx, uint64_t id, int rc) {
    detail_cb_t *d = ctx;
    d->rc = psc_wait_detail(d->c, id, d->why, sizeof d->why);
    assert_int_equal(d->rc, rc);
    atomic_store(&d->done, 1);
}

/* A done callback that makes a blocking call (a push of one new key, NESTED_KEY): refused at
 * once and nothing sent (it waited for ever on the I/O thread, which runs its own deadline; then
 * it was refused after the push had gone out). */
#define NESTED_KEY 0x5EED5EED5EEDull
static void on_nested(void *ctx, uint64_t id, int rc) {
    (void)id;
    (void)rc;
    detail_cb_t *d = ctx;
    const uint64_t key = NESTED_KEY;
    const float g[D] = {1, 1, 1, 1, 1, 1, 1, 1};
    d->rc = psc_push(d->c, "emb", &key, 1, D, g, NULL);
    atomic_store(&d->done, 1);
}

/* A client of the server at data port `port` (its address into one) that gives up after two
 * retries, and keys spread over both servers' slots: the failure-detail tests'. */
static psc_t *detail_client(int port, char *one, size_t cap) {
    snprintf(one, cap, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one, .timeout_ms = 5000, .retries = 2};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

static void spread_keys(uint64_t *keys, int n) {
    for (int i = 0; i < n; i++)
        keys[i] = (uint64_t)i * 0x9E3779B97F4A7C15ULL;
}

static void assert_has(const char *text, const char *part) {
    if (!strstr(text, part))
        fail_msg("\"%s\" does not contain \"%s\"", text, part);
}

/* Failures carry their detail to the caller (psc_wait_detail): the server's message with the
 * table and both dims, the missing table's name, the address of a server that is down; from a
 * waited call and from inside a done callback. */
static void test_error_detail(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], tables[200], one[64], a0[64], a1[64], why[1024];
    tc_tmpdir(dir, sizeof dir, "dpwhy");
    int p0 = pu_free_port(), p1 = pu_free_port();
    two_way_map(map, sizeof map, p0, p1, 1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {maparg, tables, NULL};
    pid_t s0 = pu_spawn(p0, dir, extra, NULL), s1 = pu_spawn(p1, dir, extra, NULL);
    snprintf(a0, sizeof a0, "127.0.0.1:%d", p0);
    snprintf(a1, sizeof a1, "127.0.0.1:%d", p1);
    psc_t *c = detail_client(p0, one, sizeof one);
    enum { N = 200 };
    uint64_t keys[N], id;
    static float rows[N * D];
    spread_keys(keys, N);
    /* a success: no detail */
    assert_int_equal(psc_pull_async(c, "emb", keys, N, D, rows, NULL, NULL, &id), 0);
    strcpy(why, "x");
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), 0);
    assert_string_equal(why, "");
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_EINVAL); /* taken */
    /* wrong dim: the server's message, after its address */
    assert_int_equal(psc_pull_async(c, "emb", keys, N, 4, rows, NULL, NULL, &id), 0);
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_EDIM);
    print_message("wrong dim: %s\n", why);
    assert_has(why, "table emb has dim 8, request 4");
    assert_true(strncmp(why, a0, strlen(a0)) == 0 || strncmp(why, a1, strlen(a1)) == 0);
    /* no such table: named */
    assert_int_equal(psc_lookup_async(c, "nope", keys, N, D, rows, NULL, NULL, NULL, &id), 0);
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_ENOTFOUND);
    print_message("no table: %s\n", why);
    assert_has(why, "nope");
    assert_has(why, "127.0.0.1:");
    /* from inside a done callback (the I/O thread); a truncating buffer stays terminated */
    static float g[N * D];
    detail_cb_t d = {.c = c};
    assert_int_equal(psc_push_async(c, "emb", keys, N, 4, g, NULL, on_detail, &d, &id), 0);
    for (double t0 = pu_now(); !atomic_load(&d.done) && pu_now() - t0 < 10;)
        usleep(1000);
    assert_true(atomic_load(&d.done));
    assert_int_equal(d.rc, PC_EDIM);
    assert_has(d.why, "table emb has dim 8, request 4");
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_EINVAL); /* not from outside */
    assert_int_equal(psc_pull_async(c, "emb", keys, N, 4, rows, NULL, NULL, &id), 0);
    assert_int_equal(psc_wait_detail(c, id, why, 8), PC_EDIM);
    assert_int_equal(strlen(why), 7);
    detail_cb_t nd = {.c = c};
    assert_int_equal(psc_pull_async(c, "emb", keys, N, D, rows, on_nested, &nd, &id), 0);
    for (double t0 = pu_now(); !atomic_load(&nd.done) && pu_now() - t0 < 10;)
        usleep(1000);
    assert_true(atomic_load(&nd.done));
    assert_int_equal(nd.rc, PC_EINVAL);
    const uint64_t nested = NESTED_KEY;
    uint8_t found = 1;
    usleep(100000); /* (a push sent anyway would be applied by now) */
    assert_int_equal(psc_lookup(c, "emb", &nested, 1, D, rows, &found), 0);
    assert_int_equal(found, 0); /* the refused push did not go */
    /* a server down for good: its address and why, once the retries are spent */
    kill(s1, SIGKILL);
    pu_reap(s1, 5);
    assert_int_equal(psc_pull_async(c, "emb", keys, N, D, rows, NULL, NULL, &id), 0);
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_EUNAVAIL);
    print_message("server down: %s\n", why);
    assert_true(strncmp(why, a1, strlen(a1)) == 0);
    assert_has(why, "connection refused");
    assert_has(why, "attempts");
    psc_close(c);
    pu_stop(s0);
    tc_rmdir(dir);
}

/* A map that names a server by a host name (libpsclient connects to IPv4 addresses): calls to
 * its slots fail with PC_EINVAL and say why, every time (they said "the server refused this
 * client at HELLO", PC_EAUTH, once the first call's retries were spent). */
static void test_map_host_name(void **state) {
    (void)state;
    char dir[256], maparg[300], tables[200], one[64], why[1024];
    tc_tmpdir(dir, sizeof dir, "dphost");
    int p0 = pu_free_port(), p1 = pu_free_port();
    snprintf(maparg, sizeof maparg,
             "--cluster-map=version=1;servers=127.0.0.1:%d,localhost:%d;slots=0-8191:0,8192-"
             "16383:1",
             p0, p1);
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {maparg, tables, NULL};
    pid_t s0 = pu_spawn(p0, dir, extra, NULL);
    psc_t *c = detail_client(p0, one, sizeof one);
    enum { N = 200 };
    uint64_t keys[N], id;
    static float rows[N * D];
    spread_keys(keys, N);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(psc_pull_async(c, "emb", keys, N, D, rows, NULL, NULL, &id), 0);
        assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_EINVAL);
        print_message("a server named by host name: %s\n", why);
        assert_has(why, "not an IPv4 host:port");
    }
    psc_close(c);
    pu_stop(s0);
    tc_rmdir(dir);
}

/* psc_claim across two servers: every server claimed, owners refused with the server's message,
 * fresh empties both, and servers whose tables differ (or lack it) are an error. */
static void test_claim(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], t0[200], t1[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpclaim");
    int p0 = pu_free_port(), p1 = pu_free_port();
    two_way_map(map, sizeof map, p0, p1, 1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(t0, sizeof t0, "--tables=%s;name=odd,dim=8", TABLE);
    snprintf(t1, sizeof t1, "--tables=%s;name=odd,dim=8,optimizer=sgd", TABLE);
    const char *e0[] = {maparg, t0, NULL}, *e1[] = {maparg, t1, NULL};
    pid_t s0 = pu_spawn(p0, dir, e0, NULL), s1 = pu_spawn(p1, dir, e1, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", p0);
    psc_t *c = connect_to(one, NULL);
    psc_claim_t cl;
    assert_int_equal(psc_claim(c, "emb", "a", PSC_CLAIM_CHECK, &cl), 0);
    assert_int_equal(cl.action, PSC_CLAIMED_NEW);
    assert_int_equal(cl.dim, D);
    assert_non_null(strstr(cl.config, "name=emb,dim=8,"));
    enum { N = 300 };
    static uint64_t keys[N];
    static float g[N * D];
    batch(1, keys, g, N);
    assert_int_equal(psc_push(c, "emb", keys, N, D, g, NULL), 0); /* both servers get keys */
    assert_int_equal(psc_claim(c, "emb", "b", PSC_CLAIM_CHECK, &cl), PC_EOWNED);
    assert_has(cl.message, "holds rows of job 'a'");
    assert_has(cl.message, "127.0.0.1:");
    assert_int_equal(psc_claim(c, "emb", "", PSC_CLAIM_INSPECT, &cl), 0);
    assert_int_equal(cl.action, PSC_CLAIMED_NONE);
    assert_string_equal(cl.previous, "a");
    assert_int_equal(cl.version, 2); /* one push call per server */
    assert_int_equal(psc_claim(c, "emb", "b", PSC_CLAIM_FRESH, &cl), 0);
    assert_int_equal(cl.action, PSC_CLAIMED_RESET);
    assert_true(cl.rows > 0);
    assert_int_equal(psc_claim(c, "emb", "", PSC_CLAIM_INSPECT, &cl), 0);
    assert_int_equal(cl.rows, 0);
    assert_int_equal(cl.version, 0);
    assert_string_equal(cl.previous, "b");
    /* the servers' "odd" tables differ; no server has "nope" */
    assert_int_equal(psc_claim(c, "odd", "a", PSC_CLAIM_CHECK, &cl), PC_ESTATE);
    assert_has(cl.message, "servers disagree on table odd");
    assert_int_equal(psc_claim(c, "nope", "a", PSC_CLAIM_CHECK, &cl), PC_ENOTFOUND);
    assert_has(cl.message, "nope");
    assert_int_equal(psc_claim(c, "emb", "", PSC_CLAIM_CHECK, &cl), PC_EINVAL); /* no job */
    psc_close(c);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

static void test_tables_health(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], t0[200], t1[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dptables");
    int p0 = pu_free_port(), p1 = pu_free_port();
    two_way_map(map, sizeof map, p0, p1, 1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(t0, sizeof t0, "--tables=%s;name=aux,dim=4", TABLE);
    snprintf(t1, sizeof t1, "--tables=%s;name=aux,dim=4,optimizer=sgd", TABLE);
    const char *e0[] = {maparg, t0, NULL}, *e1[] = {maparg, t0, NULL}, *e2[] = {maparg, t1, NULL};
    pid_t s0 = pu_spawn(p0, dir, e0, NULL), s1 = pu_spawn(p1, dir, e1, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", p0);
    psc_t *c = connect_to(one, NULL);
    char text[4096];
    size_t len = 7;
    assert_int_equal(psc_tables(c, text, sizeof text, &len), 0);
    assert_int_equal(len, strlen(text));
    assert_true(!strncmp(text, "name=aux,dim=4,", 15)); /* in name order, a line each */
    const char *second = strchr(text, '\n');
    assert_non_null(second);
    assert_true(!strncmp(second + 1, "name=emb,dim=8,shards=4,", 24));
    assert_non_null(strstr(second, ",optimizer=adagrad,"));
    assert_true(strchr(second + 1, '\n') == text + len - 1); /* two lines, the last ended */
    char small[16];
    size_t need = 0;
    assert_int_equal(psc_tables(c, small, sizeof small, &need), PC_ETOOBIG);
    assert_int_equal(need, len);
    assert_int_equal(psc_tables(c, NULL, 0, &need), PC_ETOOBIG);
    assert_int_equal(psc_tables(c, text, sizeof text, NULL), PC_EINVAL);

    psc_server_health_t h[4];
    memset(h, 0x55, sizeof h);
    assert_int_equal(psc_health(c, 2000, h, 4), 2);
    for (int i = 0; i < 2; i++) {
        char want[64];
        snprintf(want, sizeof want, "127.0.0.1:%d", i ? p1 : p0);
        assert_string_equal(h[i].addr, want);
        assert_int_equal(h[i].rc, 0);
        assert_string_equal(h[i].message, "");
        assert_true(h[i].rtt_us < 2000000);
    }
    assert_int_equal(psc_health(c, 2000, h, 1), 2); /* only the first described */
    assert_int_equal(psc_health(c, 0, h, 4), PC_EINVAL);
    /* a stopped server: no answer within the deadline; the other still answers */
    pu_stop_signal(s1);
    assert_int_equal(psc_health(c, 300, h, 4), 2);
    assert_int_equal(h[0].rc, 0);
    assert_int_equal(h[1].rc, PC_ETIMEDOUT);
    assert_has(h[1].message, "no answer within 300 ms");
    kill(s1, SIGCONT);
    /* a killed server: its connection fails; a server with other tables: PC_ESTATE */
    kill(s1, SIGKILL);
    waitpid(s1, NULL, 0);
    assert_int_equal(psc_health(c, 3000, h, 4), 2);
    assert_int_equal(h[0].rc, 0);
    assert_true(h[1].rc == PC_EUNAVAIL || h[1].rc == PC_ETIMEDOUT);
    assert_true(h[1].message[0] != '\0');
    s1 = pu_spawn(p1, dir, e2, NULL);
    assert_int_equal(psc_tables(c, text, sizeof text, &len), PC_ESTATE);
    assert_int_equal(len, 0);
    psc_close(c);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

static void test_wrong_slot_redirect(void **state) {
    (void)state;
    char dir[256], mf[300], mfarg[320], tables[200], map[256];
    tc_tmpdir(dir, sizeof dir, "dpmap");
    int p0 = pu_free_port(), p1 = pu_free_port();
    snprintf(mf, sizeof mf, "%s/map", dir);
    snprintf(map, sizeof map, "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-16383:0", p0,
             p1);
    tc_write_file(mf, map);
    snprintf(mfarg, sizeof mfarg, "--cluster-map-file=%s", mf);
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    char idx0[] = "--server-index=0", idx1[] = "--server-index=1";
    const char *e0[] = {mfarg, tables, idx0, NULL}, *e1[] = {mfarg, tables, idx1, NULL};
    pid_t s0 = pu_spawn(p0, dir, e0, NULL);
    const int m0 = pu_last_metrics_port;
    pid_t s1 = pu_spawn(p1, dir, e1, NULL);
    const int m1 = pu_last_metrics_port;
    psc_t *c = connect_to(map, NULL);
    ps_table_t *ref = tc_create(TABLE);
    enum { N = 500 };
    static uint64_t keys[N];
    static float g[N * D], x[N * D], y[N * D];
    batch(1, keys, g, N);
    assert_int_equal(psc_pull(c, "emb", keys, N, D, x), 0);
    /* Move half the slots to server 1 (the servers learn it on SIGHUP, the client does not). */
    two_way_map(map, sizeof map, p0, p1, 2);
    tc_write_file(mf, map);
    kill(s1, SIGHUP);
    kill(s0, SIGHUP);
    usleep(200000);
    for (int i = 0; i < N; i++) /* fresh keys: initial rows wherever they live */
        keys[i] = (uint64_t)(100000 + i) * 0x9E3779B97F4A7C15ULL;
    assert_int_equal(psc_pull(c, "emb", keys, N, D, x), 0);
    assert_int_equal(ps_table_pull(ref, keys, N, y, N * D), 0);
    assert_memory_equal(x, y, sizeof x);
    psc_stats_t st;
    psc_stats(c, &st);
    assert_true(st.map_refreshes >= 1);
    char text[256];
    psc_map_text(c, text, sizeof text);
    assert_non_null(strstr(text, "version=2"));
    /* A map without server 1 (server 0 owns every slot again; 1 is not told): the client's
     * connection to 1 is closed once it adopts that map (it stayed open for as long as 1 lived) */
    assert_true(metric(m1, "emberps_dataplane_connections") == 1);
    snprintf(map, sizeof map, "version=3;servers=127.0.0.1:%d;slots=0-16383:0", p0);
    tc_write_file(mf, map);
    kill(s0, SIGHUP);
    double conns1 = -1;
    for (double t0 = pu_now(); pu_now() - t0 < 10; usleep(50000)) {
        (void)psc_pull(c, "emb", keys, 1, D, x); /* a reply from server 0 says version 3 */
        psc_map_text(c, text, sizeof text);
        if (strstr(text, "version=3") &&
            (conns1 = metric(m1, "emberps_dataplane_connections")) == 0)
            break;
    }
    print_message("server 1's connections once the client took a map without it: %.0f\n", conns1);
    assert_true(conns1 == 0);
    assert_true(metric(m0, "emberps_dataplane_connections") == 1);
    assert_int_equal(psc_pull(c, "emb", keys, N, D, x), 0);
    psc_close(c);
    ps_table_destroy(ref);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

/* Deadlines: a stopped server makes calls end with PC_ETIMEDOUT on time; its late replies
 * (after SIGCONT) are discarded without touching the caller's buffers; then calls work again. */
typedef struct waiter {
    psc_t *c;
    uint64_t id;
    int rc;
} waiter_t;

static void *wait_main(void *arg) {
    waiter_t *w = arg;
    w->rc = psc_wait(w->c, w->id);
    return NULL;
}

/* psc_close while another thread waits in psc_wait for a call that cannot end (its server is
 * stopped): the waiter gets PC_ECANCELED, and the client is freed only after it left (it was
 * freed under it: ASan's heap-use-after-free). Closing from a done callback is refused. */
static atomic_int g_cb_closed = 1; /* written by the client's I/O thread */
static void close_in_callback(void *ctx, uint64_t id, int rc) {
    (void)id, (void)rc;
    psc_close(ctx); /* refused (logged): it would wait for its own thread */
    atomic_store(&g_cb_closed, 0);
}

static void test_close_with_waiter(void **state) {
    (void)state;
    char dir[256], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpcw");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, NULL};
    const int port = pu_free_port();
    const pid_t s = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one, .timeout_ms = 30000, .retries = 1};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    uint64_t keys[4] = {1, 2, 3, 4};
    float rows[4 * D];
    uint64_t cb_id;
    assert_int_equal(psc_pull_async(c, "emb", keys, 4, D, rows, close_in_callback, c, &cb_id), 0);
    for (double t0 = pu_now(); atomic_load(&g_cb_closed) && pu_now() - t0 < 10;)
        usleep(10000);
    assert_int_equal(atomic_load(&g_cb_closed), 0);
    assert_int_equal(psc_pull(c, "emb", keys, 4, D, rows), 0); /* still open */
    pu_stop_signal(s);
    waiter_t w = {.c = c};
    assert_int_equal(psc_pull_async(c, "emb", keys, 4, D, rows, NULL, NULL, &w.id), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_main, &w), 0);
    usleep(200000); /* in psc_wait by now */
    psc_close(c);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, PC_ECANCELED);
    kill(s, SIGCONT);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_deadline(void **state) {
    (void)state;
    char dir[256], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpdl");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one, .timeout_ms = 300, .retries = 1};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    enum { N = 100 };
    uint64_t keys[N];
    float *rows = malloc(N * D * sizeof(float)), *ok = malloc(N * D * sizeof(float));
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 7;
    assert_int_equal(psc_pull(c, "emb", keys, N, D, ok), 0);
    pu_stop_signal(s);
    const double t0 = pu_now();
    uint64_t id;
    char why[512];
    assert_int_equal(psc_pull_async(c, "emb", keys, N, D, rows, NULL, NULL, &id), 0);
    assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_ETIMEDOUT);
    const double took = pu_now() - t0;
    print_message("stopped server: %s\n", why);
    assert_non_null(strstr(why, "timed out after 300 ms; no answer from "));
    assert_non_null(strstr(why, one)); /* the server that did not answer */
    assert_true(took >= 0.25 && took < 3.0);
    free(rows); /* the late reply must not be written here */
    kill(s, SIGCONT);
    usleep(100000);
    float again[N * D];
    assert_int_equal(psc_pull(c, "emb", keys, N, D, again), 0);
    assert_memory_equal(again, ok, sizeof again);
    psc_stats_t st;
    psc_stats(c, &st);
    assert_true(st.timeouts >= 1);
    free(ok);
    psc_close(c);
    pu_stop(s);
    tc_rmdir(dir);
}

static size_t count_ckpts(const char *dir) {
    ps_ckpt_entry_t e[8];
    size_t n = 0;
    return ps_ckpt_list(dir, e, 8, &n) == 0 ? n : 0;
}

static void test_kill_and_restart(void **state) {
    (void)state;
    char dir[256], ck[300], ckarg[320], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpkill");
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s", ck);
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {ckarg, tables, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one, NULL);
    ps_table_t *ref = tc_create(TABLE);
    enum { N = 400 };
    static uint64_t keys[N];
    static float g[N * D], x[N * D], y[N * D];
    for (int i = 0; i < 10; i++) {
        batch(i, keys, g, N);
        assert_int_equal(psc_push(c, "emb", keys, N, D, g, NULL), 0);
        assert_int_equal(ps_table_push(ref, keys, N, g, N * D, NULL), 0);
    }
    kill(s, SIGUSR1); /* checkpoint now */
    for (double t0 = pu_now(); count_ckpts(ck) == 0 && pu_now() - t0 < 10;)
        usleep(10000);
    assert_int_equal(count_ckpts(ck), 1);
    kill(s, SIGKILL);
    pu_reap(s, 5);
    s = pu_spawn(port, dir, extra, NULL); /* restores the checkpoint */
    batch(3, keys, g, N);
    assert_int_equal(psc_pull(c, "emb", keys, N, D, x), 0); /* the client reconnects */
    assert_int_equal(ps_table_pull(ref, keys, N, y, N * D), 0);
    assert_memory_equal(x, y, sizeof x);
    psc_stats_t st;
    psc_stats(c, &st);
    assert_true(st.reconnects >= 1 || st.retries >= 1);
    /* SIGTERM: exit 0 with a final checkpoint. */
    assert_int_equal(psc_push(c, "emb", keys, N, D, g, NULL), 0);
    pu_stop(s);
    assert_int_equal(count_ckpts(ck), 2);
    psc_close(c);
    ps_table_destroy(ref);
    tc_rmdir(dir);
}

/* ---- raw frames ---- */

/* Receive one reply; its status (body discarded), or 1 when the connection closed. want_id
 * UINT64_MAX: any id. */
static int recv_reply(int fd, uint64_t want_id) {
    uint8_t h[PC_WIRE_HDR];
    size_t got = 0;
    while (got < sizeof h) {
        ssize_t r = recv(fd, h + got, sizeof h - got, 0);
        if (r <= 0)
            return 1;
        got += (size_t)r;
    }
    pc_wire_hdr_t hd;
    assert_int_equal(pc_wire_hdr_decode(h, 1u << 30, &hd), 0);
    assert_true(hd.flags & PC_WIRE_RESPONSE);
    if (want_id != UINT64_MAX)
        assert_int_equal(hd.id, want_id);
    for (uint32_t left = hd.body_len; left;) {
        char buf[4096];
        ssize_t r = recv(fd, buf, left < sizeof buf ? left : sizeof buf, 0);
        if (r <= 0)
            return 1;
        left -= (uint32_t)r;
    }
    return hd.status;
}

/* recv_reply, also giving the body as text (an error's message) in msg. */
static int recv_reply_msg(int fd, uint64_t want_id, char *msg, size_t cap) {
    uint8_t h[PC_WIRE_HDR];
    size_t got = 0;
    msg[0] = '\0';
    while (got < sizeof h) {
        ssize_t r = recv(fd, h + got, sizeof h - got, 0);
        if (r <= 0)
            return 1;
        got += (size_t)r;
    }
    pc_wire_hdr_t hd;
    assert_int_equal(pc_wire_hdr_decode(h, 1u << 30, &hd), 0);
    assert_int_equal(hd.id, want_id);
    size_t kept = 0;
    for (uint32_t left = hd.body_len; left;) {
        char buf[4096];
        ssize_t r = recv(fd, buf, left < sizeof buf ? left : sizeof buf, 0);
        if (r <= 0)
            return 1;
        size_t take = kept + (size_t)r < cap - 1 ? (size_t)r : cap - 1 - kept;
        memcpy(msg + kept, buf, take);
        kept += take;
        left -= (uint32_t)r;
    }
    msg[kept] = '\0';
    return hd.status;
}

/* A batch body for `name` with n keys of dim (push: zero gradients, or NaN when nan). */
static uint32_t batch_body(uint8_t op, const char *name, uint32_t n, uint32_t dim, bool nan,
                           uint8_t *out) {
    size_t hl = pc_wire_batch_head_encode(name, n, dim, out);
    uint64_t *k = (uint64_t *)(void *)(out + hl);
    for (uint32_t i = 0; i < n; i++)
        k[i] = i * 7919;
    size_t len = hl + (size_t)n * 8;
    if (op == PC_OP_PUSH) {
        float *g = (float *)(void *)(out + len);
        for (uint32_t i = 0; i < n * dim; i++)
            g[i] = nan ? NAN : 0.0f;
        len += (size_t)n * dim * 4;
    }
    return (uint32_t)len;
}

static void test_bad_input(void **state) {
    (void)state;
    char dir[256], tables[200];
    tc_tmpdir(dir, sizeof dir, "dpbad");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    char lim[] = "--max-body-bytes=65536", keys[] = "--max-batch-keys=1000";
    const char *extra[] = {tables, lim, keys, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    static uint8_t body[200000];
    /* Not a frame: an error, then the server closes. */
    int fd = raw_connect(port);
    send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0", 32);
    assert_int_equal(recv_reply(fd, UINT64_MAX), PC_EPARSE);
    char b;
    assert_true(recv(fd, &b, 1, 0) <= 0);
    close(fd);
    /* Oversized body: PC_ETOOBIG, the body is skipped, the connection goes on. */
    fd = raw_connect(port);
    send_frame(fd, PC_OP_PING, 1, body, 100000);
    assert_int_equal(recv_reply(fd, 1), PC_ETOOBIG);
    send_frame(fd, PC_OP_PING, 2, NULL, 0);
    assert_int_equal(recv_reply(fd, 2), 0);
    /* Malformed batch (name length 0): PC_EINVAL, connection lives. */
    memset(body, 0, 64);
    send_frame(fd, PC_OP_PULL, 3, body, 24);
    assert_int_equal(recv_reply(fd, 3), PC_EINVAL);
    /* Length that does not match n: PC_EINVAL. */
    uint32_t len = batch_body(PC_OP_PULL, "emb", 10, D, false, body);
    send_frame(fd, PC_OP_PULL, 4, body, len - 8);
    assert_int_equal(recv_reply(fd, 4), PC_EINVAL);
    /* Unknown table, wrong dim, too many keys. */
    len = batch_body(PC_OP_PULL, "missing", 10, D, false, body);
    send_frame(fd, PC_OP_PULL, 5, body, len);
    assert_int_equal(recv_reply(fd, 5), PC_ENOTFOUND);
    len = batch_body(PC_OP_PULL, "emb", 10, 3, false, body);
    send_frame(fd, PC_OP_PULL, 6, body, len);
    assert_int_equal(recv_reply(fd, 6), PC_EDIM);
    len = batch_body(PC_OP_PULL, "emb", 2000, D, false, body);
    send_frame(fd, PC_OP_PULL, 7, body, len);
    assert_int_equal(recv_reply(fd, 7), PC_ETOOBIG);
    send_frame(fd, PC_OP_PING, 8, NULL, 0);
    assert_int_equal(recv_reply(fd, 8), 0);
    close(fd);
    /* NaN gradients: skipped and counted; rows unchanged. */
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one, NULL);
    uint64_t k[4] = {1, 2, 3, 4};
    float before[4 * D], after[4 * D], g[4 * D];
    for (int i = 0; i < 4 * D; i++)
        g[i] = NAN;
    assert_int_equal(psc_pull(c, "emb", k, 4, D, before), 0);
    psc_push_result_t r;
    assert_int_equal(psc_push(c, "emb", k, 4, D, g, &r), 0);
    assert_int_equal(r.skipped_nonfinite, 4);
    assert_int_equal(r.applied, 0);
    assert_int_equal(psc_pull(c, "emb", k, 4, D, after), 0);
    assert_memory_equal(before, after, sizeof before);
    /* A push whose body would pass 4 GiB (1Mi keys at dim 1024): refused before anything is
     * sent or read (its length was cut to 32 bits: the server parsed gradients as frames) */
    assert_int_equal(psc_push(c, "emb", k, 1u << 20, 1024, g, &r), PC_ETOOBIG);
    assert_int_equal(psc_pull(c, "emb", k, 4, D, after), 0); /* the connection is fine */
    psc_close(c);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_token(void **state) {
    (void)state;
    char dir[256], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dptok");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    char tok[] = "--token=s3cret";
    const char *extra[] = {tables, tok, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one, .timeout_ms = 3000};
    psc_t *c = NULL;
    assert_int_equal(psc_connect(&o, &c), PC_EAUTH);
    o.token = "wrong";
    assert_int_equal(psc_connect(&o, &c), PC_EAUTH);
    c = connect_to(one, "s3cret");
    uint64_t k = 42;
    float row[D];
    assert_int_equal(psc_pull(c, "emb", &k, 1, D, row), 0);
    psc_close(c);
    /* A raw connection that skips HELLO is refused and closed. */
    int fd = raw_connect(port);
    static uint8_t body[256];
    uint32_t len = batch_body(PC_OP_PULL, "emb", 1, D, false, body);
    send_frame(fd, PC_OP_PULL, 9, body, len);
    assert_int_equal(recv_reply(fd, 9), PC_EAUTH);
    char b;
    assert_true(recv(fd, &b, 1, 0) <= 0);
    close(fd);
    /* Nor is a body held before the token: the header of a 16 MiB PULL (under the body limit)
     * or HELLO is refused at once, not after its body (which never comes); nor skipped: one
     * over the limit (4 GiB) too, rather than answered PC_ETOOBIG with the connection kept
     * to send more. */
    for (uint8_t op = 0; op < 3; op++) {
        fd = raw_connect(port);
        uint8_t h[PC_WIRE_HDR];
        pc_wire_hdr_t hd = {.op = op == 1 ? PC_OP_HELLO : PC_OP_PULL,
                            .id = 10,
                            .body_len = op == 2 ? UINT32_MAX : 16u << 20};
        pc_wire_hdr_encode(&hd, h);
        send_all(fd, h, sizeof h);
        assert_int_equal(recv_reply(fd, 10), PC_EAUTH);
        assert_true(recv(fd, &b, 1, 0) <= 0);
        close(fd);
    }
    pu_stop(s);
    /* A non-loopback address without a token is refused at start (exit status 2). */
    pid_t p = fork();
    if (p == 0) {
        execl(pu_bin, pu_bin, "--host=0.0.0.0", "--port=0", "--log-level=error", (char *)NULL);
        _exit(127);
    }
    assert_int_equal(pu_reap(p, 10), 2);
    tc_rmdir(dir);
}

/* A ps-server started on the data-plane or gRPC port of a running one exits with an error; the
 * first one keeps every connection (before, SO_REUSEPORT let the second bind the port and take
 * part of them: two tests' servers that drew the same free port answered each other's
 * clients). */
static void test_port_in_use(void **state) {
    (void)state;
    char dir[256], tables[200], one[64], port_arg[32], grpc_arg[32];
    tc_tmpdir(dir, sizeof dir, "dpport");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, NULL};
    const int port = pu_free_port();
    int grpc = 0;
    const pid_t s = pu_spawn(port, dir, extra, &grpc);
    const int ports[2][2] = {{port, pu_free_port()}, {pu_free_port(), grpc}};
    for (int k = 0; k < 2; k++) {
        snprintf(port_arg, sizeof port_arg, "--port=%d", ports[k][0]);
        snprintf(grpc_arg, sizeof grpc_arg, "--grpc-port=%d", ports[k][1]);
        const pid_t p = fork();
        if (p == 0) {
            execl(pu_bin, pu_bin, port_arg, grpc_arg, "--metrics-port=-1", tables,
                  "--log-level=error", (char *)NULL);
            _exit(127);
        }
        const int st = pu_reap(p, 10);
        print_message("a second server on the %s port %d: exit status %d\n",
                      k ? "gRPC" : "data-plane", k ? grpc : port, st);
        assert_true(st > 0 && st < 127); /* exited by itself with an error */
    }
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    for (int i = 0; i < 20; i++) { /* new connections all reach the first server */
        psc_t *c = connect_to(one, NULL);
        uint64_t k = 42;
        float row[D];
        assert_int_equal(psc_pull(c, "emb", &k, 1, D, row), 0);
        psc_close(c);
    }
    pu_stop(s);
    tc_rmdir(dir);
}

/* Out of memory at every allocation of the client (libpsclient counts its memory under the
 * client tag, so pc_mem_fail_after reaches it; the server is another process): connect, pull and
 * lookup with the i-th allocation failing, i = 0, 1, ... until a round reaches no failure. Every
 * call returns 0 or PC_ENOMEM, rows that arrive are the right ones, and after psc_close the
 * client holds no memory. */
static void test_client_oom(void **state) {
    (void)state;
    char dir[256], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpoom");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one, .timeout_ms = 5000};
    enum { N = 64 };
    uint64_t keys[N];
    float want[N * D], rows[N * D];
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 13 + 1;
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    assert_int_equal(psc_pull(c, "emb", keys, N, D, want), 0); /* rows exist from here on */
    psc_close(c);
    const uint64_t base = pc_mem_used(PC_MEM_CLIENT);
    int i = 0, enomem = 0;
    for (; i < 5000; i++) {
        pc_mem_fail_after(i);
        c = NULL;
        int rc = psc_connect(&o, &c), prc = 0, lrc = 0;
        if (!rc) {
            memset(rows, 0, sizeof rows);
            prc = psc_pull(c, "emb", keys, N, D, rows);
            if (!prc)
                assert_memory_equal(rows, want, sizeof rows);
            memset(rows, 0, sizeof rows);
            lrc = psc_lookup(c, "emb", keys, N, D, rows, NULL);
            if (!lrc)
                assert_memory_equal(rows, want, sizeof rows);
        }
        const bool reached = pc_mem_fail_remaining() == 0;
        pc_mem_fail_after(-1);
        if ((rc && rc != PC_ENOMEM) || (prc && prc != PC_ENOMEM) || (lrc && lrc != PC_ENOMEM))
            fail_msg("allocation %d failing: connect %s, pull %s, lookup %s", i, pc_err_name(rc),
                     pc_err_name(prc), pc_err_name(lrc));
        enomem += rc == PC_ENOMEM || prc == PC_ENOMEM || lrc == PC_ENOMEM;
        psc_close(c);
        assert_true(pc_mem_used(PC_MEM_CLIENT) == base);
        if (!reached) {
            assert_true(!rc && !prc && !lrc);
            break;
        }
    }
    print_message("client: %d allocation points replayed, %d rounds ended in PC_ENOMEM\n", i,
                  enomem);
    assert_true(i > 10 && i < 5000 && enomem > 0);
    pu_stop(s);
    tc_rmdir(dir);
}

/* How much the server's peak RSS may grow in test_reply_limit: about 70 MiB in a Release build;
 * sanitizer builds keep shadow memory beside every byte (about 320 MiB under TSan), yet a 1 GiB
 * reply built would still exceed their bound. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define HWM_GROWTH_KB (1024L * 1024)
#else
#define HWM_GROWTH_KB (256L * 1024)
#endif

/* A reply over max_reply_bytes (64 MiB by default) is refused before it is built: a lookup of
 * 262144 keys of a dim-1024 table would be 1 GiB. */
static void test_reply_limit(void **state) {
    (void)state;
    char dir[256], tables[200], one[64], msg[PC_WIRE_MSG_MAX + 1];
    tc_tmpdir(dir, sizeof dir, "dpreply");
    snprintf(tables, sizeof tables, "--tables=name=big,dim=1024,shards=4");
    const char *extra[] = {tables, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    const long hwm0 = tu_proc_kb(s, "VmHWM:");
    enum { N = 262144, DIM = 1024 };
    const size_t body_cap = 64 + (size_t)N * 8;
    uint8_t *body = malloc(body_cap);
    /* Raw frames: the status, the message naming the sizes, the connection lives. */
    int fd = raw_connect(port);
    double t0 = pu_now();
    uint32_t len = batch_body(PC_OP_LOOKUP, "big", N, DIM, false, body);
    send_frame(fd, PC_OP_LOOKUP, 1, body, len);
    assert_int_equal(recv_reply_msg(fd, 1, msg, sizeof msg), PC_ETOOBIG);
    print_message("LOOKUP: %s\n", msg);
    assert_non_null(
        strstr(msg, "lookup of 262144 rows x dim 1024 = 1 GiB over the reply limit of 64 MiB"));
    len = batch_body(PC_OP_PULL, "big", N, DIM, false, body);
    send_frame(fd, PC_OP_PULL, 2, body, len);
    assert_int_equal(recv_reply_msg(fd, 2, msg, sizeof msg), PC_ETOOBIG);
    assert_non_null(
        strstr(msg, "pull of 262144 rows x dim 1024 = 1 GiB over the reply limit of 64 MiB"));
    send_frame(fd, PC_OP_PING, 3, NULL, 0);
    assert_int_equal(recv_reply(fd, 3), 0);
    close(fd);
    assert_true(pu_now() - t0 < 10); /* refused, not computed */
    /* libpsclient: PC_ETOOBIG, and not a byte written into the caller's rows (they are mapped
     * without access: a write would crash). */
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one, NULL);
    uint64_t *keys = malloc((size_t)N * sizeof *keys);
    for (uint32_t i = 0; i < N; i++)
        keys[i] = i * 7919u;
    const size_t rows_len = (size_t)N * DIM * sizeof(float);
    float *rows =
        mmap(NULL, rows_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(rows != MAP_FAILED);
    t0 = pu_now();
    assert_int_equal(psc_pull(c, "big", keys, N, DIM, rows), PC_ETOOBIG);
#if PSC_VERSION_MINOR >= 2 /* psc_wait_detail: the server's message reaches the caller */
    uint64_t id;
    assert_int_equal(psc_lookup_async(c, "big", keys, N, DIM, rows, NULL, NULL, NULL, &id), 0);
    assert_int_equal(psc_wait_detail(c, id, msg, sizeof msg), PC_ETOOBIG);
    print_message("psc_lookup: %s\n", msg);
    assert_non_null(
        strstr(msg, "lookup of 262144 rows x dim 1024 = 1 GiB over the reply limit of 64 MiB"));
#else
    assert_int_equal(psc_lookup(c, "big", keys, N, DIM, rows, NULL), PC_ETOOBIG);
#endif
    assert_true(pu_now() - t0 < 10);
    /* Within the limit it works: 16384 rows x dim 1024 = 64 MiB + 16 KiB found > 64 MiB, so
     * 16000 rows. */
    float *ok = malloc((size_t)16000 * DIM * sizeof(float));
    assert_int_equal(psc_lookup(c, "big", keys, 16000, DIM, ok, NULL), 0);
    free(ok);
    psc_close(c);
    munmap(rows, rows_len);
    const long hwm1 = tu_proc_kb(s, "VmHWM:");
    print_message("server peak RSS %ld -> %ld KiB\n", hwm0, hwm1);
    assert_true(hwm0 > 0 && hwm1 - hwm0 < HWM_GROWTH_KB); /* 1 GiB replies were never built */
    free(keys);
    free(body);
    pu_stop(s);
    tc_rmdir(dir);
}

/* Open a connection that sends `count` LOOKUPs of n keys of dim and never reads; a small
 * receive buffer keeps the kernel from taking the replies off the server's hands. */
static int flood(int port, int count, uint32_t n, uint32_t dim, uint64_t id0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 16 << 10;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    static uint8_t body[64 + 8 * 4096];
    assert_true(n <= 4096);
    const uint32_t len = batch_body(PC_OP_LOOKUP, "wide", n, dim, false, body);
    uint8_t h[PC_WIRE_HDR];
    for (int i = 0; i < count; i++) {
        pc_wire_hdr_t hd = {.op = PC_OP_LOOKUP, .id = id0 + (uint64_t)i, .body_len = len};
        pc_wire_hdr_encode(&hd, h);
        /* Blocking sends with a timeout: the server stops reading once its caps are reached. */
        struct timeval tv = {0, 200000};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
            send(fd, body, len, MSG_NOSIGNAL) != (ssize_t)len)
            break;
    }
    return fd;
}

/* Clients that send lookups and never read their replies (1 MiB each): the server's unsent
 * bytes stay under its caps. 2 MiB per connection, 8 MiB in all; 2 event loops. */
static void test_unsent_bounded(void **state) {
    (void)state;
    char dir[256], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpunsent");
    snprintf(tables, sizeof tables, "--tables=name=wide,dim=256,shards=4");
    char q[] = "--reply-queue-bytes=2Mi", qt[] = "--reply-queue-total-bytes=8Mi";
    const char *extra[] = {tables, q, qt, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    const int mp = pu_last_metrics_port;
    enum { DIM = 256, N = 1024, LOOPS = 2, FIRST = 3, MORE = 9 };
    const double reply = (double)N * DIM * 4 + N, reply_alloc = reply + 4096; /* one reply */
    const double conn_cap = 2 << 20, total_cap = 8 << 20;
    const long rss0 = tu_proc_kb(s, "VmRSS:");
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one, NULL);
    uint64_t keys[64];
    float rows[64 * DIM];
    for (int i = 0; i < 64; i++)
        keys[i] = (uint64_t)i * 31 + 5;
    /* A few non-readers: each stops at its own cap; together under the server's. */
    int fds[FIRST + MORE];
    for (int i = 0; i < FIRST; i++)
        fds[i] = flood(port, 40, N, DIM, 1000u * (uint64_t)i);
    /* Each stops once it has its cap unsent; the kernel's socket buffers take some replies off
     * its hands first, so it rests with at least one reply queued (it goes on at half the cap). */
    double paused = 0;
    for (double t0 = pu_now(); pu_now() - t0 < 5 && paused < FIRST; usleep(20000))
        paused = metric(mp, "emberps_dataplane_paused_connections");
    const double queued = metric(mp, "emberps_dataplane_reply_queue_bytes");
    print_message("%d non-readers: %.1f MiB unsent, %g paused\n", FIRST, queued / (1 << 20),
                  paused);
    assert_true(paused >= FIRST);
    assert_true(queued >= FIRST * reply);                    /* they did queue replies */
    assert_true(queued <= FIRST * (conn_cap + reply_alloc)); /* and no more than their caps */
    for (int k = 0; k < 20; k++) /* a client that reads is served meanwhile */
        assert_int_equal(psc_pull(c, "wide", keys, 64, DIM, rows), 0);
    /* Enough more to exceed the server-wide cap: the total stays bounded. */
    for (int i = FIRST; i < FIRST + MORE; i++)
        fds[i] = flood(port, 40, N, DIM, 1000u * (uint64_t)i);
    usleep(500000);
    const double peak = metric(mp, "emberps_dataplane_reply_queue_peak_bytes");
    const long rss1 = tu_proc_kb(s, "VmRSS:");
    print_message("%d non-readers: peak %.1f MiB unsent (cap %.0f MiB), RSS %ld -> %ld KiB\n",
                  FIRST + MORE, peak / (1 << 20), total_cap / (1 << 20), rss0, rss1);
    assert_true(peak >= total_cap);
    assert_true(peak <= total_cap * 9 / 8 + LOOPS * reply_alloc);
    assert_true(rss1 - rss0 < 96 * 1024); /* before the caps: ~64 MiB per connection */
    /* They go: their replies are dropped, the queue empties, clients are served. */
    for (int i = 0; i < FIRST + MORE; i++)
        close(fds[i]);
    double left = -1;
    for (double t0 = pu_now(); pu_now() - t0 < 5 && left != 0; usleep(20000))
        left = metric(mp, "emberps_dataplane_reply_queue_bytes");
    assert_true(left == 0);
    assert_true(metric(mp, "emberps_dataplane_paused_connections") == 0);
    /* Written replies wait for reuse, a bounded amount per loop (ps_dataplane.c POOL_KEEP). */
    const double pooled = metric(mp, "emberps_dataplane_reply_pool_bytes");
    print_message("reply pool: %.1f MiB idle\n", pooled / (1 << 20));
    assert_true(pooled > 0 && pooled <= LOOPS * 16.0 * (1 << 20));
    assert_int_equal(psc_pull(c, "wide", keys, 64, DIM, rows), 0);
    psc_close(c);
    pu_stop(s);
    tc_rmdir(dir);
}

/* A client that never reads its replies does not hold a stopping server: SIGTERM ends it (exit
 * 0, after its exit steps) once the stop's flush deadline (5 s) closed that connection. Before,
 * the connection's shutdown waited for the peer to read, the loop with it, forever. */
static void test_stop_with_nonreader(void **state) {
    (void)state;
    char dir[256], tables[200];
    tc_tmpdir(dir, sizeof dir, "dpstop");
    snprintf(tables, sizeof tables, "--tables=name=wide,dim=256,shards=4");
    const char *extra[] = {tables, NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    const int mp = pu_last_metrics_port;
    const int fd = flood(port, 40, 1024, 256, 0);
    double queued = 0;
    for (double t0 = pu_now(); pu_now() - t0 < 5 && queued < (8 << 20); usleep(20000))
        queued = metric(mp, "emberps_dataplane_reply_queue_bytes");
    assert_true(queued >= 8 << 20); /* replies wait for it */
    const double t0 = pu_now();
    kill(s, SIGTERM);
    const int st = pu_reap(s, 20);
    print_message("stopped in %.1f s with a non-reader's replies unsent: exit %d\n", pu_now() - t0,
                  st);
    assert_int_equal(st, 0);
    close(fd);
    tc_rmdir(dir);
}

/* A map that lists a server with no role (as a failover leaves the dead server listed; here
 * one that never ran): a client connects to the others, and the cluster calls (tables, claim)
 * and the keyed ones work, and health says it is down; so does a client given an older map in
 * which the dead server still had slots. Before, the connect failed on it (a worker restarted
 * after a failover could not join), and so did every tables call. */
static void test_roleless_dead_server(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], tables[200];
    tc_tmpdir(dir, sizeof dir, "dproleless");
    const int p0 = pu_free_port(), dead = pu_free_port();
    snprintf(map, sizeof map, "version=2;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-16383:0", p0,
             dead);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *e0[] = {maparg, tables, "--server-index=0", NULL};
    pid_t s0 = pu_spawn(p0, dir, e0, NULL);
    psc_t *c = connect_to(map, NULL); /* (asserts the connect) */
    char text[4096];
    size_t len = 0;
    assert_int_equal(psc_tables(c, text, sizeof text, &len), 0);
    assert_true(!strncmp(text, "name=emb,dim=8,", 15));
    psc_claim_t cl;
    assert_int_equal(psc_claim(c, "emb", "job", PSC_CLAIM_CHECK, &cl), 0);
    enum { N = 64 };
    uint64_t keys[N];
    static float g[N * D], rows[N * D];
    batch(7, keys, g, N);
    assert_int_equal(psc_push(c, "emb", keys, N, D, g, NULL), 0);
    assert_int_equal(psc_pull(c, "emb", keys, N, D, rows), 0);
    psc_server_health_t h[2];
    assert_int_equal(psc_health(c, 1000, h, 2), 2);
    assert_int_equal(h[0].rc, 0);
    assert_true(h[1].rc != 0); /* the server with no role: asked, and down */
    psc_close(c);
    /* The map a job was started with (version 1: the dead server had slots then), as the
     * container entrypoint gives every worker: the live server answers with version 2, in which
     * the dead one has no role, so its refused connection is no error (it failed the connect) */
    char old[256];
    snprintf(old, sizeof old,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", p0, dead);
    c = connect_to(old, NULL);
    assert_int_equal(psc_pull(c, "emb", keys, N, D, g), 0); /* every key to the live server */
    assert_memory_equal(g, rows, sizeof rows);
    psc_close(c);
    pu_stop(s0);
    tc_rmdir(dir);
}

/* ---- dead peers ---- */

static int g_home_ns = -1; /* the test's network namespace while test_dead_peer runs in another */

/* Loopback of this thread's network namespace up, or down: then its packets vanish with no
 * error to anyone, as on a cut that drops them. 0 or -1. */
static int lo_set(bool up) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq r;
    memset(&r, 0, sizeof r);
    snprintf(r.ifr_name, IFNAMSIZ, "lo");
    int rc = fd < 0 ? -1 : ioctl(fd, SIOCGIFFLAGS, &r);
    if (!rc) {
        r.ifr_flags = (short)(up ? r.ifr_flags | IFF_UP : r.ifr_flags & ~IFF_UP);
        rc = ioctl(fd, SIOCSIFFLAGS, &r);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Back to the test's own namespace (also after a failed assertion: the tests after it run
 * there). */
static int leave_ns(void **state) {
    (void)state;
    if (g_home_ns >= 0) {
        if (setns(g_home_ns, CLONE_NEWNET) != 0)
            fprintf(stderr, "cannot return to the test's network namespace: %s\n", strerror(errno));
        close(g_home_ns);
        g_home_ns = -1;
    }
    return 0;
}

/* frame_timeout_ms: a connection that sends part of a request (a header and part of a large
 * body, or part of a header) and then nothing is closed after it, with the buffer it held (an
 * admitted peer stopped mid-body held up to max_body for ever); an idle connection between
 * requests stays open, and so does a working client's. */
static void test_frame_deadline(void **state) {
    (void)state;
    char dir[256], tables[200];
    tc_tmpdir(dir, sizeof dir, "dpframe");
    snprintf(tables, sizeof tables, "--tables=%s;name=big,dim=256", TABLE);
    const char *extra[] = {tables, "--frame-timeout-ms=500", NULL};
    const int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    int body = raw_connect(port), head = raw_connect(port), idle = raw_connect(port);
    uint8_t h[PC_WIRE_HDR];
    pc_wire_hdr_t hd = {.op = PC_OP_PUSH, .id = 1, .body_len = 1u << 20}; /* 1 MiB announced */
    pc_wire_hdr_encode(&hd, h);
    static uint8_t part[100 << 10]; /* past the staging buffer: the body's own buffer holds it */
    send_all(body, h, sizeof h);
    send_all(body, part, sizeof part);
    send_all(head, h, 10); /* part of a header */
    const double b = raw_closed_after(body, 6), d = raw_closed_after(head, 6);
    const double i = raw_closed_after(idle, 1.5);
    /* a half-close after pipelined requests: every reply still comes (the ones not yet written
     * when the end was read were dropped) */
    const int half = raw_connect(port);
    static uint8_t pb[64 << 10];
    const uint32_t plen = batch_body(PC_OP_PULL, "big", 1000, 256, false, pb);
    enum { NP = 48 }; /* 48 MiB of replies, more than the sockets hold: some wait in the server */
    for (int k = 0; k < NP; k++)
        send_frame(half, PC_OP_PULL, 100 + (uint64_t)k, pb, plen);
    assert_int_equal(shutdown(half, SHUT_WR), 0);
    int answered = 0;
    for (int k = 0; k < NP && recv_reply(half, 100 + (uint64_t)k) == 0; k++)
        answered++;
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    uint64_t keys[2] = {1, 2};
    float rows[2 * D];
    assert_int_equal(psc_pull(c, "emb", keys, 2, D, rows), 0);
    print_message("closed after %.2f s (part of a body), %.2f s (part of a header); idle: %s; "
                  "%d of %d pulls answered after a half-close\n",
                  b, d, i < 0 ? "open" : "closed", answered, NP);
    assert_true(b > 0 && d > 0);
    assert_true(i < 0);
    assert_int_equal(answered, NP);
    close(half);
    psc_close(c);
    close(body);
    close(head);
    close(idle);
    pu_stop(s);
    tc_rmdir(dir);
}

/* Generation fences on two servers: job a fences its table at epoch 5 through one client (psc_fence
 * reaches both servers), and a second client of a, fenced at 3 (a worker the group left behind;
 * its fence does not lower the table's), has its pushes refused with PC_EFENCED on both, its rows
 * untouched; the first client's pushes (epoch 5) and a client that never fenced (no epoch) are
 * taken; a fence by another job is refused and leaves that client unfenced. A raw push of a lower
 * epoch is refused the same way, and a pull that carries an epoch is malformed. After a restart
 * from its checkpoint, the server still refuses epoch 3 (the fence is in the manifest). */
static void test_fence(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], one[64], ck[300];
    tc_tmpdir(dir, sizeof dir, "dpfence");
    int p0 = pu_free_port(), p1 = pu_free_port();
    two_way_map(map, sizeof map, p0, p1, 1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(ck, sizeof ck, "--ckpt-dir=%s/ck0", dir);
    char tables[200];
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *e0[] = {maparg, tables, ck, NULL}, *e1[] = {maparg, tables, NULL};
    pid_t s0 = pu_spawn(p0, dir, e0, NULL), s1 = pu_spawn(p1, dir, e1, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", p0);
    psc_t *now = connect_to(one, NULL), *old = connect_to(one, NULL),
          *plain = connect_to(one, NULL);
    psc_claim_t cl;
    assert_int_equal(psc_claim(now, "emb", "a", PSC_CLAIM_CHECK, &cl), 0);
    assert_int_equal(psc_fence(old, "emb", "a", 3, &cl), 0);
    assert_int_equal(psc_fence(now, "emb", "a", 5, &cl), 0);
    assert_int_equal(psc_fence(plain, "emb", "b", 9, &cl), PC_EOWNED); /* not b's table */
    assert_has(cl.message, "holds rows of job 'a'");
    assert_int_equal(psc_fence(plain, "emb", "a", 0, &cl), PC_EINVAL);
    enum { N = 300 };
    static uint64_t keys[N];
    static float g[N * D], before[N * D], after[N * D];
    batch(1, keys, g, N);
    assert_int_equal(psc_pull(plain, "emb", keys, N, D, before), 0);
    assert_int_equal(psc_push(old, "emb", keys, N, D, g, NULL), PC_EFENCED);
    assert_int_equal(psc_pull(plain, "emb", keys, N, D, after), 0);
    assert_memory_equal(before, after, sizeof before); /* nothing of it applied, on either */
    assert_int_equal(psc_push(now, "emb", keys, N, D, g, NULL), 0);
    assert_int_equal(psc_push(plain, "emb", keys, N, D, g, NULL), 0); /* (no epoch: never) */
    /* raw frames: a push of epoch 4 refused, 5 taken; a pull carrying an epoch is malformed */
    static uint8_t body[64 << 10];
    const uint32_t plen = batch_body(PC_OP_PUSH, "emb", 1, D, false, body);
    pc_wire_batch_set_epoch(body, 4);
    char msg[256];
    int fd = raw_connect(p0), rc = PC_EWRONGSLOT;
    send_frame(fd, PC_OP_PUSH, 1, body, plen);
    if ((rc = recv_reply_msg(fd, 1, msg, sizeof msg)) == PC_EWRONGSLOT) { /* the key's server */
        close(fd);
        fd = raw_connect(p1);
        send_frame(fd, PC_OP_PUSH, 1, body, plen);
        rc = recv_reply_msg(fd, 1, msg, sizeof msg);
    }
    assert_int_equal(rc, PC_EFENCED);
    assert_has(msg, "fenced at generation epoch 5");
    pc_wire_batch_set_epoch(body, 5);
    send_frame(fd, PC_OP_PUSH, 2, body, plen);
    assert_int_equal(recv_reply(fd, 2), 0);
    const uint32_t qlen = batch_body(PC_OP_PULL, "emb", 1, D, false, body);
    pc_wire_batch_set_epoch(body, 5);
    send_frame(fd, PC_OP_PULL, 3, body, qlen);
    assert_int_equal(recv_reply(fd, 3), PC_EINVAL);
    close(fd);
    /* the fence survives a restart from the checkpoint (written on exit) */
    psc_close(old);
    pu_stop(s0);
    s0 = pu_spawn(p0, dir, e0, NULL);
    old = connect_to(one, NULL);
    assert_int_equal(psc_fence(old, "emb", "a", 3, &cl), PC_EFENCED); /* below its fence, 5 */
    assert_has(cl.message, "fenced at generation epoch 5");
    psc_close(old);
    psc_close(now);
    psc_close(plain);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

/* Large bodies share one budget (--body-total-bytes): while one connection holds a 1 MB push
 * body read in part, a second connection's 260 KB push waits unread (counted as a wait) and is
 * executed once the first completes; before the budget, every connection got its body's buffer at
 * once (many connections announcing max_body made the server allocate them all). And a body that
 * trickles in, a byte every 100 ms, is closed at frame_ms plus 1 ms per KiB from its header on,
 * though no gap reaches frame_ms (before, each byte renewed the deadline for ever). */
static void test_body_budget(void **state) {
    (void)state;
    char dir[256], tables[200];
    tc_tmpdir(dir, sizeof dir, "dpbody");
    snprintf(tables, sizeof tables, "--tables=%s;name=big,dim=256", TABLE);
    const char *extra[] = {tables, "--body-total-bytes=64Ki", "--frame-timeout-ms=2000", NULL};
    const int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    const int mport = pu_last_metrics_port;
    static uint8_t big[1100 << 10], small[300 << 10];
    const uint32_t blen = batch_body(PC_OP_PUSH, "big", 1000, 256, false, big);
    const uint32_t slen = batch_body(PC_OP_PUSH, "big", 250, 256, false, small);
    const int a = raw_connect(port), b = raw_connect(port);
    uint8_t h[PC_WIRE_HDR];
    pc_wire_hdr_t hd = {.op = PC_OP_PUSH, .id = 1, .body_len = blen};
    pc_wire_hdr_encode(&hd, h);
    send_all(a, h, sizeof h);
    send_all(a, big, 100 << 10);
    usleep(200 * 1000); /* a's body is taken before b's header comes */
    send_frame(b, PC_OP_PUSH, 2, small, slen);
    struct pollfd pb = {.fd = b, .events = POLLIN};
    const int early = poll(&pb, 1, 500);
    const double waits = metric(mport, "emberps_dataplane_body_waits_total");
    send_all(a, big + (100 << 10), blen - (100 << 10));
    assert_int_equal(recv_reply(a, 1), 0);
    assert_int_equal(recv_reply(b, 2), 0);
    /* the trickle: 1 MB announced, 100 KiB sent, then a byte every 100 ms */
    const int t = raw_connect(port);
    hd.id = 3;
    pc_wire_hdr_encode(&hd, h);
    send_all(t, h, sizeof h);
    send_all(t, big, 100 << 10);
    double closed = -1;
    for (int i = 0; i < 100 && closed < 0; i++) {
        if (send(t, big, 1, MSG_NOSIGNAL) != 1)
            closed = i * 0.1;
        else if (raw_closed_after(t, 0.1) >= 0)
            closed = i * 0.1;
    }
    print_message("a push waited %s for the body budget (waits %.0f); a trickling body closed "
                  "after %.1f s\n",
                  early == 0 ? "500 ms" : "not at all", waits, closed);
    assert_int_equal(early, 0);
    assert_true(waits >= 1);
    assert_true(closed > 2.0 && closed < 8.0); /* 2000 ms + ~1 s for the KiB, + the timer */
    close(a);
    close(b);
    close(t);
    pu_stop(s);
    tc_rmdir(dir);
}

/* A server and a client in a network namespace of their own whose loopback goes down for 4 s
 * with a call in flight: every packet vanishes, nobody is told. The client (call timeout 500 ms,
 * so its dead-peer time is 2 s) ends its connection and reconnects once the network is back;
 * the server (--dead-peer-ms=2000) ends its side, so it holds only the new connection. Without
 * the kernel's watch (pc_wire_watch_peer) both old connections live on: the client's waits for
 * TCP's next retransmission (seconds, then minutes) with no reconnect, the server's for ever. */
static void test_dead_peer(void **state) {
    (void)state;
    g_home_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (g_home_ns < 0 || unshare(CLONE_NEWNET) != 0 || lo_set(true) != 0) {
        print_message("SKIPPED: no network namespace of the test's own (%s): needs "
                      "CAP_SYS_ADMIN\n",
                      strerror(errno));
        skip();
    }
    char dir[256], tables[200], one[64];
    tc_tmpdir(dir, sizeof dir, "dpdead");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, "--dead-peer-ms=2000", NULL};
    int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    const int mport = pu_last_metrics_port;
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one, .timeout_ms = 500, .retries = 1};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    enum { N = 100 };
    uint64_t keys[N];
    static float rows[N * D], ok[N * D];
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 11;
    assert_int_equal(psc_pull(c, "emb", keys, N, D, ok), 0);
    assert_true(metric(mport, "emberps_dataplane_connections") == 1);
    assert_int_equal(lo_set(false), 0);
    const double t0 = pu_now();
    assert_int_equal(psc_pull(c, "emb", keys, N, D, rows), PC_ETIMEDOUT);
    while (pu_now() - t0 < 4.0)
        usleep(50000);
    assert_int_equal(lo_set(true), 0);
    int rc = -1;
    double back = pu_now();
    while ((rc = psc_pull(c, "emb", keys, N, D, rows)) != 0 && pu_now() - back < 15)
        usleep(100000);
    back = pu_now() - back;
    psc_stats_t st;
    psc_stats(c, &st);
    double conns = -1;
    for (double t1 = pu_now(); pu_now() - t1 < 5; usleep(100000))
        if ((conns = metric(mport, "emberps_dataplane_connections")) == 1)
            break;
    print_message("dead peer: a pull %.1f s after the network came back: %s; reconnects %llu; "
                  "server connections %.0f\n",
                  back, psc_strerror(rc), (unsigned long long)st.reconnects, conns);
    assert_int_equal(rc, 0);
    assert_memory_equal(rows, ok, sizeof rows);
    assert_true(st.reconnects >= 1); /* the old connection ended: a new one */
    assert_true(conns == 1);         /* the server's side of the old one ended too */
    psc_close(c);
    pu_stop(s);
    tc_rmdir(dir);
    leave_ns(NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_dataplane PATH-TO-ps-server\n");
        return 2;
    }
    pu_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_servers_match_local),
        cmocka_unit_test(test_one_server_direct),
        cmocka_unit_test(test_one_server_direct_polling),
        cmocka_unit_test(test_error_detail),
        cmocka_unit_test(test_map_host_name),
        cmocka_unit_test(test_claim),
        cmocka_unit_test(test_tables_health),
        cmocka_unit_test(test_wrong_slot_redirect),
        cmocka_unit_test(test_kill_and_restart),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_close_with_waiter),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_port_in_use),
        cmocka_unit_test(test_client_oom),
        cmocka_unit_test(test_reply_limit),
        cmocka_unit_test(test_unsent_bounded),
        cmocka_unit_test(test_stop_with_nonreader),
        cmocka_unit_test(test_roleless_dead_server),
        cmocka_unit_test(test_frame_deadline),
        cmocka_unit_test(test_body_budget),
        cmocka_unit_test(test_fence),
        cmocka_unit_test_teardown(test_dead_peer, leave_ns),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all(); /* servers a failed test left running */
    return rc;
}
