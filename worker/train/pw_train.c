/* pw_train.c: see pw_train.h. */
#include "pw_train.h"

#include "pc_error.h"
#include "pc_log.h"
#include "pc_time.h"
#include "ps_table.h"
#include "emberps/psclient.h"
#include "pw_coll.h"
#include "pw_group.h"
#include "pw_jobckpt.h"
#include "pw_deepfm.h"
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
#include <sys/stat.h>

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
    snprintf(c->table_name, sizeof c->table_name, "emb");
    snprintf(c->job, sizeof c->job, "emberps");
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->world = 1;
    c->timeout_ms = 30000;
    c->rejoin_timeout_ms = 60000;
    c->server_retry_ms = 60000;
    c->shrink = true;
}

typedef struct trainer {
    const pw_train_config_t *c;
    const pw_backend_t *be;
    pw_format_t fmt;
    enum { M_DLRM, M_DEEPFM, M_FM, M_LR } kind;
    int nf, ndense, dim; /* dim: the table's row width */
    bool ones;           /* no dense features: one constant 1 stands in (a learned bias) */
    ps_table_t *emb;     /* local */
    psc_t *ps;           /* distributed: the servers */
    pw_group_t *grp;     /* world > 1: the workers' group (membership, collectives) */
    float *flat;         /* distributed: every dense gradient and the has-batch flag */
    size_t nflat;
    uint64_t step;  /* dense optimizer steps taken (distributed: the group's count) */
    bool has_state; /* the dense model is trained state (not a restarted worker's fresh one) */
    bool waiting_servers;  /* warned that the servers are unavailable (until they answer) */
    bool pos_saved;        /* this worker's last position reached the coordinator */
    uint64_t pos_retry_ns; /* after a failed save, the next try waits until then */
    uint64_t lost_pushes;
    pw_dlrm_t *dlrm;
    pw_deepfm_t *deepfm;
    pw_linear_t lin; /* lr, fm: dense features -> logit */
    pw_linear_t *layers;
    int nlayers;
    pw_opt_t *opt; /* 2 per layer: weights, biases */
    size_t cap;    /* features the row buffers hold */
    float *rows, *grads, *pooled, *dpooled, *dense1, *logits, *dlogits, *probs;
} trainer_t;

static void trainer_free(trainer_t *t) {
    for (int i = 0; t->opt && i < 2 * t->nlayers; i++)
        pw_opt_free(&t->opt[i]);
    free(t->opt);
    pw_dlrm_destroy(t->dlrm);
    pw_deepfm_destroy(t->deepfm);
    if (t->kind == M_LR || t->kind == M_FM)
        pw_linear_free(&t->lin);
    ps_table_destroy(t->emb);
    pw_group_close(t->grp);
    psc_close(t->ps);
    free(t->flat);
    free(t->rows);
    free(t->grads);
    free(t->pooled);
    free(t->dpooled);
    free(t->dense1);
    free(t->logits);
    free(t->dlogits);
    free(t->probs);
}

static int model_kind(const char *name, int *kind) {
    static const char *const names[] = {"dlrm", "deepfm", "fm", "lr"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *kind = i;
            return 0;
        }
    PC_ERROR("train: unknown model '%s' (dlrm, deepfm, fm, lr)", name);
    return PC_EINVAL;
}

/* Distributed: connect to the servers and, with world > 1, form the collective group. */
static int connect_cluster(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world ||
        (c->world > 1 && !c->coordinator[0])) {
        PC_ERROR("train: rank %d of world %d%s", c->rank, c->world,
                 c->world > 1 && !c->coordinator[0] ? " needs a coordinator" : " is invalid");
        return PC_EINVAL;
    }
    psc_opts_t po = {.servers = c->servers, .timeout_ms = c->timeout_ms};
    int rc = psc_connect(&po, &t->ps);
    if (rc) {
        PC_ERROR("train: cannot reach the servers (%s): %s", c->servers, pc_strerror(rc));
        return rc;
    }
    if (!c->coordinator[0])
        return 0;
    pw_group_opts_t go = {.coordinator = c->coordinator,
                          .job = c->job,
                          .host = c->host,
                          .rank = c->rank,
                          .world = c->world,
                          .timeout_ms = c->timeout_ms,
                          .rejoin_timeout_ms = c->rejoin_timeout_ms,
                          .shrink = c->shrink};
    if ((rc = pw_group_join(&go, &t->grp)))
        PC_ERROR("train: the worker group did not form (job %s at %s): %s", c->job, c->coordinator,
                 pc_strerror(rc));
    return rc;
}

