/* pw_dlrm.c: see pw_dlrm.h. Two MLPs (pw_mlp_t) over one layer array; the MLPs keep their
 * activations, so backward needs no recomputation. */
#include "pw_dlrm.h"

#include "pc_error.h"

#include <stdlib.h>
#include <string.h>

struct pw_dlrm {
    pw_dlrm_config_t c;
    const pw_backend_t *be;
    pw_linear_t l[2 * PW_MLP_MAX]; /* bottom layers, then top layers */
    pw_mlp_t bottom, top;
    float *z, *dz; /* z: [bottom output, embeddings] per sample, and its gradient */
    float *top_in; /* [bottom output, interactions] per sample; then its gradient */
    float *inter;  /* interactions; their gradient; then the bottom's (max(np, dim) wide) */
    int np, batch;
};

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
    int rc = pw_mlp_init(&m->bottom, m->l, c->ndense, c->bottom, c->nbottom, true, c->max_batch,
                         c->seed);
    if (!rc)
        rc = pw_mlp_init(&m->top, m->l + c->nbottom, c->dim + m->np, c->top, c->ntop, false,
                         c->max_batch, c->seed + (uint64_t)c->nbottom);
    const size_t b = (size_t)c->max_batch;
    m->z = malloc(b * (size_t)f * c->dim * sizeof(float));
    m->dz = malloc(b * (size_t)f * c->dim * sizeof(float));
    m->top_in = malloc(b * (size_t)(c->dim + m->np) * sizeof(float));
    m->inter = malloc(b * (size_t)(m->np > c->dim ? m->np : c->dim) * sizeof(float));
    if (!rc && (!m->z || !m->dz || !m->top_in || !m->inter))
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
    if (m->bottom.l)
        pw_mlp_free(&m->bottom);
    if (m->top.l)
        pw_mlp_free(&m->top);
    free(m->z);
    free(m->dz);
    free(m->top_in);
    free(m->inter);
    free(m);
}

int pw_dlrm_forward(pw_dlrm_t *m, int batch, const float *dense, const float *emb, float *logits) {
    const pw_dlrm_config_t *c = &m->c;
    if (batch < 1 || batch > c->max_batch)
        return PC_EINVAL;
    const int d = c->dim, f = c->nfields + 1, tw = d + m->np;
    m->batch = batch;
    const float *bot = pw_mlp_forward(m->be, &m->bottom, batch, dense); /* batch x d */
    for (int s = 0; s < batch; s++) {                                   /* z = [bottom, emb] */
        memcpy(m->z + (size_t)s * f * d, bot + (size_t)s * d, (size_t)d * sizeof(float));
        memcpy(m->z + (size_t)s * f * d + d, emb + (size_t)s * c->nfields * d,
               (size_t)c->nfields * d * sizeof(float));
    }
    pw_dot_forward(batch, f, d, m->z, m->inter);
    for (int s = 0; s < batch; s++) { /* top input = [bottom, interactions] */
        memcpy(m->top_in + (size_t)s * tw, bot + (size_t)s * d, (size_t)d * sizeof(float));
        memcpy(m->top_in + (size_t)s * tw + d, m->inter + (size_t)s * m->np,
               (size_t)m->np * sizeof(float));
    }
    memcpy(logits, pw_mlp_forward(m->be, &m->top, batch, m->top_in), (size_t)batch * sizeof(float));
    return 0;
}

int pw_dlrm_backward(pw_dlrm_t *m, const float *dlogits, float *demb) {
    const pw_dlrm_config_t *c = &m->c;
    const int batch = m->batch, d = c->dim, f = c->nfields + 1, tw = d + m->np;
    float *dtop = m->top_in; /* the top's input is kept by the top MLP itself */
    pw_mlp_backward(m->be, &m->top, dlogits, dtop);
    for (int s = 0; s < batch; s++)
        memcpy(m->inter + (size_t)s * m->np, dtop + (size_t)s * tw + d,
               (size_t)m->np * sizeof(float));
    pw_dot_backward(batch, f, d, m->z, m->inter, m->dz);
    float *dbot = m->inter;         /* reuse: the interaction gradient is consumed */
    for (int s = 0; s < batch; s++) /* d bottom = direct part + interaction part (z vector 0) */
        for (int e = 0; e < d; e++)
            dbot[(size_t)s * d + e] = dtop[(size_t)s * tw + e] + m->dz[(size_t)s * f * d + e];
    for (int s = 0; s < batch; s++)
        memcpy(demb + (size_t)s * c->nfields * d, m->dz + (size_t)s * f * d + d,
               (size_t)c->nfields * d * sizeof(float));
    pw_mlp_backward(m->be, &m->bottom, dbot, NULL);
    return 0;
}

pw_linear_t *pw_dlrm_layers(pw_dlrm_t *m, int *n) {
    *n = m->c.nbottom + m->c.ntop;
    return m->l;
}

void pw_dlrm_zero_grad(pw_dlrm_t *m) {
    for (int i = 0; i < m->c.nbottom + m->c.ntop; i++)
        pw_linear_zero_grad(&m->l[i]);
}
