/* test_grpc_tls: security and health of the gRPC plane, against ps-server processes on loopback.
 *
 *  - TLS: a server with --tls-cert/--tls-key answers psctl --tls-ca=ca.pem (and psgrpc with the
 *    CA); psctl without the CA (plaintext, or --tls with the system's roots) and with another CA
 *    fails with exit 3 and a message that names the server and says the certificate did not
 *    verify (PC_ETLS); a wrong token over TLS gets UNAUTHENTICATED (exit 1);
 *  - mutual TLS: with --tls-client-auth=require a client without a certificate, or with one its
 *    CA did not sign, is refused (exit 3, PC_ETLS), one with client.pem works;
 *  - grpc.health.v1.Health/Check: SERVING for "" and "emberps.ParameterServer" without the
 *    token the server wants, NOT_FOUND for another service, Watch UNIMPLEMENTED, NOT_SERVING
 *    while the server checkpoints on its way out; psctl probe prints it and exits 0 on SERVING;
 *  - ps-worker's gRPC clients (pw_coord_open, pw_jobckpt_servers) with the worker's token and
 *    TLS files against a TLS coordinator with mutual TLS: KvSet/KvGet and a job checkpoint work,
 *    the same calls without them fail (PC_ETLS);
 *  - the bind rule: --host=0.0.0.0 without a token and without TLS is refused (exit 2), with TLS
 *    it serves.
 * Certificates come from deploy/make-certs.sh (argv[3]) into a fresh directory.
 * argv[1] is ps-server, argv[2] psctl. Every wait is bounded. */
#include "proc_util.h"
#include "table_check.h"

#include "emberps.pb-c.h"
#include "emberps/psgrpc.h"
#include "health.pb-c.h"
#include "pc_error.h"
#include "ps_api.h"
#include "pw_coord_client.h"
#include "pw_jobckpt.h"

#include <stdlib.h>

static const char *g_psctl, *g_certs_sh;
static char g_certs[256]; /* make-certs.sh output */

/* A PEM file of the test certificates. */
static const char *pem(const char *name) {
    static char buf[8][320];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", g_certs, name);
    return b;
}

/* Run psctl against 127.0.0.1:gp with args (NULL-terminated); stdout and stderr into out; its
 * exit status. */
