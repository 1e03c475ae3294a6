/* Out of memory at every allocation of a training step and of a whole local training run
 * (SQLite style, pc_mem_fail_after): the sequence is replayed with the i-th counted allocation
 * failing, for i = 0, 1, 2, ... until it completes without reaching the failure. Each time:
 * every call returns 0 or PC_ENOMEM (nothing else, no crash), everything allocated is given back
 * (the model and batch counters return to where they were: no leak on any error path), and once
 * memory is back the same sequence gives bit-identical results. */
#include "test_util.h"

#include <string.h>
#include <unistd.h>

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pw_backend.h"
#include "pw_datagen.h"
#include "pw_step.h"
#include "pw_train.h"

enum { N = 8, FEAT = 3, NK = N * FEAT, ND = 2, DIM = 4 };

static uint64_t used(void) {
    return pc_mem_used(PC_MEM_MODEL) + pc_mem_used(PC_MEM_BATCH);
}

/* One step of a small DLRM: create, stage, compute, finish (dense step), evaluate, destroy.
 * Returns the first error; *loss and ugrads when it got that far. */
static int one_step(double *loss, float *ugrads) {
    pw_backend_t *be = pw_backend_cpu();
    pw_model_config_t mc = {.name = "dlrm",
                            .ndense = ND,
                            .nfields = FEAT,
                            .dim = DIM,
                            .nbottom = 2,
                            .bottom = {8, DIM},
                            .ntop = 2,
                            .top = {8, 1},
                            .max_batch = N,
                            .seed = 3};
    float labels[N], dense[N * ND], vals[NK], urows[NK * DIM], probs[N];
    uint64_t keys[NK], ukeys[NK];
    uint16_t fields[NK];
    size_t off[N + 1], nu = 0;
    uint32_t inv[NK];
    for (int s = 0; s <= N; s++)
        off[s] = (size_t)s * FEAT;
    for (int i = 0; i < N * ND; i++)
        dense[i] = 0.1f * (float)(i % 7);
    for (int j = 0; j < NK; j++) {
        keys[j] = (uint64_t)(j * 5 % 11);
        fields[j] = (uint16_t)(j % FEAT);
        vals[j] = 1.0f;
        labels[j % N] = (float)(j % 2);
    }
    for (int i = 0; i < NK * DIM; i++)
        urows[i] = 0.01f * (float)(i % 13) - 0.05f;
    pw_batch_t b = {.n = N,
                    .ndense = ND,
                    .labels = labels,
                    .dense = dense,
                    .keys = keys,
                    .fields = fields,
                    .vals = vals,
                    .key_off = off};
    pw_unique_t u = {0};
    pw_model_t *m = NULL;
    pw_step_t *st = NULL;
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, PW_OPT_ADAM);
    int rc = pw_unique(&u, keys, NK, ukeys, inv, &nu);
    if (!rc)
        rc = pw_model_create(&mc, be, &m);
    pw_step_config_t sc = {.be = be, .model = m, .ndense = ND, .opt = &oc};
    if (!rc)
        rc = pw_step_create(&sc, &st);
    pw_step_input_t in = {.b = &b, .inv = inv, .nu = nu, .urows = urows};
    if (!rc)
        rc = pw_step_stage(st, 0, &in);
    if (!rc)
        rc = pw_step_compute(st, 0, 1.0f, ugrads);
    if (!rc)
        rc = pw_step_finish(st, true, loss);
    float *rows = rc ? NULL : pw_step_eval_rows(st, NK);
    if (!rc && !rows)
        rc = PC_ENOMEM;
    if (!rc) {
        for (int j = 0; j < NK; j++)
            memcpy(rows + j * DIM, urows + inv[j] * DIM, DIM * sizeof(float));
        rc = pw_step_eval(st, &b, probs);
    }
    pw_step_destroy(st);
    pw_model_destroy(m);
    pw_unique_free(&u);
    return rc;
}

static void test_step_oom(void **state) {
    (void)state;
    double want_loss, loss;
    float want[NK * DIM] = {0}, got[NK * DIM] = {0}; /* rows past the unique ones stay 0 */
    assert_int_equal(one_step(&want_loss, want), 0);
    const uint64_t base = used();
    int i = 0;
    for (;; i++) {
        pc_mem_fail_after(i);
        const int rc = one_step(&loss, got);
        const bool reached = pc_mem_fail_remaining() == 0;
        pc_mem_fail_after(-1);
        if (rc != 0 && rc != PC_ENOMEM)
            fail_msg("allocation %d failing: %s", i, pc_strerror(rc));
        assert_true(used() == base);               /* everything given back on every path */
        assert_int_equal(one_step(&loss, got), 0); /* and it works again */
        assert_true(loss == want_loss);
        assert_memory_equal(got, want, sizeof want);
        if (!reached) {
            assert_int_equal(rc, 0);
            break;
        }
    }
    print_message("a training step: %d allocation points replayed\n", i);
    assert_true(i > 20); /* the model, the optimizer, the step's buffers all count */
}

static char g_dir[64], g_train[128], g_test[128];

/* A whole local training run (the trainer, its pipeline, the local store, evaluation) with the
 * i-th allocation failing: 0 or PC_ENOMEM, and nothing of the model or batches left over. */
static void test_train_oom(void **state) {
    (void)state;
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.local_store = pw_emb_local_open;
    c.batch = 64;
    c.max_samples = 640;
    c.progress_every = 0;
    const char *tr[] = {g_train}, *te[] = {g_test};
    pw_train_result_t want, r;
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, te, 1, &want), 0);
    const uint64_t base = used();
    int i = 0, enomem = 0;
    for (;; i++) {
        pc_mem_fail_after(i);
        const int rc = pw_train_run(&c, PW_FMT_CRITEO, tr, 1, te, 1, &r);
        const bool reached = pc_mem_fail_remaining() == 0;
        pc_mem_fail_after(-1);
        if (rc != 0 && rc != PC_ENOMEM)
            fail_msg("allocation %d failing: %s", i, pc_strerror(rc));
        enomem += rc == PC_ENOMEM;
        assert_true(used() == base);
        if (!reached) {
            assert_int_equal(rc, 0);
            break;
        }
    }
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, te, 1, &r), 0);
    assert_true(r.auc == want.auc && r.train_loss == want.train_loss);
    print_message("a training run: %d allocation points replayed, %d ended in PC_ENOMEM\n", i,
                  enomem);
    assert_true(enomem > 0);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-oomstep-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_train, sizeof g_train, "%s/train.tsv", g_dir);
    snprintf(g_test, sizeof g_test, "%s/test.tsv", g_dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = 640;
    o.test_rows = 200;
    FILE *ftr = fopen(g_train, "w"), *fte = fopen(g_test, "w");
    pw_datagen_result_t res;
    int rc = ftr && fte ? pw_datagen_run(&o, ftr, fte, &res) : -1;
    if (ftr)
        fclose(ftr);
    if (fte)
        fclose(fte);
    return rc;
}

static int teardown(void **state) {
    (void)state;
    unlink(g_train);
    unlink(g_test);
    rmdir(g_dir);
    return 0;
}

int main(void) {
    /* the replay's errors are expected: to /dev/null (an assertion still reports on stderr) */
    FILE *quiet = fopen("/dev/null", "w");
    pc_log_init(quiet, PC_LOG_ERROR, "test_oom_step");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_oom),
        cmocka_unit_test(test_train_oom),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
