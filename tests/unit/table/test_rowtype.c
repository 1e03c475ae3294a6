/* Tables that store their weights in 16 bits (row_dtype bf16 / f16) against f32 tables:
 * the setting parses and formats back; initial rows are the f32 ones rounded to nearest
 * wherever they appear (pull, lookup of a missing key, ps_table_initial_row); the weights take
 * half the bytes (odd dims padded); one optimizer step of every optimizer lands on one of the two
 * 16-bit neighbours of the f32 table's result from the same row, with the optimizer state equal
 * bit for bit; many updates each far below the 16-bit spacing move the weights by their sum
 * (stochastic rounding is unbiased), where rounding to nearest would not move them at all; a
 * replay gives the same bits; rows go out and back exactly through read_state / load, scans,
 * and a snapshot's copy-on-write images. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_error.h"
#include "pc_half.h"
#include "ps_table.h"

static ps_table_t *mk(const char *spec) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char err[256] = "";
    if (ps_table_config_parse(&c, spec, err, sizeof err))
        fail_msg("spec %s: %s", spec, err);
    ps_table_t *t = NULL;
    assert_int_equal(ps_table_create(&c, &t), 0);
    return t;
}

static uint16_t enc(int dtype, float x) {
    return dtype == PS_ROW_BF16 ? pc_f32_to_bf16(x) : pc_f32_to_f16(x);
}

static float dec(int dtype, uint16_t h) {
    return dtype == PS_ROW_BF16 ? pc_bf16_to_f32(h) : pc_f16_to_f32(h);
}

static float round16(int dtype, float x) {
    return dec(dtype, enc(dtype, x));
}

/* x's two neighbours in the 16-bit type, as floats (equal when x is representable). */
static void nbrs(int dtype, float x, float *lo, float *hi) {
    const uint16_t n = enc(dtype, x);
    const float d = dec(dtype, n);
    *lo = *hi = d;
    if (d == x)
        return;
    if (fabsf(d) < fabsf(x))
        *hi = dec(dtype, (uint16_t)(n + 1));
    else
        *lo = dec(dtype, (uint16_t)(n - 1));
}

static void test_config(void **state) {
    (void)state;
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(c.row_dtype, PS_ROW_F32);
    char err[256];
    assert_int_equal(ps_table_config_parse(&c, "row_dtype=bf16", err, sizeof err), 0);
    assert_int_equal(c.row_dtype, PS_ROW_BF16);
    char buf[2048];
    ps_table_config_format(&c, buf, sizeof buf);
    assert_non_null(strstr(buf, "row_dtype=bf16"));
    ps_table_config_t back;
    ps_table_config_defaults(&back);
    assert_int_equal(ps_table_config_parse(&back, buf, err, sizeof err), 0);
    assert_int_equal(back.row_dtype, PS_ROW_BF16);
    assert_int_equal(ps_table_config_parse(&c, "row_dtype=f16", err, sizeof err), 0);
    assert_int_equal(c.row_dtype, PS_ROW_F16);
    assert_int_equal(ps_table_config_parse(&c, "row_dtype=fp8", err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, "row_dtype"));
    assert_int_equal(c.row_dtype, PS_ROW_F16); /* a refused spec changes nothing */
}

