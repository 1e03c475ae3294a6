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
 * object on stdout with --json: samples, samples_per_s, train_loss, auc, logloss, ..., and per
 * file train_files / test_files: path, lines, samples, malformed). Exit status: 0, 1 on a
 * runtime error (unreadable data: a file without one usable sample or over --max-error-rate
 * malformed lines, said in one line naming the file), 2 on bad settings.
 */
#include "pc_error.h"
#include "pc_log.h"
#include "pc_settings.h"
#include "pw_train.h"
#include "pw_backend.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The trainer's settings (declared in pw_train: pw_train_settings) and this program's. */
typedef struct cfg {
    pw_train_config_t t;
    bool local, json;
    int64_t blas_threads;
    char train[4096], test[4096], device[32];
    int format; /* pw_format_t */
    int log_level;
} cfg_t;

static const char *const k_levels[] = {"error", "warn", "info", "debug", "trace", NULL};

#define T cfg_t
static const pc_setting_t k_own[] = {
    PC_SETTING_BOOL(T, local, "false", "train against an in-process table (no servers)"),
    PC_SETTING_STRING(
        T, train, "",
        "training data: comma-separated paths (- for stdin, tcp://HOST:PORT listens)"),
    PC_SETTING_STRING(T, test, "", "evaluation data: comma-separated paths"),
    PC_SETTING_ENUM(T, format, pw_format_names, "criteo", "format of --train and --test"),
    PC_SETTING_STRING(T, device, "auto",
                      "where the dense math runs: auto (a GPU when the CUDA module loads and "
                      "finds one, else the CPU) | cpu | cuda | cuda:N | cpu:checked (tests)"),
    PC_SETTING_INT(T, blas_threads, 0, 1024, "0",
                   "OpenBLAS threads for the CPU's dense math (0: the CPUs less one, which the "
                   "reader and the table's calls use; OPENBLAS_NUM_THREADS wins)"),
    PC_SETTING_BOOL(T, json, "false", "print the summary as one JSON object"),
    PC_SETTING_ENUM(T, log_level, k_levels, "warn", "log level"),
};
#undef T
#define NOWN (sizeof k_own / sizeof k_own[0])

/* Split "a,b,c" into at most cap items (in place). */
static size_t split(char *s, const char **out, size_t cap) {
    size_t n = 0;
    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok && n < cap;
         tok = strtok_r(NULL, ",", &save))
        out[n++] = tok;
    return n;
}

/* The summary's per-file counts: "train a.tsv: 1000 lines read, 998 samples, 2 malformed". */
static void files_text(const char *what, const pw_train_file_t *f, size_t n) {
    for (size_t i = 0; i < n; i++)
        printf("%s %s: %llu lines read, %llu samples, %llu malformed\n", what, f[i].path,
               (unsigned long long)f[i].lines, (unsigned long long)f[i].samples,
               (unsigned long long)f[i].bad);
}

/* ... and in JSON: key: [{"path", "lines", "samples", "malformed"}, ...]. */
static void files_json(cJSON *j, const char *key, const pw_train_file_t *f, size_t n) {
    cJSON *a = cJSON_AddArrayToObject(j, key);
    for (size_t i = 0; a && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToArray(a, o); /* fails only for NULL arguments */
        cJSON_AddStringToObject(o, "path", f[i].path);
        cJSON_AddNumberToObject(o, "lines", (double)f[i].lines);
        cJSON_AddNumberToObject(o, "samples", (double)f[i].samples);
        cJSON_AddNumberToObject(o, "malformed", (double)f[i].bad);
    }
}

/* A stop signal ends the worker at once, as the default action does (its group recovers
 * without it, as after any worker's death; a restarted worker joins again). Caught, because as a
 * container's pid 1 (the entrypoint execs it, with no init) the kernel drops default-action
 * signals: a `docker stop` or a pod's deletion waited out the grace period, then SIGKILL. */
static void on_stop(int sig) {
    _Exit(128 + sig);
}

