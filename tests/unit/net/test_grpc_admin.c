/* The gRPC transport (ps_grpc.h) keeps a handler thread for data calls and health checks: with 2
 * threads, one administrative call that runs (here held until the test lets it go) makes a second
 * one answered UNAVAILABLE at once, while a data call is served; once it ended, the next one
 * runs. (Two checkpoints held both threads, and with them every Lookup and Health call.) */
#include "test_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "emberps/psgrpc.h"
#include "pc_error.h"
#include "pc_time.h"
#include "ps_grpc.h"

enum { SLOW, FAST };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_slow_running;
static bool g_release;

static int method(const char *path, size_t len) {
    if (len == strlen("/t.S/Slow") && !memcmp(path, "/t.S/Slow", len))
        return SLOW;
    if (len == strlen("/t.S/Fast") && !memcmp(path, "/t.S/Fast", len))
        return FAST;
    return -1;
}

static bool is_admin(int m) {
    return m == SLOW;
}

/* Slow: counted running, then held until g_release; both answer an empty message. */
static void call(void *ctx, int m, const uint8_t *req, size_t len, bool admin,
                 ps_api_reply_t *out) {
    (void)ctx, (void)req, (void)len, (void)admin;
    if (m == SLOW) {
        pthread_mutex_lock(&g_mu);
        g_slow_running++;
        pthread_cond_broadcast(&g_cv);
        while (!g_release)
            pthread_cond_wait(&g_cv, &g_mu);
        g_slow_running--;
        pthread_mutex_unlock(&g_mu);
    }
    memset(out, 0, sizeof *out);
}

typedef struct caller {
    int port, rc;
    const char *path;
    pthread_t th;
} caller_t;

static int request(int port, const char *path, char *msg, size_t cap) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psg_opts_t o = {.addr = addr};
    psg_t *c;
    int rc = psg_create(&o, &c);
    if (rc)
        return rc;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int st = 0;
    rc = psg_request(c, path, (const uint8_t *)"", 0, 10000, &resp, &rlen, &st, msg, cap);
    free(resp);
    psg_destroy(c);
    return rc;
}

static void *caller_main(void *arg) {
    caller_t *k = arg;
    char msg[256];
    k->rc = request(k->port, k->path, msg, sizeof msg);
    return NULL;
}

static void test_admin_keeps_a_thread(void **state) {
    (void)state;
    static const char *const names[] = {"t.S", NULL};
    const ps_grpc_service_t svc = {
        .names = names, .method = method, .is_admin = is_admin, .call = call};
    const ps_grpc_opts_t o = {.addr = "127.0.0.1:0", .threads = 2, .max_message = 1 << 20};
    ps_grpc_t *g;
    assert_int_equal(ps_grpc_start(&svc, &o, &g), 0);
    ps_grpc_set_serving(g, true);
    caller_t slow = {.port = ps_grpc_port(g), .rc = -1, .path = "/t.S/Slow"};
    assert_int_equal(pthread_create(&slow.th, NULL, caller_main, &slow), 0);
    pthread_mutex_lock(&g_mu);
    const uint64_t t0 = pc_time_mono_ns();
    while (!g_slow_running && pc_time_sec_since(t0) < 20) { /* bounded */
        pthread_mutex_unlock(&g_mu);
        pc_time_sleep_ms(5);
        pthread_mutex_lock(&g_mu);
    }
    const int running = g_slow_running;
    pthread_mutex_unlock(&g_mu);
    char msg[256] = "", fast_msg[256] = "";
    const int second = running ? request(ps_grpc_port(g), "/t.S/Slow", msg, sizeof msg) : -1;
    const int fast = request(ps_grpc_port(g), "/t.S/Fast", fast_msg, sizeof fast_msg);
    pthread_mutex_lock(&g_mu); /* released before any assertion: no handler left held */
    g_release = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(slow.th, NULL);
    print_message("a second administrative call: %s\n", msg);
    assert_int_equal(running, 1);
    assert_int_equal(second, PC_EUNAVAIL);
    assert_non_null(strstr(msg, "busy"));
    assert_int_equal(fast, 0);
    assert_int_equal(slow.rc, 0);
    assert_int_equal(request(ps_grpc_port(g), "/t.S/Slow", msg, sizeof msg), 0); /* (released) */
    char metrics[4096];
    metrics[0] = '\0';
    ps_grpc_render_metrics(g, metrics, sizeof metrics, 0);
    assert_non_null(strstr(metrics, "emberps_grpc_admin_busy_total 1\n"));
    ps_grpc_stop(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_admin_keeps_a_thread)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
