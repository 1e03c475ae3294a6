/* pw_model.c: see pw_model.h. The list of model kinds and what every model shares: lookup by
 * name, the gradient reset before backward, the model file. */
#include "pw_model.h"

#include "pc_error.h"
#include "pc_log.h"
#include "pw_model_io.h"

#include <string.h>

static const pw_model_ops_t *const k_models[] = {&pw_model_dlrm, &pw_model_deepfm, &pw_model_fm,
                                                 &pw_model_lr};
#define NMODELS (sizeof k_models / sizeof k_models[0])

int pw_model_find(const char *name, const pw_model_ops_t **ops) {
    for (size_t i = 0; i < NMODELS; i++)
        if (strcmp(name, k_models[i]->name) == 0) {
            *ops = k_models[i];
            return 0;
        }
    PC_ERROR("train: unknown model '%s' (dlrm, deepfm, fm, lr)", name);
    return PC_EINVAL;
}

int pw_model_row_dim(const pw_model_config_t *c) {
    for (size_t i = 0; i < NMODELS; i++)
        if (strcmp(c->name, k_models[i]->name) == 0)
            return k_models[i]->row_dim(c);
    return 0;
}

int pw_model_create(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out) {
    const pw_model_ops_t *ops;
    int rc = pw_model_find(c->name, &ops);
    if (rc)
        return rc;
    if (ops->needs_fields && c->nfields < 1) {
        PC_ERROR("train: model %s needs --fields (the number of categorical fields): this "
                 "format does not give it",
                 c->name);
        return PC_EINVAL;
    }
    return ops->create(c, be, out);
}

void pw_model_destroy(pw_model_t *m) {
    if (m)
        m->ops->destroy(m);
}

int pw_model_fields(const pw_model_t *m) {
    return m->ops->needs_fields ? m->c.nfields : 0;
}

int pw_model_forward(pw_model_t *m, const pw_view_t *v, float *logits) {
    return m->ops->forward(m, v, logits);
}

static void zero_grads(pw_model_t *m) {
    for (int i = 0; i < m->nparams; i++)
        pw_linear_zero_grad(&m->params[i]);
}

int pw_model_backward(pw_model_t *m, const float *dlogits, float *drows) {
    zero_grads(m);
    return m->ops->backward(m, dlogits, drows);
}

bool pw_model_reads_unique(const pw_model_t *m) {
    return m->ops->reads_unique && m->ops->reads_unique(m);
}

int pw_model_backward_unique(pw_model_t *m, const float *dlogits, float alpha, float *ugrads) {
    zero_grads(m);
    return m->ops->backward_unique(m, dlogits, alpha, ugrads);
}

int pw_model_save(const pw_model_t *m, const char *path) {
    return pw_dense_save(path, m->params, m->nparams);
}

int pw_model_load(pw_model_t *m, const char *path) {
    return pw_dense_load(path, m->params, m->nparams);
}
