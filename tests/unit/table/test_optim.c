/* Every optimizer (and clipping / weight decay) against an independent double-precision
 * reference, over random push sequences with duplicate keys; rows AND optimizer state compared. */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"
#include "ps_table.h"

#define NKEYS 40
#define STEPS 60
#define BATCH 48

typedef struct ref_row {
    double w[64], a[64], b[64]; /* a, b: per-optimizer state */
    double G;                   /* rowwise accumulator */
    uint32_t t;
} ref_row_t;

typedef struct ref {
    ps_table_config_t c;
    ref_row_t rows[NKEYS];
} ref_t;

static void ref_step(const ps_table_config_t *c, ref_row_t *r, const double *g_in) {
    const int d = (int)c->dim;
    double g[64];
    memcpy(g, g_in, sizeof(double) * (size_t)d);
    if (c->clip_value > 0)
        for (int i = 0; i < d; i++)
            g[i] = fmax(-c->clip_value, fmin(c->clip_value, g[i]));
    if (c->clip_norm > 0) {
        double sq = 0;
        for (int i = 0; i < d; i++)
            sq += g[i] * g[i];
        if (sqrt(sq) > c->clip_norm)
            for (int i = 0; i < d; i++)
                g[i] *= c->clip_norm / sqrt(sq);
    }
    for (int i = 0; i < d; i++)
        g[i] += c->weight_decay * r->w[i];
    switch ((ps_optim_kind_t)c->optimizer) {
        case PS_OPT_SGD:
            for (int i = 0; i < d; i++)
                r->w[i] -= c->lr * g[i];
            break;
        case PS_OPT_ADAGRAD:
            for (int i = 0; i < d; i++) {
                r->a[i] += g[i] * g[i];
                r->w[i] -= c->lr * g[i] / (sqrt(r->a[i]) + c->eps);
            }
            break;
        case PS_OPT_ROWWISE_ADAGRAD: {
            double sq = 0;
            for (int i = 0; i < d; i++)
                sq += g[i] * g[i];
            r->G += sq / d;
            for (int i = 0; i < d; i++)
                r->w[i] -= c->lr * g[i] / (sqrt(r->G) + c->eps);
            break;
        }
        case PS_OPT_ADAM:
            r->t++;
            for (int i = 0; i < d; i++) {
                r->a[i] = c->beta1 * r->a[i] + (1 - c->beta1) * g[i];
                r->b[i] = c->beta2 * r->b[i] + (1 - c->beta2) * g[i] * g[i];
                double mh = r->a[i] / (1 - pow(c->beta1, r->t));
                double vh = r->b[i] / (1 - pow(c->beta2, r->t));
                r->w[i] -= c->lr * mh / (sqrt(vh) + c->eps);
            }
            break;
        case PS_OPT_FTRL:
            for (int i = 0; i < d; i++) { /* a = z, b = n */
                double n2 = r->b[i] + g[i] * g[i];
                double sigma = (sqrt(n2) - sqrt(r->b[i])) / c->lr;
                r->a[i] += g[i] - sigma * r->w[i];
                r->b[i] = n2;
                double z = r->a[i];
                r->w[i] = fabs(z) <= c->l1 ? 0.0
                                           : -(z - (z < 0 ? -1 : 1) * c->l1) /
                                                 ((c->ftrl_beta + sqrt(n2)) / c->lr + c->l2);
            }
            break;
    }
}

typedef struct cmp_ctx {
    const ref_t *ref;
    uint64_t keys[NKEYS];
    int seen[NKEYS];
    double rtol;  /* weights */
    double srtol; /* optimizer state: float accumulators drift more than the weights */
    const char *label;
} cmp_ctx_t;

