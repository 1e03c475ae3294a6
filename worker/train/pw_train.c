/* pw_train.c: see pw_train.h. */
#include "pw_train.h"

#include "pc_error.h"
#include "pc_log.h"
#include "pc_time.h"
#include "ps_table.h"
#include "emberps/psclient.h"
#include "pw_coll.h"
#include "pw_group.h"
#include "pw_sched.h"
#include "pc_hash.h"
#include "pw_jobckpt.h"
#include "pw_deepfm.h"
#include "pw_dlrm.h"
#include "ps_ckpt.h"
#include "pw_metrics.h"
#include "pw_model_io.h"
#include "pw_reader.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
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
    c->lease_ms = 10000;
    c->server_retry_ms = 60000;
    c->shrink = true;
    c->staleness = 0;
    c->pull_ahead = 2;
    c->async_window = 2;
    c->credit_bytes = (size_t)4 << 20;
    c->chunk_bytes = (size_t)256 << 10;
}

int pw_train_mode_parse(const char *s, int *staleness) {
    if (strcmp(s, "sync") == 0)
        return *staleness = 0, 0;
    if (strcmp(s, "async") == 0)
        return *staleness = PW_ASYNC, 0;
    char *end;
    long v = strncmp(s, "ssp:", 4) == 0 ? strtol(s + 4, &end, 10) : 0;
    if (v < 1 || v > 1000 || *end)
        return PC_EINVAL;
    *staleness = (int)v;
    return 0;
}

struct trainer;

/* The backend's copies of what a step computes from (device memory, grown as needed; cap in
 * bytes). Backends with host memory compute from the host arrays and leave these unused. */
typedef struct dbuf {
    void *p;
    size_t cap;
} dbuf_t;

enum { DB_LABELS, DB_DENSE, DB_KEY_OFF, DB_FIELDS, DB_VALS, DB_INV, DB_UROWS, DB_UGRADS, DB_N };
enum {
    DB_SETS = 3
}; /* two for training steps (by round parity), one for evaluation; the
    * gradients' buffer (DB_UGRADS) is set 0's only */

/* A batch as the backend sees it (device pointers; host ones with host memory). */
typedef struct dview {
    int n;
    size_t nk;           /* features */
    const uint32_t *inv; /* training: feature -> unique row */
    const float *urows;  /* training: the unique rows */
    const float *labels, *dense, *vals;
    const size_t *key_off;
    const uint16_t *fields;
} dview_t;

/* A step's batch on its way through the pipeline: a copy of the reader's batch, its unique keys
 * (ukeys; inv[j]: the index of feature j's key), their pulled rows and summed gradients, and the
 * jobs that move them (pw_sched.h). */
typedef struct slot {
    struct trainer *t;
    uint64_t round; /* the step it is computed as */
    uint64_t pos;   /* the reader's position after this batch */
    pw_batch_t b;
    size_t ncap, dcap, kcap; /* labels and key_off; dense; keys, fields, vals, inv, ukeys */
    uint64_t *ukeys;
    uint32_t *inv;
    size_t nu, ucap; /* ucap: urows, ugrads (the backend's host memory: pinned on a GPU) */
    float *urows, *ugrads;
    pw_job_t pull;
    bool staged; /* its inputs are on the backend (in dv), uploaded after its pull */
    dview_t dv;
    struct pchunk *push;
    size_t npush, pcap;
} slot_t;

typedef struct pchunk { /* a push of keys [off, off + n) of a slot */
    pw_job_t job;
    slot_t *s;
    size_t off, n;
} pchunk_t;

/* A step's round: its dense gradients summed over the group in chunks (the layers the next
 * forward needs first), then the marker (ordered lane): it waits for the step's pushes (sync,
 * ssp), records the step's end, and sums the has-batch flag (the last float of flat). The group
 * applies rounds in order; without a group a round only tracks the pushes. */
typedef struct round {
    struct trainer *t;
    uint64_t id;
    uint64_t pos; /* the reader position after its batch */
    bool has_pos; /* it had a batch */
    slot_t *slot; /* whose pushes the marker waits for (NULL: none) */
    float *flat;  /* the group's dense gradients and flag (device memory when dflat) */
    struct dchunk *chunks;
    pw_job_t mark;
} round_t;

typedef struct dchunk { /* an allreduce of flat[off, off + n) */
    pw_job_t job;
    round_t *r;
    size_t off, n;
} dchunk_t;

typedef struct trainer {
    const pw_train_config_t *c;
    pw_backend_t *be;
    pw_format_t fmt;
    enum { M_DLRM, M_DEEPFM, M_FM, M_LR } kind;
    int nf, ndense, dim; /* dim: the table's row width */
    bool ones;           /* no dense features: one constant 1 stands in (a learned bias) */
    ps_table_t *emb;     /* local */
    psc_t *ps;           /* distributed: the servers */
    pw_group_t *grp;     /* world > 1: the workers' group (membership, collectives) */
    pw_dcoll_t *dcoll;   /* the group's dense allreduce on the device (NCCL), or NULL (Gloo) */
    pw_sched_t *sched;   /* distributed: every call to the servers and the group */
    size_t nflat;        /* dense gradients and the has-batch flag */
    int stale;           /* rounds a step may run ahead of the group (sync 0) */
    int ahead;           /* batches pulled ahead of the one computing */
    slot_t *slots;       /* ring: slots[head] holds step next_round's batch */
    int nslots, head, filled;
    round_t *rounds; /* ring by round id */
    int nrounds;
    dchunk_t *plan; /* the chunks of a round (offsets, priorities) */
    int nplan;
    uint64_t next_round, applied; /* rounds submitted, rounds applied */
    uint64_t step;                /* dense optimizer steps taken (distributed: the group's count) */
    bool has_state; /* the dense model is trained state (not a restarted worker's fresh one) */
    bool waiting_servers;  /* warned that the servers are unavailable (until they answer) */
    uint64_t done_pos;     /* position after the last applied round with a batch */
    bool pos_dirty;        /* done_pos not recorded at the coordinator yet */
    bool pos_saved;        /* this worker's last position reached the coordinator */
    uint64_t pos_retry_ns; /* after a failed save, the next try waits until then */
    atomic_ullong lost_pushes;
    uint64_t seen_reconnects; /* the client's reconnects when last looked at (rollback) */
    bool want_rollback;       /* this worker saw a server connection lost */
    bool reposition;          /* a rollback: read again from reposition_at (the loop reopens) */
    uint64_t reposition_at, rollbacks;
    atomic_bool coll_broken; /* an ordered-lane collective failed (until the group re-forms) */
    FILE *step_log;
    uint64_t max_ahead;
    double pull_wait_s;
    uint32_t *dedup; /* open addressing: index + 1 into ukeys, 0 empty */
    size_t dedup_cap;
    pw_dlrm_t *dlrm;
    pw_deepfm_t *deepfm;
    pw_linear_t lin; /* lr, fm: dense features -> logit */
    pw_linear_t *layers;
    int nlayers;
    pw_opt_t *opt; /* 2 per layer: weights, biases */
    size_t cap;    /* features the row buffers hold */
    /* device memory: a row and its gradient per feature, the model's inputs and outputs */
    float *rows, *grads, *pooled, *dpooled, *dense1, *logits, *dlogits, *probs;
    float *hrows; /* pinned host: rows looked up for evaluation (device backends; cap of them) */
    dbuf_t dev[DB_SETS][DB_N]; /* steps' inputs on the backend */
    float *dloss, *hloss;      /* the step's loss: device, host (pinned) */
} trainer_t;

