/* FM against double precision: the logits equal the explicit pairwise sum (no identity), and
 * every row gradient matches central finite differences of the double reference. */
#include "test_util.h"

#include <math.h>

#include "pw_fm.h"

enum { B = 3, NF = 5, K = 4, W = K + 1 };

static double ref_logit(const double *r) { /* explicit O(F^2 k) pairwise sum */
    double z = 0;
    for (int f = 0; f < NF; f++) {
        z += r[f * W];
        for (int g = f + 1; g < NF; g++)
            for (int j = 0; j < K; j++)
                z += r[f * W + 1 + j] * r[g * W + 1 + j];
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
    pw_fm_forward(B, NF, K, rows, logits);
    pw_fm_backward(B, NF, K, rows, dl, drows);
    for (int s = 0; s < B; s++) {
        double r[NF * W];
        for (int i = 0; i < NF * W; i++)
            r[i] = rows[s * NF * W + i];
        TU_ASSERT_CLOSE(logits[s], base[s] + ref_logit(r), 1e-5, 1e-5, "logit %d", s);
        for (int i = 0; i < NF * W; i++) { /* d(dl * logit)/d row */
            const double save = r[i], eps = 1e-6;
            r[i] = save + eps;
            const double up = ref_logit(r);
            r[i] = save - eps;
            const double down = ref_logit(r);
            r[i] = save;
            TU_ASSERT_CLOSE(drows[s * NF * W + i], dl[s] * (up - down) / (2 * eps), 2e-3, 2e-5,
                            "sample %d row value %d", s, i);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
