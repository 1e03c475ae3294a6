/* pw_recover.c: the trainer's recovery: one dense state for the group, job rollback, coordinated
 * checkpoints and reader positions.
 *
 * DESIGN
 * - Dense state: the model's parameters, the step's optimizer state and the step count, packed
 *   as floats (dense_state) for the allreduce that hands it to a (re)formed group and for the
 *   checkpoint files. Counts travel as two floats each, exact below 2^48.
 * - Agreement (agree), after every formation of the group: where the generation sums its dense
 *   gradients (dcoll_decide: NCCL when every member can and no two share a GPU, else Gloo on
 *   the host; all members decide alike from one allreduce), one dense state (the member with
 *   the most steps gives it, sync_state), then a job rollback when any member asks for one
 *   (rollback_agree). A member failing during the agreement makes the group form again
 *   (regroup); errors no re-formation cures (fatal) end the job.
 * - Coordinated checkpoints (pw__job_checkpoint) never record a restarted server's older rows:
 *   none is taken after a lost server connection, none published when a server restarted while
 *   it was taken (server_restarted); the job rolls back instead.
 * - Positions: after every applied step a worker records its reader position at the coordinator
 *   (save_position); a restarted worker reads on from there, a checkpoint records every rank's.
 * - Rollback (rollback_on_server_loss): a reconnect of the store means a server may have
 *   restarted from its own last checkpoint; the worker proposes a new generation, and in it the
 *   group restores the servers and itself to the latest coordinated checkpoint. Only while the
 *   servers' map, at the look before the loss (look_map, once a step under rollback), names no
 *   backup and gives every server it lists a role. With backups a lost server's slots go to a
 *   backup with every acknowledged push and a restarted server joins again as a backup, so a
 *   reconnect loses nothing; what can lose rows there is a promotion of a backup that had not
 *   caught up, which the map counts (pw__rows_went_back): said and counted, and with rollback
 *   the job stops, since the checkpoint's rows of a server that is gone cannot be restored
 *   while the job runs. A server listed with no role (a failover's) could not be restored:
 *   a rollback would only end the job. A server that restarts while it is the only holder of
 *   its slots in such a cluster counts them in the map too (its run record, ps_repl.h).
 * - Threads: the training thread's; the ordered lane is stopped before a re-formation.
 */
#include "pc_alloc.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_hash.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_jobckpt.h"
#include "pw_train_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The token and TLS files of the worker's gRPC calls (coordinator, server checkpoints): views
 * of c's settings, valid while c is. */
static psg_opts_t grpc_sec(const pw_train_config_t *c) {
    return (psg_opts_t){
        .token = c->token, .tls_ca = c->tls_ca, .tls_cert = c->tls_cert, .tls_key = c->tls_key};
}

int pw__group_join(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    const psg_opts_t sec = grpc_sec(c);
    pw_group_opts_t go = {.coordinator = c->coordinator,
                          .sec = &sec,
                          .job = c->job,
                          .host = c->host,
                          .rank = (int)c->rank,
                          .world = (int)c->world,
                          .timeout_ms = (int)c->timeout_ms,
                          .rejoin_timeout_ms = (int)c->rejoin_timeout_ms,
                          .lease_ms = (int)c->lease_ms,
                          .shrink = c->on_worker_loss == PW_WORKER_LOSS_SHRINK};
    int rc = pw_group_join(&go, &t->grp);
    if (rc)
        PC_ERROR("train: the worker group did not form (job %s at %s): %s", c->job, c->coordinator,
                 pc_strerror(rc));
    return rc;
}