/* The rounds' dense buffers are device memory, summed by the backend's device collectives
 * (NCCL); else host memory summed by Gloo. */
static bool dflat(const trainer_t *t) {
    return t->grp && t->be->dcoll;
}

static void slot_free(pw_backend_t *be, slot_t *s) {
    void *const host[] = {s->b.labels,  s->b.dense, s->b.keys, s->b.fields, s->b.vals,
                          s->b.key_off, s->ukeys,   s->inv,    s->urows,    s->ugrads};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        be->host_free(be, host[i]);
    free(s->push);
}

static void trainer_free(trainer_t *t) {
    pw_backend_t *be = t->be;
    pw_sched_destroy(t->sched); /* first: its jobs use the slots, rounds and client */
    for (int i = 0; t->slots && i < t->nslots; i++)
        slot_free(be, &t->slots[i]);
    free(t->slots);
    if (t->dcoll)
        be->dcoll->destroy(t->dcoll);
    for (int i = 0; t->rounds && i < t->nrounds; i++) {
        if (dflat(t))
            be->free(be, t->rounds[i].flat);
        else
            free(t->rounds[i].flat);
        free(t->rounds[i].chunks);
    }
    free(t->rounds);
    free(t->plan);
    free(t->dedup);
    if (t->step_log)
        fclose(t->step_log);
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
    be->free(be, t->rows);
    be->free(be, t->grads);
    be->free(be, t->pooled);
    be->free(be, t->dpooled);
    be->free(be, t->dense1);
    be->free(be, t->logits);
    be->free(be, t->dlogits);
    be->free(be, t->probs);
    be->host_free(be, t->hrows);
    for (int k = 0; k < DB_SETS; k++)
        for (int i = 0; i < DB_N; i++)
            be->free(be, t->dev[k][i].p);
    be->free(be, t->dloss);
    be->host_free(be, t->hloss);
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
                          .lease_ms = c->lease_ms,
                          .shrink = c->shrink};
    if ((rc = pw_group_join(&go, &t->grp)))
        PC_ERROR("train: the worker group did not form (job %s at %s): %s", c->job, c->coordinator,
                 pc_strerror(rc));
    return rc;
}

static bool transient(int rc) {
    return rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT;
}

/* Evaluation's read-only lookups. Distributed: a server that is down (killed, restarting) is
 * waited for, up to server_retry_ms, retrying every 200 ms. */
/* A read from the servers (a pull or a lookup, first tried at t0) ended with rc: true when it is
 * to be tried again, after a 200 ms pause (a server down, within server_retry_ms). Warns once
 * while the servers are down, and when they answer again. */
static bool server_retry(trainer_t *t, int rc, uint64_t t0) {
    if (!transient(rc) || pc_time_sec_since(t0) * 1000 > t->c->server_retry_ms) {
        if (!rc && t->waiting_servers)
            PC_WARN("train: the servers answer again");
        t->waiting_servers = t->waiting_servers && rc;
        return false;
    }
    if (!t->waiting_servers)
        PC_WARN("train: servers unavailable (%s); waiting up to %d ms", pc_strerror(rc),
                t->c->server_retry_ms);
    t->waiting_servers = true;
    pc_time_sleep_ms(200);
    return true;
}

static int emb_lookup(trainer_t *t, const uint64_t *keys, size_t n, float *rows) {
    if (!t->ps)
        return ps_table_lookup(t->emb, keys, n, rows, n * (size_t)t->dim, NULL);
    const uint64_t t0 = pc_time_mono_ns();
    int rc;
    do
        rc = psc_lookup(t->ps, t->c->table_name, keys, n, (uint32_t)t->dim, rows, NULL);
    while (server_retry(t, rc, t0));
    return rc;
}

/* ---- the pipeline: pulls ahead, chunked pushes and dense rounds through the scheduler ---- */

enum { PRIO_PULL = 0, PRIO_DENSE = 1, PRIO_PUSH = 1 << 20 };

static void call_done(void *ctx, uint64_t id, int rc) {
    (void)id;
    pw_sched_complete(ctx, rc);
}

static int run_pull(pw_job_t *j) {
    slot_t *s = j->ctx;
    trainer_t *t = s->t;
    if (t->ps) {
        uint64_t id;
        return psc_pull_async(t->ps, t->c->table_name, s->ukeys, s->nu, (uint32_t)t->dim, s->urows,
                              call_done, j, &id);
    }
    pw_sched_complete(j, ps_table_pull(t->emb, s->ukeys, s->nu, s->urows, s->nu * t->dim));
    return 0;
}

/* A push that a server failure cut short is not sent again: the servers that answered applied
 * their part; a restarted server lost it anyway (and all since its checkpoint). */
static void push_done(void *ctx, uint64_t id, int rc) {
    (void)id;
    pchunk_t *p = ctx;
    if (transient(rc)) {
        PC_WARN("train: a push failed (%s); its part on the failed server is lost",
                pc_strerror(rc));
        atomic_fetch_add(&p->s->t->lost_pushes, 1);
        rc = 0;
    }
    pw_sched_complete(&p->job, rc);
}

static int run_push(pw_job_t *j) {
    pchunk_t *p = (pchunk_t *)j;
    trainer_t *t = p->s->t;
    const size_t d = (size_t)t->dim;
    if (t->ps) {
        uint64_t id;
        return psc_push_async(t->ps, t->c->table_name, p->s->ukeys + p->off, p->n, (uint32_t)d,
                              p->s->ugrads + p->off * d, NULL, push_done, p, &id);
    }
    ps_push_result_t pr;
    pw_sched_complete(j, ps_table_push(t->emb, p->s->ukeys + p->off, p->n,
                                       p->s->ugrads + p->off * d, p->n * d, &pr));
    return 0;
}

/* A collective of the ordered lane; after one failed, the group is broken: the rest fail at
 * once (until the group is re-formed). */
static int coll_sum(trainer_t *t, float *buf, size_t n) {
    if (atomic_load(&t->coll_broken))
        return PC_ECANCELED;
    int rc = dflat(t) ? t->be->dcoll->allreduce_sum(t->dcoll, buf, n)
                      : pw_coll_allreduce_sum(pw_group_coll(t->grp), buf, n);
    if (rc)
        atomic_store(&t->coll_broken, true);
    return rc;
}

static int run_dense(pw_job_t *j) {
    dchunk_t *c = (dchunk_t *)j;
    return coll_sum(c->r->t, c->r->flat + c->off, c->n);
}

static void log_step(trainer_t *t, uint64_t round, const char *what) {
    if (t->step_log)
        fprintf(t->step_log, "%d %" PRIu64 " %s %" PRIu64 "\n", t->c->rank, round, what,
                pc_time_mono_ns());
}

