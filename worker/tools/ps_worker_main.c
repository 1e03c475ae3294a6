/* ps-worker: the training worker: --local (an in-process embedding table) or against servers.
 *
 *   build/bin/ps-worker --local --train=train.tsv --test=test.tsv --model=dlrm --json
 *   build/bin/ps-worker --servers=127.0.0.1:7400 --coordinator=127.0.0.1:7500 --rank=0 \
 *       --world=2 --train=part-0.tsv,part-1.tsv --test=test.tsv   (rank 1 likewise)
 *   build/bin/ps-worker --local --format=csv \
 *       --csv=header=1,threshold=4,columns=cat:cat:label:skip --train=r.csv --test=t.csv
 *
 * Paths are comma-separated lists (files, "-" for stdin, .gz read through zlib). Prints a
 * progress line every --progress-every samples on stderr and a summary at the end (one JSON
 * object on stdout with --json: samples, samples_per_s, train_loss, auc, logloss). Exit status:
 * 0, 1 on a runtime error, 2 on bad settings.
 */
#include "pc_error.h"
#include "pc_log.h"
#include "pc_settings.h"
#include "pw_train.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cfg {
    bool local, json;
    char train[4096], test[4096], format[16], model[16], csv[2048];
    char bottom[128], top[128], table[512];
    char load_dense[512], save_dense[512], export_embeddings[512];
    char servers[4096], table_name[64], coordinator[256], job[64], host[64];
    char ckpt_dir[512], server_grpc[4096], mode[16], step_log[512], device[32];
    int pooling, dense_optimizer, on_worker_loss, on_server_loss, resume,
        order; /* indexes into k_* lists */
    int64_t pull_ahead, async_window, credit_kib, chunk_kib;
    int64_t ckpt_every;
    int64_t rank, world, timeout_ms, rejoin_timeout_ms, lease_ms, server_retry_ms;
    int64_t dim, fields, batch, epochs, max_samples, seed, progress_every, eval_every;
    double dense_lr;
    int log_level;
} cfg_t;

static const char *const k_levels[] = {"error", "warn", "info", "debug", "trace", NULL};
static const char *const k_pooling[] = {"sum", "mean", NULL};
/* in pw_opt_kind_t order */
static const char *const k_optimizers[] = {"sgd", "adagrad", "adam", NULL};
static const char *const k_loss[] = {"shrink", "wait", NULL};
static const char *const k_resume[] = {"position", "checkpoint", NULL};
static const char *const k_server_loss[] = {"continue", "rollback", NULL};
static const char *const k_order[] = {"priority", "fifo", NULL};

#define T cfg_t
static const pc_setting_t k_set[] = {
    PC_SETTING_BOOL(T, local, "false", "train against an in-process table (no servers)"),
    PC_SETTING_STRING(T, servers, "", "the servers: a cluster map, or host:port of any server"),
    PC_SETTING_STRING(T, table_name, "emb", "the servers' embedding table"),
    PC_SETTING_STRING(T, coordinator, "", "host:gRPC port of the coordinator (world > 1)"),
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
    PC_SETTING_ENUM(T, on_worker_loss, k_loss, "shrink",
                    "after that: shrink (go on without it) | wait (keep waiting)"),
    PC_SETTING_STRING(T, mode, "sync",
                      "sync | async | ssp:S (no worker more than S steps ahead of the slowest)"),
    PC_SETTING_INT(T, pull_ahead, 0, 64, "2",
                   "batches whose rows are pulled ahead (async, ssp: at most S)"),
    PC_SETTING_INT(T, async_window, 1, 1000, "2",
                   "async: dense rounds in flight at most (their gradients apply that late)"),
    PC_SETTING_ENUM(T, order, k_order, "priority",
                    "what is sent first: priority (pulls, then dense layers the next forward "
                    "needs first, then pushes) | fifo (submission order)"),
    PC_SETTING_INT(T, credit_kib, 16, 1 << 22, "4096", "KiB in flight at most"),
    PC_SETTING_INT(T, chunk_kib, 4, 1 << 20, "256",
                   "pushes and dense allreduce go in chunks of this many KiB"),
    PC_SETTING_STRING(T, step_log, "", "append every step's start and end time (ns) here"),
    PC_SETTING_STRING(
        T, train, "",
        "training data: comma-separated paths (- for stdin, tcp://HOST:PORT listens)"),
    PC_SETTING_STRING(T, test, "", "evaluation data: comma-separated paths"),
    PC_SETTING_STRING(T, format, "criteo", "criteo | libsvm | libffm | csv"),
    PC_SETTING_STRING(T, csv, "",
                      "CSV column spec, e.g. header=1,threshold=4,columns=cat:cat:label:skip"),
    PC_SETTING_STRING(T, model, "dlrm", "dlrm | deepfm | fm | lr"),
    PC_SETTING_STRING(T, device, "auto",
                      "where the dense math runs: auto (a GPU when the CUDA module loads and "
                      "finds one, else the CPU) | cpu | cuda | cuda:N | cpu:checked (tests)"),
    PC_SETTING_INT(T, dim, 1, 1023, "16", "embedding dim (dlrm), factor dim (fm, deepfm)"),
    PC_SETTING_INT(T, fields, 0, 1024, "0", "categorical fields (0: from the format)"),
    PC_SETTING_ENUM(T, pooling, k_pooling, "sum", "pooling of multi-valued fields: sum | mean"),
    PC_SETTING_STRING(T, bottom, "64,16", "dlrm bottom MLP widths (last = dim)"),
    PC_SETTING_STRING(T, top, "128,64,1", "dlrm top / deepfm MLP widths (last = 1)"),
    PC_SETTING_STRING(T, table,
                      "optimizer=adagrad,lr=0.05,adagrad_init=1e-6,init=uniform,init_scale=0.05",
                      "embedding table settings (ps_table.h)"),
    PC_SETTING_ENUM(T, dense_optimizer, k_optimizers, "adam", "sgd | adagrad | adam"),
    PC_SETTING_DOUBLE(T, dense_lr, 0, 100, "0.001", "dense learning rate"),
    PC_SETTING_INT(T, batch, 1, 1 << 20, "1024", "samples per step"),
    PC_SETTING_INT(T, epochs, 1, 1000, "1", "passes over the training data"),
    PC_SETTING_INT(T, max_samples, 0, 1e15, "0", "stop after this many samples (0: no limit)"),
    PC_SETTING_INT(T, seed, 0, 9.2e18, "1", "seed of the model's initial values"),
    PC_SETTING_INT(T, progress_every, 0, 1e15, "100000", "samples between progress lines"),
    PC_SETTING_INT(T, eval_every, 0, 1e15, "0", "samples between evaluations (0: at the end)"),
    PC_SETTING_STRING(T, load_dense, "", "start from this dense model file"),
    PC_SETTING_STRING(T, save_dense, "", "save the dense model here after training"),
    PC_SETTING_STRING(T, export_embeddings, "", "export the embedding table (row file) here"),
    PC_SETTING_BOOL(T, json, "false", "print the summary as one JSON object"),
    PC_SETTING_ENUM(T, log_level, k_levels, "warn", "log level"),
};
#undef T
#define NSET (sizeof k_set / sizeof k_set[0])

