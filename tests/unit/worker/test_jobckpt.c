/* Coordinated checkpoints' files (worker/train/pw_jobckpt.h), without servers:
 *  - a step written with the dense model and the card is a model version: `model` loads into
 *    the model the card describes (bit-exact weights), `card` reads back, the manifest gives the
 *    servers' ids, positions and checkpoint directories; pw_jobckpt_read of a given step and
 *    pw_jobckpt_read_latest agree; state NULL reads only the manifest;
 *  - without a model and card, and without server directories (servers that do not say): no
 *    server-dir lines, and it reads; a manifest as written before server-dir lines existed reads;
 *  - damaged server-dir lines (an index out of range, one twice, no path, a foreign line) are
 *    PC_ECORRUPT; a step that is not there is PC_ENOTFOUND (read) or PC_ECORRUPT (LATEST names
 *    it);
 *  - the directories' arena: paths up to PW_JOBCKPT_DIR_MAX - 1, newlines refused, PC_ETOOBIG
 *    when full; retention keeps `keep` step directories;
 *  - server lists with an empty entry, or another count than a restore's checkpoint: no call;
 *  - the run that wrote a checkpoint ("run NAME") reads back; once, before the map;
 *  - a step written again is the new write whole (written aside, renamed into place); a crash's
 *    leftover of any step goes;
 *  - manifests are sealed (version 2): one unsealed or with a digit flipped is PC_ECORRUPT;
 *    version 1 (older, unsealed) reads. */
#include "test_util.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pw_backend.h"
#include "pw_jobckpt.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/ember-jobckpt-XXXXXX", base);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    pc_fs_rm_tree(g_dir);
    return 0;
}

/* A checkpoint of 3 servers (1 and 2 with directories) and 2 ranks at step. */
static pw_jobckpt_t *sample_ck(uint64_t step, bool dirs) {
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    assert_non_null(ck);
    ck->step = step;
    ck->nservers = 3;
    ck->nranks = 2;
    for (size_t i = 0; i < 3; i++)
        ck->servers[i] = 100 * step + i;
    ck->positions[0] = 7 * step;
    ck->positions[1] = 7 * step + 1;
    if (dirs) {
        assert_int_equal(pw_jobckpt_server_dir_set(ck, 1, "/var/lib/emberps/ckpt 1"), 0);
        assert_int_equal(pw_jobckpt_server_dir_set(ck, 2, "/srv/ckpt/two"), 0);
    }
    return ck;
}

static void write_text(const char *path, const char *text) {
    assert_int_equal(pc_fs_write_atomic(path, text, strlen(text)), 0);
}

