/* Collectives (pw_coll.h over Gloo): groups of 2 and 3 ranks (threads) rendezvous through the
 * coordinator's store, in process and through a real `ps-server --coordinator` over gRPC; the
 * allreduce sums are exact on every rank for small and 4 MB buffers, repeatedly; a rank that
 * never comes makes formation fail with PC_ETIMEDOUT within the timeout; a peer that leaves makes
 * the survivor's allreduce fail (never hang); a new prefix re-forms the group. */
#include "proc_util.h"

#include <pthread.h>
#include <stdlib.h>

#include "pc_error.h"
#include "pc_log.h"
#include "ps_coord.h"
#include "pw_coll.h"
#include "pw_coord_client.h"

static char g_dir[256];

typedef struct member {
    pw_kv_t kv;
    const char *prefix;
    int rank, size, timeout_ms;
    size_t n;
    int rc_create, rc_reduce;
    bool exact;
    bool leave_early; /* destroy the group right after forming it */
} member_t;

static void *run_member(void *arg) {
    member_t *m = arg;
    pw_coll_t *c = NULL;
    m->rc_create =
        pw_coll_create(&m->kv, m->prefix, m->rank, m->size, "127.0.0.1", m->timeout_ms, &c);
    if (m->rc_create)
        return NULL;
    if (m->leave_early) {
        pw_coll_destroy(c);
        return NULL;
    }
    float *buf = malloc(m->n * sizeof *buf);
    m->exact = true;
    for (int rep = 0; rep < 3 && !m->rc_reduce; rep++) {
        for (size_t i = 0; i < m->n; i++)
            buf[i] = (float)((i % 1000) + (size_t)m->rank * 7 + (size_t)rep);
        m->rc_reduce = pw_coll_allreduce_sum(c, buf, m->n);
        for (size_t i = 0; i < m->n && !m->rc_reduce; i++) {
            /* sum over ranks r of (i % 1000 + 7 r + rep): small integers, exact in float */
            const float want = (float)(m->size * ((i % 1000) + (size_t)rep) +
                                       7 * (size_t)(m->size * (m->size - 1) / 2));
            if (buf[i] != want)
                m->exact = false;
        }
    }
    free(buf);
    pw_coll_destroy(c);
    return NULL;
}

static void run_group(pw_kv_t kv, const char *prefix, int size, size_t n) {
    member_t m[4];
    pthread_t th[4];
    for (int r = 0; r < size; r++) {
        m[r] = (member_t){
            .kv = kv, .prefix = prefix, .rank = r, .size = size, .timeout_ms = 10000, .n = n};
        pthread_create(&th[r], NULL, run_member, &m[r]);
    }
    for (int r = 0; r < size; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(m[r].rc_create, 0);
        assert_int_equal(m[r].rc_reduce, 0);
        assert_true(m[r].exact);
    }
}

static ps_coord_store_t g_store;

static int store_set(void *ctx, const char *key, const void *value, size_t len) {
    return g_store.set(ctx, key, value, len, false, 0);
}

static pw_kv_t memory_kv(ps_coord_store_t *st) {
    assert_int_equal(ps_coord_store_memory(st), 0);
    g_store = *st;
    return (pw_kv_t){st->ctx, store_set, st->get};
}

/* A coordinator with no room left: every set refused (PC_EFULL). */
static int full_set(void *ctx, const char *key, const void *value, size_t len) {
    (void)ctx, (void)key, (void)value, (void)len;
    return PC_EFULL;
}

