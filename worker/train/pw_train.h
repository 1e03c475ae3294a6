/* pw_train.h: training: local (ps-worker --local: one worker, an in-process embedding table) or
 * distributed (against ps-servers through libpsclient, dense gradients allreduced among workers).
 *
 * Each step takes a batch from the reader, pulls the embeddings of its unique keys from the
 * embedding store (pw_emb.h: the servers, or with `local_store` an in-process table; missing keys
 * start from their initial rows), runs the model's step (pw_step.h: forward, backward), pushes
 * the embedding gradients (duplicates summed; the store's optimizer applies them, as a server
 * would) and steps the dense optimizer. Evaluation reads a test stream with lookups (read-only:
 * the test set never inserts rows) and reports the exact AUC and the logloss. The files:
 * pw_train.c (the loop), pw_pipeline.c (slots, rounds, jobs), pw_recover.c (group agreement,
 * rollback, checkpoints); their shared state: pw_train_int.h.
 *
 * Models: "dlrm" (pw_dlrm.h; one embedding of `dim` per categorical field: the field's features
 * pooled, sum or mean, weighted by their values), "deepfm" (pw_deepfm.h: rows [w, v_1 .. v_dim]
 * shared by an FM and an MLP over the dense features and the pooled v per field; widths from
 * `top`), "fm" (pw_fm.c: the same rows, plus a linear term over the dense features) and "lr" (a
 * weight per feature, dim-1 table, plus the same dense linear term): models behind one table of
 * functions (pw_model.h). FM and LR work on features
 * (any number per sample); DLRM and DeepFM need the field count: from the format (Criteo 26, CSV
 * its categorical columns, libsvm 1) or `fields`. Streams without dense features (libsvm,
 * libffm, CSV without numeric columns) get one constant 1 as their dense input, so the dense
 * part still learns a bias (for DLRM, a learned vector that interacts with every field).
 *
 * Distributed (`servers` set): the embedding table `table_name` lives on the servers (created
 * there with the same dim: `dim` for DLRM, dim + 1 for FM/DeepFM, 1 for LR; a mismatch is
 * PC_EDIM at start, as is a setting of `table` the servers' table does not have). Every worker
 * claims the table for the job's run before training (pw_emb.h): rows another job trained are
 * refused (PC_EOWNED) unless `warm_start` (train them further) or `fresh` (empty the table
 * first); `world` workers (ranks 0..world-1) each read their share of the files (file i goes to
 * rank i % world). Each batch's keys are made unique and their rows pulled through the
 * communication scheduler (pw_sched.h: pulls first, then the dense allreduce chunks, then pushes,
 * under a credit limit; `fifo` for submission order); the summed gradients of the unique keys
 * are pushed in chunks, scaled by 1/size of the group. Step t's round: its dense gradients
 * allreduced in chunks (the layers the next forward needs first) and a marker that waits for
 * step t's pushes (not in async) and sums the has-batch flags. Rounds are applied in order on
 * every worker (the dense optimizer steps with the group's sum divided by its size, as the
 * pushes were scaled: a worker without a batch adds zeros to both).
 * Consistency (`staleness`): step t's pull waits for round t - S - 1 and that round is applied
 * before step t computes; sync is S = 0 (bulk synchronous: every worker's pushes of step t - 1
 * applied before any pull of step t, and no push of step t sent before every worker's pull of
 * step t was answered: the pushes wait for the round's first allreduce; with a server optimizer
 * linear in the gradient, 2 workers with batch b train the same model as 1 worker with batch 2b
 * over the interleaved data, to float rounding), ssp:S lets a worker run at most S steps ahead of
 * the slowest and pulls `pull_ahead` (<= S) batches ahead, async does not wait for pushes and
 * applies dense rounds up to `async_window` steps late. A worker without a group in sync
 * (`--local`, whose mode is always sync, or one worker on servers without a coordinator) with
 * pull_ahead >= 1, on a table with no admission, row budget, cold tier or expiry, reads one
 * batch ahead and pulls the rows its step before does not push while that step computes, the
 * rest after that step's first push: the serial model to the last bit for f32 rows
 * (pw_pipeline.c). A worker whose data ran out joins rounds
 * with no gradient until a round in which no worker had a batch. The group's rank 0 evaluates the
 * test stream at the end (lookups: the servers' rows are not changed), writes its predictions
 * when asked (`predictions`: the probability of every test sample, one per line, in the test
 * stream's order, written atomically) and saves what is asked.
 * `step_log`: a line "rank step start|end ns" (CLOCK_MONOTONIC) when a step starts computing and
 * when its pushes were acknowledged.
 *
 * Worker failures: after every step a worker records its reader position at the coordinator.
 * When a collective fails (a peer died), the survivors re-form the group (pw_group_recover: they
 * wait rejoin_timeout_ms for the lost worker, then go on without it when `shrink`); the rounds in
 * flight are dropped (their pushes went out; their dense gradients are lost) and the batches read
 * ahead are pulled again. A worker restarted with its rank
 * rejoins: it reads its data from its recorded position (the batch it was in when it died is
 * read again; its pushes may have been applied once already) and, like every member of a newly
 * formed group, takes the dense state (weights, optimizer state, step count) of the member with
 * the most steps. The servers keep the embeddings throughout.
 *
 * Coordinated checkpoints (ckpt_every steps, pw_jobckpt.h): after step S every worker has
 * recorded its position; a barrier; the group's rank 0 has every server write a checkpoint and
 * writes the dense state, the servers' ids and every data rank's position under ckpt_dir; a
 * barrier (no push of S + 1 reaches a server before its cut). A failed checkpoint is logged and
 * training goes on (the previous one stays the latest). resume=checkpoint: every worker starts
 * from the latest one's dense state and its rank's position (the servers restarted from the
 * listed ids): the job rolled back as a whole.
 *
 * Server failures: pulls and lookups that find a server down (PC_EUNAVAIL, PC_ETIMEDOUT) are
 * tried again every 200 ms for up to server_retry_ms (a restarted server restores its last
 * checkpoint); a push that fails so is not sent again (the servers that answered applied their
 * part; a restarted server lost it anyway): counted in lost_pushes, training goes on. A push
 * that fails otherwise (refused by a server) stops the job on every worker. With
 * on_server_loss=rollback, once the servers answer again the worker that saw a connection to a
 * server lost proposes a new generation; in it every member learns of the loss (an allreduce),
 * the group's rank 0 has every server restore its checkpoint of the latest coordinated one
 * (gRPC Restore) and every worker loads that checkpoint's dense state and reads its data again
 * from that checkpoint's position: servers and workers agree again, at step S.
 *
 * Serving (publish_dir): the group's rank 0 (a lone worker, local too) publishes its dense model
 * every publish_every steps or publish_every_s seconds, with the model card and a watermark of
 * the servers' delta streams read after the step's pushes were acknowledged (pw_publish.h: a
 * thread of its own writes them; training only copies the weights); and at the end.
 *
 * Progress lines (stderr, every progress_every samples): samples, samples/s, loss, and the ETA
 * when the size is known (a sample budget, or uncompressed files). With eval_every, the test
 * stream is evaluated every that many samples too (AUC and logloss on stderr; in a group, at a
 * round every member stops at, the others waiting for rank 0's up to eval_timeout_ms). The same
 * figures and the pipeline's (pull waits, scheduler queues and credits, generation, rollbacks,
 * reconnects) are published after every step (pw_telemetry.h): on Prometheus /metrics at
 * metrics_host:metrics_port while the run lasts, and as JSON lines in metrics_log (a row per
 * progress line and per evaluation; `psctl plot` draws them).
 *
 * Thread rule: a trainer is used by one thread.
 */
