/* The training step (pw_step.h) on cpu:checked (device memory unreadable outside backend calls:
 * the step keeps the memory rule) against double precision:
 *  - FM: loss, every unique row's gradient (duplicate keys summed, scaled) and the dense
 *    gradient against an explicit double reference; the dense optimizer (SGD) applied in
 *    pw_step_finish moves the weights by exactly -lr * gradient;
 *  - DLRM: every unique row's gradient against central differences of the loss computed in double
 *    from pw_step_eval's probabilities (the model's own pooling included);
 *  - the two buffer sets: a batch staged into set 1 while set 0's step runs gives the same
 *    gradients as the same batch run alone;
 *  - pw_unique, and batches that do not fit the model (dense width, field range) refused. */
#include "test_util.h"

#include <math.h>
#include <string.h>

#include "pc_error.h"
#include "pw_backend.h"
#include "pw_step.h"

enum { N = 4, FEAT = 3, NK = N * FEAT, ND = 2 };

/* A batch of N samples, FEAT features each (fields 0..FEAT-1), keys with duplicates (key j % 5),
 * weighted values, dense values. */
typedef struct batch {
    pw_batch_t b;
    float labels[N], dense[N * ND], vals[NK];
    uint64_t keys[NK], ukeys[NK];
    uint16_t fields[NK];
    size_t off[N + 1];
    uint32_t inv[NK];
    size_t nu;
} batch_t;

static void batch_make(batch_t *t, uint64_t seed, int nd) {
    uint64_t rng = seed;
    memset(t, 0, sizeof *t);
    for (int s = 0; s < N; s++) {
        t->labels[s] = (float)(s % 2);
        for (int j = 0; j < nd; j++)
            t->dense[s * nd + j] = tu_gauss(&rng);
        t->off[s] = (size_t)s * FEAT;
    }
    t->off[N] = NK;
    for (int j = 0; j < NK; j++) {
        t->keys[j] = 100 + (uint64_t)((j * 7) % 5); /* duplicates within and across samples */
        t->fields[j] = (uint16_t)(j % FEAT);
        t->vals[j] = j % 2 ? 1.0f : 0.5f + 0.25f * (float)(j % 3);
    }
    t->b = (pw_batch_t){.n = N,
                        .ndense = (size_t)nd,
                        .labels = t->labels,
                        .dense = t->dense,
                        .keys = t->keys,
                        .fields = t->fields,
                        .vals = t->vals,
                        .key_off = t->off};
    pw_unique_t u = {0};
    assert_int_equal(pw_unique(&u, t->keys, NK, t->ukeys, t->inv, &t->nu), 0);
    pw_unique_free(&u);
}

static void test_unique(void **state) {
    (void)state;
    batch_t t;
    batch_make(&t, 1, ND);
    assert_int_equal(t.nu, 5);
    for (size_t j = 0; j < NK; j++) /* each feature points at its own key, first-seen order */
        assert_true(t.ukeys[t.inv[j]] == t.keys[j]);
    assert_true(t.ukeys[0] == t.keys[0] && t.inv[0] == 0);
}

/* pw_unique_index and pw_unique_find_many against a linear search: sets and query batches of
 * sizes around the batch's lookahead, half the queries present, in a set dense enough to chain
 * (keys that collide); an empty set; equal keys refused (and then nothing found). */
static void test_unique_find(void **state) {
    (void)state;
    enum { MAXN = 300 };
    uint64_t set[MAXN], q[2 * MAXN];
    uint32_t idx[2 * MAXN];
    pw_unique_t u = {0};
    uint64_t rng = 7;
    const size_t sizes[] = {0, 1, 7, 8, 9, 16, 17, 33, 300};
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++)
        for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++) {
            const size_t n = sizes[a], nq = sizes[b];
            for (size_t i = 0; i < n; i++)
                set[i] = 1000 * (a + 1) + 3 * i; /* distinct */
            assert_int_equal(pw_unique_index(&u, set, n), 0);
            for (size_t i = 0; i < nq; i++)
                q[i] = n && tu_rand(&rng) % 2 ? set[tu_rand(&rng) % n] : 1000 * (a + 1) + 3 * i + 1;
            pw_unique_find_many(&u, set, q, nq, idx);
            for (size_t i = 0; i < nq; i++) {
                uint32_t want = PW_UNIQUE_NONE;
                for (size_t j = 0; j < n; j++)
                    if (set[j] == q[i])
                        want = (uint32_t)j;
                assert_int_equal(idx[i], want);
            }
        }
    set[0] = set[1] = 5;
    assert_int_equal(pw_unique_index(&u, set, 2), PC_EINVAL);
    pw_unique_find_many(&u, set, set, 2, idx);
    assert_true(idx[0] == PW_UNIQUE_NONE && idx[1] == PW_UNIQUE_NONE);
    pw_unique_free(&u);
}

