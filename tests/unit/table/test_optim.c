/* Every optimizer (and clipping / weight decay) against an independent double-precision
 * reference, over random push sequences with duplicate keys; rows AND optimizer state compared.
 * The row kernels themselves ("scalar" and, where the CPU has it, "avx2") are also run one by
 * one against the reference and against each other on odd dims, with guard words around every
 * row, and their non-finite check is tried with NaN / Inf in every position. */
#include "test_util.h"

#include <stdio.h>
#include <string.h>

#include "pc_error.h"
#include "ps_optim.h"
#include "ps_table.h"

#define NKEYS 40
#define STEPS 60
#define BATCH 48
#define DMAX  72 /* widest row of these tests */

typedef struct ref_row {
    double w[DMAX], a[DMAX], b[DMAX]; /* a, b: per-optimizer state */
    double G;                         /* rowwise accumulator */
    uint32_t t;
} ref_row_t;

typedef struct ref {
    ps_table_config_t c;
    ref_row_t rows[NKEYS];
} ref_t;

static void ref_step(const ps_table_config_t *c, ref_row_t *r, const double *g_in) {
    const int d = (int)c->dim;
    double g[DMAX];
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
        float init[DMAX];
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
    static float grads[BATCH * DMAX];
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
            double g[DMAX] = {0};
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
        float w[DMAX];
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
/* Whole rows of vectors plus a tail, through the table (duplicates merged across shards). */
static void test_wide_rows(void **s) {
    (void)s;
    run_case("dim=63,optimizer=adagrad,lr=0.1,adagrad_init=0.1", 1e-5);
    run_case("dim=64,optimizer=adagrad,lr=0.1,adagrad_init=0.1,shards=4", 1e-5);
    run_case("dim=65,optimizer=adam,lr=0.01,clip_norm=2", 1e-5);
    run_case("dim=71,optimizer=ftrl,lr=0.1,l1=0.01,l2=0.1,init=zeros", 1e-4);
    run_case("dim=64,optimizer=rowwise_adagrad,lr=0.2,weight_decay=0.01", 1e-5);
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

/* ---- the row kernels one by one ------------------------------------------------------------ */

#define GUARD      8
#define GUARD_WORD 12345.0f
static const uint32_t k_dims[] = {1, 7, 8, 16, 63, 64, 65};
static const char *const k_specs[] = {
    "optimizer=sgd,lr=0.1",
    "optimizer=adagrad,lr=0.1,adagrad_init=0.1",
    "optimizer=adagrad,lr=0.3,adagrad_init=0,eps=1e-6",
    "optimizer=rowwise_adagrad,lr=0.2",
    "optimizer=adam,lr=0.01",
    "optimizer=adam,lr=0.05,beta1=0.5,beta2=0.9,eps=1e-6",
    "optimizer=ftrl,lr=0.1,ftrl_beta=1,l1=0.01,l2=0.1",
    "optimizer=ftrl,lr=0.5,ftrl_beta=0.5,l1=0,l2=0",
    "optimizer=sgd,lr=0.1,clip_value=0.3",
    "optimizer=adagrad,lr=0.1,clip_norm=0.5,weight_decay=0.01",
    "optimizer=adam,lr=0.01,clip_value=0.4,clip_norm=0.8,weight_decay=0.1",
};

/* The kernel sets this CPU runs: "scalar" always, "avx2" where supported. */
static int kernel_sets(const ps_optim_kernels_t **ks) {
    int n = 0;
    ks[n++] = ps__optim_kernels("scalar");
    assert_non_null(ks[0]);
    if ((ks[n] = ps__optim_kernels("avx2")) != NULL)
        n++;
    else
        print_message("avx2 kernels not supported by this CPU: only the scalar ones tested\n");
    assert_non_null(ps__optim_kernels(NULL));
    assert_null(ps__optim_kernels("no-such-kernels"));
    return n;
}

/* One row of weights and state with GUARD words on both sides of each. */
typedef struct krow {
    float w[GUARD + DMAX + GUARD];
    float s[GUARD + 2 * DMAX + 1 + GUARD];
} krow_t;

static void check_guards(const krow_t *r, uint32_t d, uint32_t sl, const char *what) {
    for (uint32_t i = 0; i < GUARD; i++) {
        if (r->w[i] != GUARD_WORD || r->w[GUARD + d + i] != GUARD_WORD || r->s[i] != GUARD_WORD ||
            r->s[GUARD + sl + i] != GUARD_WORD)
            fail_msg("%s: a kernel wrote outside its row", what);
    }
}

/* Run each kernel set for STEPS steps on one row per dim and spec; compare each with the
 * double reference, and the sets with each other. */
static void test_kernels_vs_reference(void **st) {
    (void)st;
    const ps_optim_kernels_t *ks[2];
    const int nk = kernel_sets(ks);
    static krow_t rows[2];
    for (size_t di = 0; di < sizeof k_dims / sizeof k_dims[0]; di++) {
        for (size_t si = 0; si < sizeof k_specs / sizeof k_specs[0]; si++) {
            const uint32_t d = k_dims[di];
            char spec[200], err[200], what[260];
            snprintf(spec, sizeof spec, "%s,dim=%u", k_specs[si], d);
            ps_table_config_t c;
            ps_table_config_defaults(&c);
            if (ps_table_config_parse(&c, spec, err, sizeof err))
                fail_msg("%s: %s", spec, err);
            ps_optim_t o[2];
            const uint32_t sl = ps__optim_state_len((ps_optim_kind_t)c.optimizer, d);
            ref_row_t ref;
            memset(&ref, 0, sizeof ref);
            uint64_t rng = 99 + d;
            for (int k = 0; k < nk; k++) {
                ps__optim_from_config(&c, &o[k]);
                o[k].k = ks[k];
                for (size_t i = 0; i < sizeof rows[k].w / sizeof(float); i++)
                    rows[k].w[i] = GUARD_WORD;
                for (size_t i = 0; i < sizeof rows[k].s / sizeof(float); i++)
                    rows[k].s[i] = GUARD_WORD;
                ps__optim_init_state(&o[k], rows[k].s + GUARD);
            }
            for (uint32_t e = 0; e < d; e++) {
                const float w0 = c.optimizer == PS_OPT_FTRL ? 0.0f : tu_gauss(&rng) * 0.1f;
                ref.w[e] = w0;
                for (int k = 0; k < nk; k++)
                    rows[k].w[GUARD + e] = w0;
                if (c.optimizer == PS_OPT_ADAGRAD)
                    ref.a[e] = (float)c.adagrad_init;
            }
            ref.G = (float)c.adagrad_init;
            for (int step = 0; step < STEPS; step++) {
                float g[DMAX];
                double gd[DMAX];
                for (uint32_t e = 0; e < d; e++) {
                    g[e] = tu_gauss(&rng) * (step % 7 == 3 ? 5.0f : 0.5f); /* some clipped */
                    gd[e] = g[e];
                }
                ref_step(&c, &ref, gd);
                for (int k = 0; k < nk; k++) {
                    assert_true(ps__grad_finite(&o[k], g));
                    ps__optim_step(&o[k], rows[k].w + GUARD, rows[k].s + GUARD, g);
                }
            }
            for (int k = 0; k < nk; k++) {
                snprintf(what, sizeof what, "%s [%s]", spec, ks[k]->name);
                check_guards(&rows[k], d, sl, what);
                const float *w = rows[k].w + GUARD, *s = rows[k].s + GUARD;
                for (uint32_t e = 0; e < d; e++)
                    TU_ASSERT_CLOSE(w[e], ref.w[e], 1e-4, 1e-6, "%s w[%u]", what, e);
                if (c.optimizer == PS_OPT_ADAGRAD)
                    for (uint32_t e = 0; e < d; e++)
                        TU_ASSERT_CLOSE(s[e], ref.a[e], 1e-4, 1e-7, "%s G[%u]", what, e);
                if (c.optimizer == PS_OPT_ROWWISE_ADAGRAD)
                    TU_ASSERT_CLOSE(s[0], ref.G, 1e-4, 1e-7, "%s G", what);
                if (c.optimizer == PS_OPT_ADAM || c.optimizer == PS_OPT_FTRL)
                    for (uint32_t e = 0; e < d; e++) {
                        TU_ASSERT_CLOSE(s[e], ref.a[e], 1e-4, 1e-6, "%s s1[%u]", what, e);
                        TU_ASSERT_CLOSE(s[d + e], ref.b[e], 1e-4, 1e-8, "%s s2[%u]", what, e);
                    }
                if (c.optimizer == PS_OPT_ADAM) {
                    uint32_t t;
                    memcpy(&t, &s[2 * d], sizeof t);
                    assert_int_equal(t, STEPS);
                }
            }
            /* The sets agree with each other closer than with the reference, except FTRL's z,
             * a running sum of terms of both signs whose relative rounding error grows. */
            const double srtol = c.optimizer == PS_OPT_FTRL ? 1e-4 : 2e-5;
            for (int k = 1; k < nk; k++) {
                for (uint32_t e = 0; e < d; e++)
                    TU_ASSERT_CLOSE(rows[k].w[GUARD + e], rows[0].w[GUARD + e], 2e-5, 1e-7,
                                    "%s: %s vs %s w[%u]", spec, ks[k]->name, ks[0]->name, e);
                for (uint32_t e = 0; e < sl; e++) {
                    if (c.optimizer == PS_OPT_ADAM && e == 2 * d) /* the step count */
                        assert_memory_equal(&rows[k].s[GUARD + e], &rows[0].s[GUARD + e], 4);
                    else
                        TU_ASSERT_CLOSE(rows[k].s[GUARD + e], rows[0].s[GUARD + e], srtol, 1e-9,
                                        "%s: %s vs %s s[%u]", spec, ks[k]->name, ks[0]->name, e);
                }
            }
        }
    }
}

/* NaN, +Inf and -Inf are found in every position of every dim (the vector body, the masked
 * tail, a single-element row); large, tiny, subnormal and signed-zero values are finite. */
static void test_kernels_nonfinite(void **st) {
    (void)st;
    const ps_optim_kernels_t *ks[2];
    const int nk = kernel_sets(ks);
    /* NaN, Inf, and magnitudes from 2^56 on (their squares overflow the accumulators) */
    const float bad[5] = {NAN, INFINITY, -INFINITY, 0x1p56f, -3.0e38f};
    for (int k = 0; k < nk; k++) {
        for (size_t di = 0; di < sizeof k_dims / sizeof k_dims[0]; di++) {
            const uint32_t d = k_dims[di];
            float g[DMAX + GUARD];
            for (uint32_t e = 0; e < d; e++)
                g[e] = (e % 4 == 0)   ? -0x1.fffffep55f /* the largest accepted */
                       : (e % 4 == 1) ? 1e-45f
                       : (e % 4 == 2) ? -0.0f
                                      : -1.5f;
            for (uint32_t e = d; e < d + GUARD; e++)
                g[e] = NAN; /* past the row: must not be looked at */
            assert_true(ks[k]->grad_finite(g, d));
            for (uint32_t p = 0; p < d; p++) {
                for (int b = 0; b < 5; b++) {
                    const float keep = g[p];
                    g[p] = bad[b];
                    if (ks[k]->grad_finite(g, d))
                        fail_msg("[%s] dim %u: %g at %u not found", ks[k]->name, d, bad[b], p);
                    g[p] = keep;
                }
            }
        }
    }
}

/* Through the table: a pushed batch whose duplicates sum to a NaN (or hold an Inf) is skipped
 * for that key only, on a row long enough to use a vector body and a masked tail. */
static void test_push_nonfinite_wide(void **st) {
    (void)st;
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, "dim=65,optimizer=adagrad,lr=0.1", NULL, 0), 0);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    const uint64_t keys[5] = {1, 2, 1, 3, 2};
    static float g[5 * 65];
    for (size_t i = 0; i < 5 * 65; i++)
        g[i] = 0.25f;
    g[0 * 65 + 64] = INFINITY; /* key 1, tail lane: 1 + (-1) would be NaN */
    g[2 * 65 + 64] = -INFINITY;
    g[1 * 65 + 3] = NAN; /* key 2, vector lane */
    float before[3 * 65], after[3 * 65];
    const uint64_t ukeys[3] = {1, 2, 3};
    assert_int_equal(ps_table_pull(t, ukeys, 3, before, 3 * 65), 0);
    ps_push_result_t r;
    assert_int_equal(ps_table_push(t, keys, 5, g, 5 * 65, &r), 0);
    assert_int_equal(r.applied, 1);
    assert_int_equal(r.skipped_nonfinite, 2);
    assert_int_equal(ps_table_pull(t, ukeys, 3, after, 3 * 65), 0);
    assert_memory_equal(before, after, 2 * 65 * sizeof(float)); /* keys 1 and 2 untouched */
    for (int e = 0; e < 65; e++)
        assert_true(after[2 * 65 + e] < before[2 * 65 + e]); /* key 3 took its step */
    ps_table_destroy(t);
}

