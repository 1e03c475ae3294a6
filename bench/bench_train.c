/* bench_train.c: `ps-bench train`: local DLRM training speed and quality.
 *
 * ps-datagen data (2M training rows and 200k test rows; --quick 300k/30k; --smoke 20k/4k; --keys
 * sets the training rows), the model: 26 sparse fields, dim 16, bottom 13-64-16, top
 * 128-64-1 (input 16 + 351 interactions), batch 1024, OpenBLAS on one thread; the reader runs on
 * its own thread, as in ps-worker. Figures:
 *  - train_samples_per_s, and the dense part's GFLOP/s (3 x the forward GEMM/interaction FLOPs
 *    per sample) as a fraction of single-thread OpenBLAS sgemm (512^3) measured in the same run;
 *  - auc and logloss on the test rows next to the oracle's (oracle_auc);
 *  - parse_lines_per_s of Criteo lines (as `ps-bench data`);
 *  - the same data's AUC for LR, FM and DeepFM (auc_lr, auc_fm, auc_deepfm; not with --smoke);
 *  - MovieLens (when $EMBER_SHARED_DATA or ../shared/data has it): ratings >= 4 positive, the
 *    last 20% by time as the test set, user and movie as two fields, batch 64, one epoch:
 *    movielens_auc_lr, movielens_auc_dlrm (and FM, DeepFM).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_datagen.h"
#include "pw_split.h"
#include "pw_train.h"

/* Single-thread sgemm GFLOP/s on square matrices of side m, for about `secs`. */
static double sgemm_peak(int m, double secs) {
    float *a = malloc((size_t)m * m * sizeof *a), *b = malloc((size_t)m * m * sizeof *b),
          *c = calloc((size_t)m * m, sizeof *c);
    for (size_t i = 0; i < (size_t)m * m; i++)
        a[i] = b[i] = (float)(i % 7) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, a, m, b, m, 0, c, m);
    int reps = 0;
    const uint64_t t0 = pc_time_mono_ns();
    while (pc_time_sec_since(t0) < secs || reps < 2) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1, a, m, b, m, 0, c, m);
        reps++;
    }
    const double s = pc_time_sec_since(t0);
    free(a);
    free(b);
    free(c);
    return 2.0 * m * m * (double)m * reps / s / 1e9;
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

int bench_train_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "train", &o);
    pc_log_set_level(PC_LOG_WARN);
    openblas_set_num_threads(1);
    const uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 20000 : o.quick ? 300000 : 2000000;
    const double peak = sgemm_peak(512, o.smoke ? 0.2 : 1.0);
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
    pw_train_config_t c;
    pw_train_config_defaults(&c); /* dim 16, 13-64-16, 128-64-1, batch 1024 */
    c.local_store = pw_emb_local_open;
    const char *trp[] = {tr}, *tep[] = {te};
    pw_train_result_t r;
    if (pw_train_run(&c, PW_FMT_CRITEO, trp, 1, tep, 1, &r))
        abort();
    /* Dense FLOPs per sample: forward GEMMs and dot products, backward twice that. */
    const int f = 27, np = f * (f - 1) / 2, d = (int)c.dim;
    double fwd = 2.0 * (13 * 64 + 64 * 16) + 2.0 * np * d;
    int in = d + np;
    for (char *p = c.top, *end; *p; p = *end ? end + 1 : end) { /* "128,64,1" */
        const int w = (int)strtol(p, &end, 10);
        fwd += 2.0 * in * w;
        in = w;
    }
    const double dense_gflops = r.samples_per_s * 3 * fwd / 1e9;
    double other[3] = {NAN, NAN, NAN};
    const char *others[] = {"lr", "fm", "deepfm"};
    for (int i = 0; i < 3 && !o.smoke; i++)
        other[i] = auc_of(c, others[i], PW_FMT_CRITEO, tr, te);
    size_t len;
    char *lines = bench_gen_lines(o.smoke ? 20000 : 200000, &len, NULL);
    double scan, ratio;
    const double parse = bench_parse_rate(lines, len, o.smoke ? 20000 : 200000, &scan, &ratio);
    free(lines);
    unlink(tr);
    unlink(te);
    printf("ps-bench train: DLRM (26 fields, dim 16, 13-64-16, 128-64-1), batch 1024, %llu "
           "training rows, OpenBLAS 1 thread + the reader thread\n",
           (unsigned long long)r.samples);
    printf("%-40s %12.0f samples/s\n", "local DLRM training", r.samples_per_s);
    printf("%-40s %12.2f GFLOP/s  (%.2f of sgemm 512^3, %.1f GFLOP/s, same run)\n", "dense part",
           dense_gflops, dense_gflops / peak, peak);
    printf("%-40s %12.4f  (oracle %.4f), logloss %.4f (oracle %.4f)\n", "test AUC", r.auc,
           oracle.oracle_auc, r.logloss, oracle.oracle_logloss);
    printf("%-40s %12.0f lines/s  (%.2f of a raw line scan)\n", "Criteo parsing", parse, ratio);
    printf("%-40s LR %.4f, FM %.4f, DeepFM %.4f\n", "other models' test AUC", other[0], other[1],
           other[2]);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "auc_lr", other[0]);
    cJSON_AddNumberToObject(root, "auc_fm", other[1]);
    cJSON_AddNumberToObject(root, "auc_deepfm", other[2]);
    if (!o.smoke)
        movielens(dir, root);
    rmdir(dir);
    cJSON_AddStringToObject(root, "bench", "train");
    cJSON_AddNumberToObject(root, "train_rows", (double)r.samples);
    cJSON_AddNumberToObject(root, "train_samples_per_s", r.samples_per_s);
    cJSON_AddNumberToObject(root, "dense_gflops", dense_gflops);
    cJSON_AddNumberToObject(root, "sgemm_gflops", peak);
    cJSON_AddNumberToObject(root, "dense_vs_sgemm_peak", dense_gflops / peak);
    cJSON_AddNumberToObject(root, "auc", r.auc);
    cJSON_AddNumberToObject(root, "logloss", r.logloss);
    cJSON_AddNumberToObject(root, "oracle_auc", oracle.oracle_auc);
    cJSON_AddNumberToObject(root, "oracle_logloss", oracle.oracle_logloss);
    cJSON_AddNumberToObject(root, "parse_lines_per_s", parse);
    bench_emit_json(&o, root);
    return 0;
}