static int run_mark(pw_job_t *j) {
    round_t *r = j->ctx;
    trainer_t *t = r->t;
    int rc = 0;
    for (size_t i = 0; r->slot && i < r->slot->npush; i++) {
        int prc = pw_sched_wait(t->sched, &r->slot->push[i].job);
        rc = rc ? rc : prc;
    }
    log_step(t, r->id, "end");
    if (!rc && t->grp)
        rc = coll_sum(t, r->flat + t->nflat - 1, 1);
    return rc;
}

/* The pipeline's buffers: stale = the rounds a step may run ahead (sync 0, ssp S, async the
 * window), ahead = batches pulled ahead (at most stale). A slot is refilled only once its round
 * is done: stale + ahead + 2 slots never wait for that. The dense rounds go in chunks of
 * chunk_bytes, per layer, in the order the forward pass needs them. */
static int pipeline_init(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    t->stale =
        c->staleness == PW_ASYNC ? (c->async_window > 0 ? c->async_window : 1) : c->staleness;
    if (!t->ps)
        t->stale = 0; /* local training is one thread */
    t->ahead = c->pull_ahead < t->stale ? c->pull_ahead : t->stale;
    if (t->ahead < 0)
        t->ahead = 0;
    t->nslots = t->stale + t->ahead + 2;
    t->nrounds = t->stale + 2;
    t->slots = calloc((size_t)t->nslots, sizeof *t->slots);
    t->rounds = calloc((size_t)t->nrounds, sizeof *t->rounds);
    const size_t cf = c->chunk_bytes / sizeof(float) ? c->chunk_bytes / sizeof(float) : 1;
    size_t nplan = 0;
    for (int i = 0; i < t->nlayers; i++) {
        const size_t n = (size_t)t->layers[i].in * t->layers[i].out + (size_t)t->layers[i].out;
        nplan += (n + cf - 1) / cf;
    }
    t->plan = calloc(nplan ? nplan : 1, sizeof *t->plan);
    if (!t->slots || !t->rounds || !t->plan)
        return PC_ENOMEM;
    size_t k = 0;
    for (int i = 0; i < t->nlayers; i++) {
        const size_t n = (size_t)t->layers[i].in * t->layers[i].out + (size_t)t->layers[i].out;
        for (size_t o = 0; o < n; o += cf) {
            dchunk_t *d = &t->plan[t->nplan++];
            d->off = k + o;
            d->n = n - o < cf ? n - o : cf;
            d->job.prio = PRIO_DENSE + i;
        }
        k += n;
    }
    for (int i = 0; i < t->nslots; i++)
        t->slots[i].t = t;
    for (int i = 0; i < t->nrounds; i++) {
        round_t *r = &t->rounds[i];
        r->t = t;
        if (!t->grp)
            continue;
        r->flat = dflat(t) ? t->be->alloc(t->be, t->nflat * sizeof(float))
                           : calloc(t->nflat, sizeof(float));
        r->chunks = calloc((size_t)t->nplan, sizeof *r->chunks);
        if (!r->flat || !r->chunks)
            return PC_ENOMEM;
    }
    if (c->step_log[0] && !(t->step_log = fopen(c->step_log, "a"))) {
        PC_ERROR("train: cannot open the step log %s", c->step_log);
        return PC_EIO;
    }
    if (t->step_log)
        setvbuf(t->step_log, NULL, _IOLBF, 0);
    if (!t->ps)
        return 0;
    pw_sched_opts_t so = {.credit_bytes = c->credit_bytes, .fifo = c->fifo};
    return pw_sched_create(&so, &t->sched);
}

/* Arrays p[0..n) (element sizes es[]) that share the capacity *cap grow together to hold
 * need elements; *cap changes only when all grew (after a failure the next call grows again).
 * With a backend they are its host memory (pinned on a GPU: what the device copies from and
 * to), and their contents are not kept; without, realloc keeps them. */
static int grow(pw_backend_t *be, size_t *cap, size_t need, int n, void **const p[],
                const size_t es[]) {
    if (need <= *cap)
        return 0;
    const size_t c = need + need / 2;
    for (int i = 0; i < n; i++) {
        void *q = be ? be->host_alloc(be, c * es[i]) : realloc(*p[i], c * es[i]);
        if (!q)
            return PC_ENOMEM;
        if (be)
            be->host_free(be, *p[i]);
        *p[i] = q;
    }
    *cap = c;
    return 0;
}

/* The batch copied into the slot (the reader reuses its buffers), and its unique keys. */
static int slot_fill(trainer_t *t, slot_t *s, const pw_batch_t *b) {
    const size_t n = b->n, nk = b->key_off[n], nd = b->ndense;
    void **const per_sample[] = {(void **)&s->b.labels, (void **)&s->b.key_off};
    const size_t ps_size[] = {sizeof(float), sizeof(size_t)};
    void **const per_key[] = {(void **)&s->b.keys, (void **)&s->b.fields, (void **)&s->b.vals,
                              (void **)&s->inv, (void **)&s->ukeys};
    const size_t pk_size[] = {sizeof(uint64_t), sizeof(uint16_t), sizeof(float), sizeof(uint32_t),
                              sizeof(uint64_t)};
    void **const dense[] = {(void **)&s->b.dense};
    const size_t d_size[] = {sizeof(float)};
    pw_backend_t *be = t->be; /* the slot's arrays are what the device copies from */
    int rc = grow(be, &s->ncap, n + 1, 2, per_sample, ps_size);
    if (!rc)
        rc = grow(be, &s->dcap, n * nd + 1, 1, dense, d_size);
    if (!rc)
        rc = grow(be, &s->kcap, nk + 1, 5, per_key, pk_size);
    if (rc)
        return rc;
    s->b.n = n;
    s->b.ndense = nd;
    s->b.lines = b->lines;
    memcpy(s->b.labels, b->labels, n * sizeof(float));
    memcpy(s->b.dense, b->dense, n * nd * sizeof(float));
    memcpy(s->b.key_off, b->key_off, (n + 1) * sizeof(size_t));
    memcpy(s->b.keys, b->keys, nk * sizeof(uint64_t));
    memcpy(s->b.fields, b->fields, nk * sizeof(uint16_t));
    memcpy(s->b.vals, b->vals, nk * sizeof(float));
    /* unique keys, in first-seen order */
    size_t hc = 16;
    while (hc < 2 * nk)
        hc <<= 1;
    if (hc > t->dedup_cap) {
        free(t->dedup);
        if (!(t->dedup = malloc(hc * sizeof *t->dedup)))
            return t->dedup_cap = 0, PC_ENOMEM;
        t->dedup_cap = hc;
    }
    memset(t->dedup, 0, hc * sizeof *t->dedup);
    s->nu = 0;
    for (size_t j = 0; j < nk; j++) {
        const uint64_t key = s->b.keys[j];
        size_t h = pc_hash_u64(key, PC_HASH_SEED_DEDUP) & (hc - 1);
        while (t->dedup[h] && s->ukeys[t->dedup[h] - 1] != key)
            h = (h + 1) & (hc - 1);
        if (!t->dedup[h]) {
            s->ukeys[s->nu] = key;
            t->dedup[h] = (uint32_t)++s->nu;
        }
        s->inv[j] = t->dedup[h] - 1;
    }
    void **const rows[] = {(void **)&s->urows, (void **)&s->ugrads};
    const size_t r_size[] = {sizeof(float), sizeof(float)};
    return grow(be, &s->ucap, s->nu * (size_t)t->dim + 1, 2, rows, r_size);
}

