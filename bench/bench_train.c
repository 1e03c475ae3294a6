/* bench_train.c: `ps-bench train`: local DLRM training speed and quality.
 *
 * ps-datagen data (2M training rows and 200k test rows; --quick 300k/30k; --smoke 20k/4k; --keys
 * sets the training rows), the model: 26 sparse fields, dim 16, bottom 13-64-16, top
 * 128-64-1 (input 16 + 351 interactions), batch 1024, OpenBLAS on one thread; the reader runs on
 * its own thread, as in ps-worker. Figures:
 *  - train_samples_per_s, and the dense part's GFLOP/s (3 x the forward GEMM/interaction FLOPs
 *    per sample) as a fraction of single-thread OpenBLAS sgemm (512^3) measured in the same run
 *    (dense_vs_sgemm_peak: a figure of the whole training loop, table and all, on 2 cores);
 *  - the same run with the serial pipeline (pull_ahead 0: each step's pull after the pushes of
 *    the step before, all on one thread of table work): train_serial_samples_per_s,
 *    train_vs_serial, early_rows_share (the rows pulled while the step before computed) and
 *    auc_serial_minus_split (0: the split reads every row as the serial order does);
 *  - the same FLOPs over the dense step alone (dense_step_vs_sgemm_peak): the trainer's step
 *    (pw_step.h: rows gathered, the model's forward and backward, BCE, row gradients summed, the
 *    dense optimizer) on the run's model and batch, synthetic batches, no table, no reader, the
 *    same one OpenBLAS thread, the fastest of 100 steps; and the ceiling of its shapes:
 *    sgemm_step_shapes_gflops, OpenBLAS alone on the GEMMs one step makes (each layer's forward,
 *    dW and dx, the interaction's 2 x batch small products), over the same 512^3 peak;
 *  - auc and logloss on the test rows next to the oracle's (oracle_auc);
 *  - the same run with the table storing its weights in bf16 and in f16 (row_dtype, docs/table.md
 *    "Stored row types"; local training is deterministic, so the difference is the storage's):
 *    auc_stored_bf16_minus_f32, auc_stored_f16_minus_f32 (goal >= -0.001) and
 *    train_stored_bf16_vs_f32 (samples/s against the f32 run's);
 *  - parse_lines_per_s of Criteo lines (as `ps-bench data`);
 *  - the same data's AUC for LR, FM and DeepFM (auc_lr, auc_fm, auc_deepfm; not with --smoke);
 *  - MovieLens (when $EMBER_SHARED_DATA or ../shared/data has it): ratings >= 4 positive, the
 *    last 20% by time as the test set, user and movie as two fields, batch 64, one epoch:
 *    movielens_auc_lr, movielens_auc_dlrm (and FM, DeepFM);
 *  - torch_auc: the same DLRM trained on the same files in PyTorch on the CPU
 *    (bench/torch_train.py under /usr/bin/python3: local embeddings with the table's Adagrad and
 *    initializer, the worker's dense optimizer, batch and order; every setting passed from the
 *    two settings tables, so the defaults stay declared once) and auc_minus_torch = auc -
 *    torch_auc (goal >= -0.002). Without python3 and torch the two keys are absent and
 *    torch_skipped says why.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_log.h"
#include "pc_rand.h"
#include "pc_settings.h"
#include "pc_time.h"
#include "ps_table.h"
#include "pw_datagen.h"
#include "pw_model.h"
#include "pw_split.h"
#include "pw_step.h"
#include "pw_train.h"

enum { FIELDS = 26, DENSE = 13 }; /* ps-datagen's Criteo rows */

/* Single-thread sgemm GFLOP/s on square matrices of side m: the fastest of the products made in
 * about `secs` (the best, as the dense step's figures: on a shared machine a mean over the
 * whole time counts the neighbours' load). */
