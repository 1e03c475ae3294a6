/* pw_pipeline.c: the trainer's pipeline: pulls ahead, chunked pushes and dense rounds, every one
 * a scheduler job (pw_sched.h), in priority order: pulls first, then the dense allreduce chunks
 * (the layers the next forward needs first), then pushes.
 *
 * DESIGN (the rings: pw_train_int.h)
 * - Sizes: stale = the rounds a step may run ahead (sync 0, ssp S, async the window), ahead =
 *   batches pulled ahead (at most stale). A slot is refilled only once its round is done:
 *   stale + ahead + 2 slots never wait for that. A synchronous store (local: its calls run on the
 *   scheduler's dispatch thread, beside the trainer's compute) keeps stale 0.
 * - Gates: the pull of step t waits for round t - stale - 1 (its marker: every worker's pushes of
 *   that step applied, in sync); the marker of a round waits for its slot's pushes (not async).
 * - A lone worker in sync (`split`: no group, pull_ahead >= 1, a store whose calls on disjoint
 *   keys commute: pw_emb.h order_free) reads one batch ahead and splits
 *   each batch's unique keys against the batch before (pw_unique sets, one per slot): step t + 1's
 *   keys that step t does not have (first in its ukeys) are pulled after round t - 1's marker,
 *   while step t computes; the rest (pull2) once step t's first push, of exactly those keys
 *   (pkeys[0, push_first), gathered with their gradients), was applied. Step t's other pushes
 *   then run while step t + 1 computes, and step t + 2's first pull waits for all of them (round
 *   t's marker). Every row is read after every push before it and before every push after it,
 *   as in the serial order: the model is the same to the last bit (test_train). Rows stored in
 *   16 bits round with seeds that follow the push calls, which the split cuts otherwise: the
 *   same model up to those roundings, and reproducible (pushes run in submission order).
 * - Push order rank (sync): turn k of a round is an allreduce of one float that rank k enters
 *   once its pushes were answered and every other rank at once; rank k + 1's pushes wait for
 *   turn k. A row then sees the workers' gradients of a step in rank order, so a job's model
 *   depends on its data only (Adagrad and Adam are not linear in the order of updates). Every
 *   rank enters every turn, whatever its pushes did: a failed push never stalls the others. A
 *   worker submits its own turn after its pushes (pw_sched_wait does not wait for a job not
 *   submitted yet) and the lower ranks' turns before them (they gate the pushes).
 * - Failures: a pull or lookup that finds a server down is tried again every 200 ms for up to
 *   server_retry_ms; a push cut short by a server failure is not sent again (lost_pushes); a
 *   failed collective marks the group broken (coll_broken), the rest of the ordered lane fails at
 *   once, and the loop re-forms the group (pw_recover.c).
 * - Threads: run_* functions run on the scheduler's threads (the ordered lane's, or the dispatch
 *   thread that starts store calls); they touch only their job's slot or round and the atomics.
 */
#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_train_int.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PRIO_PULL = 0, PRIO_DENSE = 1, PRIO_PUSH = 1 << 20 };

/* The round's sum: where its collectives add (see round_t). */
static float *round_sum(round_t *r) {
    return r->dev ? r->dflat : r->hflat;
}

static bool transient(int rc) {
    return rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT;
}

/* ---- reads that wait for servers ---- */

const char *pw__store_why(trainer_t *t, int rc, char *buf, size_t cap) {
    buf[0] = '\0';
    if (t->emb->ops->error)
        t->emb->ops->error(t->emb, buf, cap);
    if (!buf[0])
        snprintf(buf, cap, "%s", pc_strerror(rc));
    return buf;
}

bool pw__server_retry(trainer_t *t, int rc, uint64_t t0) {
    const int rank = (int)t->c->rank;
    char why[1024];
    if (!transient(rc) || pc_time_sec_since(t0) * 1000 > t->c->server_retry_ms) {
        if (!rc && t->waiting_servers) {
            PC_WARN("train: rank %d: the servers answer again", rank);
            if (t->grp)
                pw_group_note(t->grp, NULL);
        } else if (transient(rc)) {
            PC_ERROR("train: rank %d: giving up after waiting %lld ms for the servers: %s", rank,
                     (long long)t->c->server_retry_ms, pw__store_why(t, rc, why, sizeof why));
        }
        t->waiting_servers = t->waiting_servers && rc;
        return false;
    }
    if (!t->waiting_servers) {
        pw__store_why(t, rc, why, sizeof why);
        PC_WARN("train: rank %d: servers unavailable: %s; waiting up to %lld ms", rank, why,
                (long long)t->c->server_retry_ms);
        if (t->grp) { /* peers that miss this worker in a recovery say why */
            char note[sizeof why + 64], at[32];
            const time_t now = time(NULL);
            struct tm tm;
            strftime(at, sizeof at, "%H:%M:%S", localtime_r(&now, &tm));
            snprintf(note, sizeof note, "waiting since %s for the servers: %s", at, why);
            pw_group_note(t->grp, note);
        }
    }
    t->waiting_servers = true;
    pc_time_sleep_ms(200);
    return true;
}

