/* pw_deepfm.c: see pw_deepfm.h. */
#include "pw_deepfm.h"

#include "pc_alloc.h"
#include "pc_log.h"
#include "pw_model.h"

#include "pc_error.h"

#include <stdlib.h>
#include <string.h>

struct pw_deepfm {
    pw_deepfm_config_t c;
    pw_backend_t *be;
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

int pw_deepfm_create(const pw_deepfm_config_t *c, pw_backend_t *be, pw_deepfm_t **out) {
    if (c->ndense < 1 || c->nfields < 1 || c->nfields > PW_POOL_FIELDS_MAX || c->k < 1 ||
        c->k > PW_FM_K_MAX || c->nlayers < 1 || c->nlayers > PW_MLP_MAX || c->max_batch < 1 ||
        c->widths[c->nlayers - 1] != 1)
        return PC_EINVAL;
    pw_deepfm_t *m = pc_scalloc(PC_MEM_MODEL, 1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->c = *c;
    m->be = be;
    m->in = c->ndense + c->nfields * c->k;
    int rc =
        pw_mlp_init(&m->mlp, be, m->l, m->in, c->widths, c->nlayers, false, c->max_batch, c->seed);
    const size_t b = (size_t)c->max_batch;
    m->x = be->alloc(be, b * (size_t)m->in * sizeof(float));
    m->dx = be->alloc(be, b * (size_t)m->in * sizeof(float));
    m->pooled = be->alloc(be, b * (size_t)c->nfields * c->k * sizeof(float));
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
    m->be->free(m->be, m->x);
    m->be->free(m->be, m->dx);
    m->be->free(m->be, m->pooled);
    pc_sfree(m);
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
    pw_backend_t *be = m->be;
    const int k = c->k, pw = c->nfields * k;
    be->pool(be, batch, off, field, val, c->nfields, k, rows + 1, k + 1, c->mean, m->pooled);
    be->copy2d(be, batch, c->ndense, dense, c->ndense, m->x, m->in); /* x = [dense, pooled] */
    be->copy2d(be, batch, pw, m->pooled, pw, m->x + c->ndense, m->in);
    be->copy(be, logits, pw_mlp_forward(&m->mlp, batch, m->x), (size_t)batch * sizeof(float));
    be->fm(be, batch, off, val, k, rows, logits);
    return 0;
}

int pw_deepfm_backward(pw_deepfm_t *m, const float *dlogits, float *drows) {
    const pw_deepfm_config_t *c = &m->c;
    pw_backend_t *be = m->be;
    const int batch = m->batch, k = c->k, pw = c->nfields * k;
    be->fm_grad(be, batch, m->off, m->val, k, m->rows, dlogits, drows); /* writes every row */
    pw_mlp_backward(&m->mlp, dlogits, m->dx);
    /* d pooled: the MLP input's gradient past the dense part */
    be->copy2d(be, batch, pw, m->dx + c->ndense, m->in, m->pooled, pw);
    be->pool_grad(be, batch, m->off, m->field, m->val, c->nfields, k, m->pooled, k + 1, c->mean,
                  drows + 1);
    return 0;
}

pw_linear_t *pw_deepfm_layers(pw_deepfm_t *m, int *n) {
    *n = m->c.nlayers;
    return m->l;
}

/* ---- DeepFM as a model (pw_model.h) ---- */

typedef struct deepfm_model {
    pw_model_t base;
    pw_deepfm_t *d;
} deepfm_model_t;

static int deepfm_row_dim(const pw_model_config_t *c) {
    return c->dim + 1; /* [w, v_1 .. v_k] */
}

static void deepfm_model_destroy(pw_model_t *base) {
    pw_deepfm_destroy(((deepfm_model_t *)base)->d);
    pc_sfree(base);
}

static int deepfm_model_create(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out) {
    pw_deepfm_config_t dc = {.ndense = c->ndense,
                             .nfields = c->nfields,
                             .k = c->dim,
                             .nlayers = c->ntop,
                             .mean = c->mean,
                             .max_batch = c->max_batch,
                             .seed = c->seed};
    memcpy(dc.widths, c->top, sizeof dc.widths);
    deepfm_model_t *m = pc_scalloc(PC_MEM_MODEL, 1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->base = (pw_model_t){.ops = &pw_model_deepfm, .be = be, .c = *c, .row_dim = c->dim + 1};
    int rc = pw_deepfm_create(&dc, be, &m->d);
    if (rc) {
        PC_ERROR("train: DeepFM layers do not fit (top must end at 1)");
        pc_sfree(m);
        return rc;
    }
    m->base.params = pw_deepfm_layers(m->d, &m->base.nparams);
    *out = &m->base;
    return 0;
}

static int deepfm_model_forward(pw_model_t *base, const pw_view_t *v, float *logits) {
    return pw_deepfm_forward(((deepfm_model_t *)base)->d, v->n, v->dense, v->key_off, v->fields,
                             v->vals, v->rows, logits);
}

static int deepfm_model_backward(pw_model_t *base, const float *dlogits, float *drows) {
    return pw_deepfm_backward(((deepfm_model_t *)base)->d, dlogits, drows);
}

const pw_model_ops_t pw_model_deepfm = {.name = "deepfm",
                                        .needs_fields = true,
                                        .row_dim = deepfm_row_dim,
                                        .create = deepfm_model_create,
                                        .forward = deepfm_model_forward,
                                        .backward = deepfm_model_backward,
                                        .destroy = deepfm_model_destroy};