static int cmp_scan(void *vctx, const ps_row_view_t *rows, size_t n) {
    cmp_ctx_t *x = vctx;
    const ps_table_config_t *c = &x->ref->c;
    const int d = (int)c->dim;
    for (size_t i = 0; i < n; i++) {
        int k = -1;
        for (int j = 0; j < NKEYS; j++)
            if (x->keys[j] == rows[i].key)
                k = j;
        assert_true(k >= 0);
        x->seen[k]++;
        const ref_row_t *r = &x->ref->rows[k];
        for (int e = 0; e < d; e++)
            TU_ASSERT_CLOSE(rows[i].weights[e], r->w[e], x->rtol, 1e-6, "%s w key %d el %d",
                            x->label, k, e);
        const float *s = rows[i].state;
        switch ((ps_optim_kind_t)c->optimizer) {
            case PS_OPT_SGD:
                assert_null(s);
                break;
            case PS_OPT_ADAGRAD:
                for (int e = 0; e < d; e++)
                    TU_ASSERT_CLOSE(s[e], r->a[e], x->srtol, 1e-7, "%s G", x->label);
                break;
            case PS_OPT_ROWWISE_ADAGRAD:
                TU_ASSERT_CLOSE(s[0], r->G, x->srtol, 1e-7, "%s rowwise G", x->label);
                break;
            case PS_OPT_ADAM: {
                uint32_t t;
                memcpy(&t, &s[2 * d], 4);
                assert_int_equal(t, r->t);
                for (int e = 0; e < d; e++) {
                    TU_ASSERT_CLOSE(s[e], r->a[e], x->srtol, 1e-7, "%s m", x->label);
                    TU_ASSERT_CLOSE(s[d + e], r->b[e], x->srtol, 1e-9, "%s v", x->label);
                }
                break;
            }
            case PS_OPT_FTRL:
                for (int e = 0; e < d; e++) {
                    TU_ASSERT_CLOSE(s[e], r->a[e], x->srtol, 1e-6, "%s z", x->label);
                    TU_ASSERT_CLOSE(s[d + e], r->b[e], x->srtol, 1e-7, "%s n", x->label);
                }
                break;
        }
    }
    return 0;
}

/* Run STEPS random batches (with duplicates) through a table and the reference. */
static void run_case(const char *spec, double rtol) {
    static ref_t ref;
    memset(&ref, 0, sizeof ref);
    ps_table_config_defaults(&ref.c);
    char err[200];
    if (ps_table_config_parse(&ref.c, spec, err, sizeof err))
        fail_msg("spec %s: %s", spec, err);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&ref.c, &t), 0);
    const int d = (int)ref.c.dim;
    cmp_ctx_t cx = {.ref = &ref, .rtol = rtol, .srtol = 10 * rtol, .label = spec};
    uint64_t rng = 1234;
    for (int k = 0; k < NKEYS; k++) {
        cx.keys[k] = tu_rand(&rng);
        float init[64];
        ps_table_initial_row(t, cx.keys[k], init);
        for (int e = 0; e < d; e++)
            ref.rows[k].w[e] = init[e];
        if (ref.c.optimizer == PS_OPT_ADAGRAD)
            for (int e = 0; e < d; e++)
                ref.rows[k].a[e] = (float)ref.c.adagrad_init;
        ref.rows[k].G = (float)ref.c.adagrad_init;
    }
    uint64_t keys[BATCH];
    int kidx[BATCH], pushed[NKEYS] = {0};
    static float grads[BATCH * 64];
    for (int step = 0; step < STEPS; step++) {
        int nb = 1 + (int)(tu_rand(&rng) % BATCH);
        for (int i = 0; i < nb; i++) {
            kidx[i] = (int)(tu_rand(&rng) % (NKEYS / 2 + step % (NKEYS / 2))); /* many dups */
            keys[i] = cx.keys[kidx[i]];
            pushed[kidx[i]] = 1;
            for (int e = 0; e < d; e++)
                grads[i * d + e] = tu_gauss(&rng) * 0.5f;
        }
        ps_push_result_t res;
        assert_int_equal(ps_table_push(t, keys, (size_t)nb, grads, (size_t)nb * d, &res), 0);
        /* Reference: sum duplicates (in double), then one step per distinct key. */
        int distinct = 0;
        for (int k = 0; k < NKEYS; k++) {
            double g[64] = {0};
            int hit = 0;
            for (int i = 0; i < nb; i++) {
                if (kidx[i] != k)
                    continue;
                hit = 1;
                for (int e = 0; e < d; e++)
                    g[e] += grads[i * d + e];
            }
            if (hit) {
                ref_step(&ref.c, &ref.rows[k], g);
                distinct++;
            }
        }
        assert_int_equal(res.applied, distinct);
    }
    assert_int_equal(ps_table_scan(t, PS_SCAN_ALL, cmp_scan, &cx), 0);
    /* pull agrees with the scan (for keys ever pushed) */
    for (int k = 0; k < NKEYS; k++) {
        assert_int_equal(cx.seen[k], pushed[k]); /* every pushed row exists, exactly once */
        if (!cx.seen[k])
            continue;
        float w[64];
        assert_int_equal(ps_table_lookup(t, &cx.keys[k], 1, w, (size_t)d, NULL), 0);
        for (int e = 0; e < d; e++)
            TU_ASSERT_CLOSE(w[e], ref.rows[k].w[e], rtol, 1e-6, "%s lookup", spec);
    }
    ps_table_destroy(t);
}

