/* pw_train.c: the training loop (pw_train.h): set-up, reading ahead, the step, progress,
 * evaluation and the end of a run.
 *
 * DESIGN
 * - One loop on the training thread. Each turn: fill the slot ring up to `ahead` batches past
 *   the one due (each slot's pull submitted, gated by staleness), re-form the group when a newer
 *   generation was proposed, apply the rounds that are due (the staleness gate), take a
 *   coordinated checkpoint when one is due, wait for the due slot's rows, stage and run its step
 *   (pw_step.h; the next slot staged while it computes), push its gradients and submit its
 *   round. A worker without a batch joins rounds with no gradient until no worker has one.
 * - Failures come back as a failed round or a failed collective: the loop calls
 *   pw__pipeline_regroup (pw_recover.c) and goes on from the agreed step.
 * - What lives where: the rings and jobs in pw_pipeline.c, the group's state and checkpoints in
 *   pw_recover.c, the step's device buffers in pw_step.c, rows in the store (pw_emb.h).
 */
#include "pw_train.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_log.h"
#include "pc_settings.h"
#include "pc_time.h"
#include "pc_wire.h"
#include "pw_metrics.h"
#include "pw_train_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- settings ---- */

static const char *const k_pooling[] = {"sum", "mean", NULL};
static const char *const k_optimizers[] = {"sgd", "adagrad", "adam", NULL}; /* pw_opt_kind_t */
static const char *const k_worker_loss[] = {"shrink", "wait", NULL};
static const char *const k_resume[] = {"position", "checkpoint", NULL};
static const char *const k_server_loss[] = {"continue", "rollback", NULL};
static const char *const k_order[] = {"priority", "fifo", NULL};
static const char *const k_push_order[] = {"arrival", "rank", NULL};    /* pw_push_order_t */
static const char *const k_wire_dtype[] = {"f32", "bf16", "f16", NULL}; /* PSC_WIRE_* */

