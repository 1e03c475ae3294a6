/* The RocksDB cold tier: a table with 10x its RAM budget gives exactly what an all-in-RAM table
 * gives under random pulls, pushes and lookups (also with two threads racing spills and
 * promotions, and rows evicted and taken back within one call); erase, lookup, TTL and
 * freezing; corrupt cold records are refused, not used, and can be erased. */
#include "table_check.h"

#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pc_alloc.h"
#include "pc_error.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"
#include "ps_tier.h"

typedef struct fixture {
    char dir[256];
    ps_tier_t *tier;
} fixture_t;

static void fx_open(fixture_t *f) {
    tc_tmpdir(f->dir, sizeof f->dir, "tier");
    ps_tier_opts_t o = {.dir = f->dir,
                        .cache_bytes = 8 << 20,
                        .write_buffer_bytes = 1 << 20,
                        .min_free_bytes = 1 << 20};
    assert_int_equal(ps_tier_open(&o, &f->tier), 0);
}

static void fx_close(fixture_t *f) {
    ps_tier_close(f->tier);
    tc_rmdir(f->dir);
}

static ps_table_t *mk_cold(fixture_t *f, const char *spec) {
    ps_table_t *t = tc_create(spec);
    assert_int_equal(ps_tier_attach(f->tier, t, true), 0);
    return t;
}

static void drop_cold(fixture_t *f, ps_table_t *t) {
    ps_tier_detach(f->tier, t, true);
    ps_table_destroy(t);
}

/* Pull every key of both tables and compare; then push one more gradient to all and compare
 * again (the optimizer state decides that step, so it is compared too). */
static void assert_same_everywhere(ps_table_t *a, ps_table_t *b, const uint64_t *keys, size_t n) {
    const uint32_t dim = ps_table_dim(a);
    float *x = malloc(n * dim * sizeof(float)), *y = malloc(n * dim * sizeof(float));
    float *g = malloc(n * dim * sizeof(float));
    uint64_t rng = 77;
    for (size_t i = 0; i < n * dim; i++)
        g[i] = tu_gauss(&rng) * 0.05f;
    for (int round = 0; round < 3; round++) {
        assert_int_equal(ps_table_pull(a, keys, n, x, n * dim), 0);
        assert_int_equal(ps_table_pull(b, keys, n, y, n * dim), 0);
        assert_memory_equal(x, y, n * dim * sizeof(float));
        assert_int_equal(ps_table_push(a, keys, n, g, n * dim, NULL), 0);
        assert_int_equal(ps_table_push(b, keys, n, g, n * dim, NULL), 0);
    }
    free(x);
    free(y);
    free(g);
}

static uint64_t key_of(uint64_t i) {
    return i * 0x9E3779B97F4A7C15ULL + 12345;
}

/* dtype: the row_dtype of both tables (16-bit rows spill as f32 and come back exactly). */
static void working_set_10x(const char *dtype) {
    fixture_t f;
    fx_open(&f);
    enum { POOL = 20000, CAP = 2000, B = 256, DIM = 16 };
    char spec[200];
    snprintf(spec, sizeof spec,
             "name=emb,dim=16,optimizer=adam,shards=8,capacity_rows=2000,cold=true,row_dtype=%s",
             dtype);
    ps_table_t *c = mk_cold(&f, spec);
    snprintf(spec, sizeof spec, "name=emb,dim=16,optimizer=adam,shards=8,row_dtype=%s", dtype);
    ps_table_t *r = tc_create(spec);
    static uint64_t keys[B];
    static float x[B * DIM], y[B * DIM], g[B * DIM];
    static uint8_t fx[B], fy[B];
    uint64_t rng = 5;
    for (int it = 0; it < 600; it++) {
        for (int i = 0; i < B; i++) /* skewed: half the draws from a hot tenth */
            keys[i] = key_of(tu_rand(&rng) % (i & 1 ? POOL : POOL / 10));
        const uint64_t op = tu_rand(&rng) % 8;
        if (op < 3) {
            assert_int_equal(ps_table_pull(c, keys, B, x, B * DIM), 0);
            assert_int_equal(ps_table_pull(r, keys, B, y, B * DIM), 0);
            assert_memory_equal(x, y, sizeof x);
        } else if (op < 7) {
            for (int i = 0; i < B * DIM; i++)
                g[i] = tu_gauss(&rng) * 0.1f;
            ps_push_result_t pa, pb;
            assert_int_equal(ps_table_push(c, keys, B, g, B * DIM, &pa), 0);
            assert_int_equal(ps_table_push(r, keys, B, g, B * DIM, &pb), 0);
            assert_int_equal(pa.applied, pb.applied);
        } else {
            assert_int_equal(ps_table_lookup(c, keys, B, x, B * DIM, fx), 0);
            assert_int_equal(ps_table_lookup(r, keys, B, y, B * DIM, fy), 0);
            assert_memory_equal(x, y, sizeof x); /* found flags may differ: see below */
        }
        assert_true(ps_table_count(c) <= CAP + 8 * 2);
    }
    ps_table_stats_t s;
    assert_int_equal(ps_table_stats(c, &s), 0);
    print_message("rows in RAM %llu of %llu; spilled %llu, clean drops %llu, cold hits %llu\n",
                  (unsigned long long)s.rows, (unsigned long long)ps_table_count(r),
                  (unsigned long long)s.spilled, (unsigned long long)s.spill_clean,
                  (unsigned long long)s.cold_hits);
    assert_true(ps_table_count(r) > 8 * CAP); /* the working set is far beyond the budget */
    assert_true(s.spilled > 1000 && s.cold_hits > 1000 && s.spill_clean > 0);
    assert_int_equal(s.cold_errors, 0);
    static uint64_t all[POOL];
    for (int i = 0; i < POOL; i++)
        all[i] = key_of((uint64_t)i);
    assert_same_everywhere(c, r, all, POOL);
    ps_table_destroy(r);
    drop_cold(&f, c);
    fx_close(&f);
}

/* The tier empties its directory at every open, but only its own: one holding files without
 * its marker or a RocksDB database (the checkpoint directory given as --tier-dir, or a parent
 * of it) is refused and left as it was (it was wiped: every checkpoint gone); its own is emptied,
 * the marker kept. */
