/* sv_model.c: see sv_model.h. A pool of evaluators (model instance + step) behind a mutex and a
 * condition variable; loading builds every instance from the card, reads the weights file once
 * (its checksum checked once) into each and warms each with a synthetic batch before the model is
 * returned.
 *
 * DESIGN: the step's dense optimizer is never used (serving never trains); it is SGD, which keeps
 * no state, only because pw_step owns one. The synthetic batch has every field once with the
 * key 0 (rows zero) and the dense inputs 0: its scores depend only on the weights, so a NaN
 * there means the weights themselves are unusable.
 */
#include "sv_model.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pw_backend.h"
#include "pw_dense_optim.h"
#include "pw_model_io.h"
#include "pw_step.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sv_eval {
    pw_model_t *model;
    pw_step_t *st;
    const struct sv_model *owner;
    sv_eval_t *next_free;
};

struct sv_model {
    pw_model_card_t card;
    pw_csv_spec_t csv;
    uint64_t step;
    int max_batch;
    pw_backend_t *be;
    pthread_mutex_t *device_mu; /* see sv_model_opts_t */
    int n;
    sv_eval_t *ev;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_eval_t *free_list;
    atomic_int refs; /* sv_model_ref / sv_model_destroy */
};

/* The device's turn (sv_model_opts_t.device_mu): taken and bound to this thread. */
static void device_enter(const sv_model_t *m) {
    if (!m->device_mu)
        return;
    pthread_mutex_lock(m->device_mu);
    if (m->be->bind)
        m->be->bind(m->be);
}

static void device_leave(const sv_model_t *m) {
    if (m->device_mu)
        pthread_mutex_unlock(m->device_mu);
}

/* sv_eval_run's work (the device's turn taken). */
static int eval_run(sv_eval_t *e, const pw_batch_t *b, float *probs, char *why, size_t cap) {
    int rc = pw_step_eval(e->st, b, probs);
    if (rc)
        snprintf(why, cap, "the model could not score the batch: %s", pc_strerror(rc));
    return rc;
}

/* Score one synthetic sample per evaluator: buffers touched, weights checked. (Under the
 * device's turn, as the load.) */
static int warm(sv_model_t *m, sv_eval_t *e, char *why, size_t cap) {
    const pw_model_card_t *c = &m->card;
    const int nf = c->model.nfields > 0 ? c->model.nfields : 1;
    float dense[PW_DENSE_MAX] = {0}, label = 0, vals[PW_FIELDS_MAX], prob = 0;
    uint64_t keys[PW_FIELDS_MAX] = {0};
    uint16_t fields[PW_FIELDS_MAX];
    for (int f = 0; f < nf; f++) {
        fields[f] = (uint16_t)f;
        vals[f] = 1;
    }
    size_t off[2] = {0, (size_t)nf};
    pw_batch_t b = {.n = 1,
                    .ndense = (size_t)c->ndense,
                    .labels = &label,
                    .dense = dense,
                    .keys = keys,
                    .fields = fields,
                    .vals = vals,
                    .key_off = off};
    float *rows = pw_step_eval_rows(e->st, (size_t)nf);
    if (!rows)
        return PC_ENOMEM;
    memset(rows, 0, (size_t)nf * (size_t)c->row_dim * sizeof *rows);
    int rc = eval_run(e, &b, &prob, why, cap);
    if (!rc && !isfinite(prob)) {
        snprintf(why, cap, "the model's weights give a non-finite score");
        rc = PC_ECORRUPT;
    }
    return rc;
}

static int eval_init(sv_model_t *m, sv_eval_t *e, char *why, size_t cap) {
    e->owner = m;
    pw_model_config_t mc = m->card.model;
    mc.max_batch = m->max_batch;
    int rc = pw_model_create(&mc, m->be, &e->model);
    if (rc) {
        snprintf(why, cap, "cannot create the %s model of the card: %s", mc.name, pc_strerror(rc));
        return rc;
    }
    pw_opt_config_t oc; /* never steps: SGD, which keeps no state (Adam's is 2x the weights) */
    pw_opt_config_defaults(&oc, PW_OPT_SGD);
    pw_step_config_t sc = {.be = m->be, .model = e->model, .ndense = m->card.ndense, .opt = &oc};
    if ((rc = pw_step_create(&sc, &e->st)))
        snprintf(why, cap, "cannot create the model's step: %s", pc_strerror(rc));
    return rc;
}

/* The weights image checked and loaded into instance e, which is warmed. */
static int eval_load(sv_model_t *m, sv_eval_t *e, const char *file, const uint8_t *img, size_t size,
                     char *why, size_t cap) {
    int rc = pw_dense_load_image(img, size, e->model->params, e->model->nparams);
    if (rc)
        snprintf(why, cap, "%s: %s", file,
                 rc == PC_EDIM ? "its layers do not match the card's model" : pc_strerror(rc));
    return rc ? rc : warm(m, e, why, cap);
}

