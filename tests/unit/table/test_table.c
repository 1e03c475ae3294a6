/* Table behaviour: pull/push/lookup/erase semantics, keys alike in one half, growth through many
 * index rebuilds, scans, load, admission, TTL, capacity eviction, bad input and memory
 * accounting. */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"
#include "ps_table.h"

#include <pthread.h>
#include <unistd.h>

static ps_table_t *make(const char *spec) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char err[200];
    if (ps_table_config_parse(&c, spec, err, sizeof err))
        fail_msg("%s: %s", spec, err);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    return t;
}

static void test_pull_push_lookup(void **state) {
    (void)state;
    ps_table_t *t = make("dim=4,optimizer=sgd,lr=1,init=zeros,missing=zeros");
    uint64_t k[3] = {1, 2, 3};
    float rows[12], g[12];
    uint8_t found[3];
    assert_int_equal(ps_table_lookup(t, k, 3, rows, 12, found), 0);
    assert_int_equal(found[0] + found[1] + found[2], 0);
    assert_int_equal(ps_table_count(t), 0); /* lookup never inserts */
    assert_int_equal(ps_table_pull(t, k, 2, rows, 8), 0);
    assert_int_equal(ps_table_count(t), 2);
    for (int i = 0; i < 12; i++)
        g[i] = (float)i;
    ps_push_result_t r;
    assert_int_equal(ps_table_push(t, k, 3, g, 12, &r), 0); /* key 3 is inserted by push */
    assert_int_equal(r.applied, 3);
    assert_int_equal(ps_table_count(t), 3);
    assert_int_equal(ps_table_lookup(t, k, 3, rows, 12, found), 0);
    for (int i = 0; i < 12; i++)
        assert_true(rows[i] == -(float)i);
    assert_int_equal(found[0] + found[1] + found[2], 3);
    size_t erased;
    assert_int_equal(ps_table_erase(t, k + 1, 2, &erased), 0);
    assert_int_equal(erased, 2);
    assert_int_equal(ps_table_erase(t, k + 1, 2, &erased), 0);
    assert_int_equal(erased, 0);
    assert_int_equal(ps_table_lookup(t, k, 3, rows, 12, found), 0);
    assert_int_equal(found[0], 1);
    assert_int_equal(found[1] + found[2], 0);
    assert_true(rows[4] == 0.0f); /* missing=zeros */
    ps_table_stats_t st;
    assert_int_equal(ps_table_stats(t, &st), 0);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.pushed, 3);
    assert_int_equal(st.pulled, 2);
    assert_int_equal(st.looked_up, 9);
    assert_int_equal(st.inserted, 3);
    assert_int_equal(st.erased, 2);
    ps_table_destroy(t);
}

/* Many keys through many index rebuilds, every row correct afterwards; then erase half. */
static void test_growth_and_erase(void **state) {
    (void)state;
    ps_table_t *t = make("dim=3,optimizer=sgd,lr=1,init=zeros,shards=4");
    enum { N = 300000 };
    uint64_t *keys = malloc(N * sizeof *keys);
    float *g = malloc(N * 3 * sizeof *g), *rows = malloc(N * 3 * sizeof *rows);
    uint64_t rng = 5;
    for (int i = 0; i < N; i++) {
        keys[i] = tu_rand(&rng);
        for (int e = 0; e < 3; e++)
            g[i * 3 + e] = (float)((i * 3 + e) % 1000);
    }
    for (int off = 0; off < N; off += 10000)
        assert_int_equal(ps_table_push(t, keys + off, 10000, g + off * 3, 30000, NULL), 0);
    assert_int_equal(ps_table_count(t), N);
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N * 3, NULL), 0);
    for (int i = 0; i < N * 3; i++)
        assert_true(rows[i] == -g[i]);
    ps_table_stats_t st;
    ps_table_stats(t, &st);
    assert_true(st.index_rebuilds > 20);
    double load = (double)st.rows / (st.bytes_index / 4.0);
    assert_true(load > 0.75 && load <= 0.97);
    double ovh = ps_table_stats_overhead_per_row(&st);
    print_message("rows=%llu index load=%.3f overhead=%.2f B/row\n", (unsigned long long)st.rows,
                  load, ovh);
    assert_true(ovh <= 16.0);
    assert_int_equal(st.bytes_weights, (uint64_t)N * 12);
    assert_int_equal(st.bytes_keys + st.bytes_meta, (uint64_t)N * 11);
    /* erase every other key: the rest must be intact (rows move on erase) */
    for (int i = 0; i < N; i += 2)
        keys[i / 2] = keys[i], memcpy(g + (i / 2) * 3, g + i * 3, 12);
    uint64_t *gone = malloc(N / 2 * sizeof *gone);
    rng = 5;
    for (int i = 0; i < N; i++) {
        uint64_t k = tu_rand(&rng);
        if (i % 2)
            gone[i / 2] = k;
    }
    size_t erased;
    assert_int_equal(ps_table_erase(t, gone, N / 2, &erased), 0);
    assert_int_equal(erased, N / 2);
    uint8_t *found = malloc(N / 2);
    assert_int_equal(ps_table_lookup(t, keys, N / 2, rows, N / 2 * 3, found), 0);
    for (int i = 0; i < N / 2; i++) {
        assert_int_equal(found[i], 1);
        for (int e = 0; e < 3; e++)
            assert_true(rows[i * 3 + e] == -g[i * 3 + e]);
    }
    assert_int_equal(ps_table_lookup(t, gone, N / 2, rows, N / 2 * 3, found), 0);
    for (int i = 0; i < N / 2; i++)
        assert_int_equal(found[i], 0);
    /* erase all: memory shrinks back */
    assert_int_equal(ps_table_erase(t, keys, N / 2, &erased), 0);
    assert_int_equal(ps_table_count(t), 0);
    ps_table_stats(t, &st);
    assert_true(st.bytes_index < 64 * 1024);
    free(found);
    free(gone);
    free(keys);
    free(g);
    free(rows);
    ps_table_destroy(t);
}

