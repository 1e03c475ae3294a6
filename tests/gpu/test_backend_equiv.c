/* A backend against the CPU backend: every function of the table, every layer's forward and
 * backward, a whole training step of DLRM and of DeepFM (logits, loss, every parameter gradient,
 * every row gradient) and a short training run of each model (AUC within 0.002).
 *
 *   test_backend_equiv DEVICE [--short]   (DEVICE: cuda, cuda:N, cpu:checked)
 *
 * --short trains on a fifth of the rows (as cpu:checked always does): for compute-sanitizer's
 * racecheck, which runs the kernels a hundred times slower and would not reach the end.
 *
 * Arrays are compared by their normwise relative error, max |x - ref| / max |ref|, under 1e-4 in
 * fp32. Without the device (no GPU, no CUDA module) the program prints why and exits 77, which
 * ctest reports as skipped. With cpu:checked (always available) the results are bit-identical,
 * so CI exercises this harness, and the data it moves, without a GPU.
 */
#include "table_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pc_error.h"
#include "pc_log.h"
#include "pw_backend.h"
#include "pw_datagen.h"
#include "pw_deepfm.h"
#include "pw_dense_optim.h"
#include "pw_dlrm.h"
#include "pw_layers.h"
#include "pw_train.h"

#define RTOL 1e-4

static pw_backend_t *g_x;   /* the backend under test */
static pw_backend_t *g_cpu; /* the reference */
static const char *g_device;
static bool g_short; /* --short: fewer training rows */

/* ---- moving data ---- */

static float *rnd(size_t n, uint64_t *rng, float scale) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = tu_gauss(rng) * scale;
    return x;
}

/* A device copy of host bytes on backend be. */
static void *up(pw_backend_t *be, const void *host, size_t bytes) {
    void *d = be->alloc(be, bytes ? bytes : 4);
    assert_non_null(d);
    if (bytes)
        be->upload(be, d, host, bytes);
    return d;
}

/* A host copy of n device floats. */
static float *down(pw_backend_t *be, const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    assert_non_null(h);
    if (n)
        be->download(be, h, dev, n * sizeof *h);
    return h;
}

/* x (n floats on g_x) against ref (n host floats): normwise relative error under rtol. */
static void same(const char *what, const float *xdev, const float *ref, size_t n, double rtol) {
    float *x = down(g_x, xdev, n);
    double err = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) && isfinite(ref[i]))
            fail_msg("%s[%zu]: %g on %s, %g on the CPU", what, i, x[i], g_device, ref[i]);
        err = fmax(err, fabs((double)x[i] - ref[i]));
        mag = fmax(mag, fabs((double)ref[i]));
    }
    free(x);
    const double rel = mag > 0 ? err / mag : err;
    if (rel > rtol)
        fail_msg("%s: relative error %.3g (max |diff| %.3g, max |ref| %.3g)", what, rel, err, mag);
    char msg[256];
    assert_int_equal(g_x->error(g_x, msg, sizeof msg), 0);
}

/* ---- the table, function by function ---- */

