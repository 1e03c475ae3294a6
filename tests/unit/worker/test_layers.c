/* Layers against double precision: the backend's GEMM (all transpose cases) and each layer's
 * forward match a double reference; every gradient (weights, biases, inputs) of a
 * Linear-ReLU-Linear-BCE network (pw_mlp) and of the dot interaction (the CPU's fused kernel in
 * both block widths, which give the same bits, and the batched GEMM and triangle the GPU runs)
 * matches central finite differences of the
 * double reference; pooling is exact and its
 * gradient is its adjoint. BCE is finite and exact at extreme logits. A ReLU keeps NaN. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pc_error.h"
#include "pw_backend.h"
#include "pw_layers.h"

/* The fused interaction's two block widths, as the CPU backend builds them (it runs one of
 * them, by the CPU): both are checked here, on any CPU. */
#define IK_LANES   8
#define IK_NAME(x) x##_8
#define IK_ATTR
#include "pw_cpu_interact.h"
#define IK_LANES   16
#define IK_NAME(x) x##_16
#define IK_ATTR
#include "pw_cpu_interact.h"

static pw_backend_t *be;

static void fill(float *x, size_t n, uint64_t *rng, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = tu_gauss(rng) * scale;
}

static void test_gemm(void **state) {
    (void)state;
    uint64_t rng = 1;
    for (int t = 0; t < 4; t++) {
        const bool ta = t & 1, tb = t & 2;
        const int m = 7, n = 5, k = 9;
        float a[63], b[45], c[35], c0[35];
        fill(a, 63, &rng, 1);
        fill(b, 45, &rng, 1);
        fill(c, 35, &rng, 1);
        memcpy(c0, c, sizeof c);
        be->gemm(be, ta, tb, m, n, k, 0.5f, a, b, 2.0f, c);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int p = 0; p < k; p++)
                    s += (double)(ta ? a[p * m + i] : a[i * k + p]) *
                         (tb ? b[j * k + p] : b[p * n + j]);
                const double want = 0.5 * s + 2.0 * c0[i * n + j];
                TU_ASSERT_CLOSE(c[i * n + j], want, 1e-5, 1e-5, "gemm t=%d (%d,%d)", t, i, j);
            }
    }
}

/* ---- the double-precision reference network: x -> W1 x + b1 -> relu -> W2 h + b2 -> bce ---- */
enum { B = 6, IN = 5, H = 4 };

typedef struct net {
    double w1[H * IN], b1[H], w2[H], b2, x[B * IN];
} net_t;

static double net_loss(const net_t *n, const float *y) {
    double loss = 0;
    for (int s = 0; s < B; s++) {
        double z = n->b2;
        for (int h = 0; h < H; h++) {
            double a = n->b1[h];
            for (int i = 0; i < IN; i++)
                a += n->w1[h * IN + i] * n->x[s * IN + i];
            z += n->w2[h] * (a > 0 ? a : 0);
        }
        loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y[s] * z;
    }
    return loss / B;
}

/* Central difference of the loss in *p. */
static double fd(net_t *n, double *p, const float *y) {
    const double eps = 1e-6, save = *p;
    *p = save + eps;
    const double up = net_loss(n, y);
    *p = save - eps;
    const double down = net_loss(n, y);
    *p = save;
    return (up - down) / (2 * eps);
}

#define GRAD_OK(analytic, numeric, what, i) \
    TU_ASSERT_CLOSE((analytic), (numeric), 2e-3, 2e-5, "%s[%d]", what, (int)(i))

