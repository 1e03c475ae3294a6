/* pw_fm.c: the factorization machine (Rendle 2010) and logistic regression as models
 * (pw_model.h).
 *
 *   rows   one per feature: [w, v_1 .. v_k] (table dim k + 1; LR: k = 0, dim 1, rows from 0)
 *   logit  = dense W + b + sum_j w_j x_j + pairwise interactions of the v_j x_j
 *
 * The dense features enter through one linear layer (its weights start at zero, so an untrained
 * model is the table's alone); the per-feature part is the backend's fm / fm_grad. Features of
 * any field and any number per sample.
 */
#include "pw_model.h"

#include "pc_alloc.h"
#include "pc_error.h"

#include <stdlib.h>

typedef struct fm {
    pw_model_t base;
    pw_linear_t lin; /* dense features -> logit */
    pw_view_t v;     /* the last forward's input */
} fm_t;

static int fm_row_dim(const pw_model_config_t *c) {
    return c->dim + 1;
}

static int lr_row_dim(const pw_model_config_t *c) {
    (void)c;
    return 1;
}

static void fm_destroy(pw_model_t *base) {
    fm_t *m = (fm_t *)base;
    pw_linear_free(&m->lin);
    pc_sfree(m);
}

static int create(const pw_model_ops_t *ops, const pw_model_config_t *c, pw_backend_t *be,
                  pw_model_t **out) {
    if (c->ndense < 1 || c->max_batch < 1 || (ops == &pw_model_fm && c->dim > PW_FM_K_MAX))
        return PC_EINVAL;
    fm_t *m = pc_scalloc(PC_MEM_MODEL, 1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    int rc = pw_linear_init(&m->lin, be, c->ndense, 1, c->seed);
    if (rc) {
        pc_sfree(m);
        return rc;
    }
    be->zero(be, m->lin.w, (size_t)c->ndense * sizeof(float)); /* the linear part starts at 0 */
    m->base = (pw_model_t){
        .ops = ops, .be = be, .c = *c, .row_dim = ops->row_dim(c), .params = &m->lin, .nparams = 1};
    *out = &m->base;
    return 0;
}

static int fm_create(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out) {
    return create(&pw_model_fm, c, be, out);
}

static int lr_create(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out) {
    return create(&pw_model_lr, c, be, out);
}

static int fm_forward(pw_model_t *base, const pw_view_t *v, float *logits) {
    fm_t *m = (fm_t *)base;
    if (v->n < 1 || v->n > base->c.max_batch)
        return PC_EINVAL;
    m->v = *v;
    pw_linear_forward(&m->lin, v->n, v->dense, logits);
    base->be->fm(base->be, v->n, v->key_off, v->vals, base->row_dim - 1, v->rows, logits);
    return 0;
}

static int fm_backward(pw_model_t *base, const float *dlogits, float *drows) {
    fm_t *m = (fm_t *)base;
    const pw_view_t *v = &m->v;
    pw_linear_backward(&m->lin, v->n, v->dense, dlogits, NULL);
    base->be->fm_grad(base->be, v->n, v->key_off, v->vals, base->row_dim - 1, v->rows, dlogits,
                      drows);
    return 0;
}

const pw_model_ops_t pw_model_fm = {.name = "fm",
                                    .row_dim = fm_row_dim,
                                    .create = fm_create,
                                    .forward = fm_forward,
                                    .backward = fm_backward,
                                    .destroy = fm_destroy};

/* An FM without factors. */
const pw_model_ops_t pw_model_lr = {.name = "lr",
                                    .zero_rows = true,
                                    .row_dim = lr_row_dim,
                                    .create = lr_create,
                                    .forward = fm_forward,
                                    .backward = fm_backward,
                                    .destroy = fm_destroy};