static void test_gemm(void **state) {
    (void)state;
    uint64_t rng = 1;
    const int m = 67, n = 45, k = 129;
    float *a = rnd((size_t)m * k, &rng, 1), *b = rnd((size_t)k * n, &rng, 1);
    float *c = rnd((size_t)m * n, &rng, 1);
    for (int t = 0; t < 4; t++) {
        const bool ta = t & 1, tb = t & 2;
        float *da = up(g_x, a, (size_t)m * k * 4), *db = up(g_x, b, (size_t)k * n * 4);
        float *dc = up(g_x, c, (size_t)m * n * 4), *rc = malloc((size_t)m * n * 4);
        memcpy(rc, c, (size_t)m * n * 4);
        g_x->gemm(g_x, ta, tb, m, n, k, 0.5f, da, db, 2.0f, dc);
        g_cpu->gemm(g_cpu, ta, tb, m, n, k, 0.5f, a, b, 2.0f, rc);
        same(ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"), dc, rc,
             (size_t)m * n, RTOL);
        /* batched: 5 products of 7 x 6 x 9 at strides past their sizes */
        const int cnt = 5, bm = 7, bn = 6, bk = 9;
        const size_t sa = 70, sb = 60, sc = 50;
        float *ra = rnd(cnt * sa, &rng, 1), *rb = rnd(cnt * sb, &rng, 1),
              *rr = rnd(cnt * sc, &rng, 1);
        float *xa = up(g_x, ra, cnt * sa * 4), *xb = up(g_x, rb, cnt * sb * 4);
        float *xc = up(g_x, rr, cnt * sc * 4);
        g_x->gemm_batched(g_x, ta, tb, bm, bn, bk, 1.5f, xa, sa, xb, sb, 0.25f, xc, sc, cnt);
        g_cpu->gemm_batched(g_cpu, ta, tb, bm, bn, bk, 1.5f, ra, sa, rb, sb, 0.25f, rr, sc, cnt);
        same("gemm_batched", xc, rr, cnt * sc, RTOL);
        g_x->free(g_x, da);
        g_x->free(g_x, db);
        g_x->free(g_x, dc);
        g_x->free(g_x, xa);
        g_x->free(g_x, xb);
        g_x->free(g_x, xc);
        free(rc);
        free(ra);
        free(rb);
        free(rr);
    }
    free(a);
    free(b);
    free(c);
}

static void test_elementwise(void **state) {
    (void)state;
    uint64_t rng = 2;
    const int rows = 300, cols = 37, ld = 41;
    const size_t n = (size_t)rows * ld;
    float *y = rnd(n, &rng, 1), *bias = rnd((size_t)cols, &rng, 1), *dy = rnd(n, &rng, 1);
    float *out = rnd((size_t)cols, &rng, 1);
    float *xy = up(g_x, y, n * 4), *xbias = up(g_x, bias, (size_t)cols * 4);
    float *xdy = up(g_x, dy, n * 4), *xout = up(g_x, out, (size_t)cols * 4);
    for (int relu = 0; relu < 2; relu++) {
        g_x->bias_act(g_x, rows, cols, xbias, relu, xy);
        g_cpu->bias_act(g_cpu, rows, cols, bias, relu, y);
        same("bias_act", xy, y, (size_t)rows * cols, RTOL);
    }
    g_x->col_sum(g_x, rows, cols, xdy, 0.5f, xout);
    g_cpu->col_sum(g_cpu, rows, cols, dy, 0.5f, out);
    same("col_sum", xout, out, (size_t)cols, RTOL);
    g_x->col_sum(g_x, 0, cols, xdy, 0.25f, xout); /* no rows: out = beta * out */
    g_cpu->col_sum(g_cpu, 0, cols, dy, 0.25f, out);
    same("col_sum of no rows", xout, out, (size_t)cols, RTOL);
    g_x->col_sum(g_x, rows, 0, xdy, 0.25f, xout); /* no columns: nothing, and no failure */
    char msg[256];
    assert_int_equal(g_x->error(g_x, msg, sizeof msg), 0);
    float *xdx = g_x->alloc(g_x, n * 4), *dx = malloc(n * 4);
    g_x->relu_grad(g_x, n, xy, xdy, xdx);
    g_cpu->relu_grad(g_cpu, n, y, dy, dx);
    same("relu_grad", xdx, dx, n, 0);
    g_x->copy2d(g_x, rows, cols - 3, xdy + 2, ld, xy + 1, ld);
    g_cpu->copy2d(g_cpu, rows, cols - 3, dy + 2, ld, y + 1, ld);
    same("copy2d", xy, y, n, 0);
    g_x->add2d(g_x, rows, cols - 3, xdy + 2, ld, xy + 1, ld);
    g_cpu->add2d(g_cpu, rows, cols - 3, dy + 2, ld, y + 1, ld);
    same("add2d", xy, y, n, RTOL);
    g_x->scale(g_x, n, -0.75f, xy);
    g_cpu->scale(g_cpu, n, -0.75f, y);
    same("scale", xy, y, n, RTOL);
    g_x->fill(g_x, 17, 3.5f, xy + 5);
    g_cpu->fill(g_cpu, 17, 3.5f, y + 5);
    same("fill", xy, y, n, 0);
    g_x->copy(g_x, xdx, xy, n * 4);
    g_x->zero(g_x, xdx + 3, 40);
    memcpy(dx, y, n * 4);
    memset(dx + 3, 0, 40);
    same("copy, zero", xdx, dx, n, 0);
    float *p[] = {xy, xbias, xdy, xout, xdx};
    for (size_t i = 0; i < 5; i++)
        g_x->free(g_x, p[i]);
    free(y);
    free(bias);
    free(dy);
    free(out);
    free(dx);
}