static double sgemm_peak(int m, double secs) {
    float *a = malloc((size_t)m * m * sizeof *a), *b = malloc((size_t)m * m * sizeof *b),
          *c = calloc((size_t)m * m, sizeof *c);
    for (size_t i = 0; i < (size_t)m * m; i++)
        a[i] = b[i] = (float)(i % 7) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, a, m, b, m, 0, c, m);
    int reps = 0;
    double s = INFINITY;
    const uint64_t t0 = pc_time_mono_ns();
    while (pc_time_sec_since(t0) < secs || reps < 2) {
        const uint64_t t1 = pc_time_mono_ns();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, a, m, b, m, 0, c, m);
        const double t = pc_time_sec_since(t1);
        s = t < s ? t : s;
        reps++;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * m * m * (double)m / s / 1e9;
}

/* "64,16" -> w[], their count (at most PW_MLP_MAX). */
static int widths(const char *list, int *w) {
    int n = 0;
    for (const char *p = list; *p && n < PW_MLP_MAX; n++) {
        char *end;
        w[n] = (int)strtol(p, &end, 10);
        p = *end ? end + 1 : end;
    }
    return n;
}

/* The run's DLRM (c's widths, dim and batch) as a model configuration. */
static pw_model_config_t model_config(const pw_train_config_t *c) {
    pw_model_config_t mc = {.name = "dlrm",
                            .ndense = DENSE,
                            .nfields = FIELDS,
                            .dim = (int)c->dim,
                            .max_batch = (int)c->batch,
                            .seed = 1};
    mc.nbottom = widths(c->bottom, mc.bottom);
    mc.ntop = widths(c->top, mc.top);
    return mc;
}

/* Seconds per step of the trainer's dense step alone (see the file's comment): the fastest of
 * `steps` after 3 warm-up steps. */
static double dense_step_seconds(const pw_train_config_t *c, int steps) {
    pw_backend_t *be = pw_backend_cpu();
    const pw_model_config_t mc = model_config(c);
    const int n = mc.max_batch, d = mc.dim;
    const size_t nk = (size_t)n * FIELDS;
    pw_model_t *m;
    pw_step_t *st;
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, (pw_opt_kind_t)c->dense_optimizer);
    if (pw_model_create(&mc, be, &m))
        abort();
    pw_step_config_t sc = {.be = be, .model = m, .ndense = DENSE, .opt = &oc};
    if (pw_step_create(&sc, &st))
        abort();
    pw_batch_t b = {.n = (size_t)n, .ndense = DENSE};
    b.labels = calloc((size_t)n, sizeof *b.labels);
    b.dense = calloc((size_t)n * DENSE, sizeof *b.dense);
    b.keys = calloc(nk, sizeof *b.keys);
    b.fields = calloc(nk, sizeof *b.fields);
    b.vals = calloc(nk, sizeof *b.vals);
    b.key_off = calloc((size_t)n + 1, sizeof *b.key_off);
    uint32_t *inv = calloc(nk, sizeof *inv); /* every feature its own row */
    float *urows = calloc(nk * d, sizeof *urows), *ugrads = calloc(nk * d, sizeof *ugrads);
    if (!b.labels || !b.dense || !b.keys || !b.fields || !b.vals || !b.key_off || !inv || !urows ||
        !ugrads)
        abort();
    uint64_t rng = 7;
    for (int s = 0; s < n; s++) {
        b.labels[s] = pc_rand_unit(&rng) < 0.25 ? 1.0f : 0.0f;
        for (int j = 0; j < DENSE; j++)
            b.dense[(size_t)s * DENSE + j] = (float)pc_rand_unit(&rng);
        b.key_off[s + 1] = (size_t)(s + 1) * FIELDS;
    }
    for (size_t j = 0; j < nk; j++) {
        b.fields[j] = (uint16_t)(j % FIELDS);
        b.vals[j] = 1.0f;
        inv[j] = (uint32_t)j;
    }
    for (size_t i = 0; i < nk * d; i++)
        urows[i] = (float)((pc_rand_unit(&rng) - 0.5) * 0.1);
    const pw_step_input_t in = {.b = &b, .inv = inv, .nu = nk, .urows = urows};
    double best = INFINITY;
    for (int i = -3; i < steps; i++) {
        const uint64_t t0 = pc_time_mono_ns();
        double loss;
        if (pw_step_stage(st, 0, &in) || pw_step_compute(st, 0, 1.0f, ugrads) ||
            pw_step_finish(st, true, &loss))
            abort();
        const double sec = pc_time_sec_since(t0);
        best = i >= 0 && sec < best ? sec : best;
    }
    pw_step_destroy(st);
    pw_model_destroy(m);
    free(b.labels);
    free(b.dense);
    free(b.keys);
    free(b.fields);
    free(b.vals);
    free(b.key_off);
    free(inv);
    free(urows);
    free(ugrads);
    return best;
}