/* Split "a,b,c" into at most cap items (in place). */
static size_t split(char *s, const char **out, size_t cap) {
    size_t n = 0;
    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok && n < cap;
         tok = strtok_r(NULL, ",", &save))
        out[n++] = tok;
    return n;
}

static int widths(char *s, int *out, int *n) {
    const char *items[8];
    size_t k = split(s, items, 8);
    for (size_t i = 0; i < k; i++) {
        char *end;
        long v = strtol(items[i], &end, 10);
        if (*end || v < 1 || v > 65536)
            return PC_EINVAL;
        out[i] = (int)v;
    }
    *n = (int)k;
    return k ? 0 : PC_EINVAL;
}

int main(int argc, char **argv) {
    cfg_t c;
    int cli = pc_settings_cli(
        k_set, NSET, &c, argc, argv, "ps-worker",
        "ps-worker (--local | --servers=...) --train=PATHS [--test=PATHS] [--name=value ...]");
    if (cli)
        return cli == 1 ? 0 : 2;
    char tag[64];
    snprintf(tag, sizeof tag, c.local ? "ps-worker[local]" : "ps-worker[%d]", (int)c.rank);
    pc_log_init(NULL, (pc_log_level_t)c.log_level, tag);
    if (c.local == (c.servers[0] != '\0')) {
        fprintf(stderr, "ps-worker: give either --local or --servers=...\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a peer that died must not kill this worker */
    pw_train_config_t tc;
    pw_train_config_defaults(&tc);
    pw_format_t fmt;
    const char *train[256], *test[256];
    size_t ntrain = split(c.train, train, 256), ntest = split(c.test, test, 256);
    const pw_opt_kind_t ok = (pw_opt_kind_t)c.dense_optimizer;
    if (!ntrain || pw_format_parse(c.format, &fmt) || widths(c.bottom, tc.bottom, &tc.nbottom) ||
        widths(c.top, tc.top, &tc.ntop)) {
        fprintf(stderr, "ps-worker: bad --train, --format, --bottom or --top\n");
        return 2;
    }
    char err[256];
    if (fmt == PW_FMT_CSV && pw_csv_spec_parse(c.csv, &tc.csv, err, sizeof err)) {
        fprintf(stderr, "ps-worker: --csv: %s\n", err);
        return 2;
    }
    tc.fields = (int)c.fields;
    tc.mean_pooling = c.pooling == 1;
    tc.eval_every = (uint64_t)c.eval_every;
    snprintf(tc.servers, sizeof tc.servers, "%s", c.servers);
    snprintf(tc.table_name, sizeof tc.table_name, "%s", c.table_name);
    snprintf(tc.coordinator, sizeof tc.coordinator, "%s", c.coordinator);
    snprintf(tc.job, sizeof tc.job, "%s", c.job);
    snprintf(tc.host, sizeof tc.host, "%s", c.host);
    tc.rank = (int)c.rank;
    tc.world = (int)c.world;
    tc.timeout_ms = (int)c.timeout_ms;
    tc.rejoin_timeout_ms = (int)c.rejoin_timeout_ms;
    tc.lease_ms = (int)c.lease_ms;
    tc.server_retry_ms = (int)c.server_retry_ms;
    tc.ckpt_every = (uint64_t)c.ckpt_every;
    snprintf(tc.ckpt_dir, sizeof tc.ckpt_dir, "%s", c.ckpt_dir);
    snprintf(tc.server_grpc, sizeof tc.server_grpc, "%s", c.server_grpc);
    tc.resume_checkpoint = c.resume == 1;
    tc.rollback_on_server_loss = c.on_server_loss == 1;
    tc.shrink = c.on_worker_loss == 0;
    if (pw_train_mode_parse(c.mode, &tc.staleness)) {
        fprintf(stderr, "ps-worker: --mode is sync, async or ssp:S (S from 1 to 1000)\n");
        return 2;
    }
    tc.pull_ahead = (int)c.pull_ahead;
    tc.async_window = (int)c.async_window;
    tc.fifo = c.order == 1;
    tc.credit_bytes = (size_t)c.credit_kib << 10;
    tc.chunk_bytes = (size_t)c.chunk_kib << 10;
    snprintf(tc.step_log, sizeof tc.step_log, "%s", c.step_log);
    snprintf(tc.model, sizeof tc.model, "%s", c.model);
    snprintf(tc.table_spec, sizeof tc.table_spec, "%s", c.table);
    snprintf(tc.load_dense, sizeof tc.load_dense, "%s", c.load_dense);
    snprintf(tc.save_dense, sizeof tc.save_dense, "%s", c.save_dense);
    snprintf(tc.export_embeddings, sizeof tc.export_embeddings, "%s", c.export_embeddings);
    tc.dim = (int)c.dim;
    tc.batch = (int)c.batch;
    tc.epochs = (int)c.epochs;
    tc.max_samples = (uint64_t)c.max_samples;
    tc.seed = (uint64_t)c.seed;
    tc.progress_every = (uint64_t)c.progress_every;
    pw_opt_config_defaults(&tc.dense_opt, ok);
    tc.dense_opt.lr = (float)c.dense_lr;
    char why[768];
    int rc = pw_backend_open(c.device, &tc.backend, why, sizeof why);
    if (rc) {
        fprintf(stderr, "%s: --device %s: %s\n", tag, c.device, why);
        return rc == PC_EINVAL ? 2 : 1;
    }
    fprintf(stderr, "%s: dense math on %s\n", tag, why);
    pw_train_result_t r;
    rc = pw_train_run(&tc, fmt, train, ntrain, test, ntest, &r);
    if (rc) {
        pw_backend_close(tc.backend);
        fprintf(stderr, "ps-worker: training failed: %s\n", pc_strerror(rc));
        return rc == PC_EINVAL ? 2 : 1;
    }
    if (c.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", tc.model);
        cJSON_AddStringToObject(j, "device", tc.backend->name);
        cJSON_AddNumberToObject(j, "rank", (double)tc.rank);
        cJSON_AddNumberToObject(j, "samples", (double)r.samples);
        cJSON_AddNumberToObject(j, "steps", (double)r.steps);
        cJSON_AddNumberToObject(j, "first_step_s", r.first_step_s);
        cJSON_AddNumberToObject(j, "lost_pushes", (double)r.lost_pushes);
        cJSON_AddNumberToObject(j, "rollbacks", (double)r.rollbacks);
        cJSON_AddNumberToObject(j, "max_ahead", (double)r.max_ahead);
        cJSON_AddNumberToObject(j, "pull_wait_s", r.pull_wait_s);
        cJSON_AddNumberToObject(j, "pulled_bytes", (double)r.pulled_bytes);
        cJSON_AddNumberToObject(j, "pushed_bytes", (double)r.pushed_bytes);
        cJSON_AddNumberToObject(j, "dense_bytes", (double)r.dense_bytes);
        cJSON_AddNumberToObject(j, "seconds", r.seconds);
        cJSON_AddNumberToObject(j, "samples_per_s", r.samples_per_s);
        cJSON_AddNumberToObject(j, "train_loss", r.train_loss);
        cJSON_AddNumberToObject(j, "test_samples", (double)r.test_samples);
        cJSON_AddNumberToObject(j, "auc", r.auc);
        cJSON_AddNumberToObject(j, "logloss", r.logloss);
        cJSON_AddNumberToObject(j, "embedding_rows", (double)r.table_rows);
        char *t = cJSON_PrintUnformatted(j);
        printf("%s\n", t);
        cJSON_free(t);
        cJSON_Delete(j);
    } else {
        printf("%s: %llu samples in %.1f s (%.0f/s), train loss %.4f; test: %llu samples, AUC "
               "%.4f, logloss %.4f\n",
               tc.model, (unsigned long long)r.samples, r.seconds, r.samples_per_s, r.train_loss,
               (unsigned long long)r.test_samples, r.auc, r.logloss);
    }
    pw_backend_close(tc.backend);
    return 0;
}
