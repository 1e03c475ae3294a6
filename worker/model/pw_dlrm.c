/* pw_dlrm.c: see pw_dlrm.h. Activations are stored per layer (inputs and outputs) so backward
 * needs no recomputation. */
#include "pw_dlrm.h"

#include "pc_error.h"

#include <stdlib.h>
#include <string.h>

struct pw_dlrm {
    pw_dlrm_config_t c;
    const pw_backend_t *be;
    int nl; /* layers: nbottom + ntop */
    pw_linear_t l[2 * PW_MLP_MAX];
    float *act[2 * PW_MLP_MAX + 1];  /* act[i]: input of layer i (bottom: act[0] = dense copy) */
    float *z, *grad_a, *grad_b, *dz; /* z: [bottom, embeddings] per sample */
    int np, batch;
};

static int width_in(const pw_dlrm_t *m, int i) {
    return m->l[i].in;
}

int pw_dlrm_create(const pw_dlrm_config_t *c, const pw_backend_t *be, pw_dlrm_t **out) {
    if (c->ndense < 1 || c->nfields < 1 || c->dim < 1 || c->nbottom < 1 ||
        c->nbottom > PW_MLP_MAX || c->ntop < 1 || c->ntop > PW_MLP_MAX || c->max_batch < 1 ||
        c->bottom[c->nbottom - 1] != c->dim || c->top[c->ntop - 1] != 1)
        return PC_EINVAL;
    pw_dlrm_t *m = calloc(1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->c = *c;
    m->be = be;
    const int f = c->nfields + 1;
    m->np = f * (f - 1) / 2;
    int rc = 0, in = c->ndense, widest = c->ndense;
    for (int i = 0; i < c->nbottom && !rc; i++, m->nl++) {
        rc = pw_linear_init(&m->l[m->nl], in, c->bottom[i], c->seed + (uint64_t)m->nl);
        in = c->bottom[i];
        widest = in > widest ? in : widest;
    }
    in = c->dim + m->np;
    widest = in > widest ? in : widest;
    for (int i = 0; i < c->ntop && !rc; i++, m->nl++) {
        rc = pw_linear_init(&m->l[m->nl], in, c->top[i], c->seed + (uint64_t)m->nl);
        in = c->top[i];
        widest = in > widest ? in : widest;
    }
    const size_t b = (size_t)c->max_batch;
    for (int i = 0; !rc && i <= m->nl; i++) {
        const int w = i < m->nl ? width_in(m, i) : 1;
        if (!(m->act[i] = malloc(b * (size_t)w * sizeof(float))))
            rc = PC_ENOMEM;
    }
    m->z = malloc(b * (size_t)f * c->dim * sizeof(float));
    m->dz = malloc(b * (size_t)f * c->dim * sizeof(float));
    m->grad_a = malloc(b * (size_t)widest * sizeof(float));
    m->grad_b = malloc(b * (size_t)widest * sizeof(float));
    if (!rc && (!m->z || !m->dz || !m->grad_a || !m->grad_b))
        rc = PC_ENOMEM;
    if (rc) {
        pw_dlrm_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void pw_dlrm_destroy(pw_dlrm_t *m) {
    if (!m)
        return;
    for (int i = 0; i < m->nl; i++)
        pw_linear_free(&m->l[i]);
    for (int i = 0; i <= 2 * PW_MLP_MAX; i++)
        free(m->act[i]);
    free(m->z);
    free(m->dz);
    free(m->grad_a);
    free(m->grad_b);
    free(m);
}

int pw_dlrm_forward(pw_dlrm_t *m, int batch, const float *dense, const float *emb, float *logits) {
    const pw_dlrm_config_t *c = &m->c;
    if (batch < 1 || batch > c->max_batch)
        return PC_EINVAL;
    const pw_backend_t *be = m->be;
    const int d = c->dim, f = c->nfields + 1, nb = c->nbottom;
    m->batch = batch;
    memcpy(m->act[0], dense, (size_t)batch * c->ndense * sizeof(float));
    for (int i = 0; i < nb; i++) { /* bottom: Linear + ReLU */
        pw_linear_forward(be, &m->l[i], batch, m->act[i], m->act[i + 1]);
        be->relu((size_t)batch * m->l[i].out, m->act[i + 1], m->act[i + 1]);
    }
    const float *bot = m->act[nb];    /* batch x d, dense rows */
    for (int s = 0; s < batch; s++) { /* z = [bottom, embeddings] */
        memcpy(m->z + (size_t)s * f * d, bot + (size_t)s * d, (size_t)d * sizeof(float));
        memcpy(m->z + (size_t)s * f * d + d, emb + (size_t)s * c->nfields * d,
               (size_t)c->nfields * d * sizeof(float));
    }
    /* Top input = [bottom, interactions]. The bottom output stays in z (vector 0), so act[nb]
     * (allocated with the top input's width) is rebuilt as the top input. */
    float *inter = m->grad_a;
    pw_dot_forward(batch, f, d, m->z, inter);
    const int tw = d + m->np;
    for (int s = 0; s < batch; s++) { /* sources are z and inter, never act[nb] itself */
        memcpy(m->act[nb] + (size_t)s * tw, m->z + (size_t)s * f * d, (size_t)d * sizeof(float));
        memcpy(m->act[nb] + (size_t)s * tw + d, inter + (size_t)s * m->np,
               (size_t)m->np * sizeof(float));
    }
    for (int i = nb; i < m->nl; i++) {
        pw_linear_forward(be, &m->l[i], batch, m->act[i], m->act[i + 1]);
        if (i + 1 < m->nl)
            be->relu((size_t)batch * m->l[i].out, m->act[i + 1], m->act[i + 1]);
    }
    memcpy(logits, m->act[m->nl], (size_t)batch * sizeof(float));
    return 0;
}

int pw_dlrm_backward(pw_dlrm_t *m, const float *dlogits, float *demb) {
    const pw_dlrm_config_t *c = &m->c;
    const pw_backend_t *be = m->be;
    const int batch = m->batch, d = c->dim, f = c->nfields + 1, nb = c->nbottom;
    const int tw = d + m->np;
    float *g = m->grad_a, *gx = m->grad_b;
    memcpy(g, dlogits, (size_t)batch * sizeof(float));
    for (int i = m->nl - 1; i >= nb; i--) { /* top */
        pw_linear_backward(be, &m->l[i], batch, m->act[i], g, gx);
        if (i > nb) /* through the ReLU that produced act[i] */
            be->relu_grad((size_t)batch * m->l[i].in, m->act[i], gx, gx);
        float *t = g;
        g = gx;
        gx = t;
    }
    /* g: d top_in (batch x tw) = [d bottom (direct), d inter] */
    float *dinter = gx;
    for (int s = 0; s < batch; s++)
        memcpy(dinter + (size_t)s * m->np, g + (size_t)s * tw + d, (size_t)m->np * sizeof(float));
    pw_dot_backward(batch, f, d, m->z, dinter, m->dz);
    /* d bottom = direct part + interaction part (z vector 0) */
    float *dbot = dinter; /* reuse: dinter is consumed */
    for (int s = 0; s < batch; s++)
        for (int e = 0; e < d; e++)
            dbot[(size_t)s * d + e] = g[(size_t)s * tw + e] + m->dz[(size_t)s * f * d + e];
    for (int s = 0; s < batch; s++)
        memcpy(demb + (size_t)s * c->nfields * d, m->dz + (size_t)s * f * d + d,
               (size_t)c->nfields * d * sizeof(float));
    /* bottom: act[nb] now holds the top input; the bottom output is vector 0 of z */
    float *gb = dbot, *gbx = g;
    for (int i = nb - 1; i >= 0; i--) {
        /* through the ReLU after layer i (its output: z's vector 0 for the last bottom layer) */
        if (i == nb - 1) {
            for (int s = 0; s < batch; s++)
                for (int e = 0; e < d; e++)
                    if (m->z[(size_t)s * f * d + e] <= 0)
                        gb[(size_t)s * d + e] = 0;
        } else {
            be->relu_grad((size_t)batch * m->l[i].out, m->act[i + 1], gb, gb);
        }
        pw_linear_backward(be, &m->l[i], batch, m->act[i], gb, i > 0 ? gbx : NULL);
        float *t = gb;
        gb = gbx;
        gbx = t;
    }
    return 0;
}

pw_linear_t *pw_dlrm_layers(pw_dlrm_t *m, int *n) {
    *n = m->nl;
    return m->l;
}

void pw_dlrm_zero_grad(pw_dlrm_t *m) {
    for (int i = 0; i < m->nl; i++)
        pw_linear_zero_grad(&m->l[i]);
}