static bool transient(int rc) {
    return rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT;
}

/* Distributed: a server that is down (killed, restarting) is waited for, up to
 * server_retry_ms, retrying every 200 ms; pulls and lookups do not change the servers. */
static int emb_pull(trainer_t *t, const uint64_t *keys, size_t n, float *rows, bool train) {
    if (t->ps) {
        const char *name = t->c->table_name;
        const uint32_t dim = (uint32_t)t->dim;
        const uint64_t t0 = pc_time_mono_ns();
        for (;;) {
            int rc = train ? psc_pull(t->ps, name, keys, n, dim, rows)
                           : psc_lookup(t->ps, name, keys, n, dim, rows, NULL);
            if (!transient(rc)) {
                if (!rc && t->waiting_servers) {
                    PC_WARN("train: the servers answer again");
                    t->waiting_servers = false;
                }
                return rc;
            }
            if (pc_time_sec_since(t0) * 1000 > t->c->server_retry_ms)
                return rc;
            if (!t->waiting_servers)
                PC_WARN("train: servers unavailable (%s); waiting up to %d ms", pc_strerror(rc),
                        t->c->server_retry_ms);
            t->waiting_servers = true;
            pc_time_sleep_ms(200);
        }
    }
    return train ? ps_table_pull(t->emb, keys, n, rows, n * (size_t)t->dim)
                 : ps_table_lookup(t->emb, keys, n, rows, n * (size_t)t->dim, NULL);
}

static int emb_push(trainer_t *t, const uint64_t *keys, size_t n, float *grads) {
    if (t->ps) {
        const int world = t->grp ? pw_group_size(t->grp) : 1;
        const float scale = 1.0f / (float)world; /* the mean over the workers' batches */
        if (world > 1)
            for (size_t i = 0; i < n * (size_t)t->dim; i++)
                grads[i] *= scale;
        int rc = psc_push(t->ps, t->c->table_name, keys, n, (uint32_t)t->dim, grads, NULL);
        if (transient(rc)) {
            /* Not sent again: the servers that answered applied their part. The failed
             * server lost this part (and, when it restarted, all since its checkpoint). */
            PC_WARN("train: a push failed (%s); its part on the failed server is lost",
                    pc_strerror(rc));
            t->lost_pushes++;
            rc = 0;
        }
        return rc;
    }
    ps_push_result_t pr;
    return ps_table_push(t->emb, keys, n, grads, n * (size_t)t->dim, &pr);
}

/* Sync steps (BSP) take two collectives: reduce_dense after every worker computed (so every
 * pull of step t is done before any push of step t is applied) and barrier after the pushes (so
 * every push of step t is applied before any pull of step t + 1). Local training: no-ops. */

/* With a group: allreduce every dense gradient (and whether this worker had a batch) and leave
 * the mean over the workers that had one in the layers. *any: some worker had a batch. */
static int reduce_dense(trainer_t *t, bool had_batch, bool *any) {
    *any = had_batch;
    if (!t->grp)
        return 0;
    size_t k = 0;
    for (int i = 0; i < t->nlayers; i++) {
        const pw_linear_t *l = &t->layers[i];
        const size_t nw = (size_t)l->in * l->out;
        if (had_batch) {
            memcpy(t->flat + k, l->dw, nw * sizeof(float));
            memcpy(t->flat + k + nw, l->db, (size_t)l->out * sizeof(float));
        } else {
            memset(t->flat + k, 0, (nw + (size_t)l->out) * sizeof(float));
        }
        k += nw + (size_t)l->out;
    }
    t->flat[k] = had_batch ? 1.0f : 0.0f;
    int rc = pw_coll_allreduce_sum(pw_group_coll(t->grp), t->flat, t->nflat);
    if (rc)
        return rc;
    const float active = t->flat[k];
    *any = active > 0;
    k = 0;
    for (int i = 0; i < t->nlayers && *any; i++) {
        pw_linear_t *l = &t->layers[i];
        const size_t nw = (size_t)l->in * l->out;
        for (size_t j = 0; j < nw; j++)
            l->dw[j] = t->flat[k + j] / active;
        for (int j = 0; j < l->out; j++)
            l->db[j] = t->flat[k + nw + (size_t)j] / active;
        k += nw + (size_t)l->out;
    }
    return 0;
}

static int barrier(trainer_t *t) {
    return t->grp ? pw_coll_barrier(pw_group_coll(t->grp), 0) : 0;
}

