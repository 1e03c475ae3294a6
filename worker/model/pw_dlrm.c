/* pw_dlrm.c: see pw_dlrm.h. Two MLPs (pw_mlp_t) over one layer array; the MLPs keep their
 * activations, so backward needs no recomputation. */
#include "pw_dlrm.h"

#include "pc_alloc.h"
#include "pc_log.h"
#include "pw_model.h"

#include "pc_error.h"

#include <stdlib.h>
#include <string.h>

struct pw_dlrm {
    pw_dlrm_config_t c;
    pw_backend_t *be;
    pw_linear_t l[2 * PW_MLP_MAX]; /* bottom layers, then top layers */
    pw_mlp_t bottom, top;
    float *z, *dz; /* z: [bottom output, embeddings] per sample, and its gradient */
    float *full;   /* interaction scratch: f x f per sample */
    float *top_in; /* [bottom output, interactions] per sample; then its gradient */
    float *dbot;   /* the bottom output's gradient */
    int np, batch;
};

int pw_dlrm_create(const pw_dlrm_config_t *c, pw_backend_t *be, pw_dlrm_t **out) {
    if (c->ndense < 1 || c->nfields < 1 || c->dim < 1 || c->nbottom < 1 ||
        c->nbottom > PW_MLP_MAX || c->ntop < 1 || c->ntop > PW_MLP_MAX || c->max_batch < 1 ||
        c->bottom[c->nbottom - 1] != c->dim || c->top[c->ntop - 1] != 1)
        return PC_EINVAL;
    pw_dlrm_t *m = pc_scalloc(PC_MEM_MODEL, 1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->c = *c;
    m->be = be;
    const int f = c->nfields + 1;
    m->np = f * (f - 1) / 2;
    int rc = pw_mlp_init(&m->bottom, be, m->l, c->ndense, c->bottom, c->nbottom, true, c->max_batch,
                         c->seed);
    if (!rc)
        rc = pw_mlp_init(&m->top, be, m->l + c->nbottom, c->dim + m->np, c->top, c->ntop, false,
                         c->max_batch, c->seed + (uint64_t)c->nbottom);
    const size_t b = (size_t)c->max_batch, fl = sizeof(float);
    m->z = be->alloc(be, b * (size_t)f * c->dim * fl);
    m->dz = be->alloc(be, b * (size_t)f * c->dim * fl);
    m->full = be->alloc(be, b * (size_t)f * f * fl);
    m->top_in = be->alloc(be, b * (size_t)(c->dim + m->np) * fl);
    m->dbot = be->alloc(be, b * (size_t)c->dim * fl);
    if (!rc && (!m->z || !m->dz || !m->full || !m->top_in || !m->dbot))
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
    m->be->free(m->be, m->z);
    m->be->free(m->be, m->dz);
    m->be->free(m->be, m->full);
    m->be->free(m->be, m->top_in);
    m->be->free(m->be, m->dbot);
    pc_sfree(m);
}

int pw_dlrm_forward(pw_dlrm_t *m, int batch, const float *dense, const float *emb, float *logits) {
    const pw_dlrm_config_t *c = &m->c;
    if (batch < 1 || batch > c->max_batch)
        return PC_EINVAL;
    pw_backend_t *be = m->be;
    const int d = c->dim, f = c->nfields + 1, tw = d + m->np, ne = c->nfields * d;
    m->batch = batch;
    const float *bot = pw_mlp_forward(&m->bottom, batch, dense); /* batch x d */
    be->copy2d(be, batch, d, bot, d, m->z, f * d);               /* z = [bottom, emb] */
    be->copy2d(be, batch, ne, emb, ne, m->z + d, f * d);
    be->copy2d(be, batch, d, bot, d, m->top_in, tw); /* top input = [bottom, interactions] */
    pw_interact_forward(be, batch, f, d, m->z, m->full, m->top_in + d, tw);
    be->copy(be, logits, pw_mlp_forward(&m->top, batch, m->top_in), (size_t)batch * sizeof(float));
    return 0;
}

int pw_dlrm_backward(pw_dlrm_t *m, const float *dlogits, float *demb) {
    const pw_dlrm_config_t *c = &m->c;
    pw_backend_t *be = m->be;
    const int batch = m->batch, d = c->dim, f = c->nfields + 1, tw = d + m->np, ne = c->nfields * d;
    float *dtop = m->top_in; /* the top's input is kept by the top MLP itself */
    pw_mlp_backward(&m->top, dlogits, dtop);
    pw_interact_backward(be, batch, f, d, m->z, dtop + d, tw, m->full, m->dz);
    /* d bottom = the direct part + the interaction part (z vector 0) */
    be->copy2d(be, batch, d, dtop, tw, m->dbot, d);
    be->add2d(be, batch, d, m->dz, f * d, m->dbot, d);
    be->copy2d(be, batch, ne, m->dz + d, f * d, demb, ne);
    pw_mlp_backward(&m->bottom, m->dbot, NULL);
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

/* ---- DLRM as a model (pw_model.h): the embeddings pooled per field first ---- */

typedef struct dlrm_model {
    pw_model_t base;
    pw_dlrm_t *d;
    float *pooled, *dpooled; /* max_batch x nfields x dim */
    pw_view_t v;             /* the last forward's input */
} dlrm_model_t;

static int dlrm_row_dim(const pw_model_config_t *c) {
    return c->dim;
}

static void dlrm_model_destroy(pw_model_t *base) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    pw_dlrm_destroy(m->d);
    base->be->free(base->be, m->pooled);
    base->be->free(base->be, m->dpooled);
    pc_sfree(m);
}

static int dlrm_model_create(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out) {
    pw_dlrm_config_t dc = {.ndense = c->ndense,
                           .nfields = c->nfields,
                           .dim = c->dim,
                           .nbottom = c->nbottom,
                           .ntop = c->ntop,
                           .max_batch = c->max_batch,
                           .seed = c->seed};
    memcpy(dc.bottom, c->bottom, sizeof dc.bottom);
    memcpy(dc.top, c->top, sizeof dc.top);
    dlrm_model_t *m = pc_scalloc(PC_MEM_MODEL, 1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->base = (pw_model_t){.ops = &pw_model_dlrm, .be = be, .c = *c, .row_dim = c->dim};
    int rc = pw_dlrm_create(&dc, be, &m->d);
    if (rc) {
        PC_ERROR("train: DLRM layers do not fit (bottom must end at dim %d, top at 1)", c->dim);
        pc_sfree(m);
        return rc;
    }
    const size_t pooled = (size_t)c->max_batch * c->nfields * c->dim * sizeof(float);
    m->pooled = be->alloc(be, pooled);
    m->dpooled = be->alloc(be, pooled);
    if (!m->pooled || !m->dpooled) {
        dlrm_model_destroy(&m->base);
        return PC_ENOMEM;
    }
    m->base.params = pw_dlrm_layers(m->d, &m->base.nparams);
    *out = &m->base;
    return 0;
}

static int dlrm_model_forward(pw_model_t *base, const pw_view_t *v, float *logits) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    const pw_model_config_t *c = &base->c;
    if (v->n < 1 || v->n > c->max_batch)
        return PC_EINVAL;
    m->v = *v;
    base->be->pool(base->be, v->n, v->key_off, v->fields, v->vals, c->nfields, c->dim, v->rows,
                   c->dim, c->mean, m->pooled);
    return pw_dlrm_forward(m->d, v->n, v->dense, m->pooled, logits);
}

static int dlrm_model_backward(pw_model_t *base, const float *dlogits, float *drows) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    const pw_model_config_t *c = &base->c;
    const pw_view_t *v = &m->v;
    int rc = pw_dlrm_backward(m->d, dlogits, m->dpooled);
    if (rc)
        return rc;
    base->be->zero(base->be, drows, v->nk * (size_t)c->dim * sizeof(float));
    base->be->pool_grad(base->be, v->n, v->key_off, v->fields, v->vals, c->nfields, c->dim,
                        m->dpooled, c->dim, c->mean, drows);
    return 0;
}

const pw_model_ops_t pw_model_dlrm = {.name = "dlrm",
                                      .needs_fields = true,
                                      .row_dim = dlrm_row_dim,
                                      .create = dlrm_model_create,
                                      .forward = dlrm_model_forward,
                                      .backward = dlrm_model_backward,
                                      .destroy = dlrm_model_destroy};