int pw__lookup(trainer_t *t, const uint64_t *keys, size_t n, float *rows) {
    const uint64_t t0 = pc_time_mono_ns();
    int rc;
    do
        rc = t->emb->ops->lookup(t->emb, keys, n, rows);
    while (pw__server_retry(t, rc, t0));
    char why[1024];
    if (rc && !transient(rc))
        PC_ERROR("train: rank %d: a lookup failed: %s", (int)t->c->rank,
                 pw__store_why(t, rc, why, sizeof why));
    return rc;
}

/* ---- jobs ---- */

static void job_done(void *ctx, int rc) {
    pw_sched_complete(ctx, rc);
}

static int run_pull(pw_job_t *j) {
    slot_t *s = j->ctx;
    pw_emb_t *e = s->t->emb;
    const size_t off = j == &s->pull ? 0 : s->npull, n = j == &s->pull ? s->npull : s->nu - off;
    return e->ops->pull_async(e, s->ukeys + off, n, s->urows + off * (size_t)e->dim, job_done, j);
}

/* A push that a server failure cut short is not sent again: the servers that answered applied
 * their part; a restarted server lost it anyway (and all since its checkpoint). */
static void push_done(void *ctx, int rc) {
    pchunk_t *p = ctx;
    trainer_t *t = p->s->t;
    char why[1024];
    if (rc == PC_EFENCED) { /* this worker was left behind: it re-forms (or learns it is out) */
        if (p->epoch == atomic_load(&t->epoch) && !atomic_exchange(&t->fenced, true))
            PC_WARN("train: rank %d: a push was refused: %s; re-forming the group", (int)t->c->rank,
                    pw__store_why(t, rc, why, sizeof why));
        atomic_fetch_add(&t->lost_pushes, 1);
        rc = 0;
    } else if (transient(rc)) {
        PC_WARN("train: rank %d: a push failed (%s); its part on the failed server is lost",
                (int)t->c->rank, pw__store_why(t, rc, why, sizeof why));
        atomic_fetch_add(&t->lost_pushes, 1);
        if (rc == PC_EUNAVAIL) /* the connection lost (a timeout may be a slow server) */
            atomic_fetch_add(&t->server_push_fails, 1);
        rc = 0;
    } else if (rc) {
        PC_ERROR("train: rank %d: a push failed: %s", (int)t->c->rank,
                 pw__store_why(t, rc, why, sizeof why));
        int none = 0; /* the job stops (run_mark tells the others), whatever the round does */
        atomic_compare_exchange_strong(&t->push_refused, &none, rc);
    }
    pw_sched_complete(&p->job, rc);
}

static int run_push(pw_job_t *j) {
    pchunk_t *p = (pchunk_t *)j;
    pw_emb_t *e = p->s->t->emb;
    p->sent = true;
    p->epoch = atomic_load(&p->s->t->epoch); /* (a refusal of an older one: a dropped round's) */
    const int rc = e->ops->push_async(e, p->keys, p->n, p->grads, push_done, p);
    if (rc) /* refused before it went out: the same account as one that failed (a refusal stops
             * the job through push_refused, which the marks tell the others) */
        push_done(p, rc);
    return 0;
}

/* A collective of the ordered lane, on the devices (dev: buf is device memory, the round's
 * generation formed t->dcoll; the rounds of a generation are dropped with it) or the host; after
 * one failed, the group is broken: the rest fail at once (until the group is re-formed). */
static int coll_sum(trainer_t *t, float *buf, size_t n, bool dev) {
    if (atomic_load(&t->coll_broken))
        return PC_ECANCELED;
    int rc = dev ? t->be->dcoll->allreduce_sum(t->dcoll, buf, n)
                 : pw_coll_allreduce_sum(pw_group_coll(t->grp), buf, n);
    if (rc)
        atomic_store(&t->coll_broken, true);
    else if (dev) /* this generation's device allreduce works (pw_recover.c's dcoll_form) */
        atomic_store(&t->dcoll_worked, true);
    return rc;
}