#define T pw_train_config_t
static const pc_setting_t k_settings[] = {
    PC_SETTING_STRING(T, servers, "", "the servers: a cluster map, or host:port of any server"),
    PC_SETTING_STRING(T, table_name, "emb", "the servers' embedding table"),
    PC_SETTING_SECRET(T, token, "the servers' token (ps-server --token)"),
    PC_SETTING_STRING(T, tls_ca, "",
                      "PEM CA bundle the servers' certificates chain to: connect with TLS"),
    PC_SETTING_STRING(T, tls_cert, "", "PEM client certificate (servers with tls_client_auth)"),
    PC_SETTING_STRING(T, tls_key, "", "PEM private key of tls_cert"),
    PC_SETTING_ENUM(T, wire_dtype, k_wire_dtype, "f32",
                    "rows and gradients between this worker and the servers: f32 (exact) | bf16 "
                    "| f16 (half the bytes, rounded; the servers' tables stay f32: docs/wire.md "
                    "Compressed rows)"),
    PC_SETTING_STRING(T, coordinator, "",
                      "the coordinator (world > 1): host:gRPC port of a ps-server --coordinator, "
                      "or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcds:// for TLS)"),
    PC_SETTING_INT(T, rank, 0, 4095, "0", "this worker's rank"),
    PC_SETTING_INT(T, world, 1, 4096, "1", "workers in the job"),
    PC_SETTING_STRING(T, job, "emberps", "the job's key prefix at the coordinator"),
    PC_SETTING_STRING(T, host, "127.0.0.1", "this worker's address as its peers reach it"),
    PC_SETTING_INT(T, timeout_ms, 100, 3.6e6, "30000", "server calls and collectives time out"),
    PC_SETTING_INT(T, rejoin_timeout_ms, 100, 3.6e6, "60000",
                   "how long survivors wait for a lost worker to come back"),
    PC_SETTING_INT(T, lease_ms, 100, 3.6e6, "10000",
                   "membership lease at the coordinator (a heartbeat every lease / 4)"),
    PC_SETTING_INT(T, server_retry_ms, 0, 3.6e6, "60000",
                   "how long pulls wait for servers that are down (restarting)"),
    PC_SETTING_INT(T, ckpt_every, 0, 1e15, "0",
                   "steps between coordinated checkpoints (0: none; needs --ckpt-dir, "
                   "--server-grpc)"),
    PC_SETTING_STRING(T, ckpt_dir, "", "where coordinated checkpoints go (all workers reach it)"),
    PC_SETTING_STRING(T, server_grpc, "",
                      "the servers' gRPC addresses, comma-separated, in cluster-map order"),
    PC_SETTING_ENUM(T, resume, k_resume, "position",
                    "position (a restarted worker continues where it was) | checkpoint (the "
                    "whole job starts from the latest coordinated checkpoint)"),
    PC_SETTING_ENUM(T, on_server_loss, k_server_loss, "continue",
                    "after a lost server connection: continue, or roll the job back to its "
                    "latest coordinated checkpoint (needs --ckpt-every)"),
    PC_SETTING_ENUM(T, on_worker_loss, k_worker_loss, "shrink",
                    "after that: shrink (go on without it) | wait (keep waiting)"),
    PC_SETTING_STRING(T, mode, "sync",
                      "sync | async | ssp:S (no worker more than S steps ahead of the slowest)"),
    PC_SETTING_INT(T, pull_ahead, 0, 64, "2",
                   "batches whose rows are pulled ahead (async, ssp: at most S; a lone "
                   "worker in sync: 0 off, else one batch's rows the step before does not "
                   "push, while it computes)"),
    PC_SETTING_INT(T, async_window, 1, 1000, "2",
                   "async: dense rounds in flight at most (their gradients apply that late)"),
    PC_SETTING_ENUM(T, order, k_order, "priority",
                    "what is sent first: priority (pulls, then dense layers the next forward "
                    "needs first, then pushes) | fifo (submission order)"),
    PC_SETTING_ENUM(T, push_order, k_push_order, "arrival",
                    "sync: the servers get a step's pushes as they arrive, or rank by rank (each "
                    "worker pushes once the lower ranks' pushes were acknowledged: the same run "
                    "gives the same model; one more collective per worker and step)"),
    PC_SETTING_INT(T, credit_kib, 16, 1 << 22, "4096", "KiB in flight at most"),
    PC_SETTING_INT(T, chunk_kib, 4, 1 << 20, "256",
                   "pushes and dense allreduce go in chunks of this many KiB"),
    PC_SETTING_STRING(T, step_log, "", "append every step's start and end time (ns) here"),
    PC_SETTING_INT(T, metrics_port, -1, 65535, "-1",
                   "Prometheus /metrics port of this worker while it trains (-1: off, 0: any free "
                   "port, logged at info)"),
    PC_SETTING_STRING(T, metrics_host, "127.0.0.1",
                      "the address /metrics listens on (0.0.0.0: every interface)"),
    PC_SETTING_STRING(T, metrics_log, "",
                      "append a JSON line per progress line and per evaluation here (psctl plot "
                      "draws it)"),
    PC_SETTING_STRING(T, csv, "",
                      "CSV column spec, e.g. header=1,threshold=4,columns=cat:cat:label:skip"),
    PC_SETTING_STRING(T, model, "dlrm", "dlrm | deepfm | fm | lr"),
    PC_SETTING_INT(T, dim, 1, 1023, "16", "embedding dim (dlrm), factor dim (fm, deepfm)"),
    PC_SETTING_INT(T, fields, 0, 1024, "0", "categorical fields (0: from the format)"),
    PC_SETTING_ENUM(T, pooling, k_pooling, "sum", "pooling of multi-valued fields: sum | mean"),
    PC_SETTING_STRING(T, bottom, "64,16", "dlrm bottom MLP widths (last = dim)"),
    PC_SETTING_STRING(T, top, "128,64,1", "dlrm top / deepfm MLP widths (last = 1)"),
    PC_SETTING_STRING(T, table, "",
                      "embedding table settings (ps-server --help-tables): --local's table is "
                      "made with them (the rest: the table defaults); with --servers, the servers' "
                      "table must have them (checked at start)"),
    PC_SETTING_BOOL(T, fresh, "false",
                    "--servers: start from new rows when the table holds another job's (the "
                    "table is emptied)"),
    PC_SETTING_BOOL(T, warm_start, "false",
                    "--servers: train further the rows another job left in the table"),
    PC_SETTING_ENUM(T, dense_optimizer, k_optimizers, "adam", "sgd | adagrad | adam"),
    PC_SETTING_DOUBLE(T, dense_lr, 0, 100, "0.003", "dense learning rate"),
    PC_SETTING_INT(T, batch, 1, 1 << 20, "1024", "samples per step"),
    PC_SETTING_INT(T, epochs, 1, 1000, "1", "passes over the training data"),
    PC_SETTING_INT(T, max_samples, 0, 1e15, "0", "stop after this many samples (0: no limit)"),
    PC_SETTING_DOUBLE(T, max_error_rate, 0, 1, "0.01",
                      "the fraction of a file's lines that may be malformed (checked at its end, "
                      "and once it has 1000 lines)"),
    PC_SETTING_INT(T, parse_threads, -1, PW_READER_PARSE_THREADS_MAX, "-1",
                   "threads parsing the data files beside the reader thread (0: the reader "
                   "thread parses; -1: a quarter of the CPUs this worker may use, at most 4)"),
    PC_SETTING_INT(T, seed, 0, 9.2e18, "1", "seed of the model's initial values"),
    PC_SETTING_INT(T, progress_every, 0, 1e15, "100000", "samples between progress lines"),
    PC_SETTING_INT(T, eval_every, 0, 1e15, "0", "samples between evaluations (0: at the end)"),
    PC_SETTING_INT(T, eval_timeout_ms, 100, 8.64e7, "3600000",
                   "in a group, how long the members wait for rank 0's evaluation (--eval-every)"),
    PC_SETTING_STRING(T, load_dense, "", "start from this dense model file"),
    PC_SETTING_STRING(T, save_dense, "", "save the dense model here after training"),
    PC_SETTING_STRING(T, publish_dir, "",
                      "publish the dense model for serving replicas here: DIR/dense-<step>/ "
                      "with model, card and watermark (\"\": off)"),
    PC_SETTING_INT(T, publish_every, 0, 1e15, "100",
                   "steps between published dense models (0: by --publish-every-s only)"),
    PC_SETTING_DOUBLE(T, publish_every_s, 0, 1e6, "0",
                      "seconds between published dense models (0: by steps only; whichever "
                      "comes first)"),
    PC_SETTING_INT(T, publish_keep, 1, 1000, "3", "published dense models kept"),
    PC_SETTING_STRING(T, predictions, "",
                      "write the final evaluation's predicted probability of every test sample "
                      "here, one per line in test-stream order (the evaluating rank)"),
    PC_SETTING_STRING(T, export_embeddings, "", "export the embedding table (row file) here"),
};
#undef T
#define NSETTINGS (sizeof k_settings / sizeof k_settings[0])

const pc_setting_t *pw_train_settings(size_t *n) {
    *n = NSETTINGS;
    return k_settings;
}