static pw_model_t *model_make(pw_backend_t *be, const char *name, int ndense) {
    pw_model_config_t mc = {.ndense = ndense,
                            .nfields = FEAT,
                            .dim = 3,
                            .nbottom = 2,
                            .bottom = {5, 3},
                            .ntop = 2,
                            .top = {4, 1},
                            .max_batch = N,
                            .seed = 7};
    snprintf(mc.name, sizeof mc.name, "%s", name);
    pw_model_t *m;
    assert_int_equal(pw_model_create(&mc, be, &m), 0);
    return m;
}

static double sigmoid(double z) {
    return 1.0 / (1.0 + exp(-z));
}

/* FM against an explicit double reference. */
static void test_fm_reference(void **state) {
    (void)state;
    pw_backend_t *be;
    char why[256];
    assert_int_equal(pw_backend_open("cpu:checked", &be, why, sizeof why), 0);
    pw_model_t *m = model_make(be, "fm", ND);
    const int d = m->row_dim, k = d - 1;
    assert_int_equal(d, 4);
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, PW_OPT_SGD);
    oc.lr = 0.1f;
    pw_step_config_t sc = {.be = be, .model = m, .ndense = ND, .opt = &oc};
    pw_step_t *st;
    assert_int_equal(pw_step_create(&sc, &st), 0);
    batch_t t;
    batch_make(&t, 3, ND);
    uint64_t rng = 9;
    float urows[NK * 4], ugrads[NK * 4];
    for (size_t i = 0; i < t.nu * (size_t)d; i++)
        urows[i] = tu_gauss(&rng) * 0.3f;
    /* dense weights: start at 0 (FM), set to known values */
    const float w0[ND] = {0.2f, -0.4f}, b0 = 0.1f;
    be->upload(be, m->params[0].w, w0, sizeof w0);
    be->upload(be, m->params[0].b, &b0, sizeof b0);
    pw_step_input_t in = {.b = &t.b, .inv = t.inv, .nu = t.nu, .urows = urows};
    const float scale = 0.5f;
    double loss;
    assert_int_equal(pw_step_stage(st, 0, &in), 0);
    assert_int_equal(pw_step_compute(st, 0, scale, ugrads), 0);
    assert_int_equal(pw_step_finish(st, true, &loss), 0);
    /* the reference */
    double ref_loss = 0, dl[N], gw[ND] = {0}, gb = 0, gu[NK * 4] = {0};
    for (int s = 0; s < N; s++) {
        double z = b0;
        for (int j = 0; j < ND; j++)
            z += w0[j] * t.dense[s * ND + j];
        double sum[3] = {0};
        for (size_t j = t.off[s]; j < t.off[s + 1]; j++) {
            const float *r = urows + t.inv[j] * d;
            z += r[0] * t.vals[j];
            for (int e = 0; e < k; e++) {
                sum[e] += (double)r[1 + e] * t.vals[j];
                z -= 0.5 * (double)r[1 + e] * r[1 + e] * t.vals[j] * t.vals[j];
            }
        }
        for (int e = 0; e < k; e++)
            z += 0.5 * sum[e] * sum[e];
        const double p = sigmoid(z), y = t.labels[s];
        ref_loss -= (y * log(p) + (1 - y) * log(1 - p)) / N;
        dl[s] = (p - y) / N;
        for (int j = 0; j < ND; j++)
            gw[j] += dl[s] * t.dense[s * ND + j];
        gb += dl[s];
        for (size_t j = t.off[s]; j < t.off[s + 1]; j++) {
            const float *r = urows + t.inv[j] * d;
            double *g = gu + t.inv[j] * d;
            g[0] += scale * dl[s] * t.vals[j];
            for (int e = 0; e < k; e++)
                g[1 + e] += scale * dl[s] * t.vals[j] * (sum[e] - (double)r[1 + e] * t.vals[j]);
        }
    }
    TU_ASSERT_CLOSE(loss, ref_loss, 1e-5, 1e-6, "loss");
    for (size_t i = 0; i < t.nu * (size_t)d; i++)
        TU_ASSERT_CLOSE(ugrads[i], gu[i], 1e-4, 1e-6, "unique row gradient %zu", i);
    float w1[ND], b1;
    be->download(be, w1, m->params[0].w, sizeof w1);
    be->download(be, &b1, m->params[0].b, sizeof b1);
    for (int j = 0; j < ND; j++) /* SGD: w -= lr * g */
        TU_ASSERT_CLOSE(w1[j], w0[j] - 0.1 * gw[j], 1e-5, 1e-7, "dense weight %d", j);
    TU_ASSERT_CLOSE(b1, b0 - 0.1 * gb, 1e-5, 1e-7, "bias");
    pw_step_destroy(st);
    pw_model_destroy(m);
    pw_backend_close(be);
}