static int psctl(int gp, char *out, size_t cap, const char *const *args) {
    char cmd[2048];
    int n = snprintf(cmd, sizeof cmd, "%s --server=127.0.0.1:%d --timeout-ms=3000", g_psctl, gp);
    for (int i = 0; args[i]; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", args[i]);
    snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, cap - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static psg_t *client(const psg_opts_t *o) {
    psg_t *c;
    assert_int_equal(psg_create(o, &c), 0);
    return c;
}

/* grpc.health.v1.Health/Check of `service`: 0 with the serving status in *status, or the code. */
static int health_check(psg_t *c, const char *service, int *status) {
    Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    q.service = (char *)service;
    uint8_t req[256], *resp = NULL;
    const size_t n = grpc__health__v1__health_check_request__pack(&q, req);
    size_t len = 0;
    int rc =
        psg_request(c, "/grpc.health.v1.Health/Check", req, n, 3000, &resp, &len, NULL, NULL, 0);
    *status = -1;
    if (rc == 0) {
        Grpc__Health__V1__HealthCheckResponse *r =
            grpc__health__v1__health_check_response__unpack(NULL, len, resp);
        assert_non_null(r);
        *status = (int)r->status;
        grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    }
    free(resp);
    return rc;
}

/* Start a TLS server with `more` flags (NULL-terminated, at most 8). */
static pid_t spawn_tls(const char *dir, const char *const *more, int *gp) {
    static char cert[320], key[320], ca[320];
    snprintf(cert, sizeof cert, "--tls-cert=%s", pem("server.pem"));
    snprintf(key, sizeof key, "--tls-key=%s", pem("server.key"));
    snprintf(ca, sizeof ca, "--tls-ca=%s", pem("ca.pem"));
    const char *extra[16] = {cert, key, ca, "--tables=name=emb,dim=4"};
    int a = 4;
    for (int i = 0; more && more[i] && a < 15; i++)
        extra[a++] = more[i];
    extra[a] = NULL;
    return pu_spawn(pu_free_port(), dir, extra, gp);
}

static void test_tls(void **state) {
    (void)state;
    char dir[256], out[8192], ca[320], other[320];
    tc_tmpdir(dir, sizeof dir, "tls1");
    int gp = 0;
    pid_t s = spawn_tls(dir, (const char *[]){"--token=t1", NULL}, &gp);
    snprintf(ca, sizeof ca, "--tls-ca=%s", pem("ca.pem"));
    snprintf(other, sizeof other, "--tls-ca=%s", pem("other-ca.pem"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){ca, "--token=t1", "health", NULL}),
                     0);
    assert_non_null(strstr(out, "status: serving"));
    /* Without the CA: the handshake fails before any call reaches the API (exit 3). */
    char want[128];
    snprintf(want, sizeof want, "server 127.0.0.1:%d: TLS handshake failed", gp);
    assert_int_equal(
        psctl(gp, out, sizeof out, (const char *[]){other, "--token=t1", "health", NULL}), 3);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "certificate did not verify against"));
    assert_non_null(strstr(out, "other-ca.pem"));
    assert_int_equal(
        psctl(gp, out, sizeof out, (const char *[]){"--tls", "--token=t1", "health", NULL}), 3);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "did not verify against the system's roots"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"--token=t1", "health", NULL}),
                     3); /* plaintext to a TLS-only port */
    assert_non_null(strstr(out, "give its CA"));
    /* Over TLS the token is still checked: the server answers, UNAUTHENTICATED (exit 1). */
    assert_int_equal(
        psctl(gp, out, sizeof out, (const char *[]){ca, "--token=wrong", "tables", NULL}), 1);
    assert_non_null(strstr(out, "PC_EAUTH"));
    /* psgrpc: the same through the library, with the exact codes. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", gp);
    psg_t *good = client(&(psg_opts_t){.addr = addr, .token = "t1", .tls_ca = pem("ca.pem")});
    psg_t *bad = client(&(psg_opts_t){.addr = addr, .token = "t1", .tls_ca = pem("other-ca.pem")});
    psg_t *name = client(&(psg_opts_t){
        .addr = addr, .token = "t1", .tls_ca = pem("ca.pem"), .tls_target = "elsewhere.example"});
    int st;
    assert_int_equal(health_check(good, "", &st), 0);
    assert_int_equal(st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    char msg[512];
    uint8_t *resp;
    size_t len;
    Emberps__ListTablesRequest tq = EMBERPS__LIST_TABLES_REQUEST__INIT;
    uint8_t req[16];
    const size_t n = emberps__list_tables_request__pack(&tq, req);
    const char *path = ps_api_path(PS_API_LIST_TABLES);
    assert_int_equal(psg_request(good, path, req, n, 3000, &resp, &len, NULL, msg, sizeof msg), 0);
    free(resp);
    assert_int_equal(psg_request(bad, path, req, n, 3000, &resp, &len, NULL, msg, sizeof msg),
                     PC_ETLS);
    assert_non_null(strstr(msg, "did not verify"));
    /* The certificate names localhost and 127.0.0.1, not the name this client expects. */
    assert_int_equal(psg_request(name, path, req, n, 3000, &resp, &len, NULL, msg, sizeof msg),
                     PC_ETLS);
    assert_non_null(strstr(msg, "does not name elsewhere.example"));
    psg_destroy(good);
    psg_destroy(bad);
    psg_destroy(name);
    /* A PEM file that is not there fails at creation. */
    psg_t *c;
    assert_int_equal(psg_create(&(psg_opts_t){.addr = addr, .tls_ca = "/nonexistent/ca.pem"}, &c),
                     PC_ENOTFOUND);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_mtls(void **state) {
    (void)state;
    char dir[256], out[8192], ca[320], cert[320], key[320], ocert[320], okey[320];
    tc_tmpdir(dir, sizeof dir, "tls2");
    int gp = 0;
    pid_t s = spawn_tls(dir, (const char *[]){"--tls-client-auth=require", NULL}, &gp);
    snprintf(ca, sizeof ca, "--tls-ca=%s", pem("ca.pem"));
    snprintf(cert, sizeof cert, "--tls-cert=%s", pem("client.pem"));
    snprintf(key, sizeof key, "--tls-key=%s", pem("client.key"));
    snprintf(ocert, sizeof ocert, "--tls-cert=%s", pem("other-ca.pem"));
    snprintf(okey, sizeof okey, "--tls-key=%s", pem("other-ca.key"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){ca, "health", NULL}), 3);
    assert_non_null(strstr(out, "requires a client certificate"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){ca, ocert, okey, "health", NULL}),
                     3);
    assert_non_null(strstr(out, "did not accept this client's certificate"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){ca, cert, key, "health", NULL}),
                     0);
    assert_non_null(strstr(out, "status: serving"));
    /* A certificate without its key is a usage error. */
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){ca, cert, "health", NULL}), 2);
    pu_stop(s);
    /* The server checks its own settings: client auth without a CA is refused (exit 2). */
    char line[1024];
    snprintf(line, sizeof line,
             "%s --port=0 --grpc-port=0 --metrics-port=-1 --tls-cert=%s --tls-key=%s "
             "--tls-client-auth=require >/dev/null 2>&1",
             pu_bin, pem("server.pem"), pem("server.key"));
    int st = system(line);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    tc_rmdir(dir);
}

