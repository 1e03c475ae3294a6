/* Local training end to end on generated data: LR, FM and DLRM learn (AUC well above 0.5 on
 * held-out rows), DLRM beats LR on data with planted interactions, the test set inserts no rows,
 * and bad configurations or unreadable data fail with a clear error. */
#include "table_check.h"

#include <math.h>

#include "pc_error.h"
#include "pc_log.h"
#include "pw_datagen.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"
#include "pw_train.h"

static char g_dir[256], g_train[300], g_test[300];
static pw_datagen_result_t g_oracle;

static int setup(void **state) {
    (void)state;
    pc_log_set_level(PC_LOG_ERROR);
    tc_tmpdir(g_dir, sizeof g_dir, "train");
    snprintf(g_train, sizeof g_train, "%s/train.tsv", g_dir);
    snprintf(g_test, sizeof g_test, "%s/test.tsv", g_dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = 150000;
    o.test_rows = 30000;
    o.vocab_max = 2000;
    FILE *a = fopen(g_train, "w"), *b = fopen(g_test, "w");
    int rc = pw_datagen_run(&o, a, b, &g_oracle);
    fclose(a);
    fclose(b);
    return rc;
}

static int teardown(void **state) {
    (void)state;
    tc_rmdir(g_dir);
    return 0;
}

static pw_train_result_t train(const char *model) {
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "%s", model);
    c.batch = 512;
    const char *tr[] = {g_train}, *te[] = {g_test};
    pw_train_result_t r;
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, te, 1, &r), 0);
    return r;
}

static void test_models_learn(void **state) {
    (void)state;
    pw_train_result_t lr = train("lr"), fm = train("fm"), dlrm = train("dlrm");
    print_message("oracle AUC %.4f; LR %.4f (%.0f samples/s); FM %.4f; DLRM %.4f (%.0f "
                  "samples/s)\n",
                  g_oracle.oracle_auc, lr.auc, lr.samples_per_s, fm.auc, dlrm.auc,
                  dlrm.samples_per_s);
    /* FM learns; at this size its 325 factor pairs are under-trained (it passes LR at 2M rows:
     * docs/training.md), so only DLRM is held to beating LR here. */
    assert_true(fm.auc > 0.70);
    assert_int_equal(dlrm.samples, 150000);
    assert_int_equal(dlrm.test_samples, 30000);
    assert_true(lr.auc > 0.68 && dlrm.auc > 0.72);
    assert_true(dlrm.auc > lr.auc + 0.02);       /* the interactions are learned */
    assert_true(dlrm.auc < g_oracle.oracle_auc); /* nobody beats the truth */
    assert_true(isfinite(dlrm.logloss) && dlrm.logloss < 0.6);
    /* Rows come from training keys only: evaluation reads, never inserts. */
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.batch = 512;
    const char *tr[] = {g_train};
    pw_train_result_t only;
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, NULL, 0, &only), 0);
    assert_int_equal(only.table_rows, dlrm.table_rows);
}

/* Save the dense model and export the embeddings: the export imports as a table with every
 * trained row; loading the dense file into a model of another shape fails with PC_EDIM. */
static void test_save_load(void **state) {
    (void)state;
    char dense[300], emb[300];
    snprintf(dense, sizeof dense, "%s/model.dense", g_dir);
    snprintf(emb, sizeof emb, "%s/emb.rows", g_dir);
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.batch = 512;
    c.max_samples = 20000;
    snprintf(c.save_dense, sizeof c.save_dense, "%s", dense);
    snprintf(c.export_embeddings, sizeof c.export_embeddings, "%s", emb);
    const char *tr[] = {g_train}, *te[] = {g_test};
    pw_train_result_t a;
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, te, 1, &a), 0);
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    assert_int_equal(ps_table_import(cat, emb, NULL), 0);
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
    assert_int_equal(ps_table_count(t), a.table_rows);
    ps_catalog_release(cat, t);
    ps_catalog_destroy(cat);
    pw_train_config_t d = c; /* loading a model of another shape fails clearly */
    d.save_dense[0] = d.export_embeddings[0] = '\0';
    snprintf(d.load_dense, sizeof d.load_dense, "%s", dense);
    d.top[0] = 32;
    pw_train_result_t b;
    assert_int_equal(pw_train_run(&d, PW_FMT_CRITEO, tr, 1, NULL, 0, &b), PC_EDIM);
}

static void test_errors(void **state) {
    (void)state;
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    const char *tr[] = {g_train}, *missing[] = {"/nonexistent/data.tsv"};
    pw_train_result_t r;
    snprintf(c.model, sizeof c.model, "gbdt");
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, NULL, 0, &r), PC_EINVAL);
    pw_train_config_defaults(&c);
    c.bottom[c.nbottom - 1] = 8; /* must end at dim 16 */
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, NULL, 0, &r), PC_EINVAL);
    pw_train_config_defaults(&c);
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, missing, 1, NULL, 0, &r), PC_EIO);
    c.max_samples = 5000; /* a budget stops training early */
    assert_int_equal(pw_train_run(&c, PW_FMT_CRITEO, tr, 1, NULL, 0, &r), 0);
    assert_true(r.samples >= 5000 && r.samples < 5000 + 1024);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_learn),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