static void test_groups_in_process(void **state) {
    (void)state;
    ps_coord_store_t st;
    pw_kv_t kv = memory_kv(&st);
    run_group(kv, "job/gen/0", 2, 1000);
    run_group(kv, "job/gen/1", 3, 1000);
    run_group(kv, "job/gen/2", 2, 1 << 20); /* 4 MB */
    /* A rank that never comes: formation fails within the timeout. */
    member_t lone = {
        .kv = kv, .prefix = "job/gen/3", .rank = 0, .size = 2, .timeout_ms = 300, .n = 10};
    const double t0 = pu_now();
    run_member(&lone);
    assert_int_equal(lone.rc_create, PC_ETIMEDOUT);
    assert_true(pu_now() - t0 < 5);
    /* A peer that leaves after forming: the survivor's allreduce fails, it does not hang. */
    member_t a = {.kv = kv,
                  .prefix = "job/gen/4",
                  .rank = 0,
                  .size = 2,
                  .timeout_ms = 2000,
                  .n = 1000},
             b = {.kv = kv,
                  .prefix = "job/gen/4",
                  .rank = 1,
                  .size = 2,
                  .timeout_ms = 2000,
                  .n = 1000,
                  .leave_early = true};
    pthread_t ta, tb;
    pthread_create(&tb, NULL, run_member, &b);
    pthread_create(&ta, NULL, run_member, &a);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    assert_int_equal(b.rc_create, 0);
    if (a.rc_create == 0)
        assert_true(a.rc_reduce == PC_EUNAVAIL || a.rc_reduce == PC_ETIMEDOUT);
    /* ... and a new prefix forms a working group again. */
    run_group(kv, "job/gen/5", 2, 1000);
    /* A store that refuses the rendezvous keys: its own code (PC_EFULL), not a peer's failure
     * (it read as PC_EUNAVAIL, and the group formed again for ever) */
    member_t full = {.kv = kv, .prefix = "job/gen/6", .rank = 0, .size = 2, .timeout_ms = 300};
    full.kv.set = full_set;
    run_member(&full);
    assert_int_equal(full.rc_create, PC_EFULL);
    /* Bad arguments. */
    pw_coll_t *c;
    assert_int_equal(pw_coll_create(&kv, "p/", 2, 2, "127.0.0.1", 100, &c), PC_EINVAL);
    assert_int_equal(pw_coll_create(NULL, "p/", 0, 1, "127.0.0.1", 100, &c), PC_EINVAL);
    st.destroy(st.ctx);
}

static void test_groups_through_coordinator(void **state) {
    (void)state;
    char addr[64];
    pid_t pid = pu_coordinator(g_dir, 0, addr, sizeof addr);
    pw_coord_t *co;
    assert_int_equal(pw_coord_open(addr, NULL, 5000, &co), 0);
    void *v;
    size_t n;
    assert_int_equal(pw_coord_get(co, "absent", &v, &n), PC_ENOTFOUND);
    assert_int_equal(pw_coord_set(co, "k", "v", 1), 0);
    assert_int_equal(pw_coord_get(co, "k", &v, &n), 0);
    assert_true(n == 1 && memcmp(v, "v", 1) == 0);
    free(v);
    assert_int_equal(pw_coord_set_if_absent(co, "once", "a", 1), 0);
    assert_int_equal(pw_coord_set_if_absent(co, "once", "b", 1), PC_EEXIST);
    assert_int_equal(pw_coord_get(co, "once", &v, &n), 0);
    assert_true(n == 1 && memcmp(v, "a", 1) == 0);
    free(v);
    run_group(pw_coord_kv(co, 0), "job/gen/0", 2, 100000);
    pw_coord_close(co);
    pu_stop(pid);
    /* A server that is not the coordinator refuses. */
    int gp = 0;
    pid = pu_spawn(pu_free_port(), g_dir, NULL, &gp);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", gp);
    assert_int_equal(pw_coord_open(addr, NULL, 5000, &co), 0);
    assert_int_not_equal(pw_coord_set(co, "k", "v", 1), 0);
    pw_coord_close(co);
    pu_stop(pid);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a peer that left must not kill the survivor */
    pc_log_set_level(PC_LOG_ERROR);
    pu_bin = argc > 1 ? argv[1] : "build/bin/ps-server";
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-coll-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_in_process),
        cmocka_unit_test(test_groups_through_coordinator),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
