/* test_lifecycle.c: one set of table defaults, and jobs that claim their tables (issue 20, items
 * 1 and 2), through real processes: a ps-server started as the README shows, ps-worker jobs
 * against it, psctl.
 *
 * - A server table made from "name=emb,dim=16" (every other setting its default) trains as well
 *   as ps-worker --local's table: same data, same seed, the same AUC (one set of defaults).
 * - A worker whose --table settings or model dim differ from the servers' table stops at start
 *   (exit status 2 and 1) and says which setting differs.
 * - A second job on a table another job trained is refused with a message naming that job;
 *   --fresh empties the table (and then reproduces the first job exactly), --warm-start trains
 *   the rows further, psctl reset empties it and clears the owner, and the owner survives a
 *   restart of the server from its checkpoint.
 *
 * argv: ps-server, ps-worker, psctl.
 */
#include "proc_util.h"
#include "pw_datagen.h"
#include "table_check.h"

#include <math.h>
#include <stdlib.h>

static const char *g_worker, *g_psctl;
static char g_dir[256], g_train[300], g_test[300], g_err[300];

/* Run ps-worker with args (NULL-terminated); its JSON summary into *auc (NAN when absent), its
 * stderr into g_err. Returns its exit status. */
static int run_worker(const char *const *args, double *auc) {
    char out[320], tr[320], te[320];
    snprintf(out, sizeof out, "%s/out.json", g_dir);
    snprintf(tr, sizeof tr, "--train=%s", g_train);
    snprintf(te, sizeof te, "--test=%s", g_test);
    const char *argv[32] = {g_worker, "--progress-every=0", "--json", "--timeout-ms=20000", tr, te};
    int a = 6;
    for (int i = 0; args[i] && a < 31; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out, "w", stdout) || !freopen(g_err, "w", stderr))
            _exit(126);
        execv(g_worker, (char *const *)argv);
        _exit(127);
    }
    int rc = pu_reap(pid, 120);
    char buf[4096] = "";
    FILE *f = fopen(out, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
        fclose(f);
    }
    const char *p = strstr(buf, "\"auc\":");
    *auc = p ? strtod(p + 6, NULL) : NAN;
    return rc;
}

/* True when the last worker's stderr contains s. */
static bool err_has(const char *s) {
    char buf[8192] = "";
    FILE *f = fopen(g_err, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
        fclose(f);
    }
    if (!strstr(buf, s))
        print_message("stderr of the worker, without '%s':\n%s\n", s, buf);
    return strstr(buf, s) != NULL;
}

typedef struct server {
    pid_t pid;
    int port, grpc;
    char srv[64], ckpt[320];
} server_t;

static void server_start(server_t *s) {
    const char *extra[] = {"--tables=name=emb,dim=16,seed=1", s->ckpt, NULL};
    s->pid = pu_spawn(s->port, g_dir, extra, &s->grpc);
}

/* psctl stats emb: the value of `key` ("rows: 12") as text into out. */
static void stat_of(const server_t *s, const char *key, char *out, size_t cap) {
    char buf[4096], pat[64];
    const char *args[] = {"stats", "emb", NULL};
    assert_int_equal(pu_psctl(g_psctl, s->grpc, buf, sizeof buf, args), 0);
    snprintf(pat, sizeof pat, "\n%s: ", key);
    const char *p = strstr(buf, pat);
    assert_non_null(p);
    p += strlen(pat);
    size_t n = strcspn(p, "\n");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
}