static void test_version_roundtrip(void **state) {
    (void)state;
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.dim = 4;
    snprintf(c.bottom, sizeof c.bottom, "8,4");
    snprintf(c.top, sizeof c.top, "8,1");
    c.batch = 16;
    pw_model_card_t card;
    assert_int_equal(pw_model_card_from_config(&c, PW_FMT_CRITEO, &card), 0);
    pw_model_t *m, *m2;
    assert_int_equal(pw_model_create(&card.model, pw_backend_cpu(), &m), 0);
    m->params[0].w[3] = 0.625f; /* not an initial value */
    const float st[5] = {1, 2, 3, 4, 5};
    pw_jobckpt_t *ck = sample_ck(40, true), *r = calloc(1, sizeof *r);
    snprintf(ck->run, sizeof ck->run, "job-a/run/3");
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, m, &card, 2), 0);

    float got[5] = {0};
    assert_int_equal(pw_jobckpt_read_latest(g_dir, r, got, 5), 0);
    assert_memory_equal(got, st, sizeof st);
    assert_true(r->step == 40 && r->nservers == 3 && r->nranks == 2);
    assert_true(r->servers[2] == 4002 && r->positions[1] == 281);
    assert_string_equal(pw_jobckpt_server_dir(r, 0), "");
    assert_string_equal(pw_jobckpt_server_dir(r, 1), "/var/lib/emberps/ckpt 1");
    assert_string_equal(pw_jobckpt_server_dir(r, 2), "/srv/ckpt/two");
    assert_string_equal(r->run, "job-a/run/3");
    memset(r, 0x7f, sizeof *r); /* pw_jobckpt_read sets every field it reads */
    assert_int_equal(pw_jobckpt_read(g_dir, 40, r, NULL, 0), 0);
    assert_string_equal(pw_jobckpt_server_dir(r, 0), "");
    assert_string_equal(pw_jobckpt_server_dir(r, 2), "/srv/ckpt/two");
    assert_int_equal(pw_jobckpt_read(g_dir, 41, r, NULL, 0), PC_ENOTFOUND);
    assert_int_equal(pw_jobckpt_read(g_dir, 40, r, got, 4), PC_EDIM);

    /* the step directory is a model version: its card and model */
    char path[512], err[256];
    pw_model_card_t rc;
    snprintf(path, sizeof path, "%s/step-%020d/card", g_dir, 40);
    assert_int_equal(pw_model_card_read(path, &rc, err, sizeof err), 0);
    assert_int_equal(rc.model.dim, 4);
    assert_int_equal(rc.row_dim, 4);
    assert_int_equal(pw_model_create(&rc.model, pw_backend_cpu(), &m2), 0);
    snprintf(path, sizeof path, "%s/step-%020d/model", g_dir, 40);
    assert_int_equal(pw_model_load(m2, path), 0);
    for (int i = 0; i < m->nparams; i++)
        assert_memory_equal(m->params[i].w, m2->params[i].w,
                            sizeof(float) * (size_t)m->params[i].in * (size_t)m->params[i].out);
    assert_true(m2->params[0].w[3] == 0.625f);

    /* without model, card and directories; retention keeps 2 */
    free(ck);
    ck = sample_ck(80, false);
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, m, NULL, 2), PC_EINVAL); /* both or none */
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, NULL, NULL, 2), 0);
    snprintf(path, sizeof path, "%s/step-%020d/model", g_dir, 80);
    assert_int_equal(access(path, F_OK), -1);
    char *text;
    snprintf(path, sizeof path, "%s/step-%020d/manifest", g_dir, 80);
    assert_int_equal(pc_fs_read_all(path, 1 << 16, &text, NULL), 0);
    assert_null(strstr(text, "server-dir"));
    free(text);
    assert_int_equal(pw_jobckpt_read_latest(g_dir, r, NULL, 0), 0);
    assert_true(r->step == 80);
    assert_string_equal(pw_jobckpt_server_dir(r, 1), "");
    assert_string_equal(r->run, ""); /* none given: no run line */
    free(ck);
    ck = sample_ck(120, true);
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, m, &card, 2), 0);
    assert_int_equal(pw_jobckpt_read(g_dir, 40, r, NULL, 0), PC_ENOTFOUND); /* pruned */
    assert_int_equal(pw_jobckpt_read(g_dir, 80, r, NULL, 0), 0);
    assert_int_equal(pw_jobckpt_read(g_dir, 120, r, NULL, 0), 0);
    /* step 120 written again (a rollback reached it again), without a model: the step is the
     * new write whole, not the new manifest beside the old model (a model version serving would
     * have paired them); a crash's leftovers go, this step's and another's (step-S.tmp) */
    char other[400];
    snprintf(path, sizeof path, "%s/step-%020d.tmp", g_dir, 120);
    snprintf(other, sizeof other, "%s/step-%020d.tmp", g_dir, 100);
    assert_int_equal(pc_fs_mkdirs(path), 0);
    assert_int_equal(pc_fs_mkdirs(other), 0);
    ck->servers[0] = 9999;
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, NULL, NULL, 2), 0);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(access(other, F_OK), -1);
    snprintf(path, sizeof path, "%s/step-%020d/model", g_dir, 120);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(pw_jobckpt_read(g_dir, 120, r, NULL, 0), 0);
    assert_true(r->servers[0] == 9999);
    pw_model_destroy(m);
    pw_model_destroy(m2);
    free(ck);
    free(r);
}

/* The manifest of step 7 in dir/step-7 with `tail` after the positions line: read's code. */
static int read_manifest(const char *tail) {
    char sdir[400], path[450];
    snprintf(sdir, sizeof sdir, "%s/step-%020d", g_dir, 7);
    assert_int_equal(pc_fs_mkdirs(sdir), 0);
    snprintf(path, sizeof path, "%s/manifest", sdir);
    char text[1024];
    snprintf(text, sizeof text,
             "emberps-job-checkpoint 1\nstep 7\nservers 11 12\npositions 5 6 7\n%s", tail);
    write_text(path, text);
    pw_jobckpt_t *r = calloc(1, sizeof *r);
    const int rc = pw_jobckpt_read(g_dir, 7, r, NULL, 0);
    if (rc == 0)
        assert_true(r->nservers == 2 && r->nranks == 3 && r->servers[1] == 12);
    free(r);
    return rc;
}

/* The manifest of step 7 with `lines` after its step line: read's code. */
static int read_numbers(const char *lines) {
    char sdir[400], path[450], text[1024];
    snprintf(sdir, sizeof sdir, "%s/step-%020d", g_dir, 7);
    assert_int_equal(pc_fs_mkdirs(sdir), 0);
    snprintf(path, sizeof path, "%s/manifest", sdir);
    snprintf(text, sizeof text, "emberps-job-checkpoint 1\nstep 7\n%s", lines);
    write_text(path, text);
    pw_jobckpt_t *r = calloc(1, sizeof *r);
    const int rc = pw_jobckpt_read(g_dir, 7, r, NULL, 0);
    free(r);
    return rc;
}