#ifndef PW_TRAIN_H
#define PW_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_backend.h"
#include "pw_emb.h"
#include "pw_parse.h"

/* The trainer's settings, declared once (pw_train_settings: name, type, bounds, default, help)
 * and read by ps-worker from flags, a file or the environment. Storage types are the settings
 * table's: int64_t, double, int for a choice (the enums below), bool, char[]. */
typedef enum { PW_POOL_SUM, PW_POOL_MEAN } pw_pooling_t;
typedef enum { PW_RESUME_POSITION, PW_RESUME_CHECKPOINT } pw_resume_t;
typedef enum { PW_WORKER_LOSS_SHRINK, PW_WORKER_LOSS_WAIT } pw_worker_loss_t;
typedef enum { PW_SERVER_LOSS_CONTINUE, PW_SERVER_LOSS_ROLLBACK } pw_server_loss_t;
typedef enum { PW_ORDER_PRIORITY, PW_ORDER_FIFO } pw_order_t;
typedef enum { PW_PUSH_ARRIVAL, PW_PUSH_RANK } pw_push_order_t;

typedef struct pw_train_config {
    /* the model */
    char model[16];       /* "dlrm", "deepfm", "fm" or "lr" */
    int64_t dim;          /* embedding dim (dlrm), factor dim (fm, deepfm) */
    int64_t fields;       /* categorical fields (0: from the format) */
    int pooling;          /* pw_pooling_t: of a field's features */
    char bottom[128];     /* dlrm bottom widths, "64,16" (last = dim) */
    char top[128];        /* dlrm top / deepfm MLP widths, "128,64,1" (last = 1) */
    char table[512];      /* embedding table settings (ps_table.h): the local store's; the
                           * servers' table must match them */
    bool fresh;           /* servers: empty a table another job trained, then train */
    bool warm_start;      /* servers: train further the rows another job left */
    int dense_optimizer;  /* pw_opt_kind_t */
    double dense_lr;      /* its learning rate */
    int64_t seed;         /* initial values */
    char load_dense[512]; /* start from this dense model file (pw_model_io.h), "" none */
    /* the data */
    char csv[2048];        /* the column spec of CSV streams (pw_csv_spec_parse) */
    int64_t batch;         /* samples per step */
    int64_t epochs;        /* passes over the training data */
    int64_t max_samples;   /* 0: no limit */
    double max_error_rate; /* malformed lines a file may have, a fraction (pw_reader.h's rule) */
    int64_t parse_threads; /* threads parsing files beside the reader (pw_reader.h; -1: auto) */
    /* reporting and results */
    int64_t progress_every;  /* samples between progress lines on stderr, 0: none */
    int64_t eval_every;      /* samples between evaluations of the test stream, 0: at the end */
    int64_t eval_timeout_ms; /* a group's members wait this long for rank 0's evaluation */
    char save_dense[512];    /* save the dense model here after training, "" none */
    char predictions[512];   /* the final evaluation's predicted probabilities, one per line
                              * in test-stream order ("%.9g"; the evaluating rank), "" none */
    char publish_dir[512];   /* publish the dense model for serving here (pw_publish.h), "" off */
    int64_t publish_every;   /* steps between published versions (0: by seconds only) */
    double publish_every_s;  /* seconds between them (0: by steps only; whichever first) */
    int64_t publish_keep;    /* versions kept */
    char export_embeddings[512]; /* export the local table (with optimizer state), "" none */
    char step_log[512];          /* append every step's start and end times here ("" none) */
    int64_t metrics_port;        /* Prometheus /metrics (pw_telemetry.h): -1 off, 0 any port */
    char metrics_host[64];       /* the address it listens on */
    char metrics_log[512];       /* append a JSON line per progress line and evaluation ("" none) */
    /* distributed training (servers[0] != 0) */
    char servers[4096];        /* a cluster map text, or host:port of any server */
    char table_name[64];       /* the servers' embedding table */
    char token[256];           /* the servers' token (data plane HELLO, gRPC), "" none */
    char tls_ca[512];          /* PEM CA that the servers' certificates chain to: TLS on */
    char tls_cert[512];        /* PEM client certificate (servers that want one), "" none */
    char tls_key[512];         /* its private key */
    int wire_dtype;            /* PSC_WIRE_*: rows and gradients on the wire (f32, bf16, f16) */
    char coordinator[256];     /* host:gRPC port of the coordinator (world > 1) */
    char job[64];              /* key prefix of this job at the coordinator */
    char host[64];             /* this worker's address as its peers reach it */
    int64_t rank, world;       /* this worker, of world */
    int64_t timeout_ms;        /* every server call and collective */
    int64_t rejoin_timeout_ms; /* survivors wait this long for a lost worker (pw_group.h) */
    int64_t lease_ms;          /* membership lease at the coordinator (heartbeats) */
    int on_worker_loss;        /* pw_worker_loss_t: then go on without it, or keep waiting */
    int64_t server_retry_ms;   /* pulls wait this long for servers that are down */
    int64_t ckpt_every;        /* steps between coordinated checkpoints (pw_jobckpt.h), 0: none */
    char ckpt_dir[512];        /* where the group's rank 0 writes them */
    char server_grpc[4096];    /* the servers' gRPC addresses, comma-separated, map order */
    int resume;                /* pw_resume_t: a restarted worker goes on from its position, or
                                * the job starts from the latest coordinated checkpoint */
    int on_server_loss;        /* pw_server_loss_t: roll the job back to the latest coordinated
                                * checkpoint while it runs (docs/training.md) */
    char mode[16];             /* consistency: "sync", "async" or "ssp:S" */
    int64_t pull_ahead;        /* batches whose rows are pulled ahead (at most the staleness) */
    int64_t async_window;      /* async: rounds in flight at most (a buffer limit) */
    int64_t credit_kib;        /* KiB in flight at most (pw_sched.h) */
    int64_t chunk_kib;         /* pushes and dense allreduce go in chunks of at most this */
    int order;                 /* pw_order_t: by priority, or submission order (the baseline) */
    int push_order;            /* pw_push_order_t: sync: a step's pushes as they come, or one
                                * worker after another in rank order (reproducible) */
    /* not settings: the caller's */
    pw_backend_t *backend;      /* borrowed: the dense math's device (NULL: the CPU) */
    pw_emb_open_fn local_store; /* without servers: opens the in-process embedding store
                                 * (pw_emb_local_open, library ember_worker_local) */
} pw_train_config_t;

