/* Out of memory at every allocation: a sequence of table operations (push with inserts and
 * duplicates, pull of new keys, erase, load, snapshot) is replayed with the i-th allocation
 * failing, for i = 0, 1, 2, ... until the sequence completes without reaching the failure.
 * Each time: every call returns 0 or PC_ENOMEM, the table stays consistent (scan, count and
 * lookups agree), rows no call touched are bit-identical to before, and the table works again
 * once memory is back. (Allocation failure injection: pc_mem_fail_after.) */
#include "table_check.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"
#include "ps_table.h"

enum { BASE = 3000, DIM = 4 };

static uint64_t base_key(int i) {
    return 0x5000000ULL + (uint64_t)i * 7;
}

static const char *BASE_SPEC = "dim=4,optimizer=adam,shards=4";

/* The base rows: one push of BASE keys. */
static void fill_base(ps_table_t *t) {
    static uint64_t keys[BASE];
    static float g[BASE * DIM];
    for (int i = 0; i < BASE; i++)
        keys[i] = base_key(i);
    for (int i = 0; i < BASE * DIM; i++)
        g[i] = 0.01f * (float)(i % 17);
    assert_int_equal(ps_table_push(t, keys, BASE, g, BASE * DIM, NULL), 0);
}

static ps_table_t *make_base(void) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, BASE_SPEC, NULL, 0), 0);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    fill_base(t);
    return t;
}

static int g_failed_calls; /* calls that reported PC_ENOMEM, over all replays */

static int ok_or_oom(int rc) {
    g_failed_calls += rc == PC_ENOMEM;
    return rc == 0 || rc == PC_ENOMEM;
}

static int count_rows(void *ctx, const ps_row_view_t *r, size_t n) {
    (void)r;
    *(size_t *)ctx += n;
    return 0;
}

/* The operations; keys base_key(0..999) are touched, base_key(1000..) never are. */
static void run_ops(ps_table_t *t) {
    static uint64_t keys[1200];
    static float g[1200 * DIM], rows[1200 * DIM];
    for (int i = 0; i < 600; i++) /* 300 existing, 300 new, with duplicates */
        keys[i] = i < 300 ? base_key(i % 250) : 0x9000000ULL + (uint64_t)(i % 280);
    for (int i = 0; i < 600 * DIM; i++)
        g[i] = 0.5f;
    assert_true(ok_or_oom(ps_table_push(t, keys, 600, g, 600 * DIM, NULL)));
    for (int i = 0; i < 1200; i++)
        keys[i] = 0xA000000ULL + (uint64_t)i; /* new keys: inserts, index and slab growth */
    assert_true(ok_or_oom(ps_table_pull(t, keys, 1200, rows, 1200 * DIM)));
    for (int i = 0; i < 200; i++)
        keys[i] = base_key(300 + i);
    assert_true(ok_or_oom(ps_table_erase(t, keys, 200, NULL)));
    for (int i = 0; i < 300; i++)
        keys[i] = i < 150 ? base_key(500 + i) : 0xB000000ULL + (uint64_t)i;
    assert_true(ok_or_oom(ps_table_load(t, 300, keys, g, NULL, NULL, NULL)));
    ps_snapshot_info_t info;
    int rc = ps_table_snapshot_begin(t, true, &info);
    assert_true(ok_or_oom(rc));
    if (rc == 0) { /* a push while the snapshot copies: copy-on-write under the same failure */
        assert_true(ok_or_oom(ps_table_push(t, keys, 150, g, 150 * DIM, NULL)));
        size_t n = 0;
        assert_true(ok_or_oom(ps_table_snapshot_scan(t, PS_SCAN_ALL, count_rows, NULL, &n)));
        ps_table_snapshot_end(t, false);
    }
}

