/* pw_train_int.h: the trainer's state, shared by its three files (not a public header):
 *
 *   pw_train.c     the loop: set-up, read ahead, the step, progress, evaluation, the end
 *   pw_pipeline.c  slots, rounds, chunks: every call to the store and the group, through the
 *                  scheduler
 *   pw_recover.c   the dense state, the group's agreement, rollback, coordinated checkpoints,
 *                  positions
 *   pw_telemetry.c what the loop publishes after each step: /metrics and the metrics log
 *
 * DESIGN
 * - The slot ring: slots[head] holds the batch of step next_round, the `filled` slots after it
 *   the batches read ahead (their rows pulled ahead, up to `ahead`). A slot owns a copy of the
 *   reader's batch (backend host memory: pinned on a GPU), its unique keys and rows, and the
 *   scheduler jobs that move them: one pull, push chunks. A slot is refilled only once the
 *   pushes of its last step were acknowledged.
 * - The round ring: round r carries step r's dense gradients through the group (allreduce chunks
 *   in the order the next forward needs them) and a marker that waits for step r's pushes
 *   (sync, ssp) and sums the has-batch flags. With push_order rank, turns between them: turn k
 *   ends once rank k's pushes were acknowledged, and rank k + 1's pushes wait for it. Rounds
 *   are applied in order (apply_rounds); the staleness gate: step t's pull waits for round
 *   t - stale - 1.
 * - The step (pw_step.h) owns the device buffers: slot s is staged into set (s->round & 1), so
 *   the next slot uploads while this one computes.
 * - Threads: everything here is the training thread's, except what the scheduler's threads touch
 *   while a job runs (a job's slot or round, the store's callbacks, the group's collectives in
 *   the ordered lane: coll_broken and lost_pushes are atomic for them).
 */
#ifndef PW_TRAIN_INT_H
#define PW_TRAIN_INT_H

#include "pw_coll.h"
#include "pw_emb.h"
#include "pw_group.h"
#include "pw_jobckpt.h"
#include "pw_model.h"
#include "pw_model_card.h"
#include "pw_publish.h"
#include "pw_reader.h"
#include "pw_sched.h"
#include "pw_step.h"
#include "pw_telemetry.h"
#include "pw_train.h"
#include "pw_unique.h"

#include <stdatomic.h>
#include <stdio.h>

struct trainer;

/* A step's batch on its way through the pipeline: a copy of the reader's batch, its unique keys
 * (ukeys; inv[j]: the index of feature j's key), their pulled rows and summed gradients, and the
 * jobs that move them (pw_sched.h). */
typedef struct slot {
    struct trainer *t;
    uint64_t round; /* the step it is computed as */
    uint64_t pos;   /* the reader's position after this batch */
    uint64_t pos0;  /* and before it (async: the position recorded while its pushes are out) */
    pw_batch_t b;   /* the batch without its features' keys (keys NULL: the step reads ukeys) */
    size_t ncap, dcap, kcap; /* labels and key_off; dense; fields, vals, inv, ukeys */
    uint64_t *ukeys;
    uint32_t *inv;
    size_t nu, ucap; /* ucap: urows, ugrads (the backend's host memory: pinned on a GPU) */
    float *urows, *ugrads;
    pw_job_t pull;  /* keys [0, npull) */
    pw_job_t pull2; /* split: keys [npull, nu), those the step before pushes (after its first
                     * push: submitted with that round) */
    size_t npull;
    bool pull2_due; /* split: pull2 is to be submitted (with the round before) */
    bool staged;    /* its inputs are on the backend (the step's set round & 1) */
    /* split (t->split, see pw_pipeline.c): the slot's keys as a set (once `indexed`), and which
     * of them the next slot's batch has (in_next: set when that slot splits its keys) */
    pw_unique_t set;
    bool indexed;
    uint8_t *in_next;
    uint32_t *perm;    /* split: scratch (the keys' new places) */
    uint64_t *pkeys;   /* split: the pushed keys, those in the next batch first; scratch before */
    float *pgrads;     /* split: their gradients */
    size_t push_first; /* split: pkeys[0, push_first) are in the next batch (one push first) */
    struct pchunk *push;
    size_t npush, pcap;
} slot_t;

