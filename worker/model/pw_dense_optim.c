/* pw_dense_optim.c: see pw_dense_optim.h. */
#include "pw_dense_optim.h"

#include "pc_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void pw_opt_config_defaults(pw_opt_config_t *c, pw_opt_kind_t kind) {
    *c = (pw_opt_config_t){.kind = kind,
                           .lr = kind == PW_OPT_ADAM ? 0.001f : 0.01f,
                           .beta1 = 0.9f,
                           .beta2 = 0.999f,
                           .eps = 1e-8f,
                           .adagrad_init = 0.0f};
}

int pw_opt_init(pw_opt_t *o, const pw_opt_config_t *c, size_t n) {
    memset(o, 0, sizeof *o);
    o->c = *c;
    o->n = n;
    if (c->kind == PW_OPT_SGD)
        return 0;
    o->s1 = malloc((n ? n : 1) * sizeof(float));
    o->s2 = c->kind == PW_OPT_ADAM ? calloc(n ? n : 1, sizeof(float)) : NULL;
    if (!o->s1 || (c->kind == PW_OPT_ADAM && !o->s2)) {
        pw_opt_free(o);
        return PC_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        o->s1[i] = c->kind == PW_OPT_ADAGRAD ? c->adagrad_init : 0.0f;
    return 0;
}

void pw_opt_free(pw_opt_t *o) {
    free(o->s1);
    free(o->s2);
    o->s1 = o->s2 = NULL;
}

void pw_opt_step(pw_opt_t *o, float *w, const float *g) {
    const pw_opt_config_t *c = &o->c;
    switch (c->kind) {
        case PW_OPT_SGD:
            for (size_t i = 0; i < o->n; i++)
                w[i] -= c->lr * g[i];
            return;
        case PW_OPT_ADAGRAD:
            for (size_t i = 0; i < o->n; i++) {
                o->s1[i] += g[i] * g[i];
                w[i] -= c->lr * g[i] / (sqrtf(o->s1[i]) + c->eps);
            }
            return;
        case PW_OPT_ADAM: {
            o->t++;
            const float bc1 = 1.0f - powf(c->beta1, (float)o->t);
            const float bc2 = 1.0f - powf(c->beta2, (float)o->t);
            for (size_t i = 0; i < o->n; i++) {
                o->s1[i] = c->beta1 * o->s1[i] + (1 - c->beta1) * g[i];
                o->s2[i] = c->beta2 * o->s2[i] + (1 - c->beta2) * g[i] * g[i];
                w[i] -= c->lr * (o->s1[i] / bc1) / (sqrtf(o->s2[i] / bc2) + c->eps);
            }
            return;
        }
    }
}