static void test_sgd(void **s) {
    (void)s;
    run_case("dim=8,optimizer=sgd,lr=0.1", 1e-5);
    run_case("dim=33,optimizer=sgd,lr=0.05,shards=1", 1e-5);
}
static void test_adagrad(void **s) {
    (void)s;
    run_case("dim=8,optimizer=adagrad,lr=0.1,adagrad_init=0.1", 1e-5);
    run_case("dim=17,optimizer=adagrad,lr=0.3,adagrad_init=0,eps=1e-6", 1e-5);
}
static void test_rowwise_adagrad(void **s) {
    (void)s;
    run_case("dim=16,optimizer=rowwise_adagrad,lr=0.2", 1e-5);
}
static void test_adam(void **s) {
    (void)s;
    run_case("dim=8,optimizer=adam,lr=0.01", 1e-5);
    run_case("dim=31,optimizer=adam,lr=0.05,beta1=0.5,beta2=0.9,eps=1e-6", 1e-5);
}
static void test_ftrl(void **s) {
    (void)s;
    run_case("dim=8,optimizer=ftrl,lr=0.1,ftrl_beta=1,l1=0.01,l2=0.1,init=zeros", 1e-4);
    run_case("dim=12,optimizer=ftrl,lr=0.5,ftrl_beta=0.5,l1=0,l2=0", 1e-4);
}
static void test_clip_and_decay(void **s) {
    (void)s;
    run_case("dim=8,optimizer=sgd,lr=0.1,clip_value=0.3", 1e-5);
    run_case("dim=8,optimizer=adagrad,lr=0.1,clip_norm=0.5,weight_decay=0.01", 1e-5);
    run_case("dim=10,optimizer=adam,lr=0.01,clip_value=0.4,clip_norm=0.8,weight_decay=0.1", 1e-5);
}

/* One push of [k, k] with g1, g2 equals one push of [k] with g1 + g2 (one step, not two). */
static void test_duplicates_one_step(void **s) {
    (void)s;
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, "dim=4,optimizer=adam,lr=0.1", NULL, 0), 0);
    ps_table_t *a, *b;
    assert_int_equal(ps_table_create(&c, &a), 0);
    assert_int_equal(ps_table_create(&c, &b), 0);
    uint64_t kk[2] = {77, 77};
    float g2[8] = {0.5f, -1, 2, 0.25f, 0.5f, 1, -1, 0.25f}, g1[4] = {1, 0, 1, 0.5f};
    ps_push_result_t r;
    assert_int_equal(ps_table_push(a, kk, 2, g2, 8, &r), 0);
    assert_int_equal(r.applied, 1);
    assert_int_equal(ps_table_push(b, kk, 1, g1, 4, &r), 0);
    float wa[4], wb[4];
    assert_int_equal(ps_table_pull(a, kk, 1, wa, 4), 0);
    assert_int_equal(ps_table_pull(b, kk, 1, wb, 4), 0);
    assert_memory_equal(wa, wb, sizeof wa);
    ps_table_destroy(a);
    ps_table_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_rowwise_adagrad),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_ftrl),
        cmocka_unit_test(test_clip_and_decay),
        cmocka_unit_test(test_duplicates_one_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