typedef struct pchunk { /* a push of n keys of a slot, from keys and grads */
    pw_job_t job;
    slot_t *s;
    const uint64_t *keys;
    const float *grads;
    size_t n;
    bool sent;      /* its call started (else its gate failed and it never ran) */
    uint32_t epoch; /* the generation fence its call was started under (t->epoch then) */
} pchunk_t;

/* A step's round (see DESIGN). Its sum: the group's dense gradients, and one float for the turns
 * (push_order rank); in device memory (dflat) when the generation sums on the devices
 * (t->dcoll), else in host memory (hflat). Its mark's flag is a host float whatever the
 * generation (the mark reads and writes it on the scheduler's thread, which must not use the
 * backend), summed on the host. */
typedef struct round {
    struct trainer *t;
    uint64_t id;
    uint64_t pos; /* the reader position after its batch */
    bool has_pos; /* it had a batch */
    slot_t *slot; /* whose pushes the marker waits for (NULL: none) */
    float *dflat; /* nflat + 1 floats of device memory (the backend has dcoll), or NULL */
    float *hflat; /* nflat + 1 floats of host memory */
    bool dev;     /* it sums dflat on the devices (its generation formed t->dcoll), else hflat */
    float flag;   /* 1 when this worker had a batch, + PUSH_FAILED when its pushes failed; the
                   * mark makes it the group's sum: the members with a batch (run_mark) */
    int members;  /* the group's size when it was submitted: its dense sum's divisor, as the
                   * pushes' gradients were scaled by 1 / members (step_run) */
    struct dchunk *chunks;
    pw_job_t *turns; /* push_order rank: turn k waits for rank k's pushes (world - 1 of them;
                      * NULL with arrival order) */
    int nturns, me;  /* turns submitted; this worker's rank in them */
    pw_job_t mark;
} round_t;

typedef struct dchunk { /* an allreduce of the round's sum [off, off + n) */
    pw_job_t job;
    round_t *r;
    size_t off, n;
} dchunk_t;