int main(int argc, char **argv) {
    pw_blas_select(argv); /* first: it may execute this program again */
    size_t ntrain_set, nset;
    const pc_setting_t *ts = pw_train_settings(&ntrain_set);
    pc_setting_t *set = pc_settings_join(ts, ntrain_set, offsetof(cfg_t, t), k_own, NOWN, &nset);
    if (!set)
        return 1;
    cfg_t c;
    int cli = pc_settings_cli(
        set, nset, &c, argc, argv, "ps-worker",
        "ps-worker (--local | --servers=...) --train=PATHS [--test=PATHS] [--name=value ...]");
    free(set);
    if (cli)
        return cli == 1 ? 0 : 2;
    pw_train_config_t *tc = &c.t;
    char tag[64];
    snprintf(tag, sizeof tag, c.local ? "ps-worker[local]" : "ps-worker[%d]", (int)tc->rank);
    pc_log_init(NULL, (pc_log_level_t)c.log_level, tag);
    if (c.local == (tc->servers[0] != '\0')) {
        fprintf(stderr, "ps-worker: give either --local or --servers=...\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a peer that died must not kill this worker */
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    const char *train[256], *test[256];
    size_t ntrain = split(c.train, train, 256), ntest = split(c.test, test, 256);
    if (!ntrain) {
        fprintf(stderr, "ps-worker: --train: give the training data (comma-separated paths, - "
                        "for stdin, tcp://HOST:PORT)\n");
        return 2;
    }
    if (c.local)
        tc->local_store = pw_emb_local_open;
    pw_blas_threads((int)c.blas_threads);
    char why[768];
    int rc = pw_backend_open(c.device, &tc->backend, why, sizeof why);
    if (rc) {
        fprintf(stderr, "%s: --device %s: %s\n", tag, c.device, why);
        return rc == PC_EINVAL ? 2 : 1;
    }
    fprintf(stderr, "%s: dense math on %s\n", tag, why);
    pw_train_result_t r;
    r.error[0] = '\0';
    rc = pw_train_run(tc, (pw_format_t)c.format, train, ntrain, test, ntest, &r);
    if (rc) {
        pw_backend_close(tc->backend);
        if (r.error[0]) /* which file and why */
            fprintf(stderr, "ps-worker: %s\n", r.error);
        else
            fprintf(stderr, "ps-worker: training failed: %s\n", pc_strerror(rc));
        return rc == PC_EINVAL ? 2 : 1;
    }
    if (c.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", tc->model);
        cJSON_AddStringToObject(j, "device", tc->backend->name);
        cJSON_AddNumberToObject(j, "rank", (double)tc->rank);
        cJSON_AddNumberToObject(j, "samples", (double)r.samples);
        cJSON_AddNumberToObject(j, "steps", (double)r.steps);
        cJSON_AddNumberToObject(j, "first_step_s", r.first_step_s);
        cJSON_AddNumberToObject(j, "lost_pushes", (double)r.lost_pushes);
        cJSON_AddNumberToObject(j, "rollbacks", (double)r.rollbacks);
        cJSON_AddNumberToObject(j, "unclean_slots", (double)r.unclean_slots);
        cJSON_AddNumberToObject(j, "max_ahead", (double)r.max_ahead);
        cJSON_AddNumberToObject(j, "pull_wait_s", r.pull_wait_s);
        cJSON_AddNumberToObject(j, "early_rows", (double)r.early_rows);
        cJSON_AddNumberToObject(j, "pulled_rows", (double)r.pulled_rows);
        cJSON_AddNumberToObject(j, "pulled_bytes", (double)r.pulled_bytes);
        cJSON_AddNumberToObject(j, "pushed_bytes", (double)r.pushed_bytes);
        cJSON_AddNumberToObject(j, "dense_bytes", (double)r.dense_bytes);
        char digest[20];
        snprintf(digest, sizeof digest, "%016llx", (unsigned long long)r.dense_digest);
        cJSON_AddStringToObject(j, "dense_digest", digest);
        cJSON_AddNumberToObject(j, "seconds", r.seconds);
        cJSON_AddNumberToObject(j, "samples_per_s", r.samples_per_s);
        cJSON_AddNumberToObject(j, "train_loss", r.train_loss);
        cJSON_AddNumberToObject(j, "test_samples", (double)r.test_samples);
        cJSON_AddNumberToObject(j, "auc", r.auc);
        cJSON_AddNumberToObject(j, "logloss", r.logloss);
        cJSON_AddNumberToObject(j, "embedding_rows", (double)r.table_rows);
        files_json(j, "train_files", r.train_files, r.ntrain_files);
        files_json(j, "test_files", r.test_files, r.ntest_files);
        char *t = cJSON_PrintUnformatted(j);
        printf("%s\n", t);
        cJSON_free(t);
        cJSON_Delete(j);
    } else {
        printf("%s: %llu samples in %.1f s (%.0f/s), train loss %.4f; test: %llu samples, AUC "
               "%.4f, logloss %.4f\n",
               tc->model, (unsigned long long)r.samples, r.seconds, r.samples_per_s, r.train_loss,
               (unsigned long long)r.test_samples, r.auc, r.logloss);
        files_text("train", r.train_files, r.ntrain_files);
        files_text("test", r.test_files, r.ntest_files);
    }
    pw_backend_close(tc->backend);
    return 0;
}