static void test_manifests(void **state) {
    (void)state;
    /* as written before server directories */
    assert_int_equal(read_manifest(""), 0);
    assert_int_equal(read_manifest("server-dir 1 /a b/c\nserver-dir 0 /d\n"), 0);
    assert_int_equal(read_manifest("server-dir 2 /a\n"), PC_ECORRUPT); /* index */
    assert_int_equal(read_manifest("server-dir 0 /a\nserver-dir 0 /b\n"), PC_ECORRUPT);
    assert_int_equal(read_manifest("server-dir 0 \n"), PC_ECORRUPT); /* no path */
    assert_int_equal(read_manifest("server-dir 0\n"), PC_ECORRUPT);
    assert_int_equal(read_manifest("server-dir x /a\n"), PC_ECORRUPT);
    assert_int_equal(read_manifest("server-dir 0 /a"), PC_ECORRUPT); /* cut short */
    assert_int_equal(read_manifest("colour blue\n"), PC_ECORRUPT);
    assert_int_equal(read_numbers("servers 11 0\npositions 5 6 7\n"), PC_ECORRUPT); /* id 0 */
    assert_int_equal(read_numbers("servers 11 -1\npositions 5 6 7\n"), PC_ECORRUPT);
    assert_int_equal(read_numbers("servers 11 12\npositions 5 +6 7\n"), PC_ECORRUPT);
    assert_int_equal(read_numbers("servers 11 12\npositions 5 99999999999999999999 7\n"),
                     PC_ECORRUPT);
    assert_int_equal(read_numbers("servers 11 12\npositions 5 6 7\n"), 0);
    assert_int_equal(read_manifest("server-dir 0 /a\nrun j/run/0\nmap version=1\n"), 0);
    assert_int_equal(read_manifest("run j/run/0\nrun j/run/1\n"), PC_ECORRUPT); /* twice */
    assert_int_equal(read_manifest("run \n"), PC_ECORRUPT);                     /* no name */
    assert_int_equal(read_manifest("map version=1\nrun j/run/0\n"),
                     PC_ECORRUPT); /* after the map */
    /* version 2 is sealed (pc_fs_seal): without its seal, or with a digit flipped under it,
     * refused; sealed, read */
    char sdir[400], mpath[450], text[1024];
    snprintf(sdir, sizeof sdir, "%s/step-%020d", g_dir, 7);
    snprintf(mpath, sizeof mpath, "%s/manifest", sdir);
    size_t len = (size_t)snprintf(text, sizeof text,
                                  "emberps-job-checkpoint 2\nstep 7\nservers 11 12\npositions 5\n");
    write_text(mpath, text);
    pw_jobckpt_t *r = calloc(1, sizeof *r);
    assert_int_equal(pw_jobckpt_read(g_dir, 7, r, NULL, 0), PC_ECORRUPT);
    len = pc_fs_seal(text, len, sizeof text);
    write_text(mpath, text);
    assert_int_equal(pw_jobckpt_read(g_dir, 7, r, NULL, 0), 0);
    assert_true(r->nservers == 2 && r->servers[1] == 12);
    strstr(text, "12")[1] = '3'; /* server 1's checkpoint 13: another cut */
    write_text(mpath, text);
    assert_int_equal(pw_jobckpt_read(g_dir, 7, r, NULL, 0), PC_ECORRUPT);
    /* LATEST names a step that is not there */
    char path[400];
    snprintf(path, sizeof path, "%s/LATEST", g_dir);
    write_text(path, "999\n");
    assert_int_equal(pw_jobckpt_read_latest(g_dir, r, NULL, 0), PC_ECORRUPT);
    assert_int_equal(pw_jobckpt_read_latest("/nonexistent", r, NULL, 0), PC_ENOTFOUND);
    free(r);
}