int sv_model_load(const sv_model_opts_t *o, sv_model_t **out, char *why, size_t cap) {
    *out = NULL;
    snprintf(why, cap, "%s", "");
    if (!o || !o->dir || o->evaluators < 1 || o->evaluators > 256 || o->max_batch < 1)
        return PC_EINVAL;
    sv_model_t *m = pc_scalloc(PC_MEM_MODEL, 1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->step = o->step;
    m->max_batch = o->max_batch;
    m->be = o->be ? o->be : pw_backend_cpu();
    m->device_mu = m->be->host_memory ? NULL : o->device_mu;
    pthread_mutex_init(&m->mu, NULL);
    atomic_init(&m->refs, 1);
    pthread_cond_init(&m->cv, NULL);
    char path[4096], err[256] = "";
    snprintf(path, sizeof path, "%s/card", o->dir);
    int rc = pw_model_card_read(path, &m->card, err, sizeof err);
    if (!rc && m->card.format == PW_FMT_CSV &&
        pw_csv_spec_parse(m->card.csv, &m->csv, err, sizeof err))
        rc = PC_EPARSE;
    if (rc)
        snprintf(why, cap, "%s: %s", path, err[0] ? err : pc_strerror(rc));
    snprintf(path, sizeof path, "%s/model", o->dir);
    if (!rc && !(m->ev = pc_scalloc(PC_MEM_MODEL, (size_t)o->evaluators, sizeof *m->ev)))
        rc = PC_ENOMEM;
    /* m->n counts the instances begun, a failed one included (destroy frees its parts). The
     * device's turn is taken per instance, and the file is read outside it: a load never holds
     * requests back for longer than one instance's work. */
    for (int i = 0; !rc && i < o->evaluators; i++) {
        m->n++;
        device_enter(m);
        rc = eval_init(m, &m->ev[i], why, cap);
        device_leave(m);
    }
    uint8_t *img = NULL;
    size_t size = 0;
    if (!rc &&
        (rc = pw_dense_read(path, m->ev[0].model->params, m->ev[0].model->nparams, &img, &size)))
        snprintf(why, cap, "%s: %s", path, pc_strerror(rc));
    for (int i = 0; !rc && i < m->n; i++) {
        device_enter(m);
        rc = eval_load(m, &m->ev[i], path, img, size, why, cap);
        device_leave(m);
    }
    free(img);
    if (rc) {
        sv_model_destroy(m);
        return rc;
    }
    for (int i = m->n - 1; i >= 0; i--) {
        m->ev[i].next_free = m->free_list;
        m->free_list = &m->ev[i];
    }
    *out = m;
    return 0;
}

sv_model_t *sv_model_ref(sv_model_t *m) {
    if (m)
        atomic_fetch_add(&m->refs, 1);
    return m;
}

void sv_model_destroy(sv_model_t *m) {
    if (!m || atomic_fetch_sub(&m->refs, 1) > 1)
        return;
    for (int i = 0; i < m->n; i++) {
        device_enter(m);
        pw_step_destroy(m->ev[i].st);
        pw_model_destroy(m->ev[i].model);
        device_leave(m);
    }
    pc_sfree(m->ev);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    pc_sfree(m);
}

const pw_model_card_t *sv_model_card(const sv_model_t *m) {
    return &m->card;
}

const pw_csv_spec_t *sv_model_csv(const sv_model_t *m) {
    return &m->csv;
}

uint64_t sv_model_step(const sv_model_t *m) {
    return m->step;
}

bool sv_model_card_compatible(const pw_model_card_t *a, const pw_model_card_t *b, char *why,
                              size_t cap) {
    const pw_model_config_t *x = &a->model, *y = &b->model;
    const char *d =
        a->format != b->format                             ? "the stream format"
        : strcmp(a->csv, b->csv) != 0                      ? "the CSV column spec"
        : strcmp(x->name, y->name) != 0                    ? "the model"
        : x->ndense != y->ndense || a->ndense != b->ndense ? "the dense width"
        : x->nfields != y->nfields                         ? "the field count"
        : x->dim != y->dim || a->row_dim != b->row_dim     ? "the embedding dim"
        : x->mean != y->mean                               ? "the pooling"
        : x->nbottom != y->nbottom || memcmp(x->bottom, y->bottom, sizeof x->bottom) != 0
            ? "the bottom widths"
        : x->ntop != y->ntop || memcmp(x->top, y->top, sizeof x->top) != 0 ? "the top widths"
        : strcmp(a->table_name, b->table_name) != 0                        ? "the embedding table"
                                                                           : NULL;
    if (d)
        snprintf(why, cap, "%s differs from the served model's", d);
    return d == NULL;
}

sv_eval_t *sv_model_acquire(sv_model_t *m) {
    pthread_mutex_lock(&m->mu);
    while (!m->free_list)
        pthread_cond_wait(&m->cv, &m->mu);
    sv_eval_t *e = m->free_list;
    m->free_list = e->next_free;
    pthread_mutex_unlock(&m->mu);
    return e;
}

void sv_model_release(sv_model_t *m, sv_eval_t *e) {
    pthread_mutex_lock(&m->mu);
    e->next_free = m->free_list;
    m->free_list = e;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

int sv_model_check(const sv_model_t *m, const pw_batch_t *b, char *why, size_t cap) {
    return pw_step_check_why(m->ev[0].st, b, why, cap); /* every instance is the same model */
}

float *sv_eval_rows(sv_eval_t *e, size_t nk) {
    device_enter(e->owner);
    float *rows = pw_step_eval_rows(e->st, nk);
    device_leave(e->owner);
    return rows;
}

int sv_eval_run(sv_eval_t *e, const pw_batch_t *b, float *probs, char *why, size_t cap) {
    if (b->n > (size_t)e->owner->max_batch) { /* the step's buffers hold max_batch samples */
        snprintf(why, cap, "%zu samples, over the model's max_batch %d", (size_t)b->n,
                 e->owner->max_batch);
        return PC_EINVAL;
    }
    device_enter(e->owner);
    int rc = eval_run(e, b, probs, why, cap);
    device_leave(e->owner);
    return rc;
}