static int run_dense(pw_job_t *j) {
    dchunk_t *c = (dchunk_t *)j;
    return coll_sum(c->r->t, round_sum(c->r) + c->off, c->n, c->r->dev);
}

void pw__log_step(trainer_t *t, uint64_t round, const char *what) {
    if (t->step_log)
        fprintf(t->step_log, "%d %" PRIu64 " %s %" PRIu64 "\n", (int)t->c->rank, round, what,
                pc_time_mono_ns());
}

/* Wait until round r's pushes (its slot's; none in async) are answered: the first error. */
static int round_pushes_wait(trainer_t *t, round_t *r) {
    int rc = 0;
    for (size_t i = 0; r->slot && i < r->slot->npush; i++) {
        const int prc = pw_sched_wait(t->sched, &r->slot->push[i].job);
        rc = rc ? rc : prc;
    }
    return rc;
}

static int run_turn(pw_job_t *j) {
    round_t *r = j->ctx;
    trainer_t *t = r->t;
    if (j - r->turns == r->me)         /* this worker's turn: its pushes answered first */
        (void)round_pushes_wait(t, r); /* the marker reports their errors */
    return coll_sum(t, round_sum(r) + t->nflat, 1, r->dev);
}

/* What a member whose pushes failed adds to the mark's flag (the sum of the members with a
 * batch, at most 4096, the largest --world: strictly below it): every member learns it from the
 * sum, at least this with any failure (however rounded). */
#define PUSH_FAILED 8192.0f

/* The round's end: its pushes answered, then (a group) the sum of the flag, which every member
 * enters, so that one whose pushes failed does not leave the others waiting in it (they would
 * time out, or meet the next round's collective): the sum tells every member, and each ends the
 * round with an error and stops (push_refused: no regroup). Such a failure is not a server
 * restart (push_done counts those and goes on): a refusal (a body over the server's
 * --max-body-bytes, a dropped table, a server out of memory) that a new group would meet again
 * every round, each time with a round's rows half updated. */
static int run_mark(pw_job_t *j) {
    round_t *r = j->ctx;
    trainer_t *t = r->t;
    const int prc = round_pushes_wait(t, r);
    pw__log_step(t, r->id, "end");
    if (!t->grp)
        return prc;
    /* (async: the round waits for no push; one of an earlier round that failed is told here) */
    const int own = prc ? prc : atomic_load(&t->push_refused);
    if (own)
        r->flag += PUSH_FAILED;
    int rc = coll_sum(t, &r->flag, 1, false);
    if (!rc && r->flag >= PUSH_FAILED) {
        rc = own ? own : PC_EIO;
        if (!own)
            PC_ERROR("train: round %llu: another worker's pushes failed, not for a server "
                     "restart (its log says why): the job stops",
                     (unsigned long long)r->id);
        int none = 0; /* (this worker's own failure was recorded by push_done) */
        atomic_compare_exchange_strong(&t->push_refused, &none, rc);
    }
    return rc;
}

/* ---- set-up ---- */