/* OpenBLAS alone on the GEMMs of one step of the run's DLRM (one thread): GFLOP/s over the best
 * of `reps` passes. Each layer's forward (x W^T), dW (dy^T x) and dx (dy W; not the first
 * layer's), the interaction's Z Z^T and G Z per sample, with pw_layers' layouts. */
static double step_shapes_gflops(const pw_train_config_t *c, int reps) {
    const pw_model_config_t mc = model_config(c);
    const int n = mc.max_batch, d = mc.dim, f = FIELDS + 1, np = f * (f - 1) / 2;
    int in[2 * PW_MLP_MAX], out[2 * PW_MLP_MAX], nl = 0;
    size_t big = (size_t)f * f; /* floats per sample of the largest operand */
    for (int i = 0; i < mc.nbottom; i++, nl++) {
        in[nl] = i ? mc.bottom[i - 1] : DENSE;
        out[nl] = mc.bottom[i];
    }
    for (int i = 0; i < mc.ntop; i++, nl++) {
        in[nl] = i ? mc.top[i - 1] : d + np;
        out[nl] = mc.top[i];
    }
    for (int i = 0; i < nl; i++) { /* a layer's x, y or dy per sample */
        big = (size_t)in[i] > big ? (size_t)in[i] : big;
        big = (size_t)out[i] > big ? (size_t)out[i] : big;
    }
    size_t cap = (size_t)n * big;
    for (int i = 0; i < nl; i++) /* or its weights */
        cap = (size_t)in[i] * out[i] > cap ? (size_t)in[i] * out[i] : cap;
    float *a = calloc(cap, sizeof *a), *b = calloc(cap, sizeof *b), *y = calloc(cap, sizeof *y);
    if (!a || !b || !y)
        abort();
    for (size_t i = 0; i < cap; i++)
        a[i] = b[i] = (float)(i % 7) * 0.1f;
    const CBLAS_TRANSPOSE N = CblasNoTrans, T = CblasTrans;
    double best = INFINITY, flops = 0;
    for (int r = 0; r < reps; r++) {
        flops = 0;
        const uint64_t t0 = pc_time_mono_ns();
        for (int i = 0; i < nl; i++) {
            const int k = in[i], o = out[i];
            cblas_sgemm(CblasRowMajor, N, T, n, o, k, 1, a, k, b, k, 0, y, o);
            cblas_sgemm(CblasRowMajor, T, N, o, k, n, 1, a, o, b, k, 1, y, k);
            flops += 4.0 * n * k * o;
            if (i != 0) { /* the bottom's first layer has no dx */
                cblas_sgemm(CblasRowMajor, N, N, n, k, o, 1, a, o, b, k, 0, y, k);
                flops += 2.0 * n * k * o;
            }
        }
        for (int s = 0; s < n; s++) {
            const float *z = a + (size_t)s * f * d;
            cblas_sgemm(CblasRowMajor, N, T, f, f, d, 1, z, d, z, d, 0, y + (size_t)s * f * f, f);
            cblas_sgemm(CblasRowMajor, N, N, f, d, f, 1, b + (size_t)s * f * f, f, z, d, 0,
                        y + (size_t)s * f * d, d);
        }
        flops += 2 * 2.0 * n * f * f * d;
        const double sec = pc_time_sec_since(t0);
        best = sec < best ? sec : best;
    }
    free(a);
    free(b);
    free(y);
    return flops / best / 1e9;
}