static void test_foreign_dir_kept(void **state) {
    (void)state;
    char dir[256], path[320];
    tc_tmpdir(dir, sizeof dir, "tier-foreign");
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000001", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    ps_tier_opts_t o = {.dir = dir, .cache_bytes = 8 << 20, .min_free_bytes = 1 << 20};
    ps_tier_t *tier = NULL;
    assert_int_equal(ps_tier_open(&o, &tier), PC_EEXIST);
    assert_null(tier);
    assert_int_equal(access(path, F_OK), 0); /* still there */
    assert_int_equal(rmdir(path), 0);
    snprintf(path, sizeof path, "%s/lost+found", dir); /* a fresh ext4 volume's: neutral */
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(ps_tier_open(&o, &tier), 0); /* empty: taken, marked */
    ps_tier_close(tier);
    assert_int_equal(access(path, F_OK), 0); /* and left there */
    snprintf(path, sizeof path, "%s/EMBERPS-TIER", dir);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/leftover", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(ps_tier_open(&o, &tier), 0); /* its own: emptied */
    ps_tier_close(tier);
    assert_int_not_equal(access(path, F_OK), 0);
    tc_rmdir(dir);
}

static void test_working_set_10x(void **state) {
    (void)state;
    working_set_10x("f32");
}

static void test_working_set_10x_bf16(void **state) {
    (void)state;
    working_set_10x("bf16");
}

/* Two threads on disjoint keys sharing shards: spills of one race with misses of the other. */
typedef struct worker {
    ps_table_t *t;
    int id;
} worker_t;

enum { WK = 3000, WB = 200, WDIM = 8, WROUNDS = 150 };

static void worker_round(ps_table_t *t, int id, int round, float *rows) {
    uint64_t rng = (uint64_t)(id * 100000 + round);
    uint64_t keys[WB];
    static _Thread_local float g[WB * WDIM];
    for (int i = 0; i < WB; i++)
        keys[i] = key_of((tu_rand(&rng) % WK) * 2 + (uint64_t)id);
    for (int i = 0; i < WB * WDIM; i++)
        g[i] = tu_gauss(&rng) * 0.1f;
    if (round % 3 == 0)
        assert_int_equal(ps_table_pull(t, keys, WB, rows, WB * WDIM), 0);
    else
        assert_int_equal(ps_table_push(t, keys, WB, g, WB * WDIM, NULL), 0);
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    static _Thread_local float rows[WB * WDIM];
    for (int k = 0; k < WROUNDS; k++)
        worker_round(w->t, w->id, k, rows);
    return NULL;
}

