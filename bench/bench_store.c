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
 * Cold tier (a separate table of 2M rows, --quick 1M, --smoke 20k; dim 64, Adagrad, RAM budget
 * 10% of the rows, the rest in the RocksDB tier):
 *  - pulls of 1000 uniformly random keys (90% of them cold: fetched and promoted, evicting clean
 *    rows) against raw rocksdb_batched_multi_get_cf of the same keys and values: the tier's own
 *    checkpoint (the same SST files) opened read-only with a block cache of the same size.
 *    Three interleaved pairs, median ratio (cold_pull_vs_multiget);
 *  - the cold table's fill (spill rate) and a checkpoint of it (hard links + RAM rows).
 * Files go to $TMPDIR (default /tmp) and are removed at the end.
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
#include "ps_tier.h"

#include <rocksdb/c.h>

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

/* ---- cold tier ------------------------------------------------------------------------------ */

#define COLD_CACHE (256ull << 20)
enum { CB = 1000 };

typedef struct cold_figs {
    uint64_t rows, ram_rows;
    double fill_rows_per_s, pull_rows_per_s, mget_rows_per_s, ratio, hit_frac;
    double ckpt_seconds, ckpt_mb;
} cold_figs_t;

/* Raw batched MultiGet of `calls` batches of CB random keys (same generator as the pulls) from
 * the read-only database `db`, column family `h`; touches every value. Rows/s. */
static double raw_multiget(rocksdb_t *db, rocksdb_column_family_handle_t *h, uint64_t n,
                           uint64_t seed, int calls) {
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    static char kb[CB][8];
    const char *kl[CB];
    size_t ks[CB];
    rocksdb_pinnableslice_t *vals[CB];
    char *errs[CB];
    uint64_t rng = seed, sink = 0;
    const uint64_t t0 = pc_time_mono_ns();
    for (int c = 0; c < calls; c++) {
        for (int i = 0; i < CB; i++) {
            uint64_t key = bench_key(bench_rand(&rng) % n);
            for (int b = 0; b < 8; b++)
                kb[i][b] = (char)(key >> (56 - 8 * b));
            kl[i] = kb[i];
            ks[i] = 8;
        }
        rocksdb_batched_multi_get_cf(db, ro, h, CB, kl, ks, vals, errs, false);
        for (int i = 0; i < CB; i++) {
            if (errs[i])
                abort();
            if (!vals[i])
                continue;
            size_t len;
            const char *v = rocksdb_pinnableslice_value(vals[i], &len);
            sink += (uint8_t)v[len - 1]; /* use the value, as a pull copies it */
            rocksdb_pinnableslice_destroy(vals[i]);
        }
    }
    double secs = pc_time_sec_since(t0);
    rocksdb_readoptions_destroy(ro);
    if (sink == 42)
        printf(" ");
    return (double)calls * CB / secs;
}

static double cold_pulls(ps_table_t *t, uint64_t n, uint64_t seed, int calls) {
    uint64_t keys[CB], rng = seed;
    float *rows = malloc((size_t)CB * 64 * sizeof *rows);
    const uint64_t t0 = pc_time_mono_ns();
    for (int c = 0; c < calls; c++) {
        for (int i = 0; i < CB; i++)
            keys[i] = bench_key(bench_rand(&rng) % n);
        if (ps_table_pull(t, keys, CB, rows, (size_t)CB * 64))
            abort();
    }
    double secs = pc_time_sec_since(t0);
    free(rows);
    return (double)calls * CB / secs;
}

/* Open the tier checkpoint `path` read-only with the tier's table options; *h gets the column
 * family of table "cold". */