#define PW_ASYNC (-1)

/* "sync" -> 0, "async" -> PW_ASYNC, "ssp:S" (1 <= S <= 1000) -> S; else PC_EINVAL. */
int pw_train_mode_parse(const char *s, int *staleness);

/* The settings table over pw_train_config_t (*n entries; a static table). */
struct pc_setting;
const struct pc_setting *pw_train_settings(size_t *n);

/* Every setting's default (the pointers NULL). */
void pw_train_config_defaults(pw_train_config_t *c);

/* What the readers counted for one file (pw_reader_source_t): lines read (not blank lines or
 * CSV headers), samples (lines that parsed: trained on unless max_samples ended the run first,
 * as the reader reads a few batches ahead) and malformed lines. */
typedef struct pw_train_file {
    const char *path; /* borrowed: the caller's train or test path */
    uint64_t lines, samples, bad;
} pw_train_file_t;

#define PW_TRAIN_FILES_MAX 256
#define PW_TRAIN_ERROR_MAX 768

typedef struct pw_train_result {
    uint64_t samples;
    double seconds, samples_per_s;
    double train_loss;   /* moving average of the batch losses (weight 0.99) */
    double auc, logloss; /* on the test stream at the end (NaN when none) */
    int evals;           /* evaluations run (periodic and final) */
    uint64_t test_samples;
    uint64_t table_rows;    /* local training only */
    uint64_t steps;         /* optimizer steps taken (distributed: the group's count) */
    double first_step_s;    /* from the start to this worker's first completed step */
    uint64_t lost_pushes;   /* pushes a server failure cut short (not sent again) */
    uint64_t rollbacks;     /* job rollbacks taken part in (rollback_on_server_loss) */
    uint64_t unclean_slots; /* slots the servers promoted to a backup not caught up meanwhile */
    uint64_t max_ahead;     /* most steps this worker ran ahead of the slowest (<= staleness) */
    double pull_wait_s;     /* time the training thread waited for pulled rows */
    uint64_t early_rows;    /* rows pulled while the step before computed (a lone worker in
                             * sync: those it did not push) */
    uint64_t pulled_rows;   /* rows pulled, in all */
    uint64_t pulled_bytes, pushed_bytes, dense_bytes;
    /* XXH3 of this rank's final dense state (weights, optimizer state, step count): the ranks
     * of a synchronous job end with the same one (0: not computed) */
    uint64_t dense_digest;
    /* per file (the first PW_TRAIN_FILES_MAX): this rank's training files, over every epoch
     * (from the resume position on), and the test files of the last evaluation */
    pw_train_file_t train_files[PW_TRAIN_FILES_MAX], test_files[PW_TRAIN_FILES_MAX];
    size_t ntrain_files, ntest_files;
    char error[PW_TRAIN_ERROR_MAX]; /* a failed run's data error in one line naming the file
                                     * ("" when the code says all, or it was logged) */
} pw_train_result_t;

/* Train on `train` paths, then evaluate on `test` paths (ntest may be 0). Format as given.
 * PC_EINVAL for a bad configuration; reader errors (PC_EIO, PC_EPARSE) stop training, and a
 * training share (started from its beginning) or a test set without one usable sample is
 * PC_EPARSE: res->error then says which file and why (the reader's reason, the counts, the
 * first malformed line, a hint about the format when no line parsed);
 * distributed: server errors (PC_EUNAVAIL, PC_ETIMEDOUT, PC_EDIM, PC_ENOTFOUND for a missing
 * table) and collective errors (a peer gone: PC_EUNAVAIL / PC_ETIMEDOUT) stop it too. */
int pw_train_run(const pw_train_config_t *c, pw_format_t fmt, const char *const *train,
                 size_t ntrain, const char *const *test, size_t ntest, pw_train_result_t *res);

#endif
