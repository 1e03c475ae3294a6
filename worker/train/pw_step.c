/* pw_step.c: see pw_step.h.
 *
 * DESIGN
 * - Device buffers (dbuf_t) grow to the largest request and are kept: a step allocates only
 *   while batches grow. Sets 0 and 1 are the training steps' (by the caller's parity), set 2
 *   evaluation's; the unique rows' gradient buffer is one (its download is waited for in
 *   pw_step_finish, before the next step writes it).
 * - The rows per feature (rows) and their gradients (grads) are shared by every set: only one
 *   step computes at a time. A model that reads rows through inv (DLRM on the CPU) uses neither
 *   in training; evaluation looks its rows up into `rows` and never holds `grads`.
 */
#include "pw_step.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- types ---- */

/* Device memory grown as needed (cap in bytes). */
typedef struct dbuf {
    void *p;
    size_t cap;
} dbuf_t;

enum { DB_LABELS, DB_DENSE, DB_KEY_OFF, DB_FIELDS, DB_VALS, DB_INV, DB_UROWS, DB_N };
enum { NSETS = 3, EVAL_SET = 2 };

/* What a set holds once staged (device pointers; host ones with host memory). */
typedef struct staged {
    pw_view_t v; /* urows and inv: set at staging; rows: at compute (NULL: through inv) */
    const float *labels;
    size_t nu;
} staged_t;

struct pw_step {
    pw_backend_t *be;
    pw_model_t *m;
    int ndense; /* of the batches (0: ones) */
    int d;      /* row width */
    pw_opt_t *opt;
    int nopt;
    dbuf_t dev[NSETS][DB_N], dugrads;
    staged_t set[NSETS];
    size_t cap, hcap, gcap; /* features rows, hrows (evaluation on a device) and grads
                             * (training) hold */
    float *rows, *grads;    /* device: a row and its gradient per feature */
    float *hrows;           /* host (pinned): evaluation's looked-up rows (device backends) */
    float *dense1;          /* max_batch ones: the dense input of streams without dense values */
    float *logits, *dlogits, *probs, *dloss;
    float *hloss; /* host (pinned) */
    /* the step between compute and finish */
    float *ugrads_host, *ugrads_dev;
    size_t ugrads_bytes;
};

/* ---- lifecycle ---- */

int pw_step_create(const pw_step_config_t *c, pw_step_t **out) {
    pw_model_t *m = c->model;
    if (c->ndense < 0 || (c->ndense ? c->ndense : 1) != m->c.ndense) {
        PC_ERROR("train: batches with %d dense values for a model of %d", c->ndense, m->c.ndense);
        return PC_EINVAL;
    }
    pw_step_t *st = pc_scalloc(PC_MEM_MODEL, 1, sizeof *st);
    if (!st)
        return PC_ENOMEM;
    pw_backend_t *be = c->be;
    st->be = be;
    st->m = m;
    st->ndense = c->ndense;
    st->d = m->row_dim;
    st->nopt = 2 * m->nparams;
    st->opt = pc_scalloc(PC_MEM_MODEL, (size_t)st->nopt, sizeof *st->opt);
    int rc = st->opt ? 0 : PC_ENOMEM;
    for (int i = 0; i < m->nparams && !rc; i++) {
        const pw_linear_t *l = &m->params[i];
        rc = pw_opt_init(&st->opt[2 * i], be, c->opt, (size_t)l->in * l->out);
        if (!rc)
            rc = pw_opt_init(&st->opt[2 * i + 1], be, c->opt, (size_t)l->out);
    }
    const size_t b = (size_t)m->c.max_batch, fl = sizeof(float);
    st->dense1 = be->alloc(be, b * fl);
    st->logits = be->alloc(be, b * fl);
    st->dlogits = be->alloc(be, b * fl);
    st->probs = be->alloc(be, b * fl);
    st->dloss = be->alloc(be, fl);
    st->hloss = be->host_alloc(be, fl);
    if (!rc && !(st->dense1 && st->logits && st->dlogits && st->probs && st->dloss && st->hloss))
        rc = PC_ENOMEM;
    if (rc) {
        pw_step_destroy(st);
        return rc;
    }
    be->fill(be, b, 1.0f, st->dense1);
    *out = st;
    return 0;
}

void pw_step_destroy(pw_step_t *st) {
    if (!st)
        return;
    pw_backend_t *be = st->be;
    for (int i = 0; st->opt && i < st->nopt; i++)
        pw_opt_free(&st->opt[i]);
    pc_sfree(st->opt);
    for (int k = 0; k < NSETS; k++)
        for (int i = 0; i < DB_N; i++)
            be->free(be, st->dev[k][i].p);
    be->free(be, st->dugrads.p);
    void *const dev[] = {st->rows,    st->grads, st->dense1, st->logits,
                         st->dlogits, st->probs, st->dloss};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        be->free(be, dev[i]);
    be->host_free(be, st->hrows);
    be->host_free(be, st->hloss);
    pc_sfree(st);
}