int pw__pipeline_init(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    const pw_linear_t *layers = t->model->params;
    const int nlayers = t->model->nparams;
    if (t->emb->ops->synchronous)
        t->staleness = 0; /* one store thread: the local model is sync's, whatever the mode */
    t->stale = t->staleness == PW_ASYNC ? (int)c->async_window : t->staleness;
    t->ahead = c->pull_ahead < t->stale ? (int)c->pull_ahead : t->stale;
    if (t->ahead < 0)
        t->ahead = 0;
    t->split = !t->grp && t->stale == 0 && c->pull_ahead >= 1 && t->emb->ops->order_free &&
               t->emb->ops->order_free(t->emb);
    if (t->split)
        t->ahead = 1;
    /* split: round t - 1 may be unapplied while step t + 1 is read (one slot and round more) */
    t->nslots = t->stale + t->ahead + 2 + t->split;
    t->nrounds = t->stale + 2 + t->split;
    t->slots = pc_scalloc(PC_MEM_BATCH, (size_t)t->nslots, sizeof *t->slots);
    t->rounds = pc_scalloc(PC_MEM_BATCH, (size_t)t->nrounds, sizeof *t->rounds);
    const size_t cf = ((size_t)c->chunk_kib << 10) / sizeof(float);
    size_t nplan = 0;
    for (int i = 0; i < nlayers; i++) {
        const size_t n = (size_t)layers[i].in * layers[i].out + (size_t)layers[i].out;
        nplan += (n + cf - 1) / cf;
        t->nflat += n;
    }
    t->plan = pc_scalloc(PC_MEM_BATCH, nplan ? nplan : 1, sizeof *t->plan);
    if (!t->slots || !t->rounds || !t->plan)
        return PC_ENOMEM;
    size_t k = 0;
    for (int i = 0; i < nlayers; i++) {
        const size_t n = (size_t)layers[i].in * layers[i].out + (size_t)layers[i].out;
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
        const size_t nf = t->nflat + 1; /* the turns' float */
        r->hflat = pc_scalloc(PC_MEM_BATCH, nf, sizeof(float));
        if (t->be->dcoll && (r->dflat = t->be->alloc(t->be, nf * sizeof(float))))
            t->be->zero(t->be, r->dflat, nf * sizeof(float)); /* the turns sum it: defined */
        r->chunks = pc_scalloc(PC_MEM_BATCH, (size_t)t->nplan, sizeof *r->chunks);
        if (c->push_order == PW_PUSH_RANK && c->world > 1 &&
            !(r->turns = pc_scalloc(PC_MEM_BATCH, (size_t)c->world - 1, sizeof *r->turns)))
            return PC_ENOMEM;
        if (!r->hflat || (t->be->dcoll && !r->dflat) || !r->chunks)
            return PC_ENOMEM;
    }
    if (c->step_log[0] && !(t->step_log = fopen(c->step_log, "a"))) {
        PC_ERROR("train: cannot open the step log %s", c->step_log);
        return PC_EIO;
    }
    if (t->step_log)
        setvbuf(t->step_log, NULL, _IOLBF, 0);
    pw_sched_opts_t so = {.credit_bytes = (size_t)c->credit_kib << 10,
                          .fifo = c->order == PW_ORDER_FIFO};
    return pw_sched_create(&so, &t->sched);
}

static void slot_free(pw_backend_t *be, slot_t *s) {
    void *const host[] = {s->b.labels, s->b.dense, s->b.fields, s->b.vals, s->b.key_off,
                          s->ukeys,    s->inv,     s->perm,     s->pkeys,  s->in_next,
                          s->urows,    s->ugrads,  s->pgrads};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        be->host_free(be, host[i]);
    pw_unique_free(&s->set);
    pc_sfree(s->push);
}

void pw__pipeline_free(trainer_t *t) {
    pw_backend_t *be = t->be;
    pw_sched_destroy(t->sched); /* first: its jobs use the slots, rounds and store */
    for (int i = 0; t->slots && i < t->nslots; i++)
        slot_free(be, &t->slots[i]);
    pc_sfree(t->slots);
    for (int i = 0; t->rounds && i < t->nrounds; i++) {
        be->free(be, t->rounds[i].dflat);
        pc_sfree(t->rounds[i].hflat);
        pc_sfree(t->rounds[i].chunks);
        pc_sfree(t->rounds[i].turns);
    }
    pc_sfree(t->rounds);
    pc_sfree(t->plan);
    if (t->step_log)
        fclose(t->step_log);
}

/* ---- slots ---- */

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
        void *q = be ? be->host_alloc(be, c * es[i]) : pc_srealloc(PC_MEM_BATCH, *p[i], c * es[i]);
        if (!q)
            return PC_ENOMEM;
        if (be)
            be->host_free(be, *p[i]);
        *p[i] = q;
    }
    *cap = c;
    return 0;
}