/* Initial rows, memory, and rows out and back, for one type and dim. */
static void check_rows(int dtype, int dim) {
    char spec[160];
    snprintf(spec, sizeof spec, "dim=%d,optimizer=adam,init_scale=0.5,row_dtype=%s,seed=7", dim,
             dtype == PS_ROW_BF16 ? "bf16" : "f16");
    ps_table_t *h = mk(spec);
    snprintf(spec, sizeof spec, "dim=%d,optimizer=adam,init_scale=0.5,seed=7", dim);
    ps_table_t *f = mk(spec);
    enum { N = 3000 };
    uint64_t keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 2654435761u + 11;
    const size_t len = (size_t)N * dim;
    float *a = malloc(len * 4), *b = malloc(len * 4), *c = malloc(len * 4), *init = malloc(4 * dim);
    uint8_t *found = malloc(N);
    /* Lookup of missing keys (nothing inserted), then pull (inserted): both the rounded rows. */
    assert_int_equal(ps_table_lookup(h, keys, N, c, len, found), 0);
    assert_int_equal(ps_table_pull(h, keys, N, a, len), 0);
    assert_int_equal(ps_table_pull(f, keys, N, b, len), 0);
    for (size_t i = 0; i < len; i++) {
        if (a[i] != round16(dtype, b[i]) || c[i] != a[i])
            fail_msg("dim %d element %zu: pulled %a, looked up %a, f32 %a", dim, i, (double)a[i],
                     (double)c[i], (double)b[i]);
    }
    ps_table_initial_row(h, keys[5], init);
    assert_memory_equal(init, a + 5 * dim, 4 * (size_t)dim);
    /* Half the weights' bytes, each row padded to 4 bytes. */
    ps_table_stats_t sh, sf;
    assert_int_equal(ps_table_stats(h, &sh), 0);
    assert_int_equal(ps_table_stats(f, &sf), 0);
    assert_int_equal(sh.bytes_weights, (uint64_t)N * (((size_t)dim * 2 + 3) & ~(size_t)3));
    assert_int_equal(sf.bytes_weights, (uint64_t)N * dim * 4);
    assert_int_equal(sh.bytes_state, sf.bytes_state);
    /* Train a little, then copy every row with its state into a third table: equal bits. */
    float *g = malloc(len * 4);
    for (int s = 0; s < 5; s++) {
        for (size_t i = 0; i < len; i++)
            g[i] = (float)sin((double)(i * 7 + (size_t)s * 13)) * 0.3f;
        assert_int_equal(ps_table_push(h, keys, N, g, len, NULL), 0);
    }
    const uint32_t st = dim + ps_table_state_len(h);
    float *rs = malloc((size_t)N * st * 4), *rs2 = malloc((size_t)N * st * 4);
    assert_int_equal(ps_table_read_state(h, keys, N, rs, found), 0);
    snprintf(spec, sizeof spec, "dim=%d,optimizer=adam,init_scale=0.5,row_dtype=%s,seed=99", dim,
             dtype == PS_ROW_BF16 ? "bf16" : "f16");
    ps_table_t *h2 = mk(spec);
    assert_int_equal(ps_table_load_rows_unlogged(h2, N, keys, rs), 0);
    assert_int_equal(ps_table_read_state(h2, keys, N, rs2, found), 0);
    assert_memory_equal(rs, rs2, (size_t)N * st * 4);
    for (int i = 0; i < N; i++) /* stored weights are exact 16-bit values */
        for (int e = 0; e < dim; e++)
            assert_true(rs[(size_t)i * st + e] == round16(dtype, rs[(size_t)i * st + e]));
    assert_int_equal(ps_table_pull(h, keys, N, a, len), 0);
    for (int i = 0; i < N; i++)
        assert_memory_equal(a + (size_t)i * dim, rs + (size_t)i * st, 4 * (size_t)dim);
    ps_table_destroy(h2);
    free(rs2);
    free(rs);
    free(g);
    free(found);
    free(init);
    free(c);
    free(b);
    free(a);
    ps_table_destroy(f);
    ps_table_destroy(h);
}

static void test_rows(void **state) {
    (void)state;
    static const int dims[] = {1, 8, 13, 64};
    for (int dt = PS_ROW_BF16; dt <= PS_ROW_F16; dt++)
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
            check_rows(dt, dims[i]);
}

/* One push to a 16-bit table against the same push to an f32 table holding the same rows: each
 * weight is one of the two 16-bit neighbours of the f32 result; the state is identical. */
static void test_one_step(void **state) {
    (void)state;
    static const char *const opts[] = {
        "optimizer=sgd,lr=0.1",
        "optimizer=adagrad,lr=0.05",
        "optimizer=rowwise_adagrad,lr=0.05",
        "optimizer=adam,lr=0.01",
        "optimizer=ftrl,lr=0.05,l1=0.001,l2=0.01",
        "optimizer=adagrad,lr=0.05,clip_norm=0.5,weight_decay=0.01",
    };
    enum { N = 500, D = 24 };
    uint64_t keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 977 + 3;
    static float g[N * D], w16[N * D], w32[N * D];
    for (int dt = PS_ROW_BF16; dt <= PS_ROW_F16; dt++) {
        for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
            char spec[256];
            snprintf(spec, sizeof spec, "dim=%d,init_scale=0.3,%s,row_dtype=%s", D, opts[o],
                     dt == PS_ROW_BF16 ? "bf16" : "f16");
            ps_table_t *h = mk(spec);
            snprintf(spec, sizeof spec, "dim=%d,init_scale=0.3,%s", D, opts[o]);
            ps_table_t *f = mk(spec);
            const uint32_t st = D + ps_table_state_len(h);
            float *rs = malloc((size_t)N * st * 4), *rs32 = malloc((size_t)N * st * 4);
            uint8_t found[N];
            assert_int_equal(ps_table_pull(h, keys, N, w16, N * D), 0); /* h's initial rows */
            for (int step = 0; step < 8; step++) {
                for (int i = 0; i < N * D; i++)
                    g[i] = (float)cos(i * 0.37 + step) * (step & 1 ? 0.02f : 0.7f);
                /* f takes h's rows (exact: 16-bit values are f32 values), both take the push. */
                assert_int_equal(ps_table_read_state(h, keys, N, rs, found), 0);
                assert_int_equal(ps_table_load_rows_unlogged(f, N, keys, rs), 0);
                assert_int_equal(ps_table_push(h, keys, N, g, N * D, NULL), 0);
                assert_int_equal(ps_table_push(f, keys, N, g, N * D, NULL), 0);
                assert_int_equal(ps_table_pull(h, keys, N, w16, N * D), 0);
                assert_int_equal(ps_table_pull(f, keys, N, w32, N * D), 0);
                for (int i = 0; i < N * D; i++) {
                    float lo, hi;
                    nbrs(dt, w32[i], &lo, &hi);
                    if (w16[i] != lo && w16[i] != hi)
                        fail_msg("%s step %d element %d: %a, f32 result %a (neighbours %a, %a)",
                                 spec, step, i, (double)w16[i], (double)w32[i], (double)lo,
                                 (double)hi);
                }
                assert_int_equal(ps_table_read_state(h, keys, N, rs, found), 0);
                assert_int_equal(ps_table_read_state(f, keys, N, rs32, found), 0);
                for (int i = 0; i < N; i++)
                    assert_memory_equal(rs + (size_t)i * st + D, rs32 + (size_t)i * st + D,
                                        4 * (st - D));
            }
            free(rs32);
            free(rs);
            ps_table_destroy(f);
            ps_table_destroy(h);
        }
    }
}

