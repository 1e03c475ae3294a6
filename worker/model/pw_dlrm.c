/* pw_dlrm.c: see pw_dlrm.h. Two MLPs (pw_mlp_t) over one layer array; the MLPs keep their
 * activations, so backward needs no recomputation.
 *
 * DESIGN
 * - z (per sample the bottom output, then the embeddings: the interaction's input) is the only
 *   copy of the embeddings: as a model (pw_model.h) DLRM pools the rows straight into z and
 *   pools their gradients straight from dz (dlrm_model_forward says how); pw_dlrm_forward, which
 *   takes the embeddings as an array, copies them in. top_in, the top MLP's input, is borrowed
 *   by the MLP (not copied) and its gradient has its own buffer (dtop). A 1024-sample step of
 *   the default model so copies 4.9 MB less than with a copy at each hand-over. */
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
    float *z, *dz; /* z: [bottom output, embeddings] per sample (+ dim floats: see
                    * dlrm_model_forward), and its gradient */
    float *full;   /* interaction scratch: f x f per sample (NULL: the backend's fused one) */
    float *top_in; /* [bottom output, interactions] per sample: the top MLP's input */
    float *dtop;   /* its gradient */
    float *dbot;   /* the bottom output's gradient */
    int np, batch;
};

int pw_dlrm_create(const pw_dlrm_config_t *c, pw_backend_t *be, pw_dlrm_t **out) {
    if (c->ndense < 1 || c->nfields < 1 || c->nfields > PW_POOL_FIELDS_MAX || c->dim < 1 ||
        c->nbottom < 1 || c->nbottom > PW_MLP_MAX || c->ntop < 1 || c->ntop > PW_MLP_MAX ||
        c->max_batch < 1 || c->bottom[c->nbottom - 1] != c->dim || c->top[c->ntop - 1] != 1)
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
    m->z = be->alloc(be, (b * f + 1) * (size_t)c->dim * fl);
    m->dz = be->alloc(be, b * (size_t)f * c->dim * fl);
    const bool fused = be->interact && be->interact_grad; /* no f x f scratch */
    m->full = fused ? NULL : be->alloc(be, b * (size_t)f * f * fl);
    m->top_in = be->alloc(be, b * (size_t)(c->dim + m->np) * fl);
    m->dtop = be->alloc(be, b * (size_t)(c->dim + m->np) * fl);
    m->dbot = be->alloc(be, b * (size_t)c->dim * fl);
    if (!rc && (!m->z || !m->dz || (!fused && !m->full) || !m->top_in || !m->dtop || !m->dbot))
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
    if (m->full)
        m->be->free(m->be, m->full);
    m->be->free(m->be, m->top_in);
    m->be->free(m->be, m->dtop);
    m->be->free(m->be, m->dbot);
    pc_sfree(m);
}

/* Forward from z with its embeddings (vectors 1 .. nfields of each sample) in place. */
static void dlrm_forward_z(pw_dlrm_t *m, int batch, const float *dense, float *logits) {
    pw_backend_t *be = m->be;
    const int d = m->c.dim, f = m->c.nfields + 1, tw = d + m->np;
    m->batch = batch;
    const float *bot = pw_mlp_forward(&m->bottom, batch, dense); /* batch x d */
    be->copy2d(be, batch, d, bot, d, m->z, f * d);               /* z = [bottom, emb] */
    be->copy2d(be, batch, d, bot, d, m->top_in, tw); /* top input = [bottom, interactions] */
    pw_interact_forward(be, batch, f, d, m->z, m->full, m->top_in + d, tw);
    be->copy(be, logits, pw_mlp_forward_borrowed(&m->top, batch, m->top_in),
             (size_t)batch * sizeof(float));
}

int pw_dlrm_forward(pw_dlrm_t *m, int batch, const float *dense, const float *emb, float *logits) {
    const pw_dlrm_config_t *c = &m->c;
    if (batch < 1 || batch > c->max_batch)
        return PC_EINVAL;
    const int d = c->dim, ne = c->nfields * d;
    m->be->copy2d(m->be, batch, ne, emb, ne, m->z + d, ne + d);
    dlrm_forward_z(m, batch, dense, logits);
    return 0;
}

/* Backward: parameter gradients accumulated, dz (the gradient of z) written. */
static void dlrm_backward_z(pw_dlrm_t *m, const float *dlogits) {
    pw_backend_t *be = m->be;
    const int batch = m->batch, d = m->c.dim, f = m->c.nfields + 1, tw = d + m->np;
    pw_mlp_backward(&m->top, dlogits, m->dtop);
    pw_interact_backward(be, batch, f, d, m->z, m->dtop + d, tw, m->full, m->dz);
    /* d bottom = the direct part + the interaction part (z vector 0) */
    be->copy2d(be, batch, d, m->dtop, tw, m->dbot, d);
    be->add2d(be, batch, d, m->dz, f * d, m->dbot, d);
    pw_mlp_backward(&m->bottom, m->dbot, NULL);
}

