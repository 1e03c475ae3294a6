/* The model card (worker/train/pw_model_card.h):
 *  - from the trainer's settings: Criteo DLRM, CSV (dense width from the spec), libsvm FM
 *    (no dense: model_ndense 1), libffm DeepFM with --fields; errors for an unknown model, bad
 *    widths, a bad CSV spec;
 *  - a round trip of each, field for field; the text starts with the magic line;
 *  - every damage a card can take read back as an error with its reason: no file, another
 *    magic, a missing line, a line twice, an unknown name, a bad value of every kind, values
 *    that do not fit together (widths, row_dim, ndense, csv with another format), a cut-short
 *    file; and write refuses a card that would not read back. */
#include "test_util.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pw_model_card.h"

#include <string.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/ember-card-XXXXXX", base);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    pc_fs_rm_tree(g_dir);
    return 0;
}

static void path_of(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static void assert_cards_equal(const pw_model_card_t *a, const pw_model_card_t *b) {
    assert_int_equal(a->format, b->format);
    assert_string_equal(a->csv, b->csv);
    assert_string_equal(a->model.name, b->model.name);
    assert_int_equal(a->model.ndense, b->model.ndense);
    assert_int_equal(a->model.nfields, b->model.nfields);
    assert_int_equal(a->model.dim, b->model.dim);
    assert_int_equal(a->model.mean, b->model.mean);
    assert_int_equal(a->model.nbottom, b->model.nbottom);
    assert_memory_equal(a->model.bottom, b->model.bottom, sizeof(int) * (size_t)a->model.nbottom);
    assert_int_equal(a->model.ntop, b->model.ntop);
    assert_memory_equal(a->model.top, b->model.top, sizeof(int) * (size_t)a->model.ntop);
    assert_int_equal(a->model.max_batch, b->model.max_batch);
    assert_true(a->model.seed == b->model.seed);
    assert_int_equal(a->ndense, b->ndense);
    assert_string_equal(a->table_name, b->table_name);
    assert_int_equal(a->row_dim, b->row_dim);
}

/* Write, read back, compare. */
static void roundtrip(const pw_model_card_t *k) {
    char path[400], err[256];
    path_of(path, sizeof path, "card");
    assert_int_equal(pw_model_card_write(path, k), 0);
    pw_model_card_t r;
    memset(&r, 0x5a, sizeof r);
    assert_int_equal(pw_model_card_read(path, &r, err, sizeof err), 0);
    assert_string_equal(err, "");
    assert_cards_equal(k, &r);
}

static void test_from_config_and_roundtrip(void **state) {
    (void)state;
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.seed = 9000000000000000000LL; /* above 2^62: the seed is 64-bit */
    c.batch = 333;
    pw_model_card_t k;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &k), 0);
    assert_string_equal(k.model.name, "dlrm");
    assert_int_equal(k.ndense, 13);
    assert_int_equal(k.model.ndense, 13);
    assert_int_equal(k.model.nfields, 26);
    assert_int_equal(k.model.dim, 16);
    assert_int_equal(k.model.nbottom, 2);
    assert_int_equal(k.model.bottom[1], 16);
    assert_int_equal(k.model.ntop, 3);
    assert_int_equal(k.model.max_batch, 333);
    assert_true(k.model.seed == 9000000000000000000ULL);
    assert_string_equal(k.table_name, "emb");
    assert_int_equal(k.row_dim, 16);
    assert_string_equal(k.csv, "");
    roundtrip(&k);

    /* the text: the magic line first, an empty csv line */
    char path[400], *text;
    size_t len;
    path_of(path, sizeof path, "card");
    assert_int_equal(pc_fs_read_all(path, 1 << 16, &text, &len), 0);
    assert_memory_equal(text, "emberps-model-card 1\n", 21);
    assert_non_null(strstr(text, "\ncsv\n"));
    assert_non_null(strstr(text, "\nseed 9000000000000000000\n"));
    free(text);

    /* CSV: the dense width from the spec; mean pooling; another table */
    snprintf(c.csv, sizeof c.csv, "header=1,threshold=4,columns=cat:cat:label:num:log:cats");
    snprintf(c.table_name, sizeof c.table_name, "ml");
    snprintf(c.model, sizeof c.model, "deepfm");
    c.pooling = PW_POOL_MEAN;
    c.dim = 8;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CSV, &k), 0);
    assert_int_equal(k.ndense, 2);
    assert_int_equal(k.model.ndense, 2);
    assert_int_equal(k.model.nfields, 3);
    assert_int_equal(k.row_dim, 9);
    assert_true(k.model.mean);
    assert_string_equal(k.csv, c.csv);
    roundtrip(&k);

    /* libsvm FM: no dense values in the stream, a constant 1 for the model */
    snprintf(c.model, sizeof c.model, "fm");
    c.pooling = PW_POOL_SUM;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_LIBSVM, &k), 0);
    assert_int_equal(k.ndense, 0);
    assert_int_equal(k.model.ndense, 1);
    assert_string_equal(k.csv, ""); /* the csv setting is the stream's only with CSV */
    roundtrip(&k);

    /* LR on libffm with --fields */
    snprintf(c.model, sizeof c.model, "lr");
    c.fields = 39;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_LIBFFM, &k), 0);
    assert_int_equal(k.model.nfields, 39);
    assert_int_equal(k.row_dim, 1);
    roundtrip(&k);

    /* errors of the settings */
    pw_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "wide");
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &k), PC_EINVAL);
    pw_train_config_defaults(&c);
    snprintf(c.bottom, sizeof c.bottom, "64,,16");
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &k), PC_EINVAL);
    pw_train_config_defaults(&c);
    snprintf(c.top, sizeof c.top, "128,0,1");
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &k), PC_EINVAL);
    pw_train_config_defaults(&c);
    snprintf(c.csv, sizeof c.csv, "columns=cat:banana");
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CSV, &k), PC_EINVAL);
}

