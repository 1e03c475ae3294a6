/* bench_table.c: `ps-bench table`: throughput of the in-process embedding table against the
 * memory-gather limit measured in the same process.
 *
 * For each dim (16, 64) and table size (1M, 16M keys; --quick: 1M; --smoke: 100k) the table is
 * filled completely, then batches of 1000 keys drawn uniformly or Zipf(1.05) over the keys are
 * pulled, pushed (Adagrad; Adam on a second table) and looked up by 1 and 2 threads, each thread
 * pinned to its own core. The reference gather copies the same rows, by precomputed row id, from
 * a flat float array (huge pages, touched) into the same output buffer: no hashing, no locks, no
 * optimizer. pull_vs_ref and push_vs_ref are the ratios for the same keys and threads; the
 * headline is dim 64, and each dim's own ratios are in pull_vs_ref_dimD / push_vs_ref_dimD and
 * by_dim (optim_kernels names the optimizer kernels the CPU got).
 * Replication's row copies (uniform keys, 1 thread, interleaved with the above): read_state
 * (whole rows with optimizer state out, as a primary answers DELTAS and SCAN) and load (whole
 * rows in, as a backup or a restore writes them), in rows/s and against the gather of the same
 * keys' weights: read_state_vs_ref, load_vs_ref (they move twice its bytes with Adagrad). The
 * load writes 0.01 into every row and state it touches, so the samples after it run on those
 * values (finite and normal: the same work per row).
 * Memory overhead per row is reported twice: exact accounting (keys + metadata + index) and the
 * growth of the resident set while filling the table, minus the floats. The fill itself (pulls
 * of 65,536 new keys at a time into the empty table: index placement and growth, slab growth,
 * initial rows, first-touch page faults) is insert_rows_per_s, and insert_vs_ref against the
 * uniform 1-thread gather: the rate at which a stream of new ids can enter.
 * Stored row types (docs/table.md): at the first size, an Adagrad table storing its weights in
 * bf16 against one in f32, both filled and alive, pull and push samples interleaved (uniform
 * keys, 1 thread): pull_stored_bf16_vs_f32, push_stored_bf16_vs_f32 (rows/s ratios, medians of
 * 3) and the bytes per row of each (weights, state, keys, metadata and index, exact accounting:
 * row_bytes_f32, row_bytes_stored_bf16, stored_bf16_memory_ratio); dim 64's at the top level,
 * every dim's under by_dim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "pc_rand.h"
#include "pc_alloc.h"
#include "pc_time.h"
#include "ps_optim.h"
#include "ps_table.h"

#define BATCH      1000
#define STREAM_LEN (2u * 1000 * 1000) /* keys per thread stream */
#define MAX_THR    2

typedef enum { OP_PULL, OP_PUSH, OP_LOOKUP, OP_REF, OP_REF_ADAGRAD, OP_READ_STATE, OP_LOAD } op_t;
static const char *const k_dist_names[] = {"uniform", "zipf"};

typedef struct stream {
    uint64_t *keys;
    uint32_t *idx;
    size_t n;
    uint64_t nkeys; /* size of the key universe idx points into */
} stream_t;

typedef struct job {
    op_t op;
    ps_table_t *t;
    const float *ref;
    uint32_t dim;
    const stream_t *st;
    const float *grads;
    const ps_optim_t *optim;
    float *out;
    const bench_opts_t *o;
    int cpu;      /* thread number, also its CPU when pinned */
    int nthreads; /* threads of this sample */
    uint64_t nrows;
    double seconds;
    uint64_t rows;
    double elapsed;
    int rc;
} job_t;