/* AUC of `model` trained with c's other settings; NaN on failure. */
static double auc_of(pw_train_config_t c, const char *model, pw_format_t fmt, const char *tr,
                     const char *te) {
    snprintf(c.model, sizeof c.model, "%s", model);
    const char *trp[] = {tr}, *tep[] = {te};
    pw_train_result_t r;
    return pw_train_run(&c, fmt, trp, 1, tep, 1, &r) ? NAN : r.auc;
}

/* MovieLens figures into root (nothing when the data is absent). */
static void movielens(const char *dir, cJSON *root) {
    const char *data = getenv("EMBER_SHARED_DATA") ? getenv("EMBER_SHARED_DATA") : "../shared/data";
    char src[512], tr[300], te[300];
    snprintf(src, sizeof src, "%s/movielens-latest-small/ratings.csv", data);
    snprintf(tr, sizeof tr, "%s/ml_train.csv", dir);
    snprintf(te, sizeof te, "%s/ml_test.csv", dir);
    if (access(src, R_OK) != 0) {
        printf("%-40s skipped: %s not found\n", "MovieLens", src);
        return;
    }
    if (pw_split_by_column(src, ',', true, 3, 0.2, tr, te, NULL, NULL))
        abort();
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.local_store = pw_emb_local_open;
    c.batch = 64;
    snprintf(c.csv, sizeof c.csv, "header=1,threshold=4,columns=cat:cat:label:skip");
    const char *models[] = {"lr", "fm", "dlrm", "deepfm"};
    printf(
        "MovieLens ml-latest-small, rating >= 4, last 20%% by time as test, batch 64, 1 epoch:\n");
    for (int i = 0; i < 4; i++) {
        const double auc = auc_of(c, models[i], PW_FMT_CSV, tr, te);
        char key[64];
        snprintf(key, sizeof key, "movielens_auc_%s", models[i]);
        printf("  %-38s %12.4f\n", key, auc);
        cJSON_AddNumberToObject(root, key, auc);
    }
    unlink(tr);
    unlink(te);
}

/* torch_train.py's flags: the settings of ps-worker (pw_train_settings) or of its table
 * (ps_table_settings) that it takes. */
static const struct {
    bool table;
    const char *name, *flag;
} k_torch_flags[] = {
    {false, "dense_optimizer", "dense-optimizer"},
    {false, "dense_lr", "dense-lr"},
    {false, "batch", "batch"},
    {false, "dim", "dim"},
    {false, "bottom", "bottom"},
    {false, "top", "top"},
    {false, "seed", "seed"},
    {true, "lr", "table-lr"},
    {true, "adagrad_init", "adagrad-init"},
    {true, "eps", "eps"},
    {true, "init_scale", "init-scale"},
};

/* "--flag=VALUE" of setting `name` of tab (over obj) appended to args. */
static void add_flag(char **args, int *na, const pc_setting_t *tab, size_t n, const void *obj,
                     const char *name, const char *flag) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(tab[i].name, name) == 0) {
            char v[256], buf[320];
            pc_settings_format(&tab[i], obj, v, sizeof v);
            snprintf(buf, sizeof buf, "--%s=%s", flag, v);
            args[(*na)++] = strdup(buf);
            return;
        }
    abort(); /* a setting this file names is gone */
}

/* bench/torch_train.py on tr/te with c's settings and its table's: torch_auc and
 * auc_minus_torch into root (auc is ps-worker's), or torch_skipped with the reason. */