static void test_mlp_gradients(void **state) {
    (void)state;
    uint64_t rng = 7;
    pw_linear_t l[2];
    pw_mlp_t m;
    const int widths[2] = {H, 1};
    assert_int_equal(pw_mlp_init(&m, be, l, IN, widths, 2, false, B, 11), 0);
    pw_linear_t *l1 = &l[0], *l2 = &l[1];
    fill(l1->b, H, &rng, 0.3f);
    l2->b[0] = 0.1f;
    float x[B * IN], y[B], z[B], dz[B], dx[B * IN];
    fill(x, B * IN, &rng, 1);
    for (int s = 0; s < B; s++)
        y[s] = (float)(s % 2);
    /* float forward and backward through the MLP (Linear, ReLU, Linear) */
    memcpy(z, pw_mlp_forward(&m, B, x), sizeof z);
    float p[B];
    float loss;
    be->bce(be, B, z, y, p, dz, &loss);
    pw_linear_zero_grad(l1);
    pw_linear_zero_grad(l2);
    pw_mlp_backward(&m, dz, dx);
    /* the same network in double */
    net_t n;
    for (int i = 0; i < H * IN; i++)
        n.w1[i] = l1->w[i];
    for (int i = 0; i < H; i++) {
        n.b1[i] = l1->b[i];
        n.w2[i] = l2->w[i];
    }
    n.b2 = l2->b[0];
    for (int i = 0; i < B * IN; i++)
        n.x[i] = x[i];
    TU_ASSERT_CLOSE(loss, net_loss(&n, y), 1e-5, 1e-6, "loss");
    for (int i = 0; i < H * IN; i++)
        GRAD_OK(l1->dw[i], fd(&n, &n.w1[i], y), "dW1", i);
    for (int i = 0; i < H; i++) {
        GRAD_OK(l1->db[i], fd(&n, &n.b1[i], y), "db1", i);
        GRAD_OK(l2->dw[i], fd(&n, &n.w2[i], y), "dW2", i);
    }
    GRAD_OK(l2->db[0], fd(&n, &n.b2, y), "db2", 0);
    for (int i = 0; i < B * IN; i++)
        GRAD_OK(dx[i], fd(&n, &n.x[i], y), "dx", i);
    /* Gradients accumulate: a second backward doubles them. */
    const float dw0 = l1->dw[0];
    pw_mlp_backward(&m, dz, NULL);
    TU_ASSERT_CLOSE(l1->dw[0], 2 * dw0, 1e-6, 1e-7, "accumulate");
    /* Bad shapes are refused; a batch over max_batch has no output. */
    assert_null(pw_mlp_forward(&m, B + 1, x));
    pw_mlp_free(&m);
    pw_mlp_t bad;
    const int zero[1] = {0};
    assert_int_equal(pw_mlp_init(&bad, be, l, IN, zero, 1, false, B, 1), PC_EINVAL);
    assert_int_equal(pw_mlp_init(&bad, be, l, IN, widths, 0, false, B, 1), PC_EINVAL);
}

/* Pooling against double precision, sum and mean: forward equals the reference, and pool_grad
 * is the exact adjoint of pool (<pool(r), g> = <r, pool_grad(g)>, which is what the gradient of
 * a linear map is), accumulating into the rows. Samples with several, one and no features of a
 * field. */
static void test_pool(void **state) {
    (void)state;
    enum { N = 3, NF = 3, D = 4, LD = 6, NK = 7 };
    const size_t off[N + 1] = {0, 4, 4, NK};
    const uint16_t field[NK] = {0, 2, 0, 0, /* sample 1 has none */ 1, 2, 1};
    const float val[NK] = {1, 0.5f, 2, 1, 1, -1, 0.25f};
    uint64_t rng = 9;
    float rows[NK * LD], g[N * NF * D], out[N * NF * D], dr[NK * LD];
    fill(rows, NK * LD, &rng, 1);
    fill(g, N * NF * D, &rng, 1);
    for (int mean = 0; mean < 2; mean++) {
        be->pool(be, N, off, field, val, NF, D, rows + 1, LD, mean, out);
        double ref[N * NF * D] = {0};
        for (int s = 0; s < N; s++)
            for (size_t j = off[s]; j < off[s + 1]; j++) {
                int cnt = 0;
                for (size_t i = off[s]; i < off[s + 1]; i++)
                    cnt += field[i] == field[j];
                for (int e = 0; e < D; e++)
                    ref[(s * NF + field[j]) * D + e] +=
                        (double)val[j] * rows[j * LD + 1 + e] / (mean ? cnt : 1);
            }
        for (int i = 0; i < N * NF * D; i++)
            TU_ASSERT_CLOSE(out[i], ref[i], 1e-6, 1e-6, "pool %d value %d", mean, i);
        for (int i = 0; i < NK * LD; i++)
            dr[i] = 0.5f; /* pool_grad adds to what is there */
        be->pool_grad(be, N, off, field, val, NF, D, g, LD, mean, dr + 1);
        double lhs = 0, rhs = 0;
        for (int i = 0; i < N * NF * D; i++)
            lhs += (double)out[i] * g[i];
        for (int j = 0; j < NK; j++) {
            assert_true(dr[j * LD] == 0.5f && dr[j * LD + 5] == 0.5f); /* columns outside d */
            for (int e = 0; e < D; e++)
                rhs += (double)rows[j * LD + 1 + e] * (dr[j * LD + 1 + e] - 0.5);
        }
        TU_ASSERT_CLOSE(lhs, rhs, 1e-5, 1e-6, "adjoint %d", mean);
    }
}