int pw__slot_fill(trainer_t *t, slot_t *s, const pw_batch_t *b) {
    const size_t n = b->n, nk = b->key_off[n], nd = b->ndense;
    assert(b->ukeys); /* the training stream's reader dedups (open_reader) */
    void **const per_sample[] = {(void **)&s->b.labels, (void **)&s->b.key_off};
    const size_t ps_size[] = {sizeof(float), sizeof(size_t)};
    /* not the features' keys: the step reads their unique keys' rows through inv */
    void **const per_key[] = {(void **)&s->b.fields, (void **)&s->b.vals, (void **)&s->inv,
                              (void **)&s->ukeys,    (void **)&s->perm,   (void **)&s->pkeys,
                              (void **)&s->in_next};
    const size_t pk_size[] = {sizeof(uint16_t), sizeof(float),    sizeof(uint32_t),
                              sizeof(uint64_t), sizeof(uint32_t), sizeof(uint64_t),
                              sizeof(uint8_t)};
    void **const dense[] = {(void **)&s->b.dense};
    const size_t d_size[] = {sizeof(float)};
    pw_backend_t *be = t->be; /* the slot's arrays are what the device copies from */
    int rc = grow(be, &s->ncap, n + 1, 2, per_sample, ps_size);
    if (!rc)
        rc = grow(be, &s->dcap, n * nd + 1, 1, dense, d_size);
    if (!rc)
        rc = grow(be, &s->kcap, nk + 1, t->split ? 7 : 4, per_key, pk_size); /* split: 3 more */
    if (rc)
        return rc;
    s->b.n = n;
    s->b.ndense = nd;
    s->b.lines = b->lines;
    memcpy(s->b.labels, b->labels, n * sizeof(float));
    memcpy(s->b.dense, b->dense, n * nd * sizeof(float));
    memcpy(s->b.key_off, b->key_off, (n + 1) * sizeof(size_t));
    memcpy(s->b.fields, b->fields, nk * sizeof(uint16_t));
    memcpy(s->b.vals, b->vals, nk * sizeof(float));
    memcpy(s->ukeys, b->ukeys, b->nu * sizeof(uint64_t)); /* the reader found them (dedup) */
    memcpy(s->inv, b->inv, nk * sizeof(uint32_t));
    s->nu = b->nu;
    if (t->split)
        memset(s->in_next, 0, s->nu);
    s->indexed = s->pull2_due = false;
    s->push_first = 0;
    void **const rows[] = {(void **)&s->urows, (void **)&s->ugrads, (void **)&s->pgrads};
    const size_t r_size[] = {sizeof(float), sizeof(float), sizeof(float)};
    return grow(be, &s->ucap, s->nu * (size_t)t->emb->dim + 1, t->split ? 3 : 2, rows, r_size);
}

static round_t *round_of(trainer_t *t, uint64_t id) {
    return &t->rounds[id % (uint64_t)t->nrounds];
}

/* Submit slot s's pull job j (s->pull or s->pull2: run_pull reads which keys) of n keys, to
 * start once `after` is done (NULL: at once). */
static void pull_submit(trainer_t *t, slot_t *s, pw_job_t *j, size_t n, pw_job_t *after) {
    pw_sched_reset(j);
    j->cls = PW_JOB_PULL;
    j->prio = PRIO_PULL;
    j->bytes = n * (sizeof(uint64_t) + (size_t)t->emb->dim * sizeof(float));
    t->pulled_rows += n;
    j->run = run_pull;
    j->ctx = s;
    j->after = after;
    pw_sched_submit(t->sched, j);
}

/* The marker of round `round - back` while it is to be waited for (submitted, not applied), else
 * NULL. */
static pw_job_t *mark_gate(trainer_t *t, uint64_t round, uint64_t back) {
    if (round < back || round - back < t->applied)
        return NULL;
    return &round_of(t, round - back)->mark;
}

static slot_t *slot_step(trainer_t *t, const slot_t *s, int by) {
    return &t->slots[((s - t->slots) + by + t->nslots) % t->nslots];
}

/* Split: reorder s's unique keys, those p (the slot of the step before, not computed yet) does not
 * have first (inv follows), and mark in p those s has. Returns how many p does not have. */
static size_t split_keys(slot_t *s, slot_t *p) {
    size_t nfresh = 0;
    pw_unique_find_many(&p->set, p->ukeys, s->ukeys, s->nu, s->perm);
    for (size_t i = 0; i < s->nu; i++) {
        const uint32_t j = s->perm[i];
        s->perm[i] = j == PW_UNIQUE_NONE ? 0 : 1;
        nfresh += j == PW_UNIQUE_NONE;
        if (j != PW_UNIQUE_NONE)
            p->in_next[j] = 1;
    }
    size_t fi = 0, si = nfresh;
    for (size_t i = 0; i < s->nu; i++) {
        const size_t to = s->perm[i] ? si++ : fi++;
        s->pkeys[to] = s->ukeys[i];
        s->perm[i] = (uint32_t)to;
    }
    uint64_t *const k = s->ukeys; /* the reordered keys become ukeys; the old array scratch */
    s->ukeys = s->pkeys;
    s->pkeys = k;
    const size_t nk = s->b.key_off[s->b.n];
    for (size_t j = 0; j < nk; j++)
        s->inv[j] = s->perm[s->inv[j]];
    return nfresh;
}