/* ---- buffers and staging ---- */

/* Row buffers for nk features (their contents are not kept), and with `grads` their gradients:
 * evaluation (serving's Predict included) needs no gradients, so it does not hold them, and only
 * evaluation looks rows up into the pinned host buffer of a device backend (hrows). A batch
 * without features still gets a buffer of one row: a model reads rows per feature when it has
 * them (a NULL buffer means "through inv", which a device backend does not do). */
static int reserve_rows(pw_step_t *st, size_t nk, bool grads) {
    pw_backend_t *be = st->be;
    nk = nk ? nk : 1;
    const size_t cap = nk + nk / 2, bytes = cap * (size_t)st->d * sizeof(float);
    if (nk > st->cap) {
        be->free(be, st->rows);
        if (!(st->rows = be->alloc(be, bytes)))
            return st->cap = 0, PC_ENOMEM;
        st->cap = cap;
    }
    if (!grads && !be->host_memory && nk > st->hcap) {
        be->host_free(be, st->hrows);
        if (!(st->hrows = be->host_alloc(be, bytes)))
            return st->hcap = 0, PC_ENOMEM;
        st->hcap = cap;
    }
    if (grads && nk > st->gcap) {
        be->free(be, st->grads);
        if (!(st->grads = be->alloc(be, bytes)))
            return st->gcap = 0, PC_ENOMEM;
        st->gcap = cap;
    }
    return 0;
}

/* Device buffer d holding at least bytes (contents not kept). */
static void *dbuf_reserve(pw_backend_t *be, dbuf_t *d, size_t bytes) {
    if (bytes > d->cap || !d->p) {
        be->free(be, d->p);
        d->cap = bytes + bytes / 2 + 64;
        if (!(d->p = be->alloc(be, d->cap)))
            d->cap = 0;
    }
    return d->p;
}

/* host (bytes) as the backend sees it: itself on a host-memory backend, else uploaded into
 * device buffer d (asynchronously: visible to the functions called after). NULL: no memory. */
static const void *stage(pw_backend_t *be, dbuf_t *d, const void *host, size_t bytes) {
    if (be->host_memory)
        return host;
    void *p = dbuf_reserve(be, d, bytes);
    if (p && bytes)
        be->upload_async(be, p, host, bytes);
    return p;
}

/* The batch's inputs on the backend, in set k. PC_ENOMEM. */
static int stage_batch(pw_step_t *st, int k, const pw_batch_t *b) {
    pw_backend_t *be = st->be;
    dbuf_t *d = st->dev[k];
    staged_t *s = &st->set[k];
    const size_t n = b->n, nk = b->key_off[n];
    memset(s, 0, sizeof *s);
    s->v.n = (int)n;
    s->v.nk = nk;
    s->labels = stage(be, &d[DB_LABELS], b->labels, n * sizeof(float));
    s->v.dense =
        st->ndense ? stage(be, &d[DB_DENSE], b->dense, n * b->ndense * sizeof(float)) : st->dense1;
    s->v.key_off = stage(be, &d[DB_KEY_OFF], b->key_off, (n + 1) * sizeof(size_t));
    s->v.fields = stage(be, &d[DB_FIELDS], b->fields, nk * sizeof(uint16_t));
    s->v.vals = stage(be, &d[DB_VALS], b->vals, nk * sizeof(float));
    return s->labels && s->v.dense && s->v.key_off && s->v.fields && s->v.vals ? 0 : PC_ENOMEM;
}

int pw_step_check_why(const pw_step_t *st, const pw_batch_t *b, char *why, size_t cap) {
    if ((int)b->ndense != st->ndense) {
        snprintf(why, cap, "a sample with %zu dense values, the model has %d", b->ndense,
                 st->ndense);
        return PC_EINVAL;
    }
    const int nf = pw_model_fields(st->m);
    for (size_t s = 0; nf && s < b->n; s++)
        for (size_t j = b->key_off[s]; j < b->key_off[s + 1]; j++)
            if (b->fields[j] >= nf) {
                snprintf(why, cap, "sample %zu: a feature of field %u, the model has %d fields", s,
                         b->fields[j], nf);
                return PC_EINVAL;
            }
    return 0;
}

int pw_step_check(const pw_step_t *st, const pw_batch_t *b) {
    char why[160];
    const int rc = pw_step_check_why(st, b, why, sizeof why);
    if (rc)
        PC_ERROR("train: %s (--fields)", why);
    return rc;
}

