/* The change log of the delta stream (ps_changelog.h): positions, the ring's bounds (wrapping,
 * appends larger than the ring), PC_ERANGE outside them, a base position, and writers and
 * readers on several threads (run under TSan): every key a reader copies sits at its position.
 * A table's lazily started log (ps_table_changelog_start): installed once while several threads
 * race to start it and pushes go on, and a follower that scans after the install and reads the
 * log from the head it took before the scan ends with every row the table has. */
#include "test_util.h"

#include "pc_error.h"
#include "ps_changelog.h"
#include "ps_table.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static void test_positions_and_bounds(void **state) {
    (void)state;
    ps_changelog_t *l;
    assert_int_equal(ps_changelog_create(0, 0, &l), PC_EINVAL);
    assert_int_equal(ps_changelog_create(10, 0, &l), 0);
    uint64_t keys[64], got[64], oldest, head;
    size_t n;
    for (uint64_t i = 0; i < 64; i++)
        keys[i] = 1000 + i;
    assert_int_equal(ps_changelog_read(l, 0, 5, got, &n, &oldest, &head), 0);
    assert_int_equal(n, 0);
    assert_int_equal(head, 0);
    ps_changelog_append(l, keys, 7); /* positions 0..6 */
    assert_int_equal(ps_changelog_read(l, 2, 100, got, &n, &oldest, &head), 0);
    assert_int_equal(n, 5);
    assert_true(got[0] == 1002 && got[4] == 1006 && oldest == 0 && head == 7);
    ps_changelog_append(l, keys + 7, 6); /* 7..12: the ring (10) wraps, 0..2 are gone */
    ps_changelog_bounds(l, &oldest, &head);
    assert_true(oldest == 3 && head == 13);
    assert_int_equal(ps_changelog_read(l, 2, 100, got, &n, NULL, NULL), PC_ERANGE);
    assert_int_equal(n, 0);
    assert_int_equal(ps_changelog_read(l, 14, 100, got, &n, NULL, NULL), PC_ERANGE);
    assert_int_equal(ps_changelog_read(l, 3, 100, got, &n, NULL, NULL), 0);
    assert_int_equal(n, 10);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], 1003 + i); /* across the wrap, in order */
    assert_int_equal(ps_changelog_read(l, 13, 100, got, &n, NULL, NULL), 0); /* caught up */
    assert_int_equal(n, 0);
    ps_changelog_append(l, keys, 25); /* more than the ring: the newest 10 stay */
    ps_changelog_bounds(l, &oldest, &head);
    assert_true(oldest == 28 && head == 38);
    assert_int_equal(ps_changelog_read(l, 28, 3, got, &n, NULL, NULL), 0);
    assert_true(n == 3 && got[0] == 1015 && got[2] == 1017);
    ps_changelog_append(l, keys, 0);
    ps_changelog_destroy(l);
    ps_changelog_destroy(NULL);
}

/* A log started at a base: positions below it are refused, the ring wraps from there. */
static void test_base(void **state) {
    (void)state;
    ps_changelog_t *l;
    const uint64_t base = 1000000007ull;
    assert_int_equal(ps_changelog_create(4, UINT64_MAX, &l), PC_EINVAL);
    assert_int_equal(ps_changelog_create(4, base, &l), 0);
    uint64_t keys[6] = {1, 2, 3, 4, 5, 6}, got[8], oldest, head;
    size_t n;
    ps_changelog_bounds(l, &oldest, &head);
    assert_true(oldest == base && head == base);
    assert_int_equal(ps_changelog_read(l, 0, 8, got, &n, &oldest, &head), PC_ERANGE);
    assert_int_equal(ps_changelog_read(l, base - 1, 8, got, &n, NULL, NULL), PC_ERANGE);
    assert_int_equal(ps_changelog_read(l, base, 8, got, &n, NULL, NULL), 0);
    assert_int_equal(n, 0);
    ps_changelog_append(l, keys, 3);
    assert_int_equal(ps_changelog_read(l, base + 1, 8, got, &n, NULL, &head), 0);
    assert_true(n == 2 && got[0] == 2 && got[1] == 3 && head == base + 3);
    ps_changelog_append(l, keys + 3, 3); /* base .. base + 5: the newest 4 stay */
    ps_changelog_bounds(l, &oldest, &head);
    assert_true(oldest == base + 2 && head == base + 6);
    assert_int_equal(ps_changelog_read(l, base + 1, 8, got, &n, NULL, NULL), PC_ERANGE);
    assert_int_equal(ps_changelog_read(l, base + 2, 8, got, &n, NULL, NULL), 0);
    assert_true(n == 4 && got[0] == 3 && got[3] == 6);
    ps_changelog_destroy(l);
}