/* The interaction on backend b (nb samples, f vectors of dim d, output rows with a stride)
 * against double precision: each dot product, and dz against (G + G^T) z; with fd, dz also
 * against central differences of L = sum_k g_k out_k. */
static void check_interaction(pw_backend_t *b, int nb, int f, int d, bool fd, uint64_t seed) {
    /* as inside the DLRM's top input, whose columns past np are the next sample's: more than a
     * vector block of them, each checked untouched */
    const int np = f * (f - 1) / 2, ldo = np + 17;
    const size_t nz = (size_t)nb * f * d, no = (size_t)nb * ldo;
    float *z = malloc(nz * sizeof *z), *out = malloc(no * sizeof *out), *g = malloc(no * sizeof *g),
          *dz = malloc(nz * sizeof *dz), *full = malloc((size_t)nb * f * f * sizeof *full);
    double *zd = malloc(nz * sizeof *zd);
    assert_non_null(z && out && g && dz && full && zd);
    uint64_t rng = seed;
    fill(z, nz, &rng, 1);
    fill(g, no, &rng, 1);
    for (size_t i = 0; i < no; i++)
        out[i] = 7.0f; /* the columns past np stay untouched */
    pw_interact_forward(b, nb, f, d, z, full, out, ldo);
    pw_interact_backward(b, nb, f, d, z, g, ldo, full, dz);
    for (size_t i = 0; i < nz; i++)
        zd[i] = z[i];
    for (int s = 0; s < nb; s++) {
        for (int k = np; k < ldo; k++)
            assert_true(out[s * ldo + k] == 7.0f);
        for (int i = 1, k = 0; i < f; i++)
            for (int j = 0; j < i; j++, k++) {
                double dot = 0, mag = 0;
                for (int e = 0; e < d; e++) {
                    const double t =
                        zd[((size_t)s * f + i) * d + e] * zd[((size_t)s * f + j) * d + e];
                    dot += t;
                    mag += fabs(t);
                }
                /* a float sum of d rounded products is within (d + 1) u sum |t| (u = 2^-24) */
                TU_ASSERT_CLOSE(out[s * ldo + k], dot, 0, (d + 1) * 0x1p-24 * mag + 1e-12,
                                "dot (%d,%d,%d)", s, i, j);
            }
        for (int i = 0; i < f; i++) /* dz_i = sum over j != i of g_(max,min) z_j */
            for (int e = 0; e < d; e++) {
                double r = 0, mag = 0;
                for (int j = 0; j < f; j++) {
                    if (j == i)
                        continue;
                    const int hi = i > j ? i : j, lo = i > j ? j : i;
                    const double t =
                        g[s * ldo + hi * (hi - 1) / 2 + lo] * zd[((size_t)s * f + j) * d + e];
                    r += t;
                    mag += fabs(t);
                }
                TU_ASSERT_CLOSE(dz[((size_t)s * f + i) * d + e], r, 0, f * 0x1p-24 * mag + 1e-12,
                                "dz (%d,%d,%d)", s, i, e);
            }
    }
    for (size_t p = 0; fd && p < nz; p++) { /* L is quadratic in each z: differences are exact */
        double lv[2];
        for (int side = 0; side < 2; side++) {
            const double save = zd[p];
            zd[p] = save + (side ? -1e-3 : 1e-3);
            double l = 0;
            for (int s = 0; s < nb; s++)
                for (int i = 1, k = 0; i < f; i++)
                    for (int j = 0; j < i; j++, k++) {
                        double dot = 0;
                        for (int e = 0; e < d; e++)
                            dot +=
                                zd[((size_t)s * f + i) * d + e] * zd[((size_t)s * f + j) * d + e];
                        l += g[s * ldo + k] * dot;
                    }
            lv[side] = l;
            zd[p] = save;
        }
        GRAD_OK(dz[p], (lv[0] - lv[1]) / 2e-3, "dz", p);
    }
    free(z);
    free(out);
    free(g);
    free(dz);
    free(full);
    free(zd);
}

/* The fused kernel's widths on one input, and the backend's own (its width for this CPU, its
 * target variant): the same bits (outputs and gradients). */