static void test_defaults_and_lifecycle(void **state) {
    (void)state;
    server_t s = {.port = pu_free_port()};
    snprintf(s.srv, sizeof s.srv, "--servers=127.0.0.1:%d", s.port);
    snprintf(s.ckpt, sizeof s.ckpt, "--ckpt-dir=%s/ckpt", g_dir);
    server_start(&s);
    double auc_local, auc1, auc;

    /* one set of defaults: the README's server table trains like --local's */
    const char *local[] = {"--local", NULL};
    assert_int_equal(run_worker(local, &auc_local), 0);
    const char *plain[] = {s.srv, NULL};
    assert_int_equal(run_worker(plain, &auc1), 0);
    print_message("AUC: --local %.6f, servers %.6f\n", auc_local, auc1);
    assert_true(auc_local > 0.6 && fabs(auc_local - auc1) < 1e-4);

    /* settings that differ from the servers' table: refused at start, naming the setting */
    const char *sgd[] = {s.srv, "--table=optimizer=sgd,lr=0.05", "--fresh", NULL};
    assert_int_equal(run_worker(sgd, &auc), 2); /* bad settings */
    assert_true(err_has("optimizer=sgd (have: adagrad)"));
    const char *dim8[] = {s.srv, "--dim=8", "--bottom=64,8", "--fresh", NULL};
    assert_int_equal(run_worker(dim8, &auc), 1);
    assert_true(err_has("has dim 16; this model needs rows of 8 floats"));
    const char *same[] = {s.srv, "--table=optimizer=adagrad,lr=5e-2,adagrad-init=1e-6", NULL};
    assert_int_equal(run_worker(same, &auc), 1); /* matches, but: another job's rows (below) */

    /* a second job on the first one's rows: refused, naming the job */
    assert_int_equal(run_worker(plain, &auc), 1);
    assert_true(err_has("holds rows of job 'emberps@"));
    assert_true(err_has("--warm-start"));
    char owner1[160], owner[160], rows[32];
    stat_of(&s, "owner", owner1, sizeof owner1);
    assert_true(strncmp(owner1, "emberps@", 8) == 0);

    /* --fresh: an empty table, then exactly the first job's run */
    const char *fresh[] = {s.srv, "--fresh", NULL};
    assert_int_equal(run_worker(fresh, &auc), 0);
    print_message("AUC: first job %.6f, --fresh %.6f\n", auc1, auc);
    assert_true(fabs(auc - auc1) < 1e-9);
    stat_of(&s, "owner", owner, sizeof owner);
    assert_true(strcmp(owner, owner1) != 0);

    /* --warm-start: the rows trained further (a second epoch's worth) */
    const char *warm[] = {s.srv, "--warm-start", NULL};
    assert_int_equal(run_worker(warm, &auc), 0);
    print_message("AUC after --warm-start %.6f\n", auc);
    assert_true(auc > 0.6);

    /* the owner is kept in the checkpoint written at exit */
    stat_of(&s, "owner", owner1, sizeof owner1);
    pu_stop(s.pid);
    server_start(&s);
    stat_of(&s, "owner", owner, sizeof owner);
    assert_string_equal(owner, owner1);
    assert_int_equal(run_worker(plain, &auc), 1);
    assert_true(err_has("holds rows of job"));

    /* psctl reset: no rows, no owner; the next job claims it */
    char buf[1024];
    const char *reset[] = {"reset", "emb", NULL};
    assert_int_equal(pu_psctl(g_psctl, s.grpc, buf, sizeof buf, reset), 0);
    stat_of(&s, "rows", rows, sizeof rows);
    stat_of(&s, "owner", owner, sizeof owner);
    assert_string_equal(rows, "0");
    assert_string_equal(owner, "(none)");
    assert_int_equal(run_worker(plain, &auc), 0);
    assert_true(fabs(auc - auc1) < 1e-9);
    pu_stop(s.pid);
}

static int setup(void **state) {
    (void)state;
    tc_tmpdir(g_dir, sizeof g_dir, "lifecycle");
    snprintf(g_train, sizeof g_train, "%s/train.tsv", g_dir);
    snprintf(g_test, sizeof g_test, "%s/test.tsv", g_dir);
    snprintf(g_err, sizeof g_err, "%s/stderr.txt", g_dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = 20000;
    o.test_rows = 4000;
    o.vocab_max = 5000;
    FILE *a = fopen(g_train, "w"), *t = fopen(g_test, "w");
    assert_int_equal(pw_datagen_run(&o, a, t, NULL), 0);
    fclose(a);
    fclose(t);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    pu_kill_all();
    tc_rmdir(g_dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s PS_SERVER PS_WORKER PSCTL\n", argv[0]);
        return 2;
    }
    pu_bin = argv[1];
    g_worker = argv[2];
    g_psctl = argv[3];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_defaults_and_lifecycle)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
