/* pw_layers.c: see pw_layers.h. */
#include "pw_layers.h"

#include "pc_error.h"
#include "pc_rand.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int pw_linear_init(pw_linear_t *l, int in, int out, uint64_t seed) {
    memset(l, 0, sizeof *l);
    if (in < 1 || out < 1)
        return PC_EINVAL;
    const size_t nw = (size_t)in * out;
    l->in = in;
    l->out = out;
    l->w = malloc(nw * sizeof(float));
    l->dw = calloc(nw, sizeof(float));
    l->b = calloc((size_t)out, sizeof(float));
    l->db = calloc((size_t)out, sizeof(float));
    if (!l->w || !l->dw || !l->b || !l->db) {
        pw_linear_free(l);
        return PC_ENOMEM;
    }
    const double limit = sqrt(6.0 / (in + out)); /* Glorot & Bengio 2010 */
    uint64_t st = seed;
    for (size_t i = 0; i < nw; i++)
        l->w[i] = (float)((2 * pc_rand_unit(&st) - 1) * limit);
    return 0;
}

void pw_linear_free(pw_linear_t *l) {
    free(l->w);
    free(l->b);
    free(l->dw);
    free(l->db);
    memset(l, 0, sizeof *l);
}

void pw_linear_zero_grad(pw_linear_t *l) {
    memset(l->dw, 0, (size_t)l->in * l->out * sizeof(float));
    memset(l->db, 0, (size_t)l->out * sizeof(float));
}

void pw_linear_forward(const pw_backend_t *be, const pw_linear_t *l, int batch, const float *x,
                       float *y) {
    /* y (batch x out) = x (batch x in) * W^T (in x out) */
    be->gemm(false, true, batch, l->out, l->in, 1.0f, x, l->w, 0.0f, y);
    be->add_bias(batch, l->out, l->b, y);
}

void pw_linear_backward(const pw_backend_t *be, pw_linear_t *l, int batch, const float *x,
                        const float *dy, float *dx) {
    /* dW (out x in) += dy^T (out x batch) * x (batch x in); db += column sums of dy */
    be->gemm(true, false, l->out, l->in, batch, 1.0f, dy, x, 1.0f, l->dw);
    be->col_sum(batch, l->out, dy, 1.0f, l->db);
    if (dx) /* dx (batch x in) = dy (batch x out) * W (out x in) */
        be->gemm(false, false, batch, l->in, l->out, 1.0f, dy, l->w, 0.0f, dx);
}

int pw_mlp_init(pw_mlp_t *m, pw_linear_t *l, int in, const int *widths, int n, bool relu_last,
                int max_batch, uint64_t seed) {
    memset(m, 0, sizeof *m);
    if (n < 1 || n > PW_MLP_MAX || in < 1 || max_batch < 1)
        return PC_EINVAL;
    m->l = l;
    m->relu_last = relu_last;
    m->max_batch = max_batch;
    int rc = 0, widest = in;
    for (int i = 0; i < n && !rc; i++) {
        if (widths[i] < 1) {
            rc = PC_EINVAL;
            break;
        }
        rc = pw_linear_init(&l[i], i ? widths[i - 1] : in, widths[i], seed + (uint64_t)i);
        if (!rc)
            m->nl++;
        widest = widths[i] > widest ? widths[i] : widest;
    }
    const size_t b = (size_t)max_batch;
    for (int i = 0; i <= m->nl && !rc; i++)
        if (!(m->act[i] = malloc(b * (size_t)(i ? widths[i - 1] : in) * sizeof(float))))
            rc = PC_ENOMEM;
    if (!rc && (!(m->ga = malloc(b * (size_t)widest * sizeof(float))) ||
                !(m->gb = malloc(b * (size_t)widest * sizeof(float)))))
        rc = PC_ENOMEM;
    if (rc)
        pw_mlp_free(m);
    return rc;
}

void pw_mlp_free(pw_mlp_t *m) {
    for (int i = 0; i < m->nl; i++)
        pw_linear_free(&m->l[i]);
    for (int i = 0; i <= PW_MLP_MAX; i++)
        free(m->act[i]);
    free(m->ga);
    free(m->gb);
    memset(m, 0, sizeof *m);
}

const float *pw_mlp_forward(const pw_backend_t *be, pw_mlp_t *m, int batch, const float *x) {
    if (batch < 1 || batch > m->max_batch)
        return NULL;
    m->batch = batch;
    memcpy(m->act[0], x, (size_t)batch * m->l[0].in * sizeof(float));
    for (int i = 0; i < m->nl; i++) {
        pw_linear_forward(be, &m->l[i], batch, m->act[i], m->act[i + 1]);
        if (i + 1 < m->nl || m->relu_last)
            be->relu((size_t)batch * m->l[i].out, m->act[i + 1], m->act[i + 1]);
    }
    return m->act[m->nl];
}

void pw_mlp_backward(const pw_backend_t *be, pw_mlp_t *m, const float *dy, float *dx) {
    const int batch = m->batch, last = m->nl - 1;
    float *g = m->ga, *gx = m->gb;
    if (m->relu_last)
        be->relu_grad((size_t)batch * m->l[last].out, m->act[m->nl], dy, g);
    else
        memcpy(g, dy, (size_t)batch * m->l[last].out * sizeof(float));
    for (int i = last; i >= 0; i--) {
        pw_linear_backward(be, &m->l[i], batch, m->act[i], g, i ? gx : dx);
        if (i == 0)
            break;
        be->relu_grad((size_t)batch * m->l[i].in, m->act[i], gx, gx); /* the ReLU before i */
        float *t = g;
        g = gx;
        gx = t;
    }
}

double pw_bce_logits(int batch, const float *logits, const float *labels, float *p,
                     float *dlogits) {
    double loss = 0;
    for (int i = 0; i < batch; i++) {
        const double z = logits[i], y = labels[i];
        /* log(1 + exp(-|z|)) + max(z, 0) - y z: no overflow for any z */
        loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y * z;
        const double s = z >= 0 ? 1 / (1 + exp(-z)) : exp(z) / (1 + exp(z));
        if (p)
            p[i] = (float)s;
        if (dlogits)
            dlogits[i] = (float)((s - y) / batch);
    }
    return batch ? loss / batch : 0;
}

void pw_dot_forward(int batch, int f, int d, const float *z, float *out) {
    const int np = f * (f - 1) / 2;
    for (int b = 0; b < batch; b++) {
        const float *zb = z + (size_t)b * f * d;
        float *o = out + (size_t)b * np;
        for (int i = 1, k = 0; i < f; i++)
            for (int j = 0; j < i; j++, k++) {
                float s = 0;
                for (int e = 0; e < d; e++)
                    s += zb[i * d + e] * zb[j * d + e];
                o[k] = s;
            }
    }
}

void pw_dot_backward(int batch, int f, int d, const float *z, const float *dout, float *dz) {
    const int np = f * (f - 1) / 2;
    memset(dz, 0, (size_t)batch * f * d * sizeof(float));
    for (int b = 0; b < batch; b++) {
        const float *zb = z + (size_t)b * f * d, *g = dout + (size_t)b * np;
        float *dzb = dz + (size_t)b * f * d;
        for (int i = 1, k = 0; i < f; i++)
            for (int j = 0; j < i; j++, k++)
                for (int e = 0; e < d; e++) {
                    dzb[i * d + e] += g[k] * zb[j * d + e];
                    dzb[j * d + e] += g[k] * zb[i * d + e];
                }
    }
}