/* Keys that share one 32-bit half with others (a probe must compare all 64 bits), key 0 and its
 * neighbours, through inserts, erasures and lookups of present and erased keys. */
static void test_key_patterns(void **state) {
    (void)state;
    ps_table_t *t = make("dim=1,optimizer=sgd,lr=1,init=zeros,shards=1");
    enum { N = 8000 };
    uint64_t *keys = malloc(N * sizeof *keys);
    float *g = malloc(N * sizeof *g), *rows = malloc(N * sizeof *rows);
    uint8_t *found = malloc(N);
    for (int i = 0; i < N; i++) {
        const uint64_t x = (uint64_t)(i / 4);
        switch (i % 4) {
            case 0:
                keys[i] = x;
                break; /* high half 0 */
            case 1:
                keys[i] = (x + 1) << 32;
                break; /* low half 0 */
            case 2:
                keys[i] = UINT64_C(0xffffffff00000000) | x;
                break; /* high half ~0 */
            default:
                keys[i] = ((x + 1) << 32) | (x + 1);
                break; /* both halves x+1 */
        }
        g[i] = -(float)(i + 1);
    }
    assert_int_equal(ps_table_push(t, keys, N, g, N, NULL), 0);
    assert_int_equal(ps_table_count(t), N);
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N, found), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(found[i], 1);
        assert_true(rows[i] == (float)(i + 1));
    }
    /* Erase every third key (key 0 among them): empty entries appear between live ones. */
    uint64_t *gone = malloc(N * sizeof *gone);
    size_t ng = 0, erased;
    for (int i = 0; i < N; i += 3)
        gone[ng++] = keys[i];
    assert_int_equal(ps_table_erase(t, gone, ng, &erased), 0);
    assert_int_equal(erased, ng);
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N, found), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(found[i], i % 3 != 0);
        assert_true(i % 3 == 0 ? rows[i] == 0.0f : rows[i] == (float)(i + 1));
    }
    /* Pulls insert the erased keys again, pushes then reach exactly them. */
    assert_int_equal(ps_table_pull(t, gone, ng, rows, ng), 0);
    for (size_t i = 0; i < ng; i++)
        assert_true(rows[i] == 0.0f);
    assert_int_equal(ps_table_count(t), N);
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N, found), 0);
    for (int i = 0; i < N; i++)
        assert_true(found[i] && rows[i] == (i % 3 == 0 ? 0.0f : (float)(i + 1)));
    free(gone);
    free(found);
    free(keys);
    free(g);
    free(rows);
    ps_table_destroy(t);
    /* Key 0 inserted after others into a table too small to shrink, the others erased: emptied
     * slots now sit before key 0's own in its bucket. */
    t = make("dim=1,optimizer=sgd,lr=1,init=zeros,shards=1");
    uint64_t k[15];
    float gk[15], r0 = 0;
    uint8_t f0 = 0;
    for (int i = 0; i < 15; i++)
        k[i] = (uint64_t)i + 1, gk[i] = 1.0f;
    assert_int_equal(ps_table_push(t, k, 14, gk, 14, NULL), 0);
    uint64_t zero = 0;
    float gz = -5.0f;
    assert_int_equal(ps_table_push(t, &zero, 1, &gz, 1, NULL), 0);
    assert_int_equal(ps_table_erase(t, k, 14, &erased), 0);
    assert_int_equal(erased, 14);
    assert_int_equal(ps_table_lookup(t, &zero, 1, &r0, 1, &f0), 0);
    assert_int_equal(f0, 1);
    assert_true(r0 == 5.0f);
    ps_table_destroy(t);
}