static void apply_dense(trainer_t *t) {
    for (int i = 0; i < t->nlayers; i++) {
        pw_opt_step(&t->opt[2 * i], t->layers[i].w, t->layers[i].dw);
        pw_opt_step(&t->opt[2 * i + 1], t->layers[i].b, t->layers[i].db);
    }
    t->step++;
}

/* A step count as two floats, exact below 2^48. */
static void u64_put(float *f, uint64_t v) {
    f[0] = (float)(v >> 24);
    f[1] = (float)(v & 0xffffff);
}

static uint64_t u64_get(const float *f) {
    return ((uint64_t)f[0] << 24) | (uint64_t)f[1];
}

/* n floats at p into buf + *k (pack) or back; *k advances either way (buf NULL: counting). */
static void move(float *buf, size_t *k, float *p, size_t n, bool pack) {
    if (buf && n)
        memcpy(pack ? buf + *k : p, pack ? p : buf + *k, n * sizeof(float));
    *k += n;
}

/* The dense state as floats (weights, biases, optimizer state, the step count): the count, and
 * with buf, packed into it (pack) or taken from it. */
static size_t dense_state(trainer_t *t, float *buf, bool pack) {
    size_t k = 0;
    for (int i = 0; i < t->nlayers; i++) {
        pw_linear_t *l = &t->layers[i];
        move(buf, &k, l->w, (size_t)l->in * l->out, pack);
        move(buf, &k, l->b, (size_t)l->out, pack);
    }
    for (int i = 0; i < 2 * t->nlayers; i++) {
        pw_opt_t *o = &t->opt[i];
        if (o->s1)
            move(buf, &k, o->s1, o->n, pack);
        if (o->s2)
            move(buf, &k, o->s2, o->n, pack);
        if (buf && pack)
            u64_put(buf + k, o->t);
        else if (buf)
            o->t = u64_get(buf + k);
        k += 2;
    }
    if (buf && pack)
        u64_put(buf + k, t->step);
    else if (buf)
        t->step = u64_get(buf + k);
    return k + 2;
}

/* After the group (re)formed: every member takes the dense state of the member with the most
 * steps among those that have trained state (ties: the lowest group rank), by an allreduce in
 * which the others contribute zeros. Members that restarted have none; when no member has any
 * (the whole job restarted), each keeps its initial model. Members whose dense state differs in
 * size (another model) get PC_EDIM. */
static int sync_state(trainer_t *t) {
    const int n = pw_group_size(t->grp), me = pw_group_rank(t->grp);
    pw_coll_t *coll = pw_group_coll(t->grp);
    const size_t len = dense_state(t, NULL, false);
    float *info = calloc((size_t)n * 4, sizeof *info); /* per member: steps + 1, state size */
    if (!info)
        return PC_ENOMEM;
    u64_put(info + 4 * me, t->has_state ? t->step + 1 : 0);
    u64_put(info + 4 * me + 2, len);
    int rc = pw_coll_allreduce_sum(coll, info, (size_t)n * 4);
    int src = -1;
    uint64_t best = 0;
    for (int i = 0; !rc && i < n; i++) {
        if (u64_get(info + 4 * i + 2) != len) {
            PC_ERROR("train: group member %d has a dense model of another size: not the same "
                     "model settings",
                     i);
            rc = PC_EDIM;
        } else if (u64_get(info + 4 * i) > best) {
            best = u64_get(info + 4 * i), src = i;
        }
    }
    free(info);
    if (rc || src < 0)
        return rc;
    float *buf = calloc(len, sizeof *buf);
    if (!buf)
        return PC_ENOMEM;
    if (me == src)
        dense_state(t, buf, true);
    if (!(rc = pw_coll_allreduce_sum(coll, buf, len)) && me != src)
        dense_state(t, buf, false);
    free(buf);
    if (!rc) {
        t->has_state = true;
        PC_INFO("train: group generation %llu: %d worker(s) at step %llu (state of member %d)",
                (unsigned long long)pw_group_gen(t->grp), n, (unsigned long long)t->step, src);
    }
    return rc;
}

/* Errors of the agreement that re-forming the group cannot cure. */
static bool fatal(int rc) {
    return rc == PC_ENOMEM || rc == PC_EDIM || rc == PC_EINVAL;
}

/* A collective failed (a peer died) or a newer generation was proposed: re-form the group and
 * agree on the dense state; tried again while a member fails during the agreement. */