static void test_every_allocation_failure(void **state) {
    (void)state;
    ps_table_t *ref = make_base();
    tc_rows_t before;
    tc_dump(ref, &before);
    int iterations = 0;
    for (long i = 0;; i++) {
        ps_table_t *t = make_base();
        pc_mem_fail_after(i);
        run_ops(t);
        const long left = pc_mem_fail_remaining(); /* > 0: the failure was never reached */
        pc_mem_fail_after(-1);
        /* Consistency: scan, count and lookups agree. */
        tc_rows_t now;
        tc_dump(t, &now);
        assert_int_equal(now.n, ps_table_count(t));
        for (size_t r = 0; r < now.n; r++) {
            float w[DIM];
            uint8_t found;
            assert_int_equal(ps_table_lookup(t, &now.keys[r], 1, w, DIM, &found), 0);
            assert_int_equal(found, 1);
            assert_memory_equal(w, now.vals + r * now.width, sizeof w);
        }
        /* Rows no call touched (base keys 1000..) are exactly as before. */
        size_t j = 0;
        for (size_t r = 0; r < before.n; r++) {
            uint64_t k = before.keys[r];
            if (k < base_key(1000))
                continue;
            while (j < now.n && now.keys[j] < k)
                j++;
            assert_true(j < now.n && now.keys[j] == k);
            assert_memory_equal(now.vals + j * now.width, before.vals + r * before.width,
                                before.width * sizeof(float));
            assert_int_equal(now.tick[j], before.tick[r]);
        }
        tc_free(&now);
        /* Works again with memory back. */
        uint64_t k = 0xC000000ULL;
        float g[DIM] = {1, 1, 1, 1}, w[DIM];
        assert_int_equal(ps_table_push(t, &k, 1, g, DIM, NULL), 0);
        assert_int_equal(ps_table_pull(t, &k, 1, w, DIM), 0);
        ps_table_destroy(t);
        iterations++;
        if (left > 0)
            break; /* the whole sequence ran without meeting the failure */
        assert_true(i < 20000);
    }
    print_message("%d allocation failure points replayed, %d calls reported PC_ENOMEM\n",
                  iterations, g_failed_calls);
    assert_true(g_failed_calls >= iterations - 1); /* each replay but the last met a failure */
    tc_free(&before);
    ps_table_destroy(ref);
}

/* Same weights and optimizer state for the same keys (ticks may differ: cuts advance clocks). */
static void assert_same_rows(const ps_table_t *a, const ps_table_t *b) {
    tc_rows_t x, y;
    tc_dump(a, &x);
    tc_dump(b, &y);
    assert_int_equal(x.n, y.n);
    assert_memory_equal(x.keys, y.keys, x.n * sizeof *x.keys);
    assert_memory_equal(x.vals, y.vals, x.n * x.width * sizeof(float));
    tc_free(&x);
    tc_free(&y);
}

static ps_table_t *table_in(ps_catalog_t *cat, const char *name) {
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, name, &t), 0);
    ps_catalog_release(cat, t);
    return t;
}

/* Checkpoint write and restore with the i-th allocation failing, for every i they reach. */
static void test_checkpoint_allocation_failures(void **state) {
    (void)state;
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "oom");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_t *old = make_base(); /* the state of checkpoint 1 */
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, BASE_SPEC, NULL, 0), 0);
    snprintf(c.name, sizeof c.name, "live");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_table_t *live = table_in(cat, "live");
    fill_base(live);
    uint64_t keys[10];
    for (int i = 0; i < 10; i++)
        keys[i] = base_key(i);
    assert_int_equal(ps_table_erase(live, keys, 10, NULL), 0);
    assert_int_equal(ps_table_erase(old, keys, 10, NULL), 0);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 3, .full_every = 2};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    assert_int_equal(ps_ckpt_write(ck, NULL), 0);
    tc_round(live, 1); /* the new state, to be checkpointed under failures */
    ps_table_t *now = make_base();
    assert_int_equal(ps_table_erase(now, keys, 10, NULL), 0);
    tc_round(now, 1);
    int published = 0, points = 0;
    for (long i = 0;; i++, points++) {
        pc_mem_fail_after(i);
        int rc = ps_ckpt_write(ck, NULL);
        const long left = pc_mem_fail_remaining();
        pc_mem_fail_after(-1);
        assert_true(rc == 0 || rc == PC_ENOMEM);
        published |= rc == 0;
        assert_same_rows(live, now); /* a checkpoint never changes the tables */
        ps_catalog_t *c2;
        ps_ckpt_t *ck2;
        assert_int_equal(ps_catalog_create(&c2), 0);
        assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
        assert_int_equal(ps_ckpt_restore(ck2, 0, NULL), 0);
        assert_same_rows(table_in(c2, "live"), published ? now : old);
        ps_ckpt_destroy(ck2);
        ps_catalog_destroy(c2);
        if (left > 0)
            break;
        assert_true(i < 20000);
    }
    for (long i = 0;; i++, points++) { /* restore: all or nothing */
        ps_catalog_t *c2;
        ps_ckpt_t *ck2;
        assert_int_equal(ps_catalog_create(&c2), 0);
        assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
        pc_mem_fail_after(i);
        int rc = ps_ckpt_restore(ck2, 0, NULL);
        const long left = pc_mem_fail_remaining();
        pc_mem_fail_after(-1);
        assert_true(rc == 0 || rc == PC_ENOMEM);
        char names[2][PS_TABLE_NAME_MAX];
        if (rc == 0)
            assert_same_rows(table_in(c2, "live"), now);
        else
            assert_int_equal(ps_catalog_list(c2, names, 2), 0); /* nothing half-installed */
        ps_ckpt_destroy(ck2);
        ps_catalog_destroy(c2);
        if (left > 0)
            break;
        assert_true(i < 20000);
    }
    print_message("%d allocation failure points in checkpoint write and restore\n", points);
    ps_table_destroy(now);
    ps_table_destroy(old);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    tc_rmdir(dir);
}

