/* DLRM as a whole against a double-precision reference: the logits match, and the gradients of
 * the BCE loss with respect to every weight, bias and embedding value match central finite
 * differences of the reference. Also: bad configurations are refused. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pc_error.h"
#include "pw_dlrm.h"

enum { B = 4, ND = 3, NF = 3, D = 2, F = NF + 1, NP = F * (F - 1) / 2 };

static pw_dlrm_config_t cfg(void) {
    return (pw_dlrm_config_t){.ndense = ND,
                              .nfields = NF,
                              .dim = D,
                              .nbottom = 2,
                              .bottom = {4, D},
                              .ntop = 2,
                              .top = {3, 1},
                              .max_batch = B,
                              .seed = 5};
}

/* ---- the reference: layers' parameters copied to double ---- */
typedef struct ref {
    int nl, in[4], out[4];
    double *w[4], *b[4];
    double dense[B * ND], emb[B * NF * D];
} ref_t;

static void linear_d(const ref_t *r, int l, const double *x, double *y, bool relu) {
    for (int s = 0; s < B; s++)
        for (int o = 0; o < r->out[l]; o++) {
            double a = r->b[l][o];
            for (int i = 0; i < r->in[l]; i++)
                a += r->w[l][o * r->in[l] + i] * x[s * r->in[l] + i];
            y[s * r->out[l] + o] = relu && a < 0 ? 0 : a;
        }
}

static double ref_loss(const ref_t *r, const float *y, double *logits) {
    double h1[B * 4], bot[B * D], z[B * F * D], top_in[B * (D + NP)], t1[B * 3], lg[B];
    linear_d(r, 0, r->dense, h1, true);
    linear_d(r, 1, h1, bot, true);
    for (int s = 0; s < B; s++) {
        memcpy(z + s * F * D, bot + s * D, D * sizeof(double));
        memcpy(z + s * F * D + D, r->emb + s * NF * D, NF * D * sizeof(double));
        memcpy(top_in + s * (D + NP), bot + s * D, D * sizeof(double));
        for (int i = 1, k = 0; i < F; i++)
            for (int j = 0; j < i; j++, k++) {
                double dot = 0;
                for (int e = 0; e < D; e++)
                    dot += z[(s * F + i) * D + e] * z[(s * F + j) * D + e];
                top_in[s * (D + NP) + D + k] = dot;
            }
    }
    linear_d(r, 2, top_in, t1, true);
    linear_d(r, 3, t1, lg, false);
    double loss = 0;
    for (int s = 0; s < B; s++) {
        if (logits)
            logits[s] = lg[s];
        loss += log1p(exp(-fabs(lg[s]))) + (lg[s] > 0 ? lg[s] : 0) - y[s] * lg[s];
    }
    return loss / B;
}

static double fd(const ref_t *r, double *p, const float *y) {
    const double eps = 1e-6, save = *p;
    *p = save + eps;
    const double up = ref_loss(r, y, NULL);
    *p = save - eps;
    const double down = ref_loss(r, y, NULL);
    *p = save;
    return (up - down) / (2 * eps);
}

#define GRAD_OK(a, n, what, i) TU_ASSERT_CLOSE((a), (n), 3e-3, 3e-5, "%s[%d]", what, (int)(i))

static void test_gradients(void **state) {
    (void)state;
    pw_dlrm_config_t c = cfg();
    pw_dlrm_t *m;
    assert_int_equal(pw_dlrm_create(&c, pw_backend_cpu(), &m), 0);
    int nl;
    pw_linear_t *l = pw_dlrm_layers(m, &nl);
    assert_int_equal(nl, 4);
    uint64_t rng = 17;
    for (int i = 0; i < nl; i++) /* nonzero biases: every path matters */
        for (int o = 0; o < l[i].out; o++)
            l[i].b[o] = tu_gauss(&rng) * 0.2f;
    float dense[B * ND], emb[B * NF * D], y[B], logits[B], p[B], dlog[B], demb[B * NF * D];
    for (int i = 0; i < B * ND; i++)
        dense[i] = tu_gauss(&rng);
    for (int i = 0; i < B * NF * D; i++)
        emb[i] = tu_gauss(&rng);
    for (int s = 0; s < B; s++)
        y[s] = (float)(s & 1);
    assert_int_equal(pw_dlrm_forward(m, B, dense, emb, logits), 0);
    float loss;
    pw_backend_cpu()->bce(pw_backend_cpu(), B, logits, y, p, dlog, &loss);
    pw_dlrm_zero_grad(m);
    assert_int_equal(pw_dlrm_backward(m, dlog, demb), 0);
    ref_t r = {.nl = nl};
    for (int i = 0; i < nl; i++) {
        r.in[i] = l[i].in;
        r.out[i] = l[i].out;
        r.w[i] = malloc((size_t)l[i].in * l[i].out * sizeof(double));
        r.b[i] = malloc((size_t)l[i].out * sizeof(double));
        for (int k = 0; k < l[i].in * l[i].out; k++)
            r.w[i][k] = l[i].w[k];
        for (int k = 0; k < l[i].out; k++)
            r.b[i][k] = l[i].b[k];
    }
    for (int i = 0; i < B * ND; i++)
        r.dense[i] = dense[i];
    for (int i = 0; i < B * NF * D; i++)
        r.emb[i] = emb[i];
    double rl[B];
    TU_ASSERT_CLOSE(loss, ref_loss(&r, y, rl), 1e-5, 1e-6, "loss");
    for (int s = 0; s < B; s++)
        TU_ASSERT_CLOSE(logits[s], rl[s], 1e-5, 1e-5, "logit %d", s);
    for (int i = 0; i < nl; i++) {
        for (int k = 0; k < l[i].in * l[i].out; k++)
            GRAD_OK(l[i].dw[k], fd(&r, &r.w[i][k], y), i < 2 ? "bottom dW" : "top dW", k);
        for (int k = 0; k < l[i].out; k++)
            GRAD_OK(l[i].db[k], fd(&r, &r.b[i][k], y), i < 2 ? "bottom db" : "top db", k);
    }
    for (int i = 0; i < B * NF * D; i++)
        GRAD_OK(demb[i], fd(&r, &r.emb[i], y), "d embedding", i);
    for (int i = 0; i < nl; i++) {
        free(r.w[i]);
        free(r.b[i]);
    }
    pw_dlrm_destroy(m);
}

static void test_bad_config(void **state) {
    (void)state;
    pw_dlrm_t *m;
    pw_dlrm_config_t c = cfg();
    c.bottom[1] = D + 1; /* bottom output must match the embedding dim */
    assert_int_equal(pw_dlrm_create(&c, pw_backend_cpu(), &m), PC_EINVAL);
    c = cfg();
    c.top[1] = 2; /* one logit */
    assert_int_equal(pw_dlrm_create(&c, pw_backend_cpu(), &m), PC_EINVAL);
    c = cfg();
    assert_int_equal(pw_dlrm_create(&c, pw_backend_cpu(), &m), 0);
    float x[(B + 1) * (ND + NF * D)] = {0}, lg[B + 1];
    assert_int_equal(pw_dlrm_forward(m, B + 1, x, x, lg), PC_EINVAL); /* over max_batch */
    pw_dlrm_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