static round_t *round_of(trainer_t *t, uint64_t id) {
    return &t->rounds[id % (uint64_t)t->nrounds];
}

/* Start the pull of a filled slot: after round `round - stale - 1` is done (sync: every
 * worker's pushes of the step before it were applied). */
static void slot_pull(trainer_t *t, slot_t *s) {
    s->staged = false;
    pw_sched_reset(&s->pull);
    s->pull.cls = PW_JOB_PULL;
    s->pull.prio = PRIO_PULL;
    s->pull.bytes = s->nu * (sizeof(uint64_t) + (size_t)t->dim * sizeof(float));
    s->pull.run = run_pull;
    s->pull.ctx = s;
    const uint64_t gate = s->round - (uint64_t)t->stale - 1;
    if (s->round >= (uint64_t)t->stale + 1 && gate >= t->applied)
        s->pull.after = &round_of(t, gate)->mark;
    pw_sched_submit(t->sched, &s->pull);
}

/* Wait for the slot's rows; pulls that find a server down are tried again every 200 ms for up
 * to server_retry_ms (a restarted server restores its last checkpoint). */
static int slot_rows(trainer_t *t, slot_t *s) {
    const uint64_t t0 = pc_time_mono_ns();
    int rc;
    while (server_retry(t, rc = pw_sched_wait(t->sched, &s->pull), t0))
        slot_pull(t, s); /* its gate is done: waited for before */
    t->pull_wait_s += pc_time_sec_since(t0);
    return rc;
}

/* Push the slot's summed gradients in chunks (bulk: after everything else). */
static int slot_push(trainer_t *t, slot_t *s) {
    const size_t d = (size_t)t->dim, row = sizeof(uint64_t) + d * sizeof(float);
    size_t per = t->c->chunk_bytes / row ? t->c->chunk_bytes / row : 1;
    const size_t n = s->nu ? (s->nu + per - 1) / per : 0;
    void **const push[] = {(void **)&s->push};
    const size_t p_size[] = {sizeof *s->push};
    int rc = grow(NULL, &s->pcap, n ? n : 1, 1, push, p_size);
    if (rc)
        return rc;
    s->npush = n;
    for (size_t i = 0; i < n; i++) {
        pchunk_t *p = &s->push[i]; /* grown by realloc: every field of the job set here */
        p->job =
            (pw_job_t){.cls = PW_JOB_PUSH, .ordered = false, .prio = PRIO_PUSH, .run = run_push};
        pw_sched_reset(&p->job);
        p->s = s;
        p->off = i * per;
        p->n = s->nu - p->off < per ? s->nu - p->off : per;
        p->job.bytes = p->n * row;
        pw_sched_submit(t->sched, &p->job);
    }
    return 0;
}

/* Submit round next_round: the dense gradients now in the layers (group), whether this worker
 * had a batch, and the marker; `s` the slot whose pushes it waits for (sync, ssp). */
static void round_submit(trainer_t *t, slot_t *s, bool had_batch) {
    round_t *r = round_of(t, t->next_round);
    r->id = t->next_round++;
    r->has_pos = s != NULL;
    r->pos = s ? s->pos : 0;
    r->slot = t->c->staleness == PW_ASYNC ? NULL : s;
    if (t->grp) {
        pw_backend_t *be = t->be;
        const bool dev = dflat(t);
        void (*out)(pw_backend_t *, void *, const void *, size_t) = dev ? be->copy : be->download;
        size_t k = 0;
        for (int i = 0; i < t->nlayers && had_batch; i++) {
            const pw_linear_t *l = &t->layers[i];
            const size_t nw = (size_t)l->in * l->out;
            out(be, r->flat + k, l->dw, nw * sizeof(float));
            out(be, r->flat + k + nw, l->db, (size_t)l->out * sizeof(float));
            k += nw + (size_t)l->out;
        }
        const float flag = had_batch ? 1.0f : 0.0f;
        if (dev) { /* the collective reads the buffer from another thread: complete it */
            if (!had_batch)
                be->zero(be, r->flat, (t->nflat - 1) * sizeof(float));
            be->fill(be, 1, flag, r->flat + t->nflat - 1);
            be->sync(be);
        } else {
            if (!had_batch)
                memset(r->flat, 0, (t->nflat - 1) * sizeof(float));
            r->flat[t->nflat - 1] = flag;
        }
        for (int i = 0; i < t->nplan; i++) {
            dchunk_t *c = &r->chunks[i];
            pw_sched_reset(&c->job);
            c->job.cls = PW_JOB_DENSE;
            c->job.ordered = true;
            c->job.prio = t->plan[i].job.prio;
            c->job.bytes = t->plan[i].n * sizeof(float);
            c->job.run = run_dense;
            c->r = r;
            c->off = t->plan[i].off;
            c->n = t->plan[i].n;
            pw_sched_submit(t->sched, &c->job);
        }
    }
    pw_sched_reset(&r->mark);
    r->mark.cls = PW_JOB_MARK;
    r->mark.ordered = true;
    r->mark.prio = PRIO_DENSE + t->nlayers;
    r->mark.bytes = sizeof(float);
    r->mark.run = run_mark;
    r->mark.ctx = r;
    pw_sched_submit(t->sched, &r->mark);
}

static void apply_dense(trainer_t *t) {
    for (int i = 0; i < t->nlayers; i++) {
        pw_opt_step(&t->opt[2 * i], t->layers[i].w, t->layers[i].dw);
        pw_opt_step(&t->opt[2 * i + 1], t->layers[i].b, t->layers[i].db);
    }
    t->step++;
}

/* Apply the rounds that are done, in order; first wait for those up to round `wait_upto`
 * (wait_all: every submitted one). The group's rounds step the dense optimizer with the mean
 * over the workers that had a batch; a round in which none had one sets *stop. A failed round
 * (a collective: a peer died) is returned: the caller re-forms the group. */
static int apply_rounds(trainer_t *t, int64_t wait_upto, bool wait_all, bool *stop) {
    while (t->applied < t->next_round) {
        round_t *r = round_of(t, t->applied);
        if (!wait_all && (int64_t)t->applied > wait_upto && !pw_sched_done(t->sched, &r->mark))
            break;
        int rc = pw_sched_wait(t->sched, &r->mark);
        for (int i = 0; t->grp && i < t->nplan; i++) {
            const int crc = pw_sched_wait(t->sched, &r->chunks[i].job);
            rc = rc ? rc : crc;
        }
        if (rc)
            return rc;
        if (t->grp) {
            pw_backend_t *be = t->be;
            const bool dev = dflat(t);
            void (*in)(pw_backend_t *, void *, const void *, size_t) = dev ? be->copy : be->upload;
            float active = 0;
            if (dev)
                be->download(be, &active, r->flat + t->nflat - 1, sizeof active);
            else
                active = r->flat[t->nflat - 1];
            if (active <= 0) {
                *stop = true;
                return 0;
            }
            if (dev) /* the mean over the active workers */
                be->scale(be, t->nflat - 1, 1.0f / active, r->flat);
            else
                for (size_t j = 0; j + 1 < t->nflat; j++)
                    r->flat[j] /= active;
            size_t k = 0;
            for (int i = 0; i < t->nlayers; i++) {
                pw_linear_t *l = &t->layers[i];
                const size_t nw = (size_t)l->in * l->out;
                in(be, l->dw, r->flat + k, nw * sizeof(float));
                in(be, l->db, r->flat + k + nw, (size_t)l->out * sizeof(float));
                k += nw + (size_t)l->out;
            }
            apply_dense(t);
        }
        if (r->has_pos) {
            t->done_pos = r->pos;
            t->pos_dirty = true;
        }
        t->applied++;
    }
    return 0;
}

