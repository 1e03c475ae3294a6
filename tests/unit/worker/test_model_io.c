/* Dense model files: a round trip is bit-exact; a wrong shape is PC_EDIM; a flipped byte, a
 * truncated file or a foreign file is PC_ECORRUPT and leaves the model untouched; a model with a
 * NaN or infinite weight is neither written nor loaded (PC_ERANGE). */
#include "table_check.h"

#include <math.h>

#include "pc_error.h"
#include "pc_hash.h"
#include "pw_model_io.h"

static void test_roundtrip_and_damage(void **state) {
    (void)state;
    char dir[256], path[300];
    tc_tmpdir(dir, sizeof dir, "dense");
    snprintf(path, sizeof path, "%s/model.dense", dir);
    pw_linear_t a[2], b[2], c[1];
    assert_int_equal(pw_linear_init(&a[0], pw_backend_cpu(), 5, 4, 1), 0);
    assert_int_equal(pw_linear_init(&a[1], pw_backend_cpu(), 4, 1, 2), 0);
    assert_int_equal(pw_linear_init(&b[0], pw_backend_cpu(), 5, 4, 3), 0);
    assert_int_equal(pw_linear_init(&b[1], pw_backend_cpu(), 4, 1, 4), 0);
    assert_int_equal(pw_linear_init(&c[0], pw_backend_cpu(), 5, 4, 5), 0);
    a[0].b[2] = 0.75f;
    assert_int_equal(pw_dense_save(path, a, 2), 0);
    assert_int_equal(pw_dense_load(path, b, 2), 0);
    for (int i = 0; i < 2; i++) {
        assert_memory_equal(a[i].w, b[i].w, (size_t)a[i].in * a[i].out * sizeof(float));
        assert_memory_equal(a[i].b, b[i].b, (size_t)a[i].out * sizeof(float));
    }
    assert_int_equal(pw_dense_load(path, c, 1), PC_EDIM);
    /* a damaged header (a shape) is damage, not another model: the checksum is checked first */
    FILE *hf = fopen(path, "r+b");
    fseek(hf, 16, SEEK_SET);
    fputc(9, hf); /* layer 0's `in`: 5 -> 9 */
    fclose(hf);
    assert_int_equal(pw_dense_load(path, b, 2), PC_ECORRUPT);
    assert_int_equal(pw_dense_save(path, a, 2), 0);
    /* damage: flip a weight byte; the model must stay as it was */
    FILE *f = fopen(path, "r+b");
    fseek(f, 40, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 40, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
    const float before = b[0].w[0];
    b[0].w[0] = 123.0f;
    assert_int_equal(pw_dense_load(path, b, 2), PC_ECORRUPT);
    assert_true(b[0].w[0] == 123.0f);
    b[0].w[0] = before;
    assert_int_equal(pw_dense_save(path, a, 2), 0);
    assert_int_equal(truncate(path, 30), 0);
    assert_int_equal(pw_dense_load(path, b, 2), PC_ECORRUPT);
    f = fopen(path, "wb");
    fputs("not a model file at all", f);
    fclose(f);
    assert_int_equal(pw_dense_load(path, b, 2), PC_ECORRUPT);
    assert_int_equal(pw_dense_load("/nonexistent/x", b, 2), PC_ENOTFOUND);
    for (int i = 0; i < 2; i++) {
        pw_linear_free(&a[i]);
        pw_linear_free(&b[i]);
    }
    pw_linear_free(&c[0]);
    tc_rmdir(dir);
}

/* The state file: a round trip; another count is PC_EDIM, a damaged count PC_ECORRUPT. */
static void test_state_file(void **state) {
    (void)state;
    char dir[256], path[300];
    tc_tmpdir(dir, sizeof dir, "state");
    snprintf(path, sizeof path, "%s/dense.state", dir);
    const float v[5] = {1, 2, 3, 4, 5};
    float got[5] = {0}, more[6];
    assert_int_equal(pw_state_save(path, v, 5), 0);
    assert_int_equal(pw_state_load(path, got, 5), 0);
    assert_memory_equal(got, v, sizeof v);
    assert_int_equal(pw_state_load(path, more, 6), PC_EDIM);
    FILE *f = fopen(path, "r+b");
    fseek(f, 8, SEEK_SET);
    fputc(6, f); /* the count: 5 -> 6 */
    fclose(f);
    assert_int_equal(pw_state_load(path, more, 6), PC_ECORRUPT);
    assert_int_equal(pw_state_load(path, got, 5), PC_ECORRUPT);
    assert_int_equal(pw_state_load("/nonexistent/x", got, 5), PC_ENOTFOUND);
    tc_rmdir(dir);
}

static void test_not_finite(void **state) {
    (void)state;
    char dir[256], path[300];
    tc_tmpdir(dir, sizeof dir, "dense");
    snprintf(path, sizeof path, "%s/model.dense", dir);
    pw_linear_t a, b;
    assert_int_equal(pw_linear_init(&a, pw_backend_cpu(), 3, 2, 1), 0);
    assert_int_equal(pw_linear_init(&b, pw_backend_cpu(), 3, 2, 2), 0);
    assert_int_equal(pw_dense_save(path, &a, 1), 0);
    const float good = a.w[4];
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        a.w[4] = bad[k];
        uint8_t *img;
        size_t size;
        assert_int_equal(pw_dense_image(&a, 1, &img, &size), PC_ERANGE);
        assert_int_equal(pw_dense_save(path, &a, 1), PC_ERANGE);
        assert_int_equal(pw_dense_load(path, &b, 1), 0); /* the file written before stays */
        assert_true(b.w[4] == good);
    }
    a.b[1] = NAN;
    a.w[4] = good;
    assert_int_equal(pw_dense_save(path, &a, 1), PC_ERANGE); /* biases too */
    /* a file with a NaN weight and a right checksum (written by something else): refused */
    a.b[1] = 0.5f;
    uint8_t *img;
    size_t size;
    assert_int_equal(pw_dense_image(&a, 1, &img, &size), 0);
    const float nan = NAN;
    memcpy(img + 16 + 8 + 2 * sizeof(float), &nan, sizeof nan);
    const uint64_t h = pc_hash64(img, size - 8, 0);
    memcpy(img + size - 8, &h, 8);
    FILE *f = fopen(path, "wb");
    assert_int_equal(fwrite(img, 1, size, f), size);
    fclose(f);
    free(img);
    b.w[0] = 7.0f;
    assert_int_equal(pw_dense_load(path, &b, 1), PC_ERANGE);
    assert_true(b.w[0] == 7.0f); /* untouched */
    pw_linear_free(&a);
    pw_linear_free(&b);
    tc_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_roundtrip_and_damage),
                                       cmocka_unit_test(test_state_file),
                                       cmocka_unit_test(test_not_finite)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