void pw__slot_pull(trainer_t *t, slot_t *s) {
    s->staged = false;
    pw_sched_reset(&s->pull2);
    if (!t->split) {
        pull_submit(t, s, &s->pull, s->npull = s->nu,
                    mark_gate(t, s->round, (uint64_t)t->stale + 1));
        return;
    }
    slot_t *p = slot_step(t, s, -1);
    /* the step before is to compute still: its pushes can be split for this batch */
    const bool before_due = s->round >= 1 && p->round + 1 == s->round && p->round >= t->next_round;
    const size_t nfresh = before_due && p->indexed ? split_keys(s, p) : 0;
    s->indexed = pw_unique_index(&s->set, s->ukeys, s->nu) == 0; /* else: no split after it */
    if (!before_due) { /* the step before was submitted (or there is none): one pull after it */
        pull_submit(t, s, &s->pull, s->npull = s->nu, mark_gate(t, s->round, 1));
        return;
    }
    s->npull = nfresh;
    t->early_rows += nfresh;
    if (nfresh)
        pull_submit(t, s, &s->pull, nfresh, mark_gate(t, s->round, 2));
    else
        pw_sched_reset(&s->pull);
    s->pull2_due = nfresh < s->nu; /* submitted with the round before (pw__round_submit) */
}

static int slot_pull_wait(trainer_t *t, slot_t *s) {
    const int rc = pw_sched_wait(t->sched, &s->pull), rc2 = pw_sched_wait(t->sched, &s->pull2);
    return rc ? rc : rc2;
}

int pw__slot_rows(trainer_t *t, slot_t *s) {
    const uint64_t t0 = pc_time_mono_ns();
    assert(!s->pull2_due); /* submitted with the round before, which every lone step submits */
    int rc;
    while (pw__server_retry(t, rc = slot_pull_wait(t, s), t0)) {
        pw_sched_reset(&s->pull2); /* all keys again: their gates are done (waited for) */
        pull_submit(t, s, &s->pull, s->npull = s->nu, NULL);
    }
    t->pull_wait_s += pc_time_sec_since(t0);
    pw_telemetry_pull_wait(t->tel, pc_time_mono_ns() - t0);
    char why[1024];
    if (rc && !transient(rc) && rc != PC_ECANCELED) /* transient: logged giving up */
        PC_ERROR("train: rank %d: pulling rows failed: %s", (int)t->c->rank,
                 pw__store_why(t, rc, why, sizeof why));
    return rc;
}

bool pw__slot_pulled(trainer_t *t, slot_t *s) {
    return !s->pull2_due && pw_sched_done(t->sched, &s->pull) &&
           pw_sched_done(t->sched, &s->pull2) && slot_pull_wait(t, s) == 0;
}

int pw__slot_stage(trainer_t *t, slot_t *s) {
    pw_step_input_t in = {.b = &s->b, .inv = s->inv, .nu = s->nu, .urows = s->urows};
    int rc = pw_step_stage(t->st, (int)(s->round & 1), &in);
    s->staged = rc == 0;
    return rc;
}

/* Split: gather slot s's keys and gradients for its pushes, those in the next batch first
 * (pkeys, pgrads; push_first of them). */
static void slot_gather(trainer_t *t, slot_t *s) {
    const size_t d = (size_t)t->emb->dim;
    size_t first = 0;
    for (size_t i = 0; i < s->nu; i++)
        first += s->in_next[i];
    size_t a = 0, b = first;
    for (size_t i = 0; i < s->nu; i++) {
        const size_t to = s->in_next[i] ? a++ : b++;
        s->pkeys[to] = s->ukeys[i];
        memcpy(s->pgrads + to * d, s->ugrads + i * d, d * sizeof(float));
    }
    s->push_first = first;
}

/* Push chunks of slot s: their count, *per keys each, *row bytes a key (split: the keys in the
 * next batch are one push, the first). */
static size_t push_chunks(const trainer_t *t, const slot_t *s, size_t *per, size_t *row) {
    *row = sizeof(uint64_t) + (size_t)t->emb->dim * sizeof(float);
    const size_t chunk = (size_t)t->c->chunk_kib << 10;
    *per = chunk / *row ? chunk / *row : 1;
    const size_t rest = s->nu - s->push_first;
    return (s->push_first ? 1 : 0) + (rest + *per - 1) / *per;
}