static void test_concurrent_spills(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    const char *spec = "name=race,dim=8,optimizer=adagrad,shards=4,capacity_rows=600,cold=true";
    ps_table_t *c = mk_cold(&f, spec);
    ps_table_t *r = tc_create("name=race,dim=8,optimizer=adagrad,shards=4");
    pthread_t th[2];
    worker_t w[2] = {{c, 0}, {c, 1}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    static float rows[WB * WDIM];
    for (int id = 0; id < 2; id++) /* the same rounds, one after another, all in RAM */
        for (int k = 0; k < WROUNDS; k++)
            worker_round(r, id, k, rows);
    static uint64_t all[2 * WK];
    for (int i = 0; i < 2 * WK; i++)
        all[i] = key_of((uint64_t)i);
    assert_same_everywhere(c, r, all, 2 * WK);
    ps_table_destroy(r);
    drop_cold(&f, c);
    fx_close(&f);
}

/* Two threads on the SAME keys: each pushes gradient 1 (lr 0.5, zero init) and pulls, with a
 * tiny RAM budget so rows move between RAM and the store all the time. Every weight must end at
 * exactly -0.5 x the pushes of its key: a promotion that used a stale cold copy (a spill or
 * erase racing a miss) would lose updates. */
enum { SK = 1000, SB = 64, SROUNDS = 400 };
typedef struct shared_worker {
    ps_table_t *t;
    int id;
    uint32_t counts[SK];
} shared_worker_t;

static void *shared_main(void *arg) {
    shared_worker_t *w = arg;
    uint64_t rng = 900 + (uint64_t)w->id;
    uint64_t keys[SB];
    float g[SB * 2], rows[SB * 2];
    for (int i = 0; i < SB * 2; i++)
        g[i] = 1.0f;
    for (int k = 0; k < SROUNDS; k++) {
        for (int i = 0; i < SB; i++) {
            uint64_t j = tu_rand(&rng) % SK;
            keys[i] = key_of(j);
            if (k % 2 == 0)
                w->counts[j]++;
        }
        if (k % 2 == 0)
            assert_int_equal(ps_table_push(w->t, keys, SB, g, SB * 2, NULL), 0);
        else
            assert_int_equal(ps_table_pull(w->t, keys, SB, rows, SB * 2), 0);
    }
    return NULL;
}

static void test_shared_keys_no_lost_update(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    ps_table_t *c = mk_cold(&f, "name=sh,dim=2,optimizer=sgd,lr=0.5,init=zeros,shards=1,"
                                "capacity_rows=48,cold=true");
    static shared_worker_t w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        w[i].t = c;
        w[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, shared_main, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    static uint64_t keys[SK];
    static float rows[SK * 2];
    for (int i = 0; i < SK; i++)
        keys[i] = key_of((uint64_t)i);
    assert_int_equal(ps_table_lookup(c, keys, SK, rows, SK * 2, NULL), 0);
    for (int i = 0; i < SK; i++) {
        const float want = -0.5f * (float)(w[0].counts[i] + w[1].counts[i]);
        if (rows[2 * i] != want || rows[2 * i + 1] != want)
            fail_msg("key %d: %g, want %g", i, rows[2 * i], want);
    }
    drop_cold(&f, c);
    fx_close(&f);
}

/* A cold store in memory whose deletions can be refused, as RocksDB's are on a full disk. */
enum { FAKE_KEYS = 256, FAKE_STRIDE = 4 };
typedef struct fake_cold {
    uint64_t keys[FAKE_KEYS];
    float rows[FAKE_KEYS][FAKE_STRIDE];
    ps_cold_meta_t meta[FAKE_KEYS];
    size_t n;
    uint32_t stride; /* the table's: dim + state_len floats a row (at most FAKE_STRIDE) */
    bool refuse_del, refuse_put;
    bool oom_on_refuse;   /* a refused put also makes every allocation fail from then on */
    void (*hook)(void *); /* run once by the next get, before it reads (another caller's turn) */
    void *hook_arg;
} fake_cold_t;

static long fake_find(const fake_cold_t *f, uint64_t key) {
    for (size_t i = 0; i < f->n; i++)
        if (f->keys[i] == key)
            return (long)i;
    return -1;
}

static int fake_get(void *ctx, const uint64_t *keys, size_t n, float *rows, ps_cold_meta_t *meta) {
    fake_cold_t *f = ctx;
    void (*hook)(void *) = f->hook;
    f->hook = NULL;
    if (hook)
        hook(f->hook_arg);
    for (size_t i = 0; i < n; i++) {
        const long at = fake_find(f, keys[i]);
        meta[i] = at < 0 ? (ps_cold_meta_t){0} : f->meta[at];
        if (at >= 0)
            memcpy(rows + i * f->stride, f->rows[at], f->stride * sizeof(float));
    }
    return 0;
}

static int fake_put(void *ctx, const ps_cold_row_t *rows, size_t n) {
    fake_cold_t *f = ctx;
    if (f->refuse_put && f->oom_on_refuse) {
        f->oom_on_refuse = false;
        pc_mem_fail_after(0);
    }
    if (f->refuse_put)
        return PC_ENOSPC;
    for (size_t i = 0; i < n; i++) {
        long at = fake_find(f, rows[i].key);
        if (at < 0 && f->n == FAKE_KEYS)
            return PC_ENOSPC;
        if (at < 0)
            f->keys[at = (long)f->n++] = rows[i].key;
        memcpy(f->rows[at], rows[i].row, f->stride * sizeof(float));
        f->meta[at] = (ps_cold_meta_t){.clock = rows[i].clock, .freq = rows[i].freq, .found = 1};
    }
    return 0;
}

static int fake_del(void *ctx, const uint64_t *keys, size_t n) {
    fake_cold_t *f = ctx;
    if (f->refuse_del)
        return PC_ENOSPC;
    for (size_t i = 0; i < n; i++) {
        const long at = fake_find(f, keys[i]);
        if (at >= 0) { /* the last one into its place */
            f->n--;
            f->keys[at] = f->keys[f->n];
            memcpy(f->rows[at], f->rows[f->n], sizeof f->rows[at]);
            f->meta[at] = f->meta[f->n];
        }
    }
    return 0;
}

static bool fake_writable(void *ctx) {
    (void)ctx;
    return true;
}

/* An erasure the cold store refuses is not done, in RAM either: a row changed in RAM since its
 * cold copy was written stays what it is (removing it from RAM alone would let the older cold
 * copy show through), and the erasure goes through once the store takes it. */
static void test_erase_refused(void **state) {
    (void)state;
    enum { N = 40, D = 2 }; /* sgd: no state */
    static fake_cold_t f;
    memset(&f, 0, sizeof f);
    f.stride = D;
    const ps_cold_ops_t ops = {fake_get, fake_put, fake_del, fake_writable, NULL};
    ps_table_t *c = tc_create("name=r,dim=2,optimizer=sgd,lr=1,shards=1,capacity_rows=8,cold=true");
    assert_int_equal(ps_table_dim(c) + ps_table_state_len(c), f.stride);
    ps_table_set_cold(c, &ops, &f);
    uint64_t keys[N];
    float g[N * D], x[N * D], y[N * D];
    uint8_t found[N];
    for (int i = 0; i < N; i++)
        keys[i] = key_of((uint64_t)i);
    for (int i = 0; i < N * D; i++)
        g[i] = 1.0f;
    assert_int_equal(ps_table_push(c, keys, N, g, N * D, NULL), 0); /* most spill */
    assert_true(f.n >= N - 8);
    /* the first 4 keys: promoted and pushed again, newer in RAM than their cold copies */
    assert_int_equal(ps_table_push(c, keys, 4, g, 4 * D, NULL), 0);
    assert_int_equal(ps_table_lookup(c, keys, N, x, N * D, found), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(found[i], 1);
    f.refuse_del = true;
    size_t erased = 99;
    assert_int_equal(ps_table_erase(c, keys, 4, &erased), PC_ENOSPC);
    assert_int_equal(erased, 0);
    assert_int_equal(ps_table_lookup(c, keys, N, y, N * D, found), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(found[i], 1);
    assert_memory_equal(x, y, sizeof x); /* the newest rows, not the cold copies */
    f.refuse_del = false;
    assert_int_equal(ps_table_erase(c, keys, 4, &erased), 0);
    assert_int_equal(erased, 4);
    assert_int_equal(ps_table_lookup(c, keys, N, y, N * D, found), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(found[i], i >= 4);
    ps_table_destroy(c);
}

typedef struct push_call {
    ps_table_t *t;
    const uint64_t *keys;
    size_t n;
    const float *g;
} push_call_t;

static void push_hook(void *arg) {
    const push_call_t *p = arg;
    assert_int_equal(ps_table_push(p->t, p->keys, p->n, p->g, p->n * ps_table_dim(p->t), NULL), 0);
}

/* Another caller's push lands between a push's misses and its cold pass (the hook): it leaves
 * CAP keys in RAM (dirty), the middle CAP of the push. The cold pass applies keys in call order:
 * the NEW keys before them evict them into the spill queue (NEW entries: the queue is full),
 * and each is then taken back from the queue while its own insert evicts another row, which
 * grows (moves) the queue; the AFTER keys evict some of them again (a key queued twice, its
 * older copy first). Every row must equal an all-in-RAM table's given the same two pushes:
 * reading a queued row where the queue was is a use after free (ASan's report, or garbage), and
 * when the cold store refuses the writes (refuse_put), the rows put back into RAM must be the
 * newest copies. */
static void requeued_rows(bool refuse_put) {
    enum { CAP = 32, NEW = 64, AFTER = 64, N = NEW + CAP + AFTER, D = 2 }; /* adagrad: stride 4 */
    static fake_cold_t f;
    memset(&f, 0, sizeof f);
    f.stride = 2 * D;
    const ps_cold_ops_t ops = {fake_get, fake_put, fake_del, fake_writable, NULL};
    ps_table_t *c = tc_create("name=q,dim=2,optimizer=adagrad,shards=1,capacity_rows=32,"
                              "cold=true"),
               *r = tc_create("name=q,dim=2,optimizer=adagrad,shards=1");
    assert_int_equal(ps_table_dim(c) + ps_table_state_len(c), f.stride);
    ps_table_set_cold(c, &ops, &f);
    static uint64_t keys[N];
    static float g1[CAP * D], g2[N * D], x[N * D], y[N * D];
    uint64_t rng = 9;
    for (int i = 0; i < N; i++)
        keys[i] = key_of(1000 + (uint64_t)i);
    for (int i = 0; i < CAP * D; i++)
        g1[i] = tu_gauss(&rng) * 0.3f;
    for (int i = 0; i < N * D; i++)
        g2[i] = tu_gauss(&rng) * 0.3f;
    push_call_t other = {c, keys + NEW, CAP, g1};
    f.hook = push_hook;
    f.hook_arg = &other;
    f.refuse_put = refuse_put;
    assert_int_equal(ps_table_push(c, keys, N, g2, N * D, NULL), refuse_put ? PC_ENOSPC : 0);
    assert_null(f.hook); /* the other push ran */
    assert_int_equal(ps_table_push(r, keys + NEW, CAP, g1, CAP * D, NULL), 0);
    assert_int_equal(ps_table_push(r, keys, N, g2, N * D, NULL), 0);
    f.refuse_put = false;
    assert_int_equal(ps_table_lookup(c, keys, N, x, N * D, NULL), 0);
    assert_int_equal(ps_table_lookup(r, keys, N, y, N * D, NULL), 0);
    for (int i = 0; i < N * D; i++)
        if (x[i] != y[i])
            fail_msg("key %d: %g, want %g", i / D, x[i], y[i]);
    ps_table_destroy(c);
    ps_table_destroy(r);
}

static void test_requeued_rows(void **state) {
    (void)state;
    requeued_rows(false);
}

static void test_requeued_rows_refused(void **state) {
    (void)state;
    requeued_rows(true);
}

/* A cold write refused when memory has run out too: the victims go back into RAM into room
 * their inserts reserved, none lost (the put-back grew the slab, which failed: trained rows
 * gone, in neither RAM nor the store). */
static void test_requeued_rows_oom(void **state) {
    (void)state;
    enum { N = 100, D = 2 };
    static fake_cold_t f;
    memset(&f, 0, sizeof f);
    f.stride = D; /* sgd */
    const ps_cold_ops_t ops = {fake_get, fake_put, fake_del, fake_writable, NULL};
    ps_table_t *c = tc_create("name=o,dim=2,optimizer=sgd,lr=1,shards=1,capacity_rows=32,"
                              "cold=true"),
               *r = tc_create("name=o,dim=2,optimizer=sgd,lr=1,shards=1");
    ps_table_set_cold(c, &ops, &f);
    static uint64_t keys[N];
    static float g[N * D], x[N * D], y[N * D];
    static uint8_t found[N];
    for (int i = 0; i < N; i++)
        keys[i] = key_of(5000 + (uint64_t)i);
    for (int i = 0; i < N * D; i++)
        g[i] = 0.25f * (float)(i % 7 + 1);
    f.refuse_put = f.oom_on_refuse = true;
    assert_int_equal(ps_table_push(c, keys, N, g, N * D, NULL), PC_ENOSPC);
    assert_int_equal(pc_mem_fail_remaining(), 0); /* the put was reached: allocations fail */
    pc_mem_fail_after(-1);
    f.refuse_put = false;
    assert_int_equal(ps_table_push(r, keys, N, g, N * D, NULL), 0);
    assert_int_equal(ps_table_lookup(c, keys, N, x, N * D, found), 0);
    assert_int_equal(ps_table_lookup(r, keys, N, y, N * D, NULL), 0);
    for (int i = 0; i < N; i++)
        if (!found[i] || memcmp(x + i * D, y + i * D, D * sizeof(float)))
            fail_msg("key %d lost (found %d)", i, found[i]);
    ps_table_destroy(c);
    ps_table_destroy(r);
}

static void test_erase_lookup_ttl(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    enum { N = 1000, D = 4 };
    ps_table_t *c = mk_cold(&f, "name=e,dim=4,optimizer=sgd,lr=0.01,shards=2,capacity_rows=100,"
                                "cold=true,ttl_ticks=50");
    static uint64_t keys[N];
    static float g[N * D], x[N * D], y[N * D];
    static uint8_t found[N];
    for (int i = 0; i < N; i++)
        keys[i] = key_of((uint64_t)i);
    for (int i = 0; i < N * D; i++)
        g[i] = 1.0f;
    assert_int_equal(ps_table_push(c, keys, N, g, N * D, NULL), 0);
    assert_true(ps_table_count(c) <= 100);
    /* Lookup reads cold rows without promoting them. */
    const uint64_t before = ps_table_count(c);
    assert_int_equal(ps_table_lookup(c, keys, N, x, N * D, found), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(found[i], 1);
        float init[D];
        ps_table_initial_row(c, keys[i], init);
        assert_true(x[i * D] == init[0] - 0.01f * 1.0f); /* sgd, lr 0.01 */
    }
    assert_int_equal(ps_table_count(c), before);
    /* Erase half (most of them cold): all counted, and they come back as initial rows. */
    size_t erased = 0;
    assert_int_equal(ps_table_erase(c, keys, N / 2, &erased), 0);
    assert_int_equal(erased, N / 2);
    assert_int_equal(ps_table_lookup(c, keys, N, y, N * D, found), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(found[i], i >= N / 2);
        if (i < N / 2) {
            float init[D];
            ps_table_initial_row(c, keys[i], init);
            assert_memory_equal(y + i * D, init, sizeof init);
        } else {
            assert_memory_equal(y + i * D, x + i * D, D * sizeof(float));
        }
    }
    /* A key named twice is one key erased (its cold copy was counted again) */
    const uint64_t twice[] = {keys[N - 1], keys[N - 1], keys[N - 2]};
    assert_int_equal(ps_table_erase(c, twice, 3, &erased), 0);
    assert_int_equal(erased, 2);
    /* TTL: rows idle for 50 ticks read as absent, in RAM and in the cold store. */
    assert_int_equal(ps_table_advance_clock(c, 60), 0);
    assert_int_equal(ps_table_lookup(c, keys, N, y, N * D, found), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(found[i], 0);
    /* and an erase counts none of them (it counted the cold ones) */
    assert_int_equal(ps_table_erase(c, keys + N / 2, N / 2 - 2, &erased), 0);
    assert_int_equal(erased, 0);
    drop_cold(&f, c);
    fx_close(&f);
}

/* read_state of a cold table reads the rows it spilled (weights and optimizer state, as a
 * RAM-only table fed the same pushes holds them) without promoting them; erased and expired rows
 * read as absent. ps_table_cold_walk visits the cold store in key order, in steps that take up
 * where the last stopped (a callback's stop included): with the RAM rows every key is seen, none
 * twice within the walk. */
static int collect_keys(void *ctx, const ps_row_view_t *rows, size_t n) {
    uint64_t **at = ctx;
    for (size_t i = 0; i < n; i++)
        *(*at)++ = rows[i].key;
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* ps_table_cold_walk's callback: keys appended at `at`, stopping before the one after `stop`
 * keys (0: never). */
typedef struct walk_ctx {
    uint64_t *at;
    size_t n, stop;
} walk_ctx_t;

static int walk_key(void *ctx, uint64_t key) {
    walk_ctx_t *w = ctx;
    if (w->stop && w->n == w->stop)
        return 7;
    w->at[w->n++] = key;
    return 0;
}

static void test_read_state_and_keys(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    enum { N = 3000, D = 8, S = 2 * D + 1 }; /* adam: 2 dim + 1 state words */
    ps_table_t *c = mk_cold(&f, "name=r,dim=8,optimizer=adam,shards=4,capacity_rows=200,"
                                "cold=true,ttl_ticks=50");
    ps_table_t *r = tc_create("name=r,dim=8,optimizer=adam,shards=4");
    static uint64_t keys[N], walked[2 * N];
    static float g[N * D], x[N * (D + S)], y[N * (D + S)];
    static uint8_t fx[N], fy[N];
    uint64_t rng = 9;
    for (int i = 0; i < N; i++)
        keys[i] = key_of((uint64_t)i);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N * D; i++)
            g[i] = tu_gauss(&rng) * 0.1f;
        assert_int_equal(ps_table_push(c, keys, N, g, N * D, NULL), 0);
        assert_int_equal(ps_table_push(r, keys, N, g, N * D, NULL), 0);
    }
    assert_int_equal(ps_table_state_len(c), S);
    const uint64_t in_ram = ps_table_count(c);
    assert_true(in_ram <= 200 + 4 * 2);
    assert_int_equal(ps_table_read_state(c, keys, N, x, fx), 0);
    assert_int_equal(ps_table_read_state(r, keys, N, y, fy), 0);
    assert_memory_equal(fx, fy, N);
    assert_memory_equal(x, y, sizeof x);
    for (int i = 0; i < N; i++)
        assert_int_equal(fx[i], 1);
    assert_int_equal(ps_table_count(c), in_ram); /* nothing promoted */
    /* The walk: cold keys in order, in steps of 37 keys; with the RAM keys, every key. */
    walk_ctx_t w = {.at = walked};
    uint64_t start = 0;
    int steps = 0;
    do {
        const size_t before = w.n;
        assert_int_equal(ps_table_cold_walk(c, &start, 37, walk_key, &w), 0);
        assert_true(w.n - before <= 37 && (!start || w.n - before == 37));
        assert_true(!start || start > walked[w.n - 1]);
        steps++;
    } while (start && steps < 1000);
    const size_t ncold = w.n;
    for (size_t i = 1; i < ncold; i++)
        assert_true(walked[i - 1] < walked[i]);
    assert_true(ncold >= N - in_ram && steps > 10);
    /* A callback's stop: the walk ends before that key, and the next one starts at it. */
    static uint64_t part[2 * N];
    walk_ctx_t p = {.at = part, .stop = 10};
    start = 0;
    assert_int_equal(ps_table_cold_walk(c, &start, UINT64_MAX, walk_key, &p), 7);
    assert_true(p.n == 10 && start == walked[10]);
    p.stop = 0;
    assert_int_equal(ps_table_cold_walk(c, &start, UINT64_MAX, walk_key, &p), 0);
    assert_true(start == 0 && p.n == ncold);
    assert_memory_equal(part, walked, ncold * sizeof *walked);
    uint64_t *at = walked + ncold;
    assert_int_equal(ps_table_scan(c, PS_SCAN_ALL, collect_keys, &at), 0);
    const size_t nall = (size_t)(at - walked);
    qsort(walked, nall, sizeof *walked, cmp_key);
    size_t nu = 0;
    for (size_t i = 0; i < nall; i++)
        if (!nu || walked[nu - 1] != walked[i])
            walked[nu++] = walked[i];
    assert_int_equal(nu, N);
    qsort(keys, N, sizeof *keys, cmp_key);
    assert_memory_equal(walked, keys, N * sizeof *keys);
    /* A table that is not cold has no cold keys; max 0 is refused. */
    w = (walk_ctx_t){.at = walked};
    start = 5;
    assert_int_equal(ps_table_cold_walk(r, &start, 10, walk_key, &w), 0);
    assert_true(w.n == 0 && start == 0);
    assert_int_equal(ps_table_cold_walk(c, &start, 0, walk_key, &w), PC_EINVAL);
    /* Erased rows (RAM or cold) read as absent, and leave the walk. */
    assert_int_equal(ps_table_erase(c, keys, N / 2, NULL), 0);
    assert_int_equal(ps_table_read_state(c, keys, N, x, fx), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(fx[i], i >= N / 2);
    w = (walk_ctx_t){.at = walked};
    start = 0;
    assert_int_equal(ps_table_cold_walk(c, &start, UINT64_MAX, walk_key, &w), 0);
    for (size_t i = 0; i < w.n; i++)
        assert_null(bsearch(&walked[i], keys, N / 2, sizeof *keys, cmp_key));
    assert_true(start == 0 && w.n > 0 && w.n <= N / 2);
    /* TTL: idle rows read as absent from the cold store too. */
    assert_int_equal(ps_table_advance_clock(c, 60), 0);
    assert_int_equal(ps_table_read_state(c, keys, N, x, fx), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(fx[i], 0);
    ps_table_destroy(r);
    drop_cold(&f, c);
    fx_close(&f);
}

typedef struct eraser {
    ps_table_t *t;
    uint64_t key;
    atomic_int done;
} eraser_t;

static void *erase_main(void *arg) {
    eraser_t *e = arg;
    assert_int_equal(ps_table_erase(e->t, &e->key, 1, NULL), 0);
    atomic_store(&e->done, 1);
    return NULL;
}

static void test_freeze(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    enum { N = 300, D = 4 };
    ps_table_t *c = mk_cold(&f, "name=fz,dim=4,optimizer=sgd,shards=1,capacity_rows=100,"
                                "cold=true");
    static uint64_t keys[3 * N];
    static float g[3 * N * D];
    for (int i = 0; i < 3 * N; i++)
        keys[i] = key_of((uint64_t)i);
    for (int i = 0; i < 3 * N * D; i++)
        g[i] = 0.5f;
    assert_int_equal(ps_table_push(c, keys, N, g, N * D, NULL), 0);
    ps_table_stats_t s0, s1;
    assert_int_equal(ps_table_stats(c, &s0), 0);
    ps_table_cold_freeze(c, true);
    ps_table_cold_freeze(c, true); /* a second freezer (a checkpoint and an export) */
    eraser_t e = {c, keys[0], 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, erase_main, &e), 0);
    ps_table_cold_freeze(c, false); /* one thaw: still frozen for the other (it thawed) */
    assert_int_equal(ps_table_push(c, keys + N, N, g, N * D, NULL), 0);
    assert_int_equal(ps_table_stats(c, &s1), 0);
    assert_int_equal(s1.spilled, s0.spilled); /* nothing written while frozen */
    assert_true(ps_table_count(c) >= 100 + N - 1);
    usleep(50000);
    assert_int_equal(atomic_load(&e.done), 0); /* the erase waits for the thaw */
    ps_table_cold_freeze(c, false);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&e.done), 1);
    assert_int_equal(ps_table_push(c, keys + 2 * N, N, g, N * D, NULL), 0);
    assert_true(ps_table_count(c) <= 100); /* back within budget: two evictions per insert */
    drop_cold(&f, c);
    fx_close(&f);
}

/* A record that is not what the table expects (wrong size) is an error, never a row. */
static void test_corrupt_record(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    char src[300];
    snprintf(src, sizeof src, "%s-src", f.dir);
    { /* a database holding table "bad" with one short record for key_of(1) */
        rocksdb_options_t *o = rocksdb_options_create();
        rocksdb_options_set_create_if_missing(o, 1);
        char *err = NULL;
        rocksdb_t *db = rocksdb_open(o, src, &err);
        assert_null(err);
        rocksdb_column_family_handle_t *h = rocksdb_create_column_family(db, o, "t.bad", &err);
        assert_null(err);
        rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
        char k[8];
        uint64_t key = key_of(1);
        for (int i = 0; i < 8; i++)
            k[i] = (char)(key >> (56 - 8 * i));
        rocksdb_put_cf(db, wo, h, k, 8, "\x01\x00\x00\x00garbage", 11, &err);
        assert_null(err);
        rocksdb_writeoptions_destroy(wo);
        rocksdb_column_family_handle_destroy(h);
        rocksdb_close(db);
        rocksdb_options_destroy(o);
    }
    assert_int_equal(ps_tier_replace(f.tier, src), 0);
    ps_table_t *t = tc_create("name=bad,dim=4,optimizer=sgd,capacity_rows=10,cold=true");
    assert_int_equal(ps_tier_attach(f.tier, t, false), 0);
    uint64_t keys[2] = {key_of(1), key_of(2)};
    float rows[8], g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(ps_table_pull(t, keys, 2, rows, 8), PC_ECORRUPT);
    assert_int_equal(ps_table_push(t, keys, 2, g, 8, NULL), PC_ECORRUPT);
    assert_int_equal(ps_table_count(t), 0); /* nothing inserted over the bad record */
    /* ... and erasing it goes through (it used to refuse with the read's error, forever) */
    size_t erased = 99;
    assert_int_equal(ps_table_erase(t, keys, 2, &erased), 0);
    assert_int_equal(erased, 0);
    assert_int_equal(ps_table_pull(t, keys, 2, rows, 8), 0); /* initial rows now */
    ps_tier_detach(f.tier, t, true);
    ps_table_destroy(t);
    tc_rmdir(src);
    fx_close(&f);
}

/* A checkpoint's cold copy whose MANIFEST is damaged, or whose CURRENT names another MANIFEST
 * (sizes right: the checkpoint's own check passes), is PC_ECORRUPT (a restore then goes back to
 * an older checkpoint; it was PC_EIO, which ends the server), and the tier is left empty and
 * working. */
static void test_damaged_copy(void **state) {
    (void)state;
    fixture_t f;
    fx_open(&f);
    char src[300], cmd[700];
    snprintf(src, sizeof src, "%s-src", f.dir);
    {
        rocksdb_options_t *o = rocksdb_options_create();
        rocksdb_options_set_create_if_missing(o, 1);
        char *err = NULL;
        rocksdb_t *db = rocksdb_open(o, src, &err);
        assert_null(err);
        rocksdb_close(db);
        rocksdb_options_destroy(o);
    }
    snprintf(cmd, sizeof cmd,
             "for m in %s/MANIFEST-*; do s=$(stat -c %%s $m); head -c $s /dev/urandom > $m; done",
             src);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(ps_tier_replace(f.tier, src), PC_ECORRUPT);
    /* a CURRENT naming a MANIFEST that is not there (one digit changed, its size right):
     * RocksDB says "IO error: No such file", and that is the copy's damage too (it was PC_EIO,
     * so a restore stopped instead of going back to an older checkpoint) */
    snprintf(cmd, sizeof cmd, "printf 'MANIFEST-999999\n' > %s/CURRENT", src);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(ps_tier_replace(f.tier, src), PC_ECORRUPT);
    ps_table_t *t = mk_cold(&f, "name=d,dim=4,optimizer=sgd,lr=1,shards=1,capacity_rows=2,"
                                "cold=true");
    uint64_t keys[8];
    float g[32], x[32];
    for (int i = 0; i < 8; i++)
        keys[i] = key_of((uint64_t)i);
    for (int i = 0; i < 32; i++)
        g[i] = 1.0f;
    assert_int_equal(ps_table_push(t, keys, 8, g, 32, NULL), 0); /* most spill to the tier */
    assert_int_equal(ps_table_pull(t, keys, 8, x, 32), 0);
    for (int i = 0; i < 8; i++) {
        float init[4];
        ps_table_initial_row(t, keys[i], init);
        assert_true(x[4 * i] == init[0] - 1.0f);
    }
    drop_cold(&f, t);
    tc_rmdir(src);
    fx_close(&f);
}

/* A cold table without a store refuses to evict changed rows instead of losing them. */
static void test_unattached_refuses(void **state) {
    (void)state;
    ps_table_t *t = tc_create("name=u,dim=4,optimizer=sgd,shards=1,capacity_rows=10,cold=true");
    uint64_t keys[20];
    float g[80];
    for (int i = 0; i < 20; i++)
        keys[i] = key_of((uint64_t)i);
    for (int i = 0; i < 80; i++)
        g[i] = 1;
    assert_int_equal(ps_table_push(t, keys, 10, g, 40, NULL), 0);
    assert_int_equal(ps_table_push(t, keys + 10, 10, g, 40, NULL), PC_ENOSPC);
    assert_int_equal(ps_table_count(t), 10);
    ps_table_destroy(t);
}

/* ---- checkpoints, restore, export of cold tables ------------------------------------------ */

enum { LK = 20000, LN = 256, LD = 16 };
static const char *k_live = "name=live,dim=16,optimizer=adam,shards=2,capacity_rows=2000,cold=true";
static const char *k_live_ref = "name=live,dim=16,optimizer=adam,shards=2";

/* Call i: one push of 256 rows over 20k keys (10x the RAM budget); every fourth call then
 * erases 40 random keys (mostly cold: the checkpoint's freeze must hold such erases back). */
static void live_call(ps_table_t *t, int i, bool with_erase) {
    uint64_t keys[LN];
    static _Thread_local float g[LN * LD];
    uint64_t rng = 77 + (uint64_t)i;
    for (int j = 0; j < LN; j++) {
        keys[j] = key_of(tu_rand(&rng) % LK);
        for (int e = 0; e < LD; e++)
            g[j * LD + e] = tu_gauss(&rng);
    }
    assert_int_equal(ps_table_push(t, keys, LN, g, LN * LD, NULL), 0);
    if (with_erase && i % 4 == 3) { /* random keys: mostly cold ones */
        for (int j = 0; j < 40; j++)
            keys[j] = key_of(tu_rand(&rng) % LK);
        assert_int_equal(ps_table_erase(t, keys, 40, NULL), 0);
    }
}

typedef struct live_pusher {
    ps_table_t *t;
    atomic_int done, stop;
} live_pusher_t;

static void *live_loop(void *arg) {
    live_pusher_t *p = arg;
    for (int i = 0; i < 100000 && !atomic_load(&p->stop); i++) {
        live_call(p->t, i, true);
        atomic_store(&p->done, i + 1);
    }
    return NULL;
}

/* Lookups of every key agree (weights, RAM or cold). */
static bool same_lookups(ps_table_t *a, ps_table_t *b) {
    static uint64_t keys[LK];
    static float x[LK * LD], y[LK * LD];
    for (int i = 0; i < LK; i++)
        keys[i] = key_of((uint64_t)i);
    assert_int_equal(ps_table_lookup(a, keys, LK, x, LK * LD, NULL), 0);
    assert_int_equal(ps_table_lookup(b, keys, LK, y, LK * LD, NULL), 0);
    return memcmp(x, y, sizeof x) == 0;
}

typedef struct server {
    fixture_t f;
    ps_catalog_t *cat;
    ps_ckpt_t *ck;
} server_t;

static void server_open(server_t *s, const char *ckdir) {
    fx_open(&s->f);
    assert_int_equal(ps_catalog_create(&s->cat), 0);
    ps_tier_bind_catalog(s->f.tier, s->cat);
    ps_ckpt_opts_t o = {.dir = ckdir, .keep = 5, .full_every = 3, .tier = s->f.tier};
    assert_int_equal(ps_ckpt_create(s->cat, &o, &s->ck), 0);
}

static void server_close(server_t *s) {
    ps_ckpt_destroy(s->ck);
    ps_catalog_destroy(s->cat); /* detaches (and drops) the cold tables */
    fx_close(&s->f);
}

static ps_table_t *get_table(ps_catalog_t *cat, const char *name) {
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, name, &t), 0);
    ps_catalog_release(cat, t); /* the catalog keeps it alive */
    return t;
}

/* Checkpoints cut while pushes and erases go on restore exactly the first v pushes: the RAM
 * rows and the tier's copy come from the same cut. A RAM-only table in the same checkpoints is
 * incremental and still exact. */
static void test_ckpt_cold_under_pushes(void **state) {
    (void)state;
    char ckdir[256];
    tc_tmpdir(ckdir, sizeof ckdir, "tierck");
    server_t sv;
    server_open(&sv, ckdir);
    ps_table_t *t = tc_add(sv.cat, k_live), *ram = tc_add(sv.cat, "name=ram,dim=4,optimizer=sgd");
    live_pusher_t p = {.t = t};
    pthread_t th;
    pthread_create(&th, NULL, live_loop, &p);
    uint64_t ids[3];
    for (int c = 0; c < 3; c++) {
        while (atomic_load(&p.done) < 60 * (c + 1))
            usleep(100);
        tc_round(ram, c + 1);
        ps_ckpt_result_t r;
        assert_int_equal(ps_ckpt_write(sv.ck, &r), 0);
        assert_int_equal(r.incremental, c > 0); /* the RAM table's part */
        ids[c] = r.id;
    }
    while (atomic_load(&p.done) < 60 * 4)
        usleep(100);
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    ps_table_stats_t st;
    assert_int_equal(ps_table_stats(t, &st), 0);
    assert_true(st.spilled > 0 && st.cold_hits > 0);
    for (int c = 0; c < 3; c++) {
        server_t rs; /* a fresh process: its own tier and catalog */
        server_open(&rs, ckdir);
        assert_int_equal(ps_ckpt_restore(rs.ck, ids[c], NULL), 0);
        ps_table_t *got = get_table(rs.cat, "live");
        const uint64_t v = ps_table_version(got);
        assert_true(v >= 60u * (c + 1));
        ps_table_t *ref = NULL;
        bool ok = false;
        for (int last_erase = 1; last_erase >= 0 && !ok; last_erase--) {
            ref = tc_create(k_live_ref);
            for (uint64_t i = 0; i < v; i++)
                live_call(ref, (int)i, i + 1 < v || last_erase);
            ok = same_lookups(got, ref);
            if (!ok)
                ps_table_destroy(ref);
        }
        assert_true(ok);
        static uint64_t all[LK];
        for (int i = 0; i < LK; i++)
            all[i] = key_of((uint64_t)i);
        assert_same_everywhere(got, ref, all, LK); /* optimizer state too */
        ps_table_destroy(ref);
        ps_table_t *rr = tc_create("name=ram,dim=4,optimizer=sgd");
        for (int k = 1; k <= c + 1; k++) { /* each earlier cut advanced the clock by one */
            if (k > 1)
                assert_int_equal(ps_table_advance_clock(rr, ps_table_clock(rr) + 1), 0);
            tc_round(rr, k);
        }
        tc_assert_equal(get_table(rs.cat, "ram"), rr);
        ps_table_destroy(rr);
        print_message("checkpoint %d: cut after push %llu, restored exactly\n", c,
                      (unsigned long long)v);
        server_close(&rs);
    }
    /* A restore needs a tier without attached tables: refused while "live" is attached. */
    assert_int_equal(ps_ckpt_restore(sv.ck, ids[2], NULL), PC_EINVAL);
    server_close(&sv);
    tc_rmdir(ckdir);
}

/* Every optimizer: a cold table 10x its budget, checkpointed and restored in a fresh process,
 * holds the same weights and optimizer state (pushing more gives the same results). */
static void test_roundtrip_every_optimizer(void **state) {
    (void)state;
    static const char *opts[] = {"sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"};
    char ckdir[256];
    tc_tmpdir(ckdir, sizeof ckdir, "tierrt");
    server_t sv;
    server_open(&sv, ckdir);
    char spec[5][200];
    for (int o = 0; o < 5; o++) {
        snprintf(spec[o], sizeof spec[o],
                 "name=t%d,dim=8,optimizer=%s,shards=4,capacity_rows=300,cold=true,seed=%d,"
                 "row_dtype=%s",
                 o, opts[o], o + 1, (const char *[]){"f32", "bf16", "f16"}[o % 3]);
        (void)tc_add(sv.cat, spec[o]);
    }
    enum { K = 3000, N = 200 };
    static uint64_t keys[N], all[K];
    static float g[N * 8];
    for (int i = 0; i < K; i++)
        all[i] = key_of((uint64_t)i);
    for (int o = 0; o < 5; o++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", o);
        ps_table_t *t = get_table(sv.cat, name);
        uint64_t rng = 40 + (uint64_t)o;
        for (int r = 0; r < 60; r++) {
            for (int i = 0; i < N; i++)
                keys[i] = key_of(tu_rand(&rng) % K);
            for (int i = 0; i < N * 8; i++)
                g[i] = tu_gauss(&rng) * 0.1f;
            assert_int_equal(ps_table_push(t, keys, N, g, N * 8, NULL), 0);
        }
    }
    ps_ckpt_result_t r;
    assert_int_equal(ps_ckpt_write(sv.ck, &r), 0);
    server_t rs;
    server_open(&rs, ckdir);
    assert_int_equal(ps_ckpt_restore(rs.ck, r.id, NULL), 0);
    for (int o = 0; o < 5; o++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", o);
        ps_table_t *a = get_table(sv.cat, name), *b = get_table(rs.cat, name);
        assert_int_equal(ps_table_version(a), ps_table_version(b));
        assert_int_equal(ps_table_config(b)->row_dtype, o % 3); /* the stored type comes back */
        assert_true(ps_table_count(b) <= 300);
        assert_same_everywhere(a, b, all, K);
    }
    server_close(&rs);
    server_close(&sv);
    tc_rmdir(ckdir);
}

/* Export of a cold table holds every row (RAM and cold) once; importing it elsewhere gives the
 * same table. */
static void test_export_import_cold(void **state) {
    (void)state;
    char ckdir[256], file[300];
    tc_tmpdir(ckdir, sizeof ckdir, "tierexp");
    snprintf(file, sizeof file, "%s/live.rows", ckdir);
    server_t a, b;
    server_open(&a, ckdir);
    ps_table_t *t = tc_add(a.cat, k_live);
    for (int i = 0; i < 100; i++)
        live_call(t, i, true);
    assert_int_equal(ps_table_export(t, NULL, file, true), PC_EINVAL); /* needs the tier */
    assert_int_equal(ps_table_export(t, a.f.tier, file, true), 0);
    server_open(&b, ckdir);
    assert_int_equal(ps_table_import(b.cat, file, NULL), 0);
    ps_table_t *u = get_table(b.cat, "live");
    assert_true(ps_table_count(u) <= 2000);
    assert_true(same_lookups(t, u));
    static uint64_t all[LK];
    for (int i = 0; i < LK; i++)
        all[i] = key_of((uint64_t)i);
    assert_same_everywhere(t, u, all, LK);
    /* Without a tier, a cold table is refused at import, with a clear error. */
    ps_catalog_t *plain;
    assert_int_equal(ps_catalog_create(&plain), 0);
    assert_int_equal(ps_table_import(plain, file, "x"), PC_EINVAL);
    ps_catalog_destroy(plain);
    server_close(&b);
    server_close(&a);
    tc_rmdir(ckdir);
}

/* An export of a cold table writes no expired cold row: RAM dropped its expired rows at the
 * cut, and lookups read the cold ones as absent; written, the import brought their trained
 * weights back (found, not initial) until the next expiry. */
static void test_export_skips_expired_cold(void **state) {
    (void)state;
    char ckdir[256], file[300];
    tc_tmpdir(ckdir, sizeof ckdir, "tierttl");
    snprintf(file, sizeof file, "%s/ttl.rows", ckdir);
    server_t a, b;
    server_open(&a, ckdir);
    ps_table_t *t = tc_add(a.cat, "name=ttl,dim=4,optimizer=sgd,lr=0.01,shards=2,capacity_rows=100,"
                                  "cold=true,ttl_ticks=50");
    enum { N = 1000, D = 4 };
    static uint64_t keys[N];
    static float g[N * D], x[N * D];
    static uint8_t found[N];
    for (int i = 0; i < N; i++)
        keys[i] = key_of((uint64_t)i);
    for (int i = 0; i < N * D; i++)
        g[i] = 1.0f;
    assert_int_equal(ps_table_push(t, keys, N, g, N * D, NULL), 0);
    assert_int_equal(ps_table_push(t, keys, 10, g, 10 * D, NULL), 0); /* ten stay young */
    assert_int_equal(ps_table_advance_clock(t, 30), 0);
    assert_int_equal(ps_table_push(t, keys, 10, g, 10 * D, NULL), 0);
    assert_int_equal(ps_table_advance_clock(t, 60), 0);
    assert_int_equal(ps_table_export(t, a.f.tier, file, true), 0);
    server_open(&b, ckdir);
    assert_int_equal(ps_table_import(b.cat, file, NULL), 0);
    ps_table_t *u = get_table(b.cat, "ttl");
    assert_int_equal(ps_table_lookup(u, keys, N, x, N * D, found), 0);
    size_t n_found = 0;
    for (int i = 0; i < N; i++)
        n_found += found[i];
    print_message("imported: %zu of %d keys found (10 pushed within the TTL)\n", n_found, N);
    assert_int_equal(n_found, 10);
    for (int i = 0; i < 10; i++)
        assert_int_equal(found[i], 1);
    server_close(&b);
    server_close(&a);
    tc_rmdir(ckdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_foreign_dir_kept),
        cmocka_unit_test(test_working_set_10x),
        cmocka_unit_test(test_working_set_10x_bf16),
        cmocka_unit_test(test_concurrent_spills),
        cmocka_unit_test(test_shared_keys_no_lost_update),
        cmocka_unit_test(test_requeued_rows),
        cmocka_unit_test(test_requeued_rows_refused),
        cmocka_unit_test(test_requeued_rows_oom),
        cmocka_unit_test(test_ckpt_cold_under_pushes),
        cmocka_unit_test(test_export_import_cold),
        cmocka_unit_test(test_export_skips_expired_cold),
        cmocka_unit_test(test_roundtrip_every_optimizer),
        cmocka_unit_test(test_erase_lookup_ttl),
        cmocka_unit_test(test_erase_refused),
        cmocka_unit_test(test_read_state_and_keys),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_corrupt_record),
        cmocka_unit_test(test_damaged_copy),
        cmocka_unit_test(test_unattached_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