static void test_dir_arena(void **state) {
    (void)state;
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    char big[PW_JOBCKPT_DIR_MAX + 1];
    memset(big, 'a', sizeof big);
    big[0] = '/';
    big[PW_JOBCKPT_DIR_MAX] = '\0';
    assert_int_equal(pw_jobckpt_server_dir_set(ck, 0, big), PC_EINVAL); /* 4096 bytes */
    big[PW_JOBCKPT_DIR_MAX - 1] = '\0';
    assert_int_equal(pw_jobckpt_server_dir_set(ck, 0, big), 0); /* 4095: the longest */
    assert_int_equal(pw_jobckpt_server_dir_set(ck, 1, "/a\nb"), PC_EINVAL);
    assert_int_equal(pw_jobckpt_server_dir_set(ck, PW_JOBCKPT_MAX_SERVERS, "/a"), PC_EINVAL);
    size_t i = 1;
    int rc = 0;
    while (i < PW_JOBCKPT_MAX_SERVERS && !(rc = pw_jobckpt_server_dir_set(ck, i, big)))
        i++;
    assert_int_equal(rc, PC_ETOOBIG);
    assert_true(i == PW_JOBCKPT_DIRS_BYTES / PW_JOBCKPT_DIR_MAX - 1); /* offset 0 is none */
    assert_string_equal(pw_jobckpt_server_dir(ck, i - 1), big);
    assert_string_equal(pw_jobckpt_server_dir(ck, i), "");
    assert_int_equal(pw_jobckpt_server_dir_set(ck, 0, ""), 0);
    assert_string_equal(pw_jobckpt_server_dir(ck, 0), "");
    free(ck);
}

/* Server lists with an empty entry are refused before any call (a restore once gave each server
 * the next one's id after a skipped entry): nothing listens on these ports, so a call would
 * answer PC_EUNAVAIL. */
static void test_server_lists(void **state) {
    (void)state;
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    const char *bad[] = {"127.0.0.1:1,,127.0.0.1:2", "127.0.0.1:1,", ",127.0.0.1:1", ","};
    ck->nservers = 3;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(pw_jobckpt_servers(bad[i], NULL, 200, ck), PC_EINVAL);
        assert_int_equal(pw_jobckpt_restore_servers(bad[i], NULL, 200, 0, ck), PC_EINVAL);
    }
    assert_int_equal(pw_jobckpt_restore_servers("127.0.0.1:1,127.0.0.1:2", NULL, 200, 0, ck),
                     PC_EINVAL); /* 2 servers, a checkpoint of 3 */
    assert_int_equal(pw_jobckpt_servers("", NULL, 200, ck), PC_EINVAL);
    free(ck);
}

/* The latest checkpoint's directory moved aside by pc_fs_replace_dir's fallback and the crash
 * before its second rename (step-S.tmp.old and step-S.tmp, no step-S): read_latest puts the old
 * copy back and reads it (resume failed with PC_ECORRUPT on every try); the next write clears
 * the leftovers. */
static void test_latest_after_fallback_crash(void **state) {
    (void)state;
    const float st[5] = {1, 2, 3, 4, 5};
    float got[5] = {0};
    pw_jobckpt_t *ck = sample_ck(40, false), *r = calloc(1, sizeof *r);
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, NULL, NULL, 2), 0);
    char fin[512], old[520], tmp[520];
    snprintf(fin, sizeof fin, "%s/step-%020d", g_dir, 40);
    snprintf(old, sizeof old, "%s.tmp.old", fin);
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    assert_int_equal(rename(fin, old), 0);
    assert_int_equal(mkdir(tmp, 0755), 0);
    assert_int_equal(pw_jobckpt_read_latest(g_dir, r, got, 5), 0);
    assert_true(r->step == 40);
    assert_memory_equal(got, st, sizeof st);
    ck->step = 80;
    assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, NULL, NULL, 2), 0);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(access(old, F_OK), -1);
    free(ck);
    free(r);
}

/* A step written whose LATEST write failed (LATEST still names the one before): a rollback to
 * LATEST's step removes it, and keeps every older step. */
static void test_abandon_after(void **state) {
    (void)state;
    const float st[5] = {1, 2, 3, 4, 5};
    pw_jobckpt_t *ck = sample_ck(100, false);
    for (uint64_t s = 100; s <= 300; s += 100) {
        ck->step = s;
        assert_int_equal(pw_jobckpt_write(g_dir, ck, st, 5, NULL, NULL, 3), 0);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/LATEST", g_dir);
    FILE *f = fopen(path, "w");
    fputs("200\n", f);
    fclose(f);
    pw_jobckpt_abandon_after(g_dir, 200);
    for (int s = 100; s <= 300; s += 100) {
        snprintf(path, sizeof path, "%s/step-%020d", g_dir, s);
        assert_int_equal(access(path, F_OK), s <= 200 ? 0 : -1);
    }
    free(ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_version_roundtrip),
                                       cmocka_unit_test(test_manifests),
                                       cmocka_unit_test(test_dir_arena),
                                       cmocka_unit_test(test_server_lists),
                                       cmocka_unit_test(test_latest_after_fallback_crash),
                                       cmocka_unit_test(test_abandon_after)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