static void torch_reference(const pw_train_config_t *c, double auc, const char *dir, const char *tr,
                            const char *te, cJSON *root) {
    char why[900] = "", out_path[320];
    ps_table_config_t tc;
    ps_table_config_defaults(&tc);
    if (ps_table_config_parse(&tc, c->table, why, sizeof why) == 0 &&
        (tc.optimizer != PS_OPT_ADAGRAD || tc.init != PS_INIT_UNIFORM))
        snprintf(why, sizeof why, "bench/torch_train.py has Adagrad tables with uniform init");
    cJSON *r = NULL;
    if (!why[0]) {
        char *args[32] = {BENCH_PYTHON, NULL}, script[400], trf[320], tef[320];
        int na = 1, nfixed;
        snprintf(script, sizeof script, "%s/bench/torch_train.py", EMBER_SOURCE_DIR);
        snprintf(trf, sizeof trf, "--train=%s", tr);
        snprintf(tef, sizeof tef, "--test=%s", te);
        args[na++] = script;
        args[na++] = trf;
        args[na++] = tef;
        args[na++] = "--json";
        nfixed = na;
        size_t nw, nt;
        const pc_setting_t *wt = pw_train_settings(&nw), *tt = ps_table_settings(&nt);
        for (size_t i = 0; i < sizeof k_torch_flags / sizeof *k_torch_flags; i++) {
            const bool table = k_torch_flags[i].table;
            add_flag(args, &na, table ? tt : wt, table ? nt : nw, table ? (void *)&tc : (void *)c,
                     k_torch_flags[i].name, k_torch_flags[i].flag);
        }
        snprintf(out_path, sizeof out_path, "%s/torch.out", dir);
        int st = 0; /* (a PyTorch run that hangs is stopped: its figures are then missing) */
        if (bench_wait_exit(bench_python(args, out_path, true), 3600, &st))
            fprintf(stderr, "ps-bench train: %s ran for an hour: stopped\n", script);
        for (int i = nfixed; i < na; i++)
            free(args[i]);
        char last[400];
        r = bench_python_result(out_path, last, sizeof last);
        unlink(out_path);
        snprintf(why, sizeof why, "%s exited with status %d: %s", script,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, last + strspn(last, " "));
    }
    const cJSON *ta = r ? cJSON_GetObjectItem(r, "auc") : NULL;
    if (cJSON_IsNumber(ta)) {
        cJSON_AddNumberToObject(root, "torch_auc", ta->valuedouble);
        cJSON_AddNumberToObject(root, "auc_minus_torch", auc - ta->valuedouble);
        printf("%-40s %12.4f  (auc_minus_torch %+.4f, goal >= -0.002)\n", "PyTorch's test AUC",
               ta->valuedouble, auc - ta->valuedouble);
    } else {
        char skipped[1000];
        snprintf(skipped, sizeof skipped, "%s (python3-torch: deploy/install-deps.sh)", why);
        cJSON_AddStringToObject(root, "torch_skipped", skipped);
        printf("%-40s skipped: %s\n", "PyTorch's test AUC", skipped);
    }
    cJSON_Delete(r);
}

