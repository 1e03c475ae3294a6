/* sv_version (serve/sv_version.h): a job checkpoint's step read as a serving version, and the
 * identity check that tells a load its step's directory was written again under it (a rollback
 * that reached the step again replaces the directory whole): unchanged, replaced, removed. */
#include "table_check.h"

#include "pc_error.h"
#include "pw_jobckpt.h"
#include "sv_version.h"

#include <stdio.h>
#include <stdlib.h>

static void write_step(const char *dir, uint64_t step, uint64_t server_id) {
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    assert_non_null(ck);
    ck->step = step;
    ck->nservers = 1;
    ck->servers[0] = server_id;
    assert_int_equal(pw_jobckpt_server_dir_set(ck, 0, "/srv/ckpt"), 0);
    const float state[2] = {1, 2};
    assert_int_equal(pw_jobckpt_write(dir, ck, state, 2, NULL, NULL, 3), 0);
    free(ck);
}

static void test_replaced(void **state) {
    (void)state;
    char dir[256], why[256];
    tc_tmpdir(dir, sizeof dir, "version");
    write_step(dir, 7, 100);
    sv_version_t v;
    assert_int_equal(sv_version_read(dir, 7, &v, why, sizeof why), 0);
    assert_int_equal(v.nservers, 1);
    assert_int_equal(v.ckpt_ids[0], 100);
    assert_string_equal(v.ckpt_dirs[0], "/srv/ckpt");
    assert_false(sv_version_replaced(&v)); /* nothing wrote it since */
    assert_true(sv_dir_id_same(sv_dir_id(v.dir), v.id));
    write_step(dir, 8, 101); /* another step: this one's directory is as it was */
    assert_false(sv_version_replaced(&v));
    write_step(dir, 7, 102); /* step 7 written again (a rollback): another directory */
    assert_true(sv_version_replaced(&v));
    sv_version_free(&v);
    assert_int_equal(sv_version_read(dir, 7, &v, why, sizeof why), 0);
    assert_int_equal(v.ckpt_ids[0], 102);
    assert_false(sv_version_replaced(&v));
    pw_jobckpt_abandon_after(dir, 6); /* gone (pruned by a rollback to step 6) */
    assert_true(sv_version_replaced(&v));
    sv_version_free(&v);
    assert_int_equal(sv_version_read(dir, 7, &v, why, sizeof why), PC_ENOTFOUND);
    /* an unknown identity is never the same as another, itself included */
    const sv_dir_id_t none = sv_dir_id("/nonexistent/emberps");
    assert_int_equal(none.ino, 0);
    assert_false(sv_dir_id_same(none, none));
    tc_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_replaced)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