static void test_interaction(void **state) {
    (void)state;
    uint64_t rng = 3;
    const int n = 70, f = 27, d = 16, np = f * (f - 1) / 2, ldo = np + 16;
    float *z = rnd((size_t)n * f * d, &rng, 1), *g = rnd((size_t)n * ldo, &rng, 1);
    float *out = rnd((size_t)n * ldo, &rng, 1), *full = malloc((size_t)n * f * f * 4);
    float *dz = malloc((size_t)n * f * d * 4);
    float *xz = up(g_x, z, (size_t)n * f * d * 4), *xg = up(g_x, g, (size_t)n * ldo * 4);
    float *xout = up(g_x, out, (size_t)n * ldo * 4),
          *xfull = g_x->alloc(g_x, (size_t)n * f * f * 4);
    float *xdz = g_x->alloc(g_x, (size_t)n * f * d * 4);
    pw_interact_forward(g_x, n, f, d, xz, xfull, xout + 16, ldo);
    pw_interact_forward(g_cpu, n, f, d, z, full, out + 16, ldo);
    same("interaction forward", xout, out, (size_t)n * ldo, RTOL);
    pw_interact_backward(g_x, n, f, d, xz, xg + 3, ldo, xfull, xdz);
    pw_interact_backward(g_cpu, n, f, d, z, g + 3, ldo, full, dz);
    same("interaction backward", xdz, dz, (size_t)n * f * d, RTOL);
    /* the triangle ops of the batched-GEMM path (the GPU's; the CPU has a fused kernel) */
    g_x->tril_unpack(g_x, n, f, xg + 3, ldo, xfull);
    g_cpu->tril_unpack(g_cpu, n, f, g + 3, ldo, full);
    same("tril_unpack", xfull, full, (size_t)n * f * f, 0);
    g_x->tril_pack(g_x, n, f, xfull, xout + 16, ldo);
    g_cpu->tril_pack(g_cpu, n, f, full, out + 16, ldo);
    same("tril_pack", xout, out, (size_t)n * ldo, 0);
    float *p[] = {xz, xg, xout, xfull, xdz};
    for (size_t i = 0; i < 5; i++)
        g_x->free(g_x, p[i]);
    free(z);
    free(g);
    free(out);
    free(full);
    free(dz);
}

/* A batch of n samples over nf fields: sample s has s % 5 features (some none, several of one
 * field), values one-hot or weighted. */
typedef struct sbatch {
    int n, nf;
    size_t nk, *off;
    uint16_t *field;
    float *val;
    uint32_t *idx; /* feature -> one of nu unique rows (duplicates) */
    size_t nu;
} sbatch_t;