static void test_health(void **state) {
    (void)state;
    char dir[256], ckarg[320], addr[64];
    tc_tmpdir(dir, sizeof dir, "tls3");
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s/ck", dir);
    int gp = 0;
    pid_t s =
        pu_spawn(pu_free_port(), dir,
                 (const char *[]){"--token=t1", ckarg, "--tables=name=emb,dim=64", NULL}, &gp);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", gp);
    psg_t *anon = client(&(psg_opts_t){.addr = addr}); /* probes send no token */
    int st;
    assert_int_equal(health_check(anon, "", &st), 0);
    assert_int_equal(st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    assert_int_equal(health_check(anon, "emberps.ParameterServer", &st), 0);
    assert_int_equal(st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    assert_int_equal(health_check(anon, "emberps.Coordinator", &st), PC_ENOTFOUND);
    assert_int_equal(health_check(anon, "no.such.Service", &st), PC_ENOTFOUND);
    char out[4096]; /* psctl probe: the same check, for exec probes (no token) */
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"probe", NULL}), 0);
    assert_non_null(strstr(out, "SERVING"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"probe", "no.such", NULL}), 1);
    assert_non_null(strstr(out, "PC_ENOTFOUND"));
    uint8_t *resp;
    size_t len;
    assert_int_equal(psg_request(anon, "/grpc.health.v1.Health/Watch", NULL, 0, 3000, &resp, &len,
                                 NULL, NULL, 0),
                     PC_EUNSUPPORTED);
    Emberps__HealthRequest hq = EMBERPS__HEALTH_REQUEST__INIT;
    uint8_t req[16];
    assert_int_equal(psg_request(anon, ps_api_path(PS_API_HEALTH), req,
                                 emberps__health_request__pack(&hq, req), 3000, &resp, &len, NULL,
                                 NULL, 0),
                     PC_EAUTH); /* the API itself still wants the token */
    /* Rows for the checkpoint on exit to write (a few hundred ms), during which probes must see
     * NOT_SERVING and API calls be refused; then the port closes. */
    psg_t *user = client(&(psg_opts_t){.addr = addr, .token = "t1", .max_message = 256u << 20});
    enum { N = 400000, DIM = 64 };
    Emberps__PushRequest pq = EMBERPS__PUSH_REQUEST__INIT;
    pq.table = "emb";
    pq.n_keys = N;
    pq.keys = malloc(N * sizeof *pq.keys);
    float *g = calloc((size_t)N * DIM, sizeof *g);
    for (size_t i = 0; i < N; i++)
        pq.keys[i] = i * 2654435761u + 1;
    for (size_t i = 0; i < (size_t)N * DIM; i++)
        g[i] = 0.01f;
    pq.grads.data = (uint8_t *)g;
    pq.grads.len = (size_t)N * DIM * sizeof *g;
    const size_t plen = emberps__push_request__get_packed_size(&pq);
    uint8_t *pb = malloc(plen);
    emberps__push_request__pack(&pq, pb);
    assert_int_equal(
        psg_request(user, ps_api_path(PS_API_PUSH), pb, plen, 30000, &resp, &len, NULL, NULL, 0),
        0);
    free(resp);
    free(pb);
    free(g);
    free(pq.keys);
    kill(s, SIGTERM);
    int not_serving = 0, refused = 0, serving_after = 0;
    for (double t0 = pu_now(); pu_now() - t0 < 10;) {
        int rc = health_check(anon, "", &st);
        if (rc != 0)
            break; /* the port is closed: the server is gone or going */
        if (st == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING) {
            not_serving++;
            refused += psg_request(user, ps_api_path(PS_API_HEALTH), req,
                                   emberps__health_request__pack(&hq, req), 3000, &resp, &len, NULL,
                                   NULL, 0) == PC_EUNAVAIL;
        } else if (not_serving) {
            serving_after++;
        }
        usleep(2000);
    }
    assert_int_equal(pu_reap(s, 10), 0);
    assert_true(not_serving > 0);
    assert_true(refused > 0);
    assert_int_equal(serving_after, 0);
    psg_destroy(anon);
    psg_destroy(user);
    tc_rmdir(dir);
}

