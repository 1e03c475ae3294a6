/* pw_train.c: see pw_train.h. */
#include "pw_train.h"

#include "pc_error.h"
#include "pc_log.h"
#include "pc_time.h"
#include "ps_table.h"
#include "pw_dlrm.h"
#include "pw_fm.h"
#include "ps_ckpt.h"
#include "pw_metrics.h"
#include "pw_model_io.h"
#include "pw_reader.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pw_train_config_defaults(pw_train_config_t *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model, sizeof c->model, "dlrm");
    c->dim = 16;
    c->nbottom = 2;
    c->bottom[0] = 64;
    c->bottom[1] = 16;
    c->ntop = 3;
    c->top[0] = 128;
    c->top[1] = 64;
    c->top[2] = 1;
    c->batch = 1024;
    c->epochs = 1;
    c->seed = 1;
    snprintf(c->table_spec, sizeof c->table_spec,
             "optimizer=adagrad,lr=0.05,adagrad_init=1e-6,init=uniform,init_scale=0.05,shards=16");
    pw_opt_config_defaults(&c->dense_opt, PW_OPT_ADAM);
    c->progress_every = 0;
}

typedef struct trainer {
    const pw_train_config_t *c;
    const pw_backend_t *be;
    bool lr, fm; /* lr and fm: a linear dense term (lin) plus sparse rows; else dlrm */
    int nf, ndense, dim;
    ps_table_t *emb;
    pw_dlrm_t *dlrm;
    pw_linear_t lin; /* lr: dense features -> logit */
    pw_linear_t *layers;
    int nlayers;
    pw_opt_t *opt; /* 2 per layer: weights, biases */
    float *rows, *grads, *logits, *dlogits, *probs;
} trainer_t;

static void trainer_free(trainer_t *t) {
    for (int i = 0; t->opt && i < 2 * t->nlayers; i++)
        pw_opt_free(&t->opt[i]);
    free(t->opt);
    pw_dlrm_destroy(t->dlrm);
    if (t->lr || t->fm)
        pw_linear_free(&t->lin);
    ps_table_destroy(t->emb);
    free(t->rows);
    free(t->grads);
    free(t->logits);
    free(t->dlogits);
    free(t->probs);
}

/* Build the model once the first batch tells the field and dense counts. */
static int trainer_init(trainer_t *t, const pw_batch_t *b) {
    const pw_train_config_t *c = t->c;
    t->be = pw_backend_cpu();
    t->lr = strcmp(c->model, "lr") == 0;
    t->fm = strcmp(c->model, "fm") == 0;
    if (!t->lr && !t->fm && strcmp(c->model, "dlrm") != 0) {
        PC_ERROR("train: unknown model '%s' (dlrm, fm, lr)", c->model);
        return PC_EINVAL;
    }
    t->nf = (int)(b->key_off[1] - b->key_off[0]);
    t->ndense = (int)b->ndense;
    t->dim = t->lr ? 1 : t->fm ? c->dim + 1 : c->dim; /* fm rows: [w, v_1 .. v_dim] */
    if (t->nf < 1 || t->ndense < 1) {
        PC_ERROR("train: the model needs dense features and one key per categorical field");
        return PC_EINVAL;
    }
    ps_table_config_t tc;
    char spec[600], err[256];
    ps_table_config_defaults(&tc);
    snprintf(spec, sizeof spec, "name=emb,dim=%d,seed=%llu,%s", t->dim, (unsigned long long)c->seed,
             c->table_spec);
    int rc = ps_table_config_parse(&tc, spec, err, sizeof err);
    if (rc) {
        PC_ERROR("train: table settings: %s", err);
        return PC_EINVAL;
    }
    if (t->lr)
        tc.init = PS_INIT_ZEROS;
    if ((rc = ps_table_create(&tc, &t->emb)))
        return rc;
    if (t->lr || t->fm) {
        if ((rc = pw_linear_init(&t->lin, t->ndense, 1, c->seed)))
            return rc;
        memset(t->lin.w, 0, (size_t)t->ndense * sizeof(float)); /* LR starts from zero */
        t->layers = &t->lin;
        t->nlayers = 1;
    } else {
        pw_dlrm_config_t dc = {.ndense = t->ndense,
                               .nfields = t->nf,
                               .dim = c->dim,
                               .nbottom = c->nbottom,
                               .ntop = c->ntop,
                               .max_batch = c->batch,
                               .seed = c->seed};
        memcpy(dc.bottom, c->bottom, sizeof dc.bottom);
        memcpy(dc.top, c->top, sizeof dc.top);
        if ((rc = pw_dlrm_create(&dc, t->be, &t->dlrm))) {
            PC_ERROR("train: DLRM layers do not fit (bottom must end at dim %d, top at 1)", c->dim);
            return rc;
        }
        t->layers = pw_dlrm_layers(t->dlrm, &t->nlayers);
    }
    t->opt = calloc((size_t)(2 * t->nlayers), sizeof *t->opt);
    if (!t->opt)
        return PC_ENOMEM;
    for (int i = 0; i < t->nlayers && !rc; i++) {
        rc = pw_opt_init(&t->opt[2 * i], &c->dense_opt, (size_t)t->layers[i].in * t->layers[i].out);
        if (!rc)
            rc = pw_opt_init(&t->opt[2 * i + 1], &c->dense_opt, (size_t)t->layers[i].out);
    }
    if (!rc && c->load_dense[0] && (rc = pw_dense_load(c->load_dense, t->layers, t->nlayers)))
        PC_ERROR("train: cannot load the dense model %s: %s", c->load_dense, pc_strerror(rc));
    const size_t nk = (size_t)c->batch * t->nf;
    t->rows = malloc(nk * t->dim * sizeof(float));
    t->grads = malloc(nk * t->dim * sizeof(float));
    t->logits = malloc((size_t)c->batch * sizeof(float));
    t->dlogits = malloc((size_t)c->batch * sizeof(float));
    t->probs = malloc((size_t)c->batch * sizeof(float));
    return rc ? rc : t->rows && t->grads && t->logits && t->dlogits && t->probs ? 0 : PC_ENOMEM;
}