static void sbatch_make(sbatch_t *b, int n, int nf, uint64_t *rng) {
    b->n = n;
    b->nf = nf;
    b->off = malloc(((size_t)n + 1) * sizeof *b->off);
    b->off[0] = 0;
    for (int s = 0; s < n; s++)
        b->off[s + 1] = b->off[s] + (size_t)(s % 5);
    b->nk = b->off[n];
    b->field = malloc((b->nk + 1) * sizeof *b->field);
    b->val = malloc((b->nk + 1) * sizeof *b->val);
    b->idx = malloc((b->nk + 1) * sizeof *b->idx);
    b->nu = b->nk / 3 + 1;
    for (size_t j = 0; j < b->nk; j++) {
        b->field[j] = (uint16_t)(tu_rand(rng) % (uint64_t)nf);
        b->val[j] = j % 3 ? 1.0f : 0.5f + (float)tu_unit(rng);
        b->idx[j] = (uint32_t)(tu_rand(rng) % b->nu);
    }
}

static void sbatch_free(sbatch_t *b) {
    free(b->off);
    free(b->field);
    free(b->val);
    free(b->idx);
}

static void test_embeddings(void **state) {
    (void)state;
    uint64_t rng = 4;
    sbatch_t b;
    sbatch_make(&b, 203, 7, &rng);
    const int d = 12, ld = 14;
    const size_t nk = b.nk, po = (size_t)b.n * b.nf * d;
    size_t *xoff = up(g_x, b.off, ((size_t)b.n + 1) * sizeof *b.off);
    uint16_t *xfield = up(g_x, b.field, nk * 2);
    float *xval = up(g_x, b.val, nk * 4);
    uint32_t *xidx = up(g_x, b.idx, nk * 4);
    float *urows = rnd(b.nu * ld, &rng, 1), *rows = malloc(nk * ld * 4);
    float *xurows = up(g_x, urows, b.nu * ld * 4), *xrows = g_x->alloc(g_x, nk * ld * 4);
    g_x->gather_rows(g_x, nk, xidx, xurows, ld, xrows);
    g_cpu->gather_rows(g_cpu, nk, b.idx, urows, ld, rows);
    same("gather_rows", xrows, rows, nk * ld, 0);
    float *out = malloc(po * 4), *xout = g_x->alloc(g_x, po * 4), *dout = rnd(po, &rng, 1);
    float *xdout = up(g_x, dout, po * 4), *drows = rnd(nk * ld, &rng, 1);
    float *xdrows = up(g_x, drows, nk * ld * 4);
    for (int mean = 0; mean < 2; mean++) {
        g_x->pool(g_x, b.n, xoff, xfield, xval, b.nf, d, xrows + 1, ld, mean, xout);
        g_cpu->pool(g_cpu, b.n, b.off, b.field, b.val, b.nf, d, rows + 1, ld, mean, out);
        same(mean ? "pool mean" : "pool sum", xout, out, po, RTOL);
        g_x->pool_grad(g_x, b.n, xoff, xfield, xval, b.nf, d, xdout, ld, mean, xdrows + 1);
        g_cpu->pool_grad(g_cpu, b.n, b.off, b.field, b.val, b.nf, d, dout, ld, mean, drows + 1);
        same(mean ? "pool_grad mean" : "pool_grad sum", xdrows, drows, nk * ld, RTOL);
    }
    float *ug = rnd(b.nu * ld, &rng, 1), *xug = up(g_x, ug, b.nu * ld * 4);
    g_x->scatter_add_rows(g_x, nk, xidx, xdrows, ld, 0.5f, xug);
    g_cpu->scatter_add_rows(g_cpu, nk, b.idx, drows, ld, 0.5f, ug);
    same("scatter_add_rows", xug, ug, b.nu * ld, RTOL);
    /* FM over rows of k + 1 (k = 0: logistic regression) */
    for (int k = 0; k <= 8; k += 8) {
        const size_t w = (size_t)k + 1;
        float *fr = rnd(nk * w, &rng, 0.5f), *lg = rnd((size_t)b.n, &rng, 1);
        float *dl = rnd((size_t)b.n, &rng, 1), *dr = malloc(nk * w * 4 + 4);
        float *xfr = up(g_x, fr, nk * w * 4), *xlg = up(g_x, lg, (size_t)b.n * 4);
        float *xdl = up(g_x, dl, (size_t)b.n * 4), *xdr = g_x->alloc(g_x, nk * w * 4 + 4);
        g_x->fm(g_x, b.n, xoff, xval, k, xfr, xlg);
        g_cpu->fm(g_cpu, b.n, b.off, b.val, k, fr, lg);
        same(k ? "fm" : "fm k=0 (lr)", xlg, lg, (size_t)b.n, RTOL);
        g_x->fm_grad(g_x, b.n, xoff, xval, k, xfr, xdl, xdr);
        g_cpu->fm_grad(g_cpu, b.n, b.off, b.val, k, fr, dl, dr);
        same(k ? "fm_grad" : "fm_grad k=0 (lr)", xdr, dr, nk * w, RTOL);
        float *p[] = {xfr, xlg, xdl, xdr};
        for (size_t i = 0; i < 4; i++)
            g_x->free(g_x, p[i]);
        free(fr);
        free(lg);
        free(dl);
        free(dr);
    }
    void *p[] = {xoff, xfield, xval, xidx, xurows, xrows, xout, xdout, xdrows, xug};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        g_x->free(g_x, p[i]);
    free(urows);
    free(rows);
    free(out);
    free(dout);
    free(drows);
    free(ug);
    sbatch_free(&b);
}