/* Positions are the log's to give, so a key carries its writer and sequence number, and the
 * reader checks that each writer's keys come in order with none missing. */
enum { WRITERS = 3, BATCHES = 2000, BATCH = 7 };

static void *writer(void *arg) {
    ps_changelog_t *l = ((void **)arg)[0];
    const uint64_t w = (uint64_t)(uintptr_t)((void **)arg)[1];
    uint64_t keys[BATCH];
    for (uint64_t b = 0; b < BATCHES; b++) {
        for (uint64_t i = 0; i < BATCH; i++)
            keys[i] = w << 32 | (b * BATCH + i);
        ps_changelog_append(l, keys, BATCH);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    ps_changelog_t *l;
    assert_int_equal(ps_changelog_create(1 << 16, 0, &l), 0); /* holds everything */
    pthread_t th[WRITERS];
    void *args[WRITERS][2];
    for (int w = 0; w < WRITERS; w++) {
        args[w][0] = l;
        args[w][1] = (void *)(uintptr_t)w;
        pthread_create(&th[w], NULL, writer, args[w]);
    }
    uint64_t pos = 0, last[WRITERS] = {0}, seen = 0, buf[512];
    const uint64_t total = (uint64_t)WRITERS * BATCHES * BATCH;
    int first[WRITERS] = {1, 1, 1};
    for (int spins = 0; seen < total && spins < 10000000; spins++) {
        size_t n;
        assert_int_equal(ps_changelog_read(l, pos, 512, buf, &n, NULL, NULL), 0);
        for (size_t i = 0; i < n; i++) {
            const uint64_t w = buf[i] >> 32, s = buf[i] & 0xffffffffu;
            assert_true(w < WRITERS);
            if (!first[w])
                assert_int_equal(s, last[w] + 1); /* each writer's keys in order, none lost */
            first[w] = 0;
            last[w] = s;
        }
        pos += n;
        seen += n;
    }
    for (int w = 0; w < WRITERS; w++)
        pthread_join(th[w], NULL);
    assert_int_equal(seen, total);
    ps_changelog_destroy(l);
}

/* ---- a table's lazily started log ---- */

enum { LKEYS = 3000, LDIM = 4, PUSHERS = 2, STARTERS = 4 };

typedef struct lazy {
    ps_table_t *t;
    atomic_int stop, bad; /* bad: a thread's call failed (asserted on the main thread) */
    ps_changelog_t *got[STARTERS];
    int started[STARTERS];
    atomic_int go;
} lazy_t;

static void *pusher(void *arg) {
    lazy_t *z = ((void **)arg)[0];
    uint64_t rng = 11 + (uint64_t)(uintptr_t)((void **)arg)[1], keys[64];
    float g[64 * LDIM];
    while (!atomic_load(&z->stop)) {
        for (int i = 0; i < 64; i++)
            keys[i] = tu_rand(&rng) % LKEYS + 1;
        for (int i = 0; i < 64 * LDIM; i++)
            g[i] = tu_gauss(&rng) * 0.1f;
        if (ps_table_push(z->t, keys, 64, g, 64 * LDIM, NULL))
            atomic_store(&z->bad, 1);
    }
    return NULL;
}

static void *starter(void *arg) {
    lazy_t *z = ((void **)arg)[0];
    const int i = (int)(uintptr_t)((void **)arg)[1];
    while (!atomic_load(&z->go))
        ;
    bool started;
    if (ps_table_changelog_start(z->t, 1 << 20, &z->got[i], &started))
        atomic_store(&z->bad, 1);
    z->started[i] = started;
    return NULL;
}

static int copy_rows(void *ctx, const ps_row_view_t *rows, size_t n) {
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ps_table_load(ctx, 1, &rows[i].key, rows[i].weights, NULL, NULL, NULL), 0);
    return 0;
}