/* Push the slot's summed gradients in chunks (bulk: after everything else), each started only
 * once `gate` is done (NULL: at once). s->push holds them (grown by round_submit). */
static void slot_push(trainer_t *t, slot_t *s, pw_job_t *gate) {
    size_t per, row;
    const size_t n = push_chunks(t, s, &per, &row), d = (size_t)t->emb->dim;
    const uint64_t *keys = t->split ? s->pkeys : s->ukeys;
    const float *grads = t->split ? s->pgrads : s->ugrads;
    s->npush = n;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        pchunk_t *p = &s->push[i]; /* grown by realloc: every field of the job set here */
        p->job =
            (pw_job_t){.cls = PW_JOB_PUSH, .ordered = false, .prio = PRIO_PUSH, .run = run_push};
        pw_sched_reset(&p->job);
        p->job.after = gate;
        p->s = s;
        p->sent = false;
        p->n = i == 0 && s->push_first ? s->push_first : s->nu - off < per ? s->nu - off : per;
        p->keys = keys + off;
        p->grads = grads + off * d;
        off += p->n;
        p->job.bytes = p->n * row;
        pw_sched_submit(t->sched, &p->job);
    }
}

/* ---- rounds ---- */

/* Turns [from, to) of round r (push order rank), into the ordered lane. */
static void turns_submit(trainer_t *t, round_t *r, int from, int to) {
    for (int k = from; k < to; k++) {
        pw_job_t *j = &r->turns[k];
        pw_sched_reset(j);
        j->cls = PW_JOB_MARK;
        j->ordered = true;
        j->prio = PRIO_DENSE + t->model->nparams;
        j->bytes = 0; /* holds no credits: it waits for pushes that need them (see the mark) */
        j->run = run_turn;
        j->ctx = r;
        pw_sched_submit(t->sched, j);
    }
}

/* Copies between a round's sum and the layers: device to device (it sums on the devices), else
 * download (pack) / upload. */
typedef void (*move_fn)(pw_backend_t *, void *, const void *, size_t);

int pw__slot_settle(trainer_t *t, slot_t *s) {
    int rc = 0;
    for (size_t i = 0; i < s->npush; i++) {
        const int prc = pw_sched_wait(t->sched, &s->push[i].job);
        if (prc && !s->push[i].sent) /* its gate failed: the round was dropped (a regroup) */
            atomic_fetch_add(&t->lost_pushes, 1);
        else
            rc = rc ? rc : prc;
    }
    s->npush = 0;
    return rc;
}

int pw__slots_settle(trainer_t *t) {
    int rc = 0;
    for (int i = 0; i < t->nslots; i++) {
        const int src = pw__slot_settle(t, &t->slots[i]);
        rc = rc ? rc : src;
    }
    return rc;
}