typedef struct trainer {
    const pw_train_config_t *c;
    pw_format_t fmt;
    pw_csv_spec_t csv;    /* the csv setting, parsed */
    pw_model_card_t card; /* the model's settings (pw_model_card_from_config) */
    int staleness;        /* the mode setting: 0 sync, S for ssp:S, PW_ASYNC */
    pw_backend_t *be;
    pw_model_t *model;
    pw_step_t *st;
    pw_emb_t *emb;       /* the embedding store */
    pw_group_t *grp;     /* world > 1: the workers' group (membership, collectives) */
    pw_dcoll_t *dcoll;   /* this generation's dense allreduce on the devices (NCCL), or NULL:
                          * Gloo on the host (pw__dcoll_decide) */
    pw_sched_t *sched;   /* every call to the store and the group */
    pw_telemetry_t *tel; /* /metrics and the metrics log: published after every step */
    pw_publish_t *pub;   /* publish_dir: the dense publisher (NULL: not opened yet) */
    bool pub_off;        /* it could not be opened: publishing stays off */
    bool pub_due;        /* the publisher was discarded (a regroup): the next version now */
    /* the pipeline (pw_pipeline.c) */
    size_t nflat; /* dense gradients */
    int stale;    /* rounds a step may run ahead of the group (sync 0) */
    bool split;   /* a lone worker in sync: the next batch's keys pulled in two parts */
    int ahead;    /* batches pulled ahead of the one computing */
    slot_t *slots;
    int nslots, head, filled;
    round_t *rounds; /* ring by round id */
    int nrounds;
    dchunk_t *plan; /* the chunks of a round (offsets, priorities) */
    int nplan;
    uint64_t next_round, applied; /* rounds submitted, rounds applied */
    atomic_ullong lost_pushes;
    atomic_ullong server_push_fails; /* of those, pushes whose connection was lost (push_done) */
    atomic_int push_refused; /* a round's pushes refused by a server (not a transient failure):
                              * the code (this worker's, PC_EIO for another's); the job stops */
    atomic_bool coll_broken; /* an ordered-lane collective failed (until the group re-forms) */
    atomic_bool fenced;      /* a push was refused as of a generation the group left (PC_EFENCED) */
    atomic_uint epoch;       /* the generation fence this worker's pushes carry (0: none) */
    bool waiting_servers;    /* warned that the servers are unavailable (until they answer) */
    FILE *step_log;
    uint64_t max_ahead;
    uint64_t early_rows, pulled_rows; /* pw_train_result_t's */
    double pull_wait_s;
    /* recovery (pw_recover.c) */
    uint64_t step;            /* dense optimizer steps taken (distributed: the group's count) */
    bool has_state;           /* the dense model is trained state (not a restarted worker's) */
    uint64_t restart_step;    /* a restarted worker: the step its recorded position was at */
    uint64_t done_pos;        /* position after the last applied round with a batch */
    bool pos_dirty;           /* done_pos not recorded at the coordinator yet */
    uint64_t pos_last;        /* the position last recorded (async: done_pos or before it) */
    bool pos_saved;           /* this worker's last position reached the coordinator */
    uint64_t pos_retry_ns;    /* after a failed save, the next try waits until then */
    uint64_t seen_reconnects; /* the store's reconnects when last looked at (rollback) */
    uint64_t seen_push_fails; /* server_push_fails then */
    uint64_t seen_unclean;    /* the store's unclean_slots at the last look (pw__rows_went_back) */
    uint64_t unclean_slots;   /* its growth since the start */
    bool loss_rolls_back;     /* a lost connection calls for a job rollback (look_map) */
    uint64_t seen_refreshes;  /* the store's map_refreshes when look_map last parsed */
    bool want_rollback;       /* this worker saw a server connection lost */
    bool dcoll_said;          /* the job was told its dense allreduce goes through the host */
    int dcoll_failed;         /* generations in a row whose device allreduce did not form, or
                               * formed and never summed (NCCL connects lazily: a /dev/shm too
                               * small fails the first allreduce, not the formation) */
    atomic_bool dcoll_worked; /* this generation's device allreduce summed once (coll_sum) */
    bool reposition;          /* a rollback: read again from reposition_at (the loop reopens) */
    uint64_t reposition_at, rollbacks;
    uint64_t rolled_back_steps; /* the last rollback's: their samples are not in the model, */
    uint64_t dropped_batches;   /* nor those of the rounds its regroup dropped */
    uint64_t last_ckpt;         /* the step of the last coordinated checkpoint tried (or the step a
                                 * group agreed on, pw__pipeline_regroup: every member skips a
                                 * checkpoint due there, so that all enter the same collectives) */
    uint64_t last_eval;         /* the round of the last mid-run evaluation in a group (or the
                                 * step a group agreed on, as last_ckpt, unless the evaluation
                                 * due there was not taken: pw__pipeline_regroup) */
    uint64_t eval_taken;        /* the round of this worker's last mid-run evaluation (0: none) */
    uint64_t rank0_eval_taken;  /* group rank 0's eval_taken when the group formed (sync_state) */
    bool evaluates;             /* this worker has a test stream */
    uint64_t eval_rounds;       /* a group's rounds between mid-run evaluations: its rank 0's
                                 * (sync_state), 0: none */
    bool resumed;               /* started from a coordinated checkpoint (--resume=checkpoint) */
    uint64_t resumed_step;      /* its step, and its run ("" unknown) */
    char resumed_run[PW_JOBCKPT_RUN_MAX];
} trainer_t;

/* ---- pw_recover.c: where a generation sums its dense gradients ---- */
enum { PW_DCOLL_ENTRY = 4 }; /* floats per member */
/* Generations in a row whose device allreduce did not form after which a member stops offering
 * it (the group sums on the host for the rest of the job: a firewall on NCCL's ports, a /dev/shm
 * too small, would otherwise re-form the group for ever). */
enum { PW_DCOLL_TRIES = 3 };
/* A member's entry: 1 when its backend has device collectives and it still offers them
 * (`offered`), then its device identity's hash in three 21-bit parts (exact in a float); all
 * zero otherwise. */
void pw__dcoll_entry(const pw_backend_t *be, bool offered, float out[PW_DCOLL_ENTRY]);
/* From the n members' entries (v: n x PW_DCOLL_ENTRY): whether every member has device
 * collectives and no two share a device (NCCL needs one device per member); else why not. */
bool pw__dcoll_choose(const float *v, int n, char *why, size_t cap);