/* The default card's text with line `name`'s whole line replaced by `repl` (NULL: removed), or
 * `extra` appended; written to DIR/bad, read: its code and reason. */
static int read_damaged(const char *name, const char *repl, const char *extra, char *err,
                        size_t errlen) {
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    pw_model_card_t k;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &k), 0);
    char path[400], *text;
    size_t len;
    path_of(path, sizeof path, "good");
    assert_int_equal(pw_model_card_write(path, &k), 0);
    assert_int_equal(pc_fs_read_all(path, 1 << 16, &text, &len), 0);
    char out[8192] = "";
    size_t o = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        const size_t nl = strlen(name);
        const bool match = name && strncmp(line, name, nl) == 0 && (!line[nl] || line[nl] == ' ');
        if (match && !repl)
            continue;
        o += (size_t)snprintf(out + o, sizeof out - o, "%s\n", match ? repl : line);
    }
    if (extra)
        o += (size_t)snprintf(out + o, sizeof out - o, "%s", extra);
    free(text);
    path_of(path, sizeof path, "bad");
    assert_int_equal(pc_fs_write_atomic(path, out, o), 0);
    pw_model_card_t r;
    err[0] = '\0';
    const int rc = pw_model_card_read(path, &r, err, errlen);
    print_message("  %-14s -> %s: %s\n", repl ? repl : name, pc_err_name(rc), err);
    return rc;
}

static void expect(int want, const char *reason, const char *name, const char *repl,
                   const char *extra) {
    char err[256];
    assert_int_equal(read_damaged(name, repl, extra, err, sizeof err), want);
    if (!strstr(err, reason))
        fail_msg("reason '%s' does not say '%s'", err, reason);
}