static int regroup(trainer_t *t) {
    int rc;
    do
        rc = pw_group_recover(t->grp);
    while (!rc && (rc = sync_state(t)) && !fatal(rc));
    return rc;
}

/* At start: agree on the dense state with the group just joined (a restarted worker takes it
 * from a live peer); a member failing meanwhile is handled as in regroup. */
static int regroup_initial(trainer_t *t) {
    int rc = sync_state(t);
    return rc && !fatal(rc) ? regroup(t) : rc;
}

/* Build the model: fields and dense values from the format (or the configuration). */
static int trainer_init(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    if ((c->ckpt_every || c->resume_checkpoint) &&
        (!c->servers[0] || !c->coordinator[0] || !c->ckpt_dir[0] ||
         (c->ckpt_every && !c->server_grpc[0]))) {
        PC_ERROR("train: coordinated checkpoints need servers, a coordinator, a checkpoint "
                 "directory and (to write them) the servers' gRPC addresses");
        return PC_EINVAL;
    }
    t->be = pw_backend_cpu();
    int kind, rc = model_kind(c->model, &kind);
    if (rc)
        return rc;
    t->kind = kind;
    pw_format_shape(t->fmt, &c->csv, &t->nf, &t->ndense);
    if (c->fields)
        t->nf = c->fields;
    if (t->nf < 1 && (t->kind == M_DLRM || t->kind == M_DEEPFM)) {
        PC_ERROR("train: set fields= (the number of categorical fields) for this format");
        return PC_EINVAL;
    }
    t->ones = t->ndense == 0;
    if (t->ones)
        t->ndense = 1;
    t->dim = t->kind == M_LR ? 1 : t->kind == M_DLRM ? c->dim : c->dim + 1; /* [w, v_1 .. v_k] */
    ps_table_config_t tc;
    char spec[600], err[256];
    ps_table_config_defaults(&tc);
    snprintf(spec, sizeof spec, "name=emb,dim=%d,seed=%llu,%s", t->dim, (unsigned long long)c->seed,
             c->table_spec);
    if ((rc = ps_table_config_parse(&tc, spec, err, sizeof err))) {
        PC_ERROR("train: table settings: %s", err);
        return PC_EINVAL;
    }
    if (t->kind == M_LR)
        tc.init = PS_INIT_ZEROS;
    if (c->servers[0]) { /* distributed: the servers hold the table */
        if ((rc = connect_cluster(t)))
            return rc;
    } else if ((rc = ps_table_create(&tc, &t->emb))) {
        return rc;
    }
    if (t->kind == M_LR || t->kind == M_FM) {
        if ((rc = pw_linear_init(&t->lin, t->ndense, 1, c->seed)))
            return rc;
        memset(t->lin.w, 0, (size_t)t->ndense * sizeof(float)); /* the linear part starts at 0 */
        t->layers = &t->lin;
        t->nlayers = 1;
    } else if (t->kind == M_DEEPFM) {
        pw_deepfm_config_t dc = {.ndense = t->ndense,
                                 .nfields = t->nf,
                                 .k = c->dim,
                                 .nlayers = c->ntop,
                                 .mean = c->mean_pooling,
                                 .max_batch = c->batch,
                                 .seed = c->seed};
        memcpy(dc.widths, c->top, sizeof dc.widths);
        if ((rc = pw_deepfm_create(&dc, t->be, &t->deepfm))) {
            PC_ERROR("train: DeepFM layers do not fit (top must end at 1)");
            return rc;
        }
        t->layers = pw_deepfm_layers(t->deepfm, &t->nlayers);
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
    for (int i = 0; i < t->nlayers; i++)
        t->nflat += (size_t)t->layers[i].in * t->layers[i].out + (size_t)t->layers[i].out;
    t->nflat++; /* the has-batch flag */
    if (!rc && t->grp && !(t->flat = malloc(t->nflat * sizeof(float))))
        rc = PC_ENOMEM;
    if (!rc && c->load_dense[0] && (rc = pw_dense_load(c->load_dense, t->layers, t->nlayers)))
        PC_ERROR("train: cannot load the dense model %s: %s", c->load_dense, pc_strerror(rc));
    const size_t b = (size_t)c->batch, pooled = b * (size_t)(t->nf > 0 ? t->nf : 1) * c->dim;
    t->pooled = malloc(pooled * sizeof(float));
    t->dpooled = malloc(pooled * sizeof(float));
    t->dense1 = malloc(b * sizeof(float));
    t->logits = malloc(b * sizeof(float));
    t->dlogits = malloc(b * sizeof(float));
    t->probs = malloc(b * sizeof(float));
    if (!rc && !(t->pooled && t->dpooled && t->dense1 && t->logits && t->dlogits && t->probs))
        rc = PC_ENOMEM;
    for (size_t i = 0; !rc && i < b; i++)
        t->dense1[i] = 1.0f;
    return rc;
}

/* Row buffers for nk features. */
static int reserve_rows(trainer_t *t, size_t nk) {
    if (nk <= t->cap)
        return 0;
    const size_t cap = nk + nk / 2;
    float *r = realloc(t->rows, cap * t->dim * sizeof(float));
    if (r)
        t->rows = r;
    float *g = realloc(t->grads, cap * t->dim * sizeof(float));
    if (g)
        t->grads = g;
    if (!r || !g)
        return PC_ENOMEM;
    t->cap = cap;
    return 0;
}

/* The batch fits the model: dense width, fields in range. */
static int check_batch(const trainer_t *t, const pw_batch_t *b) {
    if ((int)b->ndense != (t->ones ? 0 : t->ndense)) {
        PC_ERROR("train: a sample with %zu dense values, the model has %d", b->ndense,
                 t->ones ? 0 : t->ndense);
        return PC_EINVAL;
    }
    if (t->kind == M_DLRM || t->kind == M_DEEPFM)
        for (size_t j = 0; j < b->key_off[b->n]; j++)
            if (b->fields[j] >= t->nf) {
                PC_ERROR("train: a feature of field %u, the model has %d fields (fields=)",
                         b->fields[j], t->nf);
                return PC_EINVAL;
            }
    return 0;
}

/* One batch: forward (and backward + updates when training). The loss is returned in *loss. */
static int trainer_step(trainer_t *t, const pw_batch_t *b, bool train, double *loss) {
    const int n = (int)b->n, nf = t->nf, d = t->dim;
    const size_t nk = b->key_off[n];
    const float *dense = t->ones ? t->dense1 : b->dense;
    int rc = check_batch(t, b);
    if (!rc)
        rc = reserve_rows(t, nk);
    if (!rc)
        rc = emb_pull(t, b->keys, nk, t->rows, train);
    if (rc)
        return rc;
    const bool mean = t->c->mean_pooling;
    switch (t->kind) {
        case M_LR:
        case M_FM:
            pw_linear_forward(t->be, &t->lin, n, dense, t->logits);
            if (t->kind == M_FM)
                pw_fm_forward(n, b->key_off, b->vals, d - 1, t->rows, t->logits);
            else
                for (int s = 0; s < n; s++)
                    for (size_t j = b->key_off[s]; j < b->key_off[s + 1]; j++)
                        t->logits[s] += t->rows[j] * b->vals[j];
            break;
        case M_DEEPFM:
            rc = pw_deepfm_forward(t->deepfm, n, dense, b->key_off, b->fields, b->vals, t->rows,
                                   t->logits);
            break;
        case M_DLRM:
            t->be->pool(n, b->key_off, b->fields, b->vals, nf, d, t->rows, d, mean, t->pooled);
            rc = pw_dlrm_forward(t->dlrm, n, dense, t->pooled, t->logits);
            break;
    }
    if (rc)
        return rc;
    *loss = pw_bce_logits(n, t->logits, b->labels, t->probs, t->dlogits);
    if (!train)
        return 0;
    for (int i = 0; i < t->nlayers; i++)
        pw_linear_zero_grad(&t->layers[i]);
    switch (t->kind) {
        case M_LR:
        case M_FM:
            pw_linear_backward(t->be, &t->lin, n, dense, t->dlogits, NULL);
            if (t->kind == M_FM)
                pw_fm_backward(n, b->key_off, b->vals, d - 1, t->rows, t->dlogits, t->grads);
            else
                for (int s = 0; s < n; s++)
                    for (size_t j = b->key_off[s]; j < b->key_off[s + 1]; j++)
                        t->grads[j] = t->dlogits[s] * b->vals[j];
            break;
        case M_DEEPFM:
            rc = pw_deepfm_backward(t->deepfm, t->dlogits, t->grads);
            break;
        case M_DLRM:
            if ((rc = pw_dlrm_backward(t->dlrm, t->dlogits, t->dpooled)))
                break;
            memset(t->grads, 0, nk * d * sizeof(float));
            t->be->pool_grad(n, b->key_off, b->fields, b->vals, nf, d, t->dpooled, d, mean,
                             t->grads);
            break;
    }
    if (rc)
        return rc;
    return 0; /* the sparse gradients wait in t->grads for emb_push */
}

static int open_reader(const pw_train_config_t *c, pw_format_t fmt, const char *const *paths,
                       size_t n, int epochs, bool split, uint64_t skip, pw_reader_t **r) {
    pw_reader_opts_t o = {.format = fmt,
                          .csv = &c->csv,
                          .paths = paths,
                          .npaths = n,
                          .rank = split ? (uint32_t)c->rank : 0,
                          .world = split ? (uint32_t)c->world : 1,
                          .batch = (size_t)c->batch,
                          .queue = 4,
                          .epochs = epochs,
                          .max_error_rate = 0.01,
                          .skip_lines = skip,
                          .tcp_end_idle_ms = 1000};
    return pw_reader_open(&o, r);
}

/* Evaluate on the test stream: exact AUC and logloss over every sample. */
static int evaluate(trainer_t *t, const char *const *test, size_t ntest, pw_train_result_t *res) {
    size_t cap = 1 << 16, n = 0;
    float *p = malloc(cap * sizeof *p), *y = malloc(cap * sizeof *y);
    pw_reader_t *tr = NULL;
    int rc = p && y ? open_reader(t->c, t->fmt, test, ntest, 1, false, 0, &tr) : PC_ENOMEM;
    for (const pw_batch_t *b; !rc && (b = pw_reader_next(tr));) {
        double loss;
        if ((rc = trainer_step(t, b, false, &loss)))
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
        memcpy(p + n, t->probs, b->n * sizeof *p);
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
        res->evals++;
    }
    free(p);
    free(y);
    return rc;
}

/* Bytes the training stream will read (all epochs), or 0 when unknown (stdin, TCP, gzip). */
static uint64_t stream_bytes(const char *const *paths, size_t n, int epochs) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        const size_t len = strlen(paths[i]);
        if (strcmp(paths[i], "-") == 0 || strncmp(paths[i], "tcp://", 6) == 0 ||
            (len > 3 && strcmp(paths[i] + len - 3, ".gz") == 0) || stat(paths[i], &st))
            return 0;
        total += (uint64_t)st.st_size;
    }
    return total * (uint64_t)epochs;
}