int pw_dlrm_backward(pw_dlrm_t *m, const float *dlogits, float *demb) {
    const int d = m->c.dim, ne = m->c.nfields * d;
    dlrm_backward_z(m, dlogits);
    m->be->copy2d(m->be, m->batch, ne, m->dz + d, ne + d, demb, ne);
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
    pw_view_t v; /* the last forward's input */
} dlrm_model_t;

static int dlrm_row_dim(const pw_model_config_t *c) {
    return c->dim;
}

static void dlrm_model_destroy(pw_model_t *base) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    pw_dlrm_destroy(m->d);
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
    m->base.params = pw_dlrm_layers(m->d, &m->base.nparams);
    *out = &m->base;
    return 0;
}

/* The rows are pooled straight into z with nfields + 1 fields from z + dim: sample s's field f
 * lands in its vector f + 1, and the extra field, which no feature has (pool writes it zeros), in
 * vector 0 of sample s + 1 (past the last sample: z's slack), the bottom output's place, which
 * dlrm_forward_z writes after. Over PW_POOL_FIELDS_MAX fields, no: the gradient side reads dz the
 * same way (pool_grad with nfields + 1 fields from dz + dim reads only real fields' vectors). */
static bool dlrm_pools_in_place(const pw_model_config_t *c) {
    return c->nfields + 1 <= PW_POOL_FIELDS_MAX;
}

static int dlrm_model_forward(pw_model_t *base, const pw_view_t *v, float *logits) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    const pw_model_config_t *c = &base->c;
    pw_backend_t *be = base->be;
    if (v->n < 1 || v->n > c->max_batch)
        return PC_EINVAL;
    m->v = *v;
    if (!dlrm_pools_in_place(c)) { /* pooled into dz (free until backward), then copied */
        be->pool(be, v->n, v->key_off, v->fields, v->vals, c->nfields, c->dim, v->rows, c->dim,
                 c->mean, m->d->dz);
        return pw_dlrm_forward(m->d, v->n, v->dense, m->d->dz, logits);
    }
    if (v->rows)
        be->pool(be, v->n, v->key_off, v->fields, v->vals, c->nfields + 1, c->dim, v->rows, c->dim,
                 c->mean, m->d->z + c->dim);
    else /* through inv (dlrm_reads_unique) */
        be->pool_unique(be, v->n, v->key_off, v->fields, v->vals, c->nfields + 1, c->dim, v->urows,
                        v->inv, c->mean, m->d->z + c->dim);
    dlrm_forward_z(m->d, v->n, v->dense, logits);
    return 0;
}

static int dlrm_model_backward(pw_model_t *base, const float *dlogits, float *drows) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    const pw_model_config_t *c = &base->c;
    const pw_view_t *v = &m->v;
    pw_backend_t *be = base->be;
    dlrm_backward_z(m->d, dlogits);
    be->zero(be, drows, v->nk * (size_t)c->dim * sizeof(float));
    if (!dlrm_pools_in_place(c)) { /* the embeddings' gradient copied out of dz, over z */
        const int ne = c->nfields * c->dim;
        be->copy2d(be, v->n, ne, m->d->dz + c->dim, ne + c->dim, m->d->z, ne);
        be->pool_grad(be, v->n, v->key_off, v->fields, v->vals, c->nfields, c->dim, m->d->z, c->dim,
                      c->mean, drows);
        return 0;
    }
    be->pool_grad(be, v->n, v->key_off, v->fields, v->vals, c->nfields + 1, c->dim,
                  m->d->dz + c->dim, c->dim, c->mean, drows);
    return 0;
}

/* Pooling in place, on a backend that pools through inv: the rows per feature are never made. */
static bool dlrm_reads_unique(const pw_model_t *base) {
    return dlrm_pools_in_place(&base->c) && base->be->pool_unique && base->be->pool_grad_unique;
}

static int dlrm_model_backward_unique(pw_model_t *base, const float *dlogits, float alpha,
                                      float *ugrads) {
    dlrm_model_t *m = (dlrm_model_t *)base;
    const pw_model_config_t *c = &base->c;
    const pw_view_t *v = &m->v;
    pw_backend_t *be = base->be;
    dlrm_backward_z(m->d, dlogits);
    be->pool_grad_unique(be, v->n, v->key_off, v->fields, v->vals, c->nfields + 1, c->dim,
                         m->d->dz + c->dim, c->mean, v->inv, alpha, ugrads);
    return 0;
}

const pw_model_ops_t pw_model_dlrm = {.name = "dlrm",
                                      .needs_fields = true,
                                      .row_dim = dlrm_row_dim,
                                      .create = dlrm_model_create,
                                      .forward = dlrm_model_forward,
                                      .backward = dlrm_model_backward,
                                      .reads_unique = dlrm_reads_unique,
                                      .backward_unique = dlrm_model_backward_unique,
                                      .destroy = dlrm_model_destroy};