static void test_loss_and_optimizer(void **state) {
    (void)state;
    uint64_t rng = 5;
    const int n = 1000;
    float *z = rnd((size_t)n, &rng, 4), *y = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++)
        y[i] = (float)(i % 3 == 0);
    z[0] = 100.0f; /* extremes stay finite */
    z[1] = -100.0f;
    float *p = malloc((size_t)n * 4), *dz = malloc((size_t)n * 4);
    float *xz = up(g_x, z, (size_t)n * 4), *xy = up(g_x, y, (size_t)n * 4);
    float *xp = g_x->alloc(g_x, (size_t)n * 4), *xdz = g_x->alloc(g_x, (size_t)n * 4);
    float lc, *xl = g_x->alloc(g_x, 4);
    g_x->bce(g_x, n, xz, xy, xp, xdz, xl);
    g_cpu->bce(g_cpu, n, z, y, p, dz, &lc);
    same("bce loss", xl, &lc, 1, 1e-6);
    g_x->free(g_x, xl);
    same("bce p", xp, p, (size_t)n, RTOL);
    same("bce dlogits", xdz, dz, (size_t)n, RTOL);
    const size_t m = 5000;
    for (int kind = PW_OPT_SGD; kind <= PW_OPT_ADAM; kind++) {
        pw_opt_config_t oc;
        pw_opt_config_defaults(&oc, (pw_opt_kind_t)kind);
        oc.adagrad_init = 0.1f;
        pw_opt_t ox, o;
        assert_int_equal(pw_opt_init(&ox, g_x, &oc, m), 0);
        assert_int_equal(pw_opt_init(&o, g_cpu, &oc, m), 0);
        float *w = rnd(m, &rng, 1), *xw = up(g_x, w, m * 4);
        for (int step = 0; step < 5; step++) {
            float *g = rnd(m, &rng, 1), *xg = up(g_x, g, m * 4);
            pw_opt_step(&ox, xw, xg);
            pw_opt_step(&o, w, g);
            g_x->free(g_x, xg);
            free(g);
        }
        same(kind == PW_OPT_SGD       ? "sgd"
             : kind == PW_OPT_ADAGRAD ? "adagrad"
                                      : "adam",
             xw, w, m, RTOL);
        g_x->free(g_x, xw);
        free(w);
        pw_opt_free(&ox);
        pw_opt_free(&o);
    }
    void *q[] = {xz, xy, xp, xdz};
    for (size_t i = 0; i < 4; i++)
        g_x->free(g_x, q[i]);
    free(z);
    free(y);
    free(p);
    free(dz);
}