static void progress(const pw_train_config_t *c, pw_reader_t *r, uint64_t samples, uint64_t t0,
                     double loss, uint64_t total_bytes) {
    const double sec = pc_time_sec_since(t0);
    double frac = 0;
    if (c->max_samples)
        frac = (double)samples / (double)c->max_samples;
    if (total_bytes) {
        pw_reader_stats_t st;
        pw_reader_stats(r, &st);
        const double fb = (double)st.bytes / (double)total_bytes;
        frac = frac > fb ? frac : fb;
    }
    char eta[48] = "";
    if (frac > 0.001 && frac < 1)
        snprintf(eta, sizeof eta, ", ETA %.0f s", sec * (1 - frac) / frac);
    fprintf(stderr, "train: %llu samples, %.0f/s, loss %.4f%s\n", (unsigned long long)samples,
            (double)samples / sec, loss, eta);
}

/* A coordinated checkpoint after step t->step (pw_jobckpt.h). The members first agree that
 * every one recorded its position (else no checkpoint: one would hold a stale position); they
 * then wait for rank 0 with a timeout long enough for every server's checkpoint call. Collective
 * errors are returned (the caller regroups); a failed checkpoint is only logged. */
static int job_checkpoint(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    int nservers = 1;
    for (const char *p = c->server_grpc; *p; p++)
        nservers += *p == ',';
    const int wait_ms = c->timeout_ms * (nservers + 1);
    float saved = t->pos_saved ? 1.0f : 0.0f;
    int rc = pw_coll_allreduce_sum(pw_group_coll(t->grp), &saved, 1);
    if (rc || pw_group_rank(t->grp) != 0)
        return rc ? rc : pw_coll_barrier(pw_group_coll(t->grp), wait_ms);
    const uint64_t t0 = pc_time_mono_ns();
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    const size_t n = dense_state(t, NULL, false);
    float *state = malloc(n * sizeof *state);
    int ck_rc = !ck || !state ? PC_ENOMEM : saved < (float)pw_group_size(t->grp) ? PC_EUNAVAIL : 0;
    if (!ck_rc) {
        ck->step = t->step;
        ck->nranks = (size_t)c->world;
        for (int r = 0; r < c->world && !ck_rc; r++) { /* lost ranks: their last position */
            uint64_t step;
            ck_rc = pw_group_offset_load(t->grp, r, &step, &ck->positions[r]);
            if (ck_rc == PC_ENOTFOUND)
                ck_rc = 0, ck->positions[r] = 0;
        }
    }
    if (!ck_rc)
        ck_rc = pw_jobckpt_servers(c->server_grpc, c->timeout_ms, ck);
    if (!ck_rc) {
        dense_state(t, state, true);
        ck_rc = pw_jobckpt_write(c->ckpt_dir, ck, state, n, 2);
    }
    if (ck_rc)
        PC_ERROR("train: the checkpoint after step %llu failed: %s (training goes on)",
                 (unsigned long long)t->step, pc_strerror(ck_rc));
    else
        PC_INFO("train: checkpoint after step %llu in %s (%zu servers) in %.2f s",
                (unsigned long long)t->step, c->ckpt_dir, ck->nservers, pc_time_sec_since(t0));
    free(ck);
    free(state);
    return pw_coll_barrier(pw_group_coll(t->grp), wait_ms);
}

