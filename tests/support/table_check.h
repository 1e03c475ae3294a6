/* table_check.h: helpers for checkpoint tests: deterministic rounds of updates and bit-exact
 * comparison of two tables (weights, optimizer state, tick and frequency of every row). */
#ifndef TABLE_CHECK_H
#define TABLE_CHECK_H

#include "test_util.h"

#include <ftw.h>
#include <string.h>
#include <unistd.h>

#include "ps_catalog.h"
#include "ps_table.h"

/* A table from a spec ("name=emb,dim=8,optimizer=adam"); fails the test on a bad spec. */
static inline ps_table_t *tc_create(const char *spec) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, spec, NULL, 0), 0);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    return t;
}

/* A table from a spec added to cat (the catalog keeps it; the test holds no reference). */
static inline ps_table_t *tc_add(ps_catalog_t *cat, const char *spec) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char err[200];
    if (ps_table_config_parse(&c, spec, err, sizeof err))
        fail_msg("%s: %s", spec, err);
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, c.name, &t), 0);
    ps_catalog_release(cat, t);
    return t;
}

/* Round k (k >= 1) of deterministic changes: one push of 300 keys (with duplicates) from a pool
 * that grows with k, and every third round an erase of 20 keys. */
static inline void tc_round(ps_table_t *t, int k) {
    const uint32_t dim = ps_table_dim(t);
    enum { N = 300 };
    uint64_t keys[N];
    static float g[N * 64];
    uint64_t rng = 1000 + (uint64_t)k;
    const uint64_t pool = 2000 + (uint64_t)k * 100;
    for (int i = 0; i < N; i++) {
        keys[i] = (tu_rand(&rng) % pool) * 0x9E3779B97F4A7C15ULL;
        for (uint32_t e = 0; e < dim; e++)
            g[i * dim + e] = tu_gauss(&rng) * 0.1f;
    }
    assert_int_equal(ps_table_push(t, keys, N, g, (size_t)N * dim, NULL), 0);
    if (k % 3 == 0)
        assert_int_equal(ps_table_erase(t, keys, 20, NULL), 0);
}

typedef struct tc_rows {
    size_t n, cap, width;
    uint64_t *keys;
    float *vals; /* weights then state, width floats per row */
    uint16_t *tick;
    uint8_t *freq;
    uint32_t dim, sl;
} tc_rows_t;

static int tc_collect(void *ctx, const ps_row_view_t *r, size_t n) {
    tc_rows_t *x = ctx;
    for (size_t i = 0; i < n; i++) {
        if (x->n == x->cap) {
            x->cap = x->cap ? 2 * x->cap : 1024;
            x->keys = realloc(x->keys, x->cap * sizeof *x->keys);
            x->vals = realloc(x->vals, x->cap * x->width * sizeof(float));
            x->tick = realloc(x->tick, x->cap * sizeof *x->tick);
            x->freq = realloc(x->freq, x->cap);
        }
        x->keys[x->n] = r[i].key;
        memcpy(x->vals + x->n * x->width, r[i].weights, x->dim * sizeof(float));
        if (x->sl)
            memcpy(x->vals + x->n * x->width + x->dim, r[i].state, x->sl * sizeof(float));
        x->tick[x->n] = r[i].tick;
        x->freq[x->n] = r[i].freq;
        x->n++;
    }
    return 0;
}

static int tc_cmp_idx(const void *a, const void *b, void *keys) {
    uint64_t x = ((const uint64_t *)keys)[*(const size_t *)a];
    uint64_t y = ((const uint64_t *)keys)[*(const size_t *)b];
    return x < y ? -1 : x > y;
}

/* All rows of t, sorted by key. */
static inline void tc_dump(const ps_table_t *t, tc_rows_t *x) {
    tc_rows_t raw;
    memset(&raw, 0, sizeof raw);
    raw.dim = ps_table_dim(t);
    raw.sl = ps_table_state_len(t);
    raw.width = raw.dim + raw.sl;
    assert_int_equal(ps_table_scan(t, PS_SCAN_ALL, tc_collect, &raw), 0);
    size_t *idx = malloc((raw.n + 1) * sizeof *idx);
    for (size_t i = 0; i < raw.n; i++)
        idx[i] = i;
    qsort_r(idx, raw.n, sizeof *idx, tc_cmp_idx, raw.keys);
    *x = raw;
    x->cap = raw.n;
    x->keys = malloc((raw.n + 1) * sizeof *x->keys);
    x->vals = malloc((raw.n + 1) * raw.width * sizeof(float));
    x->tick = malloc((raw.n + 1) * sizeof *x->tick);
    x->freq = malloc(raw.n + 1);
    for (size_t i = 0; i < raw.n; i++) {
        x->keys[i] = raw.keys[idx[i]];
        memcpy(x->vals + i * raw.width, raw.vals + idx[i] * raw.width, raw.width * sizeof(float));
        x->tick[i] = raw.tick[idx[i]];
        x->freq[i] = raw.freq[idx[i]];
    }
    free(idx);
    free(raw.keys);
    free(raw.vals);
    free(raw.tick);
    free(raw.freq);
}

static inline void tc_free(tc_rows_t *x) {
    free(x->keys);
    free(x->vals);
    free(x->tick);
    free(x->freq);
}

/* Bit-exact equality of every row, its optimizer state and its metadata. */
static inline void tc_assert_equal(const ps_table_t *a, const ps_table_t *b) {
    tc_rows_t x, y;
    tc_dump(a, &x);
    tc_dump(b, &y);
    assert_int_equal(x.n, y.n);
    assert_int_equal(x.width, y.width);
    assert_memory_equal(x.keys, y.keys, x.n * sizeof *x.keys);
    assert_memory_equal(x.vals, y.vals, x.n * x.width * sizeof(float));
    assert_memory_equal(x.tick, y.tick, x.n * sizeof *x.tick);
    assert_memory_equal(x.freq, y.freq, x.n);
    tc_free(&x);
    tc_free(&y);
}

static int tc_rm(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

/* A fresh temporary directory (removed with tc_rmdir). */
static inline void tc_tmpdir(char *buf, size_t cap, const char *tag) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(buf, cap, "%s/ember-%s-XXXXXX", base, tag);
    assert_non_null(mkdtemp(buf));
}

static inline void tc_rmdir(const char *path) {
    nftw(path, tc_rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* Replace file `path` with `text` in one step (written aside, renamed over it). */
static inline void tc_write_file(const char *path, const char *text) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(rename(tmp, path), 0);
}

#endif
