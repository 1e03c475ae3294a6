/* Initializers: deterministic in (seed, key) whatever the table layout; right distributions. */
#include "test_util.h"

#include <string.h>

#include "ps_table.h"

static ps_table_t *make(const char *spec) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char err[200];
    if (ps_table_config_parse(&c, spec, err, sizeof err))
        fail_msg("%s: %s", spec, err);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    return t;
}

static void test_determinism(void **state) {
    (void)state;
    const char *kinds[] = {"uniform", "normal", "trunc_normal", "zeros"};
    for (int k = 0; k < 4; k++) {
        char s1[128], s2[128], s3[128];
        snprintf(s1, sizeof s1, "dim=13,seed=7,init=%s,init_scale=0.5,shards=1", kinds[k]);
        snprintf(s2, sizeof s2, "dim=13,seed=7,init=%s,init_scale=0.5,shards=256,optimizer=adam",
                 kinds[k]);
        snprintf(s3, sizeof s3, "dim=13,seed=8,init=%s,init_scale=0.5", kinds[k]);
        ps_table_t *a = make(s1), *b = make(s2), *c = make(s3);
        uint64_t keys[100];
        uint64_t rng = 99;
        for (int i = 0; i < 100; i++)
            keys[i] = tu_rand(&rng);
        float ra[100 * 13], rb[100 * 13], rc[100 * 13], rl[100 * 13];
        assert_int_equal(ps_table_pull(a, keys, 100, ra, 1300), 0);
        assert_int_equal(ps_table_pull(b, keys, 100, rb, 1300), 0);
        assert_int_equal(ps_table_lookup(c, keys, 100, rc, 1300, NULL), 0);
        assert_memory_equal(ra, rb, sizeof ra); /* same (seed, key) -> same row */
        if (k == 3)
            for (int i = 0; i < 1300; i++)
                assert_true(ra[i] == 0.0f);
        else
            assert_memory_not_equal(ra, rc, sizeof ra); /* other seed -> other rows */
        /* pulling again (now present) and lookup give the same row */
        assert_int_equal(ps_table_lookup(a, keys, 100, rl, 1300, NULL), 0);
        assert_memory_equal(ra, rl, sizeof ra);
        ps_table_initial_row(a, keys[5], rl);
        assert_memory_equal(rl, ra + 5 * 13, 13 * sizeof(float));
        ps_table_destroy(a);
        ps_table_destroy(b);
        ps_table_destroy(c);
    }
}

static void moments(const char *spec, double *mean, double *var, double *maxabs) {
    ps_table_t *t = make(spec);
    enum { N = 4000, D = 16 };
    static float rows[N * D];
    static uint64_t keys[N];
    for (uint64_t i = 0; i < N; i++)
        keys[i] = i; /* sequential keys must still give independent rows */
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N * D, NULL), 0);
    double s = 0, s2 = 0, m = 0;
    for (int i = 0; i < N * D; i++) {
        s += rows[i];
        s2 += (double)rows[i] * rows[i];
        if (fabs(rows[i]) > m)
            m = fabs(rows[i]);
    }
    *mean = s / (N * D);
    *var = s2 / (N * D) - *mean * *mean;
    *maxabs = m;
    /* neighbouring keys are not correlated */
    double c = 0;
    for (int i = 0; i + 1 < N; i++)
        c += (double)rows[i * D] * rows[(i + 1) * D];
    c /= (N - 1) * *var;
    assert_true(fabs(c) < 0.06);
    ps_table_destroy(t);
}

static void test_distributions(void **state) {
    (void)state;
    double mean, var, mx;
    moments("dim=16,init=uniform,init_scale=0.3", &mean, &var, &mx);
    TU_ASSERT_CLOSE(mean, 0, 0, 0.005, "uniform mean");
    TU_ASSERT_CLOSE(var, 0.09 / 3, 0.03, 0, "uniform var");
    assert_true(mx <= 0.3);
    moments("dim=16,init=normal,init_scale=0.2", &mean, &var, &mx);
    TU_ASSERT_CLOSE(mean, 0, 0, 0.005, "normal mean");
    TU_ASSERT_CLOSE(var, 0.04, 0.03, 0, "normal var");
    assert_true(mx > 0.5); /* tails exist beyond 2.5 sigma in 64k draws */
    moments("dim=16,init=trunc_normal,init_scale=0.2", &mean, &var, &mx);
    TU_ASSERT_CLOSE(mean, 0, 0, 0.005, "trunc mean");
    TU_ASSERT_CLOSE(var, 0.04 * 0.7737, 0.03, 0, "trunc var"); /* var of N(0,1) cut at +-2 */
    assert_true(mx <= 0.4 + 1e-6);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_determinism),
                                       cmocka_unit_test(test_distributions)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