static void check_widths_agree(int nb, int f, int d, uint64_t seed) {
    const int np = f * (f - 1) / 2, ldo = np + 17;
    const size_t nz = (size_t)nb * f * d, no = (size_t)nb * ldo;
    float *z = malloc(nz * sizeof *z), *g = malloc(no * sizeof *g), *o[3], *dz[3];
    assert_non_null(z && g);
    for (int w = 0; w < 3; w++) {
        o[w] = calloc(no, sizeof *o[w]);
        dz[w] = calloc(nz, sizeof *dz[w]);
        assert_non_null(o[w] && dz[w]);
    }
    uint64_t rng = seed;
    fill(z, nz, &rng, 1);
    fill(g, no, &rng, 1);
    interact_8(be, nb, f, d, z, o[0], ldo);
    interact_16(be, nb, f, d, z, o[1], ldo);
    interact_grad_8(be, nb, f, d, z, g, ldo, dz[0]);
    interact_grad_16(be, nb, f, d, z, g, ldo, dz[1]);
    be->interact(be, nb, f, d, z, o[2], ldo);
    be->interact_grad(be, nb, f, d, z, g, ldo, dz[2]);
    for (int w = 1; w < 3; w++) {
        assert_memory_equal(o[0], o[w], no * sizeof *o[0]);
        assert_memory_equal(dz[0], dz[w], nz * sizeof *dz[0]);
    }
    for (int w = 0; w < 3; w++) {
        free(o[w]);
        free(dz[w]);
    }
    free(z);
    free(g);
}

/* The CPU's fused kernel (no f x f matrices; as the backend picks it, and each width) and the
 * batched-GEMM path the GPU takes, at small odd shapes, DLRM's 27 x 16, z too large for the
 * fused kernel's transposed copy, row groups that cross blocks, a d with a tail and more fields
 * than its row results hold. */
static void test_dot_interaction(void **state) {
    (void)state;
    assert_non_null(be->interact);
    pw_backend_t gemm = *be, w8 = *be, w16 = *be; /* the CPU backend is stateless: copies */
    gemm.interact = NULL;
    gemm.interact_grad = NULL;
    w8.interact = interact_8;
    w8.interact_grad = interact_grad_8;
    w16.interact = interact_16;
    w16.interact_grad = interact_grad_16;
    static const int shapes[][3] = {{2, 27, 16}, {3, 4, 3},   {2, 70, 130}, {3, 40, 32},
                                    {2, 21, 17}, {2, 150, 4}, {2, 33, 7},   {1, 2, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        check_widths_agree(shapes[k][0], shapes[k][1], shapes[k][2], 20 + k);
    pw_backend_t *const paths[] = {be, &gemm, &w8, &w16};
    for (int p = 0; p < 4; p++) {
        check_interaction(paths[p], 3, 4, 3, true, 3);
        check_interaction(paths[p], 2, 27, 16, true, 4);
        check_interaction(paths[p], 5, 9, 5, true, 5);
        check_interaction(paths[p], 2, 70, 130, false, 6); /* 9100 floats per sample */
        check_interaction(paths[p], 3, 40, 32, false, 7);  /* 3 blocks of rows, 2 of d */
        check_interaction(paths[p], 2, 21, 17, false, 8);  /* a tail of d */
        check_interaction(paths[p], 2, 150, 4, false, 9);  /* more fields than row results */
    }
}

static void test_bce_extremes(void **state) {
    (void)state;
    const float z[4] = {100.0f, -100.0f, 100.0f, 0.0f}, y[4] = {1, 0, 0, 1};
    float p[4], d[4];
    float loss;
    be->bce(be, 4, z, y, p, d, &loss);
    assert_true(isfinite(loss));
    TU_ASSERT_CLOSE(loss, (100.0 + log(2.0)) / 4, 1e-7, 1e-9, "loss"); /* a float */
    assert_true(p[0] == 1.0f && p[1] >= 0.0f && p[1] < 1e-30f && p[3] == 0.5f);
    TU_ASSERT_CLOSE(d[2], 1.0 / 4, 1e-7, 1e-9, "gradient at a confident mistake");
    TU_ASSERT_CLOSE(d[3], -0.5 / 4, 1e-7, 1e-9, "gradient at 0");
}

/* A NaN reaching a ReLU stays NaN (so a diverged hidden layer reaches the loss, whose check
 * stops the run; a ReLU that made it 0 hid it while the backward's 0 x NaN poisoned the
 * weights); -0 and negatives become 0. */
static void test_relu_nan(void **state) {
    (void)state;
    const float bias[4] = {0, 0, 0, 0};
    float y[4] = {NAN, -1.0f, -0.0f, 2.0f};
    be->bias_act(be, 1, 4, bias, true, y);
    assert_true(isnan(y[0]));
    assert_true(y[1] == 0.0f && !signbit(y[2]) && y[3] == 2.0f);
}

int main(void) {
    be = pw_backend_cpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),         cmocka_unit_test(test_mlp_gradients),
        cmocka_unit_test(test_pool),         cmocka_unit_test(test_dot_interaction),
        cmocka_unit_test(test_bce_extremes), cmocka_unit_test(test_relu_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
