/* Disk full: checkpoints into a 3 MiB tmpfs. A checkpoint that does not fit fails with
 * PC_ENOSPC and publishes nothing; the process and its tables keep working; the previous
 * checkpoint still restores bit for bit; once space is back, checkpoints succeed again.
 * Needs root (mount); reports SKIPPED otherwise. */
#include "table_check.h"

#include <sys/mount.h>
#include <sys/stat.h>

#include "pc_error.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"

static char g_mnt[256];

static int setup(void **state) {
    (void)state;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_mnt[0]) {
        umount(g_mnt);
        rmdir(g_mnt);
    }
    return 0;
}

static void test_checkpoint_on_full_disk(void **state) {
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ckpt", g_mnt);
    const char *spec = "name=full,dim=32,optimizer=adagrad,shards=4";
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, spec, NULL, 0), 0);
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "full", &t), 0);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 2, .full_every = 1};
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);

    tc_round(t, 1); /* ~300 rows: a few hundred KiB */
    ps_ckpt_result_t r;
    assert_int_equal(ps_ckpt_write(ck, &r), 0);
    assert_int_equal(r.id, 1);

    /* Grow the table past the disk: 20k rows of 268 bytes = 5.4 MB. */
    enum { N = 20000 };
    static uint64_t keys[N];
    static float rows[N * 32];
    for (int i = 0; i < N; i++)
        keys[i] = 1000000 + (uint64_t)i;
    assert_int_equal(ps_table_pull(t, keys, N, rows, N * 32), 0);
    assert_int_equal(ps_ckpt_write(ck, &r), PC_ENOSPC);

    /* Nothing published, no leftovers, the table still serves and trains. */
    ps_ckpt_entry_t e[4];
    size_t n;
    assert_int_equal(ps_ckpt_list(dir, e, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ps_table_pull(t, keys, 100, rows, 100 * 32), 0);
    assert_int_equal(ps_table_push(t, keys, 100, rows, 100 * 32, NULL), 0);

    /* The previous checkpoint restores exactly (rounds 1 with its cut). */
    ps_catalog_t *c2;
    ps_ckpt_t *ck2;
    assert_int_equal(ps_catalog_create(&c2), 0);
    assert_int_equal(ps_ckpt_create(c2, &o, &ck2), 0);
    uint64_t got;
    assert_int_equal(ps_ckpt_restore(ck2, 0, &got), 0);
    assert_int_equal(got, 1);
    ps_table_t *ref, *restored;
    assert_int_equal(ps_table_create(&c, &ref), 0);
    tc_round(ref, 1);
    assert_int_equal(ps_table_advance_clock(ref, 1), 0);
    assert_int_equal(ps_catalog_acquire(c2, "full", &restored), 0);
    tc_assert_equal(restored, ref);
    ps_catalog_release(c2, restored);
    ps_table_destroy(ref);

    /* Space back (the big rows erased): checkpoints succeed again. */
    assert_int_equal(ps_table_erase(t, keys, N, NULL), 0);
    assert_int_equal(ps_ckpt_write(ck, &r), 0);
    assert_int_equal(r.id, 2); /* the failed attempt left nothing behind, not even its id */
    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(c2);
    ps_ckpt_destroy(ck);
    ps_catalog_release(cat, t);
    ps_catalog_destroy(cat);
}

int main(void) {
    tc_tmpdir(g_mnt, sizeof g_mnt, "diskfull");
    if (mount("tmpfs", g_mnt, "tmpfs", 0, "size=3m") != 0) {
        rmdir(g_mnt);
        printf("SKIPPED: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)\n");
        return 77; /* ctest SKIP_RETURN_CODE */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_checkpoint_on_full_disk, setup, teardown)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
