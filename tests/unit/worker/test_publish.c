/* The dense publisher (worker/train/pw_publish.h) over a stand-in store whose watermark op
 * answers set marks:
 *  - a version every 5 steps: dense-<20 digits>/ with model (loads bit-exact into the model the
 *    card describes: the snapshot of that step, not a later one), card and watermark (the magic,
 *    the table, a line per server in order); no *.tmp left; the `keep` newest stay;
 *  - a step below the last (a rollback) is published at once and the versions after it go;
 *    a job rollback's pw_publish_abandon removes them before that, a later snapshot with them
 *    (and a resumed job's first step is then published at once);
 *  - force publishes an off-schedule step once; a store without the op writes no server lines;
 *  - a failing watermark: counted, logged, no directory; the next one works;
 *  - by seconds alone (every 0, every_s): due after the interval;
 *  - open removes a crash's dense-*.tmp; bad options are PC_EINVAL. */
#include "test_util.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pw_backend.h"
#include "pw_publish.h"

#include <dirent.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/ember-publish-XXXXXX", base);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    pc_fs_rm_tree(g_dir);
    return 0;
}

/* A store with only a watermark op: two servers, marks (uid 7 + i, head 100 * calls + i). */
typedef struct fake {
    pw_emb_t base;
    int calls;
    int fail; /* the next call fails with PC_EUNAVAIL */
} fake_t;

static int fake_watermark(pw_emb_t *e, pw_emb_mark_t *out, size_t cap, size_t *n, char *why,
                          size_t whycap) {
    fake_t *f = (fake_t *)e;
    if (f->fail) {
        f->fail = 0;
        snprintf(why, whycap, "127.0.0.1:1: service unavailable");
        return PC_EUNAVAIL;
    }
    f->calls++;
    assert_true(cap >= 2);
    for (size_t i = 0; i < 2; i++)
        out[i] = (pw_emb_mark_t){.uid = 7 + i, .head = 100 * (uint64_t)f->calls + i};
    *n = 2;
    return 0;
}

static const pw_emb_ops_t k_fake = {.name = "fake", .watermark = fake_watermark};
static const pw_emb_ops_t k_bare = {.name = "bare"};

static bool exists(const char *name) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return access(path, F_OK) == 0;
}

static void version_path(char *buf, size_t cap, uint64_t step, const char *file) {
    snprintf(buf, cap, "%s/dense-%020llu/%s", g_dir, (unsigned long long)step, file);
}

/* The number of dense-* entries (temporary ones too). */
static int count_versions(void) {
    DIR *d = opendir(g_dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, "dense-", 6) == 0;
    closedir(d);
    return n;
}