void pw_train_config_defaults(pw_train_config_t *c) {
    memset(c, 0, sizeof *c);
    if (pc_settings_defaults(k_settings, NSETTINGS, c))
        abort(); /* a default violates its own bounds: a bug in the table above */
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

/* ---- set-up ---- */

static int check_config(const pw_train_config_t *c) {
    if ((c->ckpt_every || c->resume == PW_RESUME_CHECKPOINT) &&
        (!c->servers[0] || !c->coordinator[0] || !c->ckpt_dir[0] ||
         (c->ckpt_every && !c->server_grpc[0]))) {
        PC_ERROR("train: coordinated checkpoints need servers, a coordinator, a checkpoint "
                 "directory and (to write them) the servers' gRPC addresses");
        return PC_EINVAL;
    }
    if (!pw_jobckpt_list_ok(c->server_grpc)) {
        PC_ERROR("train: --server-grpc=%s has an empty entry: give each server's gRPC address, "
                 "in --servers' order",
                 c->server_grpc);
        return PC_EINVAL;
    }
    if (c->on_server_loss == PW_SERVER_LOSS_ROLLBACK && !c->ckpt_every) {
        PC_ERROR("train: rolling back on a server loss needs coordinated checkpoints "
                 "(--ckpt-every, --ckpt-dir, --server-grpc)");
        return PC_EINVAL;
    }
    if (c->servers[0] && (c->world < 1 || c->rank < 0 || c->rank >= c->world ||
                          (c->world > 1 && !c->coordinator[0]))) {
        PC_ERROR("train: rank %lld of world %lld%s", (long long)c->rank, (long long)c->world,
                 c->world > 1 && !c->coordinator[0] ? " needs a coordinator" : " is invalid");
        return PC_EINVAL;
    }
    if (!c->servers[0] && !c->local_store) {
        PC_ERROR("train: no embedding store: give servers, or a local store (--local)");
        return PC_EINVAL;
    }
    if (c->publish_dir[0] && !c->publish_every && !(c->publish_every_s > 0)) {
        PC_ERROR("train: --publish-dir needs --publish-every (steps) or --publish-every-s");
        return PC_EINVAL;
    }
    if (c->fresh && c->warm_start) {
        PC_ERROR("train: --fresh (new rows) and --warm-start (the rows there) exclude each other");
        return PC_EINVAL;
    }
    return 0;
}

/* Claim the servers' table for this job run (pw_emb.h): the run's name at the coordinator, or,
 * for a worker on its own, a name no other process has. */
static int claim_table(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    char job[160], host[64] = "", msg[1024];
    if (t->grp) {
        snprintf(job, sizeof job, "%s", pw_group_run_name(t->grp));
    } else { /* (the host cut to fit a claim's job name, PC_WIRE_JOB_MAX: the pid and time make
              * it unique) */
        gethostname(host, sizeof host - 1);
        char tail[48];
        const int nt =
            snprintf(tail, sizeof tail, ":%d:%lld", (int)getpid(), (long long)time(NULL));
        const int room = PC_WIRE_JOB_MAX - (int)strlen(c->job) - 1 - nt;
        snprintf(job, sizeof job, "%s@%.*s%s", c->job, room > 0 ? room : 0, host, tail);
    }
    const int mode = c->fresh        ? PW_CLAIM_FRESH
                     : c->warm_start ? PW_CLAIM_WARM_START
                                     : PW_CLAIM_CHECK;
    int rc = t->emb->ops->claim(t->emb, job, mode, c->table, msg, sizeof msg);
    if (rc == PC_EOWNED)
        PC_ERROR("train: %s. --warm-start trains those rows further; --fresh empties the table "
                 "first (as psctl reset %s on every server does); or use another --table-name",
                 msg, c->table_name);
    else if (rc)
        PC_ERROR("train: %s", msg);
    return rc;
}

/* The settings that are text (mode, csv) parsed; the model, its store, the group, the step and
 * the pipeline. */
static int trainer_init(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    t->be = c->backend ? c->backend : pw_backend_cpu();
    int rc = check_config(c);
    if (rc)
        return rc;
    pw_telemetry_opts_t to = {.host = c->metrics_host,
                              .port = (int)c->metrics_port,
                              .log_path = c->metrics_log,
                              .model = c->model,
                              .rank = (int)c->rank};
    if ((rc = pw_telemetry_open(&to, &t->tel)))
        return rc;
    char err[256];
    if (pw_train_mode_parse(c->mode, &t->staleness)) {
        PC_ERROR("train: --mode=%s: sync, async or ssp:S (S from 1 to 1000)", c->mode);
        return PC_EINVAL;
    }
    if (c->push_order == PW_PUSH_RANK && t->staleness != 0) {
        PC_ERROR("train: --push-order=rank needs --mode=sync (steps of other modes overlap)");
        return PC_EINVAL;
    }
    if (t->fmt == PW_FMT_CSV && pw_csv_spec_parse(c->csv, &t->csv, err, sizeof err)) {
        PC_ERROR("train: --csv: %s", err);
        return PC_EINVAL;
    }
    if ((rc = pw_model_card_from_config(c, t->fmt, &t->card)))
        return rc;
    const pw_model_ops_t *ops;
    if ((rc = pw_model_find(c->model, &ops)))
        return rc;
    pw_emb_opts_t eo = {.dim = t->card.row_dim,
                        .timeout_ms = (int)c->timeout_ms,
                        .servers = c->servers,
                        .table = c->table_name,
                        .token = c->token,
                        .tls_ca = c->tls_ca,
                        .tls_cert = c->tls_cert,
                        .tls_key = c->tls_key,
                        .wire_dtype = c->wire_dtype,
                        .table_spec = c->table,
                        .seed = (uint64_t)c->seed,
                        .zero_rows = ops->zero_rows};
    if ((rc = c->servers[0] ? pw_emb_remote_open(&eo, &t->emb) : c->local_store(&eo, &t->emb)))
        return rc;
    if (c->servers[0] && c->coordinator[0] && (rc = pw__group_join(t)))
        return rc;
    if (t->emb->ops->claim && (rc = claim_table(t)))
        return rc;
    if ((rc = pw_model_create(&t->card.model, t->be, &t->model)))
        return rc;
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, (pw_opt_kind_t)c->dense_optimizer);
    oc.lr = (float)c->dense_lr;
    pw_step_config_t sc = {.be = t->be, .model = t->model, .ndense = t->card.ndense, .opt = &oc};
    if ((rc = pw_step_create(&sc, &t->st)))
        return rc;
    if (c->load_dense[0] && (rc = pw_model_load(t->model, c->load_dense)))
        PC_ERROR("train: cannot load the dense model %s: %s", c->load_dense, pc_strerror(rc));
    return rc ? rc : pw__pipeline_init(t);
}

