/* bench_store.c: `ps-bench store`: checkpoint and restore speed of a large table.
 *
 * A table of 10M rows (--quick: 1M; --smoke: 20k; --keys=N), dim 32 (--dim=D), Adagrad, is
 * filled, then:
 *  - baseline: the same number of bytes written sequentially (1 MiB writes) and fsynced into the
 *    same directory: the disk's plain sequential write speed, measured in the same run;
 *  - a full checkpoint (MB/s, ratio to the baseline) while a second thread keeps pushing:
 *    push throughput and the worst push-call latency during the checkpoint, next to the same
 *    pusher's figures without a checkpoint (the cost of the copy-on-write snapshot);
 *  - an incremental checkpoint after 1% of the rows changed;
 *  - restore of the full checkpoint into a fresh catalog (seconds, rows/s).
 * Files go to --dir (default $TMPDIR or /tmp) and are removed at the end.
 */
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_log.h"
#include "pc_time.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"

typedef struct pusher {
    ps_table_t *t;
    uint64_t nkeys;
    uint32_t dim;
    atomic_int stop;
    uint64_t rows;
    double max_ms, secs;
} pusher_t;

static void *push_loop(void *arg) {
    pusher_t *p = arg;
    enum { B = 1000 };
    uint64_t keys[B], rng = 99;
    float *g = calloc((size_t)B * p->dim, sizeof *g);
    for (size_t i = 0; i < (size_t)B * p->dim; i++)
        g[i] = 0.001f;
    uint64_t t0 = pc_time_mono_ns();
    while (!atomic_load(&p->stop)) {
        for (int i = 0; i < B; i++)
            keys[i] = bench_key(bench_rand(&rng) % p->nkeys);
        uint64_t a = pc_time_mono_ns();
        if (ps_table_push(p->t, keys, B, g, (size_t)B * p->dim, NULL))
            abort();
        double ms = (double)(pc_time_mono_ns() - a) * 1e-6;
        if (ms > p->max_ms)
            p->max_ms = ms;
        p->rows += B;
    }
    p->secs = pc_time_sec_since(t0);
    free(g);
    return NULL;
}

/* Write `bytes` sequentially as `files` equal files (1 MiB writes), fsyncing each (a
 * checkpoint writes one file per table and fsyncs it once); returns MB/s. */
