/* FM and DeepFM. FM against double precision: the logits equal the explicit pairwise sum over
 * features with values (no identity), and every row gradient matches central finite differences of
 * the double reference. Samples have different feature counts (one has none). */
#include "test_util.h"

#include <math.h>

#include "pc_error.h"
#include "pw_deepfm.h"
#include "pw_backend.h"

#include <string.h>

enum { B = 3, NF = 5, K = 4, W = K + 1 };

static const size_t k_off[B + 1] = {0, NF, NF, 2 * NF}; /* sample 1 has no features */

static double ref_logit(const double *r, const float *x, int nf) { /* explicit pairwise sum */
    double z = 0;
    for (int f = 0; f < nf; f++) {
        z += r[f * W] * x[f];
        for (int g = f + 1; g < nf; g++)
            for (int j = 0; j < K; j++)
                z += r[f * W + 1 + j] * x[f] * r[g * W + 1 + j] * x[g];
    }
    return z;
}

static void test_fm(void **state) {
    (void)state;
    uint64_t rng = 2;
    float rows[B * NF * W], logits[B] = {0.5f, 0, -0.5f}, dl[B], drows[B * NF * W];
    for (int i = 0; i < B * NF * W; i++)
        rows[i] = tu_gauss(&rng) * 0.5f;
    for (int s = 0; s < B; s++)
        dl[s] = tu_gauss(&rng);
    const float base[B] = {0.5f, 0, -0.5f};
    float x[B * NF];
    for (int i = 0; i < B * NF; i++)
        x[i] = i % 3 == 0 ? 1.0f : 0.3f + 0.4f * (float)(i % 4); /* one-hot and weighted */
    pw_backend_t *be = pw_backend_cpu();
    be->fm(be, B, k_off, x, K, rows, logits);
    be->fm_grad(be, B, k_off, x, K, rows, dl, drows);
    for (int s = 0; s < B; s++) {
        const int nf = (int)(k_off[s + 1] - k_off[s]), o = (int)k_off[s];
        double r[NF * W];
        for (int i = 0; i < nf * W; i++)
            r[i] = rows[o * W + i];
        TU_ASSERT_CLOSE(logits[s], base[s] + ref_logit(r, x + o, nf), 1e-5, 1e-5, "logit %d", s);
        for (int i = 0; i < nf * W; i++) { /* d(dl * logit)/d row */
            const double save = r[i], eps = 1e-6;
            r[i] = save + eps;
            const double up = ref_logit(r, x + o, nf);
            r[i] = save - eps;
            const double down = ref_logit(r, x + o, nf);
            r[i] = save;
            TU_ASSERT_CLOSE(drows[o * W + i], dl[s] * (up - down) / (2 * eps), 2e-3, 2e-5,
                            "sample %d row value %d", s, i);
        }
    }
}

/* DeepFM: its FM part is checked above; here the whole model (FM + pooled MLP over shared rows)
 * against central finite differences of its own forward, for every row value and MLP weight,
 * with sum and mean pooling and multi-valued fields; bad configurations refused. */
enum { DB = 3, DND = 2, DNF = 3, DK = 3, DW = DK + 1, DNK = 8 };
static const size_t d_off[DB + 1] = {0, 3, 5, DNK};
static const uint16_t d_field[DNK] = {0, 1, 2, 1, 1, 0, 2, 2}; /* sample 1: two of field 1 */
static const float d_val[DNK] = {1, 1, 1, 0.5f, 2, 1, 1, -0.5f};

static double deepfm_obj(pw_deepfm_t *m, const float *dense, const float *rows, const float *dl) {
    float lg[DB];
    assert_int_equal(pw_deepfm_forward(m, DB, dense, d_off, d_field, d_val, rows, lg), 0);
    double o = 0;
    for (int s = 0; s < DB; s++)
        o += (double)dl[s] * lg[s];
    return o;
}

static void deepfm_check(bool mean) {
    pw_deepfm_config_t c = {.ndense = DND,
                            .nfields = DNF,
                            .k = DK,
                            .nlayers = 2,
                            .widths = {5, 1},
                            .mean = mean,
                            .max_batch = DB,
                            .seed = 3};
    pw_deepfm_t *m;
    assert_int_equal(pw_deepfm_create(&c, pw_backend_cpu(), &m), 0);
    int nl;
    pw_linear_t *l = pw_deepfm_layers(m, &nl);
    assert_int_equal(nl, 2);
    uint64_t rng = 4;
    float dense[DB * DND], rows[DNK * DW], dl[DB], drows[DNK * DW], lg[DB];
    for (int i = 0; i < DB * DND; i++)
        dense[i] = tu_gauss(&rng);
    for (int i = 0; i < DNK * DW; i++)
        rows[i] = tu_gauss(&rng) * 0.5f;
    for (int s = 0; s < DB; s++)
        dl[s] = tu_gauss(&rng);
    for (int i = 0; i < 5; i++)
        l[0].b[i] = 0.2f; /* keep the ReLUs away from their kink */
    assert_int_equal(pw_deepfm_forward(m, DB, dense, d_off, d_field, d_val, rows, lg), 0);
    for (int i = 0; i < nl; i++)
        pw_linear_zero_grad(&l[i]);
    assert_int_equal(pw_deepfm_backward(m, dl, drows), 0);
    float dw0[5 * (DND + DNF * DK)];
    memcpy(dw0, l[0].dw, sizeof dw0);
    const float eps = 1e-3f;
    for (int i = 0; i < DNK * DW; i++) {
        const float save = rows[i];
        rows[i] = save + eps;
        const double up = deepfm_obj(m, dense, rows, dl);
        rows[i] = save - eps;
        const double down = deepfm_obj(m, dense, rows, dl);
        rows[i] = save;
        TU_ASSERT_CLOSE(drows[i], (up - down) / (2 * eps), 2e-2, 2e-3, "mean %d row value %d", mean,
                        i);
    }
    for (int i = 0; i < 5 * (DND + DNF * DK); i++) {
        const float save = l[0].w[i];
        l[0].w[i] = save + eps;
        const double up = deepfm_obj(m, dense, rows, dl);
        l[0].w[i] = save - eps;
        const double down = deepfm_obj(m, dense, rows, dl);
        l[0].w[i] = save;
        TU_ASSERT_CLOSE(dw0[i], (up - down) / (2 * eps), 2e-2, 2e-3, "mean %d W0[%d]", mean, i);
    }
    pw_deepfm_destroy(m);
}

static void test_deepfm(void **state) {
    (void)state;
    deepfm_check(false);
    deepfm_check(true);
    pw_deepfm_config_t c = {
        .ndense = DND, .nfields = DNF, .k = DK, .nlayers = 2, .widths = {5, 2}, .max_batch = DB};
    pw_deepfm_t *m;
    assert_int_equal(pw_deepfm_create(&c, pw_backend_cpu(), &m), PC_EINVAL); /* last width 2 */
    c.widths[1] = 1;
    c.nfields = 0;
    assert_int_equal(pw_deepfm_create(&c, pw_backend_cpu(), &m), PC_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fm), cmocka_unit_test(test_deepfm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