static void trainer_free(trainer_t *t) {
    pw_publish_close(t->pub); /* writes what is pending; its thread uses the store */
    pw__pipeline_free(t);     /* first of the rest: its jobs use the store and the group */
    if (t->dcoll)
        t->be->dcoll->destroy(t->dcoll);
    pw_step_destroy(t->st);
    pw_model_destroy(t->model);
    pw_group_close(t->grp);
    pw_emb_close(t->emb);
    pw_telemetry_close(t->tel); /* last: the loop published into it until here */
}

/* Whether round cur is one a group stops at every `every` rounds, not taken yet (*last: the
 * last one taken; cur from now on). */
static bool stop_due(const trainer_t *t, uint64_t cur, uint64_t every, uint64_t *last) {
    if (!t->grp || !every || cur % every || cur == *last)
        return false;
    *last = cur;
    return true;
}

/* The coordinated checkpoint of round `cur`, when it is one: a consistent cut, every round
 * before cur applied and every push acknowledged (async rounds do not wait for their pushes:
 * the slots' are waited for here). Every member takes it at that round, one whose data ran out
 * too (its empty rounds stand in the same collectives: a member that went on to the round's
 * allreduce instead would meet the others' checkpoint barrier). 0 with *again false: go on;
 * *again: the group re-formed, start the step over; else a fatal error. */
static int ckpt_round(trainer_t *t, uint64_t cur, bool *stop, bool *again) {
    *again = false;
    if (!stop_due(t, cur, (uint64_t)t->c->ckpt_every, &t->last_ckpt))
        return 0;
    int rc = pw__apply_rounds(t, 0, true, stop);
    if (!rc)
        rc = pw__slots_settle(t);
    if (!rc)
        pw__save_position(t, true);
    if (rc || (rc = pw__job_checkpoint(t)))
        *again = !(rc = pw__pipeline_regroup(t));
    return rc;
}

static int open_reader(const trainer_t *t, const char *const *paths, size_t n, int epochs,
                       bool training, uint64_t skip, pw_reader_t **r) {
    const pw_train_config_t *c = t->c;
    pw_reader_opts_t o = {.format = t->fmt,
                          .csv = &t->csv,
                          .paths = paths,
                          .npaths = n,
                          .rank = training ? (uint32_t)c->rank : 0,
                          .world = training ? (uint32_t)c->world : 1,
                          .batch = (size_t)c->batch,
                          .queue = 4,
                          .epochs = epochs,
                          .max_error_rate = c->max_error_rate,
                          .skip_lines = skip,
                          .tcp_end_idle_ms = 1000,
                          .parse_threads = (int)c->parse_threads,
                          .dedup = training,
                          .fields = t->model ? (uint32_t)pw_model_fields(t->model) : 0};
    return pw_reader_open(&o, r);
}

/* ---- data accounting ---- */

/* Add what reader r counted for each of its files (of paths[0..n): this rank's share) to
 * files[] (those files in order, the first PW_TRAIN_FILES_MAX), borrowing the paths. */
static void count_files(pw_reader_t *r, const char *const *paths, size_t n, pw_train_file_t *files,
                        size_t *nfiles) {
    size_t k = 0;
    for (size_t i = 0; i < n && k < PW_TRAIN_FILES_MAX; i++) {
        pw_reader_source_t st;
        if (pw_reader_source_stats(r, i, &st))
            continue;
        pw_train_file_t *f = &files[k++];
        f->path = paths[i];
        f->lines += st.lines;
        f->samples += st.samples;
        f->bad += st.bad;
    }
    *nfiles = k;
}

/* The end of a stream of n paths read by r: its error rc (0 when it ended normally) and, for one
 * that ended without a usable sample (when `need_sample`: read from its beginning, and this rank
 * has files), PC_EPARSE. The one-line reason goes to why (the reader's, or the counts and the first
 * malformed line) with a hint about the format when no line parsed; the code is returned. */
static int stream_end(const trainer_t *t, pw_reader_t *r, size_t n, int rc, bool need_sample,
                      char *why, size_t len) {
    uint64_t lines = 0, samples = 0, bad = 0;
    size_t nmine = 0, all_bad = 0;
    const char *name = NULL;
    pw_reader_source_t first = {.first_bad_line = 0}, st;
    for (size_t i = 0; i < n; i++) {
        if (pw_reader_source_stats(r, i, &st))
            continue;
        name = name ? name : st.path;
        nmine++;
        lines += st.lines;
        samples += st.samples;
        bad += st.bad;
        all_bad += st.lines && !st.samples;
        if (st.first_bad_line && !first.first_bad_line)
            first = st;
    }
    int len0;
    if (rc) {
        len0 = snprintf(why, len, "%s", pw_reader_error_text(r));
        if (!why[0] || rc != PC_EPARSE)
            return rc;
    } else {
        if (samples || !need_sample || !nmine)
            return 0;
        rc = PC_EPARSE;
        char more[48] = "";
        if (nmine > 1)
            snprintf(more, sizeof more, " (and %zu more files)", nmine - 1);
        len0 = snprintf(why, len, "%s%s: no usable samples: %llu lines read, %llu malformed", name,
                        more, (unsigned long long)lines, (unsigned long long)bad);
        if (first.first_bad_line && len0 >= 0 && (size_t)len0 < len)
            len0 += snprintf(why + len0, len - (size_t)len0, " (first: %s%s%s)",
                             nmine > 1 ? first.path : "", nmine > 1 ? " " : "", first.first_bad);
    }
    if (all_bad && len0 >= 0 && (size_t)len0 < len)
        snprintf(why + len0, len - (size_t)len0, "; every line malformed: %s match the file?",
                 t->fmt == PW_FMT_CSV ? "do --format and --csv" : "does --format");
    return rc;
}

/* The predictions p[0..n) to path, one "%.9g" per line (a float's exact value), atomically.
 * Errors are logged. */