/* SGD updates of a tenth of the 16-bit spacing, 400 times: the weights move by the sum (within
 * the rounding noise averaged over 4096 elements), where rounding to nearest would leave every
 * one where it was. A second table fed the same pushes ends bit for bit the same. */
static void test_unbiased(void **state) {
    (void)state;
    enum { N = 64, D = 64, STEPS = 400 };
    uint64_t keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i + 100;
    static float w0[N * D], w[N * D], w2[N * D], g[N * D];
    for (int dt = PS_ROW_BF16; dt <= PS_ROW_F16; dt++) {
        const char *spec = dt == PS_ROW_BF16 ? "dim=64,optimizer=sgd,lr=1,init=zeros,row_dtype=bf16"
                                             : "dim=64,optimizer=sgd,lr=1,init=zeros,row_dtype=f16";
        ps_table_t *h = mk(spec), *h2 = mk(spec);
        for (int i = 0; i < N * D; i++)
            w0[i] = 1.0f + (float)(i % 7) * 0.125f; /* in [1, 2): spacing 2^-7 (bf16), 2^-10 */
        assert_int_equal(ps_table_load(h, N, keys, w0, NULL, NULL, NULL), 0);
        assert_int_equal(ps_table_load(h2, N, keys, w0, NULL, NULL, NULL), 0);
        const float gap = dt == PS_ROW_BF16 ? 0x1p-7f : 0x1p-10f, step = gap / 10;
        for (int i = 0; i < N * D; i++)
            g[i] = step; /* w -= lr * g */
        for (int s = 0; s < STEPS; s++) {
            assert_int_equal(ps_table_push(h, keys, N, g, N * D, NULL), 0);
            assert_int_equal(ps_table_push(h2, keys, N, g, N * D, NULL), 0);
        }
        assert_int_equal(ps_table_pull(h, keys, N, w, N * D), 0);
        assert_int_equal(ps_table_pull(h2, keys, N, w2, N * D), 0);
        assert_memory_equal(w, w2, sizeof w);
        double moved = 0;
        for (int i = 0; i < N * D; i++)
            moved += (double)w0[i] - (double)w[i];
        moved /= N * D;
        const double want = (double)STEPS * step;
        /* Each step's rounding error has sd <= gap/2, independent: the mean over 4096 elements
         * and 400 steps has sd <= gap/2 * sqrt(400 / 4096), about gap/6. */
        if (fabs(moved - want) > gap)
            fail_msg("%s: moved %.6g on average, the updates sum to %.6g", spec, moved, want);
        ps_table_destroy(h2);
        ps_table_destroy(h);
    }
}

/* A finite step past f16's range (a large, finite gradient) leaves the weight at the largest
 * finite value, not Inf: an Inf weight would stay Inf under every later step and be served. */