/* ---- pw_pipeline.c ---- */
int pw__pipeline_init(trainer_t *t);
void pw__pipeline_free(trainer_t *t);
/* A read (pull, lookup: first tried at t0) ended with rc: true when it is to be tried again
 * after a pause (a server down, within server_retry_ms). Logs the wait (naming the server) and
 * giving up; while waiting, the group's heartbeats carry it (pw_group_note). */
bool pw__server_retry(trainer_t *t, int rc, uint64_t t0);
/* Why the store's call failed with rc: its detail (the server and its message), else the
 * code's message; in buf. */
const char *pw__store_why(trainer_t *t, int rc, char *buf, size_t cap);
/* Evaluation's read-only lookup, waiting for servers that are down like a pull. */
int pw__lookup(trainer_t *t, const uint64_t *keys, size_t n, float *rows);
/* Copy batch b (from a reader with dedup: its unique keys come with it) into slot s. */
int pw__slot_fill(trainer_t *t, slot_t *s, const pw_batch_t *b);
void pw__slot_pull(trainer_t *t, slot_t *s);
int pw__slot_rows(trainer_t *t, slot_t *s);
/* Whether slot s's rows are all there (pulled, no failure): it may be staged. */
bool pw__slot_pulled(trainer_t *t, slot_t *s);
int pw__slot_stage(trainer_t *t, slot_t *s);
/* Wait for the slot's pushes before it is refilled: pushes whose gate failed (a dropped round)
 * count as lost; a push that ran and failed is returned. */
int pw__slot_settle(trainer_t *t, slot_t *s);
/* pw__slot_settle of every slot: the first error. */
int pw__slots_settle(trainer_t *t);
/* Submit round next_round: the dense gradients now in the layers (group), whether this worker
 * had a batch, slot s's pushes (NULL: none) and the marker that waits for them (sync, ssp).
 * PC_ENOMEM (nothing submitted). */
int pw__round_submit(trainer_t *t, slot_t *s, bool had_batch);
int pw__apply_rounds(trainer_t *t, int64_t wait_upto, bool wait_all, bool *stop);
void pw__apply_dense(trainer_t *t);
void pw__log_step(trainer_t *t, uint64_t round, const char *what);

/* ---- pw_train.c ---- */
/* The dense publisher (pw_publish.h), on the group's rank 0 only (NULL elsewhere, without
 * --publish-dir, or when it cannot open). It is opened by the first worker that publishes (a
 * rank 0 chosen later, after a shrink, opens its own then; opening clears a crash's leftovers,
 * which must not happen under a publishing rank 0's feet); a failure to open is logged once and
 * publishing stays off. */
pw_publish_t *pw__publisher(trainer_t *t);

/* ---- pw_recover.c ---- */
/* Distributed: connect to the group (world > 1). */
int pw__group_join(trainer_t *t);
int pw__regroup_initial(trainer_t *t);
/* A collective failed or a newer generation was proposed: re-form, agree, pull again. */
int pw__pipeline_regroup(trainer_t *t);
/* The group's round stops once it formed at t->step (at start, a restart included, and after a
 * regroup), alike on every member: a checkpoint due at this step is skipped (a member that met
 * the new generation before it and one that tried it first would disagree on taking it); an
 * evaluation due here is taken unless rank 0 had taken it (the agreement's rank0_eval_taken: a
 * regroup before it skipped it, and one taken, its barrier failed on a long evaluation, is not
 * taken again). */
void pw__stops_formed(trainer_t *t);
int pw__job_checkpoint(trainer_t *t);
int pw__resume_checkpoint(trainer_t *t, uint64_t *skip);
/* XXH3 of the dense state as a group's members exchange it; 0 when out of memory. */
uint64_t pw__dense_digest(trainer_t *t);
void pw__save_position(trainer_t *t, bool force);
bool pw__server_lost(trainer_t *t);
/* After the store connected and the group formed: the reconnects and unclean slots so far are
 * no losses; whether the servers run with replicas. */
void pw__losses_start(trainer_t *t);
/* Whether the servers' unclean promotions grew since the last look: logged and counted
 * (t->unclean_slots); PC_EIO with rollback_on_server_loss (the job stops), else 0. */
int pw__rows_went_back(trainer_t *t);

#endif