/* A step count as two floats, exact below 2^48. */
static void u64_put(float *f, uint64_t v) {
    f[0] = (float)(v >> 24);
    f[1] = (float)(v & 0xffffff);
}

static uint64_t u64_get(const float *f) {
    return ((uint64_t)f[0] << 24) | (uint64_t)f[1];
}

/* n floats at device p into buf + *k (pack) or back; *k advances either way (buf NULL:
 * counting). */
static void move(pw_backend_t *be, float *buf, size_t *k, float *p, size_t n, bool pack) {
    if (buf && n && pack)
        be->download(be, buf + *k, p, n * sizeof(float));
    else if (buf && n)
        be->upload(be, p, buf + *k, n * sizeof(float));
    *k += n;
}

/* The dense state as floats (weights, biases, optimizer state, the step count): the count, and
 * with buf, packed into it (pack) or taken from it. */
static size_t dense_state(trainer_t *t, float *buf, bool pack) {
    size_t k = 0;
    for (int i = 0; i < t->nlayers; i++) {
        pw_linear_t *l = &t->layers[i];
        move(t->be, buf, &k, l->w, (size_t)l->in * l->out, pack);
        move(t->be, buf, &k, l->b, (size_t)l->out, pack);
    }
    for (int i = 0; i < 2 * t->nlayers; i++) {
        pw_opt_t *o = &t->opt[i];
        if (o->s1)
            move(t->be, buf, &k, o->s1, o->n, pack);
        if (o->s2)
            move(t->be, buf, &k, o->s2, o->n, pack);
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
    return rc == PC_ENOMEM || rc == PC_EDIM || rc == PC_EINVAL || rc == PC_EIO;
}

/* How long members wait for rank 0 calling every server (checkpoint, restore). */
static int servers_wait_ms(const pw_train_config_t *c) {
    int nservers = 1;
    for (const char *p = c->server_grpc; *p; p++)
        nservers += *p == ',';
    return c->timeout_ms * (nservers + 1);
}

/* The latest coordinated checkpoint of ckpt_dir: its manifest and dense state (*ck and *state
 * malloc'ed, NULL on errors), checked against this job's world. Errors are logged. */
static int latest_checkpoint(trainer_t *t, pw_jobckpt_t **ck, float **state) {
    const size_t n = dense_state(t, NULL, false);
    *ck = calloc(1, sizeof **ck);
    *state = malloc(n * sizeof **state);
    int rc = *ck && *state ? pw_jobckpt_read_latest(t->c->ckpt_dir, *ck, *state, n) : PC_ENOMEM;
    if (!rc && (*ck)->nranks != (size_t)t->c->world) {
        PC_ERROR("train: the checkpoint is of %zu workers, this job has %d", (*ck)->nranks,
                 t->c->world);
        rc = PC_EINVAL;
    }
    if (rc) {
        PC_ERROR("train: cannot read the checkpoint in %s: %s", t->c->ckpt_dir, pc_strerror(rc));
        free(*ck);
        free(*state);
        *ck = NULL;
        *state = NULL;
    }
    return rc;
}

/* Take a checkpoint's dense state (and step count) and this rank's position in it. */
static void take_checkpoint(trainer_t *t, const pw_jobckpt_t *ck, const float *state,
                            uint64_t *pos) {
    dense_state(t, (float *)state, false);
    *pos = ck->positions[t->c->rank];
    PC_WARN("train: rank %d goes on from the checkpoint after step %llu, line %llu of its data",
            t->c->rank, (unsigned long long)t->step, (unsigned long long)*pos);
}

/* In a group just formed: when any member saw a server connection lost (want_rollback), the
 * job rolls back to the latest coordinated checkpoint. Every member reads it first (when one
 * cannot, nothing changes: logged, training goes on); then the group's rank 0 has every server
 * restore its part (gRPC Restore) while the others wait, the members agree that every restore
 * worked, and each takes the checkpoint's dense state and position (t->reposition: the loop
 * reads from there again). A restore that failed part-way leaves the servers at different
 * points: PC_EIO, fatal (the job must be restarted from the checkpoint). Otherwise only
 * collective errors are returned. */
static int rollback_agree(trainer_t *t) {
    pw_coll_t *coll = pw_group_coll(t->grp);
    float want = t->want_rollback ? 1.0f : 0.0f;
    int rc = pw_coll_allreduce_sum(coll, &want, 1);
    if (rc || want == 0.0f)
        return rc;
    pw_jobckpt_t *ck = NULL;
    float *state = NULL;
    float failed = latest_checkpoint(t, &ck, &state) ? 1.0f : 0.0f;
    rc = pw_coll_allreduce_sum(coll, &failed, 1);
    if (!rc && failed > 0.0f)
        PC_ERROR("train: a worker cannot read the latest coordinated checkpoint: no rollback, "
                 "training goes on from here");
    if (!rc && failed == 0.0f) {
        const int restore_ms = 4 * t->c->timeout_ms; /* restores of large tables take long */
        int ck_rc = 0;
        if (pw_group_rank(t->grp) == 0) {
            const uint64_t t0 = pc_time_mono_ns();
            ck_rc = pw_jobckpt_restore_servers(t->c->server_grpc, restore_ms, ck);
            if (!ck_rc)
                PC_WARN("train: job rollback: %zu servers restored the checkpoint after step %llu "
                        "in %.2f s",
                        ck->nservers, (unsigned long long)ck->step, pc_time_sec_since(t0));
        }
        failed = ck_rc ? 1.0f : 0.0f;
        if (!(rc = pw_coll_barrier(coll, 4 * servers_wait_ms(t->c))))
            rc = pw_coll_allreduce_sum(coll, &failed, 1);
        if (!rc && failed > 0.0f) {
            PC_ERROR("train: the job rollback failed part-way (a server did not restore): the "
                     "servers may hold different checkpoints; restart the job from the latest "
                     "checkpoint (servers --restore-id, workers --resume=checkpoint)");
            rc = PC_EIO;
        } else if (!rc) {
            take_checkpoint(t, ck, state, &t->reposition_at);
            t->reposition = true;
            t->rollbacks++;
        }
    }
    if (!rc) {
        psc_stats_t st;
        psc_stats(t->ps, &st);
        t->seen_reconnects = st.reconnects;
        t->want_rollback = false;
    }
    free(ck);
    free(state);
    return rc;
}

/* The group's dense allreduce on the device (NCCL), formed anew for every generation under its
 * own rendezvous prefix at the coordinator (the unique id rank 0 hands out). */
static int dcoll_form(trainer_t *t) {
    if (!dflat(t))
        return 0;
    pw_backend_t *be = t->be;
    if (t->dcoll)
        be->dcoll->destroy(t->dcoll);
    t->dcoll = NULL;
    char prefix[320];
    pw_kv_t kv;
    pw_group_rendezvous(t->grp, "dcoll", &kv, prefix, sizeof prefix);
    int rc = be->dcoll->create(be, &kv, prefix, pw_group_rank(t->grp), pw_group_size(t->grp),
                               t->c->timeout_ms, &t->dcoll);
    if (rc)
        PC_WARN("train: the device allreduce of generation %llu did not form: %s",
                (unsigned long long)pw_group_gen(t->grp), pc_strerror(rc));
    return rc;
}

/* The agreement of a group just formed: its device allreduce, one dense state, then a rollback
 * if one is wanted. */
static int agree(trainer_t *t) {
    int rc = dcoll_form(t);
    if (!rc)
        rc = sync_state(t);
    return rc ? rc : rollback_agree(t);
}

/* A collective failed (a peer died) or a newer generation was proposed: re-form the group and
 * agree (agree); tried again while a member fails during the agreement. */
static int regroup(trainer_t *t) {
    int rc;
    do
        rc = pw_group_recover(t->grp);
    while (!rc && (rc = agree(t)) && !fatal(rc));
    return rc;
}

/* At start: agree with the group just joined (a restarted worker takes the dense state from a
 * live peer); a member failing meanwhile is handled as in regroup. */
static int regroup_initial(trainer_t *t) {
    int rc = agree(t);
    return rc && !fatal(rc) ? regroup(t) : rc;
}

/* Build the model: fields and dense values from the format (or the configuration). */
static int trainer_init(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    t->be = c->backend ? c->backend : pw_backend_cpu();
    if ((c->ckpt_every || c->resume_checkpoint) &&
        (!c->servers[0] || !c->coordinator[0] || !c->ckpt_dir[0] ||
         (c->ckpt_every && !c->server_grpc[0]))) {
        PC_ERROR("train: coordinated checkpoints need servers, a coordinator, a checkpoint "
                 "directory and (to write them) the servers' gRPC addresses");
        return PC_EINVAL;
    }
    if (c->rollback_on_server_loss && !c->ckpt_every) {
        PC_ERROR("train: rolling back on a server loss needs coordinated checkpoints "
                 "(--ckpt-every, --ckpt-dir, --server-grpc)");
        return PC_EINVAL;
    }
    pw_backend_t *be = t->be;
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
        if ((rc = pw_linear_init(&t->lin, be, t->ndense, 1, c->seed)))
            return rc;
        be->zero(be, t->lin.w, (size_t)t->ndense * sizeof(float)); /* the linear part starts at 0 */
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
        rc = pw_opt_init(&t->opt[2 * i], be, &c->dense_opt,
                         (size_t)t->layers[i].in * t->layers[i].out);
        if (!rc)
            rc = pw_opt_init(&t->opt[2 * i + 1], be, &c->dense_opt, (size_t)t->layers[i].out);
    }
    for (int i = 0; i < t->nlayers; i++)
        t->nflat += (size_t)t->layers[i].in * t->layers[i].out + (size_t)t->layers[i].out;
    t->nflat++; /* the has-batch flag */
    if (!rc && c->load_dense[0] && (rc = pw_dense_load(c->load_dense, t->layers, t->nlayers)))
        PC_ERROR("train: cannot load the dense model %s: %s", c->load_dense, pc_strerror(rc));
    const size_t b = (size_t)c->batch, pooled = b * (size_t)(t->nf > 0 ? t->nf : 1) * c->dim;
    const size_t fl = sizeof(float);
    t->pooled = be->alloc(be, pooled * fl);
    t->dpooled = be->alloc(be, pooled * fl);
    t->dense1 = be->alloc(be, b * fl);
    t->logits = be->alloc(be, b * fl);
    t->dlogits = be->alloc(be, b * fl);
    t->probs = be->alloc(be, b * fl);
    t->dloss = be->alloc(be, fl);
    t->hloss = be->host_alloc(be, fl);
    if (!rc && !(t->pooled && t->dpooled && t->dense1 && t->logits && t->dlogits && t->probs &&
                 t->dloss && t->hloss))
        rc = PC_ENOMEM;
    if (!rc)
        be->fill(be, b, 1.0f, t->dense1);
    return rc ? rc : pipeline_init(t);
}