typedef struct scan_ctx {
    uint64_t n, keysum, weightsum_bits;
    uint32_t dim;
    uint32_t part, parts, wrong_part; /* parts > 0: count keys of another part */
} scan_ctx_t;

static int count_scan(void *v, const ps_row_view_t *rows, size_t n) {
    scan_ctx_t *c = v;
    for (size_t i = 0; i < n; i++) {
        c->n++;
        c->keysum += rows[i].key;
        c->wrong_part += c->parts && ps_table_key_part(rows[i].key, c->parts) != c->part;
    }
    return 0;
}

static int stop_scan(void *v, const ps_row_view_t *rows, size_t n) {
    (void)v;
    (void)rows;
    (void)n;
    return 42;
}

#define DUMP_N 5000
typedef struct dump {
    uint64_t keys[DUMP_N];
    float w[DUMP_N * 5], s[DUMP_N * 11];
    uint16_t tick[DUMP_N];
    uint8_t freq[DUMP_N];
    size_t n;
} dump_t;

/* Scan callback copying rows of a dim-5 Adam table (state 11 words). */
static int dump_fn(void *v, const ps_row_view_t *r, size_t n) {
    dump_t *d = v;
    for (size_t i = 0; i < n; i++) {
        size_t j = d->n++;
        assert_true(j < DUMP_N);
        d->keys[j] = r[i].key;
        memcpy(d->w + j * 5, r[i].weights, 5 * sizeof(float));
        memcpy(d->s + j * 11, r[i].state, 11 * sizeof(float));
        d->tick[j] = r[i].tick;
        d->freq[j] = r[i].freq;
    }
    return 0;
}

static void test_scan_and_load(void **state) {
    (void)state;
    ps_table_t *t = make("dim=5,optimizer=adam,lr=0.1,shards=8");
    enum { N = DUMP_N };
    uint64_t keys[N], sum = 0;
    static float rows[N * 5], g[N * 5];
    for (int i = 0; i < N; i++) {
        keys[i] = (uint64_t)i * 7919 + 3;
        sum += keys[i];
    }
    for (int i = 0; i < N * 5; i++)
        g[i] = (float)(i % 13) - 6;
    assert_int_equal(ps_table_advance_clock(t, 10), 0);
    assert_int_equal(ps_table_push(t, keys, N / 2, g, N / 2 * 5, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, 20), 0);
    assert_int_equal(ps_table_push(t, keys + N / 2, N / 2, g, N / 2 * 5, NULL), 0);
    scan_ctx_t c = {0};
    assert_int_equal(ps_table_scan(t, PS_SCAN_ALL, count_scan, &c), 0);
    assert_int_equal(c.n, N); /* every row exactly once */
    assert_int_equal(c.keysum, sum);
    memset(&c, 0, sizeof c);
    assert_int_equal(ps_table_scan(t, 15, count_scan, &c), 0); /* dirty since clock 15 */
    assert_int_equal(c.n, N / 2);
    memset(&c, 0, sizeof c);
    assert_int_equal(ps_table_scan(t, 21, count_scan, &c), 0);
    assert_int_equal(c.n, 0);
    assert_int_equal(ps_table_scan(t, PS_SCAN_ALL, stop_scan, NULL), 42);
    assert_int_equal(ps_table_advance_clock(t, 19), PC_EINVAL); /* clocks never go back */

    /* Parts (ps_table_scan_part): fewer, as many and more parts than the table's 8 shards, and
     * counts that are not powers of two: every row in exactly one part, the one
     * ps_table_key_part names; a part with `since` is that part of the dirty rows. */
    const uint32_t nparts[] = {1, 2, 8, 32, 3, 12};
    for (size_t k = 0; k < sizeof nparts / sizeof *nparts; k++) {
        const uint32_t parts = nparts[k];
        uint64_t total = 0, ksum = 0, dirty = 0;
        for (uint32_t p = 0; p < parts; p++) {
            memset(&c, 0, sizeof c);
            c.part = p;
            c.parts = parts;
            assert_int_equal(ps_table_scan_part(t, PS_SCAN_ALL, p, parts, count_scan, &c), 0);
            assert_int_equal(c.wrong_part, 0);
            total += c.n;
            ksum += c.keysum;
            memset(&c, 0, sizeof c);
            assert_int_equal(ps_table_scan_part(t, 15, p, parts, count_scan, &c), 0);
            dirty += c.n;
        }
        assert_int_equal(total, N);
        assert_int_equal(ksum, sum);
        assert_int_equal(dirty, N / 2);
    }
    assert_int_equal(ps_table_scan_part(t, PS_SCAN_ALL, 4, 4, count_scan, &c), PC_EINVAL);
    assert_int_equal(ps_table_scan_part(t, PS_SCAN_ALL, 0, 0, count_scan, &c), PC_EINVAL);

    /* Copy every row (weights + state + meta) into a fresh table through scan + load. */
    static dump_t d;
    d.n = 0;
    ps_table_t *u = make("dim=5,optimizer=adam,lr=0.1,shards=8");
    assert_int_equal(ps_table_scan(t, PS_SCAN_ALL, dump_fn, &d), 0);
    assert_int_equal(d.n, N);
    assert_int_equal(ps_table_load(u, d.n, d.keys, d.w, d.s, d.tick, d.freq), 0);
    float ru[N * 5];
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N * 5, NULL), 0);
    assert_int_equal(ps_table_lookup(u, keys, N, ru, N * 5, NULL), 0);
    assert_memory_equal(rows, ru, sizeof ru);
    /* identical state: the same next step gives identical rows */
    assert_int_equal(ps_table_push(t, keys, N, g, N * 5, NULL), 0);
    assert_int_equal(ps_table_push(u, keys, N, g, N * 5, NULL), 0);
    assert_int_equal(ps_table_lookup(t, keys, N, rows, N * 5, NULL), 0);
    assert_int_equal(ps_table_lookup(u, keys, N, ru, N * 5, NULL), 0);
    assert_memory_equal(rows, ru, sizeof ru);
    ps_table_destroy(u);
    ps_table_destroy(t);
}

