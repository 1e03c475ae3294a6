/* Crash safety of checkpoints: a child process restores the newest checkpoint, then applies
 * rounds of updates and writes a checkpoint after each (full every third), until the parent
 * kills it with SIGKILL at a random moment. After every kill the parent restores the newest
 * complete checkpoint in its own process and checks it bit for bit against a replay of exactly
 * the rounds its update version says it holds. The same directory is used throughout, so later
 * children continue chains that earlier ones left, including half-written checkpoints.
 *
 * EMBER_FAULT_ITERS sets the number of kills (default 20; the long mode uses more). */
#include "table_check.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "pc_error.h"
#include "pc_log.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"

static const char *SPEC = "name=crash,dim=16,optimizer=adam,shards=4";

static ps_table_t *table_of(ps_catalog_t *cat) {
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "crash", &t), 0);
    ps_catalog_release(cat, t);
    return t;
}

/* The child: runs until killed (bounded by 20 s and 5000 rounds). */
static void child_main(const char *dir) {
    pc_log_set_level(PC_LOG_ERROR);
    ps_catalog_t *cat;
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = dir, .keep = 3, .full_every = 3};
    if (ps_catalog_create(&cat) || ps_ckpt_create(cat, &o, &ck))
        _exit(2);
    if (ps_ckpt_restore(ck, 0, NULL) == PC_ENOTFOUND) {
        ps_table_config_t c;
        ps_table_config_defaults(&c);
        if (ps_table_config_parse(&c, SPEC, NULL, 0) || ps_catalog_add(cat, &c))
            _exit(3);
    }
    ps_table_t *t = table_of(cat);
    time_t start = time(NULL);
    for (uint64_t k = ps_table_version(t) + 1; k < 5000 && time(NULL) - start < 20; k++) {
        tc_round(t, (int)k);
        if (ps_ckpt_write(ck, NULL))
            _exit(4);
    }
    _exit(0);
}

/* Whether the kill left an unpublished checkpoint behind (it hit one mid-write). */
static int has_tmp(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d)))
        found |= strstr(e->d_name, ".tmp") != NULL;
    if (d)
        closedir(d);
    return found;
}

static ps_table_t *replay(uint64_t rounds) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, SPEC, NULL, 0), 0);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&c, &t), 0);
    for (uint64_t k = 1; k <= rounds; k++) {
        tc_round(t, (int)k);
        assert_int_equal(ps_table_advance_clock(t, ps_table_clock(t) + 1), 0);
    }
    return t;
}

static void test_kill_during_checkpoints(void **state) {
    (void)state;
    int iters = getenv("EMBER_FAULT_ITERS") ? atoi(getenv("EMBER_FAULT_ITERS")) : 20;
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "crash");
    uint64_t rng = (uint64_t)time(NULL);
    print_message("seed %llu, %d kills\n", (unsigned long long)rng, iters);
    uint64_t last_version = 0;
    int restored_any = 0, mid_write = 0;
    for (int it = 0; it < iters; it++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child_main(dir);
        struct timespec ts = {0, (long)(2 + tu_rand(&rng) % 120) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 0));
        mid_write += has_tmp(dir);

        /* The newest complete checkpoint restores intact, in this (another) process. */
        ps_catalog_t *cat;
        ps_ckpt_t *ck;
        ps_ckpt_opts_t o = {.dir = dir, .keep = 3, .full_every = 3};
        assert_int_equal(ps_catalog_create(&cat), 0);
        assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
        uint64_t id = 0;
        int rc = ps_ckpt_restore(ck, 0, &id);
        if (rc == PC_ENOTFOUND) { /* killed before the very first checkpoint */
            assert_false(restored_any);
        } else {
            assert_int_equal(rc, 0);
            restored_any = 1;
            ps_table_t *t = table_of(cat);
            uint64_t v = ps_table_version(t);
            assert_true(v >= last_version); /* never an older state than before */
            last_version = v;
            ps_table_t *ref = replay(v);
            tc_assert_equal(t, ref);
            ps_table_destroy(ref);
        }
        ps_ckpt_destroy(ck);
        ps_catalog_destroy(cat);
    }
    print_message("after %d kills (%d in the middle of a checkpoint): newest checkpoint holds "
                  "%llu rounds, all restores exact\n",
                  iters, mid_write, (unsigned long long)last_version);
    assert_true(restored_any);
    assert_true(mid_write > 0); /* some kills did land inside a checkpoint write */
    tc_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_during_checkpoints)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