/* Row buffers for nk features (their contents are not kept). */
static int reserve_rows(trainer_t *t, size_t nk) {
    if (nk <= t->cap)
        return 0;
    pw_backend_t *be = t->be;
    const size_t cap = nk + nk / 2, bytes = cap * (size_t)t->dim * sizeof(float);
    be->free(be, t->rows);
    be->free(be, t->grads);
    be->host_free(be, t->hrows);
    t->rows = be->alloc(be, bytes);
    t->grads = be->alloc(be, bytes);
    /* evaluation looks rows up on the host: into the rows themselves with host memory */
    t->hrows = be->host_memory ? NULL : be->host_alloc(be, bytes);
    if (!t->rows || !t->grads || (!be->host_memory && !t->hrows))
        return t->cap = 0, PC_ENOMEM;
    t->cap = cap;
    return 0;
}

/* Device buffer d holding at least bytes (contents not kept). */
static void *dbuf_reserve(trainer_t *t, dbuf_t *d, size_t bytes) {
    if (bytes > d->cap || !d->p) {
        t->be->free(t->be, d->p);
        d->cap = bytes + bytes / 2 + 64;
        if (!(d->p = t->be->alloc(t->be, d->cap)))
            d->cap = 0;
    }
    return d->p;
}

/* host (bytes) as the backend sees it: itself on a host-memory backend, else uploaded into
 * device buffer d (asynchronously: visible to the functions called after). NULL: no memory. */
static const void *stage(trainer_t *t, dbuf_t *d, const void *host, size_t bytes) {
    if (t->be->host_memory)
        return host;
    void *p = dbuf_reserve(t, d, bytes);
    if (p && bytes)
        t->be->upload_async(t->be, p, host, bytes);
    return p;
}

/* The batch's inputs on the backend, in buffer set `set`. PC_ENOMEM. */
static int stage_batch(trainer_t *t, int set, const pw_batch_t *b, dview_t *v) {
    dbuf_t *d = t->dev[set];
    const size_t n = b->n, nk = b->key_off[n];
    v->n = (int)n;
    v->nk = nk;
    v->labels = stage(t, &d[DB_LABELS], b->labels, n * sizeof(float));
    v->dense =
        t->ones ? t->dense1 : stage(t, &d[DB_DENSE], b->dense, n * b->ndense * sizeof(float));
    v->key_off = stage(t, &d[DB_KEY_OFF], b->key_off, (n + 1) * sizeof(size_t));
    v->fields = stage(t, &d[DB_FIELDS], b->fields, nk * sizeof(uint16_t));
    v->vals = stage(t, &d[DB_VALS], b->vals, nk * sizeof(float));
    return v->labels && v->dense && v->key_off && v->fields && v->vals ? 0 : PC_ENOMEM;
}

/* A pulled slot's inputs and rows onto the backend, in the buffer set of its round's parity
 * (the other set may still be read by the step computing). */