static void *job_run(void *arg) {
    job_t *j = arg;
    bench_pin(j->o, j->cpu);
    const size_t dim = j->dim;
    size_t pos = 0;
    uint64_t rows = 0, t0 = pc_time_mono_ns();
    uint8_t found[BATCH];
    do {
        for (int b = 0; b < 4; b++) {
            const uint64_t *k = j->st->keys + pos;
            const uint32_t *ix = j->st->idx + pos;
            int rc = 0;
            switch (j->op) {
                case OP_PULL:
                    rc = ps_table_pull(j->t, k, BATCH, j->out, BATCH * dim);
                    break;
                case OP_PUSH:
                    rc = ps_table_push(j->t, k, BATCH, j->grads, BATCH * dim, NULL);
                    break;
                case OP_LOOKUP:
                    rc = ps_table_lookup(j->t, k, BATCH, j->out, BATCH * dim, NULL);
                    break;
                case OP_READ_STATE: /* whole rows out, as a delta stream's primary sends them */
                    rc = ps_table_read_state(j->t, k, BATCH, j->out, found);
                    break;
                case OP_LOAD: /* whole rows in (from grads: stride floats each), as a backup */
                    rc = ps_table_load_rows_unlogged(j->t, BATCH, k, j->grads);
                    break;
                case OP_REF:
                    for (size_t i = 0; i < BATCH; i++) {
                        if (i + 16 < BATCH) {
                            const char *p = (const char *)(j->ref + (size_t)ix[i + 16] * dim);
                            for (size_t l = 0; l < dim * 4; l += 64)
                                __builtin_prefetch(p + l, 0, 3);
                        }
                        memcpy(j->out + i * dim, j->ref + (size_t)ix[i] * dim, dim * 4);
                    }
                    break;
                case OP_REF_ADAGRAD: /* same update, flat [w | G] rows, no hashing or locks */
                    for (size_t i = 0; i < BATCH; i++) {
                        if (i + 16 < BATCH) {
                            uint32_t own = ix[i + 16] - ix[i + 16] % j->nthreads + (uint32_t)j->cpu;
                            if (own >= j->nrows)
                                own = (uint32_t)j->cpu;
                            const char *p = (const char *)(j->ref + (size_t)own * 2 * dim);
                            for (size_t l = 0; l < dim * 8; l += 64)
                                __builtin_prefetch(p + l, 1, 3);
                        }
                        /* Threads own disjoint rows (no locks here): round to this thread's. */
                        uint32_t own = ix[i] - ix[i] % j->nthreads + (uint32_t)j->cpu;
                        if (own >= j->nrows)
                            own = (uint32_t)j->cpu;
                        float *row = (float *)j->ref + (size_t)own * 2 * dim;
                        if (ps__grad_finite(j->optim, j->grads + i * dim))
                            ps__optim_step(j->optim, row, row + dim, j->grads + i * dim);
                    }
                    break;
            }
            if (rc)
                j->rc = rc;
            rows += BATCH;
            pos += BATCH;
            if (pos + BATCH > j->st->n)
                pos = 0;
        }
    } while (pc_time_sec_since(t0) < j->seconds);
    j->elapsed = pc_time_sec_since(t0);
    j->rows = rows;
    return NULL;
}

/* One sample: rows per second of `op` with `threads` threads, each on its own stream. */
static double sample(const bench_opts_t *o, op_t op, ps_table_t *t, const float *ref, uint32_t dim,
                     stream_t *streams, int threads, const float *grads, const ps_optim_t *optim,
                     float **outs, double seconds) {
    job_t jobs[MAX_THR];
    void *ctx[MAX_THR];
    if (threads < 1 || threads > MAX_THR)
        abort();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job_t){.optim = optim,
                          .op = op,
                          .t = t,
                          .ref = ref,
                          .dim = dim,
                          .st = &streams[i],
                          .grads = grads,
                          .out = outs[i],
                          .o = o,
                          .cpu = i,
                          .seconds = seconds,
                          .nthreads = threads,
                          .nrows = streams[i].nkeys};
        ctx[i] = &jobs[i];
    }
    bench_run_threads(threads, job_run, ctx);
    double rate = 0;
    for (int i = 0; i < threads; i++) {
        if (jobs[i].rc) {
            fprintf(stderr, "ps-bench table: operation failed with %d\n", jobs[i].rc);
            exit(1);
        }
        rate += (double)jobs[i].rows / jobs[i].elapsed;
    }
    return rate;
}