static double seq_write(const char *dir, uint64_t bytes, int files) {
    const size_t chunk = 1 << 20;
    char *buf = malloc(chunk);
    for (size_t i = 0; i < chunk; i++)
        buf[i] = (char)(i * 131 + 7); /* not zeros: nothing to compress or skip */
    uint64_t t0 = pc_time_mono_ns();
    for (int f = 0; f < files; f++) {
        char path[700];
        snprintf(path, sizeof path, "%s/seqwrite-%d.bin", dir, f);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            abort();
        const uint64_t mine = bytes / (uint64_t)files;
        for (uint64_t done = 0; done < mine; done += chunk) {
            size_t n = mine - done < chunk ? (size_t)(mine - done) : chunk;
            if (write(fd, buf, n) != (ssize_t)n)
                abort();
        }
        fsync(fd);
        close(fd);
    }
    double s = pc_time_sec_since(t0);
    for (int f = 0; f < files; f++) {
        char path[700];
        snprintf(path, sizeof path, "%s/seqwrite-%d.bin", dir, f);
        unlink(path);
    }
    free(buf);
    return (double)bytes / s / 1e6;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

int bench_store_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "store", &o);
    pc_log_set_level(PC_LOG_WARN);
    uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 20000 : o.quick ? 1000000 : 10000000;
    uint32_t dim = o.dim > 0 ? (uint32_t)o.dim : 32;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ps-bench-store-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        abort();

    ps_catalog_t *cat;
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char spec[128];
    snprintf(spec, sizeof spec, "name=bench,dim=%u,optimizer=adagrad,shards=16", dim);
    if (ps_catalog_create(&cat) || ps_table_config_parse(&c, spec, NULL, 0) ||
        ps_catalog_add(cat, &c))
        abort();
    ps_table_t *t;
    ps_catalog_acquire(cat, "bench", &t);
    bench_fill(t, n);
    printf("ps-bench store: %llu rows, dim %u, Adagrad, directory %s\n", (unsigned long long)n, dim,
           dir);

    /* Pusher alone, for the baseline of push figures. */
    pusher_t base = {.t = t, .nkeys = n, .dim = dim};
    pthread_t th;
    pthread_create(&th, NULL, push_loop, &base);
    usleep(o.smoke ? 50000 : 1000000);
    atomic_store(&base.stop, 1);
    pthread_join(th, NULL);

    ps_ckpt_t *ck;
    ps_ckpt_opts_t co = {.dir = dir, .keep = 2, .full_every = 1};
    if (ps_ckpt_create(cat, &co, &ck))
        abort();
    /* Three (sequential write, full checkpoint) pairs of the same size, back to back: the disk
     * of a shared VM bursts and throttles, so only ratios of neighbouring samples mean much. */
    const uint64_t approx = n * (12 + (uint64_t)dim * 8);
    double seq[3], ck_mb[3], ratio[3];
    ps_ckpt_result_t full;
    for (int r = 0; r < 3; r++) {
        seq[r] = seq_write(dir, approx, 1);
        if (ps_ckpt_write(ck, &full))
            abort();
        ck_mb[r] = (double)full.bytes / full.seconds / 1e6;
        ratio[r] = ck_mb[r] / seq[r];
    }
    double seq_mb = bench_median3(seq), ckpt_mb = bench_median3(ck_mb),
           ckpt_ratio = bench_median3(ratio);

    /* A full checkpoint while a second thread keeps pushing: the snapshot's cost to training. */
    pusher_t live = {.t = t, .nkeys = n, .dim = dim};
    pthread_t th2;
    pthread_create(&th2, NULL, push_loop, &live);
    ps_ckpt_result_t during;
    if (ps_ckpt_write(ck, &during))
        abort();
    atomic_store(&live.stop, 1);
    pthread_join(th2, NULL);
    ps_ckpt_destroy(ck);

    /* Incremental after exactly 1% of the rows changed (a chain: full, then increments). */
    ps_ckpt_opts_t io = {.dir = dir, .keep = 3, .full_every = 10};
    if (ps_ckpt_create(cat, &io, &ck))
        abort();
    ps_ckpt_result_t base_full, inc;
    if (ps_ckpt_write(ck, &base_full))
        abort();
    /* exactly n / 100 distinct rows, by an odd stride through the key space */
    enum { B = 1000 };
    uint64_t k[B];
    float *g = malloc((size_t)B * dim * sizeof *g);
    for (size_t i = 0; i < (size_t)B * dim; i++)
        g[i] = 0.001f;
    const uint64_t changed = n / 100, stride = 2654435761u;
    for (uint64_t done = 0; done < changed;) {
        size_t m = changed - done < B ? (size_t)(changed - done) : B;
        for (size_t i = 0; i < m; i++)
            k[i] = bench_key(((done + i) * stride) % n);
        if (ps_table_push(t, k, m, g, m * dim, NULL))
            abort();
        done += m;
    }
    free(g);
    if (ps_ckpt_write(ck, &inc))
        abort();

    /* Restore the full checkpoint into a fresh catalog. */
    ps_catalog_t *cat2;
    ps_ckpt_t *ck2;
    ps_catalog_create(&cat2);
    ps_ckpt_create(cat2, &io, &ck2);
    uint64_t t0 = pc_time_mono_ns();
    if (ps_ckpt_restore(ck2, base_full.id, NULL))
        abort();
    double restore_s = pc_time_sec_since(t0);

    double base_rate = (double)base.rows / base.secs, live_rate = (double)live.rows / live.secs;
    printf("%-42s %10.1f MB/s  (one file, one fsync, as a table file; median; samples %.0f %.0f "
           "%.0f)\n",
           "sequential write + fsync (same disk)", seq_mb, seq[0], seq[1], seq[2]);
    printf("%-42s %10.1f MB/s  (median ratio to its neighbour %.2f; %.0f MB; samples %.0f %.0f "
           "%.0f)\n",
           "full checkpoint", ckpt_mb, ckpt_ratio, (double)full.bytes / 1e6, ck_mb[0], ck_mb[1],
           ck_mb[2]);
    printf("%-42s %10.2f s     (%.0f rows/s)\n", "restore of the full checkpoint", restore_s,
           (double)base_full.rows / restore_s);
    printf("%-42s %10.2f s     (%.1f MB, %llu rows)\n", "incremental checkpoint (1% changed)",
           inc.seconds, (double)inc.bytes / 1e6, (unsigned long long)inc.rows);
    printf("%-42s %10.0f rows/s, worst call %.1f ms\n", "pushes without checkpoint", base_rate,
           base.max_ms);
    printf("%-42s %10.0f rows/s, worst call %.1f ms\n", "pushes during the full checkpoint",
           live_rate, live.max_ms);
    printf("cold tier figures (cold_pull_vs_multiget): not measured, the RocksDB tier is not built "
           "yet\n");

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "store");
    cJSON_AddNumberToObject(root, "rows", (double)n);
    cJSON_AddNumberToObject(root, "dim", dim);
    cJSON_AddNumberToObject(root, "ckpt_bytes", (double)full.bytes);
    cJSON_AddNumberToObject(root, "ckpt_seconds_during_pushes", during.seconds);
    cJSON_AddNumberToObject(root, "ckpt_mb_per_s", ckpt_mb);
    cJSON_AddNumberToObject(root, "seqwrite_mb_per_s", seq_mb);
    cJSON_AddNumberToObject(root, "ckpt_vs_seqwrite", ckpt_ratio);
    cJSON_AddNumberToObject(root, "restore_seconds", restore_s);
    cJSON_AddNumberToObject(root, "restore_rows_per_s", (double)base_full.rows / restore_s);
    cJSON_AddNumberToObject(root, "incremental_seconds", inc.seconds);
    cJSON_AddNumberToObject(root, "incremental_bytes", (double)inc.bytes);
    cJSON_AddNumberToObject(root, "push_rows_per_s", base_rate);
    cJSON_AddNumberToObject(root, "push_rows_per_s_during_ckpt", live_rate);
    cJSON_AddNumberToObject(root, "push_max_call_ms", base.max_ms);
    cJSON_AddNumberToObject(root, "push_max_call_ms_during_ckpt", live.max_ms);
    bench_emit_json(&o, root);

    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(cat2);
    ps_ckpt_destroy(ck);
    ps_catalog_release(cat, t);
    ps_catalog_destroy(cat);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
