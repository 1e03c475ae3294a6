/* Worker dense optimizers against a double-precision reference over 200 steps of random
 * gradients (relative error below 1e-4 on every weight), and basic convergence on a quadratic. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

#include "pw_dense_optim.h"

enum { N = 64, STEPS = 200 };

static void reference(const pw_opt_config_t *c, double *w, double *s1, double *s2, uint64_t t,
                      const float *g) {
    for (int i = 0; i < N; i++) {
        const double gi = g[i];
        if (c->kind == PW_OPT_SGD) {
            w[i] -= c->lr * gi;
        } else if (c->kind == PW_OPT_ADAGRAD) {
            s1[i] += gi * gi;
            w[i] -= c->lr * gi / (sqrt(s1[i]) + c->eps);
        } else {
            s1[i] = c->beta1 * s1[i] + (1 - (double)c->beta1) * gi;
            s2[i] = c->beta2 * s2[i] + (1 - (double)c->beta2) * gi * gi;
            const double mh = s1[i] / (1 - pow(c->beta1, (double)t));
            const double vh = s2[i] / (1 - pow(c->beta2, (double)t));
            w[i] -= c->lr * mh / (sqrt(vh) + c->eps);
        }
    }
}

static void test_against_double(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) {
        pw_opt_config_t c;
        pw_opt_config_defaults(&c, (pw_opt_kind_t)k);
        pw_opt_t o;
        assert_int_equal(pw_opt_init(&o, pw_backend_cpu(), &c, N), 0);
        float w[N], g[N];
        double wd[N], s1[N] = {0}, s2[N] = {0};
        uint64_t rng = 5 + (uint64_t)k;
        for (int i = 0; i < N; i++)
            wd[i] = w[i] = tu_gauss(&rng);
        for (int t = 1; t <= STEPS; t++) {
            for (int i = 0; i < N; i++)
                g[i] = tu_gauss(&rng) * (i % 3 ? 1.0f : 0.01f);
            pw_opt_step(&o, w, g);
            reference(&c, wd, s1, s2, (uint64_t)t, g);
        }
        for (int i = 0; i < N; i++)
            TU_ASSERT_CLOSE(w[i], wd[i], 1e-4, 1e-5, "optimizer %d weight %d", k, i);
        pw_opt_free(&o);
    }
}

static void test_converges(void **state) {
    (void)state;
    /* minimize sum (w - 3)^2 from 0 */
    for (int k = 0; k < 3; k++) {
        pw_opt_config_t c;
        pw_opt_config_defaults(&c, (pw_opt_kind_t)k);
        c.lr = k == PW_OPT_ADAM ? 0.05f : k == PW_OPT_ADAGRAD ? 0.5f : 0.1f;
        pw_opt_t o;
        assert_int_equal(pw_opt_init(&o, pw_backend_cpu(), &c, 4), 0);
        float w[4] = {0}, g[4];
        for (int t = 0; t < 2000; t++) {
            for (int i = 0; i < 4; i++)
                g[i] = 2 * (w[i] - 3);
            pw_opt_step(&o, w, g);
        }
        for (int i = 0; i < 4; i++)
            TU_ASSERT_CLOSE(w[i], 3.0, 0, 1e-2, "optimizer %d", k);
        pw_opt_free(&o);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_double),
        cmocka_unit_test(test_converges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
