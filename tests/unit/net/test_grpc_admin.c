/* The gRPC transport (ps_grpc.h) keeps a handler thread for data calls and health checks: with 2
 * threads, one administrative call that runs (here held until the test lets it go) makes a second
 * one answered UNAVAILABLE at once, while a data call is served; once it ended, the next one
 * runs. (Two checkpoints held both threads, and with them every Lookup and Health call.) psctl's
 * calls (psctl_request) and a job checkpoint's Checkpoint calls (pw_jobckpt_servers) ask a busy
 * server again until their timeout (psg_request_busy; the job's checkpoint failed before). */
#include "test_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "emberps.pb-c.h"
#include "emberps/psgrpc.h"
#include "pc_error.h"
#include "pc_time.h"
#include "ps_api.h"
#include "ps_grpc.h"
#include "psctl_exit.h"
#include "pw_jobckpt.h"

enum { SLOW, FAST, CKPT };
#define CKPT_PATH "/emberps.ParameterServer/Checkpoint" /* answered at once: checkpoint 1 */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_slow_running;
static bool g_release;

static int method(const char *path, size_t len) {
    if (len == strlen("/t.S/Slow") && !memcmp(path, "/t.S/Slow", len))
        return SLOW;
    if (len == strlen("/t.S/Fast") && !memcmp(path, "/t.S/Fast", len))
        return FAST;
    if (len == strlen(CKPT_PATH) && !memcmp(path, CKPT_PATH, len))
        return CKPT;
    return -1;
}

static bool is_admin(int m) {
    return m == SLOW || m == CKPT;
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
    if (m == CKPT) { /* (a job checkpoint refuses an answer without an id) */
        Emberps__CheckpointResponse r = EMBERPS__CHECKPOINT_RESPONSE__INIT;
        r.id = 1;
        ps_api_reply_pack(out, &r.base);
    }
}

typedef struct caller {
    int port, rc;
    const char *path;
    bool again; /* psctl_request */
    bool job;   /* pw_jobckpt_servers */
    pthread_t th;
} caller_t;

static int request_as(int port, const char *path, char *msg, size_t cap, bool again) {
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
    rc = again ? psctl_request(c, path, (const uint8_t *)"", 0, 20000, &resp, &rlen, &st, msg, cap)
               : psg_request(c, path, (const uint8_t *)"", 0, 10000, &resp, &rlen, &st, msg, cap);
    free(resp);
    psg_destroy(c);
    return rc;
}

static int request(int port, const char *path, char *msg, size_t cap) {
    return request_as(port, path, msg, cap, false);
}

static void *caller_main(void *arg) {
    caller_t *k = arg;
    char msg[256], addr[64];
    static pw_jobckpt_t ck;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", k->port);
    k->rc = k->job ? pw_jobckpt_servers(addr, NULL, 20000, &ck)
                   : request_as(k->port, k->path, msg, sizeof msg, k->again);
    if (k->job && !k->rc && ck.nservers != 1)
        k->rc = PC_EINTERNAL;
    return NULL;
}

/* The busy answers the server counted. */
static unsigned long long busy_count(ps_grpc_t *g) {
    char metrics[4096] = "";
    ps_grpc_render_metrics(g, metrics, sizeof metrics, 0);
    const char *p = strstr(metrics, "\nemberps_grpc_admin_busy_total "); /* (not # TYPE's) */
    return p ? strtoull(p + strlen("\nemberps_grpc_admin_busy_total "), NULL, 10) : 0;
}

/* Until cond() or 20 s (bounded); cond's last answer. */
static bool wait_for(bool (*cond)(void *), void *arg) {
    const uint64_t t0 = pc_time_mono_ns();
    while (!cond(arg) && pc_time_sec_since(t0) < 20)
        pc_time_sleep_ms(5);
    return cond(arg);
}

static bool slow_running(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    const bool r = g_slow_running > 0;
    pthread_mutex_unlock(&g_mu);
    return r;
}

static unsigned long long g_busy_want; /* busy_reached's */

static bool busy_reached(void *arg) {
    return busy_count(arg) >= g_busy_want;
}

