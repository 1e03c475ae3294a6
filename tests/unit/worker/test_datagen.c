/* Metrics and the data generator: exact AUC against brute-force pair counting (with ties),
 * logloss; the generator is deterministic, writes lines the Criteo parser accepts, hits its
 * positive rate, and its oracle is better with the planted interactions than without. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_error.h"
#include "pc_hash.h"
#include "pw_datagen.h"
#include "pw_metrics.h"
#include "pw_parse.h"

static double auc_brute(const float *s, const float *y, size_t n) {
    double good = 0, pairs = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (y[i] > 0.5f && y[j] < 0.5f) {
                pairs++;
                good += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
            }
    return good / pairs;
}

static void test_auc_logloss(void **state) {
    (void)state;
    enum { N = 600 };
    float s[N], y[N];
    uint64_t rng = 9;
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) {
            y[i] = (float)(tu_rand(&rng) % 3 == 0);
            s[i] = (float)(tu_rand(&rng) % 40) / 40.0f + y[i] * 0.1f; /* many ties */
        }
        const double a = pw_auc(s, y, N), b = auc_brute(s, y, N);
        assert_true(fabs(a - b) < 1e-12);
    }
    const float perfect[4] = {0.1f, 0.2f, 0.8f, 0.9f}, lab[4] = {0, 0, 1, 1};
    assert_true(pw_auc(perfect, lab, 4) == 1.0);
    const float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    assert_true(pw_auc(flat, lab, 4) == 0.5);
    const float ones[4] = {1, 1, 1, 1};
    assert_true(isnan(pw_auc(perfect, ones, 4)));      /* no negatives */
    const float with_nan[4] = {0.1f, NAN, 0.8f, 0.9f}; /* a diverged model's score: NaN, at once */
    assert_true(isnan(pw_auc(with_nan, lab, 4)));      /* (it never returned: the tie loop stood) */
    assert_true(fabs(pw_logloss(flat, lab, 4) - log(2.0)) < 1e-7);
    const float extreme[2] = {0.0f, 1.0f}, wrong[2] = {1, 0};
    assert_true(isfinite(pw_logloss(extreme, wrong, 2))); /* clamped */
}

static uint64_t hash_file(FILE *f, size_t *lines) {
    rewind(f);
    char buf[1024];
    uint64_t h = 0;
    *lines = 0;
    while (fgets(buf, sizeof buf, f)) {
        h = pc_hash64(buf, strlen(buf), h);
        (*lines)++;
    }
    return h;
}

static void test_datagen(void **state) {
    (void)state;
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = 20000;
    o.test_rows = 20000;
    o.vocab_max = 100000;
    FILE *a = tmpfile(), *b = tmpfile(), *t = tmpfile();
    pw_datagen_result_t ra, rb;
    assert_int_equal(pw_datagen_run(&o, a, t, &ra), 0);
    assert_int_equal(pw_datagen_run(&o, b, NULL, &rb), 0);
    size_t la, lb;
    assert_true(hash_file(a, &la) == hash_file(b, &lb)); /* deterministic */
    assert_int_equal(la, o.rows);
    assert_true(fabs(ra.train_positive - o.positive_rate) < 0.02);
    assert_true(ra.oracle_auc == rb.oracle_auc);
    /* Every line parses; the row function gives the same lines. */
    pw_datagen_t *gen;
    assert_int_equal(pw_datagen_create(&o, &gen), 0);
    assert_true(pw_datagen_bias(gen) == ra.bias);
    rewind(a);
    char line[1024], again[1024];
    pw_sample_t s;
    for (uint64_t r = 0; fgets(line, sizeof line, a); r++) {
        char err[128];
        if (pw_parse_line(PW_FMT_CRITEO, NULL, line, strlen(line), &s, err, sizeof err))
            fail_msg("line %llu: %s", (unsigned long long)r, err);
        if (r < 50) {
            size_t n = pw_datagen_row(gen, 0, r, again, NULL);
            assert_int_equal(n, strlen(line));
            assert_memory_equal(again, line, n);
        }
    }
    pw_datagen_destroy(gen);
    /* Another seed gives other data; no interactions give a weaker oracle. */
    pw_datagen_opts_t o2 = o;
    o2.seed = 2;
    FILE *c = tmpfile();
    pw_datagen_result_t rc2;
    assert_int_equal(pw_datagen_run(&o2, c, NULL, &rc2), 0);
    size_t lc;
    assert_true(hash_file(c, &lc) != hash_file(a, &la));
    pw_datagen_opts_t o3 = o;
    o3.interaction = 0;
    pw_datagen_result_t r3;
    assert_int_equal(pw_datagen_run(&o3, NULL, NULL, &r3), 0);
    print_message("oracle AUC %.4f with interactions, %.4f without\n", ra.oracle_auc,
                  r3.oracle_auc);
    assert_true(ra.oracle_auc > r3.oracle_auc + 0.03);
    assert_true(r3.oracle_auc > 0.6);
    /* Restricted oracles: with 100k-value vocabularies and 20k rows many test values are unseen,
     * so leaving their effects out costs AUC, more when 5 sightings are required; with 20-value
     * vocabularies every value is seen often and the restricted oracle is the oracle. */
    print_message("oracle AUC %.4f, seen >= 1: %.4f, seen >= 5: %.4f\n", ra.oracle_auc,
                  ra.oracle_seen_auc, ra.oracle_seen5_auc);
    assert_true(ra.oracle_seen_auc < ra.oracle_auc - 0.005);
    assert_true(ra.oracle_seen5_auc < ra.oracle_seen_auc);
    pw_datagen_opts_t o4 = o;
    o4.vocab_max = 20;
    pw_datagen_result_t r4;
    assert_int_equal(pw_datagen_run(&o4, NULL, NULL, &r4), 0);
    assert_true(r4.oracle_seen_auc == r4.oracle_auc && r4.oracle_seen5_auc == r4.oracle_auc);
    /* interactions of spread past 30 and a rare positive: the bias is found outside [-30, 30]
     * (its search stopped at -30 there, and about 0.3 of the rows came out positive) */
    pw_datagen_opts_t o5 = o;
    o5.interaction = 100;
    o5.positive_rate = 0.01;
    pw_datagen_result_t r5;
    assert_int_equal(pw_datagen_run(&o5, NULL, NULL, &r5), 0);
    print_message("interaction 100, positive rate 0.01: bias %.2f, %.4f positive\n", r5.bias,
                  r5.train_positive);
    assert_true(fabs(r5.train_positive - 0.01) < 0.01);
    pw_datagen_opts_t bad = o;
    bad.positive_rate = 1.5;
    assert_int_equal(pw_datagen_run(&bad, NULL, NULL, NULL), PC_EINVAL);
    fclose(a);
    fclose(b);
    fclose(c);
    fclose(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auc_logloss),
        cmocka_unit_test(test_datagen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