/* The batch's mean loss in double from pw_step_eval with unique rows u. */
static double eval_loss(pw_step_t *st, const batch_t *t, const float *u, int d) {
    float *rows = pw_step_eval_rows(st, NK), p[N];
    assert_non_null(rows);
    for (int j = 0; j < NK; j++)
        memcpy(rows + j * d, u + t->inv[j] * d, (size_t)d * sizeof(float));
    assert_int_equal(pw_step_eval(st, &t->b, p), 0);
    double l = 0;
    for (int s = 0; s < N; s++)
        l -= (t->labels[s] * log((double)p[s]) + (1 - t->labels[s]) * log(1.0 - p[s])) / N;
    return l;
}

/* A DLRM step (Adam) on cpu:checked: *be and *m to close and destroy after the step. */
static pw_step_t *dlrm_checked(pw_backend_t **be, pw_model_t **m) {
    char why[256];
    assert_int_equal(pw_backend_open("cpu:checked", be, why, sizeof why), 0);
    *m = model_make(*be, "dlrm", ND);
    pw_opt_config_t oc; /* (copied by the step) */
    pw_opt_config_defaults(&oc, PW_OPT_ADAM);
    pw_step_config_t sc = {.be = *be, .model = *m, .ndense = ND, .opt = &oc};
    pw_step_t *st;
    assert_int_equal(pw_step_create(&sc, &st), 0);
    return st;
}

/* DLRM (pooling in the model): unique row gradients = central differences of the loss. */
static void test_dlrm_gradients(void **state) {
    (void)state;
    pw_backend_t *be;
    pw_model_t *m;
    pw_step_t *st = dlrm_checked(&be, &m);
    const int d = m->row_dim;
    batch_t t;
    batch_make(&t, 5, ND);
    uint64_t rng = 11;
    float urows[NK * 3], ugrads[NK * 3], ugrads2[NK * 3];
    for (size_t i = 0; i < t.nu * (size_t)d; i++)
        urows[i] = tu_gauss(&rng) * 0.5f;
    pw_step_input_t in = {.b = &t.b, .inv = t.inv, .nu = t.nu, .urows = urows};
    double loss;
    assert_int_equal(pw_step_stage(st, 0, &in), 0);
    assert_int_equal(pw_step_compute(st, 0, 1.0f, ugrads), 0);
    /* the other buffer set is staged while this step is between compute and finish */
    assert_int_equal(pw_step_stage(st, 1, &in), 0);
    assert_int_equal(pw_step_finish(st, false, &loss), 0);
    TU_ASSERT_CLOSE(loss, eval_loss(st, &t, urows, d), 1e-5, 1e-6, "loss = eval's loss");
    for (size_t i = 0; i < t.nu * (size_t)d; i++) {
        float u[NK * 3];
        memcpy(u, urows, sizeof u);
        const float eps = 1e-2f;
        u[i] = urows[i] + eps;
        const double up = eval_loss(st, &t, u, d);
        u[i] = urows[i] - eps;
        const double down = eval_loss(st, &t, u, d);
        TU_ASSERT_CLOSE(ugrads[i], (up - down) / (2.0 * eps), 2e-2, 2e-4, "row value %zu", i);
    }
    /* set 1 (staged above) gives the same gradients: no weights changed (no dense step) */
    assert_int_equal(pw_step_compute(st, 1, 1.0f, ugrads2), 0);
    assert_int_equal(pw_step_finish(st, false, &loss), 0);
    assert_memory_equal(ugrads, ugrads2, t.nu * (size_t)d * sizeof(float));
    pw_step_destroy(st);
    pw_model_destroy(m);
    pw_backend_close(be);
}

/* DLRM on the CPU pools through inv (pool_unique, pool_grad_unique: no rows per feature): its
 * loss and unique row gradients are those of the rows-per-feature path (the same backend without
 * those two ops) to the bit, for two steps (the second after a dense step), with sum and mean
 * pooling over fields that hold two features each (some of them the same key). */