/* Start from the latest coordinated checkpoint: the dense state, and *skip = this rank's
 * position. */
static int resume_checkpoint(trainer_t *t, uint64_t *skip) {
    const size_t n = dense_state(t, NULL, false);
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    float *state = malloc(n * sizeof *state);
    int rc = ck && state ? pw_jobckpt_read_latest(t->c->ckpt_dir, ck, state, n) : PC_ENOMEM;
    if (!rc && ck->nranks != (size_t)t->c->world) {
        PC_ERROR("train: the checkpoint is of %zu workers, this job has %d", ck->nranks,
                 t->c->world);
        rc = PC_EINVAL;
    }
    if (!rc) {
        dense_state(t, state, false);
        *skip = ck->positions[t->c->rank];
        PC_WARN("train: rank %d resumes from the checkpoint after step %llu, line %llu of its "
                "data",
                t->c->rank, (unsigned long long)t->step, (unsigned long long)*skip);
    } else {
        PC_ERROR("train: cannot resume from the checkpoint in %s: %s", t->c->ckpt_dir,
                 pc_strerror(rc));
    }
    free(ck);
    free(state);
    return rc;
}

int pw_train_run(const pw_train_config_t *c, pw_format_t fmt, const char *const *train,
                 size_t ntrain, const char *const *test, size_t ntest, pw_train_result_t *res) {
    if (!c || !train || !ntrain || c->batch < 1 || c->epochs < 1 || !res)
        return PC_EINVAL;
    memset(res, 0, sizeof *res);
    res->auc = res->logloss = NAN;
    const uint64_t t0 = pc_time_mono_ns();
    trainer_t t = {.c = c, .fmt = fmt, .has_state = true, .pos_saved = true};
    int rc = trainer_init(&t);
    uint64_t skip = 0, saved_step = 0;
    if (!rc && t.grp && c->resume_checkpoint) { /* the job rolled back */
        if (!(rc = resume_checkpoint(&t, &skip)))
            rc = regroup_initial(&t);
    } else if (!rc && t.grp) { /* a restarted worker continues after its last step */
        rc = pw_group_offset_load(t.grp, c->rank, &saved_step, &skip);
        if (rc == 0) {
            t.has_state = false; /* its dense model comes from a live peer */
            PC_WARN("train: rank %d resumes after step %llu, line %llu of its data", c->rank,
                    (unsigned long long)saved_step, (unsigned long long)skip);
        }
        rc = rc == PC_ENOTFOUND ? 0 : rc;
        if (!rc)
            rc = regroup_initial(&t);
    }
    pw_reader_t *r = NULL;
    if (!rc)
        rc = open_reader(c, fmt, train, ntrain, c->epochs, true, skip, &r);
    if (rc) {
        trainer_free(&t);
        return rc;
    }
    const uint64_t total_bytes = stream_bytes(train, ntrain, c->epochs);
    double ema = NAN;
    uint64_t next_progress = c->progress_every, next_eval = c->eval_every;
    bool budget_left = true, redo = false;
    const pw_batch_t *b = NULL;
    res->first_step_s = NAN;
    for (;;) {
        /* A batch (none once the stream or the sample budget is done); with a group, step on
         * until no worker has one. A step that a peer's failure cut short before the pushes is
         * done again with the same batch in the re-formed group. */
        if (!redo)
            b = budget_left ? pw_reader_next(r) : NULL;
        redo = false;
        if (t.grp && pw_group_stale(t.grp) && (rc = regroup(&t)))
            break;
        double loss;
        bool any;
        if (b && (rc = trainer_step(&t, b, true, &loss)))
            break;
        if ((rc = reduce_dense(&t, b != NULL, &any)) && t.grp) {
            if ((rc = regroup(&t)))
                break;
            redo = true;
            continue;
        }
        if (rc || !any)
            break;
        if (b && (rc = emb_push(&t, b->keys, b->key_off[b->n], t.grads)))
            break;
        if ((rc = barrier(&t)) && t.grp) {
            /* b's gradients were pushed; the re-formed group agreed on a dense state */
            if ((rc = regroup(&t)))
                break;
        } else if (rc) {
            break;
        } else {
            apply_dense(&t);
        }
        if (isnan(res->first_step_s))
            res->first_step_s = pc_time_sec_since(t0);
        /* The position after this step (unchanged without a batch). A failed save: training
         * goes on (the group's connections are peer to peer), the next try a second later; a
         * restart would resume from an older position, and no checkpoint is taken meanwhile. */
        if (t.grp && (b || !t.pos_saved) && pc_time_mono_ns() >= t.pos_retry_ns) {
            rc = pw_group_offset_save(t.grp, t.step, pw_reader_consumed(r));
            if (rc && t.pos_saved)
                PC_WARN("train: cannot record this worker's position at the coordinator: %s",
                        pc_strerror(rc));
            t.pos_saved = rc == 0;
            t.pos_retry_ns = rc ? pc_time_mono_ns() + 1000000000ull : 0;
            rc = 0;
        }
        if (t.grp && c->ckpt_every && t.step % c->ckpt_every == 0 && (rc = job_checkpoint(&t))) {
            if ((rc = regroup(&t)))
                break;
        }
        if (!b)
            continue;
        ema = isnan(ema) ? loss : 0.99 * ema + 0.01 * loss;
        res->samples += b->n;
        if (c->progress_every && res->samples >= next_progress) {
            progress(c, r, res->samples, t0, ema, total_bytes);
            next_progress += c->progress_every;
        }
        if (c->eval_every && ntest && (t.grp ? pw_group_rank(t.grp) == 0 : c->rank == 0) &&
            res->samples >= next_eval) {
            if ((rc = evaluate(&t, test, ntest, res)))
                break;
            fprintf(stderr, "eval: after %llu samples: AUC %.4f, logloss %.4f (%llu samples)\n",
                    (unsigned long long)res->samples, res->auc, res->logloss,
                    (unsigned long long)res->test_samples);
            next_eval += c->eval_every;
        }
        if (c->max_samples && res->samples >= c->max_samples)
            budget_left = false;
    }
    if (!rc)
        rc = pw_reader_error(r);
    pw_reader_close(r);
    res->steps = t.step;
    res->lost_pushes = t.lost_pushes;
    res->seconds = pc_time_sec_since(t0);
    res->samples_per_s = res->seconds > 0 ? (double)res->samples / res->seconds : 0;
    res->train_loss = ema;
    if (!rc && t.emb)
        res->table_rows = ps_table_count(t.emb);
    /* distributed: the group's rank 0 saves, evaluates and ends the run at the coordinator */
    const bool lead = t.grp ? pw_group_rank(t.grp) == 0 : c->rank == 0;
    if (!rc && lead && t.grp && (rc = pw_group_finish(t.grp)))
        PC_ERROR("train: cannot mark the run finished at the coordinator: %s", pc_strerror(rc));
    if (!rc && lead && c->save_dense[0] && (rc = pw_dense_save(c->save_dense, t.layers, t.nlayers)))
        PC_ERROR("train: cannot save the dense model to %s: %s", c->save_dense, pc_strerror(rc));
    if (!rc && c->export_embeddings[0] && !t.emb) {
        PC_ERROR("train: export the servers' table with a checkpoint (psctl), not the worker");
        rc = PC_EINVAL;
    }
    if (!rc && c->export_embeddings[0] &&
        (rc = ps_table_export(t.emb, NULL, c->export_embeddings, true)))
        PC_ERROR("train: cannot export the embeddings to %s: %s", c->export_embeddings,
                 pc_strerror(rc));
    if (!rc && lead && ntest)
        rc = evaluate(&t, test, ntest, res);
    trainer_free(&t);
    return rc;
}
