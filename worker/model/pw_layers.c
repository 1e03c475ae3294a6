/* pw_layers.c: see pw_layers.h. */
#include "pw_layers.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_rand.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int pw_linear_init(pw_linear_t *l, pw_backend_t *be, int in, int out, uint64_t seed) {
    memset(l, 0, sizeof *l);
    if (in < 1 || out < 1)
        return PC_EINVAL;
    const size_t nw = (size_t)in * out;
    l->be = be;
    l->in = in;
    l->out = out;
    float *w = pc_smalloc(PC_MEM_MODEL,
                          nw * sizeof(float)); /* drawn on the host: the same on every backend */
    l->w = be->alloc(be, nw * sizeof(float));
    l->dw = be->alloc(be, nw * sizeof(float));
    l->b = be->alloc(be, (size_t)out * sizeof(float));
    l->db = be->alloc(be, (size_t)out * sizeof(float));
    if (!w || !l->w || !l->dw || !l->b || !l->db) {
        pc_sfree(w);
        pw_linear_free(l);
        return PC_ENOMEM;
    }
    const double limit = sqrt(6.0 / (in + out)); /* Glorot & Bengio 2010 */
    uint64_t st = seed;
    for (size_t i = 0; i < nw; i++)
        w[i] = (float)((2 * pc_rand_unit(&st) - 1) * limit);
    be->upload(be, l->w, w, nw * sizeof(float));
    pc_sfree(w);
    return 0;
}

void pw_linear_free(pw_linear_t *l) {
    if (l->be) {
        l->be->free(l->be, l->w);
        l->be->free(l->be, l->b);
        l->be->free(l->be, l->dw);
        l->be->free(l->be, l->db);
    }
    memset(l, 0, sizeof *l);
}

void pw_linear_zero_grad(pw_linear_t *l) {
    l->be->zero(l->be, l->dw, (size_t)l->in * l->out * sizeof(float));
    l->be->zero(l->be, l->db, (size_t)l->out * sizeof(float));
}

/* y (batch x out) = x (batch x in) * W^T (in x out) + b, then max(y, 0) when relu (fused). */
static void linear_act(const pw_linear_t *l, int batch, const float *x, bool relu, float *y) {
    l->be->gemm(l->be, false, true, batch, l->out, l->in, 1.0f, x, l->w, 0.0f, y);
    l->be->bias_act(l->be, batch, l->out, l->b, relu, y);
}

void pw_linear_forward(const pw_linear_t *l, int batch, const float *x, float *y) {
    linear_act(l, batch, x, false, y);
}

void pw_linear_backward(pw_linear_t *l, int batch, const float *x, const float *dy, float *dx) {
    pw_backend_t *be = l->be;
    /* dW (out x in) += dy^T (out x batch) * x (batch x in); db += column sums of dy */
    be->gemm(be, true, false, l->out, l->in, batch, 1.0f, dy, x, 1.0f, l->dw);
    be->col_sum(be, batch, l->out, dy, 1.0f, l->db);
    if (dx) /* dx (batch x in) = dy (batch x out) * W (out x in) */
        be->gemm(be, false, false, batch, l->in, l->out, 1.0f, dy, l->w, 0.0f, dx);
}

int pw_mlp_init(pw_mlp_t *m, pw_backend_t *be, pw_linear_t *l, int in, const int *widths, int n,
                bool relu_last, int max_batch, uint64_t seed) {
    memset(m, 0, sizeof *m);
    if (n < 1 || n > PW_MLP_MAX || in < 1 || max_batch < 1)
        return PC_EINVAL;
    m->be = be;
    m->l = l;
    m->relu_last = relu_last;
    m->max_batch = max_batch;
    int rc = 0, widest = in;
    for (int i = 0; i < n && !rc; i++) {
        if (widths[i] < 1) {
            rc = PC_EINVAL;
            break;
        }
        rc = pw_linear_init(&l[i], be, i ? widths[i - 1] : in, widths[i], seed + (uint64_t)i);
        if (!rc)
            m->nl++;
        widest = widths[i] > widest ? widths[i] : widest;
    }
    const size_t b = (size_t)max_batch;
    for (int i = 0; i <= m->nl && !rc; i++)
        if (!(m->act[i] = be->alloc(be, b * (size_t)(i ? widths[i - 1] : in) * sizeof(float))))
            rc = PC_ENOMEM;
    if (!rc && (!(m->ga = be->alloc(be, b * (size_t)widest * sizeof(float))) ||
                !(m->gb = be->alloc(be, b * (size_t)widest * sizeof(float)))))
        rc = PC_ENOMEM;
    if (rc)
        pw_mlp_free(m);
    return rc;
}

