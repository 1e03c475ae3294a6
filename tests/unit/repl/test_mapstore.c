/* The coordinator's map store (ps_mapstore.h) on the in-process store: map versions written once
 * and found from any known one, the resharding target by compare-and-set (and over a coordinator
 * older than key revisions), and a server's run record, which tells a restarted server whether
 * it starts with the rows its last run ended with. */
#include "kv_check.h"
#include "test_util.h"

#include <string.h>

#include "pc_error.h"
#include "ps_mapstore.h"

static void test_versions(void **state) {
    (void)state;
    ps_coord_store_t st;
    assert_int_equal(ps_coord_store_memory(&st), 0);
    pc_cluster_map_t *m, *got;
    assert_int_equal(ps_mapstore_newest(&st, 0, 1, &got), 0);
    assert_null(got); /* none yet */
    const char *addrs[] = {"127.0.0.1:7000", "127.0.0.1:7001"};
    assert_int_equal(pc_cmap_create_even(1, 2, addrs, &m), 0);
    assert_int_equal(ps_mapstore_put(&st, m), 0);
    assert_int_equal(ps_mapstore_put(&st, m), PC_EEXIST); /* a version is written once */
    for (uint64_t v = 2; v <= 4; v++) {
        assert_int_equal(pc_cmap_bump(m, v), 0);
        pc_cmap_unclean_add(m, 10);
        assert_int_equal(ps_mapstore_put(&st, m), 0);
    }
    assert_int_equal(ps_mapstore_newest(&st, 2, 2, &got), 0); /* from a known version */
    assert_int_equal(pc_cmap_version(got), 4);
    assert_int_equal(pc_cmap_unclean(got), 30);
    pc_cmap_destroy(got);
    assert_int_equal(ps_mapstore_newest(&st, 0, 1, &got), 0); /* through the hint */
    assert_int_equal(pc_cmap_version(got), 4);
    pc_cmap_destroy(got);
    /* a guess ahead of the store (a server configured with version 9): the store's newest, not
     * "none" (the server wrote its own at 9 then, and versions 5-8 never were) */
    assert_int_equal(ps_mapstore_newest(&st, 0, 9, &got), 0);
    assert_non_null(got);
    assert_int_equal(pc_cmap_version(got), 4);
    pc_cmap_destroy(got);
    assert_int_equal(ps_mapstore_get(&st, 5, &got), PC_ENOTFOUND);
    pc_cmap_unclean_add(m, UINT64_MAX); /* the count saturates */
    assert_true(pc_cmap_unclean(m) == UINT64_MAX);
    pc_cmap_destroy(m);
    st.destroy(st.ctx);
}

/* Start a run from checkpoint `restored`: whether it went back, and the record before. */
static bool begin(ps_coord_store_t *st, const char *addr, uint64_t restored, char *last) {
    bool back = true;
    assert_int_equal(ps_mapstore_run_read(st, addr, restored, &back, last, 64), 0);
    assert_int_equal(ps_mapstore_run_start(st, addr), 0);
    return back;
}

/* The resharding target is replaced by compare-and-set: two operators' psctl planning from the
 * same target (here none, then the first's) cannot both write, so neither plan is lost: the
 * second plans again from the first's (the last plain write won, and psctl said the loser's
 * server had its slots). The store's compare-and-set itself: kc_cas_check. */