/* ---- layers and whole steps ---- */

/* Every parameter and gradient of two layer arrays (one per backend) agree. */
static void same_layers(const char *what, const pw_linear_t *x, const pw_linear_t *c, int n) {
    char name[96];
    for (int i = 0; i < n; i++) {
        const size_t nw = (size_t)c[i].in * c[i].out;
        snprintf(name, sizeof name, "%s layer %d W", what, i);
        same(name, x[i].w, c[i].w, nw, RTOL);
        snprintf(name, sizeof name, "%s layer %d dW", what, i);
        same(name, x[i].dw, c[i].dw, nw, RTOL);
        snprintf(name, sizeof name, "%s layer %d db", what, i);
        same(name, x[i].db, c[i].db, (size_t)c[i].out, RTOL);
    }
}

static void test_mlp(void **state) {
    (void)state;
    uint64_t rng = 6;
    const int in = 40, batch = 513, widths[3] = {64, 33, 1};
    pw_linear_t lx[3], lc[3];
    pw_mlp_t mx, mc;
    assert_int_equal(pw_mlp_init(&mx, g_x, lx, in, widths, 3, true, batch, 9), 0);
    assert_int_equal(pw_mlp_init(&mc, g_cpu, lc, in, widths, 3, true, batch, 9), 0);
    float *x = rnd((size_t)batch * in, &rng, 1), *dy = rnd((size_t)batch, &rng, 1);
    float *xx = up(g_x, x, (size_t)batch * in * 4), *xdy = up(g_x, dy, (size_t)batch * 4);
    float *dx = malloc((size_t)batch * in * 4), *xdx = g_x->alloc(g_x, (size_t)batch * in * 4);
    same("mlp forward", pw_mlp_forward(&mx, batch, xx), pw_mlp_forward(&mc, batch, x),
         (size_t)batch, RTOL);
    pw_mlp_backward(&mx, xdy, xdx);
    pw_mlp_backward(&mc, dy, dx);
    same("mlp dx", xdx, dx, (size_t)batch * in, RTOL);
    same_layers("mlp", lx, lc, 3);
    pw_mlp_free(&mx);
    pw_mlp_free(&mc);
    g_x->free(g_x, xx);
    g_x->free(g_x, xdy);
    g_x->free(g_x, xdx);
    free(x);
    free(dy);
    free(dx);
}

