/* pw_dense_optim.c: see pw_dense_optim.h. */
#include "pw_dense_optim.h"

#include "pc_alloc.h"
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

int pw_opt_init(pw_opt_t *o, pw_backend_t *be, const pw_opt_config_t *c, size_t n) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->c = *c;
    o->n = n;
    if (c->kind == PW_OPT_SGD || n == 0)
        return 0;
    o->s1 = be->alloc(be, n * sizeof(float));
    o->s2 = c->kind == PW_OPT_ADAM ? be->alloc(be, n * sizeof(float)) : NULL;
    if (!o->s1 || (c->kind == PW_OPT_ADAM && !o->s2)) {
        pw_opt_free(o);
        return PC_ENOMEM;
    }
    if (c->kind == PW_OPT_ADAGRAD && c->adagrad_init != 0.0f)
        be->fill(be, n, c->adagrad_init, o->s1);
    return 0;
}

void pw_opt_free(pw_opt_t *o) {
    if (o->be) {
        o->be->free(o->be, o->s1);
        o->be->free(o->be, o->s2);
    }
    o->s1 = o->s2 = NULL;
}

void pw_opt_step(pw_opt_t *o, float *w, const float *g) {
    const pw_opt_config_t *c = &o->c;
    pw_opt_step_args_t a = {.kind = c->kind,
                            .lr = c->lr,
                            .beta1 = c->beta1,
                            .beta2 = c->beta2,
                            .eps = c->eps,
                            .bc1 = 1.0f,
                            .bc2 = 1.0f};
    if (c->kind == PW_OPT_ADAM) {
        o->t++;
        a.bc1 = 1.0f - powf(c->beta1, (float)o->t);
        a.bc2 = 1.0f - powf(c->beta2, (float)o->t);
    }
    if (o->n)
        o->be->opt_step(o->be, &a, o->n, w, g, o->s1, o->s2);
}