static rocksdb_t *open_ro(const char *path, rocksdb_column_family_handle_t **h,
                          rocksdb_options_t **opts, rocksdb_cache_t **cache,
                          rocksdb_block_based_table_options_t **bbo) {
    *opts = rocksdb_options_create();
    *bbo = rocksdb_block_based_options_create();
    *cache = rocksdb_cache_create_lru(COLD_CACHE);
    rocksdb_block_based_options_set_block_cache(*bbo, *cache);
    rocksdb_block_based_options_set_filter_policy(*bbo, rocksdb_filterpolicy_create_bloom(10));
    rocksdb_block_based_options_set_block_size(*bbo, 16 << 10);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(*bbo, 1);
    rocksdb_options_set_block_based_table_factory(*opts, *bbo);
    char *err = NULL;
    size_t ncf = 0;
    char **names = rocksdb_list_column_families(*opts, path, &ncf, &err);
    if (err)
        abort();
    const rocksdb_options_t **co = calloc(ncf, sizeof *co);
    rocksdb_column_family_handle_t **hs = calloc(ncf, sizeof *hs);
    for (size_t i = 0; i < ncf; i++)
        co[i] = *opts;
    rocksdb_t *db = rocksdb_open_for_read_only_column_families(
        *opts, path, (int)ncf, (const char *const *)names, co, hs, 0, &err);
    if (err)
        abort();
    *h = NULL;
    for (size_t i = 0; i < ncf; i++) {
        if (strcmp(names[i], "t.cold") == 0)
            *h = hs[i];
        else
            rocksdb_column_family_handle_destroy(hs[i]);
    }
    if (!*h)
        abort();
    rocksdb_list_column_families_destroy(names, ncf);
    free(co);
    free(hs);
    return db;
}

static void bench_cold(const bench_opts_t *o, const char *dir, cold_figs_t *f) {
    const uint64_t n = o->smoke ? 20000 : o->quick ? 1000000 : 2000000;
    char live[700], ckd[700], spec[160];
    snprintf(live, sizeof live, "%s/cold-live", dir);
    snprintf(ckd, sizeof ckd, "%s/cold-ckpt", dir);
    ps_tier_t *tier;
    ps_tier_opts_t to = {.dir = live, .cache_bytes = COLD_CACHE, .min_free_bytes = 64 << 20};
    ps_catalog_t *cat;
    if (ps_tier_open(&to, &tier) || ps_catalog_create(&cat))
        abort();
    ps_tier_bind_catalog(tier, cat);
    snprintf(spec, sizeof spec,
             "name=cold,dim=64,optimizer=adagrad,shards=16,capacity_rows=%llu,cold=true",
             (unsigned long long)(n / 10));
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    ps_table_t *t;
    if (ps_table_config_parse(&c, spec, NULL, 0) || ps_catalog_add(cat, &c) ||
        ps_catalog_acquire(cat, "cold", &t))
        abort();
    /* Fill: every row changed (loaded), so 90% of them are spilled. */
    enum { FB = 10000 };
    uint64_t *keys = malloc(FB * sizeof *keys);
    float *w = malloc((size_t)FB * 64 * sizeof *w);
    for (size_t i = 0; i < (size_t)FB * 64; i++)
        w[i] = (float)(i % 97) * 0.01f;
    uint64_t t0 = pc_time_mono_ns();
    for (uint64_t i = 0; i < n; i += FB) {
        size_t m = n - i < FB ? (size_t)(n - i) : FB;
        for (size_t j = 0; j < m; j++)
            keys[j] = bench_key(i + j);
        if (ps_table_load(t, m, keys, w, NULL, NULL, NULL))
            abort();
    }
    f->rows = n;
    f->fill_rows_per_s = (double)n / pc_time_sec_since(t0);
    free(keys);
    free(w);
    /* Warm up: the changed rows still in RAM leave (spilled); what replaces them is clean. */
    cold_pulls(t, n, 1, (int)(2 * (n / 10) / CB) + 1);
    /* Checkpoint: the cold tier by hard links plus the RAM rows; it also flushes memtables, so
     * the copy holds every cold row for the baseline to read. */
    ps_ckpt_t *ck;
    ps_ckpt_opts_t co = {.dir = ckd, .keep = 1, .full_every = 1, .tier = tier};
    ps_ckpt_result_t cr;
    if (ps_ckpt_create(cat, &co, &ck) || ps_ckpt_write(ck, &cr))
        abort();
    f->ckpt_seconds = cr.seconds;
    f->ckpt_mb = (double)cr.bytes / 1e6;
    char ro_path[800];
    snprintf(ro_path, sizeof ro_path, "%s/ckpt-%020llu/cold", ckd, (unsigned long long)cr.id);
    rocksdb_column_family_handle_t *h;
    rocksdb_options_t *opts;
    rocksdb_cache_t *cache;
    rocksdb_block_based_table_options_t *bbo;
    rocksdb_t *db = open_ro(ro_path, &h, &opts, &cache, &bbo);
    const int calls = o->smoke ? 10 : 300;
    raw_multiget(db, h, n, 2, calls); /* warm the baseline's cache as the pulls warmed theirs */
    double pr[3], mr[3], ratio[3];
    ps_table_stats_t s0, s1;
    ps_table_stats(t, &s0);
    /* Both read the same keys of a round, and the checkpoint's files are hard links of the
     * tier's (one page cache): the order alternates, so neither always reads what the other
     * just faulted in. */
    for (int r = 0; r < 3; r++) {
        if (r % 2) {
            mr[r] = raw_multiget(db, h, n, 100 + (uint64_t)r, calls);
            pr[r] = cold_pulls(t, n, 100 + (uint64_t)r, calls);
        } else {
            pr[r] = cold_pulls(t, n, 100 + (uint64_t)r, calls);
            mr[r] = raw_multiget(db, h, n, 100 + (uint64_t)r, calls);
        }
        ratio[r] = pr[r] / mr[r];
    }
    ps_table_stats(t, &s1);
    f->pull_rows_per_s = bench_median3(pr);
    f->mget_rows_per_s = bench_median3(mr);
    f->ratio = bench_median3(ratio);
    f->hit_frac = (double)(s1.cold_hits - s0.cold_hits) / (3.0 * calls * CB);
    f->ram_rows = ps_table_count(t);
    rocksdb_column_family_handle_destroy(h);
    rocksdb_close(db);
    rocksdb_options_destroy(opts);
    rocksdb_block_based_options_destroy(bbo);
    rocksdb_cache_destroy(cache);
    ps_ckpt_destroy(ck);
    ps_catalog_release(cat, t);
    ps_catalog_destroy(cat);
    ps_tier_close(tier);
}