/* A shard's first insert with the i-th allocation failing (its row slab taken, its key records
 * not, among others): the insert fails, and once memory is back the shard takes it, and the
 * table's memory is all given back when it is destroyed (a failed first slab was left mapped
 * with a size of 0: every later insert into the shard failed, and it leaked). */
static void test_first_insert_failures(void **state) {
    (void)state;
    const uint64_t rows0 = pc_mem_used(PC_MEM_ROWS), keys0 = pc_mem_used(PC_MEM_KEYS);
    float g[DIM] = {0.5f, 0.5f, 0.5f, 0.5f}, row[DIM];
    for (long i = 0; i < 16; i++) {
        ps_table_config_t c;
        ps_table_config_defaults(&c);
        assert_int_equal(ps_table_config_parse(&c, "dim=4,optimizer=adagrad,shards=1", NULL, 0), 0);
        ps_table_t *t;
        assert_int_equal(ps_table_create(&c, &t), 0);
        const uint64_t key = 42;
        pc_mem_fail_after(i);
        const int rc = ps_table_push(t, &key, 1, g, DIM, NULL);
        pc_mem_fail_after(-1);
        assert_true(ok_or_oom(rc));
        if (rc)
            assert_int_equal(ps_table_push(t, &key, 1, g, DIM, NULL), 0);
        assert_int_equal(ps_table_count(t), 1);
        assert_int_equal(ps_table_pull(t, &key, 1, row, DIM), 0);
        ps_table_destroy(t);
        assert_int_equal(pc_mem_used(PC_MEM_ROWS), rows0);
        assert_int_equal(pc_mem_used(PC_MEM_KEYS), keys0);
    }
}

/* A shard's slab grown (17 rows into 16) and shrunk (most of 2000 rows erased) with the i-th
 * allocation failing: the rows stay whole, and the table's memory is all given back when it is
 * destroyed (with the key records' resize failing, and then the rows' undoing resize too, each
 * mapping was recorded at the other's size: the larger one's tail was never unmapped and its
 * bytes stayed counted). */
static void test_resize_failures(void **state) {
    (void)state;
    const uint64_t rows0 = pc_mem_used(PC_MEM_ROWS), keys0 = pc_mem_used(PC_MEM_KEYS);
    enum { N = 2000 };
    static uint64_t keys[N];
    static float g[N * DIM], rows[N * DIM];
    for (int k = 0; k < N; k++)
        keys[k] = 1000 + (uint64_t)k;
    for (int k = 0; k < N * DIM; k++)
        g[k] = 0.5f;
    for (int shrink = 0; shrink < 2; shrink++)
        for (long i = 0; i < 12; i++) {
            ps_table_config_t c;
            ps_table_config_defaults(&c);
            assert_int_equal(ps_table_config_parse(&c, "dim=4,optimizer=adagrad,shards=1", NULL, 0),
                             0);
            ps_table_t *t;
            assert_int_equal(ps_table_create(&c, &t), 0);
            const size_t have = shrink ? N : 16, keep = shrink ? 200 : 17;
            assert_int_equal(ps_table_push(t, keys, have, g, have * DIM, NULL), 0);
            pc_mem_fail_after(i);
            const int rc = shrink ? ps_table_erase(t, keys + keep, N - keep, NULL)
                                  : ps_table_push(t, keys + 16, 1, g, DIM, NULL);
            pc_mem_fail_after(-1);
            assert_true(ok_or_oom(rc));
            if (rc)
                assert_int_equal(shrink ? ps_table_erase(t, keys + keep, N - keep, NULL)
                                        : ps_table_push(t, keys + 16, 1, g, DIM, NULL),
                                 0);
            assert_int_equal(ps_table_count(t), keep);
            assert_int_equal(ps_table_pull(t, keys, keep, rows, keep * DIM), 0);
            ps_table_destroy(t);
            assert_int_equal(pc_mem_used(PC_MEM_ROWS), rows0);
            assert_int_equal(pc_mem_used(PC_MEM_KEYS), keys0);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_allocation_failure),
                                       cmocka_unit_test(test_checkpoint_allocation_failures),
                                       cmocka_unit_test(test_first_insert_failures),
                                       cmocka_unit_test(test_resize_failures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