static void test_versions(void **state) {
    (void)state;
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.dim = 4;
    snprintf(c.bottom, sizeof c.bottom, "8,4");
    snprintf(c.top, sizeof c.top, "8,1");
    c.batch = 8;
    pw_model_card_t card;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &card), 0);
    pw_model_t *m, *m2;
    assert_int_equal(pw_model_create(&card.model, pw_backend_cpu(), &m), 0);
    assert_int_equal(pw_model_create(&card.model, pw_backend_cpu(), &m2), 0);
    fake_t f = {.base = {.ops = &k_fake, .dim = 4}};
    /* a crash's leftover */
    char path[512];
    snprintf(path, sizeof path, "%s/dense-00000000000000000003.tmp", g_dir);
    assert_int_equal(pc_fs_mkdirs(path), 0);
    pw_publish_opts_t o = {.dir = g_dir, .every = 5, .keep = 2, .card = &card, .emb = &f.base};
    pw_publish_t *p;
    assert_int_equal(pw_publish_open(&o, &p), 0);
    assert_false(exists("dense-00000000000000000003.tmp"));
    for (uint64_t step = 1; step <= 12; step++) {
        m->params[0].w[0] = (float)step; /* the weights of this step */
        assert_int_equal(pw_publish_step(p, m, step, false), 0);
        pw_publish_flush(p); /* so that no snapshot is replaced (skipped) here */
    }
    pw_publish_stats_t st;
    pw_publish_stats(p, &st);
    assert_int_equal(st.published, 2); /* 5, 10 */
    assert_int_equal(st.last_step, 10);
    assert_int_equal(st.skipped, 0);
    assert_true(exists("dense-00000000000000000005") && exists("dense-00000000000000000010"));
    assert_int_equal(count_versions(), 2);
    /* the version of step 10: its model is step 10's, its card and watermark */
    version_path(path, sizeof path, 10, "model");
    assert_int_equal(pw_model_load(m2, path), 0);
    assert_true(m2->params[0].w[0] == 10.0f);
    assert_memory_equal(m2->params[1].w, m->params[1].w, sizeof(float) * 8);
    pw_model_card_t rc;
    char err[256];
    version_path(path, sizeof path, 10, "card");
    assert_int_equal(pw_model_card_read(path, &rc, err, sizeof err), 0);
    assert_int_equal(rc.model.dim, 4);
    char *text;
    version_path(path, sizeof path, 10, "watermark");
    assert_int_equal(pc_fs_read_all(path, 4096, &text, NULL), 0);
    assert_string_equal(text, "emberps-watermark 1\ntable emb\nserver 0 7 200\nserver 1 8 201\n");
    free(text);

    /* force: step 12, once */
    assert_int_equal(pw_publish_step(p, m, 12, true), 0);
    assert_int_equal(pw_publish_step(p, m, 12, true), 0);
    pw_publish_flush(p);
    pw_publish_stats(p, &st);
    assert_int_equal(st.published, 3);
    assert_false(exists("dense-00000000000000000005")); /* keep 2 */
    assert_true(exists("dense-00000000000000000010") && exists("dense-00000000000000000012"));

    /* a rollback to step 7: published at once, 10 and 12 go (the abandoned steps) */
    assert_int_equal(pw_publish_step(p, m, 7, false), 0);
    pw_publish_flush(p);
    assert_true(exists("dense-00000000000000000007"));
    assert_false(exists("dense-00000000000000000010") || exists("dense-00000000000000000012"));
    assert_int_equal(pw_publish_step(p, m, 8, false), 0); /* the schedule: 12 next */
    assert_int_equal(pw_publish_step(p, m, 12, false), 0);
    pw_publish_flush(p);
    assert_true(exists("dense-00000000000000000012"));
    assert_false(exists("dense-00000000000000000008"));

    /* a job rollback to step 9 (before the servers restore): every version after it goes at
     * once, one written (13, flushed) and one pending or being written (14: dropped, or waited
     * for and removed); the rollback's step is then published at once */
    assert_int_equal(pw_publish_step(p, m, 13, true), 0);
    pw_publish_flush(p);
    assert_true(exists("dense-00000000000000000013"));
    assert_int_equal(pw_publish_step(p, m, 14, true), 0);
    pw_publish_abandon(p, 9);
    assert_false(exists("dense-00000000000000000012") || exists("dense-00000000000000000013") ||
                 exists("dense-00000000000000000014"));
    assert_int_equal(pw_publish_step(p, m, 9, false), 0);
    pw_publish_flush(p);
    assert_true(exists("dense-00000000000000000009"));
    assert_false(exists("dense-00000000000000000013"));

    /* a failing watermark: counted, nothing left behind; the next one works */
    f.fail = 1;
    assert_int_equal(pw_publish_step(p, m, 17, false), 0);
    pw_publish_flush(p);
    pw_publish_stats(p, &st);
    assert_int_equal(st.failed, 1);
    assert_false(exists("dense-00000000000000000017") || exists("dense-00000000000000000017.tmp"));
    assert_int_equal(pw_publish_step(p, m, 22, false), 0);
    pw_publish_close(p); /* writes what is pending */
    assert_true(exists("dense-00000000000000000022"));
    assert_int_equal(count_versions(), 2);

    /* a store without servers: no server lines; by seconds only */
    fake_t bare = {.base = {.ops = &k_bare, .dim = 4}};
    o = (pw_publish_opts_t){
        .dir = g_dir, .every = 0, .every_s = 0.05, .keep = 5, .card = &card, .emb = &bare.base};
    assert_int_equal(pw_publish_open(&o, &p), 0);
    assert_int_equal(pw_publish_step(p, m, 30, false), 0); /* too early */
    pw_publish_flush(p);
    assert_false(exists("dense-00000000000000000030"));
    usleep(60000);
    assert_int_equal(pw_publish_step(p, m, 31, false), 0);
    pw_publish_close(p);
    version_path(path, sizeof path, 31, "watermark");
    assert_int_equal(pc_fs_read_all(path, 4096, &text, NULL), 0);
    assert_string_equal(text, "emberps-watermark 1\ntable emb\n");
    free(text);

    /* bad options */
    o.every_s = 0;
    assert_int_equal(pw_publish_open(&o, &p), PC_EINVAL); /* neither steps nor seconds */
    o.every = 5;
    o.keep = 0;
    assert_int_equal(pw_publish_open(&o, &p), PC_EINVAL);
    o.keep = 1;
    o.dir = "";
    assert_int_equal(pw_publish_open(&o, &p), PC_EINVAL);

    /* a job resumed from a checkpoint of step 25 (--resume=checkpoint: the servers restored
     * it): a new publisher over the directory drops 31 (an earlier run's, after the checkpoint)
     * and publishes the resumed run's first step at once (its first was 100 steps away) */
    o = (pw_publish_opts_t){.dir = g_dir, .every = 100, .keep = 5, .card = &card, .emb = &f.base};
    f.fail = 0;
    assert_int_equal(pw_publish_open(&o, &p), 0);
    assert_true(exists("dense-00000000000000000031"));
    pw_publish_abandon(p, 25);
    assert_false(exists("dense-00000000000000000031"));
    assert_true(exists("dense-00000000000000000022"));
    assert_int_equal(pw_publish_step(p, m, 26, false), 0);
    pw_publish_flush(p);
    assert_true(exists("dense-00000000000000000026"));
    assert_int_equal(pw_publish_step(p, m, 27, false), 0); /* the schedule: 126 next */
    pw_publish_close(p);
    assert_false(exists("dense-00000000000000000027"));
    pw_model_destroy(m);
    pw_model_destroy(m2);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_versions)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