/* Whole-row loads and reads in large batches (the pipelined path): a load that grows the index
 * several times within one batch, with duplicate keys (the later row wins) and keys already
 * present (overwritten), reads back exactly; absent keys read as not found and zeros; a load
 * without states gives fresh optimizer state (as a new row has). */
static void test_load_read_state_batches(void **state) {
    (void)state;
    enum { N = 20000, D = 4, S = 2 * D }; /* Adagrad: stride = dim + dim */
    ps_table_t *t = make("dim=4,optimizer=adagrad,lr=0.1,shards=2");
    assert_int_equal(ps_table_state_len(t), D);
    static uint64_t keys[N + 64], absent[64];
    static float rows[(N + 64) * S], back[(N + 64) * S], ref[N * S];
    static uint8_t found[N + 64];
    for (int i = 0; i < N; i++) {
        keys[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull + 1;
        for (int e = 0; e < S; e++)
            rows[(size_t)i * S + e] = (float)i + (float)e / 8;
    }
    for (int i = 0; i < 64; i++) { /* duplicates of the first keys, with other rows */
        keys[N + i] = keys[i];
        for (int e = 0; e < S; e++)
            rows[(size_t)(N + i) * S + e] = -(float)i - 1 - (float)e / 8;
    }
    /* a few keys present before the load: overwritten */
    float g[16 * D];
    for (int i = 0; i < 16 * D; i++)
        g[i] = 1;
    assert_int_equal(ps_table_push(t, keys + 100, 16, g, 16 * D, NULL), 0);
    assert_int_equal(ps_table_load_rows_unlogged(t, N + 64, keys, rows), 0);
    assert_int_equal(ps_table_count(t), N);
    memcpy(ref, rows, sizeof ref);
    memcpy(ref, rows + (size_t)N * S, 64 * S * sizeof(float)); /* the later duplicates won */
    memset(back, 0x7f, sizeof back);
    assert_int_equal(ps_table_read_state(t, keys, N, back, found), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(found[i], 1);
    assert_memory_equal(back, ref, sizeof ref);
    for (int i = 0; i < 64; i++)
        absent[i] = (uint64_t)i * 31 + 0xABCD000000000000ull;
    memset(back, 0x7f, sizeof back);
    assert_int_equal(ps_table_read_state(t, absent, 64, back, found), 0);
    for (int i = 0; i < 64; i++)
        assert_int_equal(found[i], 0);
    for (int i = 0; i < 64 * S; i++)
        assert_true(back[i] == 0.0f);
    /* weights only: state as a new row's */
    ps_table_t *u = make("dim=4,optimizer=adagrad,lr=0.1,shards=2");
    static float w[N * D];
    for (int i = 0; i < N * D; i++)
        w[i] = (float)i;
    assert_int_equal(ps_table_load(u, N, keys, w, NULL, NULL, NULL), 0);
    uint64_t fresh = 0xFEEDull;
    float fr[S];
    uint8_t ff;
    assert_int_equal(ps_table_pull(u, &fresh, 1, fr, D), 0); /* inserts a new row */
    assert_int_equal(ps_table_read_state(u, &fresh, 1, fr, &ff), 0);
    assert_int_equal(ps_table_read_state(u, keys, N, back, found), 0);
    for (int i = 0; i < N; i++) {
        assert_memory_equal(back + (size_t)i * S, w + (size_t)i * D, D * sizeof(float));
        assert_memory_equal(back + (size_t)i * S + D, fr + D, D * sizeof(float));
    }
    ps_table_destroy(u);
    ps_table_destroy(t);
}

static void test_admission(void **state) {
    (void)state;
    ps_table_t *t = make("dim=2,optimizer=sgd,lr=1,admit_threshold=3,init=uniform,init_scale=1");
    uint64_t k = 555;
    float row[2], init[2], g[2] = {1, 1};
    ps_table_initial_row(t, k, init);
    ps_push_result_t r;
    for (int i = 0; i < 2; i++) { /* sightings 1, 2: not admitted */
        assert_int_equal(ps_table_pull(t, &k, 1, row, 2), 0);
        assert_memory_equal(row, init, sizeof row);
        assert_int_equal(ps_table_push(t, &k, 1, g, 2, &r), 0);
        assert_int_equal(r.dropped_unadmitted, 1);
        assert_int_equal(ps_table_count(t), 0);
    }
    assert_int_equal(ps_table_pull(t, &k, 1, row, 2), 0); /* third sighting: admitted */
    assert_int_equal(ps_table_count(t), 1);
    assert_memory_equal(row, init, sizeof row); /* starts from the same initial row */
    assert_int_equal(ps_table_push(t, &k, 1, g, 2, &r), 0);
    assert_int_equal(r.applied, 1);
    assert_int_equal(ps_table_pull(t, &k, 1, row, 2), 0);
    assert_true(row[0] == init[0] - 1 && row[1] == init[1] - 1);
    ps_table_stats_t st;
    ps_table_stats(t, &st);
    assert_int_equal(st.admit_pending, 2);
    assert_int_equal(st.admit_dropped, 2);
    assert_true(st.bytes_sketch > 0);
    ps_table_destroy(t);
}

typedef struct ev_ctx {
    uint64_t n_cap, n_ttl;
    uint64_t last_key;
    float last_w0;
} ev_ctx_t;

static void on_evict(void *v, ps_evict_reason_t why, const ps_row_view_t *row) {
    ev_ctx_t *c = v;
    if (why == PS_EVICT_CAPACITY)
        c->n_cap++;
    else
        c->n_ttl++;
    c->last_key = row->key;
    c->last_w0 = row->weights[0];
}

static void test_ttl(void **state) {
    (void)state;
    ps_table_t *t = make("dim=2,optimizer=sgd,ttl_ticks=100,shards=2");
    ev_ctx_t ev = {0};
    ps_table_set_evict_fn(t, on_evict, &ev);
    uint64_t old[50], young[50];
    float rows[100], g[100] = {0};
    for (int i = 0; i < 50; i++)
        old[i] = 1000 + i, young[i] = 2000 + i;
    assert_int_equal(ps_table_push(t, old, 50, g, 100, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, 60), 0);
    assert_int_equal(ps_table_push(t, young, 50, g, 100, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, 99), 0);
    assert_int_equal(ps_table_count(t), 100);
    assert_int_equal(ps_table_advance_clock(t, 107), 0); /* old: age 107 >= 100 */
    assert_int_equal(ps_table_count(t), 50);
    assert_int_equal(ev.n_ttl, 50);
    uint8_t found[50];
    assert_int_equal(ps_table_lookup(t, young, 50, rows, 100, found), 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(found[i], 1);
    /* a pull does not refresh the TTL, a push does */
    assert_int_equal(ps_table_pull(t, young, 25, rows, 50), 0);
    assert_int_equal(ps_table_push(t, young + 25, 25, g, 50, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, 200), 0);
    assert_int_equal(ps_table_count(t), 25);
    /* huge jumps: ages saturate, nothing wraps back to "young" */
    assert_int_equal(ps_table_advance_clock(t, 70000), 0);
    assert_int_equal(ps_table_count(t), 0);
    assert_int_equal(ps_table_push(t, old, 10, g, 20, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, 70000 + 65536 + 50), 0);
    assert_int_equal(ps_table_count(t), 0);
    ps_table_stats_t st;
    ps_table_stats(t, &st);
    assert_int_equal(st.evicted_ttl, 110);
    ps_table_destroy(t);
}

/* Ages and dirty scans stay exact across many aging periods (16-bit ticks wrap). */
static void test_clock_wrap(void **state) {
    (void)state;
    ps_table_t *t = make("dim=1,optimizer=sgd,shards=1");
    uint64_t k = 9;
    float g = 0;
    scan_ctx_t c;
    for (uint32_t now = 1; now < 300000; now += 997) {
        assert_int_equal(ps_table_advance_clock(t, now), 0);
        if (now % 3 == 0)
            assert_int_equal(ps_table_push(t, &k, 1, &g, 1, NULL), 0);
    }
    uint32_t now = ps_table_clock(t);
    assert_int_equal(ps_table_push(t, &k, 1, &g, 1, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, now + 5000), 0);
    memset(&c, 0, sizeof c);
    ps_table_scan(t, now + 1, count_scan, &c);
    assert_int_equal(c.n, 0); /* updated at `now`, not after */
    memset(&c, 0, sizeof c);
    ps_table_scan(t, now, count_scan, &c);
    assert_int_equal(c.n, 1);
    ps_table_destroy(t);
}

static void test_capacity(void **state) {
    (void)state;
    ps_table_t *t = make("dim=4,optimizer=sgd,lr=1,capacity_rows=1000,shards=4");
    ev_ctx_t ev = {0};
    ps_table_set_evict_fn(t, on_evict, &ev);
    uint64_t hot[100];
    float rows[4 * 1000], g[4 * 1000];
    for (int i = 0; i < 100; i++)
        hot[i] = 0xF00D0000u + (uint64_t)i;
    for (int i = 0; i < 4000; i++)
        g[i] = 0.5f;
    for (int round = 0; round < 50; round++) { /* make the hot keys frequent */
        assert_int_equal(ps_table_pull(t, hot, 100, rows, 400), 0);
        assert_int_equal(ps_table_push(t, hot, 100, g, 400, NULL), 0);
    }
    uint64_t cold[1000];
    for (int r = 0; r < 20; r++) {
        for (int i = 0; i < 1000; i++)
            cold[i] = (uint64_t)r * 100000 + (uint64_t)i;
        assert_int_equal(ps_table_pull(t, cold, 1000, rows, 4000), 0);
        assert_true(ps_table_count(t) <= 1000);
        assert_int_equal(ps_table_push(t, hot, 100, g, 400, NULL), 0);
    }
    assert_true(ev.n_cap >= 19000);
    uint8_t found[100];
    assert_int_equal(ps_table_lookup(t, hot, 100, rows, 400, found), 0);
    int kept = 0;
    for (int i = 0; i < 100; i++)
        kept += found[i];
    print_message("hot keys kept under eviction pressure: %d/100\n", kept);
    assert_true(kept >= 90); /* frequency-aware CLOCK keeps hot rows */
    ps_table_destroy(t);
}

typedef struct seen_keys {
    uint64_t *keys;
    size_t n, cap;
} seen_keys_t;

static int collect_keys(void *ctx, const ps_row_view_t *rows, size_t n) {
    seen_keys_t *x = ctx;
    for (size_t i = 0; i < n; i++) {
        assert_true(x->n < x->cap);
        x->keys[x->n++] = rows[i].key;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A snapshot of a table under capacity pressure: evictions during the snapshot must neither
 * duplicate rows nor lose the pre-cut ones. */
static void test_snapshot_with_evictions(void **state) {
    (void)state;
    ps_table_t *t = make("dim=4,optimizer=sgd,capacity_rows=2000,shards=2");
    enum { PRE = 2000, POST = 6000 };
    static uint64_t keys[PRE + POST];
    static float rows[(PRE + POST) * 4];
    for (int i = 0; i < PRE + POST; i++)
        keys[i] = 0xABC00000ULL + (uint64_t)i;
    assert_int_equal(ps_table_pull(t, keys, PRE, rows, PRE * 4), 0);
    assert_int_equal(ps_table_push(t, keys, PRE, rows, PRE * 4, NULL), 0); /* freq > 0 */
    uint64_t before = ps_table_count(t);
    ps_snapshot_info_t info;
    assert_int_equal(ps_table_snapshot_begin(t, true, &info), 0);
    assert_int_equal(ps_table_snapshot_begin(t, true, &info), PC_EAGAIN); /* one at a time */
    for (int r = 0; r < 3; r++) /* floods of new keys evict pre-cut rows, many visits each */
        assert_int_equal(ps_table_pull(t, keys + PRE, POST, rows, POST * 4), 0);
    static uint64_t got[PRE + POST];
    seen_keys_t x = {got, 0, PRE + POST};
    assert_int_equal(ps_table_snapshot_scan(t, PS_SCAN_ALL, collect_keys, NULL, &x), 0);
    assert_int_equal(ps_table_snapshot_scan(t, PS_SCAN_ALL, collect_keys, NULL, &x), PC_EINVAL);
    ps_table_snapshot_end(t, true);
    qsort(got, x.n, sizeof *got, cmp_u64);
    for (size_t i = 1; i < x.n; i++)
        assert_true(got[i] != got[i - 1]); /* every row once */
    assert_int_equal(x.n, before);         /* exactly the rows held at the cut */
    for (size_t i = 0; i < x.n; i++)
        assert_true(got[i] < keys[PRE]);
    ps_table_destroy(t);
}

/* A snapshot writes a shard in chunks of 4096 rows; changes landing between chunks must neither
 * lose rows (an unwritten row moved below the cursor by an erase) nor duplicate them (a
 * written row changed afterwards). The scan callback wakes a writer, which queues on the
 * shard's write lock (writers go first) and runs in the gap after the first chunk. */
enum { GAP_ROWS = 3 * 4096 + 100, GAP_DIM = 2 };

typedef struct gap_ctx {
    ps_table_t *t;
    int mass_erase; /* erase so much in the gap that fewer rows remain than were written */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go, done_first;
    uint64_t *keys;
    float *vals; /* emitted rows: key index -> value (NaN: not seen) */
    int *seen;
} gap_ctx_t;

static void *gap_writer(void *arg) {
    gap_ctx_t *x = arg;
    pthread_mutex_lock(&x->mu);
    while (!x->go)
        pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
    uint64_t low[100], high[50];
    float g[100 * GAP_DIM];
    for (int i = 0; i < 100; i++)
        low[i] = x->keys[100 + i]; /* rows 100..199: written; erasing moves the last rows */
    for (int i = 0; i < 50; i++)
        high[i] = x->keys[10000 + i]; /* unwritten rows: must be saved before changing */
    for (int i = 0; i < 100 * GAP_DIM; i++)
        g[i] = 1.0f;
    if (x->mass_erase) { /* written and unwritten rows alike: count drops below the cursor */
        assert_int_equal(ps_table_erase(x->t, x->keys + 2000, GAP_ROWS - 3000, NULL), 0);
        return NULL;
    }
    assert_int_equal(ps_table_push(x->t, x->keys, 100, g, 100 * GAP_DIM, NULL), 0);
    assert_int_equal(ps_table_erase(x->t, low, 100, NULL), 0);
    assert_int_equal(ps_table_push(x->t, high, 50, g, 50 * GAP_DIM, NULL), 0);
    return NULL;
}

static int gap_rows(void *ctx, const ps_row_view_t *rows, size_t n) {
    gap_ctx_t *x = ctx;
    for (size_t i = 0; i < n; i++) {
        uint64_t idx = rows[i].key - 0x77000000ULL;
        assert_true(idx < GAP_ROWS);
        x->seen[idx]++;
        x->vals[idx] = rows[i].weights[0];
    }
    if (!x->done_first) { /* first chunk: let the writer queue up for the gap */
        x->done_first = 1;
        pthread_mutex_lock(&x->mu);
        x->go = 1;
        pthread_cond_signal(&x->cv);
        pthread_mutex_unlock(&x->mu);
        usleep(100000);
    }
    return 0;
}

static void run_chunk_gap(int mass_erase) {
    ps_table_t *t = make("dim=2,optimizer=sgd,lr=1,shards=1,init=uniform");
    static uint64_t keys[GAP_ROWS];
    static float rows[GAP_ROWS * GAP_DIM], vals[GAP_ROWS];
    static int seen[GAP_ROWS];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < GAP_ROWS; i++)
        keys[i] = 0x77000000ULL + (uint64_t)i;
    assert_int_equal(ps_table_pull(t, keys, GAP_ROWS, rows, GAP_ROWS * GAP_DIM), 0);
    gap_ctx_t x = {.t = t, .keys = keys, .vals = vals, .seen = seen, .mass_erase = mass_erase};
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    ps_snapshot_info_t info;
    assert_int_equal(ps_table_snapshot_begin(t, true, &info), 0);
    pthread_t th;
    pthread_create(&th, NULL, gap_writer, &x);
    assert_int_equal(ps_table_snapshot_scan(t, PS_SCAN_ALL, gap_rows, NULL, &x), 0);
    pthread_join(th, NULL);
    ps_table_snapshot_end(t, false);
    for (int i = 0; i < GAP_ROWS; i++) {
        assert_int_equal(seen[i], 1);              /* every pre-cut row, exactly once */
        assert_true(vals[i] == rows[i * GAP_DIM]); /* ...as it was at the cut */
    }
    assert_int_equal(ps_table_count(t), mass_erase ? 3000 : GAP_ROWS - 100);
    pthread_mutex_destroy(&x.mu);
    pthread_cond_destroy(&x.cv);
    ps_table_destroy(t);
}

static void test_snapshot_chunk_gaps(void **state) {
    (void)state;
    run_chunk_gap(0); /* rows pushed on both sides of the cursor, rows moved across it */
    run_chunk_gap(1); /* fewer rows left than already written */
}

static void test_bad_input(void **state) {
    (void)state;
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    char err[200];
    const char *bad[] = {"dim=0", "dim=1025", "shards=3", "optimizer=lamb", "lr=-1", "name=a b",
                         "name=", "admit_threshold=256", "ttl_ticks=20000", "beta1=1", "unknown=1",
                         "dim=abc",
                         /* settings under which the optimizer divides 0 by 0 */
                         "optimizer=adam,eps=0", "optimizer=adagrad,eps=0,adagrad_init=0",
                         "optimizer=rowwise_adagrad,eps=0,adagrad_init=0", "optimizer=ftrl,lr=0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_table_config_t x = c;
        err[0] = 0;
        assert_int_equal(ps_table_config_parse(&x, bad[i], err, sizeof err), PC_EINVAL);
        assert_true(strlen(err) > 0);
        assert_memory_equal(&x, &c, sizeof c); /* untouched */
    }
    ps_table_t *t;
    c.dim = 5000;
    assert_int_equal(ps_table_create(&c, &t), PC_EINVAL);
    c.dim = 4;
    c.shards = 6;
    assert_int_equal(ps_table_create(&c, &t), PC_EINVAL);
    c.shards = 4;
    c.optimizer = 99;
    assert_int_equal(ps_table_create(&c, &t), PC_EINVAL);
    c.optimizer = PS_OPT_ADAGRAD;
    assert_int_equal(ps_table_create(&c, &t), 0);

    uint64_t k[2] = {1, 2};
    float rows[8] = {0}, g[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(ps_table_pull(t, k, 2, rows, 7), PC_EDIM);
    assert_int_equal(ps_table_push(t, k, 2, g, 9, NULL), PC_EDIM);
    assert_int_equal(ps_table_lookup(t, k, 2, rows, 4, NULL), PC_EDIM);
    assert_int_equal(ps_table_pull(t, NULL, 2, rows, 8), PC_EINVAL);
    assert_int_equal(ps_table_pull(NULL, k, 2, rows, 8), PC_EINVAL);
    assert_int_equal(ps_table_pull(t, k, (size_t)PS_BATCH_MAX + 1, rows, 8), PC_ETOOBIG);
    assert_int_equal(ps_table_push(t, k, 0, NULL, 0, NULL), 0);
    assert_int_equal(ps_table_count(t), 0); /* rejected calls changed nothing */

    /* NaN / Inf gradients are never applied; the rest of the batch is */
    assert_int_equal(ps_table_pull(t, k, 2, rows, 8), 0);
    float before[8];
    memcpy(before, rows, sizeof rows);
    g[1] = NAN;
    g[6] = INFINITY;
    ps_push_result_t r;
    assert_int_equal(ps_table_push(t, k, 2, g, 8, &r), 0);
    assert_int_equal(r.skipped_nonfinite, 2);
    assert_int_equal(r.applied, 0);
    assert_int_equal(ps_table_pull(t, k, 2, rows, 8), 0);
    assert_memory_equal(rows, before, sizeof rows);
    g[6] = 1; /* key 2 is clean now, key 1 still has its NaN */
    assert_int_equal(ps_table_push(t, k, 2, g, 8, &r), 0);
    assert_int_equal(r.applied, 1);
    assert_int_equal(r.skipped_nonfinite, 1);
    /* a duplicate that sums to Inf is rejected as a whole */
    uint64_t kk[2] = {1, 1};
    float big[8] = {3e38f, 0, 0, 0, 3e38f, 0, 0, 0};
    assert_int_equal(ps_table_push(t, kk, 2, big, 8, &r), 0);
    assert_int_equal(r.skipped_nonfinite, 1);
    ps_table_stats_t st;
    ps_table_stats(t, &st);
    assert_int_equal(st.nonfinite_skipped, 4);
    ps_table_destroy(t);
    ps_table_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_push_lookup),
        cmocka_unit_test(test_growth_and_erase),
        cmocka_unit_test(test_key_patterns),
        cmocka_unit_test(test_scan_and_load),
        cmocka_unit_test(test_load_read_state_batches),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_clock_wrap),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_snapshot_with_evictions),
        cmocka_unit_test(test_snapshot_chunk_gaps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