static int slot_stage(trainer_t *t, slot_t *s) {
    const int set = (int)(s->round & 1);
    const size_t nk = s->b.key_off[s->b.n];
    int rc = stage_batch(t, set, &s->b, &s->dv);
    if (rc)
        return rc;
    s->dv.inv = stage(t, &t->dev[set][DB_INV], s->inv, nk * sizeof(uint32_t));
    s->dv.urows =
        stage(t, &t->dev[set][DB_UROWS], s->urows, s->nu * (size_t)t->dim * sizeof(float));
    if (!s->dv.inv || !s->dv.urows)
        return PC_ENOMEM;
    s->staged = true;
    return 0;
}

/* A failed device (sticky): logged, PC_EIO. */
static int device_check(trainer_t *t) {
    char msg[256];
    int rc = t->be->error(t->be, msg, sizeof msg);
    if (rc)
        PC_ERROR("train: the %s backend failed: %s", t->be->name, msg);
    return rc;
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

/* One batch (v, on the backend) whose rows are in t->rows (a row per feature): forward, and when
 * training backward (dense gradients in the layers, a row gradient per feature in t->grads).
 * The loss goes to t->dloss, the probabilities to t->probs (device memory). */
static int trainer_compute(trainer_t *t, const dview_t *v, bool train) {
    pw_backend_t *be = t->be;
    const int n = v->n, nf = t->nf, d = t->dim;
    int rc = 0;
    const bool mean = t->c->mean_pooling;
    switch (t->kind) {
        case M_LR: /* an FM without factors */
        case M_FM:
            pw_linear_forward(&t->lin, n, v->dense, t->logits);
            be->fm(be, n, v->key_off, v->vals, d - 1, t->rows, t->logits);
            break;
        case M_DEEPFM:
            rc = pw_deepfm_forward(t->deepfm, n, v->dense, v->key_off, v->fields, v->vals, t->rows,
                                   t->logits);
            break;
        case M_DLRM:
            be->pool(be, n, v->key_off, v->fields, v->vals, nf, d, t->rows, d, mean, t->pooled);
            rc = pw_dlrm_forward(t->dlrm, n, v->dense, t->pooled, t->logits);
            break;
    }
    if (rc)
        return rc;
    be->bce(be, n, t->logits, v->labels, t->probs, t->dlogits, t->dloss);
    if (!train)
        return 0;
    for (int i = 0; i < t->nlayers; i++)
        pw_linear_zero_grad(&t->layers[i]);
    switch (t->kind) {
        case M_LR:
        case M_FM:
            pw_linear_backward(&t->lin, n, v->dense, t->dlogits, NULL);
            be->fm_grad(be, n, v->key_off, v->vals, d - 1, t->rows, t->dlogits, t->grads);
            break;
        case M_DEEPFM:
            rc = pw_deepfm_backward(t->deepfm, t->dlogits, t->grads);
            break;
        case M_DLRM:
            if ((rc = pw_dlrm_backward(t->dlrm, t->dlogits, t->dpooled)))
                break;
            be->zero(be, t->grads, v->nk * (size_t)d * sizeof(float));
            be->pool_grad(be, n, v->key_off, v->fields, v->vals, nf, d, t->dpooled, d, mean,
                          t->grads);
            break;
    }
    return rc;
}

/* A training step on slot s's batch (staged): a row per feature gathered from the unique rows,
 * forward and backward, and the unique rows' gradients (summed over their features, scaled by
 * 1 / workers) back in s->ugrads; *loss gets the batch's loss. While the backend computes, the
 * next slot's inputs are uploaded when its pull is done, and without a group the dense optimizer
 * steps while the gradients come back. */
static int step_compute(trainer_t *t, slot_t *s, slot_t *next, double *loss) {
    pw_backend_t *be = t->be;
    const dview_t *v = &s->dv;
    const size_t d = (size_t)t->dim, ub = s->nu * d * sizeof(float);
    /* one device buffer: this step's download of it is done (copy_wait) before the next step */
    float *ugrads = be->host_memory ? s->ugrads : dbuf_reserve(t, &t->dev[0][DB_UGRADS], ub);
    int rc = reserve_rows(t, v->nk);
    if (rc || !ugrads)
        return rc ? rc : PC_ENOMEM;
    be->gather_rows(be, v->nk, v->inv, v->urows, (int)d, t->rows);
    if ((rc = trainer_compute(t, v, true)))
        return rc;
    const float scale = t->grp ? 1.0f / (float)pw_group_size(t->grp) : 1.0f;
    be->zero(be, ugrads, ub);
    be->scatter_add_rows(be, v->nk, v->inv, t->grads, (int)d, scale, ugrads);
    if (next && !next->staged && pw_sched_done(t->sched, &next->pull) &&
        pw_sched_wait(t->sched, &next->pull) == 0 && (rc = slot_stage(t, next)))
        return rc;
    if (!be->host_memory)
        be->download_async(be, s->ugrads, ugrads, ub);
    be->download_async(be, t->hloss, t->dloss, sizeof(float));
    if (!t->grp)
        apply_dense(t);
    be->copy_wait(be);
    *loss = *t->hloss;
    return device_check(t);
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
        dview_t v;
        const size_t nk = b->key_off[b->n];
        if ((rc = check_batch(t, b)) || (rc = reserve_rows(t, nk)) ||
            (rc = emb_lookup(t, b->keys, nk, t->be->host_memory ? t->rows : t->hrows)))
            break;
        if (!t->be->host_memory)
            t->be->upload(t->be, t->rows, t->hrows, nk * (size_t)t->dim * sizeof(float));
        if ((rc = stage_batch(t, DB_SETS - 1, b, &v)) || (rc = trainer_compute(t, &v, false)))
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
        t->be->download(t->be, p + n, t->probs, b->n * sizeof *p);
        if ((rc = device_check(t)))
            break;
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
    const int wait_ms = servers_wait_ms(c);
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
    pw_jobckpt_t *ck;
    float *state;
    int rc = latest_checkpoint(t, &ck, &state);
    if (!rc)
        take_checkpoint(t, ck, state, skip);
    free(ck);
    free(state);
    return rc;
}

/* Record this worker's position (after its last applied step) at the coordinator when it
 * changed. A failed save: training goes on (the group's connections are peer to peer), the next
 * try a second later (force: now); a restart would resume from an older position, and no
 * checkpoint is taken meanwhile. */
static void save_position(trainer_t *t, bool force) {
    if (t->grp)
        pw_group_progress(t->grp, t->step);
    if (!t->grp || (!t->pos_dirty && t->pos_saved) ||
        (!force && pc_time_mono_ns() < t->pos_retry_ns))
        return;
    int rc = pw_group_offset_save(t->grp, t->step, t->done_pos);
    if (rc && t->pos_saved)
        PC_WARN("train: cannot record this worker's position at the coordinator: %s",
                pc_strerror(rc));
    t->pos_saved = rc == 0;
    t->pos_dirty = rc != 0;
    t->pos_retry_ns = rc ? pc_time_mono_ns() + 1000000000ull : 0;
}

/* With rollback_on_server_loss: whether this worker wants a job rollback: a connection to a
 * server was lost since the last look (the client reconnected: the server may have restarted
 * from an older checkpoint of its own), or an earlier want is still pending. */
static bool server_lost(trainer_t *t) {
    if (!t->grp || !t->c->rollback_on_server_loss)
        return false;
    if (t->want_rollback)
        return true;
    psc_stats_t st;
    psc_stats(t->ps, &st);
    if (st.reconnects == t->seen_reconnects)
        return false;
    t->seen_reconnects = st.reconnects;
    t->want_rollback = true;
    PC_WARN("train: a server connection was lost: rolling the job back to its latest coordinated "
            "checkpoint");
    return true;
}

/* A collective failed (a peer died) or a newer generation was proposed: stop the ordered lane
 * (its collectives cannot complete; pulls gated on its rounds fail with it), let the server
 * calls finish, re-form the group and agree on the dense state (regroup). The rounds in flight
 * are dropped: their pushes were sent (applied once), their dense gradients are lost, their
 * batches count as read. The batches read but not computed are renumbered from the agreed step
 * and pulled again (after a job rollback: dropped, the reader starts again from the
 * checkpoint's position). */
static int pipeline_regroup(trainer_t *t) {
    pw_sched_abort_ordered(t->sched, PC_ECANCELED);
    for (uint64_t id = t->applied; id < t->next_round; id++) { /* the rounds not applied */
        const round_t *r = round_of(t, id);
        if (r->has_pos) {
            t->done_pos = r->pos;
            t->pos_dirty = true;
        }
    }
    atomic_store(&t->coll_broken, false);
    int rc = regroup(t);
    if (rc)
        return rc;
    t->next_round = t->applied = t->step;
    if (t->reposition) /* rolled back: the batches read ahead are read again later */
        t->filled = 0;
    for (int i = 0; i < t->filled; i++) {
        slot_t *s = &t->slots[(t->head + i) % t->nslots];
        s->round = t->step + (uint64_t)i;
        slot_pull(t, s);
    }
    return 0;
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
    t.done_pos = skip;
    if (t.ps) { /* reconnects from here on are losses (connecting to late servers is not) */
        psc_stats_t st;
        psc_stats(t.ps, &st);
        t.seen_reconnects = st.reconnects;
    }
    const uint64_t total_bytes = stream_bytes(train, ntrain, c->epochs);
    double ema = NAN;
    uint64_t next_progress = c->progress_every, next_eval = c->eval_every, last_ckpt = t.step;
    bool more = true, stop = false;
    res->first_step_s = NAN;
    t.next_round = t.applied = t.step;
    while (!rc && !stop) {
        if (t.reposition) { /* a job rollback: read again from the checkpoint's position */
            pw_reader_close(r);
            r = NULL;
            if ((rc = open_reader(c, fmt, train, ntrain, c->epochs, true, t.reposition_at, &r)))
                break;
            t.reposition = false;
            more = true;
            t.done_pos = t.reposition_at;
            t.pos_dirty = true;
            last_ckpt = t.step; /* the checkpoint it rolled back to */
        }
        /* Read and pull ahead: slots for steps next_round .. next_round + ahead. A slot is
         * refilled once its pushes are done (sync, ssp: the ring is long enough that they are:
         * its round was done before the step now computing began). */
        while (more && t.filled <= t.ahead) {
            slot_t *s = &t.slots[(t.head + t.filled) % t.nslots];
            for (size_t i = 0; i < s->npush && !rc; i++) /* async: pushes not awaited before */
                rc = pw_sched_wait(t.sched, &s->push[i].job);
            if (rc)
                break;
            s->npush = 0;
            const pw_batch_t *b =
                c->max_samples &&
                        res->samples + (uint64_t)t.filled * (uint64_t)c->batch >= c->max_samples
                    ? NULL
                    : pw_reader_next(r);
            if (!b) {
                more = false;
                break;
            }
            if ((rc = check_batch(&t, b)) || (rc = slot_fill(&t, s, b)))
                break;
            s->round = t.next_round + (uint64_t)t.filled++;
            s->pos = pw_reader_consumed(r);
            slot_pull(&t, s);
        }
        if (rc)
            break;
        if (t.grp && pw_group_stale(t.grp)) {
            if ((rc = pipeline_regroup(&t)))
                break;
            continue;
        }
        slot_t *s = &t.slots[t.head];
        if (!t.filled) { /* no batch: the others may have some; stop when no worker has */
            if ((rc = apply_rounds(&t, 0, true, &stop)) || stop || !t.grp) {
                if (rc && t.grp)
                    rc = pipeline_regroup(&t);
                if (!rc && !stop && !t.grp)
                    stop = true;
                continue;
            }
            log_step(&t, t.next_round, "start");
            round_submit(&t, NULL, false);
            if ((rc = apply_rounds(&t, 0, true, &stop)) && t.grp)
                rc = pipeline_regroup(&t);
            continue;
        }
        /* The staleness gate: round next_round - stale - 1 done (its pull waited for it too);
         * a failed round means a peer died: re-form the group. */
        const uint64_t cur = t.next_round;
        if ((rc = apply_rounds(&t, (int64_t)cur - t.stale - 1, false, &stop))) {
            if (t.grp && !(rc = pipeline_regroup(&t)))
                continue;
            break;
        }
        if (t.grp && c->ckpt_every && cur % c->ckpt_every == 0 && cur != last_ckpt) {
            /* a consistent cut: every round before cur applied, every push acknowledged */
            last_ckpt = cur;
            if (!(rc = apply_rounds(&t, 0, true, &stop)))
                save_position(&t, true);
            if (rc || (rc = job_checkpoint(&t))) {
                if (!(rc = pipeline_regroup(&t)))
                    continue;
                break;
            }
        }
        if ((rc = slot_rows(&t, s)))
            break;
        if (server_lost(&t)) {                   /* the servers answer again: roll the job back */
            if ((rc = pw_group_reform(t.grp))) { /* the coordinator: tried again next step */
                PC_WARN("train: cannot propose the rollback's generation: %s", pc_strerror(rc));
                rc = 0;
            } else {
                if ((rc = pipeline_regroup(&t)))
                    break;
                continue;
            }
        }
        if (cur - t.applied > t.max_ahead)
            t.max_ahead = cur - t.applied;
        log_step(&t, cur, "start");
        const pw_batch_t *b = &s->b;
        slot_t *next = t.filled > 1 ? &t.slots[(t.head + 1) % t.nslots] : NULL;
        double loss;
        if ((!s->staged && (rc = slot_stage(&t, s))) || (rc = step_compute(&t, s, next, &loss)) ||
            (rc = slot_push(&t, s)))
            break;
        round_submit(&t, s, true);
        t.head = (t.head + 1) % t.nslots;
        t.filled--;
        if (isnan(res->first_step_s))
            res->first_step_s = pc_time_sec_since(t0);
        save_position(&t, false);
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
    }
    pw_sched_drain(t.sched);
    if (!rc)
        save_position(&t, true);
    pw_sched_stats_t st;
    pw_sched_stats(t.sched, &st);
    res->pulled_bytes = st.bytes[PW_JOB_PULL];
    res->pushed_bytes = st.bytes[PW_JOB_PUSH];
    res->dense_bytes = st.bytes[PW_JOB_DENSE];
    res->max_ahead = t.max_ahead;
    res->pull_wait_s = t.pull_wait_s;
    if (!rc)
        rc = pw_reader_error(r);
    pw_reader_close(r);
    res->steps = t.step;
    res->lost_pushes = atomic_load(&t.lost_pushes);
    res->rollbacks = t.rollbacks;
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