/* ---- the dense state ---- */

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
    for (int i = 0; i < t->model->nparams; i++) {
        pw_linear_t *l = &t->model->params[i];
        move(t->be, buf, &k, l->w, (size_t)l->in * l->out, pack);
        move(t->be, buf, &k, l->b, (size_t)l->out, pack);
    }
    int nopt;
    pw_opt_t *opt = pw_step_opts(t->st, &nopt);
    for (int i = 0; i < nopt; i++) {
        pw_opt_t *o = &opt[i];
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

/* The settings every member of a group must share, beside the model's size: they shape the
 * collectives of a round (the dense chunks, the push turns), the rounds a step may run ahead
 * and the checkpoints' barriers. A member with another value would enter another collective than
 * its peers (Gloo aborts the process on a size mismatch) or a barrier they never reach. */
enum { PLAN_N = 4 };
static const char *const k_plan_flag[PLAN_N] = {"--chunk-kib", "--mode", "--push-order",
                                                "--ckpt-every"};

#define PLAN_MAX   ((1ULL << 48) - 1) /* two floats' exact range (ckpt_every beyond: never) */
#define PLAN_ASYNC PLAN_MAX

static void plan_of(const trainer_t *t, uint64_t v[PLAN_N]) {
    const pw_train_config_t *c = t->c;
    v[0] = (uint64_t)c->chunk_kib;
    v[1] = t->staleness == PW_ASYNC ? PLAN_ASYNC : (uint64_t)t->staleness;
    v[2] = (uint64_t)c->push_order;
    v[3] = (uint64_t)c->ckpt_every < PLAN_MAX ? (uint64_t)c->ckpt_every : PLAN_MAX;
}

/* Rounds between this member's mid-run evaluations, as it would run them: --eval-every samples
 * in batches, rounded up; 0 without a test stream (pw_train's `evaluates`). */
static uint64_t eval_rounds_of(const trainer_t *t) {
    const uint64_t every = (uint64_t)t->c->eval_every, batch = (uint64_t)t->c->batch;
    const uint64_t rounds = every && t->evaluates ? (every + batch - 1) / batch : 0;
    return rounds < PLAN_MAX ? rounds : PLAN_MAX;
}

/* Plan value v of setting k as its flag writes it (buf: 32 bytes). */
static const char *plan_text(int k, uint64_t v, char *buf) {
    if (k == 1 && v == PLAN_ASYNC)
        return "async";
    if (k == 1)
        snprintf(buf, 32, v ? "ssp:%llu" : "sync", (unsigned long long)v);
    else if (k == 2)
        snprintf(buf, 32, "%s", v == PW_PUSH_RANK ? "rank" : "arrival");
    else
        snprintf(buf, 32, "%llu", (unsigned long long)v);
    return buf;
}

/* Member i's entry of the agreement: steps + 1 (0: no trained state), the dense state's size,
 * the plan (PLAN_N values), its evaluation rounds (eval_rounds_of: group rank 0's are the
 * group's), the round of its last mid-run evaluation (group rank 0's: whether the one due
 * where the group re-formed was taken) and, for a restarted worker, the step its recorded
 * position was at: two floats each. */
enum {
    INFO_EVAL = 2 * (2 + PLAN_N),
    INFO_TAKEN = INFO_EVAL + 2,
    INFO_RESUMED = INFO_TAKEN + 2,
    INFO_W = INFO_RESUMED + 2
};

/* Whether members i and j could train together (size and plan). */
static bool same_shape(const float *info, int i, int j) {
    for (int k = 1; k < INFO_EVAL / 2; k++)
        if (u64_get(info + INFO_W * i + 2 * k) != u64_get(info + INFO_W * j + 2 * k))
            return false;
    return true;
}

/* After the group (re)formed: every member takes the dense state of the member with the most
 * steps among those that have trained state (ties: the lowest group rank), by an allreduce in
 * which the others contribute zeros. Members that restarted have none; when no member has any
 * (the whole job restarted), every member takes member 0's (its initial model): from then on
 * they all have one, so a worker restarted later takes the trained model, not its own initial
 * one. The dense state's size and the plan (plan_of) most members have are the job's (ties: the
 * trained member's); a member with another size (other model settings) or plan gets PC_EDIM or
 * PC_EINVAL and ends, and the others get PC_EAGAIN: they re-form without it (it once ended
 * every member). */
static int sync_state(trainer_t *t) {
    const int n = pw_group_size(t->grp), me = pw_group_rank(t->grp);
    pw_coll_t *coll = pw_group_coll(t->grp);
    const size_t len = dense_state(t, NULL, false);
    float *info = pc_scalloc(PC_MEM_MODEL, (size_t)n * INFO_W, sizeof *info);
    if (!info)
        return PC_ENOMEM;
    uint64_t plan[PLAN_N];
    plan_of(t, plan);
    u64_put(info + INFO_W * me, t->has_state ? t->step + 1 : 0);
    u64_put(info + INFO_W * me + 2, len);
    for (int k = 0; k < PLAN_N; k++)
        u64_put(info + INFO_W * me + 4 + 2 * k, plan[k]);
    u64_put(info + INFO_W * me + INFO_EVAL, eval_rounds_of(t));
    u64_put(info + INFO_W * me + INFO_TAKEN, t->eval_taken);
    u64_put(info + INFO_W * me + INFO_RESUMED, t->has_state ? 0 : t->restart_step);
    int rc = pw_coll_allreduce_sum(coll, info, (size_t)n * INFO_W);
    /* Rank 0 evaluates: every member stops at its evaluation rounds (only rank 0 is usually
     * given --test and --eval-every; a member's own value is not used) */
    t->eval_rounds = rc ? 0 : u64_get(info + INFO_EVAL);
    t->rank0_eval_taken = rc ? 0 : u64_get(info + INFO_TAKEN);
    if (!rc && me != 0 && eval_rounds_of(t) && t->eval_rounds != eval_rounds_of(t))
        PC_WARN("train: this worker's --eval-every (%llu rounds) is not the group's: rank 0 "
                "evaluates, %s",
                (unsigned long long)eval_rounds_of(t),
                t->eval_rounds ? "at its own rounds" : "and has no --test or --eval-every: none");
    int job = me; /* a member of the job's shape (most members; ties: most steps) */
    for (int i = 0, most = 0; !rc && i < n; i++) {
        const uint64_t si = u64_get(info + INFO_W * i);
        int same = 0;
        for (int j = 0; j < n; j++)
            same += same_shape(info, i, j);
        if (same > most || (same == most && si > u64_get(info + INFO_W * job)))
            most = same, job = i;
    }
    const uint64_t job_len = u64_get(info + INFO_W * job + 2);
    int src = -1;
    uint64_t best = 0;
    for (int i = 0; !rc && i < n; i++) {
        const char *tail = i == me ? ": this worker ends" : ": the others go on without it";
        const uint64_t li = u64_get(info + INFO_W * i + 2);
        if (li != job_len) {
            PC_ERROR("train: group member %d has a dense model of another size (%llu floats, "
                     "the job's %llu): not the same model settings%s",
                     i, (unsigned long long)li, (unsigned long long)job_len, tail);
            rc = same_shape(info, me, job) ? PC_EAGAIN : PC_EDIM;
        } else if (!same_shape(info, i, job)) {
            int k = 0;
            while (k + 1 < PLAN_N && u64_get(info + INFO_W * i + 4 + 2 * k) ==
                                         u64_get(info + INFO_W * job + 4 + 2 * k))
                k++;
            char its[32], job_v[32];
            PC_ERROR("train: group member %d has %s=%s, the job %s: every worker of a job needs "
                     "the same%s",
                     i, k_plan_flag[k], plan_text(k, u64_get(info + INFO_W * i + 4 + 2 * k), its),
                     plan_text(k, u64_get(info + INFO_W * job + 4 + 2 * k), job_v), tail);
            rc = same_shape(info, me, job) ? PC_EAGAIN : PC_EINVAL;
        } else if (u64_get(info + INFO_W * i) > best) {
            best = u64_get(info + INFO_W * i), src = i;
        }
    }
    /* No member has trained state (the whole job restarted): member 0's initial model, at the
     * step the run had reached (the newest any member recorded). From step 0 the job's step
     * numbers went back: its next coordinated checkpoint, at a low step, removed the run's
     * later ones, and published dense versions were numbered again from the start. */
    uint64_t resumed = 0;
    for (int i = 0; !rc && src < 0 && i < n; i++)
        if (u64_get(info + INFO_W * i + INFO_RESUMED) > resumed)
            resumed = u64_get(info + INFO_W * i + INFO_RESUMED);
    pc_sfree(info);
    if (rc)
        return rc;
    const bool fresh = src < 0;
    if (src < 0)
        src = 0;
    float *buf = pc_scalloc(PC_MEM_MODEL, len, sizeof *buf);
    if (!buf)
        return PC_ENOMEM;
    if (me == src)
        dense_state(t, buf, true);
    if (!(rc = pw_coll_allreduce_sum(coll, buf, len)) && me != src)
        dense_state(t, buf, false);
    pc_sfree(buf);
    if (!rc && fresh && resumed > t->step)
        t->step = resumed;
    if (!rc) {
        t->has_state = true;
        PC_INFO("train: group generation %llu: %d worker(s) at step %llu (state of member %d)",
                (unsigned long long)pw_group_gen(t->grp), n, (unsigned long long)t->step, src);
    }
    return rc;
}

uint64_t pw__dense_digest(trainer_t *t) {
    const size_t n = dense_state(t, NULL, false);
    float *buf = pc_smalloc(PC_MEM_MODEL, n * sizeof *buf);
    if (!buf)
        return 0;
    dense_state(t, buf, true);
    const uint64_t h = pc_hash64(buf, n * sizeof *buf, 0);
    pc_sfree(buf);
    return h ? h : 1;
}

/* Errors of the agreement that re-forming the group cannot cure. */
static bool fatal(int rc) {
    return rc == PC_ENOMEM || rc == PC_EDIM || rc == PC_EINVAL || rc == PC_EIO;
}

/* A wait in milliseconds as the collectives take it: at most INT_MAX (an hour's timeout times
 * a thousand servers is more). */
static int wait_ms_of(int64_t ms) {
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* How long members wait for rank 0 calling every server (checkpoint, restore). */
static int servers_wait_ms(const pw_train_config_t *c) {
    int64_t nservers = 1;
    for (const char *p = c->server_grpc; *p; p++)
        nservers += *p == ',';
    return wait_ms_of(c->timeout_ms * (nservers + 1));
}

/* Whether ck is a checkpoint a rollback of this run may go to: one this run wrote, or the one it
 * resumed from (not another run's, left in the same directory: its rows and positions are not
 * this run's). */
static bool of_this_run(const trainer_t *t, const pw_jobckpt_t *ck) {
    if (t->resumed && ck->step == t->resumed_step && strcmp(ck->run, t->resumed_run) == 0)
        return true;
    return ck->run[0] && t->grp && strcmp(ck->run, pw_group_run_name(t->grp)) == 0;
}

/* Checkpoint `step` of ckpt_dir (0: the latest, LATEST's): its manifest and dense state (*ck and
 * *state malloc'ed, NULL on errors), checked against this job's world, and with this_run against
 * this run (of_this_run: else PC_ESTATE). Errors are logged. */
static int read_checkpoint(trainer_t *t, uint64_t step, bool this_run, pw_jobckpt_t **ck,
                           float **state) {
    const size_t n = dense_state(t, NULL, false);
    *ck = pc_scalloc(PC_MEM_MODEL, 1, sizeof **ck);
    *state = pc_smalloc(PC_MEM_MODEL, n * sizeof **state);
    int rc = !*ck || !*state ? PC_ENOMEM
             : step          ? pw_jobckpt_read(t->c->ckpt_dir, step, *ck, *state, n)
                             : pw_jobckpt_read_latest(t->c->ckpt_dir, *ck, *state, n);
    if (!rc && (*ck)->nranks != (size_t)t->c->world) {
        PC_ERROR("train: the checkpoint is of %zu workers, this job has %d", (*ck)->nranks,
                 (int)t->c->world);
        rc = PC_EINVAL;
    }
    if (!rc && this_run && !of_this_run(t, *ck)) {
        PC_ERROR("train: the latest checkpoint in %s (step %llu) is of %s%s, not of this run "
                 "(%s) nor the one it resumed from",
                 t->c->ckpt_dir, (unsigned long long)(*ck)->step,
                 (*ck)->run[0] ? "run " : "a run that did not record its name", (*ck)->run,
                 t->grp ? pw_group_run_name(t->grp) : "");
        rc = PC_ESTATE;
    }
    if (rc) {
        PC_ERROR("train: cannot read the checkpoint in %s: %s", t->c->ckpt_dir, pc_strerror(rc));
        pc_sfree(*ck);
        pc_sfree(*state);
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
            (int)t->c->rank, (unsigned long long)t->step, (unsigned long long)*pos);
}

/* The low 63 bits of x in three 21-bit parts, each exact in a float (and summed exactly by an
 * allreduce where one member alone fills them): a step, a device identity's hash. */
static void float_parts(uint64_t x, float out[3]) {
    for (int k = 0; k < 3; k++)
        out[k] = (float)((x >> (21 * k)) & 0x1fffff);
}

/* Rank 0's `step` to every member of the group (*out): one allreduce of three 21-bit parts,
 * which only rank 0 fills (exact in floats). */
static int rank0_step(trainer_t *t, uint64_t step, uint64_t *out) {
    float v[3] = {0, 0, 0};
    if (pw_group_rank(t->grp) == 0)
        float_parts(step, v);
    const int rc = pw_coll_allreduce_sum(pw_group_coll(t->grp), v, 3);
    *out = 0;
    for (int k = 0; !rc && k < 3; k++)
        *out |= (uint64_t)v[k] << (21 * k);
    return rc;
}

/* In a group just formed: when any member saw a server connection lost (want_rollback), the
 * job rolls back to the latest coordinated checkpoint. Every member reads it first (when one
 * cannot, nothing changes: logged, training goes on); then the group's rank 0 removes the dense
 * models published after it (pw_publish_abandon) and has every server restore its part (gRPC
 * Restore) while the others wait, the members agree that every restore
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
    /* Every member wants it now, until it is done or refused: when the group fails on the way
     * (after rank 0 restored the servers, say) and the member that asked is gone, the next
     * group still rolls back (before, its survivors went on at their step over the servers'
     * restored rows). */
    t->want_rollback = true;
    pw_jobckpt_t *ck = NULL;
    float *state = NULL;
    float failed = read_checkpoint(t, 0, true, &ck, &state) ? 1.0f : 0.0f;
    rc = pw_coll_allreduce_sum(coll, &failed, 1);
    /* Every member read LATEST on its own: one read before a late write of it (a replaced rank
     * 0 still running) may hold another step. Rank 0's is the group's: the others read it. */
    uint64_t step = 0;
    if (!rc && failed == 0.0f && !(rc = rank0_step(t, ck->step, &step)) && ck->step != step) {
        PC_WARN("train: rank %d read checkpoint step %llu as the latest, rank 0 step %llu: the "
                "group rolls back to rank 0's",
                pw_group_rank(t->grp), (unsigned long long)ck->step, (unsigned long long)step);
        pc_sfree(ck);
        pc_sfree(state);
        failed = read_checkpoint(t, step, true, &ck, &state) ? 1.0f : 0.0f;
        rc = pw_coll_allreduce_sum(coll, &failed, 1);
    } else if (!rc && failed == 0.0f) {
        rc = pw_coll_allreduce_sum(coll, &failed, 1); /* (every member enters the same calls) */
    }
    if (!rc && failed > 0.0f)
        PC_ERROR("train: a worker cannot read the latest coordinated checkpoint: no rollback, "
                 "training goes on from here");
    if (!rc && failed == 0.0f) {
        const int restore_ms = wait_ms_of(4 * (int64_t)t->c->timeout_ms); /* large tables: long */
        int ck_rc = 0;
        if (pw_group_rank(t->grp) == 0) {
            const uint64_t t0 = pc_time_mono_ns();
            const psg_opts_t sec = grpc_sec(t->c);
            pw_publish_t *pub = pw__publisher(t); /* abandoned models go before their rows do */
            if (pub)
                pw_publish_abandon(pub, ck->step);
            pw_jobckpt_abandon_after(t->c->ckpt_dir, ck->step); /* and their checkpoints */
            ck_rc = pw_jobckpt_restore_servers(t->c->server_grpc, &sec, restore_ms,
                                               (int)t->c->server_retry_ms, ck);
            if (!ck_rc)
                PC_WARN("train: job rollback: %zu servers restored the checkpoint after step %llu "
                        "in %.2f s",
                        ck->nservers, (unsigned long long)ck->step, pc_time_sec_since(t0));
            /* every rank's saved position goes back with the rows, before the members save
             * theirs (after the barrier below): a rank missing from this group, restarted later,
             * resumes from the checkpoint's, not where the abandoned run left it */
            for (size_t r = 0; !ck_rc && r < ck->nranks; r++) {
                const int orc = pw_group_offset_set(t->grp, (int)r, ck->step, ck->positions[r]);
                if (orc)
                    PC_WARN("train: job rollback: rank %zu's saved position could not be set "
                            "back (%s): restarted, it would resume after it",
                            r, pc_strerror(orc));
            }
        }
        failed = ck_rc ? 1.0f : 0.0f;
        /* rank 0 restores, waiting for servers that restart (server_retry_ms) */
        if (!(rc = pw_coll_barrier(
                  coll, wait_ms_of(4 * (int64_t)servers_wait_ms(t->c) + t->c->server_retry_ms))))
            rc = pw_coll_allreduce_sum(coll, &failed, 1);
        if (!rc && failed > 0.0f) {
            PC_ERROR("train: the job rollback failed part-way (a server did not restore): the "
                     "servers may hold different checkpoints; restart the job from the latest "
                     "checkpoint (servers --restore-id, workers --resume=checkpoint)");
            rc = PC_EIO;
        } else if (!rc) {
            const uint64_t was = t->step;
            take_checkpoint(t, ck, state, &t->reposition_at);
            t->reposition = true;
            t->rolled_back_steps = was > t->step ? was - t->step : 0;
            t->rollbacks++;
        }
    }
    if (!rc) {
        t->seen_reconnects = t->emb->ops->reconnects(t->emb);
        t->seen_push_fails = atomic_load(&t->server_push_fails);
        t->want_rollback = false;
    }
    pc_sfree(ck);
    pc_sfree(state);
    return rc;
}

void pw__dcoll_entry(const pw_backend_t *be, bool offered, float out[PW_DCOLL_ENTRY]) {
    memset(out, 0, PW_DCOLL_ENTRY * sizeof *out);
    if (!be->dcoll || !be->device_id || !offered)
        return;
    const uint64_t h = pc_hash64(be->device_id, strlen(be->device_id), PC_HASH_SEED_DEVICE);
    out[0] = 1;
    float_parts(h, out + 1);
}

bool pw__dcoll_choose(const float *v, int n, char *why, size_t cap) {
    for (int a = 0; a < n; a++) {
        const float *ea = v + (size_t)a * PW_DCOLL_ENTRY;
        if (ea[0] != 1) {
            snprintf(why, cap,
                     "rank %d has no device collectives (or they failed to form %d "
                     "times in a row)",
                     a, PW_DCOLL_TRIES);
            return false;
        }
        for (int b = a + 1; b < n; b++)
            if (!memcmp(ea, v + (size_t)b * PW_DCOLL_ENTRY, PW_DCOLL_ENTRY * sizeof *v)) {
                snprintf(why, cap, "ranks %d and %d use one GPU", a, b);
                return false;
            }
    }
    return true;
}

/* Where the group sums its dense gradients in this generation (pw__dcoll_choose): every member
 * writes its entry (pw__dcoll_entry) at its rank's place of a zeroed vector, and one allreduce
 * hands every member the same vector, so all decide alike. */
static int dcoll_decide(trainer_t *t, bool *on_device, char *why, size_t cap) {
    const int n = pw_group_size(t->grp);
    float *v = pc_scalloc(PC_MEM_MODEL, (size_t)n * PW_DCOLL_ENTRY, sizeof *v);
    if (!v)
        return PC_ENOMEM;
    pw__dcoll_entry(t->be, t->dcoll_failed < PW_DCOLL_TRIES,
                    v + (size_t)pw_group_rank(t->grp) * PW_DCOLL_ENTRY);
    int rc = pw_coll_allreduce_sum(pw_group_coll(t->grp), v, (size_t)n * PW_DCOLL_ENTRY);
    *on_device = !rc && pw__dcoll_choose(v, n, why, cap);
    pc_sfree(v);
    return rc;
}

/* The generation's dense allreduce (dcoll_decide): NCCL formed anew for every generation under
 * its own rendezvous prefix at the coordinator (the unique id rank 0 hands out), or none (Gloo,
 * said once per job on a backend that has device collectives). */
static int dcoll_form(trainer_t *t) {
    pw_backend_t *be = t->be;
    if (t->dcoll) { /* the last generation's: it worked (the count starts over) or never did */
        t->dcoll_failed = atomic_load(&t->dcoll_worked) ? 0 : t->dcoll_failed + 1;
        be->dcoll->destroy(t->dcoll);
    }
    t->dcoll = NULL;
    atomic_store(&t->dcoll_worked, false);
    bool on_device = false;
    char why[256] = "";
    int rc = dcoll_decide(t, &on_device, why, sizeof why);
    if (rc || !on_device) {
        if (!rc && be->dcoll && !t->dcoll_said) {
            PC_WARN("train: the dense allreduce goes through the host (Gloo), not NCCL: %s "
                    "(rank %d is on %s)",
                    why, pw_group_rank(t->grp), be->device_id ? be->device_id : be->name);
            t->dcoll_said = true;
        }
        return rc;
    }
    char prefix[320];
    pw_kv_t kv;
    pw_group_rendezvous(t->grp, "dcoll", &kv, prefix, sizeof prefix);
    rc = be->dcoll->create(be, &kv, prefix, pw_group_rank(t->grp), pw_group_size(t->grp),
                           t->c->timeout_ms, &t->dcoll);
    t->dcoll_failed += rc != 0; /* (one that forms is counted once it summed, or not) */
    if (rc)
        PC_WARN("train: the device allreduce of generation %llu did not form: %s%s",
                (unsigned long long)pw_group_gen(t->grp), pc_strerror(rc),
                t->dcoll_failed >= PW_DCOLL_TRIES
                    ? " (the last try: the group sums on the host from the next generation)"
                    : "");
    return rc;
}

/* The agreement of a group just formed: its device allreduce, one dense state, then a rollback
 * if one is wanted. */
/* Fence the table at this generation (docs/wire.md "Generation fences"): from here on the servers
 * refuse pushes of the generations before it, a worker the group left behind (stopped, cut off,
 * then back) included, before rank 0 may restore the servers (rollback_agree). Any member's
 * fence does it for all; each stamps its own pushes. A failure is said, and this member's
 * pushes go unfenced (the store stamps none): a fence is protection, not a condition to train. */
static void fence(trainer_t *t) {
    const pw_emb_ops_t *ops = t->emb->ops;
    if (!t->grp || !ops->fence)
        return;
    const uint64_t gen = pw_group_gen(t->grp);
    const uint32_t epoch = gen + 1 < UINT32_MAX ? (uint32_t)(gen + 1) : UINT32_MAX;
    char msg[1024];
    const int rc = ops->fence(t->emb, pw_group_run_name(t->grp), epoch, msg, sizeof msg);
    if (rc)
        PC_WARN("train: rank %d: cannot fence the table at generation %llu (%s): this worker's "
                "pushes go unfenced",
                (int)t->c->rank, (unsigned long long)gen, msg);
    atomic_store(&t->epoch, rc ? 0 : epoch);
    atomic_store(&t->fenced, false);
}

static int agree(trainer_t *t) {
    fence(t);
    int rc = dcoll_form(t);
    if (!rc)
        rc = sync_state(t);
    return rc ? rc : rollback_agree(t);
}

void pw__stops_formed(trainer_t *t) {
    t->last_ckpt = t->step;
    const bool eval_missed = t->grp && t->eval_rounds && t->step && t->step % t->eval_rounds == 0 &&
                             t->rank0_eval_taken < t->step;
    t->last_eval = eval_missed ? UINT64_MAX : t->step;
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
int pw__regroup_initial(trainer_t *t) {
    int rc = agree(t);
    return rc && !fatal(rc) ? regroup(t) : rc;
}

/* Look at the servers' map when the store adopted another one since the last look (force:
 * now), parsing its text: t->loss_rolls_back, whether a lost connection calls for a job rollback
 * (see DESIGN): the map names no backup and every server it lists has a role. A text that
 * cannot be read whole (memory, or it grew between the two reads) is looked at again next time.
 * Once a step under rollback: one counter read unless the map changed. */
static void look_map(trainer_t *t, bool force) {
    const pw_emb_ops_t *ops = t->emb->ops;
    if (!ops->map_text)
        return;
    const uint64_t seen = ops->map_refreshes(t->emb); /* read first: the text is as new */
    if (!force && seen == t->seen_refreshes)
        return;
    const size_t len = ops->map_text(t->emb, NULL, 0);
    char *text = pc_smalloc(PC_MEM_SCRATCH, len + 1);
    pc_cluster_map_t *m = NULL;
    char err[128];
    if (text && ops->map_text(t->emb, text, len + 1) <= len &&
        pc_cmap_parse(text, &m, err, sizeof err) == 0) {
        t->loss_rolls_back = pc_cmap_unreplicated(m); /* a rollback restores each one */
        t->seen_refreshes = seen;
    }
    pc_cmap_destroy(m);
    pc_sfree(text);
}

/* The servers' count of slots whose rows went back, as the store's map has it (0: local). */
static uint64_t unclean_now(trainer_t *t) {
    return t->emb->ops->unclean_slots ? t->emb->ops->unclean_slots(t->emb) : 0;
}

void pw__losses_start(trainer_t *t) {
    t->seen_reconnects = t->emb->ops->reconnects(t->emb);
    t->seen_push_fails = atomic_load(&t->server_push_fails);
    t->seen_unclean = unclean_now(t);
    look_map(t, true);
}

/* Whether the count grew since the last look (not taken: pw__rows_went_back says it). */
static bool unclean_grew(trainer_t *t) {
    return unclean_now(t) > t->seen_unclean;
}

/* With rollback_on_server_loss, after the servers' checkpoint calls: whether a server may have
 * restarted before its call was answered (then its checkpoint holds its own older rows, not the
 * cut's). A round trip to every server on this worker's connections, made before the cut or
 * since the last look, fails on one to a server that restarted, or finds a reconnect; either
 * asks for a rollback (pw__server_lost). */
static bool server_restarted(trainer_t *t) {
    const pw_emb_ops_t *ops = t->emb->ops;
    if (t->c->on_server_loss != PW_SERVER_LOSS_ROLLBACK || !ops->ping || !t->loss_rolls_back)
        return false;
    char why[256];
    const int rc = ops->ping(t->emb, (int)t->c->timeout_ms, why, sizeof why);
    if (!rc && ops->reconnects(t->emb) == t->seen_reconnects)
        return false;
    PC_WARN("train: the checkpoint after step %llu is not published: a server connection was lost "
            "while it was taken%s%s",
            (unsigned long long)t->step, rc ? ": " : "", why);
    t->want_rollback = true;
    return true;
}

/* A coordinated checkpoint after step t->step (pw_jobckpt.h). The members first agree that
 * every one recorded its position (else no checkpoint: one would hold a stale position), that
 * none saw the servers' count of unclean promotions grow (rows went back: no checkpoint of
 * them; pw__rows_went_back says so next) and, with rollback_on_server_loss and no replicas,
 * that none lost a server connection since the last look (else no checkpoint, and the job rolls
 * back at the step's pw__server_lost); they
 * then wait for rank 0 with a timeout long enough for every server's checkpoint call. Collective
 * errors are returned (the caller regroups); a failed checkpoint is only logged. */
int pw__job_checkpoint(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    const int wait_ms = servers_wait_ms(c);
    /* [0]: members whose position is recorded; [1]: members that lost a server connection
     * since the last look (pw__server_lost): that server may have restarted from an older
     * checkpoint of its own and already taken this cut's last pushes on top of it, so a cut now
     * would record its older rows as the job's; no checkpoint then: the job rolls back. */
    float v[2] = {t->pos_saved ? 1.0f : 0.0f, pw__server_lost(t) || unclean_grew(t) ? 1.0f : 0.0f};
    int rc = pw_coll_allreduce_sum(pw_group_coll(t->grp), v, 2);
    if (!rc && v[1] > 0) {
        PC_WARN("train: no coordinated checkpoint after step %llu: a server connection was lost, "
                "or rows went back (an unclean promotion), since the last one",
                (unsigned long long)t->step);
        return 0;
    }
    const float saved = v[0];
    if (rc || pw_group_rank(t->grp) != 0)
        return rc ? rc : pw_coll_barrier(pw_group_coll(t->grp), wait_ms);
    const uint64_t t0 = pc_time_mono_ns();
    pw_jobckpt_t *ck = pc_scalloc(PC_MEM_MODEL, 1, sizeof *ck);
    const size_t n = dense_state(t, NULL, false);
    float *state = pc_smalloc(PC_MEM_MODEL, n * sizeof *state);
    int ck_rc = !ck || !state ? PC_ENOMEM : saved < (float)pw_group_size(t->grp) ? PC_EUNAVAIL : 0;
    if (!ck_rc) {
        ck->step = t->step;
        ck->nranks = (size_t)c->world;
        snprintf(ck->run, sizeof ck->run, "%s", pw_group_run_name(t->grp));
        for (int r = 0; r < c->world && !ck_rc; r++) { /* lost ranks: their last position */
            uint64_t step;
            ck_rc = pw_group_offset_load(t->grp, r, &step, &ck->positions[r]);
            if (ck_rc == PC_ENOTFOUND)
                ck_rc = 0, ck->positions[r] = 0;
        }
    }
    const psg_opts_t sec = grpc_sec(c);
    if (!ck_rc)
        ck_rc = pw_jobckpt_servers(c->server_grpc, &sec, c->timeout_ms, ck);
    const bool restarted = !ck_rc && server_restarted(t); /* not published: a rollback */
    if (!ck_rc && t->emb->ops->map_text &&
        t->emb->ops->map_text(t->emb, ck->map, sizeof ck->map) >= sizeof ck->map)
        ck->map[0] = '\0'; /* too long to keep: a replica then asks the servers */
    if (!ck_rc && !restarted) {
        dense_state(t, state, true);
        ck_rc = pw_jobckpt_write(c->ckpt_dir, ck, state, n, t->model, &t->card, 2);
    }
    if (ck_rc)
        PC_ERROR("train: the checkpoint after step %llu failed: %s (training goes on)",
                 (unsigned long long)t->step, pc_strerror(ck_rc));
    else if (!restarted) /* else server_restarted said why */
        PC_INFO("train: checkpoint after step %llu in %s (%zu servers) in %.2f s",
                (unsigned long long)t->step, c->ckpt_dir, ck->nservers, pc_time_sec_since(t0));
    pc_sfree(ck);
    pc_sfree(state);
    return pw_coll_barrier(pw_group_coll(t->grp), wait_ms);
}

/* Start from the latest coordinated checkpoint: the dense state, and *skip = this rank's
 * position. */
int pw__resume_checkpoint(trainer_t *t, uint64_t *skip) {
    pw_jobckpt_t *ck;
    float *state;
    int rc = read_checkpoint(t, 0, false, &ck, &state);
    if (!rc) {
        pw_publish_t *pub = pw__publisher(t); /* the servers restored it: later models go */
        if (pub)
            pw_publish_abandon(pub, ck->step);
        /* and later steps' checkpoints, as a rollback's: one renamed into place before LATEST
         * named it (a crash in between) stayed the newest model version, its server checkpoints
         * abandoned, and was written again by the resumed run */
        if (t->c->rank == 0)
            pw_jobckpt_abandon_after(t->c->ckpt_dir, ck->step);
        take_checkpoint(t, ck, state, skip);
        t->resumed = true;
        t->resumed_step = ck->step;
        snprintf(t->resumed_run, sizeof t->resumed_run, "%s", ck->run);
    }
    pc_sfree(ck);
    pc_sfree(state);
    return rc;
}

/* The position a restart may resume from: done_pos, or, asynchronous, the start of the oldest
 * batch with a push not answered yet (an applied round does not wait for its pushes there; a
 * crash would have lost those of up to a ring of batches, unread again). A batch read again
 * may push some rows twice: at least once, never lost (as in sync). */
static uint64_t pushed_pos(trainer_t *t) {
    uint64_t pos = t->done_pos;
    for (int i = 0; t->staleness == PW_ASYNC && i < t->nslots; i++) {
        const slot_t *s = &t->slots[i];
        bool out = false;
        for (size_t k = 0; k < s->npush && !out; k++)
            out = !pw_sched_done(t->sched, &s->push[k].job);
        if (out && s->pos0 < pos)
            pos = s->pos0;
    }
    return pos;
}

/* Record this worker's position (after its last applied step whose pushes are answered,
 * pushed_pos) at the coordinator when it changed. A failed save: training goes on (the group's
 * connections are peer to peer), the next try a second later (force: now); a restart would
 * resume from an older position, and no checkpoint is taken meanwhile. */
void pw__save_position(trainer_t *t, bool force) {
    if (t->grp)
        pw_group_progress(t->grp, t->step);
    if (!t->grp || (!t->pos_dirty && t->pos_saved) ||
        (!force && pc_time_mono_ns() < t->pos_retry_ns))
        return;
    const uint64_t pos = pushed_pos(t);
    if (t->pos_saved && pos < t->done_pos && pos == t->pos_last)
        return; /* held back by the same pushes as at the last save: nothing new to record */
    int rc = pw_group_offset_save(t->grp, t->step, pos);
    if (rc && t->pos_saved)
        PC_WARN("train: cannot record this worker's position at the coordinator: %s",
                pc_strerror(rc));
    t->pos_saved = rc == 0;
    t->pos_last = pos;
    t->pos_dirty = rc != 0 || pos < t->done_pos; /* (the rest, once its pushes are answered) */
    t->pos_retry_ns = rc ? pc_time_mono_ns() + 1000000000ull : 0;
}

int pw__rows_went_back(trainer_t *t) {
    const uint64_t n = unclean_now(t);
    /* a smaller count is a map history started anew (servers restarted on an empty
     * coordinator): growth is counted from it */
    const uint64_t more = n > t->seen_unclean ? n - t->seen_unclean : 0;
    t->seen_unclean = n;
    if (!more)
        return 0;
    t->unclean_slots = more > UINT64_MAX - t->unclean_slots ? UINT64_MAX : t->unclean_slots + more;
    const bool stop = t->c->on_server_loss == PW_SERVER_LOSS_ROLLBACK;
    PC_ERROR("train: the servers count %llu more slots whose rows went back (promoted to a "
             "backup that had not caught up, or held alone by a server that restarted from its "
             "checkpoint): rows of them may be older than the pushes acknowledged, some back at "
             "their initial values; %s",
             (unsigned long long)more,
             stop ? "the job stops (--on-server-loss=rollback): a lost server's part of the "
                    "checkpoint cannot be restored while the job runs; restart the job from the "
                    "latest coordinated checkpoint (servers --restore-id, workers "
                    "--resume=checkpoint)"
                  : "training goes on (--on-server-loss=continue)");
    return stop ? PC_EIO : 0;
}

/* With rollback_on_server_loss: whether this worker wants a job rollback: a connection to a
 * server was lost since the last look (the client reconnected: the server may have restarted
 * from an older checkpoint of its own), or a push's connection was lost (the worker may make no
 * call after it that would reconnect: its data ran out), and the map at the look before
 * it called for a rollback (look_map, DESIGN), or an earlier want is still pending. */
bool pw__server_lost(trainer_t *t) {
    if (!t->grp || t->c->on_server_loss != PW_SERVER_LOSS_ROLLBACK)
        return false;
    if (t->want_rollback)
        return true;
    const bool rolls_back = t->loss_rolls_back; /* as the map was before this loss */
    look_map(t, false);
    const uint64_t reconnects = t->emb->ops->reconnects(t->emb);
    const uint64_t fails = atomic_load(&t->server_push_fails);
    if (reconnects == t->seen_reconnects && fails == t->seen_push_fails)
        return false;
    t->seen_reconnects = reconnects;
    t->seen_push_fails = fails;
    if (!rolls_back) {
        PC_INFO("train: a server connection was lost; the servers have replicas: no rollback (a "
                "failover keeps every acknowledged push, or counts the slots it cannot)");
        return false;
    }
    t->want_rollback = true;
    PC_WARN("train: a server connection was lost: rolling the job back to its latest coordinated "
            "checkpoint");
    return true;
}

/* A collective failed (a peer died) or a newer generation was proposed: stop the ordered lane
 * (its collectives cannot complete; pulls gated on its rounds fail with it), let the server
 * calls finish, re-form the group and agree on the dense state (regroup). The rounds in flight
 * are dropped: their pushes that were sent are applied once, those gated on the ordered lane
 * never go (counted as lost when their slot is settled), their dense gradients are lost, their
 * batches count as read. The batches read but not computed are renumbered from the agreed step
 * and pulled again (after a job rollback: dropped, the reader starts again from the
 * checkpoint's position). After a round's pushes failed for good (push_refused) the job stops
 * instead: that code is returned. */
int pw__pipeline_regroup(trainer_t *t) {
    const int refused = atomic_load(&t->push_refused);
    if (refused) /* every member learnt it from the round's mark: each stops (run_mark) */
        return refused;
    pw_sched_abort_ordered(t->sched, PC_ECANCELED);
    /* The publisher goes, what it had pending included, before the group re-forms: a rank 0
     * demoted, or left out (taken over, shrunk out: its run ends with the failure), would write
     * an older step after the new rank 0 published, and prune the newer versions. Rank 0 of the
     * new group opens one again at its next step (pw__publisher) and offers a version at once
     * (pub_due): a schedule by seconds alone would wait its whole interval again. */
    t->pub_due = t->pub != NULL;
    pw_publish_discard(t->pub);
    t->pub = NULL;
    t->dropped_batches = 0;
    for (uint64_t id = t->applied; id < t->next_round; id++) { /* the rounds not applied */
        const round_t *r = &t->rounds[id % (uint64_t)t->nrounds];
        if (r->has_pos) {
            t->done_pos = r->pos;
            t->pos_dirty = true;
            t->dropped_batches++;
        }
    }
    atomic_store(&t->coll_broken, false);
    int rc = regroup(t);
    if (rc)
        return rc;
    t->next_round = t->applied = t->step;
    pw__stops_formed(t);
    if (t->reposition) /* rolled back: the batches read ahead are read again later */
        t->filled = 0;
    for (int i = 0; i < t->filled; i++) {
        slot_t *s = &t->slots[(t->head + i) % t->nslots];
        s->round = t->step + (uint64_t)i;
        pw__slot_pull(t, s);
    }
    return 0;
}