static int write_predictions(const char *path, const float *p, size_t n) {
    const size_t cap = n * 16 + 1; /* "-1.23456789e-38\n" at most */
    char *buf = pc_smalloc(PC_MEM_BATCH, cap);
    if (!buf)
        return PC_ENOMEM;
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%.9g\n", (double)p[i]);
    int rc = pc_fs_write_atomic(path, buf, len);
    pc_sfree(buf);
    if (rc)
        PC_ERROR("train: cannot write the predictions to %s: %s", path, pc_strerror(rc));
    return rc;
}

/* Evaluate on the test stream: exact AUC and logloss over every sample (lookups: the store's rows
 * are not changed); the final one writes the predictions when asked. */
static int evaluate(trainer_t *t, const char *const *test, size_t ntest, bool final,
                    pw_train_result_t *res) {
    size_t cap = 1 << 16, n = 0;
    float *p = pc_smalloc(PC_MEM_BATCH, cap * sizeof *p),
          *y = pc_smalloc(PC_MEM_BATCH, cap * sizeof *y);
    pw_reader_t *tr = NULL;
    int rc = p && y ? open_reader(t, test, ntest, 1, false, 0, &tr) : PC_ENOMEM;
    for (const pw_batch_t *b; !rc && (b = pw_reader_next(tr));) {
        const size_t nk = b->key_off[b->n];
        float *rows = NULL;
        if ((rc = pw_step_check(t->st, b)) ||
            (rc = (rows = pw_step_eval_rows(t->st, nk)) ? 0 : PC_ENOMEM) ||
            (rc = pw__lookup(t, b->keys, nk, rows)))
            break;
        if (n + b->n > cap) {
            cap = 2 * (n + b->n);
            float *np = pc_srealloc(PC_MEM_BATCH, p, cap * sizeof *p),
                  *ny = pc_srealloc(PC_MEM_BATCH, y, cap * sizeof *y);
            if (np)
                p = np;
            if (ny)
                y = ny;
            if (!np || !ny) {
                rc = PC_ENOMEM;
                break;
            }
        }
        if ((rc = pw_step_eval(t->st, b, p + n)))
            break;
        memcpy(y + n, b->labels, b->n * sizeof *y);
        n += b->n;
    }
    if (tr) {
        memset(res->test_files, 0, sizeof res->test_files);
        count_files(tr, test, ntest, res->test_files, &res->ntest_files);
        if (!rc)
            rc = stream_end(t, tr, ntest, pw_reader_error(tr), true, res->error, sizeof res->error);
        pw_reader_close(tr);
    }
    if (!rc) {
        res->test_samples = n;
        res->auc = pw_auc(p, y, n);
        res->logloss = pw_logloss(p, y, n);
        res->evals++;
        pw_telemetry_eval(t->tel, res->auc, res->logloss, n);
        if (final && t->c->predictions[0])
            rc = write_predictions(t->c->predictions, p, n);
    }
    pc_sfree(p);
    pc_sfree(y);
    return rc;
}

/* A mid-run evaluation (--eval-every) and its line on stderr. */
static int evaluate_mid(trainer_t *t, const char *const *test, size_t ntest,
                        pw_train_result_t *res) {
    const int rc = evaluate(t, test, ntest, false, res);
    if (!rc)
        fprintf(stderr, "eval: after %llu samples: AUC %.4f, logloss %.4f (%llu samples)\n",
                (unsigned long long)res->samples, res->auc, res->logloss,
                (unsigned long long)res->test_samples);
    return rc;
}

/* The mid-run evaluation of round `cur` in a group, when it is one (every t->eval_rounds
 * rounds: the group's rank 0's --eval-every, taken by every member when the group formed): every
 * member stops there, every round before cur applied, rank 0 evaluates and the others wait for
 * it at a barrier (eval_timeout_ms; rank 0, arriving last, waits timeout_ms and a server's
 * retry time for a member that hung). Evaluated while the others went on, they waited inside the
 * next round's allreduce, which timed out on a long evaluation and re-formed the group, throwing
 * rounds away. A member out of data stops too (its empty rounds). Returns as ckpt_round does. */
static int eval_round(trainer_t *t, uint64_t cur, const char *const *test, size_t ntest,
                      pw_train_result_t *res, bool *stop, bool *again) {
    *again = false;
    if (!stop_due(t, cur, t->eval_rounds, &t->last_eval))
        return 0;
    const bool evaluator = pw_group_rank(t->grp) == 0;
    int rc = pw__apply_rounds(t, 0, true, stop);
    if (!rc && evaluator && ntest && (rc = evaluate_mid(t, test, ntest, res)))
        return rc; /* the others' barrier fails: they re-form without this member */
    if (!rc && evaluator && ntest)
        t->eval_taken = cur; /* (a regroup at cur does not take it again) */
    /* rank 0 comes last unless a member's pushes still wait for a server (server_retry_ms) */
    const int64_t wait_ms =
        evaluator ? t->c->timeout_ms + t->c->server_retry_ms : t->c->eval_timeout_ms;
    if (rc || (rc = pw_coll_barrier(pw_group_coll(t->grp), (int)wait_ms)))
        *again = !(rc = pw__pipeline_regroup(t));
    return rc;
}

/* The stops of a group's round `cur`: its coordinated checkpoint, then its evaluation, each when
 * due. Returns as they do. */
static int round_stops(trainer_t *t, uint64_t cur, const char *const *test, size_t ntest,
                       pw_train_result_t *res, bool *stop, bool *again) {
    const int rc = ckpt_round(t, cur, stop, again);
    return rc || *again ? rc : eval_round(t, cur, test, ntest, res, stop, again);
}

/* A group's step (every round before it applied): when a server was lost (pw__server_lost),
 * propose a new generation and re-form the group, which rolls the job back (*again: start the
 * step over). A proposal that fails (the coordinator) is tried again at the next step. */