int bench_store_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "store", &o);
    pc_log_set_level(PC_LOG_WARN);
    uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 20000 : o.quick ? 1000000 : 10000000;
    uint32_t dim = o.dim > 0 ? (uint32_t)o.dim : 32;
    char dir[512];
    bench_tmpdir("store", dir, sizeof dir);

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
    cold_figs_t cf;
    bench_cold(&o, dir, &cf);
    printf("cold tier: %llu rows, dim 64, Adagrad, %llu in RAM (10%%), %.0f%% of pulled keys "
           "read from RocksDB\n",
           (unsigned long long)cf.rows, (unsigned long long)cf.ram_rows, 100.0 * cf.hit_frac);
    printf("%-42s %10.0f rows/s\n", "fill (loads; 90% spilled)", cf.fill_rows_per_s);
    printf("%-42s %10.0f rows/s\n", "raw batched MultiGet (same keys, 1000/call)",
           cf.mget_rows_per_s);
    printf("%-42s %10.0f rows/s  (median ratio %.2f)\n", "pull, 90% cold (1000/call)",
           cf.pull_rows_per_s, cf.ratio);
    printf("%-42s %10.2f s     (%.1f MB: RAM rows + hard-linked cold files)\n",
           "checkpoint of the cold table", cf.ckpt_seconds, cf.ckpt_mb);

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
    cJSON_AddNumberToObject(root, "cold_rows", (double)cf.rows);
    cJSON_AddNumberToObject(root, "cold_ram_rows", (double)cf.ram_rows);
    cJSON_AddNumberToObject(root, "cold_read_fraction", cf.hit_frac);
    cJSON_AddNumberToObject(root, "cold_fill_rows_per_s", cf.fill_rows_per_s);
    cJSON_AddNumberToObject(root, "cold_pull_rows_per_s", cf.pull_rows_per_s);
    cJSON_AddNumberToObject(root, "multiget_rows_per_s", cf.mget_rows_per_s);
    cJSON_AddNumberToObject(root, "cold_pull_vs_multiget", cf.ratio);
    cJSON_AddNumberToObject(root, "cold_ckpt_seconds", cf.ckpt_seconds);
    bench_emit_json(&o, root);

    ps_ckpt_destroy(ck2);
    ps_catalog_destroy(cat2);
    ps_ckpt_destroy(ck);
    ps_catalog_release(cat, t);
    ps_catalog_destroy(cat);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