/* One DLRM step (26 fields, dim 16) on both backends from the same parameters and inputs. */
static void test_dlrm_step(void **state) {
    (void)state;
    uint64_t rng = 7;
    pw_dlrm_config_t c = {.ndense = 13,
                          .nfields = 26,
                          .dim = 16,
                          .nbottom = 2,
                          .bottom = {64, 16},
                          .ntop = 3,
                          .top = {128, 64, 1},
                          .max_batch = 1024,
                          .seed = 5};
    const int batch = 1000;
    pw_dlrm_t *mx, *mc;
    assert_int_equal(pw_dlrm_create(&c, g_x, &mx), 0);
    assert_int_equal(pw_dlrm_create(&c, g_cpu, &mc), 0);
    const size_t ne = (size_t)batch * c.nfields * c.dim;
    float *dense = rnd((size_t)batch * 13, &rng, 1), *emb = rnd(ne, &rng, 0.3f);
    float *y = malloc((size_t)batch * 4);
    for (int i = 0; i < batch; i++)
        y[i] = (float)(tu_unit(&rng) < 0.3);
    float *xdense = up(g_x, dense, (size_t)batch * 13 * 4), *xemb = up(g_x, emb, ne * 4);
    float *xy = up(g_x, y, (size_t)batch * 4), *lg = malloc((size_t)batch * 4);
    float *xlg = g_x->alloc(g_x, (size_t)batch * 4), *dl = malloc((size_t)batch * 4);
    float *xdl = g_x->alloc(g_x, (size_t)batch * 4), *demb = malloc(ne * 4);
    float *xdemb = g_x->alloc(g_x, ne * 4);
    assert_int_equal(pw_dlrm_forward(mx, batch, xdense, xemb, xlg), 0);
    assert_int_equal(pw_dlrm_forward(mc, batch, dense, emb, lg), 0);
    same("dlrm logits", xlg, lg, (size_t)batch, RTOL);
    float lc, *xl = g_x->alloc(g_x, 4);
    g_x->bce(g_x, batch, xlg, xy, NULL, xdl, xl);
    g_cpu->bce(g_cpu, batch, lg, y, NULL, dl, &lc);
    same("dlrm loss", xl, &lc, 1, RTOL);
    g_x->free(g_x, xl);
    pw_dlrm_zero_grad(mx);
    pw_dlrm_zero_grad(mc);
    assert_int_equal(pw_dlrm_backward(mx, xdl, xdemb), 0);
    assert_int_equal(pw_dlrm_backward(mc, dl, demb), 0);
    same("dlrm embedding gradients", xdemb, demb, ne, RTOL);
    int n;
    pw_linear_t *lx_ = pw_dlrm_layers(mx, &n), *lc_ = pw_dlrm_layers(mc, &n);
    same_layers("dlrm", lx_, lc_, n);
    pw_dlrm_destroy(mx);
    pw_dlrm_destroy(mc);
    void *p[] = {xdense, xemb, xy, xlg, xdl, xdemb};
    for (size_t i = 0; i < 6; i++)
        g_x->free(g_x, p[i]);
    free(dense);
    free(emb);
    free(y);
    free(lg);
    free(dl);
    free(demb);
}

static void test_deepfm_step(void **state) {
    (void)state;
    uint64_t rng = 8;
    sbatch_t b;
    sbatch_make(&b, 700, 9, &rng);
    pw_deepfm_config_t c = {.ndense = 4,
                            .nfields = 9,
                            .k = 8,
                            .nlayers = 3,
                            .widths = {32, 16, 1},
                            .mean = true,
                            .max_batch = 700,
                            .seed = 2};
    pw_deepfm_t *mx, *mc;
    assert_int_equal(pw_deepfm_create(&c, g_x, &mx), 0);
    assert_int_equal(pw_deepfm_create(&c, g_cpu, &mc), 0);
    const size_t w = 9, nk = b.nk;
    float *dense = rnd(700 * 4, &rng, 1), *rows = rnd(nk * w, &rng, 0.3f);
    float *dl = rnd(700, &rng, 0.01f), *lg = malloc(700 * 4), *dr = malloc(nk * w * 4 + 4);
    size_t *xoff = up(g_x, b.off, 701 * sizeof *b.off);
    uint16_t *xfield = up(g_x, b.field, nk * 2);
    float *xval = up(g_x, b.val, nk * 4), *xdense = up(g_x, dense, 700 * 4 * 4);
    float *xrows = up(g_x, rows, nk * w * 4), *xdl = up(g_x, dl, 700 * 4);
    float *xlg = g_x->alloc(g_x, 700 * 4), *xdr = g_x->alloc(g_x, nk * w * 4 + 4);
    assert_int_equal(pw_deepfm_forward(mx, 700, xdense, xoff, xfield, xval, xrows, xlg), 0);
    assert_int_equal(pw_deepfm_forward(mc, 700, dense, b.off, b.field, b.val, rows, lg), 0);
    same("deepfm logits", xlg, lg, 700, RTOL);
    int n;
    pw_linear_t *lx_ = pw_deepfm_layers(mx, &n), *lc_ = pw_deepfm_layers(mc, &n);
    for (int i = 0; i < n; i++) {
        pw_linear_zero_grad(&lx_[i]);
        pw_linear_zero_grad(&lc_[i]);
    }
    assert_int_equal(pw_deepfm_backward(mx, xdl, xdr), 0);
    assert_int_equal(pw_deepfm_backward(mc, dl, dr), 0);
    same("deepfm row gradients", xdr, dr, nk * w, RTOL);
    same_layers("deepfm", lx_, lc_, n);
    pw_deepfm_destroy(mx);
    pw_deepfm_destroy(mc);
    void *p[] = {xoff, xfield, xval, xdense, xrows, xdl, xlg, xdr};
    for (size_t i = 0; i < 8; i++)
        g_x->free(g_x, p[i]);
    free(dense);
    free(rows);
    free(dl);
    free(lg);
    free(dr);
    sbatch_free(&b);
}