static void test_f16_stays_finite(void **state) {
    (void)state;
    enum { D = 16 };
    ps_table_t *h = mk("dim=16,optimizer=sgd,lr=0.05,init=zeros,row_dtype=f16");
    const uint64_t keys[2] = {1, 2};
    float g[2 * D], w[2 * D];
    for (int i = 0; i < 2 * D; i++)
        g[i] = i < D ? -2e6f : 3e7f; /* steps of +1e5 and -1.5e6 */
    for (int s = 0; s < 3; s++)
        assert_int_equal(ps_table_push(h, keys, 2, g, 2 * D, NULL), 0);
    assert_int_equal(ps_table_pull(h, keys, 2, w, 2 * D), 0);
    for (int i = 0; i < 2 * D; i++)
        assert_true(w[i] == (i < D ? 65504.f : -65504.f));
    for (int i = 0; i < 2 * D; i++)
        g[i] = i < D ? 1000.f : -1000.f; /* and it moves back (steps of 50: over a gap, 32) */
    assert_int_equal(ps_table_push(h, keys, 2, g, 2 * D, NULL), 0);
    assert_int_equal(ps_table_pull(h, keys, 2, w, 2 * D), 0);
    for (int i = 0; i < 2 * D; i++)
        assert_true(isfinite(w[i]) && fabsf(w[i]) < 65504.f);
    ps_table_destroy(h);
    /* initial values past the range (init_scale 1e5) saturate too, and FTRL with gradients of
     * zero keeps them finite (0 x Inf was NaN in its z) */
    h = mk("dim=16,optimizer=ftrl,init=uniform,init_scale=1e5,row_dtype=f16");
    assert_int_equal(ps_table_pull(h, keys, 2, w, 2 * D), 0);
    int at_edge = 0;
    for (int i = 0; i < 2 * D; i++) {
        assert_true(isfinite(w[i]) && fabsf(w[i]) <= 65504.f);
        at_edge += fabsf(w[i]) == 65504.f;
    }
    assert_true(at_edge > D / 2); /* (most of U(-1e5, 1e5) is past the range) */
    for (int i = 0; i < 2 * D; i++)
        g[i] = i % 2 ? 0.f : 0.5f;
    assert_int_equal(ps_table_push(h, keys, 2, g, 2 * D, NULL), 0);
    assert_int_equal(ps_table_pull(h, keys, 2, w, 2 * D), 0);
    for (int i = 0; i < 2 * D; i++)
        assert_true(isfinite(w[i]));
    ps_table_destroy(h);
}

typedef struct snap_ctx {
    int dim, n;
    uint64_t keys[64];
    float rows[64 * 16];
} snap_ctx_t;

static int collect(void *ctx, const ps_row_view_t *rows, size_t n) {
    snap_ctx_t *x = ctx;
    for (size_t i = 0; i < n && x->n < 64; i++) {
        x->keys[x->n] = rows[i].key;
        memcpy(x->rows + (size_t)x->n * x->dim, rows[i].weights, 4 * (size_t)x->dim);
        x->n++;
    }
    return 0;
}

/* A snapshot taken before a push sees the rows before it (copy-on-write images of 16-bit rows),
 * and a scan sees what pull gives. */
static void test_snapshot(void **state) {
    (void)state;
    ps_table_t *h = mk("dim=16,shards=2,optimizer=adagrad,lr=0.5,row_dtype=bf16");
    enum { N = 64, D = 16 };
    uint64_t keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 31 + 1;
    float before[N * D], after[N * D], g[N * D];
    assert_int_equal(ps_table_pull(h, keys, N, before, N * D), 0);
    ps_snapshot_info_t info;
    assert_int_equal(ps_table_snapshot_begin(h, false, &info), 0);
    for (int i = 0; i < N * D; i++)
        g[i] = 0.25f;
    assert_int_equal(ps_table_push(h, keys, N, g, N * D, NULL), 0);
    assert_int_equal(ps_table_pull(h, keys, N, after, N * D), 0);
    snap_ctx_t *x = calloc(1, sizeof *x);
    x->dim = D;
    assert_int_equal(ps_table_snapshot_scan(h, PS_SCAN_ALL, collect, NULL, x), 0);
    ps_table_snapshot_end(h, true);
    assert_int_equal(x->n, N);
    int changed = 0;
    for (int j = 0; j < N; j++)
        for (int i = 0; i < N; i++)
            if (x->keys[j] == keys[i]) {
                assert_memory_equal(x->rows + j * D, before + i * D, 4 * D);
                changed += memcmp(before + i * D, after + i * D, 4 * D) != 0;
            }
    assert_int_equal(changed, N);
    memset(x, 0, sizeof *x);
    x->dim = D;
    assert_int_equal(ps_table_scan(h, PS_SCAN_ALL, collect, x), 0);
    assert_int_equal(x->n, N);
    for (int j = 0; j < N; j++)
        for (int i = 0; i < N; i++)
            if (x->keys[j] == keys[i])
                assert_memory_equal(x->rows + j * D, after + i * D, 4 * D);
    free(x);
    ps_table_destroy(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),   cmocka_unit_test(test_rows),
        cmocka_unit_test(test_one_step), cmocka_unit_test(test_unbiased),
        cmocka_unit_test(test_snapshot), cmocka_unit_test(test_f16_stays_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
