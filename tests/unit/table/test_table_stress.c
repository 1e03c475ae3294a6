/* Concurrency: threads pull, push, insert, erase, look up, scan and advance the clock on one
 * table at once; the final rows must equal a sequential replay of each thread's own operations.
 *
 * Each writer thread owns the keys k with k % NW == its id and is the only one to push or erase
 * them, so per-key operation order is fixed and replay is exact (Adagrad is order-sensitive).
 * Other threads read every key; their pulls may re-create a row the owner erased, which only
 * ever holds the initial row and fresh state, and the check accepts exactly that. A second phase
 * runs the same mix on a table with a small capacity so CLOCK eviction runs concurrently too.
 * Run under TSan (EMBER_SANITIZE=thread) to check the locking. */
#include "test_util.h"

#include <pthread.h>
#include <string.h>

#include "pc_error.h"
#include "ps_table.h"

#define NW    3 /* writer threads */
#define NKEYS 3000
#define DIM   8
#define OPS   400
#define BATCH 64

typedef enum { OP_PULL, OP_PUSH, OP_ERASE } op_kind_t;

typedef struct op {
    op_kind_t kind;
    int n;
    uint64_t keys[BATCH];
    float grads[BATCH * DIM];
} op_t;

typedef struct worker {
    int id;
    ps_table_t *t;
    op_t *log;
    int rc;
    int check_values;
} worker_t;

static uint64_t key_of(int i) {
    return (uint64_t)i * 0x9E3779B97F4A7C15ULL + 17;
}

static void *writer(void *arg) {
    worker_t *w = arg;
    uint64_t rng = 1000 + (uint64_t)w->id;
    float rows[BATCH * DIM];
    for (int o = 0; o < OPS; o++) {
        op_t *op = &w->log[o];
        uint64_t r = tu_rand(&rng) % 10;
        op->kind = r < 3 ? OP_PULL : (r < 9 ? OP_PUSH : OP_ERASE);
        op->n = 1 + (int)(tu_rand(&rng) % BATCH);
        for (int i = 0; i < op->n; i++) {
            int k = (int)(tu_rand(&rng) % (NKEYS / NW)) * NW + w->id; /* own keys, dups happen */
            op->keys[i] = key_of(k);
            for (int e = 0; e < DIM; e++)
                op->grads[i * DIM + e] = tu_gauss(&rng);
        }
        int rc = 0;
        switch (op->kind) {
            case OP_PULL:
                rc = ps_table_pull(w->t, op->keys, (size_t)op->n, rows, (size_t)op->n * DIM);
                break;
            case OP_PUSH:
                rc = ps_table_push(w->t, op->keys, (size_t)op->n, op->grads, (size_t)op->n * DIM,
                                   NULL);
                break;
            case OP_ERASE:
                rc = ps_table_erase(w->t, op->keys, (size_t)(op->n < 4 ? op->n : 4), NULL);
                op->n = op->n < 4 ? op->n : 4;
                break;
        }
        if (rc)
            w->rc = rc;
    }
    return NULL;
}

static int noop_scan(void *ctx, const ps_row_view_t *rows, size_t n) {
    uint64_t *sum = ctx;
    for (size_t i = 0; i < n; i++)
        *sum += rows[i].key + (uint64_t)(rows[i].weights[0] != 0);
    return 0;
}

static void *reader(void *arg) {
    worker_t *w = arg;
    uint64_t rng = 77;
    float rows[BATCH * DIM];
    uint64_t keys[BATCH], sink = 0;
    for (int o = 0; o < OPS; o++) {
        for (int i = 0; i < BATCH; i++)
            keys[i] = key_of((int)(tu_rand(&rng) % NKEYS));
        int rc = (o % 2) ? ps_table_lookup(w->t, keys, BATCH, rows, BATCH * DIM, NULL)
                         : ps_table_pull(w->t, keys, BATCH, rows, BATCH * DIM);
        if (rc)
            w->rc = rc;
        if (o % 50 == 0) {
            ps_table_scan(w->t, PS_SCAN_ALL, noop_scan, &sink);
            ps_table_stats_t st;
            ps_table_stats(w->t, &st);
            ps_table_advance_clock(w->t, (uint32_t)(o + 1));
        }
    }
    return NULL;
}

static void run_phase(const char *spec, int check) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, spec, NULL, 0), 0);
    ps_table_t *t, *ref;
    assert_int_equal(ps_table_create(&c, &t), 0);
    worker_t w[NW + 1];
    pthread_t th[NW + 1];
    for (int i = 0; i <= NW; i++) {
        w[i] = (worker_t){.id = i, .t = t, .log = calloc(OPS, sizeof(op_t)), .rc = 0};
        assert_non_null(w[i].log);
        pthread_create(&th[i], NULL, i < NW ? writer : reader, &w[i]);
    }
    for (int i = 0; i <= NW; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].rc, 0);
    }
    if (check) {
        /* Sequential replay of the writers' logs into a fresh table. */
        assert_int_equal(ps_table_create(&c, &ref), 0);
        float rows[BATCH * DIM];
        for (int i = 0; i < NW; i++) {
            for (int o = 0; o < OPS; o++) {
                op_t *op = &w[i].log[o];
                size_t n = (size_t)op->n;
                if (op->kind == OP_PULL)
                    assert_int_equal(ps_table_pull(ref, op->keys, n, rows, n * DIM), 0);
                else if (op->kind == OP_PUSH)
                    assert_int_equal(ps_table_push(ref, op->keys, n, op->grads, n * DIM, NULL), 0);
                else
                    assert_int_equal(ps_table_erase(ref, op->keys, n, NULL), 0);
            }
        }
        int compared = 0;
        for (int k = 0; k < NKEYS; k++) {
            uint64_t key = key_of(k);
            float a[DIM], b[DIM], init[DIM];
            uint8_t fa, fb;
            assert_int_equal(ps_table_lookup(t, &key, 1, a, DIM, &fa), 0);
            assert_int_equal(ps_table_lookup(ref, &key, 1, b, DIM, &fb), 0);
            if (fb) {
                assert_int_equal(fa, 1);
                assert_memory_equal(a, b, sizeof a);
                compared++;
            } else if (fa) { /* re-created by a reader's pull: must be pristine */
                ps_table_initial_row(t, key, init);
                assert_memory_equal(a, init, sizeof a);
            }
        }
        print_message("replayed %d rows equal\n", compared);
        assert_true(compared > NKEYS / 3);
        ps_table_destroy(ref);
    } else {
        assert_true(ps_table_count(t) <= (uint64_t)c.capacity_rows);
    }
    for (int i = 0; i <= NW; i++)
        free(w[i].log);
    ps_table_destroy(t);
}

static void test_concurrent_replay(void **state) {
    (void)state;
    run_phase("dim=8,optimizer=adagrad,lr=0.05,shards=4", 1);
    run_phase("dim=8,optimizer=adam,lr=0.05,shards=1", 1); /* one lock: maximal contention */
}

static void test_concurrent_eviction(void **state) {
    (void)state;
    run_phase("dim=8,optimizer=sgd,shards=4,capacity_rows=400", 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent_replay),
                                       cmocka_unit_test(test_concurrent_eviction)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