static void test_dlrm_unique_rows(void **state) {
    (void)state;
    pw_backend_t *be;
    char why[256];
    assert_int_equal(pw_backend_open("cpu", &be, why, sizeof why), 0);
    pw_backend_t per_feature = *be; /* the CPU backend is stateless: a copy without the ops */
    per_feature.pool_unique = NULL;
    per_feature.pool_grad_unique = NULL;
    pw_backend_t *const bes[2] = {be, &per_feature};
    batch_t t;
    batch_make(&t, 9, ND);
    for (int j = 0; j < NK; j++)
        t.fields[j] = (uint16_t)((j % FEAT) & ~1); /* two features a field */
    uint64_t rng = 5;
    float urows[NK * 3], ugrads[2][2][NK * 3];
    double loss[2][2];
    for (size_t i = 0; i < NK * 3; i++)
        urows[i] = tu_gauss(&rng) * 0.5f;
    for (int q = 0; q < 4; q++) {
        const int p = q % 2; /* the path; q / 2: mean pooling */
        pw_model_t *m = model_make(bes[p], "dlrm", ND);
        m->c.mean = q / 2; /* read at each forward */
        assert_true(pw_model_reads_unique(m) == (p == 0));
        pw_opt_config_t oc;
        pw_opt_config_defaults(&oc, PW_OPT_ADAM);
        pw_step_config_t sc = {.be = bes[p], .model = m, .ndense = ND, .opt = &oc};
        pw_step_t *st;
        assert_int_equal(pw_step_create(&sc, &st), 0);
        pw_step_input_t in = {.b = &t.b, .inv = t.inv, .nu = t.nu, .urows = urows};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(pw_step_stage(st, k, &in), 0);
            assert_int_equal(pw_step_compute(st, k, 0.5f, ugrads[p][k]), 0);
            assert_int_equal(pw_step_finish(st, true, &loss[p][k]), 0);
        }
        pw_step_destroy(st);
        pw_model_destroy(m);
        for (int k = 0; p == 1 && k < 2; k++) { /* both paths ran with this pooling */
            assert_memory_equal(&loss[0][k], &loss[1][k], sizeof loss[0][k]);
            assert_memory_equal(ugrads[0][k], ugrads[1][k], t.nu * 3 * sizeof(float));
        }
    }
    assert_true(memcmp(ugrads[0][0], ugrads[0][1], t.nu * 3 * sizeof(float)) != 0);
    pw_backend_close(be);
}

/* A first batch without a single feature (every sample's sparse fields empty, e.g. CSV columns
 * all blank) on a backend that pools rows per feature, as a GPU does: its step and evaluation
 * run on the dense features alone. The step reserved no row buffer for no features, and DLRM took
 * the missing buffer for "read through inv", an op such a backend does not have (a NULL call:
 * the worker crashed on a GPU). */
static void test_no_features(void **state) {
    (void)state;
    pw_backend_t *be;
    pw_model_t *m;
    pw_step_t *st = dlrm_checked(&be, &m);
    assert_null(be->pool_unique); /* (as CUDA's table) */
    assert_false(pw_model_reads_unique(m));
    batch_t t;
    batch_make(&t, 3, ND);
    for (int s = 0; s <= N; s++)
        t.off[s] = 0;
    pw_step_input_t in = {.b = &t.b, .inv = t.inv, .nu = 0, .urows = NULL};
    double loss;
    float ugrads[1], p[N];
    assert_int_equal(pw_step_stage(st, 0, &in), 0);
    assert_int_equal(pw_step_compute(st, 0, 1.0f, ugrads), 0);
    assert_int_equal(pw_step_finish(st, true, &loss), 0);
    assert_true(isfinite(loss) && loss > 0);
    assert_non_null(pw_step_eval_rows(st, 0));
    assert_int_equal(pw_step_eval(st, &t.b, p), 0);
    for (int s = 0; s < N; s++)
        assert_true(p[s] > 0 && p[s] < 1);
    pw_step_destroy(st);
    pw_model_destroy(m);
    pw_backend_close(be);
}

/* Batches that do not fit the model are refused before any memory is touched. */
static void test_check(void **state) {
    (void)state;
    pw_backend_t *be = pw_backend_cpu();
    pw_model_t *m = model_make(be, "deepfm", ND);
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, PW_OPT_ADAM);
    pw_step_config_t sc = {.be = be, .model = m, .ndense = ND, .opt = &oc};
    pw_step_t *st;
    sc.ndense = 5; /* the model has ND */
    assert_int_equal(pw_step_create(&sc, &st), PC_EINVAL);
    sc.ndense = ND;
    assert_int_equal(pw_step_create(&sc, &st), 0);
    batch_t t;
    batch_make(&t, 1, ND);
    assert_int_equal(pw_step_check(st, &t.b), 0);
    t.b.ndense = 1;
    assert_int_equal(pw_step_check(st, &t.b), PC_EINVAL);
    t.b.ndense = ND;
    t.fields[NK - 1] = FEAT; /* one field too far */
    assert_int_equal(pw_step_check(st, &t.b), PC_EINVAL);
    pw_step_destroy(st);
    pw_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unique),           cmocka_unit_test(test_unique_find),
        cmocka_unit_test(test_fm_reference),     cmocka_unit_test(test_dlrm_gradients),
        cmocka_unit_test(test_dlrm_unique_rows), cmocka_unit_test(test_check),
        cmocka_unit_test(test_no_features),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