static void test_target_cas(void **state) {
    (void)state;
    ps_coord_store_t st;
    assert_int_equal(ps_coord_store_memory(&st), 0);
    kc_cas_check(&st, "job/cas");
    const char *addrs[] = {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"};
    pc_cluster_map_t *m, *a, *b, *got;
    assert_int_equal(pc_cmap_create_even(1, 3, addrs, &m), 0);
    uint64_t rev_a = 1, rev_b = 1;
    assert_int_equal(ps_mapstore_get_target(&st, &got, &rev_a), PC_ENOTFOUND);
    assert_int_equal(ps_mapstore_get_target(&st, &got, &rev_b), PC_ENOTFOUND);
    assert_true(rev_a == 0 && rev_b == 0);
    assert_int_equal(pc_cmap_plan_remove(m, 1, &a), 0); /* operator A */
    assert_int_equal(pc_cmap_plan_remove(m, 2, &b), 0); /* operator B, from the same base */
    assert_int_equal(ps_mapstore_put_target(&st, a, rev_a), 0);
    assert_int_equal(ps_mapstore_put_target(&st, b, rev_b), PC_EEXIST);
    pc_cmap_destroy(b);
    assert_int_equal(ps_mapstore_get_target(&st, &got, &rev_b), 0); /* B again, from A's */
    assert_true(rev_b > 0 && pc_cmap_roles_same(got, a));
    assert_int_equal(pc_cmap_plan_remove(got, 2, &b), 0);
    pc_cmap_destroy(got);
    assert_int_equal(ps_mapstore_put_target(&st, b, rev_b), 0);
    assert_int_equal(ps_mapstore_put_target(&st, a, rev_a), PC_EEXIST); /* A's stale read */
    assert_int_equal(ps_mapstore_get_target(&st, &got, NULL), 0);
    assert_int_equal(pc_cmap_server_slots(got, 0), PC_NSLOTS); /* both plans in it */
    pc_cmap_destroy(got);
    pc_cmap_destroy(a);
    pc_cmap_destroy(b);
    pc_cmap_destroy(m);
    st.destroy(st.ctx);
}

/* A coordinator older than key revisions (a ps-server before them): its KvGet carries none, so
 * a target it holds reads as PS_MAPSTORE_UNVERSIONED and is written over; before, the
 * compare-and-set at revision 0 (absent) never matched and psctl reshard planned again until it
 * said "the target kept changing". */
static ps_coord_store_t g_inner;

static int norev_get_rev(void *ctx, const char *key, void **value, size_t *len, uint64_t *rev) {
    (void)ctx;
    const int rc = g_inner.get_rev(g_inner.ctx, key, value, len, rev);
    if (rev)
        *rev = 0;
    return rc;
}

static void test_target_unversioned(void **state) {
    (void)state;
    assert_int_equal(ps_coord_store_memory(&g_inner), 0);
    ps_coord_store_t st = g_inner;
    st.get_rev = norev_get_rev;
    const char *addrs[] = {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"};
    pc_cluster_map_t *m, *a, *b, *got;
    assert_int_equal(pc_cmap_create_even(1, 3, addrs, &m), 0);
    uint64_t rev = 1;
    assert_int_equal(ps_mapstore_get_target(&st, &got, &rev), PC_ENOTFOUND);
    assert_true(rev == 0);
    assert_int_equal(pc_cmap_plan_remove(m, 1, &a), 0);
    assert_int_equal(ps_mapstore_put_target(&st, a, rev), 0); /* if absent, as before */
    assert_int_equal(ps_mapstore_get_target(&st, &got, &rev), 0);
    assert_true(rev == PS_MAPSTORE_UNVERSIONED);
    assert_int_equal(pc_cmap_plan_remove(got, 2, &b), 0);
    pc_cmap_destroy(got);
    assert_int_equal(ps_mapstore_put_target(&st, b, rev), 0);
    assert_int_equal(ps_mapstore_get_target(&st, &got, NULL), 0);
    assert_int_equal(pc_cmap_server_slots(got, 0), PC_NSLOTS);
    pc_cmap_destroy(got);
    pc_cmap_destroy(a);
    pc_cmap_destroy(b);
    pc_cmap_destroy(m);
    g_inner.destroy(g_inner.ctx);
}

static void test_run_record(void **state) {
    (void)state;
    ps_coord_store_t st;
    assert_int_equal(ps_coord_store_memory(&st), 0);
    const char *a = "127.0.0.1:7000", *b = "127.0.0.1:7001";
    char last[64];
    assert_false(begin(&st, a, 0, last)); /* a first start: nothing to go back from */
    assert_string_equal(last, "none");
    assert_true(begin(&st, a, 0, last)); /* the run before never stopped: a crash */
    assert_string_equal(last, "running");
    assert_false(begin(&st, b, 3, last)); /* records are per server */
    assert_int_equal(ps_mapstore_run_end(&st, a, true, 7), 0);
    assert_false(begin(&st, a, 7, last)); /* stopped with checkpoint 7's rows, started from it */
    assert_string_equal(last, "stopped checkpoint=7");
    assert_int_equal(ps_mapstore_run_end(&st, a, true, 7), 0);
    assert_true(begin(&st, a, 6, last)); /* an older checkpoint */
    assert_int_equal(ps_mapstore_run_end(&st, a, true, 7), 0);
    assert_true(begin(&st, a, 0, last)); /* the checkpoints lost (another disk) */
    assert_int_equal(ps_mapstore_run_end(&st, a, false, 0), 0);
    assert_true(begin(&st, a, 0, last)); /* stopped with rows in no checkpoint */
    assert_string_equal(last, "stopped");
    assert_int_equal(ps_mapstore_run_end(&st, a, true, 70), 0);
    assert_true(begin(&st, a, 7, last)); /* 70 is not 7 */
    /* a start that failed puts back what it found: a crash before it is still seen */
    assert_int_equal(ps_mapstore_run_restore(&st, a, "running"), 0);
    assert_true(begin(&st, a, 7, last));
    assert_int_equal(ps_mapstore_run_end(&st, a, true, 0), 0); /* empty tables, never served */
    assert_false(begin(&st, a, 0, last));
    pc_kv_entry_t *e;
    size_t n;
    assert_int_equal(ps_mapstore_runs(&st, &e, &n), 0); /* psctl runs: by address */
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_true(!strcmp(e[i].key, a) || !strcmp(e[i].key, b));
        assert_string_equal((const char *)e[i].value, "running");
    }
    pc_kv_entries_free(e, n);
    st.destroy(st.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_target_cas),
        cmocka_unit_test(test_target_unversioned),
        cmocka_unit_test(test_run_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