int bench_train_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "train", &o);
    pc_log_set_level(PC_LOG_WARN);
    openblas_set_num_threads(1);
    const uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 20000 : o.quick ? 300000 : 2000000;
    pw_train_config_t c;
    pw_train_config_defaults(&c); /* dim 16, 13-64-16, 128-64-1, batch 1024 */
    c.local_store = pw_emb_local_open;
    /* the peak, then what the dense step and its shapes do, back to back */
    const double peak = sgemm_peak(512, o.smoke ? 0.2 : 1.0);
    const double step_s = dense_step_seconds(&c, o.smoke ? 10 : 100);
    const double shapes = step_shapes_gflops(&c, o.smoke ? 3 : 20);
    char dir[256], tr[300], te[300];
    bench_tmpdir("train", dir, sizeof dir);
    snprintf(tr, sizeof tr, "%s/train.tsv", dir);
    snprintf(te, sizeof te, "%s/test.tsv", dir);
    pw_datagen_opts_t go;
    pw_datagen_defaults(&go);
    go.rows = n;
    go.test_rows = n / 10;
    pw_datagen_result_t oracle;
    FILE *ft = fopen(tr, "w"), *fe = fopen(te, "w");
    if (!ft || !fe || pw_datagen_run(&go, ft, fe, &oracle))
        abort();
    fclose(ft);
    fclose(fe);
    const char *trp[] = {tr}, *tep[] = {te};
    pw_train_result_t r;
    if (pw_train_run(&c, PW_FMT_CRITEO, trp, 1, tep, 1, &r))
        abort();
    /* Dense FLOPs per sample: forward GEMMs and dot products, backward twice that (Criteo: 13
     * dense features into the bottom MLP, 26 fields; the model's widths) */
    double fwd = 0;
    int in = 13;
    for (char *p = c.bottom, *end; *p; p = *end ? end + 1 : end) { /* "64,16" */
        const int w = (int)strtol(p, &end, 10);
        fwd += 2.0 * in * w;
        in = w;
    }
    const int f = 26 + 1, np = f * (f - 1) / 2, d = (int)c.dim;
    fwd += 2.0 * np * d;
    in = d + np;
    for (char *p = c.top, *end; *p; p = *end ? end + 1 : end) { /* "128,64,1" */
        const int w = (int)strtol(p, &end, 10);
        fwd += 2.0 * in * w;
        in = w;
    }
    const double dense_gflops = r.samples_per_s * 3 * fwd / 1e9;
    /* The serial pipeline (no batch read ahead, no split pull): the same model, one thread of
     * table work after each step. */
    pw_train_config_t c0 = c;
    c0.pull_ahead = 0;
    pw_train_result_t r0;
    if (pw_train_run(&c0, PW_FMT_CRITEO, trp, 1, tep, 1, &r0))
        abort();
    const double early = (double)r.early_rows / (double)r.pulled_rows;
    /* The table's weights stored in 16 bits: the same run otherwise. */
    pw_train_result_t rs[2];
    static const char *const stored_types[2] = {"bf16", "f16"};
    for (int i = 0; i < 2; i++) {
        pw_train_config_t cs = c;
        const int w = snprintf(cs.table, sizeof cs.table, "%s%srow_dtype=%s", c.table,
                               c.table[0] ? "," : "", stored_types[i]);
        if (w < 0 || (size_t)w >= sizeof cs.table)
            abort();
        if (pw_train_run(&cs, PW_FMT_CRITEO, trp, 1, tep, 1, &rs[i]))
            abort();
    }
    const double step_gflops = c.batch * 3 * fwd / step_s / 1e9;
    double other[3] = {NAN, NAN, NAN};
    const char *others[] = {"lr", "fm", "deepfm"};
    for (int i = 0; i < 3 && !o.smoke; i++)
        other[i] = auc_of(c, others[i], PW_FMT_CRITEO, tr, te);
    size_t len;
    char *lines = bench_gen_lines(o.smoke ? 20000 : 200000, &len, NULL);
    double scan, ratio;
    const double parse = bench_parse_rate(lines, len, o.smoke ? 20000 : 200000, &scan, &ratio);
    free(lines);
    printf("ps-bench train: DLRM (26 fields, dim 16, 13-64-16, 128-64-1), batch 1024, %llu "
           "training rows, OpenBLAS 1 thread + the reader thread\n",
           (unsigned long long)r.samples);
    printf("%-40s %12.0f samples/s  (%.2f of the serial pipeline's %.0f; %.0f%% of the rows "
           "pulled while the step before computed)\n",
           "local DLRM training", r.samples_per_s, r.samples_per_s / r0.samples_per_s,
           r0.samples_per_s, 100.0 * early);
    printf("%-40s %12.2f GFLOP/s  (%.2f of sgemm 512^3, %.1f GFLOP/s, same run)\n", "dense part",
           dense_gflops, dense_gflops / peak, peak);
    printf("%-40s %12.2f GFLOP/s  (%.2f of sgemm 512^3; %.2f ms per step of %d)\n",
           "dense step alone (no table, no reader)", step_gflops, step_gflops / peak, step_s * 1e3,
           (int)c.batch);
    printf("%-40s %12.2f GFLOP/s  (%.2f of sgemm 512^3: the ceiling of these shapes)\n",
           "sgemm on one step's GEMMs", shapes, shapes / peak);
    printf("%-40s %12.4f  (oracle %.4f), logloss %.4f (oracle %.4f)\n", "test AUC", r.auc,
           oracle.oracle_auc, r.logloss, oracle.oracle_logloss);
    printf("%-40s %+12.6f  (f16 %+.6f; goal >= -0.001), %.0f samples/s (%.2f of f32's)\n",
           "AUC, rows stored in bf16 - f32", rs[0].auc - r.auc, rs[1].auc - r.auc,
           rs[0].samples_per_s, rs[0].samples_per_s / r.samples_per_s);
    printf("%-40s %12.0f lines/s  (%.2f of a raw line scan)\n", "Criteo parsing", parse, ratio);
    printf("%-40s LR %.4f, FM %.4f, DeepFM %.4f\n", "other models' test AUC", other[0], other[1],
           other[2]);
    cJSON *root = cJSON_CreateObject();
    torch_reference(&c, r.auc, dir, tr, te, root);
    unlink(tr);
    unlink(te);
    cJSON_AddNumberToObject(root, "auc_lr", other[0]);
    cJSON_AddNumberToObject(root, "auc_fm", other[1]);
    cJSON_AddNumberToObject(root, "auc_deepfm", other[2]);
    if (!o.smoke)
        movielens(dir, root);
    rmdir(dir);
    cJSON_AddStringToObject(root, "bench", "train");
    cJSON_AddNumberToObject(root, "train_rows", (double)r.samples);
    cJSON_AddNumberToObject(root, "train_samples_per_s", r.samples_per_s);
    cJSON_AddNumberToObject(root, "train_serial_samples_per_s", r0.samples_per_s);
    cJSON_AddNumberToObject(root, "train_vs_serial", r.samples_per_s / r0.samples_per_s);
    cJSON_AddNumberToObject(root, "early_rows_share", early);
    cJSON_AddNumberToObject(root, "auc_serial_minus_split", r0.auc - r.auc);
    cJSON_AddNumberToObject(root, "dense_gflops", dense_gflops);
    cJSON_AddNumberToObject(root, "sgemm_gflops", peak);
    cJSON_AddNumberToObject(root, "dense_vs_sgemm_peak", dense_gflops / peak);
    cJSON_AddNumberToObject(root, "dense_step_ms", step_s * 1e3);
    cJSON_AddNumberToObject(root, "dense_step_gflops", step_gflops);
    cJSON_AddNumberToObject(root, "dense_step_vs_sgemm_peak", step_gflops / peak);
    cJSON_AddNumberToObject(root, "sgemm_step_shapes_gflops", shapes);
    cJSON_AddNumberToObject(root, "sgemm_step_shapes_vs_peak", shapes / peak);
    cJSON_AddNumberToObject(root, "auc", r.auc);
    cJSON_AddNumberToObject(root, "logloss", r.logloss);
    cJSON_AddNumberToObject(root, "oracle_auc", oracle.oracle_auc);
    cJSON_AddNumberToObject(root, "auc_stored_bf16", rs[0].auc);
    cJSON_AddNumberToObject(root, "auc_stored_bf16_minus_f32", rs[0].auc - r.auc);
    cJSON_AddNumberToObject(root, "auc_stored_f16_minus_f32", rs[1].auc - r.auc);
    cJSON_AddNumberToObject(root, "train_stored_bf16_vs_f32",
                            rs[0].samples_per_s / r.samples_per_s);
    cJSON_AddNumberToObject(root, "oracle_logloss", oracle.oracle_logloss);
    cJSON_AddNumberToObject(root, "parse_lines_per_s", parse);
    bench_emit_json(&o, root);
    return 0;
}
