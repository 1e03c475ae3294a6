/* Crash safety of checkpoints: a child process restores the newest checkpoint, then applies
 * rounds of updates to two tables, one in RAM and one cold (RAM budget 300 rows, the rest in its
 * RocksDB tier), and writes a checkpoint after each (full every third), until the parent
 * kills it with SIGKILL at a random moment. After every kill the parent restores the newest
 * complete checkpoint in its own process and checks it bit for bit against a replay of exactly
 * the rounds its update version says it holds. The same directory is used throughout, so later
 * children continue chains that earlier ones left, including half-written checkpoints.
 *
 * Children are exec'ed afresh (this binary with --child): the parent runs RocksDB, whose
 * background threads live on, and a forked copy of a threaded process must not start threads.
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
#include "ps_tier.h"

static const char *SPEC = "name=crash,dim=16,optimizer=adam,shards=4";
static const char *SPEC_COLD = "name=cold,dim=16,optimizer=adam,shards=4,capacity_rows=300,"
                               "cold=true";

static ps_table_t *table_of(ps_catalog_t *cat, const char *name) {
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, name, &t), 0);
    ps_catalog_release(cat, t);
    return t;
}

/* A process's view of the store: its own tier (live directory), catalog and checkpointer. */
typedef struct proc {
    ps_tier_t *tier;
    ps_catalog_t *cat;
    ps_ckpt_t *ck;
} proc_t;

static int proc_open(proc_t *p, const char *dir, const char *live) {
    ps_tier_opts_t to = {.dir = live,
                         .cache_bytes = 8 << 20,
                         .write_buffer_bytes = 1 << 20,
                         .min_free_bytes = 1 << 20};
    ps_ckpt_opts_t o = {.dir = dir, .keep = 3, .full_every = 3};
    if (ps_tier_open(&to, &p->tier) || ps_catalog_create(&p->cat))
        return -1;
    ps_tier_bind_catalog(p->tier, p->cat);
    o.tier = p->tier;
    return ps_ckpt_create(p->cat, &o, &p->ck);
}

static void proc_close(proc_t *p) {
    ps_ckpt_destroy(p->ck);
    ps_catalog_destroy(p->cat);
    ps_tier_close(p->tier);
}

static int add_spec(ps_catalog_t *cat, const char *spec) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    return ps_table_config_parse(&c, spec, NULL, 0) || ps_catalog_add(cat, &c);
}

/* The child: runs until killed (bounded by 20 s and 5000 rounds). */
static void child_main(const char *dir, const char *live) {
    pc_log_set_level(PC_LOG_ERROR);
    proc_t p;
    if (proc_open(&p, dir, live))
        _exit(2);
    if (ps_ckpt_restore(p.ck, 0, NULL) == PC_ENOTFOUND &&
        (add_spec(p.cat, SPEC) || add_spec(p.cat, SPEC_COLD)))
        _exit(3);
    ps_table_t *t = table_of(p.cat, "crash"), *tc = table_of(p.cat, "cold");
    time_t start = time(NULL);
    for (uint64_t k = ps_table_version(t) + 1; k < 5000 && time(NULL) - start < 20; k++) {
        tc_round(t, (int)k);
        tc_round(tc, (int)k);
        if (ps_ckpt_write(p.ck, NULL))
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

static ps_table_t *replay(const char *spec, uint64_t rounds) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    assert_int_equal(ps_table_config_parse(&c, spec, NULL, 0), 0);
    c.cold = false; /* the reference holds everything in RAM */
    c.capacity_rows = 0;
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
    char dir[256], live[300], plive[300];
    tc_tmpdir(dir, sizeof dir, "crash");
    snprintf(live, sizeof live, "%s-live", dir);    /* the children's tier */
    snprintf(plive, sizeof plive, "%s-plive", dir); /* this process's */
    uint64_t rng = (uint64_t)time(NULL);
    print_message("seed %llu, %d kills\n", (unsigned long long)rng, iters);
    uint64_t last_version = 0;
    int restored_any = 0, mid_write = 0;
    for (int it = 0; it < iters; it++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            execl("/proc/self/exe", "test_ckpt_crash", "--child", dir, live, (char *)NULL);
            _exit(5);
        }
        struct timespec ts = {0, (long)(5 + tu_rand(&rng) % 300) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 0));
        mid_write += has_tmp(dir);

        /* The newest complete checkpoint restores intact, in this (another) process. */
        proc_t p;
        assert_int_equal(proc_open(&p, dir, plive), 0);
        uint64_t id = 0;
        int rc = ps_ckpt_restore(p.ck, 0, &id);
        if (rc == PC_ENOTFOUND) { /* killed before the very first checkpoint */
            assert_false(restored_any);
        } else {
            assert_int_equal(rc, 0);
            restored_any = 1;
            ps_table_t *t = table_of(p.cat, "crash"), *tc = table_of(p.cat, "cold");
            uint64_t v = ps_table_version(t);
            assert_true(v >= last_version); /* never an older state than before */
            assert_int_equal(ps_table_version(tc), v);
            last_version = v;
            ps_table_t *ref = replay(SPEC, v);
            tc_assert_equal(t, ref);
            ps_table_destroy(ref);
            /* The cold table: every key of its pool reads the same as in the reference. */
            ref = replay(SPEC_COLD, v);
            const size_t pool = 2000 + (size_t)v * 100;
            uint64_t *keys = malloc(pool * sizeof *keys);
            float *x = malloc(pool * 16 * sizeof(float)), *y = malloc(pool * 16 * sizeof(float));
            for (size_t i = 0; i < pool; i++)
                keys[i] = (uint64_t)i * 0x9E3779B97F4A7C15ULL;
            assert_int_equal(ps_table_lookup(tc, keys, pool, x, pool * 16, NULL), 0);
            assert_int_equal(ps_table_lookup(ref, keys, pool, y, pool * 16, NULL), 0);
            assert_memory_equal(x, y, pool * 16 * sizeof(float));
            assert_true(ps_table_count(tc) <= 300 + 8);
            free(keys);
            free(x);
            free(y);
            ps_table_destroy(ref);
        }
        proc_close(&p);
    }
    print_message("after %d kills (%d in the middle of a checkpoint): newest checkpoint holds "
                  "%llu rounds, all restores exact\n",
                  iters, mid_write, (unsigned long long)last_version);
    assert_true(restored_any);
    assert_true(mid_write > 0); /* some kills did land inside a checkpoint write */
    tc_rmdir(dir);
    tc_rmdir(live);
    tc_rmdir(plive);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        child_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_during_checkpoints)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
