/* pw_deepfm.c: see pw_deepfm.h. */
#include "pw_deepfm.h"

#include "pc_error.h"
#include "pw_fm.h"

#include <stdlib.h>
#include <string.h>

struct pw_deepfm {
    pw_deepfm_config_t c;
    const pw_backend_t *be;
    pw_linear_t l[PW_MLP_MAX];
    pw_mlp_t mlp;
    int in; /* MLP input width: ndense + nfields * k */
    float *x, *dx, *pooled;
    /* the last forward's inputs */
    int batch;
    const size_t *off;
    const uint16_t *field;
    const float *val, *rows;
};

int pw_deepfm_create(const pw_deepfm_config_t *c, const pw_backend_t *be, pw_deepfm_t **out) {
    if (c->ndense < 1 || c->nfields < 1 || c->nfields > PW_POOL_FIELDS_MAX || c->k < 1 ||
        c->k > PW_FM_K_MAX || c->nlayers < 1 || c->nlayers > PW_MLP_MAX || c->max_batch < 1 ||
        c->widths[c->nlayers - 1] != 1)
        return PC_EINVAL;
    pw_deepfm_t *m = calloc(1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->c = *c;
    m->be = be;
    m->in = c->ndense + c->nfields * c->k;
    int rc = pw_mlp_init(&m->mlp, m->l, m->in, c->widths, c->nlayers, false, c->max_batch, c->seed);
    const size_t b = (size_t)c->max_batch;
    m->x = malloc(b * (size_t)m->in * sizeof(float));
    m->dx = malloc(b * (size_t)m->in * sizeof(float));
    m->pooled = malloc(b * (size_t)c->nfields * c->k * sizeof(float));
    if (!rc && (!m->x || !m->dx || !m->pooled))
        rc = PC_ENOMEM;
    if (rc) {
        pw_deepfm_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void pw_deepfm_destroy(pw_deepfm_t *m) {
    if (!m)
        return;
    if (m->mlp.l)
        pw_mlp_free(&m->mlp);
    free(m->x);
    free(m->dx);
    free(m->pooled);
    free(m);
}

int pw_deepfm_forward(pw_deepfm_t *m, int batch, const float *dense, const size_t *off,
                      const uint16_t *field, const float *val, const float *rows, float *logits) {
    const pw_deepfm_config_t *c = &m->c;
    if (batch < 1 || batch > c->max_batch)
        return PC_EINVAL;
    m->batch = batch;
    m->off = off;
    m->field = field;
    m->val = val;
    m->rows = rows;
    const int k = c->k, pw = c->nfields * k;
    m->be->pool(batch, off, field, val, c->nfields, k, rows + 1, k + 1, c->mean, m->pooled);
    for (int s = 0; s < batch; s++) { /* x = [dense, pooled] */
        memcpy(m->x + (size_t)s * m->in, dense + (size_t)s * c->ndense,
               (size_t)c->ndense * sizeof(float));
        memcpy(m->x + (size_t)s * m->in + c->ndense, m->pooled + (size_t)s * pw,
               (size_t)pw * sizeof(float));
    }
    memcpy(logits, pw_mlp_forward(m->be, &m->mlp, batch, m->x), (size_t)batch * sizeof(float));
    pw_fm_forward(batch, off, val, k, rows, logits);
    return 0;
}

int pw_deepfm_backward(pw_deepfm_t *m, const float *dlogits, float *drows) {
    const pw_deepfm_config_t *c = &m->c;
    const int batch = m->batch, k = c->k, pw = c->nfields * k;
    pw_fm_backward(batch, m->off, m->val, k, m->rows, dlogits, drows); /* writes every row */
    pw_mlp_backward(m->be, &m->mlp, dlogits, m->dx);
    for (int s = 0; s < batch; s++) /* d pooled: the MLP input's gradient past the dense part */
        memcpy(m->pooled + (size_t)s * pw, m->dx + (size_t)s * m->in + c->ndense,
               (size_t)pw * sizeof(float));
    m->be->pool_grad(batch, m->off, m->field, m->val, c->nfields, k, m->pooled, k + 1, c->mean,
                     drows + 1);
    return 0;
}

pw_linear_t *pw_deepfm_layers(pw_deepfm_t *m, int *n) {
    *n = m->c.nlayers;
    return m->l;
}