#define ROUNDS 3

static void make_stream(stream_t *s, uint64_t nkeys, int dist, uint64_t seed, size_t len) {
    s->n = len;
    s->nkeys = nkeys;
    s->keys = malloc(len * sizeof *s->keys);
    s->idx = malloc(len * sizeof *s->idx);
    if (!s->keys || !s->idx)
        abort();
    pc_zipf_t z;
    pc_zipf_init(&z, nkeys, 1.05);
    uint64_t rng = seed;
    const uint64_t stride = 2654435761u; /* odd, coprime to nkeys: scatters hot ranks */
    for (size_t i = 0; i < len; i++) {
        uint64_t r =
            dist == 0 ? bench_rand(&rng) % nkeys : ((pc_zipf_next(&z, &rng) - 1) * stride) % nkeys;
        s->idx[i] = (uint32_t)r;
        s->keys[i] = bench_key(r);
    }
}

/* A table (16 shards) filled with nkeys keys (bench_fill): its exact overhead and resident
 * growth beyond the floats per row, the huge-page share of that growth, and (insert_rate, may be
 * NULL) the fill's rows/s. */
static ps_table_t *make_filled(const char *optimizer, const char *dtype, uint32_t dim,
                               uint64_t nkeys, double *overhead, double *rss_overhead,
                               double *huge_frac, double *insert_rate) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char spec[200];
    snprintf(spec, sizeof spec, "dim=%u,optimizer=%s,lr=0.01,init=uniform,shards=%u,row_dtype=%s",
             dim, optimizer, 16u, dtype);
    if (ps_table_config_parse(&c, spec, NULL, 0))
        abort();
    ps_table_t *t;
    if (ps_table_create(&c, &t))
        abort();
    uint64_t rss0 = bench_rss_bytes(), huge0 = bench_anon_huge_bytes();
    const uint64_t t0 = pc_time_mono_ns();
    bench_fill(t, nkeys);
    if (insert_rate)
        *insert_rate = (double)nkeys / pc_time_sec_since(t0);
    uint64_t rss1 = bench_rss_bytes(), huge1 = bench_anon_huge_bytes();
    ps_table_stats_t st;
    ps_table_stats(t, &st);
    *overhead = ps_table_stats_overhead_per_row(&st);
    double floats = (double)(st.bytes_weights + st.bytes_state);
    *rss_overhead = ((double)(rss1 - rss0) - floats) / (double)st.rows;
    *huge_frac = rss1 > rss0 ? (double)(huge1 - huge0) / (double)(rss1 - rss0) : 0;
    return t;
}

/* Stored bf16 rows against f32 (see the file's comment), for one dim. */
typedef struct stored {
    double pull, push; /* bf16 / f32 rows/s */
    double pull_f32, pull_bf16, push_f32, push_bf16;
    double bytes_f32, bytes_bf16; /* per row, exact accounting */
} stored_t;

static double row_bytes(ps_table_t *t, double overhead) {
    ps_table_stats_t st;
    ps_table_stats(t, &st);
    return (double)(st.bytes_weights + st.bytes_state) / (double)st.rows + overhead;
}