static void test_damaged(void **state) {
    (void)state;
    char err[256];
    pw_model_card_t r;
    /* no file */
    assert_int_equal(pw_model_card_read("/nonexistent/card", &r, err, sizeof err), PC_ENOTFOUND);
    assert_non_null(strstr(err, "no such file"));
    assert_int_equal(pw_model_card_read("/nonexistent/card", &r, NULL, 0), PC_ENOTFOUND);
    /* the undamaged card reads */
    assert_int_equal(read_damaged("nothing", NULL, NULL, err, sizeof err), 0);
    /* not a card */
    expect(PC_EPARSE, "not a model card", "emberps-model-card", "emberps-model-card 2", NULL);
    expect(PC_EPARSE, "not a model card", "emberps-model-card", "format criteo", NULL);
    /* lines: missing, twice, unknown, cut short */
    expect(PC_EPARSE, "no row_dim line", "row_dim", NULL, NULL);
    expect(PC_EPARSE, "no csv line", "csv", NULL, NULL);
    expect(PC_EPARSE, "dim given twice", "nothing", NULL, "dim 16\n");
    expect(PC_EPARSE, "unknown name 'colour'", "nothing", NULL, "colour blue\n");
    expect(PC_EPARSE, "not terminated", "nothing", NULL, "dim 1");
    /* a bad value of each kind */
    expect(PC_EPARSE, "bad format 'parquet'", "format", "format parquet", NULL);
    expect(PC_EPARSE, "bad model ''", "model", "model", NULL);
    expect(PC_EPARSE, "bad model_ndense '0'", "model_ndense", "model_ndense 0", NULL);
    expect(PC_EPARSE, "bad nfields '-1'", "nfields", "nfields -1", NULL);
    expect(PC_EPARSE, "bad dim '16x'", "dim", "dim 16x", NULL);
    expect(PC_EPARSE, "bad pooling 'max'", "pooling", "pooling max", NULL);
    expect(PC_EPARSE, "bad bottom '64,'", "bottom", "bottom 64,", NULL);
    expect(PC_EPARSE, "bad top '1,a'", "top", "top 1,a", NULL);
    expect(PC_EPARSE, "bad max_batch '0'", "max_batch", "max_batch 0", NULL);
    expect(PC_EPARSE, "bad seed '-1'", "seed", "seed -1", NULL);
    expect(PC_EPARSE, "bad ndense ''", "ndense", "ndense", NULL);
    expect(PC_EPARSE, "bad table 'a b'", "table", "table a b", NULL);
    expect(PC_EPARSE, "bad row_dim '0'", "row_dim", "row_dim 0", NULL);
    /* values that do not fit together */
    expect(PC_ECORRUPT, "model 'wide' is not one of", "model", "model wide", NULL);
    expect(PC_ECORRUPT, "bottom widths must end at dim 16", "bottom", "bottom 64,8", NULL);
    expect(PC_ECORRUPT, "bottom widths must end at dim 16", "bottom", "bottom -", NULL);
    expect(PC_ECORRUPT, "top widths must end at 1", "top", "top 128,64", NULL);
    expect(PC_ECORRUPT, "row_dim 17", "row_dim", "row_dim 17", NULL);
    expect(PC_ECORRUPT, "ndense 12: format criteo gives 13", "ndense", "ndense 12", NULL);
    expect(PC_ECORRUPT, "model_ndense 1: the stream gives 13", "model_ndense", "model_ndense 1",
           NULL);
    expect(PC_ECORRUPT, "needs nfields >= 1", "nfields", "nfields 0", NULL);
    expect(PC_ECORRUPT, "a csv spec with format criteo", "csv", "csv columns=label:cat", NULL);
    expect(PC_ECORRUPT, "csv: ", "format", "format csv", NULL); /* csv with no spec */

    /* write refuses what would not read back */
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    pw_model_card_t k;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &k), 0);
    char path[400];
    path_of(path, sizeof path, "refused");
    k.row_dim = 3;
    assert_int_equal(pw_model_card_write(path, &k), PC_EINVAL);
    assert_int_equal(access(path, F_OK), -1);
    k.row_dim = 16;
    k.model.bottom[1] = 8; /* DLRM's bottom must end at dim */
    assert_int_equal(pw_model_card_write(path, &k), PC_EINVAL);
    assert_int_equal(pw_model_card_write(NULL, &k), PC_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_from_config_and_roundtrip),
                                       cmocka_unit_test(test_damaged)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