int pw_step_stage(pw_step_t *st, int k, const pw_step_input_t *in) {
    const size_t nk = in->b->key_off[in->b->n];
    int rc = stage_batch(st, k, in->b);
    if (rc)
        return rc;
    staged_t *s = &st->set[k];
    s->nu = in->nu;
    s->v.inv = stage(st->be, &st->dev[k][DB_INV], in->inv, nk * sizeof(uint32_t));
    s->v.urows =
        stage(st->be, &st->dev[k][DB_UROWS], in->urows, in->nu * (size_t)st->d * sizeof(float));
    return s->v.inv && s->v.urows ? 0 : PC_ENOMEM;
}

/* ---- the step ---- */

/* A failed device (sticky): logged, PC_EIO. */
static int device_check(pw_step_t *st) {
    char msg[256];
    int rc = st->be->error(st->be, msg, sizeof msg);
    if (rc)
        PC_ERROR("train: the %s backend failed: %s", st->be->name, msg);
    return rc;
}

int pw_step_compute(pw_step_t *st, int k, float scale, float *ugrads) {
    pw_backend_t *be = st->be;
    staged_t *s = &st->set[k];
    const size_t d = (size_t)st->d, ub = s->nu * d * sizeof(float);
    /* one device buffer: this step's download of it is done (finish) before the next step */
    float *dug = be->host_memory ? ugrads : dbuf_reserve(be, &st->dugrads, ub);
    /* A model that reads rows through inv skips the rows per feature both ways (same sums), and
     * their buffers: evaluation reserves its own (pw_step_eval_rows) */
    const bool uq = pw_model_reads_unique(st->m);
    int rc = uq ? 0 : reserve_rows(st, s->v.nk, true);
    if (rc || !dug)
        return rc ? rc : PC_ENOMEM;
    s->v.rows = NULL;
    if (!uq) {
        be->gather_rows(be, s->v.nk, s->v.inv, s->v.urows, (int)d, st->rows);
        s->v.rows = st->rows;
    }
    if ((rc = pw_model_forward(st->m, &s->v, st->logits)))
        return rc;
    be->bce(be, s->v.n, st->logits, s->labels, st->probs, st->dlogits, st->dloss);
    be->zero(be, dug, ub);
    if (uq) {
        if ((rc = pw_model_backward_unique(st->m, st->dlogits, scale, dug)))
            return rc;
    } else {
        if ((rc = pw_model_backward(st->m, st->dlogits, st->grads)))
            return rc;
        be->scatter_add_rows(be, s->v.nk, s->v.inv, st->grads, (int)d, scale, dug);
    }
    st->ugrads_host = ugrads;
    st->ugrads_dev = dug;
    st->ugrads_bytes = ub;
    return 0;
}

bool pw_step_loss_finite(const pw_step_t *st) {
    return !st->be->host_memory || isfinite(*st->dloss);
}

int pw_step_finish(pw_step_t *st, bool apply_dense, double *loss) {
    pw_backend_t *be = st->be;
    if (!be->host_memory)
        be->download_async(be, st->ugrads_host, st->ugrads_dev, st->ugrads_bytes);
    be->download_async(be, st->hloss, st->dloss, sizeof(float));
    if (apply_dense)
        pw_step_apply(st);
    be->copy_wait(be);
    *loss = *st->hloss;
    return device_check(st);
}

void pw_step_apply(pw_step_t *st) {
    pw_model_t *m = st->m;
    for (int i = 0; i < m->nparams; i++) {
        pw_opt_step(&st->opt[2 * i], m->params[i].w, m->params[i].dw);
        pw_opt_step(&st->opt[2 * i + 1], m->params[i].b, m->params[i].db);
    }
}

pw_opt_t *pw_step_opts(pw_step_t *st, int *n) {
    *n = st->nopt;
    return st->opt;
}

/* ---- evaluation ---- */

float *pw_step_eval_rows(pw_step_t *st, size_t nk) {
    if (reserve_rows(st, nk, false))
        return NULL;
    return st->be->host_memory ? st->rows : st->hrows;
}

int pw_step_eval(pw_step_t *st, const pw_batch_t *b, float *probs) {
    pw_backend_t *be = st->be;
    const size_t nk = b->key_off[b->n];
    if (nk > st->cap || (!be->host_memory && nk > st->hcap))
        return PC_EINVAL; /* its rows were not looked up into pw_step_eval_rows */
    if (!be->host_memory)
        be->upload(be, st->rows, st->hrows, nk * (size_t)st->d * sizeof(float));
    int rc = stage_batch(st, EVAL_SET, b);
    staged_t *s = &st->set[EVAL_SET];
    s->v.rows = st->rows;
    if (rc || (rc = pw_model_forward(st->m, &s->v, st->logits)))
        return rc;
    be->bce(be, s->v.n, st->logits, s->labels, st->probs, st->dlogits, st->dloss);
    be->download(be, probs, st->probs, b->n * sizeof *probs);
    return device_check(st);
}