/* tf: the f32 Adagrad table of phase 1 (filled, overhead ovh_f32 bytes a row). */
static void stored_bf16(const bench_opts_t *o, ps_table_t *tf, double ovh_f32, uint32_t dim,
                        uint64_t n, stream_t *streams, const float *grads, float **outs,
                        double secs, stored_t *out) {
    double ovh_bf16, rss, huge, v[4][ROUNDS];
    ps_table_t *tb = make_filled("adagrad", "bf16", dim, n, &ovh_bf16, &rss, &huge, NULL);
    for (int r = 0; r < ROUNDS; r++) {
        v[0][r] = sample(o, OP_PULL, tf, NULL, dim, streams, 1, grads, NULL, outs, secs);
        v[1][r] = sample(o, OP_PULL, tb, NULL, dim, streams, 1, grads, NULL, outs, secs);
        v[2][r] = sample(o, OP_PUSH, tf, NULL, dim, streams, 1, grads, NULL, outs, secs);
        v[3][r] = sample(o, OP_PUSH, tb, NULL, dim, streams, 1, grads, NULL, outs, secs);
    }
    double ratio[2][ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        ratio[0][r] = v[1][r] / v[0][r];
        ratio[1][r] = v[3][r] / v[2][r];
    }
    *out = (stored_t){.pull = bench_median3(ratio[0]),
                      .push = bench_median3(ratio[1]),
                      .pull_f32 = bench_median3(v[0]),
                      .pull_bf16 = bench_median3(v[1]),
                      .push_f32 = bench_median3(v[2]),
                      .push_bf16 = bench_median3(v[3]),
                      .bytes_f32 = row_bytes(tf, ovh_f32),
                      .bytes_bf16 = row_bytes(tb, ovh_bf16)};
    printf("     stored bf16 (adagrad, uniform, 1 thread): pull %.0f rows/s (f32 %.0f, %.2fx), "
           "push %.0f (f32 %.0f, %.2fx); %.1f B/row against %.1f (%.2f)\n",
           out->pull_bf16, out->pull_f32, out->pull, out->push_bf16, out->push_f32, out->push,
           out->bytes_bf16, out->bytes_f32, out->bytes_bf16 / out->bytes_f32);
    ps_table_destroy(tb);
}