/* Each model trains on generated data on both backends: the AUCs agree within 0.002. */
static void test_training_runs(void **state) {
    (void)state;
    char dir[256], tr[300], te[300];
    tc_tmpdir(dir, sizeof dir, "equiv");
    snprintf(tr, sizeof tr, "%s/train.tsv", dir);
    snprintf(te, sizeof te, "%s/test.tsv", dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    const bool few = g_short || strcmp(g_device, "cpu:checked") == 0; /* slow: fewer rows */
    o.rows = few ? 20000 : 100000;
    o.test_rows = few ? 5000 : 20000;
    o.vocab_max = 2000;
    pw_datagen_result_t oracle;
    FILE *a = fopen(tr, "w"), *b = fopen(te, "w");
    assert_int_equal(pw_datagen_run(&o, a, b, &oracle), 0);
    fclose(a);
    fclose(b);
    const char *const models[] = {"lr", "fm", "deepfm", "dlrm"};
    for (size_t i = 0; i < 4; i++) {
        pw_train_result_t r[2];
        for (int k = 0; k < 2; k++) {
            pw_train_config_t c;
            pw_train_config_defaults(&c);
            c.local_store = pw_emb_local_open;
            snprintf(c.model, sizeof c.model, "%s", models[i]);
            c.batch = 1024;
            c.backend = k ? g_x : g_cpu;
            const char *trp[] = {tr}, *tep[] = {te};
            assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, trp, 1, tep, 1, &r[k]), 0);
        }
        print_message("%-6s AUC %.5f on the CPU (%.0f samples/s), %.5f on %s (%.0f samples/s)\n",
                      models[i], r[0].auc, r[0].samples_per_s, r[1].auc, g_device,
                      r[1].samples_per_s);
        assert_int_equal(r[0].samples, r[1].samples);
        assert_true(r[0].auc > 0.55 && fabs(r[0].auc - r[1].auc) < 0.002);
    }
    tc_rmdir(dir);
}

int main(int argc, char **argv) {
    pc_log_set_level(PC_LOG_ERROR);
    g_device = argc > 1 ? argv[1] : "cuda";
    g_short = argc > 2 && strcmp(argv[2], "--short") == 0;
    if (argc > 3 || (argc > 2 && !g_short)) {
        fprintf(stderr, "usage: test_backend_equiv [DEVICE [--short]]\n");
        return 2;
    }
    char why[768];
    int rc = pw_backend_open(g_device, &g_x, why, sizeof why);
    if (rc == PC_EUNAVAIL) {
        printf("SKIPPED: %s\n", why);
        return 77;
    }
    if (rc) {
        fprintf(stderr, "test_backend_equiv: %s\n", why);
        return 1;
    }
    printf("backend under test: %s\n", why);
    g_cpu = pw_backend_cpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_interaction),
        cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_loss_and_optimizer),
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_dlrm_step),
        cmocka_unit_test(test_deepfm_step),
        cmocka_unit_test(test_training_runs),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    pw_backend_close(g_x);
    return rc;
}
