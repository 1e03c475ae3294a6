/* test_sched: the worker's communication scheduler (pw_sched.h).
 *  - priority order: with the credits taken by a running job, the jobs queued meanwhile start
 *    by priority (pull before dense before push), FIFO mode in submission order;
 *  - the credit limit: a job that does not fit waits, and nothing behind it overtakes; a job
 *    larger than the limit still runs alone;
 *  - the ordered lane runs one job at a time in submission order, beside server-lane jobs;
 *  - `after`: a dependant starts only when its dependency is done, and fails with it;
 *  - abort_ordered fails the queued ordered jobs and their dependants, drains the rest;
 *  - a call that ends inside its run (the local store's) completes on the dispatch thread.
 * Server-lane jobs here complete from the test thread (as libpsclient's I/O thread would). */
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "pc_error.h"
#include "pc_time.h"
#include "pw_sched.h"

enum { MAXJ = 16 };

typedef struct rec {
    pthread_mutex_t mu;
    int order[MAXJ], n; /* job ids in start order */
} rec_t;

static rec_t g_rec = {.mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct tjob {
    pw_job_t job; /* first: the scheduler's pointer is the test's */
    int id, rc;
    atomic_int started;
} tjob_t;

static void record(tjob_t *t) {
    pthread_mutex_lock(&g_rec.mu);
    if (g_rec.n < MAXJ)
        g_rec.order[g_rec.n++] = t->id;
    pthread_mutex_unlock(&g_rec.mu);
    atomic_store(&t->started, 1);
}

static int run_async(pw_job_t *j) { /* completes later, from the test */
    record((tjob_t *)j);
    return 0;
}

static int run_sync(pw_job_t *j) { /* ordered lane: done when it returns */
    tjob_t *t = (tjob_t *)j;
    record(t);
    usleep(2000);
    return t->rc;
}

static atomic_int g_release;

static int run_block(pw_job_t *j) { /* ordered lane: runs until released */
    record((tjob_t *)j);
    const uint64_t t0 = pc_time_mono_ns();
    while (!atomic_load(&g_release) && pc_time_sec_since(t0) < 10)
        usleep(1000);
    return 0;
}

static void *releaser(void *arg) {
    (void)arg;
    usleep(50000);
    atomic_store(&g_release, 1);
    return NULL;
}

static void init(tjob_t *t, int id, pw_job_class_t cls, int prio, size_t bytes, bool ordered) {
    memset(t, 0, sizeof *t);
    t->id = id;
    t->job.cls = cls;
    t->job.prio = prio;
    t->job.bytes = bytes;
    t->job.ordered = ordered;
    t->job.run = ordered ? run_sync : run_async;
}

static void reset_rec(void) {
    pthread_mutex_lock(&g_rec.mu);
    g_rec.n = 0;
    pthread_mutex_unlock(&g_rec.mu);
}

static int started_count(void) {
    pthread_mutex_lock(&g_rec.mu);
    int n = g_rec.n;
    pthread_mutex_unlock(&g_rec.mu);
    return n;
}

/* Bounded wait until n jobs started. */
static void wait_started(int n) {
    const uint64_t t0 = pc_time_mono_ns();
    while (started_count() < n && pc_time_sec_since(t0) < 10)
        usleep(1000);
    assert_int_equal(started_count(), n);
}

/* No more starts within 50 ms. */
static void settle(int n) {
    usleep(50000);
    assert_int_equal(started_count(), n);
}

static void test_priority_and_fifo(void **state) {
    (void)state;
    /* a blocker takes every credit; push (1), dense (2), pull (3) queue meanwhile */
    pw_sched_t *s;
    for (int fifo = 0; fifo < 2; fifo++) {
        pw_sched_opts_t o = {.credit_bytes = 1000, .fifo = fifo};
        assert_int_equal(pw_sched_create(&o, &s), 0);
        reset_rec();
        tjob_t blk, a, b, c;
        init(&blk, 0, PW_JOB_PUSH, 100, 1000, false);
        init(&a, 1, PW_JOB_PUSH, 100, 600, false);
        init(&b, 2, PW_JOB_DENSE, 1, 600, false);
        init(&c, 3, PW_JOB_PULL, 0, 600, false);
        pw_sched_submit(s, &blk.job);
        wait_started(1);
        pw_sched_submit(s, &a.job);
        pw_sched_submit(s, &b.job);
        pw_sched_submit(s, &c.job);
        settle(1); /* all credits taken by the blocker */
        tjob_t *byid[] = {&blk, &a, &b, &c};
        pw_sched_complete(&blk.job, 0);
        for (int k = 2; k <= 4; k++) {
            wait_started(k);
            settle(k); /* 600 + 600 > 1000: one at a time */
            pw_sched_complete(&byid[g_rec.order[k - 1]]->job, 0);
        }
        const int want_prio[] = {0, 3, 2, 1}, want_fifo[] = {0, 1, 2, 3};
        for (int k = 0; k < 4; k++)
            assert_int_equal(g_rec.order[k], fifo ? want_fifo[k] : want_prio[k]);
        for (int k = 0; k < 4; k++)
            assert_int_equal(pw_sched_wait(s, &byid[k]->job), 0);
        pw_sched_stats_t st;
        pw_sched_stats(s, &st);
        assert_int_equal(st.jobs[PW_JOB_PUSH], 2);
        assert_int_equal(st.bytes[PW_JOB_PULL], 600);
        pw_sched_destroy(s);
    }
}

static void test_credits(void **state) {
    (void)state;
    pw_sched_t *s;
    pw_sched_opts_t o = {.credit_bytes = 1000};
    assert_int_equal(pw_sched_create(&o, &s), 0);
    reset_rec();
    tjob_t big, a, b, small;
    init(&big, 0, PW_JOB_PUSH, 5, 5000, false); /* larger than the limit: runs alone */
    init(&a, 1, PW_JOB_PULL, 0, 400, false);
    init(&b, 2, PW_JOB_PULL, 0, 400, false);
    init(&small, 3, PW_JOB_PUSH, 5, 100, false);
    pw_sched_submit(s, &big.job);
    wait_started(1);
    pw_sched_submit(s, &a.job);
    pw_sched_submit(s, &b.job);
    settle(1);
    pw_sched_complete(&big.job, 0);
    wait_started(3); /* 400 + 400 fit together */
    /* 800 in flight; the next best (small, 100) fits: it starts too */
    pw_sched_submit(s, &small.job);
    wait_started(4);
    pw_sched_complete(&a.job, 0);
    pw_sched_complete(&b.job, 0);
    pw_sched_complete(&small.job, 0);
    /* a job that does not fit blocks lower-priority ones behind it */
    reset_rec();
    tjob_t hold, urgent, bulk;
    init(&hold, 10, PW_JOB_PUSH, 5, 700, false);
    init(&urgent, 11, PW_JOB_PULL, 0, 500, false);
    init(&bulk, 12, PW_JOB_PUSH, 5, 100, false);
    pw_sched_submit(s, &hold.job);
    wait_started(1);
    pw_sched_submit(s, &urgent.job);
    pw_sched_submit(s, &bulk.job);
    settle(1); /* bulk would fit (800) but must not overtake urgent */
    pw_sched_complete(&hold.job, 0);
    wait_started(3);
    assert_int_equal(g_rec.order[1], 11);
    pw_sched_complete(&urgent.job, 0);
    pw_sched_complete(&bulk.job, 0);
    pw_sched_drain(s);
    pw_sched_destroy(s);
}

static void test_ordered_and_after(void **state) {
    (void)state;
    pw_sched_t *s;
    pw_sched_opts_t o = {.credit_bytes = 1 << 20};
    assert_int_equal(pw_sched_create(&o, &s), 0);
    reset_rec();
    tjob_t o1, o2, o3, dep;
    init(&o1, 1, PW_JOB_DENSE, 50, 10, true);
    init(&o2, 2, PW_JOB_DENSE, 1, 10, true); /* better priority: still after o1 */
    init(&o3, 3, PW_JOB_MARK, 0, 10, true);
    init(&dep, 4, PW_JOB_PULL, 0, 10, false);
    dep.job.after = &o3.job; /* (a dependency is submitted first: never submitted is none) */
    pw_sched_submit(s, &o1.job);
    pw_sched_submit(s, &o2.job);
    pw_sched_submit(s, &o3.job);
    pw_sched_submit(s, &dep.job);
    assert_int_equal(pw_sched_wait(s, &o3.job), 0);
    wait_started(4);
    assert_int_equal(g_rec.order[0], 1);
    assert_int_equal(g_rec.order[1], 2);
    assert_int_equal(g_rec.order[2], 3);
    assert_int_equal(g_rec.order[3], 4); /* the dependant only after o3 */
    pw_sched_complete(&dep.job, 0);
    assert_int_equal(pw_sched_wait(s, &dep.job), 0);
    /* a failed dependency fails its dependant without running it */
    reset_rec();
    pw_sched_reset(&o1.job);
    pw_sched_reset(&dep.job);
    o1.rc = PC_EUNAVAIL;
    dep.job.after = &o1.job;
    pw_sched_submit(s, &o1.job);
    pw_sched_submit(s, &dep.job);
    assert_int_equal(pw_sched_wait(s, &o1.job), PC_EUNAVAIL);
    assert_int_equal(pw_sched_wait(s, &dep.job), PC_EUNAVAIL);
    assert_int_equal(started_count(), 1);
    /* abort_ordered: queued ordered jobs and their dependants fail, server jobs finish */
    reset_rec();
    tjob_t slow, q1, q2, d2, srv;
    init(&slow, 20, PW_JOB_DENSE, 1, 10, true);
    init(&q1, 21, PW_JOB_DENSE, 1, 10, true);
    init(&q2, 22, PW_JOB_MARK, 1, 10, true);
    init(&d2, 23, PW_JOB_PULL, 0, 10, false);
    init(&srv, 24, PW_JOB_PUSH, 9, 10, false);
    slow.job.run = run_block;
    atomic_store(&g_release, 0);
    d2.job.after = &q2.job;
    pw_sched_submit(s, &slow.job);
    pw_sched_submit(s, &q1.job);
    pw_sched_submit(s, &q2.job);
    pw_sched_submit(s, &d2.job);
    pw_sched_submit(s, &srv.job);
    wait_started(2); /* slow and srv */
    assert_true(atomic_load(&slow.started) && atomic_load(&srv.started));
    pw_sched_complete(&srv.job, 0); /* (abort drains: the server job must end) */
    pthread_t rel;
    assert_int_equal(pthread_create(&rel, NULL, releaser, NULL), 0);
    pw_sched_abort_ordered(s, PC_ECANCELED); /* returns once slow was released and ended */
    pthread_join(rel, NULL);
    assert_int_equal(pw_sched_wait(s, &slow.job), 0);
    assert_int_equal(pw_sched_wait(s, &q1.job), PC_ECANCELED);
    assert_int_equal(pw_sched_wait(s, &q2.job), PC_ECANCELED);
    assert_int_equal(pw_sched_wait(s, &d2.job), PC_ECANCELED);
    assert_int_equal(pw_sched_wait(s, &srv.job), 0);
    assert_false(atomic_load(&q1.started) || atomic_load(&q2.started) || atomic_load(&d2.started));
    pw_sched_destroy(s);
}

/* A server-lane call that ends before it returns (the local store's): the job completes from
 * its own run, on the dispatch thread; a dependant of a failed one fails without starting; a
 * job never submitted counts as done. */
static int run_inline(pw_job_t *j) {
    record((tjob_t *)j);
    pw_sched_complete(j, ((tjob_t *)j)->rc);
    return 0;
}

static void test_inline(void **state) {
    (void)state;
    reset_rec();
    pw_sched_t *s;
    assert_int_equal(pw_sched_create(NULL, &s), 0);
    tjob_t a, b;
    init(&a, 1, PW_JOB_PULL, 0, 10, false);
    init(&b, 2, PW_JOB_PUSH, 0, 10, false);
    a.job.run = b.job.run = run_inline;
    a.rc = PC_EIO;
    b.job.after = &a.job;
    pw_sched_submit(s, &a.job);
    assert_int_equal(pw_sched_wait(s, &a.job), PC_EIO);
    assert_true(pw_sched_done(s, &a.job));
    assert_int_equal(started_count(), 1);
    pw_sched_submit(s, &b.job);
    assert_int_equal(pw_sched_wait(s, &b.job), PC_EIO); /* its dependency failed */
    assert_int_equal(started_count(), 1);
    tjob_t never;
    init(&never, 3, PW_JOB_PULL, 0, 10, false);
    assert_int_equal(pw_sched_wait(s, &never.job), 0); /* never submitted */
    pw_sched_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_and_fifo),
        cmocka_unit_test(test_credits),
        cmocka_unit_test(test_ordered_and_after),
        cmocka_unit_test(test_inline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
