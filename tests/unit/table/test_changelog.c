/* The change log of the delta stream (ps_changelog.h): positions, the ring's bounds (wrapping,
 * appends larger than the ring), PC_ERANGE outside them, and writers and readers on several
 * threads (run under TSan): every key a reader copies sits at its position. */
#include "test_util.h"

#include "pc_error.h"
#include "ps_changelog.h"

#include <pthread.h>

static void test_positions_and_bounds(void **state) {
    (void)state;
    ps_changelog_t *l;
    assert_int_equal(ps_changelog_create(0, &l), PC_EINVAL);
    assert_int_equal(ps_changelog_create(10, &l), 0);
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
    assert_int_equal(ps_changelog_create(1 << 16, &l), 0); /* holds everything */
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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_positions_and_bounds),
                                       cmocka_unit_test(test_threads)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