/* One batch: forward (and backward + updates when training). The loss is returned in *loss. */
static int trainer_step(trainer_t *t, const pw_batch_t *b, bool train, double *loss) {
    const int n = (int)b->n, nf = t->nf, d = t->dim;
    const size_t nk = (size_t)n * nf;
    for (int s = 0; s < n; s++)
        if ((int)(b->key_off[s + 1] - b->key_off[s]) != nf || (int)b->ndense != t->ndense) {
            PC_ERROR("train: a sample without exactly %d keys and %d dense values", nf, t->ndense);
            return PC_EINVAL;
        }
    int rc = train ? ps_table_pull(t->emb, b->keys, nk, t->rows, nk * d)
                   : ps_table_lookup(t->emb, b->keys, nk, t->rows, nk * d, NULL);
    if (rc)
        return rc;
    if (t->lr || t->fm) {
        pw_linear_forward(t->be, &t->lin, n, b->dense, t->logits);
        if (t->fm)
            pw_fm_forward(n, nf, d - 1, t->rows, t->logits);
        else
            for (int s = 0; s < n; s++)
                for (int f = 0; f < nf; f++)
                    t->logits[s] += t->rows[(size_t)s * nf + f];
    } else if ((rc = pw_dlrm_forward(t->dlrm, n, b->dense, t->rows, t->logits))) {
        return rc;
    }
    *loss = pw_bce_logits(n, t->logits, b->labels, t->probs, t->dlogits);
    if (!train)
        return 0;
    for (int i = 0; i < t->nlayers; i++)
        pw_linear_zero_grad(&t->layers[i]);
    if (t->lr || t->fm) {
        pw_linear_backward(t->be, &t->lin, n, b->dense, t->dlogits, NULL);
        if (t->fm)
            pw_fm_backward(n, nf, d - 1, t->rows, t->dlogits, t->grads);
        else
            for (int s = 0; s < n; s++)
                for (int f = 0; f < nf; f++)
                    t->grads[(size_t)s * nf + f] = t->dlogits[s];
    } else if ((rc = pw_dlrm_backward(t->dlrm, t->dlogits, t->grads))) {
        return rc;
    }
    ps_push_result_t pr;
    if ((rc = ps_table_push(t->emb, b->keys, nk, t->grads, nk * d, &pr)))
        return rc;
    for (int i = 0; i < t->nlayers; i++) {
        pw_opt_step(&t->opt[2 * i], t->layers[i].w, t->layers[i].dw);
        pw_opt_step(&t->opt[2 * i + 1], t->layers[i].b, t->layers[i].db);
    }
    return 0;
}