static void test_worker_clients(void **state) {
    (void)state;
    char dir[256], ckarg[320], addr[64];
    tc_tmpdir(dir, sizeof dir, "tls5");
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s/ck", dir);
    int gp = 0;
    pid_t s = spawn_tls(
        dir,
        (const char *[]){"--coordinator", "--tls-client-auth=require", "--token=t1", ckarg, NULL},
        &gp);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", gp);
    /* what pw_recover builds from the worker's token, tls_ca, tls_cert, tls_key settings */
    const psg_opts_t sec = {.token = "t1",
                            .tls_ca = pem("ca.pem"),
                            .tls_cert = pem("client.pem"),
                            .tls_key = pem("client.key")};
    pw_coord_t *co;
    assert_int_equal(pw_coord_open(addr, &sec, 3000, &co), 0);
    assert_int_equal(pw_coord_set(co, "job/x", "v1", 2), 0);
    void *v;
    size_t n;
    assert_int_equal(pw_coord_get(co, "job/x", &v, &n), 0);
    assert_int_equal(n, 2);
    assert_memory_equal(v, "v1", 2);
    free(v);
    pw_coord_close(co);
    assert_int_equal(pw_coord_open(addr, NULL, 3000, &co), 0);
    assert_int_equal(pw_coord_set(co, "job/x", "v2", 2), PC_EUNAVAIL); /* plaintext: closed */
    pw_coord_close(co);
    const psg_opts_t nocert = {.token = "t1", .tls_ca = pem("ca.pem")};
    assert_int_equal(pw_coord_open(addr, &nocert, 3000, &co), 0);
    assert_int_equal(pw_coord_set(co, "job/x", "v2", 2), PC_ETLS);
    pw_coord_close(co);
    /* A coordinated checkpoint's server side (--server-grpc). */
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    assert_int_equal(pw_jobckpt_servers(addr, &sec, 5000, ck), 0);
    assert_int_equal(ck->nservers, 1);
    assert_true(ck->servers[0] > 0);
    assert_int_equal(pw_jobckpt_servers(addr, &nocert, 5000, ck), PC_ETLS);
    free(ck);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_bind_rule(void **state) {
    (void)state;
    char dir[256], line[1024], out[8192], ca[320];
    tc_tmpdir(dir, sizeof dir, "tls4");
    /* 0.0.0.0 without a token and without TLS: refused, exit 2, saying what to set. */
    snprintf(line, sizeof line,
             "%s --host=0.0.0.0 --port=0 --grpc-port=0 --metrics-port=-1 2>&1 >/dev/null", pu_bin);
    FILE *p = popen(line, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_non_null(strstr(out, "without a token or TLS"));
    /* With TLS it serves (reached here through 127.0.0.1, which the certificate names). */
    int gp = 0;
    pid_t s = spawn_tls(dir, (const char *[]){"--host=0.0.0.0", "--server-index=0", NULL}, &gp);
    snprintf(ca, sizeof ca, "--tls-ca=%s", pem("ca.pem"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){ca, "health", NULL}), 0);
    assert_non_null(strstr(out, "status: serving"));
    pu_stop(s);
    tc_rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test_grpc_tls PATH-TO-ps-server PATH-TO-psctl make-certs.sh\n");
        return 2;
    }
    pu_bin = argv[1];
    g_psctl = argv[2];
    g_certs_sh = argv[3];
    signal(SIGPIPE, SIG_IGN);
    char dir[256], cmd[1024];
    tc_tmpdir(dir, sizeof dir, "certs");
    snprintf(g_certs, sizeof g_certs, "%s", dir);
    snprintf(cmd, sizeof cmd, "bash '%s' '%s' >/dev/null", g_certs_sh, g_certs);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_grpc_tls: %s failed (is openssl installed?)\n", g_certs_sh);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls),       cmocka_unit_test(test_mtls),
        cmocka_unit_test(test_health),    cmocka_unit_test(test_worker_clients),
        cmocka_unit_test(test_bind_rule),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    tc_rmdir(g_certs);
    return rc;
}