int bench_table_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "table", &o);
    uint32_t dims[2] = {16, 64};
    int ndims = 2;
    uint64_t sizes[2] = {1u << 20, 16u << 20};
    int nsizes = 2;
    double secs = 0.4;
    size_t stream_len = STREAM_LEN;
    if (o.quick) {
        nsizes = 1;
        secs = 0.1;
    }
    if (o.smoke) {
        sizes[0] = 100000;
        nsizes = 1;
        secs = 0.01;
        stream_len = 50000;
    }
    if (o.seconds > 0)
        secs = o.seconds;
    if (o.dim > 0) {
        dims[0] = (uint32_t)o.dim;
        ndims = 1;
    }
    if (o.keys > 0) {
        sizes[0] = (uint64_t)o.keys;
        nsizes = 1;
    }

    cJSON *root = cJSON_CreateObject(), *cases = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "bench", "table");
    cJSON_AddNumberToObject(root, "batch", BATCH);
    cJSON_AddNumberToObject(root, "seconds_per_measurement", secs);
    printf("ps-bench table: rows/s, batch %d, median of %d samples of %.2fs; gather, pull, push "
           "and lookup interleaved, flat update and Adam in their own phases; threads pinned=%s\n",
           BATCH, ROUNDS, secs, o.pin ? "yes" : "no");
    printf("%4s %9s %7s %3s %11s %11s %11s %11s %11s %11s %6s %6s %6s\n", "dim", "keys", "dist",
           "thr", "pull", "push_adagr", "push_adam", "lookup", "ref_gather", "ref_update", "pull/r",
           "push/r", "push/u");
    cJSON *main_case = NULL, *main_case2 = NULL;
    cJSON *dim_cases[2] = {NULL, NULL}; /* per dim: largest size, uniform, 1 thread */
    stored_t stored[2] = {{0}};
    float *outs[MAX_THR];
    uint32_t maxdim = 0;
    for (int i = 0; i < ndims; i++)
        maxdim = dims[i] > maxdim ? dims[i] : maxdim;
    if (maxdim > 1024) {
        fprintf(stderr, "ps-bench table: --dim must be 1..1024\n");
        return 2;
    }
    float *grads = malloc((size_t)BATCH * maxdim * sizeof *grads);
    uint64_t grng = 3;
    for (size_t i = 0; i < (size_t)BATCH * maxdim; i++)
        grads[i] = (float)((double)(bench_rand(&grng) >> 11) * 0x1p-53 - 0.5) * 0.01f;
    for (int i = 0; i < MAX_THR; i++) /* whole Adagrad rows for read_state */
        outs[i] = malloc((size_t)BATCH * maxdim * 2 * sizeof(float));
    float *srows = malloc((size_t)BATCH * maxdim * 2 * sizeof *srows); /* rows a load writes */
    for (size_t i = 0; i < (size_t)BATCH * maxdim * 2; i++)
        srows[i] = 0.01f;

    for (int si = 0; si < nsizes; si++) {
        const uint64_t n = sizes[si];
        stream_t streams[2][MAX_THR];
        for (int d = 0; d < 2; d++)
            for (int th = 0; th < MAX_THR; th++)
                make_stream(&streams[d][th], n, d, 100 + (uint64_t)(d * 10 + th), stream_len);
        for (int di = 0; di < ndims; di++) {
            const uint32_t dim = dims[di];
            double r_ref[2][MAX_THR], r_upd[2][MAX_THR], r_pull[2][MAX_THR], r_push[2][MAX_THR],
                r_adam[2][MAX_THR], r_look[2][MAX_THR], r_read = 0, r_load = 0;
            double v[6][ROUNDS];
            /* 1. Adagrad table and the flat reference array side by side; their samples are
             * interleaved (ref, pull, push, lookup; three rounds; medians) so that a change in
             * the machine's state hits both sides of every ratio alike. */
            size_t ref_bytes = (size_t)n * dim * sizeof(float);
            float *ref = pc_vm_alloc(PC_MEM_OTHER, ref_bytes);
            if (!ref)
                abort();
            pc_vm_advise_huge(ref, ref_bytes, 0);
            for (size_t i = 0; i < (size_t)n * dim; i++)
                ref[i] = (float)(i & 1023);
            double ovh, rss_ovh, huge_frac, r_insert;
            ps_table_t *t =
                make_filled("adagrad", "f32", dim, n, &ovh, &rss_ovh, &huge_frac, &r_insert);
            for (int d = 0; d < 2; d++) {
                for (int th = 1; th <= MAX_THR; th++) {
                    for (int r = 0; r < ROUNDS; r++) {
                        v[0][r] = sample(&o, OP_REF, NULL, ref, dim, streams[d], th, grads, NULL,
                                         outs, secs);
                        v[1][r] = sample(&o, OP_PULL, t, NULL, dim, streams[d], th, grads, NULL,
                                         outs, secs);
                        v[2][r] = sample(&o, OP_PUSH, t, NULL, dim, streams[d], th, grads, NULL,
                                         outs, secs);
                        v[3][r] = sample(&o, OP_LOOKUP, t, NULL, dim, streams[d], th, grads, NULL,
                                         outs, secs);
                        if (d == 0 && th == 1) { /* replication's row copies: uniform, 1 thread */
                            v[4][r] = sample(&o, OP_READ_STATE, t, NULL, dim, streams[d], th, grads,
                                             NULL, outs, secs);
                            v[5][r] = sample(&o, OP_LOAD, t, NULL, dim, streams[d], th, srows, NULL,
                                             outs, secs);
                        }
                    }
                    if (d == 0 && th == 1) {
                        r_read = bench_median3(v[4]);
                        r_load = bench_median3(v[5]);
                    }
                    r_ref[d][th - 1] = bench_median3(v[0]);
                    r_pull[d][th - 1] = bench_median3(v[1]);
                    r_push[d][th - 1] = bench_median3(v[2]);
                    r_look[d][th - 1] = bench_median3(v[3]);
                }
            }
            pc_vm_free(PC_MEM_OTHER, ref, ref_bytes);
            if (si == 0) /* 1b. the same table against one storing bf16, interleaved */
                stored_bf16(&o, t, ovh, dim, n, streams[0], grads, outs, secs, &stored[di]);
            ps_table_destroy(t);
            /* 2. The same Adagrad update on flat [w | G] rows: the optimizer's own memory cost,
             * without hashing, index, keys or locks. */
            ps_table_config_t acfg;
            ps_table_config_defaults(&acfg);
            acfg.dim = dim;
            acfg.lr = 0.01;
            ps_optim_t aopt;
            ps__optim_from_config(&acfg, &aopt);
            size_t upd_bytes = (size_t)n * dim * 2 * sizeof(float);
            float *upd = pc_vm_alloc(PC_MEM_OTHER, upd_bytes);
            if (!upd)
                abort();
            pc_vm_advise_huge(upd, upd_bytes, 0);
            for (size_t i = 0; i < (size_t)n * dim * 2; i++)
                upd[i] = 0.1f;
            for (int d = 0; d < 2; d++) {
                for (int th = 1; th <= MAX_THR; th++) {
                    for (int r = 0; r < ROUNDS; r++)
                        v[0][r] = sample(&o, OP_REF_ADAGRAD, NULL, upd, dim, streams[d], th, grads,
                                         &aopt, outs, secs);
                    r_upd[d][th - 1] = bench_median3(v[0]);
                }
            }
            pc_vm_free(PC_MEM_OTHER, upd, upd_bytes);
            /* 3. Adam table: push */
            double ovh_adam, rss_adam, huge_adam;
            t = make_filled("adam", "f32", dim, n, &ovh_adam, &rss_adam, &huge_adam, NULL);
            for (int d = 0; d < 2; d++) {
                for (int th = 1; th <= MAX_THR; th++) {
                    for (int r = 0; r < ROUNDS; r++)
                        v[0][r] = sample(&o, OP_PUSH, t, NULL, dim, streams[d], th, grads, NULL,
                                         outs, secs);
                    r_adam[d][th - 1] = bench_median3(v[0]);
                }
            }
            ps_table_destroy(t);

            for (int d = 0; d < 2; d++) {
                for (int th = 1; th <= MAX_THR; th++) {
                    int x = th - 1;
                    double pvr = r_pull[d][x] / r_ref[d][x], svr = r_push[d][x] / r_ref[d][x];
                    double svu = r_push[d][x] / r_upd[d][x];
                    printf(
                        "%4u %9llu %7s %3d %11.0f %11.0f %11.0f %11.0f %11.0f %11.0f %6.2f %6.2f "
                        "%6.2f\n",
                        dim, (unsigned long long)n, k_dist_names[d], th, r_pull[d][x], r_push[d][x],
                        r_adam[d][x], r_look[d][x], r_ref[d][x], r_upd[d][x], pvr, svr, svu);
                    cJSON *c = cJSON_CreateObject();
                    cJSON_AddNumberToObject(c, "dim", dim);
                    cJSON_AddNumberToObject(c, "keys", (double)n);
                    cJSON_AddStringToObject(c, "dist", k_dist_names[d]);
                    cJSON_AddNumberToObject(c, "threads", th);
                    cJSON_AddNumberToObject(c, "pull_rows_per_s", r_pull[d][x]);
                    cJSON_AddNumberToObject(c, "push_adagrad_rows_per_s", r_push[d][x]);
                    cJSON_AddNumberToObject(c, "push_adam_rows_per_s", r_adam[d][x]);
                    cJSON_AddNumberToObject(c, "lookup_rows_per_s", r_look[d][x]);
                    cJSON_AddNumberToObject(c, "ref_gather_rows_per_s", r_ref[d][x]);
                    cJSON_AddNumberToObject(c, "pull_vs_ref", pvr);
                    cJSON_AddNumberToObject(c, "push_vs_ref", svr);
                    cJSON_AddNumberToObject(c, "ref_adagrad_update_rows_per_s", r_upd[d][x]);
                    cJSON_AddNumberToObject(c, "push_vs_ref_update", svu);
                    cJSON_AddNumberToObject(c, "overhead_bytes_per_row", ovh);
                    cJSON_AddNumberToObject(c, "rss_overhead_bytes_per_row", rss_ovh);
                    cJSON_AddNumberToObject(c, "adam_overhead_bytes_per_row", ovh_adam);
                    cJSON_AddNumberToObject(c, "huge_page_fraction", huge_frac);
                    if (d == 0 && th == 1) {
                        printf("%4u %9llu %7s %3d read_state %.0f rows/s (%.2f of ref_gather), "
                               "load %.0f rows/s (%.2f)\n",
                               dim, (unsigned long long)n, k_dist_names[d], th, r_read,
                               r_read / r_ref[d][x], r_load, r_load / r_ref[d][x]);
                        cJSON_AddNumberToObject(c, "read_state_rows_per_s", r_read);
                        cJSON_AddNumberToObject(c, "load_rows_per_s", r_load);
                        cJSON_AddNumberToObject(c, "read_state_vs_ref", r_read / r_ref[d][x]);
                        cJSON_AddNumberToObject(c, "load_vs_ref", r_load / r_ref[d][x]);
                        printf("%4u %9llu %7s %3d insert %.0f rows/s (%.3f of ref_gather)\n", dim,
                               (unsigned long long)n, k_dist_names[d], th, r_insert,
                               r_insert / r_ref[d][x]);
                        cJSON_AddNumberToObject(c, "insert_rows_per_s", r_insert);
                        cJSON_AddNumberToObject(c, "insert_vs_ref", r_insert / r_ref[d][x]);
                    }
                    cJSON_AddItemToArray(cases, c);
                    /* headline: dim 64 (else the last dim), largest size, uniform, 1 thread */
                    if (d == 0 && si == nsizes - 1 && th == 1)
                        dim_cases[di] = c;
                    if (d == 0 && si == nsizes - 1 && (dim == 64 || !main_case || !main_case2)) {
                        if (th == 1)
                            main_case = c;
                        else
                            main_case2 = c;
                    }
                }
            }
            printf("     memory: overhead %.2f B/row (keys+meta+index), resident growth beyond "
                   "floats %.2f B/row, %.0f%% in huge pages (adagrad); adam %.2f / %.2f\n",
                   ovh, rss_ovh, 100 * huge_frac, ovh_adam, rss_adam);
            fflush(stdout);
        }
        for (int d = 0; d < 2; d++)
            for (int th = 0; th < MAX_THR; th++) {
                free(streams[d][th].keys);
                free(streams[d][th].idx);
            }
    }
    /* Headline figures: dim 64, the largest size, uniform keys, 1 thread. */
    const char *keys[] = {"pull_rows_per_s",
                          "push_adagrad_rows_per_s",
                          "push_adam_rows_per_s",
                          "lookup_rows_per_s",
                          "ref_gather_rows_per_s",
                          "pull_vs_ref",
                          "push_vs_ref",
                          "read_state_vs_ref",
                          "load_vs_ref",
                          "insert_rows_per_s",
                          "insert_vs_ref",
                          "overhead_bytes_per_row",
                          "rss_overhead_bytes_per_row",
                          "keys"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cJSON_AddNumberToObject(root, keys[i],
                                cJSON_GetObjectItem(main_case, keys[i])->valuedouble);
    /* 1 -> 2 thread scaling of pull and push for the main case */
    cJSON *c2 = main_case2;
    cJSON_AddNumberToObject(root, "pull_scaling_2_threads",
                            cJSON_GetObjectItem(c2, "pull_rows_per_s")->valuedouble /
                                cJSON_GetObjectItem(main_case, "pull_rows_per_s")->valuedouble);
    cJSON_AddNumberToObject(
        root, "push_scaling_2_threads",
        cJSON_GetObjectItem(c2, "push_adagrad_rows_per_s")->valuedouble /
            cJSON_GetObjectItem(main_case, "push_adagrad_rows_per_s")->valuedouble);
    /* The same ratios for every dim measured, e.g. pull_vs_ref_dim16 (1 thread, uniform keys,
     * largest size), and grouped under by_dim. */
    cJSON *by_dim = cJSON_CreateObject();
    const char *dim_keys[] = {"pull_vs_ref",       "push_vs_ref",
                              "pull_rows_per_s",   "push_adagrad_rows_per_s",
                              "insert_rows_per_s", "ref_gather_rows_per_s"};
    for (int di = 0; di < ndims; di++) {
        if (!dim_cases[di])
            continue;
        char name[64];
        cJSON *e = cJSON_CreateObject();
        for (size_t i = 0; i < sizeof dim_keys / sizeof dim_keys[0]; i++) {
            const double v = cJSON_GetObjectItem(dim_cases[di], dim_keys[i])->valuedouble;
            cJSON_AddNumberToObject(e, dim_keys[i], v);
            if (i < 2) {
                snprintf(name, sizeof name, "%s_dim%u", dim_keys[i], dims[di]);
                cJSON_AddNumberToObject(root, name, v);
            }
        }
        const stored_t *sd = &stored[di];
        const struct {
            const char *key;
            double v;
        } sk[] = {{"pull_stored_bf16_vs_f32", sd->pull},
                  {"push_stored_bf16_vs_f32", sd->push},
                  {"row_bytes_f32", sd->bytes_f32},
                  {"row_bytes_stored_bf16", sd->bytes_bf16},
                  {"stored_bf16_memory_ratio", sd->bytes_bf16 / sd->bytes_f32}};
        for (size_t i = 0; sd->bytes_f32 > 0 && i < sizeof sk / sizeof sk[0]; i++) {
            cJSON_AddNumberToObject(e, sk[i].key, sk[i].v);
            if (dims[di] == 64 || ndims == 1)
                cJSON_AddNumberToObject(root, sk[i].key, sk[i].v);
        }
        snprintf(name, sizeof name, "%u", dims[di]);
        cJSON_AddItemToObject(by_dim, name, e);
        printf("dim %u (1 thread, uniform): pull %.2f x ref, push(adagrad) %.2f x ref\n", dims[di],
               cJSON_GetObjectItem(e, "pull_vs_ref")->valuedouble,
               cJSON_GetObjectItem(e, "push_vs_ref")->valuedouble);
    }
    cJSON_AddItemToObject(root, "by_dim", by_dim);
    cJSON_AddStringToObject(root, "optim_kernels", ps__optim_kernels(NULL)->name);
    cJSON_AddItemToObject(root, "cases", cases);
    printf("main case (dim 64, %llu keys, uniform, 1 thread): pull %.0f rows/s = %.2f x ref, "
           "push(adagrad) %.0f rows/s = %.2f x ref, overhead %.2f B/row\n",
           (unsigned long long)cJSON_GetObjectItem(root, "keys")->valuedouble,
           cJSON_GetObjectItem(root, "pull_rows_per_s")->valuedouble,
           cJSON_GetObjectItem(root, "pull_vs_ref")->valuedouble,
           cJSON_GetObjectItem(root, "push_adagrad_rows_per_s")->valuedouble,
           cJSON_GetObjectItem(root, "push_vs_ref")->valuedouble,
           cJSON_GetObjectItem(root, "overhead_bytes_per_row")->valuedouble);
    bench_emit_json(&o, root);
    for (int i = 0; i < MAX_THR; i++)
        free(outs[i]);
    free(grads);
    free(srows);
    return 0;
}