static int rollback_if_lost(trainer_t *t, bool *again) {
    *again = false;
    if (!pw__server_lost(t))
        return 0;
    const int rc = pw_group_reform(t->grp);
    if (rc) {
        PC_WARN("train: cannot propose the rollback's generation: %s", pc_strerror(rc));
        return 0;
    }
    *again = true;
    return pw__pipeline_regroup(t);
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

/* The figures of the step just taken, for /metrics and the metrics log (pw_telemetry.h). */
static void publish(trainer_t *t, pw_reader_t *r, uint64_t samples, double loss, double ema) {
    pw_reader_stats_t rs;
    pw_reader_stats(r, &rs);
    pw_sched_stats_t ss;
    pw_sched_stats(t->sched, &ss);
    pw_telemetry_step_t s = {.step = t->step,
                             .samples = samples,
                             .epoch = rs.epoch,
                             .loss = loss,
                             .loss_ewma = ema,
                             .generation = t->grp ? pw_group_gen(t->grp) : 0,
                             .group_size = t->grp ? pw_group_size(t->grp) : 1,
                             .rollbacks = t->rollbacks,
                             .reconnects = t->emb->ops->reconnects(t->emb),
                             .lost_pushes = atomic_load(&t->lost_pushes),
                             .unclean_slots = t->unclean_slots,
                             .inflight_bytes = ss.inflight_bytes,
                             .credit_bytes = ss.credit_bytes,
                             .pulled_bytes = ss.bytes[PW_JOB_PULL],
                             .pushed_bytes = ss.bytes[PW_JOB_PUSH]};
    for (int i = 0; i < PW_JOB_NCLASS; i++)
        s.queued[i] = ss.queued[i];
    pw_telemetry_publish(t->tel, &s);
}

pw_publish_t *pw__publisher(trainer_t *t) {
    const pw_train_config_t *c = t->c;
    if (!c->publish_dir[0] || t->pub_off || !(t->grp ? pw_group_rank(t->grp) == 0 : c->rank == 0))
        return NULL;
    pw_publish_opts_t po = {.dir = c->publish_dir,
                            .every = c->publish_every,
                            .every_s = c->publish_every_s,
                            .keep = (int)c->publish_keep,
                            .card = &t->card,
                            .emb = t->emb};
    int rc = t->pub ? 0 : pw_publish_open(&po, &t->pub);
    if (rc) {
        PC_ERROR("train: cannot publish the dense model to %s: %s (training goes on)",
                 c->publish_dir, pc_strerror(rc));
        t->pub_off = true;
        return NULL;
    }
    return t->pub;
}

/* After a step (or with `force`, at the end): the dense publisher's turn (pw_publish.h). A lone
 * worker counts a step before its pushes are answered (its pipeline runs ahead: a split pull,
 * ssp): before a version of step S is taken, its rounds before S are applied (their pushes
 * answered), so that the watermark the publisher reads covers them, as a group's does. */
static void publish_dense(trainer_t *t, bool force) {
    pw_publish_t *p = pw__publisher(t);
    force = force || t->pub_due; /* (the pending version a regroup dropped: offered again) */
    if (!p || !pw_publish_due(p, t->step, force))
        return;
    bool stop = false;
    if (!t->grp && t->staleness != PW_ASYNC && t->step &&
        pw__apply_rounds(t, (int64_t)t->step - 1, false, &stop))
        return; /* (the loop meets the failure at its next gate) */
    (void)pw_publish_step(p, t->model, t->step, force); /* failures logged */
    t->pub_due = false;
}

/* A training step on slot s (staged): the step computes, the next slot is staged meanwhile when
 * its rows are there, then the gradients (scaled by 1 / workers) come back to s->ugrads; without
 * a group the dense optimizer then steps (queued behind the copy's wait: a device's loss is known
 * only there). The step's round (its pushes) is submitted once s->ugrads holds them: on host
 * memory before the dense optimizer steps (a lone worker's next step waits for its first push),
 * else after the copy back. A step whose loss is not finite (known after compute on host memory,
 * after the copy back on a device) submits nothing and leaves the dense model as it was. */
static int step_run(trainer_t *t, slot_t *s, slot_t *next, double *loss) {
    const float scale = t->grp ? 1.0f / (float)pw_group_size(t->grp) : 1.0f;
    const bool early = t->be->host_memory;
    int rc = pw_step_compute(t->st, (int)(s->round & 1), scale, s->ugrads);
    if (!rc && early && !pw_step_loss_finite(t->st)) { /* diverged: its gradients go nowhere */
        *loss = NAN;                                   /* (the caller stops the run) */
        return 0;
    }
    if (rc || (early && (rc = pw__round_submit(t, s, true))))
        return rc;
    if (next && !next->staged && pw__slot_pulled(t, next) && (rc = pw__slot_stage(t, next)))
        return rc;
    rc = pw_step_finish(t->st, false, loss);
    if (!rc && !t->grp && isfinite(*loss)) {
        pw_step_apply(t->st);
        t->step++;
    }
    if (rc || early || !isfinite(*loss)) /* a device backend's loss comes back here: diverged, */
        return rc;                       /* its gradients go nowhere (the caller stops the run) */
    return pw__round_submit(t, s, true);
}

int pw_train_run(const pw_train_config_t *c, pw_format_t fmt, const char *const *train,
                 size_t ntrain, const char *const *test, size_t ntest, pw_train_result_t *res) {
    if (!c || !train || !ntrain || c->batch < 1 || c->epochs < 1 || !res)
        return PC_EINVAL;
    memset(res, 0, sizeof *res);
    res->auc = res->logloss = NAN;
    if (c->predictions[0] && !ntest) {
        PC_ERROR("train: --predictions needs a test stream (--test)");
        return PC_EINVAL;
    }
    const uint64_t t0 = pc_time_mono_ns();
    trainer_t t = {.c = c, .fmt = fmt, .has_state = true, .pos_saved = true, .evaluates = ntest};
    int rc = trainer_init(&t);
    uint64_t skip = 0, saved_step = 0;
    if (!rc && t.grp && c->resume == PW_RESUME_CHECKPOINT) { /* the job rolled back */
        if (!(rc = pw__resume_checkpoint(&t, &skip)))
            rc = pw__regroup_initial(&t);
    } else if (!rc && t.grp) { /* a restarted worker continues after its last step */
        rc = pw_group_offset_load(t.grp, (int)c->rank, &saved_step, &skip);
        if (rc == 0) {
            t.has_state = false; /* its dense model comes from a live peer */
            t.restart_step = saved_step;
            PC_WARN("train: rank %lld resumes after step %llu, line %llu of its data",
                    (long long)c->rank, (unsigned long long)saved_step, (unsigned long long)skip);
        }
        rc = rc == PC_ENOTFOUND ? 0 : rc;
        if (!rc)
            rc = pw__regroup_initial(&t);
    }
    pw_reader_t *r = NULL;
    if (!rc)
        rc = open_reader(&t, train, ntrain, (int)c->epochs, true, skip, &r);
    if (rc) {
        trainer_free(&t);
        return rc;
    }
    t.done_pos = skip;
    /* Resumed from a checkpoint: its position is recorded at the first save, also when this rank
     * applies no batch before the next checkpoint (its share used up): the coordinator may hold
     * none (it started empty), or the abandoned run's, which that checkpoint would take. */
    t.pos_dirty = t.grp && c->resume == PW_RESUME_CHECKPOINT;
    /* reconnects and unclean promotions from here on are losses (connecting to late servers is
     * not) */
    pw__losses_start(&t);
    const uint64_t total_bytes = stream_bytes(train, ntrain, (int)c->epochs);
    double ema = NAN;
    uint64_t next_progress = (uint64_t)c->progress_every, next_eval = (uint64_t)c->eval_every;
    pw__stops_formed(&t);
    bool more = true, stop = false, again = false;
    res->first_step_s = NAN;
    t.next_round = t.applied = t.step;
    while (!rc && !stop) {
        if (t.reposition) { /* a job rollback: read again from the checkpoint's position */
            count_files(r, train, ntrain, res->train_files, &res->ntrain_files);
            pw_reader_close(r);
            r = NULL;
            if ((rc = open_reader(&t, train, ntrain, (int)c->epochs, true, t.reposition_at, &r)))
                break;
            t.reposition = false;
            /* the steps thrown away are not counted: samples (and --max-samples) are what the
             * model holds */
            const uint64_t gone = (t.rolled_back_steps + t.dropped_batches) * (uint64_t)c->batch;
            res->samples = res->samples > gone ? res->samples - gone : 0;
            more = true;
            t.done_pos = t.reposition_at;
            t.pos_dirty = true;
        }
        /* Read and pull ahead: slots for steps next_round .. next_round + ahead. A slot is
         * refilled once its pushes are done (sync, ssp: the ring is long enough that they are:
         * its round was done before the step now computing began). */
        while (more && t.filled <= t.ahead) {
            slot_t *s = &t.slots[(t.head + t.filled) % t.nslots];
            if ((rc = pw__slot_settle(&t, s))) /* async: pushes not awaited before */
                break;
            const uint64_t pos0 = pw_reader_consumed(r);
            const pw_batch_t *b =
                c->max_samples && res->samples + (uint64_t)t.filled * (uint64_t)c->batch >=
                                      (uint64_t)c->max_samples
                    ? NULL
                    : pw_reader_next(r);
            if (!b) {
                more = false;
                /* a stream that stopped on an error (too many malformed lines, a file cut
                 * short) stops the run now: in a group, waiting in empty rounds for the others
                 * to run out would leave the rest of this share untrained */
                const int rerr = pw_reader_error(r);
                if (rerr)
                    rc = stream_end(&t, r, ntrain, rerr, false, res->error, sizeof res->error);
                break;
            }
            if ((rc = pw_step_check(t.st, b)) || (rc = pw__slot_fill(&t, s, b)))
                break;
            s->round = t.next_round + (uint64_t)t.filled++;
            s->pos = pw_reader_consumed(r);
            s->pos0 = pos0;
            pw__slot_pull(&t, s);
        }
        if (rc)
            break;
        if (t.grp && (pw_group_stale(t.grp) || atomic_load(&t.fenced))) {
            if ((rc = pw__pipeline_regroup(&t)))
                break;
            continue;
        }
        slot_t *s = &t.slots[t.head];
        if (!t.filled) { /* no batch: the others may have some; stop when no worker has */
            if ((rc = pw__apply_rounds(&t, 0, true, &stop)) || stop || !t.grp) {
                if (rc && t.grp)
                    rc = pw__pipeline_regroup(&t);
                if (!rc && !stop && !t.grp)
                    stop = true;
                continue;
            }
            if ((rc = round_stops(&t, t.next_round, test, ntest, res, &stop, &again)))
                break;
            if (again)
                continue;
            if ((rc = rollback_if_lost(&t, &again)) || again)
                continue; /* (out of data: its last pushes may have failed, see pw__server_lost) */
            publish_dense(&t, false); /* rank 0 out of data: its versions stay on schedule */
            pw__log_step(&t, t.next_round, "start");
            (void)pw__round_submit(&t, NULL, false); /* no slot: nothing to allocate */
            if ((rc = pw__apply_rounds(&t, 0, true, &stop)) && t.grp)
                rc = pw__pipeline_regroup(&t);
            else if (!rc) /* its last batches' rounds applied here: their position is saved, or
                           * a restart during the others' tail read them again */
                pw__save_position(&t, false);
            continue;
        }
        /* The staleness gate: round next_round - stale - 1 done (its pull waited for it too);
         * a failed round means a peer died: re-form the group. A lone worker's split pulls wait
         * for what their rows need (pw_pipeline.c): the round before may still push. */
        const uint64_t cur = t.next_round;
        if ((rc = pw__apply_rounds(&t, (int64_t)cur - t.stale - 1 - t.split, false, &stop))) {
            if (t.grp && !(rc = pw__pipeline_regroup(&t)))
                continue;
            break;
        }
        if ((rc = round_stops(&t, cur, test, ntest, res, &stop, &again)))
            break;
        if (again)
            continue;
        /* Here every round the gate waited for is applied: in sync mode all pushes of the steps
         * the dense model has taken are acknowledged, so the watermark the publisher reads
         * covers them (a lone worker counts its steps before its pushes return). */
        publish_dense(&t, false);
        if ((rc = pw__slot_rows(&t, s)) || (rc = pw__rows_went_back(&t)))
            break;
        if ((rc = rollback_if_lost(&t, &again)) || again)
            continue;
        const uint64_t unapplied = cur - t.applied; /* split: one more, its rows not stale */
        const uint64_t ahead = unapplied > (uint64_t)t.split ? unapplied - (uint64_t)t.split : 0;
        if (ahead > t.max_ahead)
            t.max_ahead = ahead;
        pw__log_step(&t, cur, "start");
        const pw_batch_t *b = &s->b;
        slot_t *next = t.filled > 1 ? &t.slots[(t.head + 1) % t.nslots] : NULL;
        double loss;
        if ((!s->staged && (rc = pw__slot_stage(&t, s))) || (rc = step_run(&t, s, next, &loss)))
            break;
        if (!isfinite(loss)) { /* the loss is finite for any finite logit: the model diverged */
            PC_ERROR("train: the loss is not finite at step %llu: the dense model diverged (lower "
                     "--dense-lr or --lr); what was checkpointed or published before is finite",
                     (unsigned long long)t.step);
            rc = PC_ERANGE;
            break;
        }
        t.head = (t.head + 1) % t.nslots;
        t.filled--;
        if (isnan(res->first_step_s))
            res->first_step_s = pc_time_sec_since(t0);
        pw__save_position(&t, false);
        ema = isnan(ema) ? loss : 0.99 * ema + 0.01 * loss;
        res->samples += b->n;
        publish(&t, r, res->samples, loss, ema);
        if (c->progress_every && res->samples >= next_progress) {
            progress(c, r, res->samples, t0, ema, total_bytes);
            pw_telemetry_log_progress(t.tel);
            next_progress += (uint64_t)c->progress_every;
        }
        if (c->eval_every && ntest && !t.grp && c->rank == 0 && res->samples >= next_eval) {
            pw_sched_drain(t.sched); /* a lone worker's model: every push of its steps applied */
            if ((rc = evaluate_mid(&t, test, ntest, res)))
                break;
            next_eval += (uint64_t)c->eval_every;
        }
    }
    pw_sched_drain(t.sched);
    const int src = pw__slots_settle(&t); /* pushes a late regroup dropped: counted as lost */
    rc = rc ? rc : t.staleness == PW_ASYNC ? src : 0; /* async: not reported by a mark */
    if (!rc && r && !t.filled && pw_reader_consumed(r) > t.done_pos) {
        t.done_pos = pw_reader_consumed(r); /* every batch trained: the lines after the last one
                                             * (blank, malformed) are read too, not again */
        t.pos_dirty = true;
    }
    if (!rc)
        pw__save_position(&t, true);
    if (!rc) /* a promotion during the last steps: said and counted too */
        rc = pw__rows_went_back(&t);
    pw_sched_stats_t st;
    pw_sched_stats(t.sched, &st);
    res->pulled_bytes = st.bytes[PW_JOB_PULL];
    res->pushed_bytes = st.bytes[PW_JOB_PUSH];
    res->dense_bytes = st.bytes[PW_JOB_DENSE];
    res->max_ahead = t.max_ahead;
    res->early_rows = t.early_rows;
    res->pulled_rows = t.pulled_rows;
    res->pull_wait_s = t.pull_wait_s;
    if (r) /* (none when a rollback's reopen failed) */
        count_files(r, train, ntrain, res->train_files, &res->ntrain_files);
    uint64_t read = 0; /* samples of this run's readers (one before each rollback) */
    for (size_t i = 0; i < res->ntrain_files; i++)
        read += res->train_files[i].samples;
    if (!rc) /* a share read from its start must give a sample (a resumed one may be done) */
        rc = stream_end(&t, r, ntrain, pw_reader_error(r), skip == 0 && !read, res->error,
                        sizeof res->error);
    pw_reader_close(r);
    res->steps = t.step;
    res->lost_pushes = atomic_load(&t.lost_pushes);
    res->rollbacks = t.rollbacks;
    res->unclean_slots = t.unclean_slots;
    res->seconds = pc_time_sec_since(t0);
    res->samples_per_s = res->seconds > 0 ? (double)res->samples / res->seconds : 0;
    res->train_loss = ema;
    if (!rc) {
        res->table_rows = t.emb->ops->rows(t.emb);
        res->dense_digest = pw__dense_digest(&t);
    }
    /* distributed: the group's rank 0 saves, evaluates and ends the run at the coordinator */
    const bool lead = t.grp ? pw_group_rank(t.grp) == 0 : c->rank == 0;
    if (!rc && lead && t.grp && (rc = pw_group_finish(t.grp)))
        PC_ERROR("train: cannot mark the run finished at the coordinator: %s", pc_strerror(rc));
    if (!rc && lead) /* the final model */
        publish_dense(&t, true);
    if (!rc && lead && c->save_dense[0] && (rc = pw_model_save(t.model, c->save_dense)))
        PC_ERROR("train: cannot save the dense model to %s: %s", c->save_dense, pc_strerror(rc));
    if (!rc && c->export_embeddings[0] && !t.emb->ops->export_rows) {
        PC_ERROR("train: export the servers' table with a checkpoint (psctl), not the worker");
        rc = PC_EINVAL;
    }
    if (!rc && c->export_embeddings[0] &&
        (rc = t.emb->ops->export_rows(t.emb, c->export_embeddings)))
        PC_ERROR("train: cannot export the embeddings to %s: %s", c->export_embeddings,
                 pc_strerror(rc));
    if (!rc && lead && ntest)
        rc = evaluate(&t, test, ntest, true, res);
    trainer_free(&t);
    return rc;
}