/* Settings the hot path would hold as a division by 0, judged in float: refused (0.99999999
 * passed as a double and was 1.0f: every Adam row NaN at its first push; 1e-50 was 0). Adam's
 * step count saturates instead of wrapping to 0. */
static void test_float_settings(void **st) {
    (void)st;
    static const char *const refused[] = {
        "dim=4,optimizer=adam,beta2=0.99999999", "dim=4,optimizer=adam,eps=1e-50",
        "dim=4,optimizer=adagrad,eps=1e-50,adagrad_init=0", "dim=4,optimizer=ftrl,ftrl_beta=0,l2=0",
        "dim=4,optimizer=ftrl,ftrl_beta=1e-40,lr=1e6,l2=0"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ps_table_config_t c;
        ps_table_config_defaults(&c);
        char err[256] = "";
        if (ps_table_config_parse(&c, refused[i], err, sizeof err) == 0)
            fail_msg("%s was taken", refused[i]);
        print_message("%s: %s\n", refused[i], err);
    }
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, "dim=4,optimizer=adam,beta2=0.9999999", NULL, 0), 0);
    ps_optim_t o;
    ps__optim_from_config(&c, &o);
    float w[4] = {1, 1, 1, 1}, s[9] = {0}, g[4] = {0.5f, -0.5f, 0.25f, 0};
    const uint32_t last = UINT32_MAX;
    memcpy(&s[8], &last, sizeof last);
    ps__optim_step(&o, w, s, g);
    uint32_t t;
    memcpy(&t, &s[8], sizeof t);
    assert_true(t == UINT32_MAX);
    for (int e = 0; e < 4; e++)
        assert_true(isfinite(w[e]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_settings),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_rowwise_adagrad),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_ftrl),
        cmocka_unit_test(test_clip_and_decay),
        cmocka_unit_test(test_duplicates_one_step),
        cmocka_unit_test(test_wide_rows),
        cmocka_unit_test(test_kernels_vs_reference),
        cmocka_unit_test(test_kernels_nonfinite),
        cmocka_unit_test(test_push_nonfinite_wide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