void pw_mlp_free(pw_mlp_t *m) {
    for (int i = 0; i < m->nl; i++)
        pw_linear_free(&m->l[i]);
    for (int i = 0; m->be && i <= PW_MLP_MAX; i++)
        m->be->free(m->be, m->act[i]);
    if (m->be) {
        m->be->free(m->be, m->ga);
        m->be->free(m->be, m->gb);
    }
    memset(m, 0, sizeof *m);
}

const float *pw_mlp_forward_borrowed(pw_mlp_t *m, int batch, const float *x) {
    if (batch < 1 || batch > m->max_batch)
        return NULL;
    m->batch = batch;
    m->in = x;
    for (int i = 0; i < m->nl; i++)
        linear_act(&m->l[i], batch, i ? m->act[i] : x, i + 1 < m->nl || m->relu_last,
                   m->act[i + 1]);
    return m->act[m->nl];
}

const float *pw_mlp_forward(pw_mlp_t *m, int batch, const float *x) {
    if (batch < 1 || batch > m->max_batch)
        return NULL;
    m->be->copy(m->be, m->act[0], x, (size_t)batch * m->l[0].in * sizeof(float));
    return pw_mlp_forward_borrowed(m, batch, m->act[0]);
}

void pw_mlp_backward(pw_mlp_t *m, const float *dy, float *dx) {
    pw_backend_t *be = m->be;
    const int batch = m->batch, last = m->nl - 1;
    float *g = m->ga, *gx = m->gb;
    if (m->relu_last)
        be->relu_grad(be, (size_t)batch * m->l[last].out, m->act[m->nl], dy, g);
    else
        be->copy(be, g, dy, (size_t)batch * m->l[last].out * sizeof(float));
    for (int i = last; i >= 0; i--) {
        pw_linear_backward(&m->l[i], batch, i ? m->act[i] : m->in, g, i ? gx : dx);
        if (i == 0)
            break;
        be->relu_grad(be, (size_t)batch * m->l[i].in, m->act[i], gx, gx); /* the ReLU before i */
        float *t = g;
        g = gx;
        gx = t;
    }
}

void pw_interact_forward(pw_backend_t *be, int n, int f, int d, const float *z, float *full,
                         float *out, int ldo) {
    if (be->interact) {
        be->interact(be, n, f, d, z, out, ldo);
        return;
    }
    const size_t sz = (size_t)f * d, sf = (size_t)f * f;
    be->gemm_batched(be, false, true, f, f, d, 1.0f, z, sz, z, sz, 0.0f, full, sf, n);
    be->tril_pack(be, n, f, full, out, ldo);
}

void pw_interact_backward(pw_backend_t *be, int n, int f, int d, const float *z, const float *dout,
                          int ldd, float *full, float *dz) {
    /* d<z_i, z_j>/dz_i = z_j: dz_s = (G + G^T) z_s with G the gradients below the diagonal */
    if (be->interact_grad) {
        be->interact_grad(be, n, f, d, z, dout, ldd, dz);
        return;
    }
    const size_t sz = (size_t)f * d, sf = (size_t)f * f;
    be->tril_unpack(be, n, f, dout, ldd, full);
    be->gemm_batched(be, false, false, f, d, f, 1.0f, full, sf, z, sz, 0.0f, dz, sz, n);
}