static void test_lazy_start(void **state) {
    (void)state;
    ps_table_config_t cfg;
    ps_table_config_defaults(&cfg);
    assert_int_equal(ps_table_config_parse(&cfg, "dim=4,optimizer=sgd,shards=4", NULL, 0), 0);
    lazy_t z = {0};
    ps_table_t *copy;
    assert_int_equal(ps_table_create(&cfg, &z.t), 0);
    assert_int_equal(ps_table_create(&cfg, &copy), 0);
    assert_null(ps_table_changelog(z.t));
    ps_changelog_t *l;
    assert_int_equal(ps_table_changelog_start(z.t, 0, &l, NULL), PC_EINVAL);
    pthread_t pt[PUSHERS], st[STARTERS];
    void *pa[PUSHERS][2], *sa[STARTERS][2];
    for (int i = 0; i < PUSHERS; i++) {
        pa[i][0] = &z;
        pa[i][1] = (void *)(uintptr_t)i;
        pthread_create(&pt[i], NULL, pusher, pa[i]);
    }
    for (int i = 0; i < STARTERS; i++) {
        sa[i][0] = &z;
        sa[i][1] = (void *)(uintptr_t)i;
        pthread_create(&st[i], NULL, starter, sa[i]);
    }
    usleep(20000); /* rows before the log */
    atomic_store(&z.go, 1);
    int installed = 0;
    for (int i = 0; i < STARTERS; i++)
        pthread_join(st[i], NULL);
    assert_int_equal(atomic_load(&z.bad), 0);
    for (int i = 0; i < STARTERS; i++) {
        installed += z.started[i];
        assert_ptr_equal(z.got[i], z.got[0]); /* one log, whoever won */
    }
    assert_int_equal(installed, 1);
    l = ps_table_changelog(z.t);
    assert_ptr_equal(l, z.got[0]);
    uint64_t oldest, head, buf[4096];
    ps_changelog_bounds(l, &oldest, &head);
    assert_true(oldest > 0 && head >= oldest); /* a base: position 0 is not in it */
    size_t n;
    assert_int_equal(ps_changelog_read(l, 0, 16, buf, &n, NULL, NULL), PC_ERANGE);
    /* a follower: a scan after the install, then the log from the head taken before it */
    assert_int_equal(ps_table_scan(z.t, PS_SCAN_ALL, copy_rows, copy), 0);
    usleep(20000);
    atomic_store(&z.stop, 1);
    for (int i = 0; i < PUSHERS; i++)
        pthread_join(pt[i], NULL);
    assert_int_equal(atomic_load(&z.bad), 0);
    float row[LDIM];
    uint8_t found;
    for (uint64_t pos = head;;) {
        assert_int_equal(ps_changelog_read(l, pos, 4096, buf, &n, NULL, NULL), 0);
        if (!n)
            break;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(ps_table_lookup(z.t, &buf[i], 1, row, LDIM, &found), 0);
            assert_true(found);
            assert_int_equal(ps_table_load(copy, 1, &buf[i], row, NULL, NULL, NULL), 0);
        }
        pos += n;
    }
    float a[LDIM], b[LDIM];
    uint8_t fa, fb;
    size_t present = 0;
    for (uint64_t k = 1; k <= LKEYS; k++) {
        assert_int_equal(ps_table_lookup(z.t, &k, 1, a, LDIM, &fa), 0);
        assert_int_equal(ps_table_lookup(copy, &k, 1, b, LDIM, &fb), 0);
        assert_int_equal(fa, fb);
        if (fa && memcmp(a, b, sizeof a))
            fail_msg("key %llu: the follower's row differs", (unsigned long long)k);
        present += fa;
    }
    assert_true(present > LKEYS / 2);
    ps_table_destroy(copy);
    ps_table_destroy(z.t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_positions_and_bounds),
                                       cmocka_unit_test(test_base), cmocka_unit_test(test_threads),
                                       cmocka_unit_test(test_lazy_start)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