static int open_reader(const pw_train_config_t *c, pw_format_t fmt, const char *const *paths,
                       size_t n, int epochs, pw_reader_t **r) {
    pw_reader_opts_t o = {.format = fmt,
                          .paths = paths,
                          .npaths = n,
                          .world = 1,
                          .batch = (size_t)c->batch,
                          .queue = 4,
                          .epochs = epochs,
                          .max_error_rate = 0.01};
    return pw_reader_open(&o, r);
}

int pw_train_run(const pw_train_config_t *c, pw_format_t fmt, const char *const *train,
                 size_t ntrain, const char *const *test, size_t ntest, pw_train_result_t *res) {
    if (!c || !train || !ntrain || c->batch < 1 || c->epochs < 1 || !res)
        return PC_EINVAL;
    memset(res, 0, sizeof *res);
    res->auc = res->logloss = NAN;
    trainer_t t = {.c = c};
    pw_reader_t *r;
    int rc = open_reader(c, fmt, train, ntrain, c->epochs, &r);
    if (rc)
        return rc;
    const uint64_t t0 = pc_time_mono_ns();
    double ema = NAN;
    uint64_t next_progress = c->progress_every;
    for (const pw_batch_t *b; !rc && (b = pw_reader_next(r));) {
        if (!t.emb && (rc = trainer_init(&t, b)))
            break;
        double loss;
        if ((rc = trainer_step(&t, b, true, &loss)))
            break;
        ema = isnan(ema) ? loss : 0.99 * ema + 0.01 * loss;
        res->samples += b->n;
        if (c->progress_every && res->samples >= next_progress) {
            const double s = pc_time_sec_since(t0);
            fprintf(stderr, "train: %llu samples, %.0f/s, loss %.4f\n",
                    (unsigned long long)res->samples, (double)res->samples / s, ema);
            next_progress += c->progress_every;
        }
        if (c->max_samples && res->samples >= c->max_samples)
            break;
    }
    if (!rc)
        rc = pw_reader_error(r);
    pw_reader_close(r);
    res->seconds = pc_time_sec_since(t0);
    res->samples_per_s = res->seconds > 0 ? (double)res->samples / res->seconds : 0;
    res->train_loss = ema;
    if (!rc && t.emb)
        res->table_rows = ps_table_count(t.emb);
    if (!rc && t.emb && c->save_dense[0] &&
        (rc = pw_dense_save(c->save_dense, t.layers, t.nlayers)))
        PC_ERROR("train: cannot save the dense model to %s: %s", c->save_dense, pc_strerror(rc));
    if (!rc && t.emb && c->export_embeddings[0] &&
        (rc = ps_table_export(t.emb, NULL, c->export_embeddings, true)))
        PC_ERROR("train: cannot export the embeddings to %s: %s", c->export_embeddings,
                 pc_strerror(rc));
    if (!rc && ntest && t.emb) { /* evaluation */
        size_t cap = 1 << 16, n = 0;
        float *p = malloc(cap * sizeof *p), *y = malloc(cap * sizeof *y);
        pw_reader_t *tr = NULL;
        rc = p && y ? open_reader(c, fmt, test, ntest, 1, &tr) : PC_ENOMEM;
        for (const pw_batch_t *b; !rc && (b = pw_reader_next(tr));) {
            double loss;
            if ((rc = trainer_step(&t, b, false, &loss)))
                break;
            if (n + b->n > cap) {
                cap = 2 * (n + b->n);
                float *np = realloc(p, cap * sizeof *p), *ny = realloc(y, cap * sizeof *y);
                if (np)
                    p = np;
                if (ny)
                    y = ny;
                if (!np || !ny) {
                    rc = PC_ENOMEM;
                    break;
                }
            }
            memcpy(p + n, t.probs, b->n * sizeof *p);
            memcpy(y + n, b->labels, b->n * sizeof *y);
            n += b->n;
        }
        if (tr) {
            if (!rc)
                rc = pw_reader_error(tr);
            pw_reader_close(tr);
        }
        if (!rc) {
            res->test_samples = n;
            res->auc = pw_auc(p, y, n);
            res->logloss = pw_logloss(p, y, n);
        }
        free(p);
        free(y);
    }
    trainer_free(&t);
    return rc;
}