int pw__round_submit(trainer_t *t, slot_t *s, bool had_batch) {
    if (s) { /* the push chunks' memory first: nothing is submitted on a failure */
        if (t->split)
            slot_gather(t, s);
        size_t per, row, n = push_chunks(t, s, &per, &row);
        void **const push[] = {(void **)&s->push};
        const size_t p_size[] = {sizeof *s->push};
        int rc = grow(NULL, &s->pcap, n ? n : 1, 1, push, p_size);
        if (rc)
            return rc;
    }
    round_t *r = round_of(t, t->next_round);
    r->id = t->next_round++;
    r->has_pos = s != NULL;
    r->pos = s ? s->pos : 0;
    r->slot = t->staleness == PW_ASYNC ? NULL : s;
    if (t->grp) {
        pw_backend_t *be = t->be;
        r->members = pw_group_size(t->grp);
        const bool dev = r->dev = t->dcoll != NULL;
        float *const flat = round_sum(r);
        const move_fn out = dev ? be->copy : be->download;
        size_t k = 0;
        for (int i = 0; i < t->model->nparams && had_batch; i++) {
            const pw_linear_t *l = &t->model->params[i];
            const size_t nw = (size_t)l->in * l->out;
            out(be, flat + k, l->dw, nw * sizeof(float));
            out(be, flat + k + nw, l->db, (size_t)l->out * sizeof(float));
            k += nw + (size_t)l->out;
        }
        r->flag = had_batch ? 1.0f : 0.0f;
        if (dev) { /* the collective reads the buffer from another thread: complete it */
            if (!had_batch)
                be->zero(be, flat, t->nflat * sizeof(float));
            be->sync(be);
        } else if (!had_batch) {
            memset(flat, 0, t->nflat * sizeof(float));
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
    /* Sync: a step's pushes wait for the round's first allreduce, which every worker enters only
     * after its step computed: no push of step t reaches a server before every worker's pull of
     * step t was answered (else a slower worker would read rows already moved by step t). With
     * push order rank, rank k's pushes wait for turn k - 1 (which comes after that allreduce). */
    pw_job_t *gate = t->grp && t->staleness == 0 && t->nplan ? &r->chunks[0].job : NULL;
    r->nturns = r->me = 0;
    if (gate && t->c->push_order == PW_PUSH_RANK) {
        r->me = pw_group_rank(t->grp);
        r->nturns = pw_group_size(t->grp) - 1;
        turns_submit(t, r, 0, r->me); /* the lower ranks' turns: this worker's pushes wait */
        if (r->me > 0)
            gate = &r->turns[r->me - 1];
    }
    if (s)
        slot_push(t, s, gate);
    turns_submit(t, r, r->me, r->nturns); /* its own waits for the pushes: submitted after them */
    pw_sched_reset(&r->mark);
    r->mark.cls = PW_JOB_MARK;
    r->mark.ordered = true;
    r->mark.prio = PRIO_DENSE + t->model->nparams;
    /* No credits held: the mark waits for the round's pushes, queued behind it in priority; a
     * push larger than the credits left would wait for the mark's, for ever. */
    r->mark.bytes = 0;
    r->mark.run = run_mark;
    r->mark.ctx = r;
    pw_sched_submit(t->sched, &r->mark);
    slot_t *nx = s && t->split ? slot_step(t, s, 1) : NULL;
    if (nx && nx->pull2_due && nx->round == s->round + 1) { /* its keys this step pushes */
        nx->pull2_due = false;
        pull_submit(t, nx, &nx->pull2, nx->nu - nx->npull,
                    s->push_first ? &s->push[0].job : &r->mark);
    }
    return 0;
}

void pw__apply_dense(trainer_t *t) {
    pw_step_apply(t->st);
    t->step++;
}

/* The group's mean gradients of round r into the layers, and the dense step. The sum is divided
 * by the group's size, not by the members that had a batch: a member out of data adds zeros, as
 * to the embeddings, whose pushes were scaled by 1 / size before anyone knew who had a batch (the
 * two halves of the model learn at one rate at a job's tail, as with PyTorch DDP's join by the
 * initial world size). *stop when no worker had a batch. */
static void round_apply(trainer_t *t, round_t *r, bool *stop) {
    pw_backend_t *be = t->be;
    const bool dev = r->dev;
    float *const flat = round_sum(r);
    const move_fn in = dev ? be->copy : be->upload;
    if (r->flag <= 0) { /* the members with a batch (the mark's sum) */
        *stop = true;
        return;
    }
    const float members = (float)r->members;
    if (dev)
        be->scale(be, t->nflat, 1.0f / members, flat);
    else
        for (size_t j = 0; j < t->nflat; j++)
            flat[j] /= members;
    size_t k = 0;
    for (int i = 0; i < t->model->nparams; i++) {
        pw_linear_t *l = &t->model->params[i];
        const size_t nw = (size_t)l->in * l->out;
        in(be, l->dw, flat + k, nw * sizeof(float));
        in(be, l->db, flat + k + nw, (size_t)l->out * sizeof(float));
        k += nw + (size_t)l->out;
    }
    pw__apply_dense(t);
}

int pw__apply_rounds(trainer_t *t, int64_t wait_upto, bool wait_all, bool *stop) {
    while (t->applied < t->next_round) {
        round_t *r = round_of(t, t->applied);
        if (!wait_all && (int64_t)t->applied > wait_upto && !pw_sched_done(t->sched, &r->mark))
            break;
        int rc = pw_sched_wait(t->sched, &r->mark);
        for (int i = 0; t->grp && i < t->nplan; i++) {
            const int crc = pw_sched_wait(t->sched, &r->chunks[i].job);
            rc = rc ? rc : crc;
        }
        for (int k = 0; k < r->nturns; k++) {
            const int trc = pw_sched_wait(t->sched, &r->turns[k]);
            rc = rc ? rc : trc;
        }
        if (rc)
            return rc;
        if (t->grp) {
            round_apply(t, r, stop);
            if (*stop)
                return 0;
        }
        if (r->has_pos) {
            t->done_pos = r->pos;
            t->pos_dirty = true;
        }
        t->applied++;
    }
    return 0;
}