static void release(bool yes) {
    pthread_mutex_lock(&g_mu);
    g_release = yes;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* While a Slow call is held, caller k is answered busy (the server's busy count passes what it
 * was when Slow was held) and asks again; once Slow is let go, both succeed. */
static void asked_again(ps_grpc_t *g, caller_t *k) {
    release(false);
    caller_t slow = {.port = ps_grpc_port(g), .rc = -1, .path = "/t.S/Slow"};
    assert_int_equal(pthread_create(&slow.th, NULL, caller_main, &slow), 0);
    const bool held = wait_for(slow_running, NULL);
    g_busy_want = busy_count(g) + 1;
    if (held)
        assert_int_equal(pthread_create(&k->th, NULL, caller_main, k), 0);
    const bool met_busy = held && wait_for(busy_reached, g);
    release(true);
    pthread_join(slow.th, NULL);
    if (held)
        pthread_join(k->th, NULL);
    assert_true(held && met_busy);
    assert_int_equal(slow.rc, 0);
    assert_int_equal(k->rc, 0);
}

/* The test service (Slow, Fast, Checkpoint) on 2 handler threads, serving. */
static ps_grpc_t *start_serving(void) {
    static const char *const names[] = {"t.S", NULL};
    static const ps_grpc_service_t svc = {
        .names = names, .method = method, .is_admin = is_admin, .call = call};
    const ps_grpc_opts_t o = {.addr = "127.0.0.1:0", .threads = 2, .max_message = 1 << 20};
    ps_grpc_t *g;
    assert_int_equal(ps_grpc_start(&svc, &o, &g), 0);
    ps_grpc_set_serving(g, true);
    return g;
}

static void test_admin_keeps_a_thread(void **state) {
    (void)state;
    ps_grpc_t *g = start_serving();
    caller_t slow = {.port = ps_grpc_port(g), .rc = -1, .path = "/t.S/Slow"};
    assert_int_equal(pthread_create(&slow.th, NULL, caller_main, &slow), 0);
    const bool running = wait_for(slow_running, NULL);
    char msg[256] = "", fast_msg[256] = "";
    const int second = running ? request(ps_grpc_port(g), "/t.S/Slow", msg, sizeof msg) : -1;
    const int fast = request(ps_grpc_port(g), "/t.S/Fast", fast_msg, sizeof fast_msg);
    release(true); /* before any assertion: no handler left held */
    pthread_join(slow.th, NULL);
    print_message("a second administrative call: %s\n", msg);
    assert_true(running);
    assert_int_equal(second, PC_EUNAVAIL);
    assert_true(strncmp(msg, PSG_BUSY, strlen(PSG_BUSY)) == 0);
    assert_int_equal(fast, 0);
    assert_int_equal(slow.rc, 0);
    assert_int_equal(request(ps_grpc_port(g), "/t.S/Slow", msg, sizeof msg), 0); /* (released) */
    assert_int_equal(busy_count(g), 1);

    /* psctl's call: answered busy while one is held, asked again, run once it was let go; a job
     * checkpoint's call the same way (it failed at the first busy answer, and the job went on
     * without that checkpoint) */
    caller_t again = {.port = ps_grpc_port(g), .rc = -1, .path = "/t.S/Slow", .again = true};
    asked_again(g, &again);
    caller_t job = {.port = ps_grpc_port(g), .rc = -1, .job = true};
    asked_again(g, &job);
    ps_grpc_stop(g);
}

typedef struct setter {
    ps_grpc_t *g;
    pthread_t th;
} setter_t;

static void *serving_off(void *arg) {
    ps_grpc_set_serving(((setter_t *)arg)->g, false);
    return NULL;
}

/* Serving turned off (a stop) while an administrative call is held: the data call and the health
 * check after it are answered at once (not serving), and the turn-off ends once the held call
 * does. They waited on the gate behind the turn-off until the held call ended (a checkpoint:
 * minutes), holding the handler thread kept for them. */
static void test_stop_beside_a_long_call(void **state) {
    (void)state;
    ps_grpc_t *g = start_serving();
    release(false);
    caller_t slow = {.port = ps_grpc_port(g), .rc = -1, .path = "/t.S/Slow"};
    assert_int_equal(pthread_create(&slow.th, NULL, caller_main, &slow), 0);
    const bool held = wait_for(slow_running, NULL);
    setter_t off = {.g = g};
    assert_int_equal(pthread_create(&off.th, NULL, serving_off, &off), 0);
    pc_time_sleep_ms(100); /* (the turn-off waits on the gate now) */
    char msg[256] = "";
    const uint64_t t0 = pc_time_mono_ns();
    const int fast = request(ps_grpc_port(g), "/t.S/Fast", msg, sizeof msg);
    const double took = pc_time_sec_since(t0);
    release(true); /* before any assertion: no handler left held */
    pthread_join(slow.th, NULL);
    pthread_join(off.th, NULL);
    print_message("a data call beside a held one while serving turns off: %s in %.2f s (%s)\n",
                  pc_err_name(fast), took, msg);
    assert_true(held);
    assert_int_equal(fast, PC_EUNAVAIL);
    assert_true(took < 2.0);
    assert_int_equal(slow.rc, 0);
    ps_grpc_stop(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_admin_keeps_a_thread),
                                       cmocka_unit_test(test_stop_beside_a_long_call)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
