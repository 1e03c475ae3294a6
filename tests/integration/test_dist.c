/* Distributed training on loopback: 2 ps-servers (one the coordinator) and ps-worker processes.
 *  - sync equivalence: 2 workers with batch b train the same model as 1 worker with batch 2b
 *    over the interleaved data (server SGD: linear in the gradient), dense weights and test
 *    metrics equal to float rounding;
 *  - workers with unequal data both finish (the one that ran out joins with no gradient);
 *  - errors are clear exits: no coordinator for world 2 (2), servers unreachable (1), a table of
 *    another dim on the servers (1), a peer that never comes (1, within the timeout);
 *  - worker failures (kill -9): a worker restarted mid-training rejoins and the job ends within
 *    0.005 AUC of an uninterrupted run, its data read once from where it was; survivors that
 *    wait (--on-worker-loss=wait) wait; with shrink they go on alone after the rejoin timeout and
 *    take the worker back when it returns; a worker that never returns does not stop them;
 *  - mid-run evaluations in a group (--eval-every) longer than the collectives' timeout: every
 *    member waits for rank 0's at the same round, no re-formation, the model unchanged;
 *  - a worker that hangs (SIGSTOP): its membership lease ends (psctl workers shows it gone), the
 *    survivor's collective times out and it goes on alone; resumed, the worker is taken back;
 *  - coordinated checkpoints are model versions (card, model, each server's checkpoint
 *    directory); dense models published for serving carry watermarks that reach the servers'
 *    final heads;
 *  - the recovery jobs push rank by rank (--push-order=rank), so a job's model depends on its
 *    data only: two uninterrupted runs give the same AUC to the last bit (2 workers, and 3 of
 *    which two read the same share, so they push the same keys every step), and so do a job rolled
 *    back to a coordinated checkpoint (whole job, or a server killed) and a primary killed with
 *    replicas when no push was cut short; a third server added and removed while two workers
 *    train leaves the whole table, bit for bit, as a cluster never resharded. */
#include "proc_util.h"
#include "cluster_check.h"
#include "table_check.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "emberps/psclient.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_log.h"
#include "pw_coord_client.h"
#include "pw_datagen.h"
#include "pw_jobckpt.h"
#include "pw_dlrm.h"
#include "pw_model_io.h"

static const char *g_worker;
static char g_psctl[600]; /* next to ps-server */
static char g_dir[256];
enum { B = 256, ROWS = 40 * 2 * B };
#define TABLE "name=emb,dim=16,optimizer=sgd,lr=20,init=uniform,init_scale=0.05,seed=3"
/* test_sync_equivalence's: a smaller step, which does not amplify rounding (see there) */
#define SYNC_TABLE "name=emb,dim=16,optimizer=sgd,lr=5,init=uniform,init_scale=0.05,seed=3"

typedef struct cluster {
    pid_t s0, s1;
    int p0, p1, grpc0, grpc1;
    char map[256], maparg[300], tables[256], ckpt0[320], ckpt1[320];
    char grpc1arg[32]; /* "--grpc-port=N": server 1 keeps its gRPC port across restarts */
} cluster_t;

static const char *g_server_extra; /* one more flag for both servers (NULL: none) */

/* Both servers have checkpoint directories of their own; server 1 also checkpoints every
 * second, so that it can be killed and started again (start_server1). restore: --restore-id. */
static void start_server0(cluster_t *c, uint64_t restore) {
    char rs[48];
    snprintf(rs, sizeof rs, "--restore-id=%llu", (unsigned long long)restore);
    const char *e0[] = {c->maparg, c->tables, "--coordinator", c->ckpt0, rs, g_server_extra, NULL};
    c->s0 = pu_spawn(c->p0, g_dir, e0, &c->grpc0);
}

static void start_server1(cluster_t *c, uint64_t restore) {
    char rs[48];
    snprintf(rs, sizeof rs, "--restore-id=%llu", (unsigned long long)restore);
    const char *e1[10] = {c->maparg,         c->tables, c->ckpt1, "--ckpt-interval-s=1",
                          "--ckpt-keep=100", rs};
    int n = 6;
    if (c->grpc1arg[0])
        e1[n++] = c->grpc1arg;
    e1[n++] = g_server_extra; /* NULL: the end */
    e1[n] = NULL;
    c->s1 = pu_spawn(c->p1, g_dir, e1, &c->grpc1);
}

/* fixed_grpc1: server 1's gRPC port stays the same when it is started again. */
static void cluster_start(cluster_t *c, const char *table, bool fixed_grpc1) {
    c->grpc1arg[0] = '\0';
    if (fixed_grpc1)
        snprintf(c->grpc1arg, sizeof c->grpc1arg, "--grpc-port=%d", pu_free_port());
    cc_two_servers(&c->p0, &c->p1, c->map, sizeof c->map, c->maparg, sizeof c->maparg);
    snprintf(c->tables, sizeof c->tables, "--tables=%s", table);
    /* directories of this cluster only: a port a later test is given again must not bring back
     * an earlier cluster's exit checkpoint (its table, claimed by that test's job) */
    static int clusters;
    clusters++;
    snprintf(c->ckpt0, sizeof c->ckpt0, "--ckpt-dir=%s/ckpt-c%d-0", g_dir, clusters);
    snprintf(c->ckpt1, sizeof c->ckpt1, "--ckpt-dir=%s/ckpt-c%d-1", g_dir, clusters);
    start_server0(c, 0);
    start_server1(c, 0);
}

static void cluster_up(cluster_t *c, const char *table) {
    cluster_start(c, table, false);
}

static void cluster_down(cluster_t *c) {
    pu_stop(c->s0);
    pu_stop(c->s1);
}

/* Start ps-worker with args (NULL-terminated); stdout to out_path, stderr to err_path (NULL:
 * the test's). */
static pid_t worker_to(const char *const *args, const char *out_path, const char *err_path) {
    const char *argv[40] = {g_worker, "--log-level=error", "--progress-every=0", "--json",
                            "--timeout-ms=20000"};
    int a = 5;
    for (int i = 0; args[i] && a < 39; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout) || (err_path && !freopen(err_path, "w", stderr)))
            _exit(126);
        execv(g_worker, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static pid_t worker(const char *const *args, const char *out_path) {
    return worker_to(args, out_path, NULL);
}

/* A log file's lines into the test's output (nothing when unreadable). */
static void print_file(const char *path) {
    FILE *f = fopen(path, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        print_message("  %s", line);
    if (f)
        fclose(f);
}

/* The worker's JSON summary at path (empty when unreadable). */
static void json_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f) {
        size_t n = fread(buf, 1, cap - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
}

static double json_num(const char *path, const char *key) {
    char buf[4096], pat[64];
    json_text(path, buf, sizeof buf);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(buf, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static char g_all[300], g_p0[300], g_p1[300], g_test[300];
static pw_coord_t *coord_of(const cluster_t *c);
static void job_key(pw_coord_t *co, const char *job, const char *key, char *out, size_t cap);
static bool running(pid_t pid);

/* Generate o's rows into all and test, and split all into two worker shares: blocks of `block`
 * lines alternate between p0 and p1, so batch t of 2 x block lines of all is block t of p0
 * followed by block t of p1. */
static void make_shares(const pw_datagen_opts_t *o, const char *all, const char *test,
                        const char *p0, const char *p1, int block) {
    FILE *a = fopen(all, "w"), *t = fopen(test, "w");
    assert_int_equal(pw_datagen_run(o, a, t, NULL), 0);
    fclose(a);
    fclose(t);
    a = fopen(all, "r");
    FILE *f0 = fopen(p0, "w"), *f1 = fopen(p1, "w");
    char line[1024];
    for (int i = 0; fgets(line, sizeof line, a); i++)
        fputs(line, (i / block) % 2 ? f1 : f0);
    fclose(a);
    fclose(f0);
    fclose(f1);
}

static int setup(void **state) {
    (void)state;
    tc_tmpdir(g_dir, sizeof g_dir, "dist");
    snprintf(g_all, sizeof g_all, "%s/all.tsv", g_dir);
    snprintf(g_p0, sizeof g_p0, "%s/p0.tsv", g_dir);
    snprintf(g_p1, sizeof g_p1, "%s/p1.tsv", g_dir);
    snprintf(g_test, sizeof g_test, "%s/test.tsv", g_dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = ROWS;
    o.test_rows = 10000;
    o.vocab_max = 5000;
    make_shares(&o, g_all, g_test, g_p0, g_p1, B);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    pu_kill_all();
    tc_rmdir(g_dir);
    return 0;
}

static void load_dense(const char *path, pw_dlrm_t **m) {
    pw_dlrm_config_t c = {.ndense = 13,
                          .nfields = 26,
                          .dim = 16,
                          .nbottom = 2,
                          .bottom = {64, 16},
                          .ntop = 3,
                          .top = {128, 64, 1},
                          .max_batch = 1,
                          .seed = 1};
    assert_int_equal(pw_dlrm_create(&c, pw_backend_cpu(), m), 0);
    int n;
    pw_linear_t *l = pw_dlrm_layers(*m, &n);
    assert_int_equal(pw_dense_load(path, l, n), 0);
}

static int ssp_check(const char *log0, const char *log1, int S, int min_starts);

/* The largest difference of a dense weight between the models saved at a and b (printed). */
static double dense_diff(const char *a, const char *b) {
    pw_dlrm_t *m1, *m2;
    load_dense(a, &m1);
    load_dense(b, &m2);
    int n;
    pw_linear_t *l1 = pw_dlrm_layers(m1, &n), *l2 = pw_dlrm_layers(m2, &n);
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < l1[i].in * l1[i].out; j++)
            worst = fmax(worst, fabs((double)l1[i].w[j] - l2[i].w[j]));
    print_message("largest dense weight difference %.3g\n", worst);
    pw_dlrm_destroy(m1);
    pw_dlrm_destroy(m2);
    return worst;
}

static void test_sync_equivalence(void **state) {
    (void)state;
    char srv[64], coord[64], d1[300], d2[300], o1[300], o2a[300], o2b[300], a1[320], a2[320];
    char batch1[32], batch2[32], log0[300], log1[300], slog0[320], slog1[320];
    snprintf(log0, sizeof log0, "%s/sync0.steps", g_dir);
    snprintf(log1, sizeof log1, "%s/sync1.steps", g_dir);
    snprintf(slog0, sizeof slog0, "--step-log=%s", log0);
    snprintf(slog1, sizeof slog1, "--step-log=%s", log1);
    unlink(log0);
    unlink(log1);
    snprintf(d1, sizeof d1, "%s/one.dense", g_dir);
    snprintf(d2, sizeof d2, "%s/two.dense", g_dir);
    snprintf(o1, sizeof o1, "%s/one.json", g_dir);
    snprintf(o2a, sizeof o2a, "%s/two0.json", g_dir);
    snprintf(o2b, sizeof o2b, "%s/two1.json", g_dir);
    snprintf(batch1, sizeof batch1, "--batch=%d", 2 * B);
    snprintf(batch2, sizeof batch2, "--batch=%d", B);
    char train_all[320], train_parts[640], test[320];
    snprintf(train_all, sizeof train_all, "--train=%s", g_all);
    snprintf(train_parts, sizeof train_parts, "--train=%s,%s", g_p0, g_p1);
    snprintf(test, sizeof test, "--test=%s", g_test);
    /* One worker, batch 2B. */
    cluster_t c;
    cluster_up(&c, SYNC_TABLE);
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    snprintf(a1, sizeof a1, "--save-dense=%s", d1);
    const char *w1[] = {srv, train_all, test, batch1, a1, NULL};
    assert_int_equal(pu_reap(worker(w1, o1), 120), 0);
    cluster_down(&c);
    /* Two workers, batch B each, on fresh servers. */
    cluster_up(&c, SYNC_TABLE);
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", c.grpc0);
    snprintf(a2, sizeof a2, "--save-dense=%s", d2);
    const char *w20[] = {srv,  coord,  "--world=2", "--rank=0", train_parts,
                         test, batch2, a2,          slog0,      NULL};
    const char *w21[] = {srv,  coord,  "--world=2", "--rank=1", train_parts,
                         test, batch2, slog1,       NULL};
    pid_t r0 = worker(w20, o2a), r1 = worker(w21, o2b);
    assert_int_equal(pu_reap(r0, 120), 0);
    assert_int_equal(pu_reap(r1, 120), 0);
    cluster_down(&c);
    const double auc1 = json_num(o1, "auc"), auc2 = json_num(o2a, "auc");
    const double ll1 = json_num(o1, "logloss"), ll2 = json_num(o2a, "logloss");
    print_message("1 worker x batch %d: AUC %.6f logloss %.6f; 2 workers x batch %d: AUC %.6f "
                  "logloss %.6f\n",
                  2 * B, auc1, ll1, B, auc2, ll2);
    assert_true(auc1 > 0.6);
    assert_true(json_num(o1, "steps") == ROWS / (2 * B) &&
                json_num(o2a, "steps") == ROWS / (2 * B));
    assert_true(json_num(o2b, "steps") == ROWS / (2 * B));
    /* What would explain a difference: a lost push or a rollback, or a step that began before
     * the other worker's previous step ended (its pushes acknowledged). */
    print_message("two workers: lost pushes %.0f + %.0f, rollbacks %.0f + %.0f\n",
                  json_num(o2a, "lost_pushes"), json_num(o2b, "lost_pushes"),
                  json_num(o2a, "rollbacks"), json_num(o2b, "rollbacks"));
    assert_true(json_num(o2a, "lost_pushes") == 0 && json_num(o2b, "lost_pushes") == 0);
    assert_true(json_num(o2a, "rollbacks") == 0 && json_num(o2b, "rollbacks") == 0);
    assert_int_equal(ssp_check(log0, log1, 0, 2 * ROWS / (2 * B)), 0);
    /* Not bitwise: a server applies the two workers' pushes of a key in arrival order, so the
     * rows differ by rounding (1e-7). At lr=20 that was amplified in about one run in ten: a
     * ReLU input within rounding of 0 takes the other side (the loss equal to 1e-7, that step's
     * gradients not), and the jump grew to an AUC 3e-4 and dense weights 0.038 apart, always the
     * same other result. At lr=5 (SYNC_TABLE) thirty runs stayed within 2e-6. A stale pull
     * (the pull gate removed) costs 6e-3 to 5e-2 in AUC. */
    assert_true(fabs(auc1 - auc2) < 1e-3 && fabs(ll1 - ll2) < 1e-3);
    assert_true(dense_diff(d1, d2) < 1e-3);
}

/* A member without data adds zeros to the dense sum and to the embeddings' pushes alike: rank 1
 * reads an empty file, so the group trains rank 0's data at half the rate of both halves of the
 * model (size 2), which is the lone worker's model at half of both learning rates (SGD on both
 * sides: the halvings are exact). Dividing the dense sum by the members that had a batch (1)
 * instead trained the dense layers at twice the embeddings' rate at a job's tail. */
static void test_idle_member_rate(void **state) {
    (void)state;
    char srv[64], coord[64], tr1[320], test[320], d1[300], d2[300];
    char a1[320], a2[320], o1[300], o2a[300], o2b[300];
    snprintf(tr1, sizeof tr1, "--train=%s", g_all);
    snprintf(test, sizeof test, "--test=%s", g_test);
    snprintf(d1, sizeof d1, "%s/idle1.dense", g_dir);
    snprintf(d2, sizeof d2, "%s/idle2.dense", g_dir);
    snprintf(a1, sizeof a1, "--save-dense=%s", d1);
    snprintf(a2, sizeof a2, "--save-dense=%s", d2);
    snprintf(o1, sizeof o1, "%s/idle1.json", g_dir);
    snprintf(o2a, sizeof o2a, "%s/idle2a.json", g_dir);
    snprintf(o2b, sizeof o2b, "%s/idle2b.json", g_dir);
    cluster_t c;
    cluster_up(&c, "name=emb,dim=16,optimizer=sgd,lr=2.5,init=uniform,init_scale=0.05,seed=3");
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    const char *w1[] = {srv, tr1, test, "--batch=512", "--dense-optimizer=sgd", "--dense-lr=0.5",
                        a1,  NULL};
    assert_int_equal(pu_reap(worker(w1, o1), 120), 0);
    cluster_down(&c);
    cluster_up(&c, SYNC_TABLE); /* lr=5 */
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", c.grpc0);
    const char *w20[] = {srv,
                         coord,
                         "--world=2",
                         "--rank=0",
                         tr1,
                         test,
                         "--batch=512",
                         "--dense-optimizer=sgd",
                         "--dense-lr=1",
                         a2,
                         NULL};
    const char *w21[] = {srv,
                         coord,
                         "--world=2",
                         "--rank=1",
                         tr1,
                         "--batch=512",
                         "--dense-optimizer=sgd",
                         "--dense-lr=1",
                         NULL};
    pid_t r0 = worker(w20, o2a), r1 = worker(w21, o2b);
    assert_int_equal(pu_reap(r0, 120), 0);
    assert_int_equal(pu_reap(r1, 120), 0);
    cluster_down(&c);
    const double auc1 = json_num(o1, "auc"), auc2 = json_num(o2a, "auc");
    print_message("lone worker at half the rates: AUC %.7f; rank 0 of 2 beside an idle rank 1: "
                  "AUC %.7f\n",
                  auc1, auc2);
    assert_true(json_num(o2a, "samples") == ROWS && json_num(o2b, "samples") == 0);
    assert_true(json_num(o1, "steps") == json_num(o2a, "steps"));
    assert_true(fabs(auc1 - auc2) < 1e-6);
    assert_true(dense_diff(d1, d2) < 1e-5);
}

static void test_unequal_data_and_errors(void **state) {
    (void)state;
    cluster_t c;
    cluster_up(&c, TABLE);
    char srv[64], coord[64], out0[300], out1[300], tr[640], unreach[64];
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", c.grpc0);
    snprintf(out0, sizeof out0, "%s/u0.json", g_dir);
    snprintf(out1, sizeof out1, "%s/u1.json", g_dir);
    /* Rank 0 gets all.tsv (2x the rows), rank 1 p1.tsv (files split by rank). Coordinated
     * checkpoints every 15 steps: rank 1's data ends after 20, so at step 30 it takes the
     * checkpoint from its empty rounds (it went on to the round's allreduce while rank 0 waited
     * at the checkpoint's barrier, and the group broke at every checkpoint after). */
    char ckd[300], grpcs[96], ckman[400];
    snprintf(tr, sizeof tr, "--train=%s,%s", g_all, g_p1);
    snprintf(ckd, sizeof ckd, "--ckpt-dir=%s/unequal-ckpt", g_dir);
    snprintf(grpcs, sizeof grpcs, "--server-grpc=127.0.0.1:%d,127.0.0.1:%d", c.grpc0, c.grpc1);
    const char *w0[] = {srv,           coord, "--world=2",       "--rank=0", tr,
                        "--batch=512", ckd,   "--ckpt-every=15", grpcs,      NULL};
    const char *w1[] = {srv,           coord, "--world=2",       "--rank=1", tr,
                        "--batch=512", ckd,   "--ckpt-every=15", grpcs,      NULL};
    pid_t r0 = worker(w0, out0), r1 = worker(w1, out1);
    assert_int_equal(pu_reap(r0, 120), 0);
    assert_int_equal(pu_reap(r1, 120), 0);
    assert_true(json_num(out0, "samples") == ROWS && json_num(out1, "samples") == ROWS / 2);
    assert_true(json_num(out0, "steps") == json_num(out1, "steps"));
    assert_true(json_num(out0, "rollbacks") == 0 && json_num(out0, "lost_pushes") == 0);
    snprintf(ckman, sizeof ckman, "%s/unequal-ckpt/step-%020d/manifest", g_dir, 30);
    assert_int_equal(access(ckman, F_OK), 0);
    /* world 2 without a coordinator: bad settings */
    const char *nc[] = {srv, "--world=2", tr, NULL};
    assert_int_equal(pu_reap(worker(nc, out0), 30), 2);
    /* a peer that never comes: exit 1 within the timeout */
    const char *lone[] = {
        srv, coord, "--world=2", "--rank=0", "--job=lonely", tr, "--timeout-ms=1000", NULL};
    const double t0 = pu_now();
    assert_int_equal(pu_reap(worker(lone, out0), 30), 1);
    assert_true(pu_now() - t0 < 20);
    /* two workers given one rank: the second is refused at once, naming the rank and the
     * holder; the first goes on (here: to its timeout, as rank 0 never comes) */
    const char *dup[] = {srv,         coord, "--world=2",         "--rank=1",
                         "--job=dup", tr,    "--timeout-ms=3000", NULL};
    char err1[300], log[8192], v[512];
    snprintf(err1, sizeof err1, "%s/dup1.err", g_dir);
    pw_coord_t *co = coord_of(&c);
    pid_t first = worker(dup, out0);
    for (double t1 = pu_now(); pu_now() - t1 < 20; usleep(20000)) {
        job_key(co, "dup", "live/1", v, sizeof v);
        if (v[0])
            break;
    }
    assert_true(v[0]);
    const double t2 = pu_now();
    assert_int_equal(pu_reap(worker_to(dup, out1, err1), 30), 1);
    const double refused = pu_now() - t2;
    json_text(err1, log, sizeof log);
    print_message("the second rank 1 exited 1 after %.2f s: %s", refused, log);
    assert_true(refused < 2.5); /* not the 3 s formation timeout */
    assert_non_null(strstr(log, "rank 1 is already held by a live worker"));
    assert_true(running(first));
    assert_int_equal(pu_reap(first, 30), 1);
    pw_coord_close(co);
    /* rank 1's share turns out bad (1 line in 10 malformed: over --max-error-rate at its
     * 1000th line): rank 1 stops at once, naming its file, while rank 0 trains on (it waited in
     * empty rounds until rank 0 ran out of data too, its share's rest never trained) */
    char bad[300], bad_tr[640], bad_err[300];
    snprintf(bad, sizeof bad, "%s/bad1.tsv", g_dir);
    snprintf(bad_err, sizeof bad_err, "%s/bad1.err", g_dir);
    FILE *in = fopen(g_p1, "r"), *o = fopen(bad, "w");
    assert_true(in && o);
    char line[4096];
    for (int i = 0; fgets(line, sizeof line, in); i++)
        fputs(i % 10 == 5 ? "not a sample\n" : line, o);
    fclose(in);
    assert_int_equal(fclose(o), 0);
    snprintf(bad_tr, sizeof bad_tr, "--train=%s,%s", g_all, bad);
    const char *b0[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=0",
                        "--job=badshare",
                        bad_tr,
                        "--epochs=8",
                        "--rejoin-timeout-ms=1000",
                        "--warm-start",
                        NULL};
    const char *b1[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=1",
                        "--job=badshare",
                        bad_tr,
                        "--epochs=8",
                        "--rejoin-timeout-ms=1000",
                        "--warm-start",
                        NULL};
    pid_t k0 = worker(b0, out0), k1 = worker_to(b1, out1, bad_err);
    const int rk1 = pu_reap(k1, 60);
    const bool rank0_on = running(k0);
    json_text(bad_err, log, sizeof log);
    print_message("rank 1 exited %d (rank 0 %s):\n", rk1, rank0_on ? "training" : "done");
    print_file(bad_err);
    assert_int_equal(rk1, 1);
    assert_non_null(strstr(log, "bad1.tsv"));
    assert_non_null(strstr(log, "max_error_rate"));
    assert_true(rank0_on);
    const int rk0 = pu_reap(k0, 120);
    print_message("rank 0 exited %d (went on alone)\n", rk0);
    assert_int_equal(rk0, 0);
    /* a table of another dim: the model wants 17-float rows for FM with dim 16 */
    const char *fm[] = {srv, "--model=fm", tr, NULL};
    assert_int_equal(pu_reap(worker(fm, out0), 30), 1);
    cluster_down(&c);
    /* servers unreachable */
    snprintf(unreach, sizeof unreach, "--servers=127.0.0.1:%d", pu_free_port());
    const char *un[] = {unreach, tr, "--timeout-ms=500", NULL};
    assert_int_equal(pu_reap(worker(un, out0), 60), 1);
}

/* Pushes refused for good (not a server restart): rank 0's push bodies (256-row batches, a
 * 256 KiB chunk) are over the servers' --max-body-bytes, rank 1's (12-row batches) and every
 * pull are not. The round's mark tells both, and both stop (rank 1 went on alone after rank 0
 * left, and ended "successfully", before). Then the settings that shape the group's collectives:
 * a worker with another --chunk-kib is refused at the group's formation, naming the flag (Gloo
 * aborted both processes on the collectives' size mismatch before). */
static void test_push_refused(void **state) {
    (void)state;
    cluster_t c;
    g_server_extra = "--max-body-bytes=32768";
    cluster_up(&c, TABLE);
    g_server_extra = NULL;
    char srv[64], coord[64], tr[640], out[2][300], err[2][300], log[8192];
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", c.grpc0);
    snprintf(tr, sizeof tr, "--train=%s,%s", g_p0, g_p1);
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/pr%d.json", g_dir, k);
        snprintf(err[k], sizeof err[k], "%s/pr%d.err", g_dir, k);
    }
    const char *w0[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=0",
                        "--job=refused",
                        tr,
                        "--batch=256",
                        "--rejoin-timeout-ms=1000",
                        NULL};
    const char *w1[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=1",
                        "--job=refused",
                        tr,
                        "--batch=12",
                        "--rejoin-timeout-ms=1000",
                        NULL};
    pid_t r0 = worker_to(w0, out[0], err[0]), r1 = worker_to(w1, out[1], err[1]);
    const int rc0 = pu_reap(r0, 60), rc1 = pu_reap(r1, 60);
    json_text(err[0], log, sizeof log);
    print_message("rank 0 exited %d: %s", rc0, log);
    assert_int_equal(rc0, 1);
    assert_non_null(strstr(log, "body over the limit"));
    json_text(err[1], log, sizeof log);
    print_message("rank 1 exited %d: %s", rc1, log);
    assert_int_equal(rc1, 1);
    assert_non_null(strstr(log, "another worker's pushes failed"));
    /* the same in async mode, where a round waits for no push: a later round's end tells */
    const char *a0[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=0",
                        "--job=refused-async",
                        tr,
                        "--batch=256",
                        "--mode=async",
                        "--rejoin-timeout-ms=1000",
                        "--warm-start",
                        NULL};
    const char *a1[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=1",
                        "--job=refused-async",
                        tr,
                        "--batch=12",
                        "--mode=async",
                        "--rejoin-timeout-ms=1000",
                        "--warm-start",
                        NULL};
    r0 = worker_to(a0, out[0], err[0]);
    r1 = worker_to(a1, out[1], err[1]);
    const int ra0 = pu_reap(r0, 60), ra1 = pu_reap(r1, 60);
    json_text(err[1], log, sizeof log);
    print_message("async: rank 0 exited %d, rank 1 %d: %s", ra0, ra1, log);
    assert_int_equal(ra0, 1);
    assert_int_equal(ra1, 1);
    assert_non_null(strstr(log, "another worker's pushes failed"));
    /* other settings: rank 1 with 16 KiB chunks ends (bad settings), rank 0 goes on alone (the
     * rows the first job pushed are taken over) */
    const char *m0[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=0",
                        "--job=plan",
                        tr,
                        "--batch=12",
                        "--warm-start",
                        "--rejoin-timeout-ms=1000",
                        "--max-samples=240",
                        NULL};
    const char *m1[] = {srv,
                        coord,
                        "--world=2",
                        "--rank=1",
                        "--job=plan",
                        tr,
                        "--batch=12",
                        "--warm-start",
                        "--rejoin-timeout-ms=1000",
                        "--chunk-kib=16",
                        NULL};
    r0 = worker_to(m0, out[0], err[0]);
    r1 = worker_to(m1, out[1], err[1]);
    const int rc_plan = pu_reap(r1, 60);
    json_text(err[1], log, sizeof log);
    print_message("rank 1 with --chunk-kib=16 exited %d: %s", rc_plan, log);
    assert_int_equal(rc_plan, 2);
    assert_non_null(strstr(log, "group member 1 has --chunk-kib=16, the job 256"));
    assert_int_equal(pu_reap(r0, 60), 0);
    assert_true(json_num(out[0], "samples") == 240);
    cluster_down(&c);
}

/* ---- worker failures ---- */

/* Batch, rows per worker. Sanitizer builds train 5x slower: less data there, and the quality
 * bounds (an AUC floor, the distance to an uninterrupted run) are looser for it; the exact
 * checks (lines read once, steps, membership) are the same. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
enum { RB = 512, RROWS = 60 * RB };
#define AUC_MIN       0.6
#define AUC_TOL       0.02
#define ASYNC_TOL     0.06 /* 60 steps: late dense rounds weigh more */
#define REJOIN_EPOCHS 3    /* the survivor must still train when the lost worker rejoins */
#define HUNG_REAP_S   600  /* test_worker_hung's 6 epochs took over 120 s under TSan */
#else
enum { RB = 512, RROWS = 200 * RB };
#define AUC_MIN       0.65
#define AUC_TOL       0.005
#define ASYNC_TOL     0.025
/* see above: one epoch left the survivor done before the rejoin (hung: within 8 s of the stop
 * once; lost: about 1 run in 5 once sync pushes waited for the round's first allreduce) */
#define REJOIN_EPOCHS 4
#define HUNG_REAP_S   120
#endif
enum { CKPT_EVERY = RROWS / RB / 5 }; /* coordinated checkpoints in the rollback tests */
#define RTABLE                                                                                  \
    "name=emb,dim=16,optimizer=adagrad,lr=0.05,adagrad_init=1e-6,init=uniform,init_scale=0.05," \
    "seed=3"
static char g_r0[300], g_r1[300], g_rtest[300];
static double g_base_auc = NAN; /* base_auc(), once */

/* Two worker shares of RROWS rows (blocks of RB lines alternate) and a test file, once. */
static void recovery_data(void) {
    if (g_r0[0])
        return;
    char all[300];
    snprintf(all, sizeof all, "%s/rall.tsv", g_dir);
    snprintf(g_r0, sizeof g_r0, "%s/r0.tsv", g_dir);
    snprintf(g_r1, sizeof g_r1, "%s/r1.tsv", g_dir);
    snprintf(g_rtest, sizeof g_rtest, "%s/rtest.tsv", g_dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = 2 * RROWS;
    o.test_rows = 20000;
    o.vocab_max = 20000;
    o.seed = 7;
    make_shares(&o, all, g_rtest, g_r0, g_r1, RB);
}

typedef struct rjob {
    cluster_t *c;
    const char *job, *policy;
    int rejoin_ms;
    int world; /* 0: 2 (a third rank reads rank 0's share again) */
    char out[3][300];
    const char *extra[7]; /* more flags, NULL-terminated */
    const char *err;      /* rank 0's stderr goes here (NULL: the test's) */
    const char *err1;     /* rank 1's (NULL: the test's) */
} rjob_t;

static pid_t rworker(rjob_t *j, int rank, const char *out) {
    char srv[64], coord[64], tr[960], test[320], jb[80], rk[32], pol[64], rj[64], b[32], w[32];
    const int world = j->world ? j->world : 2;
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", j->c->p0);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", j->c->grpc0);
    snprintf(w, sizeof w, "--world=%d", world);
    const int tl = snprintf(tr, sizeof tr, "--train=%s,%s", g_r0, g_r1);
    if (world == 3) /* file i goes to rank i % world */
        snprintf(tr + tl, sizeof tr - (size_t)tl, ",%s", g_r0);
    snprintf(test, sizeof test, "--test=%s", g_rtest);
    snprintf(jb, sizeof jb, "--job=%s", j->job);
    snprintf(rk, sizeof rk, "--rank=%d", rank);
    snprintf(pol, sizeof pol, "--on-worker-loss=%s", j->policy);
    snprintf(rj, sizeof rj, "--rejoin-timeout-ms=%d", j->rejoin_ms);
    snprintf(b, sizeof b, "--batch=%d", RB);
    /* the dense lr these tolerances were measured at: at 0.003 (the default since issue 21) sync
     * gains 0.014 AUC here and async loses 0.003 (0.788 / 0.763 against 0.774 / 0.766: dense
     * rounds applied late weigh more at a larger step), past ASYNC_TOL */
    const char *args[20] = {srv, coord, w, tr, test, jb, rk, pol, rj, b, "--dense-lr=0.001"};
    int n = 11;
    bool sync = true;
    for (int i = 0; i < 7 && j->extra[i]; i++) {
        args[n++] = j->extra[i];
        sync = sync && strncmp(j->extra[i], "--mode=", 7) != 0;
    }
    /* sync jobs push rank by rank: the same job gives the same model, so what a fault changed is
     * all that separates a run from the uninterrupted one (the order in which two workers'
     * pushes reach a row moved Adagrad's AUC by up to 0.003 on a loaded machine) */
    if (sync)
        args[n++] = "--push-order=rank";
    return worker_to(args, out, rank == 0 ? j->err : j->err1);
}

/* A key of job's current run at the coordinator ("" when absent). */
static void job_key(pw_coord_t *co, const char *job, const char *key, char *out, size_t cap) {
    char k[256];
    snprintf(k, sizeof k, "%s/run/0/%s", job, key);
    void *v;
    size_t n;
    out[0] = '\0';
    if (pw_coord_get(co, k, &v, &n) == 0) {
        snprintf(out, cap, "%.*s", (int)n, (const char *)v);
        free(v);
    }
}

/* Bounded wait until job's key has a value (copied to out). */
static void wait_key(pw_coord_t *co, const char *job, const char *key, char *out, size_t cap) {
    const double t0 = pu_now();
    do {
        job_key(co, job, key, out, cap);
        if (out[0])
            return;
        usleep(20000);
    } while (pu_now() - t0 < 60);
    fail_msg("%s/%s never came", job, key);
}

/* Bounded wait until rank 1 recorded step >= min_step of job; its recorded lines. */
static long wait_step(pw_coord_t *co, const char *job, unsigned long long min_step) {
    const double t0 = pu_now();
    char v[64];
    unsigned long long step = 0, lines = 0;
    while (pu_now() - t0 < 60) {
        job_key(co, job, "off/1", v, sizeof v);
        if (sscanf(v, "%llu %llu", &step, &lines) == 2 && step >= min_step)
            return (long)lines;
        usleep(10000);
    }
    fail_msg("rank 1 of %s did not reach step %llu", job, min_step);
    return -1;
}

static long wait_progress(pw_coord_t *co, const char *job) {
    return wait_step(co, job, 15);
}

static pw_coord_t *coord_of(const cluster_t *c) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", c->grpc0);
    pw_coord_t *co;
    assert_int_equal(pw_coord_open(addr, NULL, 5000, &co), 0);
    return co;
}

static bool running(pid_t pid) {
    return waitpid(pid, NULL, WNOHANG) == 0;
}

/* The test AUC of an uninterrupted run of the recovery data (once). It runs twice on fresh
 * servers: with --push-order=rank both runs give the same AUC to the last bit (without it the
 * order in which two workers' pushes reach a row moves it: 0.7739-0.7748 here, 0.7722 once in a
 * loaded CI run). */
static double base_auc(void) {
    if (!isnan(g_base_auc))
        return g_base_auc;
    recovery_data();
    double auc[2];
    for (int r = 0; r < 2; r++) {
        cluster_t c;
        cluster_up(&c, RTABLE);
        rjob_t base = {.c = &c, .job = r ? "base2" : "base", .policy = "wait", .rejoin_ms = 500};
        snprintf(base.out[0], sizeof base.out[0], "%s/base%d-0.json", g_dir, r);
        snprintf(base.out[1], sizeof base.out[1], "%s/base%d-1.json", g_dir, r);
        pid_t p0 = rworker(&base, 0, base.out[0]), p1 = rworker(&base, 1, base.out[1]);
        assert_int_equal(pu_reap(p0, 120), 0);
        assert_int_equal(pu_reap(p1, 120), 0);
        cluster_down(&c);
        auc[r] = json_num(base.out[0], "auc");
        print_message("uninterrupted run %d: AUC %.8f\n", r, auc[r]);
        assert_true(auc[r] > AUC_MIN);
    }
    assert_true(auc[0] == auc[1]); /* push order rank: reproducible */
    g_base_auc = auc[0];
    return g_base_auc;
}

/* --push-order=rank with three workers (turns 0 and 1 each step): two runs on fresh servers give
 * the same AUC to the last bit. Ranks 0 and 2 read the same share, so every step both push the
 * same keys: the order between them decides each of those rows. */
static void test_push_order_three_workers(void **state) {
    (void)state;
    recovery_data();
    double auc[2];
    for (int r = 0; r < 2; r++) {
        cluster_t c;
        cluster_up(&c, RTABLE);
        rjob_t j = {.c = &c,
                    .job = r ? "three1" : "three0",
                    .policy = "wait",
                    .rejoin_ms = 500,
                    .world = 3};
        pid_t p[3];
        for (int k = 0; k < 3; k++) {
            snprintf(j.out[k], sizeof j.out[k], "%s/three%d-%d.json", g_dir, r, k);
            p[k] = rworker(&j, k, j.out[k]);
        }
        for (int k = 0; k < 3; k++)
            assert_int_equal(pu_reap(p[k], 120), 0);
        cluster_down(&c);
        auc[r] = json_num(j.out[0], "auc");
        print_message("three workers, push order rank, run %d: AUC %.8f, %.0f steps\n", r, auc[r],
                      json_num(j.out[0], "steps"));
        assert_true(auc[r] > AUC_MIN);
        for (int k = 0; k < 3; k++)
            assert_true(json_num(j.out[k], "lost_pushes") == 0);
    }
    assert_true(auc[0] == auc[1]);
}

static void test_worker_restart(void **state) {
    (void)state;
    const double auc0 = base_auc();
    /* The same on fresh servers, rank 1 killed mid-way and started again 1.5 s later (on
     * cpu:checked): the survivor waits (3 rejoin timeouts pass, no shrink), then both finish. */
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    rjob_t j = {.c = &c, .job = "restart", .policy = "wait", .rejoin_ms = 500};
    char out1b[300], v[64];
    snprintf(j.out[0], sizeof j.out[0], "%s/rs0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/rs1.json", g_dir);
    snprintf(out1b, sizeof out1b, "%s/rs1b.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    assert_int_equal(kill(p1, SIGKILL), 0);
    assert_int_equal(pu_reap(p1, 10), 128 + SIGKILL);
    usleep(1500000);
    assert_true(running(p0));
    job_key(co, j.job, "g/1", v, sizeof v);
    assert_string_equal(v, ""); /* waiting, not shrunk */
    job_key(co, j.job, "off/1", v, sizeof v);
    unsigned long long step, lines;
    assert_int_equal(sscanf(v, "%llu %llu", &step, &lines), 2);
    /* The restarted worker computes on cpu:checked (device memory unreadable to host code): it
     * takes its dense state from rank 0 and exchanges every round's gradients through the
     * backend's memory rule; the same math as rank 0's CPU backend. */
    j.extra[0] = "--device=cpu:checked";
    p1 = rworker(&j, 1, out1b);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    job_key(co, j.job, "g/1", v, sizeof v);
    assert_string_equal(v, "0,1");
    char json[4096];
    json_text(out1b, json, sizeof json);
    assert_non_null(strstr(json, "\"device\":\"cpu:checked\""));
    const double auc1 = json_num(j.out[0], "auc");
    const double again = json_num(out1b, "samples"), first = json_num(out1b, "first_step_s");
    print_message("uninterrupted AUC %.8f, with rank 1 killed after step %llu and restarted: "
                  "%.8f; the restarted worker read %llu + %.0f lines, its first step %.3f s "
                  "after its start\n",
                  auc0, step, auc1, lines, again, first);
    assert_true(fabs(auc0 - auc1) < AUC_TOL);
    /* Rank 1's share read exactly once from where it was (the lines of its last step), and
     * rank 0's whole share. */
    assert_true(again + (double)lines == RROWS);
    assert_true(json_num(j.out[0], "samples") == RROWS);
    pw_coord_close(co);
    cluster_down(&c);
}

/* The dense_digest of a worker's --json output (its final dense state's XXH3). */
static void digest_of(const char *path, char out[17]) {
    char json[8192];
    json_text(path, json, sizeof json);
    const char *p = strstr(json, "\"dense_digest\":\"");
    assert_non_null(p);
    snprintf(out, 17, "%s", p + strlen("\"dense_digest\":\""));
}

/* Every worker of the job killed and started again (they continue the run, each from its
 * recorded position and at the run's step, with no trained dense model among them), then rank 1
 * alone killed and
 * started again: both end with one model (the same dense_digest). The restarted rank 1 once
 * kept its initial model: after the whole job's restart no member counted as having one, so
 * nobody sent it, and the two trained on with different weights. */
static void test_all_restarted(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    rjob_t j = {.c = &c, .job = "allrs", .policy = "wait", .rejoin_ms = 500};
    char a0[300], a1[300], b1[300];
    snprintf(a0, sizeof a0, "%s/ar0.json", g_dir);
    snprintf(a1, sizeof a1, "%s/ar1.json", g_dir);
    snprintf(b1, sizeof b1, "%s/ar1b.json", g_dir);
    pid_t p0 = rworker(&j, 0, a0), p1 = rworker(&j, 1, a1);
    wait_step(co, j.job, 10);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(kill(k ? p1 : p0, SIGKILL), 0);
        assert_int_equal(pu_reap(k ? p1 : p0, 10), 128 + SIGKILL);
    }
    char v[64];
    unsigned long long step = 0, lines;
    job_key(co, j.job, "off/1", v, sizeof v);
    assert_int_equal(sscanf(v, "%llu %llu", &step, &lines), 2);
    p0 = rworker(&j, 0, a0);
    p1 = rworker(&j, 1, a1);
    /* the run goes on at its step (before, its steps began at 0 again: the run's next
     * coordinated checkpoint, at a low step, removed its later ones) */
    unsigned long long step2 = 0, lines2 = lines;
    for (double t0 = pu_now(); lines2 == lines && pu_now() - t0 < 60; usleep(10000)) {
        job_key(co, j.job, "off/1", v, sizeof v);
        if (sscanf(v, "%llu %llu", &step2, &lines2) != 2)
            lines2 = lines;
    }
    print_message("recorded before the restart: step %llu; the first after it: step %llu\n", step,
                  step2);
    assert_true(lines2 != lines && step2 > step);
    wait_step(co, j.job, step + 10);
    assert_int_equal(kill(p1, SIGKILL), 0);
    assert_int_equal(pu_reap(p1, 10), 128 + SIGKILL);
    p1 = rworker(&j, 1, b1);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    char d0[17], d1[17];
    digest_of(a0, d0);
    digest_of(b1, d1);
    const double auc = json_num(a0, "auc");
    print_message("after the whole job's restart and rank 1's: AUC %.8f; dense models %s (rank "
                  "0), %s (rank 1)\n",
                  auc, d0, d1);
    assert_true(auc > AUC_MIN);
    assert_string_equal(d0, d1); /* one model */
    pw_coord_close(co);
    cluster_down(&c);
}

/* A test stream that takes its time: each time a reader opens the FIFO, the feeder waits
 * delay_ms, then writes the file src and closes (an evaluation of at least delay_ms). */
typedef struct feeder {
    const char *fifo, *src;
    int delay_ms;
    atomic_bool stop;
    int served;
} feeder_t;

static void *feed(void *arg) {
    feeder_t *f = arg;
    const double t0 = pu_now();
    while (!atomic_load(&f->stop) && pu_now() - t0 < 300) {
        const int fd = open(f->fifo, O_WRONLY | O_NONBLOCK); /* ENXIO: no reader yet */
        if (fd < 0) {
            usleep(20000);
            continue;
        }
        usleep((useconds_t)f->delay_ms * 1000);
        (void)fcntl(fd, F_SETFL, 0);
        FILE *in = fopen(f->src, "rb");
        char buf[1 << 16];
        size_t n;
        while (in && (n = fread(buf, 1, sizeof buf, in)) > 0 && write(fd, buf, n) == (ssize_t)n)
            ;
        if (in)
            fclose(in);
        close(fd);
        f->served++;
        usleep(1500 * 1000); /* the reader sees the end before a next open could be taken */
    }
    return NULL;
}

#define EV_TIMEOUT_MS 5000 /* the collectives' timeout in test_eval_longer_than_timeout */
#define STR_(x)       #x
#define STR(x)        STR_(x)

/* Mid-run evaluations (--eval-every) that last longer than the collectives' timeout
 * (--timeout-ms): the members wait for rank 0's at the same round, so the group does not
 * re-form (rank 1 once waited inside the next allreduce, which timed out: a new generation,
 * rounds thrown away) and the model is the uninterrupted run's to the last bit. With
 * `rank1_wait` (rank 1's --eval-timeout-ms shorter than an evaluation) the group re-forms at
 * each evaluation's round instead, after rank 0 took it: it is not taken again (the group's
 * agreement carries rank 0's last evaluated round; one missed there is taken after it), and the
 * model is still exact (every round before it was applied). */
static void eval_long_run(const char *rank1_wait) {
    const double auc0 = base_auc();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    char fifo[300], test[340], every[64], err0[300], log[16384], v[64];
    snprintf(fifo, sizeof fifo, "%s/slowtest.fifo", g_dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(test, sizeof test, "--test=%s", fifo);
    snprintf(every, sizeof every, "--eval-every=%d", RROWS / 5 * 2); /* 2 mid-run */
    snprintf(err0, sizeof err0, "%s/slow0.err", g_dir);
    signal(SIGPIPE, SIG_IGN); /* a reader gone mid-file: the feeder's write fails instead */
    feeder_t f = {.fifo = fifo, .src = g_rtest, .delay_ms = EV_TIMEOUT_MS + 2000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, feed, &f), 0);
    /* as a job is started: only rank 0, the evaluator, is given the evaluation's settings */
    rjob_t j = {.c = &c,
                .job = rank1_wait ? "slowev2" : "slowev",
                .policy = "wait",
                .rejoin_ms = 500,
                .extra = {test, every, "--timeout-ms=" STR(EV_TIMEOUT_MS)},
                .err = err0};
    snprintf(j.out[0], sizeof j.out[0], "%s/slow0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/slow1.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]);
    j.extra[0] = "--timeout-ms=" STR(EV_TIMEOUT_MS);
    j.extra[1] = rank1_wait;
    j.extra[2] = NULL;
    pid_t p1 = rworker(&j, 1, j.out[1]);
    const int rc0 = pu_reap(p0, 180), rc1 = pu_reap(p1, 180);
    atomic_store(&f.stop, true);
    pthread_join(th, NULL);
    json_text(err0, log, sizeof log);
    int evals = 0;
    for (const char *e = log; (e = strstr(e, "eval: after")); e++)
        evals++;
    job_key(co, j.job, "g/1", v, sizeof v);
    const double auc = json_num(j.out[0], "auc");
    print_message("evaluations of >= %d ms with a %d ms timeout%s%s: %d mid-run, %d served; AUC "
                  "%.8f (uninterrupted %.8f); generation 1: %s\n",
                  f.delay_ms, EV_TIMEOUT_MS, rank1_wait ? ", rank 1 " : "",
                  rank1_wait ? rank1_wait : "", evals, f.served, auc, auc0, v[0] ? v : "none");
    assert_int_equal(rc0, 0);
    assert_int_equal(rc1, 0);
    assert_int_equal(evals, 2);
    if (rank1_wait)
        assert_true(v[0] != '\0'); /* re-formed */
    else
        assert_string_equal(v, ""); /* the group never re-formed */
    for (int k = 0; k < 2; k++)
        assert_true(json_num(j.out[k], "lost_pushes") == 0);
    assert_true(auc == auc0);
    unlink(fifo);
    pw_coord_close(co);
    cluster_down(&c);
}

static void test_eval_longer_than_timeout(void **state) {
    (void)state;
    eval_long_run(NULL);
}

static void test_eval_regroup_after_eval(void **state) {
    (void)state;
    eval_long_run("--eval-timeout-ms=1000");
}

/* Rank 1 killed and started again with another dense model (--top): it ends with an error
 * naming the size, and rank 0 goes on without it (shrink) to the end; the mismatch once ended
 * every member. */
static void test_misconfigured_rejoin(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    rjob_t j = {.c = &c, .job = "misconf", .policy = "shrink", .rejoin_ms = 1000};
    char out1b[300], err1b[300], log[8192];
    snprintf(j.out[0], sizeof j.out[0], "%s/mc0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/mc1.json", g_dir);
    snprintf(out1b, sizeof out1b, "%s/mc1b.json", g_dir);
    snprintf(err1b, sizeof err1b, "%s/mc1b.err", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    assert_int_equal(kill(p1, SIGKILL), 0);
    assert_int_equal(pu_reap(p1, 10), 128 + SIGKILL);
    j.extra[0] = "--top=32,1";
    j.err1 = err1b;
    p1 = rworker(&j, 1, out1b);
    assert_int_not_equal(pu_reap(p1, 60), 0);
    json_text(err1b, log, sizeof log);
    assert_non_null(strstr(log, "a dense model of another size"));
    assert_int_equal(pu_reap(p0, 120), 0);
    print_message("the misconfigured rank 1 ended; rank 0 finished alone: %.0f samples\n",
                  json_num(j.out[0], "samples"));
    assert_true(json_num(j.out[0], "samples") == RROWS);
    pw_coord_close(co);
    cluster_down(&c);
}

static void test_worker_lost(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    /* Shrink after 1 s, then rank 1 comes back and is taken in again. */
    char epochs[32], out1b[300], v[64];
    snprintf(epochs, sizeof epochs, "--epochs=%d", REJOIN_EPOCHS);
    rjob_t j = {
        .c = &c, .job = "shrink", .policy = "shrink", .rejoin_ms = 1000, .extra = {epochs, NULL}};
    snprintf(j.out[0], sizeof j.out[0], "%s/sh0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/sh1.json", g_dir);
    snprintf(out1b, sizeof out1b, "%s/sh1b.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    assert_int_equal(kill(p1, SIGKILL), 0);
    assert_int_equal(pu_reap(p1, 10), 128 + SIGKILL);
    wait_key(co, j.job, "g/1/formed", v, sizeof v);
    job_key(co, j.job, "g/1", v, sizeof v);
    assert_string_equal(v, "0"); /* rank 0 went on alone */
    p1 = rworker(&j, 1, out1b);
    wait_key(co, j.job, "g/2/formed", v, sizeof v);
    job_key(co, j.job, "g/2", v, sizeof v);
    assert_string_equal(v, "0,1"); /* and took rank 1 back */
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    assert_true(json_num(j.out[0], "samples") == REJOIN_EPOCHS * RROWS);
    assert_true(json_num(j.out[0], "auc") > AUC_MIN);
    /* A worker that never comes back: the survivor finishes its data alone, and its warning
     * says the worker is lost (its process is gone), not "alive" (its lease still runs). A job
     * of its own on the shrink job's table: it trains those rows further (--warm-start). */
    char err0[300], log[16384];
    snprintf(err0, sizeof err0, "%s/lost0.err", g_dir);
    rjob_t k = {.c = &c,
                .job = "lost",
                .policy = "shrink",
                .rejoin_ms = 1000,
                .extra = {"--log-level=warn", "--warm-start", NULL},
                .err = err0};
    snprintf(k.out[0], sizeof k.out[0], "%s/lost0.json", g_dir);
    snprintf(k.out[1], sizeof k.out[1], "%s/lost1.json", g_dir);
    p0 = rworker(&k, 0, k.out[0]);
    p1 = rworker(&k, 1, k.out[1]);
    wait_progress(co, k.job);
    assert_int_equal(kill(p1, SIGKILL), 0);
    assert_int_equal(pu_reap(p1, 10), 128 + SIGKILL);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_true(json_num(k.out[0], "samples") == RROWS);
    job_key(co, k.job, "g/1", v, sizeof v);
    assert_string_equal(v, "0");
    json_text(err0, log, sizeof log);
    const char *lost = strstr(log, "worker 1 is lost");
    if (!lost || strstr(log, "alive but not in recovery"))
        fail_msg("rank 0's log: %s", log);
    print_message("%.*s\n", (int)strcspn(lost, "\n"), lost);
    pw_coord_close(co);
    cluster_down(&c);
}

/* Bounded wait until key of job is absent (a lease ended). */
static void wait_gone(pw_coord_t *co, const char *job, const char *key) {
    char v[256];
    const double t0 = pu_now();
    do {
        job_key(co, job, key, v, sizeof v);
        if (!v[0])
            return;
        usleep(50000);
    } while (pu_now() - t0 < 30);
    fail_msg("%s/%s stayed: %s", job, key, v);
}

/* Rank 1 of job j stopped (SIGSTOP) until its lease ended and rank 0 went on alone (generation
 * 1 is "0"): the seconds from the stop to each. */
static void stop_until_shrunk(const rjob_t *j, pw_coord_t *co, pid_t p0, pid_t p1,
                              double *lease_end, double *shrunk) {
    char v[256];
    const double t0 = pu_now();
    assert_int_equal(kill(p1, SIGSTOP), 0);
    wait_gone(co, j->job, "live/1"); /* its heartbeats stopped */
    *lease_end = pu_now() - t0;
    job_key(co, j->job, "live/0", v, sizeof v);
    assert_non_null(strstr(v, "\"rank\":0,")); /* the survivor's lease lives */
    wait_key(co, j->job, "g/1/formed", v, sizeof v);
    *shrunk = pu_now() - t0;
    job_key(co, j->job, "g/1", v, sizeof v);
    assert_string_equal(v, "0"); /* rank 0 went on alone */
    assert_true(running(p0));
}

static void test_worker_hung(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    /* Collectives time out after 4 s, leases after 1 s, survivors wait 1 s for a replacement. */
    char epochs[32];
    rjob_t j = {.c = &c,
                .job = "hung",
                .policy = "shrink",
                .rejoin_ms = 1000,
                .extra = {"--timeout-ms=4000", "--lease-ms=1000", epochs, NULL}};
    char out[4096], v[256];
    /* Twice the lost-worker job's epochs: the stopped worker's own collective must time out
     * (4 s) after SIGCONT before it proposes the next generation, and the survivor, alone and so
     * faster, must still be training then (a fresh-clone CI run once saw it finish first). */
    snprintf(epochs, sizeof epochs, "--epochs=%d", 2 * REJOIN_EPOCHS);
    snprintf(j.out[0], sizeof j.out[0], "%s/hg0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/hg1.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    const char *args[] = {"--json", "workers", j.job, NULL};
    assert_int_equal(pu_psctl(g_psctl, c.grpc0, out, sizeof out, args), 0);
    assert_non_null(strstr(out, "\"rank\":0,"));
    assert_non_null(strstr(out, "\"rank\":1,"));
    assert_non_null(strstr(out, "\"state\":\"training\""));
    const char *text[] = {"workers", j.job, NULL}; /* the table for people */
    assert_int_equal(pu_psctl(g_psctl, c.grpc0, out, sizeof out, text), 0);
    assert_non_null(strstr(out, "generation 0: workers 0,1"));
    assert_non_null(strstr(out, "training"));
    double lease_end, shrunk;
    stop_until_shrunk(&j, co, p0, p1, &lease_end, &shrunk);
    assert_int_equal(pu_psctl(g_psctl, c.grpc0, out, sizeof out, args), 0);
    assert_null(strstr(out, "\"rank\":1,")); /* (before rank 1 resumes) */
    assert_int_equal(kill(p1, SIGCONT), 0);
    wait_key(co, j.job, "g/2/formed", v, sizeof v);
    job_key(co, j.job, "g/2", v, sizeof v);
    assert_string_equal(v, "0,1"); /* and took rank 1 back */
    assert_int_equal(pu_reap(p0, HUNG_REAP_S), 0);
    assert_int_equal(pu_reap(p1, HUNG_REAP_S), 0);
    print_message("hung worker: its lease ended %.1f s after SIGSTOP, the survivor went on alone "
                  "after %.1f s; AUC %.5f\n",
                  lease_end, shrunk, json_num(j.out[0], "auc"));
    assert_true(lease_end < 4); /* 1 s lease, heartbeats every 0.25 s */
    assert_true(json_num(j.out[0], "samples") == 2 * REJOIN_EPOCHS * RROWS);
    assert_true(json_num(j.out[1], "samples") == 2 * REJOIN_EPOCHS * RROWS);
    assert_true(json_num(j.out[0], "auc") > AUC_MIN);
    pw_coord_close(co);
    cluster_down(&c);
}

/* A stopped worker replaced while it was stopped: rank 1 stopped until rank 0 went on alone, a
 * new rank 1 started and joined (generation 2 is "0,1"), then the stopped one continued. It
 * learns that its rank was taken over (its heartbeat, or its recovery, finds the new worker's
 * mark in the rank's lease) and exits 1 instead of training as a second rank 1; the others
 * finish. (Its heartbeats used to write over the new worker's, and both held the rank.) */
static void test_worker_replaced(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    char epochs[32], err1[300], v[256], log[16384];
    snprintf(epochs, sizeof epochs, "--epochs=%d", 2 * REJOIN_EPOCHS); /* as test_worker_hung */
    snprintf(err1, sizeof err1, "%s/rp1.err", g_dir);
    rjob_t j = {.c = &c,
                .job = "replaced",
                .policy = "shrink",
                .rejoin_ms = 1000,
                .extra = {"--timeout-ms=4000", "--lease-ms=1000", epochs, NULL},
                .err1 = err1};
    snprintf(j.out[0], sizeof j.out[0], "%s/rp0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/rp1.json", g_dir);
    snprintf(j.out[2], sizeof j.out[2], "%s/rp1b.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    double lease_end, shrunk;
    stop_until_shrunk(&j, co, p0, p1, &lease_end, &shrunk);
    j.err1 = NULL; /* the new worker's: the test's */
    const pid_t p1b = rworker(&j, 1, j.out[2]);
    wait_key(co, j.job, "g/2/formed", v, sizeof v);
    job_key(co, j.job, "g/2", v, sizeof v);
    assert_string_equal(v, "0,1"); /* rank 0 and the new rank 1 */
    assert_int_equal(kill(p1, SIGCONT), 0);
    const int old = pu_reap(p1, 60);
    assert_int_equal(pu_reap(p0, HUNG_REAP_S), 0);
    assert_int_equal(pu_reap(p1b, HUNG_REAP_S), 0);
    json_text(err1, log, sizeof log);
    print_message("replaced worker: exit %d; %s\n", old,
                  strstr(log, "taken over") ? "it said it was taken over" : log);
    assert_int_equal(old, 1);
    assert_non_null(strstr(log, "was taken over by another worker"));
    assert_true(json_num(j.out[0], "samples") == 2 * REJOIN_EPOCHS * RROWS);
    assert_true(json_num(j.out[0], "auc") > AUC_MIN);
    pw_coord_close(co);
    cluster_down(&c);
}

/* Server 1 killed with -9 mid-training and started again: it restores its last checkpoint, the
 * workers' pulls wait for it, pushes it missed are counted as lost, the job completes. */
static void test_server_restart(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    pw_coord_t *co = coord_of(&c);
    char err0[300], err1[300], log[16384], log1[16384], addr[64];
    snprintf(err0, sizeof err0, "%s/srv0.err", g_dir);
    snprintf(err1, sizeof err1, "%s/srv1.err", g_dir);
    rjob_t j = {.c = &c,
                .job = "srv",
                .policy = "shrink",
                .rejoin_ms = 20000,
                .extra = {"--log-level=warn", NULL},
                .err = err0,
                .err1 = err1};
    snprintf(j.out[0], sizeof j.out[0], "%s/srv0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/srv1.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    usleep(1200000); /* at least one checkpoint of server 1 */
    assert_int_equal(kill(c.s1, SIGKILL), 0);
    assert_int_equal(pu_reap(c.s1, 10), 128 + SIGKILL);
    usleep(500000);
    start_server1(&c, 0);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    char v[64];
    job_key(co, j.job, "g/1", v, sizeof v);
    assert_string_equal(v, ""); /* no worker was lost */
    print_message("server 1 killed and restarted: AUC %.5f, pushes lost %.0f + %.0f\n",
                  json_num(j.out[0], "auc"), json_num(j.out[0], "lost_pushes"),
                  json_num(j.out[1], "lost_pushes"));
    assert_true(json_num(j.out[0], "samples") == RROWS && json_num(j.out[1], "samples") == RROWS);
    assert_true(json_num(j.out[0], "auc") > AUC_MIN);
    /* the warnings about the lost connection name the server that went down (in the log of a
     * rank that called it while it was down: a rank waiting in the allreduce for the other, with
     * its next rows pulled ahead, may not have) */
    json_text(err0, log, sizeof log);
    json_text(err1, log1, sizeof log1);
    snprintf(addr, sizeof addr, "127.0.0.1:%d: ", c.p1);
    const char *named = strstr(log, addr), *named1 = strstr(log1, addr);
    if (!named && !named1)
        fail_msg("no worker's log names server 1 (%s): rank 0: %s; rank 1: %s", addr, log, log1);
    print_message("rank %d: ...%.*s\n", named ? 0 : 1, (int)strcspn(named ? named : named1, "\n"),
                  named ? named : named1);
    pw_coord_close(co);
    cluster_down(&c);
}

/* With replicas (docs/server.md "Replicas and failover"): server 0 holds the cluster map and the
 * leases (600 ms), every slot has a backup; server 1, primary of half the slots, is killed with
 * -9 mid-training and not started again. Its backup takes its slots, the workers' calls follow
 * the new map, the job completes with no rollback and no lost worker, at the AUC of an
 * uninterrupted run: the same to the last bit when no push was cut short (the workers push in
 * rank order), else within REPLICA_TOL (a push whose answer was lost with the server may be
 * missing). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define REPLICA_TOL 0.02
#else
#define REPLICA_TOL 0.002
#endif
/* Two servers with one backup per slot, server 0 also the coordinator holding the map and the
 * leases (600 ms): docs/server.md "Replicas and failover". coordarg gets server 1's
 * --cluster-coordinator (for a server started later). */
static void replica_cluster_up(cluster_t *c, char *coordarg, size_t cap) {
    memset(c, 0, sizeof *c);
    cc_two_servers(&c->p0, &c->p1, c->map, sizeof c->map, c->maparg, sizeof c->maparg);
    snprintf(c->tables, sizeof c->tables, "--tables=%s", RTABLE);
    const char *e0[] = {c->maparg,        c->tables, "--coordinator", "--cluster-coordinator=self",
                        "--lease-ms=600", NULL};
    c->s0 = pu_spawn(c->p0, g_dir, e0, &c->grpc0);
    snprintf(coordarg, cap, "--cluster-coordinator=127.0.0.1:%d", c->grpc0);
    const char *e1[] = {c->maparg, c->tables, coordarg, "--lease-ms=600", NULL};
    c->s1 = pu_spawn(c->p1, g_dir, e1, &c->grpc1);
}

static void test_primary_kill_with_replicas(void **state) {
    (void)state;
    const double auc0 = base_auc();
    cluster_t c;
    char coordarg[64];
    replica_cluster_up(&c, coordarg, sizeof coordarg);
    pw_coord_t *co = coord_of(&c);
    rjob_t j = {.c = &c, .job = "replica", .policy = "wait", .rejoin_ms = 20000};
    snprintf(j.out[0], sizeof j.out[0], "%s/rep0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/rep1.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    assert_int_equal(kill(c.s1, SIGKILL), 0);
    assert_int_equal(pu_reap(c.s1, 10), 128 + SIGKILL);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    char v[64];
    job_key(co, j.job, "g/1", v, sizeof v);
    assert_string_equal(v, ""); /* no worker was lost */
    const double auc = json_num(j.out[0], "auc");
    const double lost = json_num(j.out[0], "lost_pushes") + json_num(j.out[1], "lost_pushes");
    print_message("primary killed, its backup took over: AUC %.8f (uninterrupted %.8f), pushes "
                  "lost %.0f + %.0f, rollbacks %.0f\n",
                  auc, auc0, json_num(j.out[0], "lost_pushes"), json_num(j.out[1], "lost_pushes"),
                  json_num(j.out[0], "rollbacks"));
    assert_true(json_num(j.out[0], "samples") == RROWS && json_num(j.out[1], "samples") == RROWS);
    assert_true(json_num(j.out[0], "rollbacks") == 0 && json_num(j.out[1], "rollbacks") == 0);
    /* Pushes go rank by rank and a sent push is never sent again: with none cut short, every
     * push was applied once on the rows the job ended with, and the model is the uninterrupted
     * one to the last bit. A push cut short may or may not have reached the backup first. */
    if (lost == 0)
        assert_true(auc == auc0);
    else
        assert_true(fabs(auc - auc0) <= REPLICA_TOL);
    pw_coord_close(co);
    pu_stop(c.s0);
}

/* Two failures in a row under two training workers (docs/server.md "Which backup is
 * promoted"): the map and the leases in a third ps-server (a coordinator outside the cluster,
 * which is also the workers'), so either data server can fail. Server 1 is killed (server 0
 * takes its slots, cleanly), server 0 stopped (SIGSTOP) and server 1 started again: it joins as
 * a backup still catching up, cannot copy from the stopped server 0, and is promoted once
 * server 0's lease ran out; server 0 is then killed. Every worker is told: with `continue` both
 * finish, their JSON counting the 16384 slots (`unclean_slots`) and their logs saying what was
 * lost; with `rollback` (coordinated checkpoints on) both stop with an error that says to
 * restart from the checkpoint, and the clean failover before asked for no rollback (the servers
 * have replicas: a lost connection loses nothing there). */
static void unclean_job(bool rollback) {
    recovery_data();
    const int pc = pu_free_port();
    char cmaparg[128], tables[300], coordarg[64], map[256], maparg[300], err0[300], err1[300];
    char ckd[320], grpcs[64];
    static char log[1 << 18], log1[1 << 18]; /* the workers' whole stderr at warn level */
    snprintf(cmaparg, sizeof cmaparg,
             "--cluster-map=version=1;servers=127.0.0.1:%d;slots=0-16383:0", pc);
    const char *ec[] = {cmaparg, "--coordinator", NULL};
    cluster_t w; /* what rworker and coord_of read: data server 0, the coordinator's gRPC */
    memset(&w, 0, sizeof w);
    const pid_t sc = pu_spawn(pc, g_dir, ec, &w.grpc0);
    int p0, p1, g0 = 0, g1 = 0;
    cc_two_servers(&p0, &p1, map, sizeof map, maparg, sizeof maparg);
    w.p0 = p0;
    snprintf(tables, sizeof tables, "--tables=%s", RTABLE);
    snprintf(coordarg, sizeof coordarg, "--cluster-coordinator=127.0.0.1:%d", w.grpc0);
    const char *es[] = {maparg, tables, coordarg, "--lease-ms=600", NULL};
    pid_t s0 = pu_spawn(p0, g_dir, es, &g0), s1 = pu_spawn(p1, g_dir, es, &g1);
    bool replicated = false;
    for (double t0 = pu_now(); !replicated && pu_now() - t0 < 15; usleep(20000)) {
        pc_cluster_map_t *m = cc_map_of(p0);
        replicated = pc_cmap_replicated(m) && pc_cmap_server_slots(m, 1) == PC_NSLOTS / 2;
        pc_cmap_destroy(m);
    }
    assert_true(replicated);
    snprintf(err0, sizeof err0, "%s/unclean%d-0.err", g_dir, rollback);
    snprintf(err1, sizeof err1, "%s/unclean%d-1.err", g_dir, rollback);
    snprintf(ckd, sizeof ckd, "--ckpt-dir=%s/unclean-ckpt%d", g_dir, rollback);
    snprintf(grpcs, sizeof grpcs, "--server-grpc=127.0.0.1:%d,127.0.0.1:%d", g0, g1);
    rjob_t j = {.c = &w,
                .job = rollback ? "unclean-rb" : "unclean",
                .policy = "shrink",
                .rejoin_ms = 3000,
                .extra = {"--log-level=warn", "--epochs=4"},
                .err = err0,
                .err1 = err1};
    if (rollback) {
        j.extra[2] = ckd;
        j.extra[3] = grpcs;
        j.extra[4] = "--ckpt-every=10";
        j.extra[5] = "--on-server-loss=rollback";
    }
    snprintf(j.out[0], sizeof j.out[0], "%s/unclean%d-0.json", g_dir, rollback);
    snprintf(j.out[1], sizeof j.out[1], "%s/unclean%d-1.json", g_dir, rollback);
    pw_coord_t *co = coord_of(&w);
    pid_t w0 = rworker(&j, 0, j.out[0]), w1 = rworker(&j, 1, j.out[1]);
    wait_progress(co, j.job);
    kill(s1, SIGKILL);
    pu_reap(s1, 5);
    bool all0 = false;
    for (double t0 = pu_now(); !all0 && pu_now() - t0 < 15; usleep(20000)) {
        pc_cluster_map_t *m = cc_map_of(p0);
        all0 = pc_cmap_server_slots(m, 0) == PC_NSLOTS && pc_cmap_unclean(m) == 0;
        pc_cmap_destroy(m);
    }
    assert_true(all0);
    /* the workers train on past the clean failover: the servers have replicas, so with rollback
     * their lost connection asked for no rollback */
    char v[64];
    unsigned long long step = 0, lines;
    job_key(co, j.job, "off/1", v, sizeof v);
    assert_int_equal(sscanf(v, "%llu %llu", &step, &lines), 2);
    wait_step(co, j.job, step + 5);
    json_text(err0, log, sizeof log);
    json_text(err1, log1, sizeof log1);
    assert_null(strstr(log, "rolling the job back"));
    assert_null(strstr(log1, "rolling the job back"));
    assert_true(running(w0) && running(w1)); /* the faults happen while they train */
    assert_int_equal(kill(s0, SIGSTOP), 0);
    s1 = pu_spawn(p1, g_dir, es, &g1);
    bool unclean = false;
    for (double t0 = pu_now(); !unclean && pu_now() - t0 < 20; usleep(50000)) {
        pc_cluster_map_t *m = cc_map_of(p1);
        unclean = pc_cmap_server_slots(m, 1) == PC_NSLOTS && pc_cmap_unclean(m) == PC_NSLOTS;
        pc_cmap_destroy(m);
    }
    assert_true(unclean);
    kill(s0, SIGKILL);
    pu_reap(s0, 5);
    const int rc0 = pu_reap(w0, 120), rc1 = pu_reap(w1, 120);
    json_text(err0, log, sizeof log);
    json_text(err1, log1, sizeof log1);
    /* continue: both say it and train on; rollback: both say it and stop (no job rollback: the
     * map lists server 1 with no role since the failover, a rollback could not restore it) */
    const char *said = "the servers count 16384 more slots whose rows went back";
    const char *then = rollback ? "the job stops (--on-server-loss=rollback)"
                                : "training goes on (--on-server-loss=continue)";
    if (!strstr(log, said) || !strstr(log1, said) || !strstr(log, then) || !strstr(log1, then) ||
        rc0 != (rollback ? 1 : 0) || rc1 != (rollback ? 1 : 0)) {
        print_message("rank 0 said:\n");
        print_file(err0);
        print_message("rank 1 said:\n");
        print_file(err1);
        fail_msg("workers exited %d and %d", rc0, rc1);
    }
    if (!rollback) {
        assert_true(json_num(j.out[0], "unclean_slots") == PC_NSLOTS &&
                    json_num(j.out[1], "unclean_slots") == PC_NSLOTS);
        assert_true(json_num(j.out[0], "samples") == 4 * RROWS);
    }
    print_message("%s: both workers told of the unclean promotion (exit %d, %d)\n",
                  rollback ? "rollback" : "continue", rc0, rc1);
    pw_coord_close(co);
    pu_stop(s1);
    pu_stop(sc);
}

static void test_unclean_promotion_told(void **state) {
    (void)state;
    unclean_job(true);
    unclean_job(false);
}

/* Steps rank 0 ended, from a --step-log (other ranks may write to it too). */
static int steps_logged(const char *log) {
    FILE *f = fopen(log, "r");
    int n = 0, rank;
    unsigned long long round, ns;
    char what[8];
    while (f && fscanf(f, "%d %llu %7s %llu", &rank, &round, what, &ns) == 4)
        n += rank == 0 && strcmp(what, "end") == 0;
    if (f)
        fclose(f);
    return n;
}

/* Two workers in sync, pushing in rank order (so the job's model depends on its data only),
 * over the recovery data, three epochs, against two servers with replicas; with `reshard`, a
 * third server is brought in after rank 0's step 20 (psctl reshard add) and taken out again
 * (remove) once the map is the target, both while the workers train. Returns the hash of the
 * whole table at the end (rows with Adagrad's state, each from its primary:
 * tests/support/cluster_check.h), its rows into *rows; the workers' summaries go to j->out. */
static uint64_t reshard_job(bool reshard, rjob_t *j, size_t *rows) {
    recovery_data();
    cluster_t c;
    char coordarg[64], sl[340], log[300], maparg[1024];
    replica_cluster_up(&c, coordarg, sizeof coordarg);
    snprintf(log, sizeof log, "%s/reshard%d.steps", g_dir, reshard);
    unlink(log);
    snprintf(sl, sizeof sl, "--step-log=%s", log); /* both ranks append, a line per step */
    j->c = &c;
    j->extra[0] = "--epochs=3";
    j->extra[1] = sl;
    const pid_t w0 = rworker(j, 0, j->out[0]), w1 = rworker(j, 1, j->out[1]);
    if (reshard) {
        for (double t0 = pu_now(); steps_logged(log) < 20 && pu_now() - t0 < 60;)
            usleep(10000);
        assert_true(steps_logged(log) >= 20);
        const int p2 = pu_free_port();
        cc_reshard_add(g_psctl, c.grpc0, p2, maparg, sizeof maparg);
        const char *e2[] = {maparg, c.tables, coordarg, "--lease-ms=600", NULL};
        const pid_t s2 = pu_spawn(p2, g_dir, e2, NULL);
        for (double t0 = pu_now(); !cc_reshard_done(g_psctl, c.grpc0) && pu_now() - t0 < 30;)
            usleep(20000);
        const int at_add = steps_logged(log);
        cc_reshard_remove(g_psctl, c.grpc0, p2);
        for (double t0 = pu_now(); !cc_reshard_done(g_psctl, c.grpc0) && pu_now() - t0 < 30;)
            usleep(20000);
        const int at_remove = steps_logged(log);
        assert_true(cc_reshard_done(g_psctl, c.grpc0));
        print_message("a third server added (moved by step %d) and removed (by step %d) while "
                      "the workers trained\n",
                      at_add, at_remove);
        assert_true(running(w0) && running(w1)); /* both moves happened during training */
        usleep(300000); /* every server adopted the last map before s2 goes */
        pu_stop(s2);
    }
    assert_int_equal(pu_reap(w0, 180), 0);
    assert_int_equal(pu_reap(w1, 180), 0);
    char srv[64];
    snprintf(srv, sizeof srv, "127.0.0.1:%d", c.p0);
    psc_opts_t po = {.servers = srv, .timeout_ms = 5000};
    psc_t *pc;
    assert_int_equal(psc_connect(&po, &pc), 0);
    const uint64_t sum = cc_table_sum(pc, 2, "emb", 32, rows); /* dim 16 + Adagrad's 16 */
    psc_close(pc);
    pu_stop(c.s1);
    pu_stop(c.s0);
    return sum;
}

/* Live resharding under training workers (docs/server.md "Live resharding"): a third server
 * added and removed mid-training; no pull or push failed or was lost, and the whole table equals,
 * bit for bit, the table of the same job on a cluster never resharded (and so does the AUC). */
static void test_reshard_mid_training(void **state) {
    (void)state;
    rjob_t j1 = {.job = "reshard1", .policy = "wait", .rejoin_ms = 20000},
           j0 = {.job = "reshard0", .policy = "wait", .rejoin_ms = 20000};
    for (int r = 0; r < 2; r++) {
        snprintf(j1.out[r], sizeof j1.out[r], "%s/reshard1-%d.json", g_dir, r);
        snprintf(j0.out[r], sizeof j0.out[r], "%s/reshard0-%d.json", g_dir, r);
    }
    size_t rows1, rows0;
    const uint64_t h1 = reshard_job(true, &j1, &rows1), h0 = reshard_job(false, &j0, &rows0);
    const char *o1 = j1.out[0], *o0 = j0.out[0];
    const double lost = json_num(o1, "lost_pushes") + json_num(j1.out[1], "lost_pushes");
    print_message("resharded: %zu rows, hash %016llx, AUC %.8f, lost pushes %.0f; never "
                  "resharded: %zu rows, hash %016llx, AUC %.8f\n",
                  rows1, (unsigned long long)h1, json_num(o1, "auc"), lost, rows0,
                  (unsigned long long)h0, json_num(o0, "auc"));
    assert_true(lost == 0 && json_num(o1, "rollbacks") == 0 &&
                json_num(j1.out[1], "rollbacks") == 0);
    assert_true(json_num(o1, "samples") == json_num(o0, "samples"));
    assert_true(json_num(j1.out[1], "samples") == json_num(j0.out[1], "samples"));
    assert_int_equal(rows1, rows0);
    assert_true(h1 == h0);
    assert_true(json_num(o1, "auc") == json_num(o0, "auc"));
}

/* The flags of a job with coordinated checkpoints into g_dir/<name> against cluster c. */
typedef struct ckjob {
    char dir[300], ckd[320], grpc[96], latest[340];
} ckjob_t;

static void ckjob_init(ckjob_t *k, const cluster_t *c, const char *name) {
    snprintf(k->dir, sizeof k->dir, "%s/%s", g_dir, name);
    snprintf(k->ckd, sizeof k->ckd, "--ckpt-dir=%s", k->dir);
    snprintf(k->grpc, sizeof k->grpc, "--server-grpc=127.0.0.1:%d,127.0.0.1:%d", c->grpc0,
             c->grpc1);
    snprintf(k->latest, sizeof k->latest, "%s/LATEST", k->dir);
}

/* Server 1 killed with -9 and started again (from its own newest checkpoint, same ports). */
static void server1_restart(cluster_t *c, useconds_t down_us) {
    assert_int_equal(kill(c->s1, SIGKILL), 0);
    assert_int_equal(pu_reap(c->s1, 10), 128 + SIGKILL);
    usleep(down_us);
    start_server1(c, 0);
}

/* Past the first coordinated checkpoint and a checkpoint of server 1's own after it: asked for
 * at once (SIGUSR1) and waited for by its id (the next after the cut's part), not left to its 1 s
 * timer behind a fixed sleep, which a sanitizer build's 60-step job on a fast machine outran (the
 * workers were done before the fault). */
static void fault_after_cut(cluster_t *c, pw_coord_t *co, const char *job, const char *latest) {
    wait_step(co, job, CKPT_EVERY + 2);
    assert_int_equal(access(latest, F_OK), 0);
    char dir[400], next[800];
    snprintf(dir, sizeof dir, "%.*s", (int)(strlen(latest) - strlen("/LATEST")), latest);
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    float st[1];
    assert_int_equal(pw_jobckpt_read_latest(dir, ck, st, 1), PC_EDIM); /* the manifest only */
    snprintf(next, sizeof next, "%s/ckpt-%020llu", pw_jobckpt_server_dir(ck, 1),
             (unsigned long long)ck->servers[1] + 1);
    free(ck);
    assert_int_equal(kill(c->s1, SIGUSR1), 0);
    const double t0 = pu_now();
    while (access(next, F_OK) != 0 && pu_now() - t0 < 30)
        usleep(5000);
    assert_int_equal(access(next, F_OK), 0);
    server1_restart(c, 300000);
}

/* With a cut after every step: server 1 killed and restarted at 30% of the job, so a step's pushes
 * (their parts not sent yet) land on its older rows and the next cut follows at once, before the
 * step loop looks for lost connections: a checkpoint taken there would record server 1's older
 * rows as the job's (the trainer refuses it: no checkpoint after a lost connection, none
 * published when a server restarted while it was taken). */
static void fault_at_cut(cluster_t *c, pw_coord_t *co, const char *job, const char *latest) {
    wait_step(co, job, RROWS / RB * 3 / 10);
    assert_int_equal(access(latest, F_OK), 0);
    server1_restart(c, 100000);
}

/* A server killed with -9 and restarted while the job runs (fault), with
 * --on-server-loss=rollback: it comes back from a periodic checkpoint of its own (not the job's
 * cut); the workers notice the lost connection and roll the whole job back to the latest
 * coordinated checkpoint (every server restores its part through gRPC Restore, every worker
 * takes the dense state and its position) and finish where an uninterrupted run does: the same
 * test AUC to the last bit (rows, optimizer states, dense model and positions all restored
 * exactly). */
static void server_rollback_run(void (*fault)(cluster_t *, pw_coord_t *, const char *,
                                              const char *),
                                const char *what, int ckpt_every) {
    recovery_data();
    cluster_t c;
    cluster_start(&c, RTABLE, true);
    pw_coord_t *co = coord_of(&c);
    ckjob_t k;
    ckjob_init(&k, &c, "liveckpt");
    char every[32];
    snprintf(every, sizeof every, "--ckpt-every=%d", ckpt_every);
    rjob_t j = {.c = &c,
                .job = "liverb",
                .policy = "wait",
                .rejoin_ms = 20000,
                .extra = {k.ckd, k.grpc, every, "--on-server-loss=rollback", "--log-level=warn"}};
    char err[2][300];
    snprintf(j.out[0], sizeof j.out[0], "%s/lr0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/lr1.json", g_dir);
    snprintf(err[0], sizeof err[0], "%s/lr0.log", g_dir);
    snprintf(err[1], sizeof err[1], "%s/lr1.log", g_dir);
    j.err = err[0];
    j.err1 = err[1];
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    fault(&c, co, j.job, k.latest);
    const bool up = running(p0) && running(p1);
    if (!up) {
        print_message("a worker ended before the fault was over; the workers' warnings and "
                      "summaries:\n");
        for (int r = 0; r < 2; r++) {
            print_file(err[r]);
            print_file(j.out[r]);
        }
    }
    assert_true(up);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    const double auc = json_num(j.out[0], "auc"), base = base_auc();
    print_message("%s, the job rolled back (%.0f, %.0f rollbacks): AUC %.8f (uninterrupted "
                  "%.8f), %.0f steps\n",
                  what, json_num(j.out[0], "rollbacks"), json_num(j.out[1], "rollbacks"), auc, base,
                  json_num(j.out[0], "steps"));
    assert_true(json_num(j.out[0], "rollbacks") >= 1 && json_num(j.out[1], "rollbacks") >= 1);
    assert_true(json_num(j.out[0], "steps") == RROWS / RB);
    assert_true(json_num(j.out[1], "steps") == RROWS / RB);
    /* samples are what the model holds: each share once (the steps rolled back not counted) */
    print_message("samples %.0f, %.0f\n", json_num(j.out[0], "samples"),
                  json_num(j.out[1], "samples"));
    assert_true(json_num(j.out[0], "samples") == RROWS && json_num(j.out[1], "samples") == RROWS);
    /* The checkpoint holds every bit the job's model depends on, so the run ends with the model
     * of one never interrupted (workers push rank by rank). Once in CI (2026-11-27) it did not
     * (0.77181 against 0.77398) before the trainer refused cuts taken after a server's restart
     * (test_server_restart_at_cut: 0.77433 without that): the workers' warnings say what
     * happened when it is not exact. */
    if (auc != base) {
        print_message("NOT EXACT: AUC %.8f against %.8f; the workers' warnings:\n", auc, base);
        for (int r = 0; r < 2; r++)
            print_file(err[r]);
    }
    assert_true(auc == base);
    pw_coord_close(co);
    cluster_down(&c);
}

static void test_server_rollback(void **state) {
    (void)state;
    server_rollback_run(fault_after_cut, "server 1 killed and restarted", CKPT_EVERY);
}

static void test_server_restart_at_cut(void **state) {
    (void)state;
    server_rollback_run(fault_at_cut, "server 1 restarted with a cut after every step", 1);
}

/* The whole job rolled back: workers take coordinated checkpoints every 40 steps; after one,
 * both workers and both servers are killed with -9; the servers start from the checkpoint's
 * ids (--restore-id), the workers with --resume=checkpoint: each reads its data from the
 * checkpoint's position exactly once and the result is an uninterrupted run's, bit for bit. */
static void test_job_rollback(void **state) {
    (void)state;
    recovery_data();
    cluster_t c;
    cluster_up(&c, RTABLE);
    char out[2][300];
    ckjob_t k;
    ckjob_init(&k, &c, "jobckpt");
    const char *dir = k.dir;
    rjob_t j = {.c = &c,
                .job = "rollback",
                .policy = "wait",
                .rejoin_ms = 20000,
                .extra = {k.ckd, k.grpc, "--ckpt-every=40", NULL}};
    snprintf(j.out[0], sizeof j.out[0], "%s/rb0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/rb1.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    const double t0 = pu_now();
    while (access(k.latest, F_OK) != 0 && pu_now() - t0 < 60)
        usleep(5000);
    assert_int_equal(access(k.latest, F_OK), 0);
    kill(p0, SIGKILL);
    kill(p1, SIGKILL);
    kill(c.s0, SIGKILL);
    kill(c.s1, SIGKILL);
    assert_int_equal(pu_reap(p0, 10), 128 + SIGKILL);
    assert_int_equal(pu_reap(p1, 10), 128 + SIGKILL);
    pu_reap(c.s0, 10);
    pu_reap(c.s1, 10);
    /* The latest checkpoint's manifest (a later one may have been written meanwhile). */
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    float *st = malloc(1 << 22);
    assert_int_equal(pw_jobckpt_read_latest(dir, ck, st, 1), PC_EDIM);
    assert_true(ck->nservers == 2 && ck->nranks == 2 && ck->step % 40 == 0);
    print_message("rolled back to step %llu: server checkpoints %llu, %llu; positions %llu, "
                  "%llu\n",
                  (unsigned long long)ck->step, (unsigned long long)ck->servers[0],
                  (unsigned long long)ck->servers[1], (unsigned long long)ck->positions[0],
                  (unsigned long long)ck->positions[1]);
    assert_true(ck->positions[0] == ck->step * RB && ck->positions[1] == ck->step * RB);
    /* The step is a model version: its card, its dense model (loads into the model the card
     * describes), and where each server's checkpoint is (the one the manifest names is there). */
    char vpath[600], why[256];
    pw_model_card_t card;
    snprintf(vpath, sizeof vpath, "%s/step-%020llu/card", dir, (unsigned long long)ck->step);
    assert_int_equal(pw_model_card_read(vpath, &card, why, sizeof why), 0);
    assert_string_equal(card.table_name, "emb");
    pw_model_t *vm;
    assert_int_equal(pw_model_create(&card.model, pw_backend_cpu(), &vm), 0);
    snprintf(vpath, sizeof vpath, "%s/step-%020llu/model", dir, (unsigned long long)ck->step);
    assert_int_equal(pw_model_load(vm, vpath), 0);
    pw_model_destroy(vm);
    for (size_t i = 0; i < ck->nservers; i++) {
        const char *sd = pw_jobckpt_server_dir(ck, i);
        print_message("server %zu: checkpoint %llu in %s\n", i, (unsigned long long)ck->servers[i],
                      sd);
        snprintf(vpath, sizeof vpath, "%s/ckpt-%020llu", sd, (unsigned long long)ck->servers[i]);
        assert_true(sd[0] == '/' && access(vpath, F_OK) == 0);
    }
    /* a later step renamed into place before LATEST named it (a crash in between): the resumed
     * job removes it, as a rollback does (it stayed the newest model version) */
    char later[600];
    snprintf(later, sizeof later, "%s/step-%020llu", dir, (unsigned long long)ck->step + 40000);
    assert_int_equal(mkdir(later, 0755), 0);
    start_server0(&c, ck->servers[0]);
    start_server1(&c, ck->servers[1]);
    ckjob_init(&k, &c, "jobckpt");       /* the servers' new gRPC ports */
    j.extra[2] = "--ckpt-every=1000000"; /* (its next checkpoint would prune it anyway) */
    j.extra[3] = "--resume=checkpoint";
    snprintf(out[0], sizeof out[0], "%s/rb0b.json", g_dir);
    snprintf(out[1], sizeof out[1], "%s/rb1b.json", g_dir);
    p0 = rworker(&j, 0, out[0]);
    p1 = rworker(&j, 1, out[1]);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    const double auc = json_num(out[0], "auc"), base = base_auc();
    print_message("after the rollback: AUC %.8f (uninterrupted %.8f), %.0f steps\n", auc, base,
                  json_num(out[0], "steps"));
    for (int r = 0; r < 2; r++)
        assert_true(json_num(out[r], "samples") + (double)ck->positions[r] == RROWS);
    assert_true(json_num(out[0], "steps") == RROWS / RB);
    assert_true(auc == base); /* as in test_server_rollback: the same model, bit for bit */
    assert_int_equal(access(later, F_OK), -1);
    /* A damaged dense state is refused (checksum), not loaded. */
    pw_jobckpt_read_latest(dir, ck, st, 1);
    char path[400];
    snprintf(path, sizeof path, "%s/step-%020llu/dense.state", dir, (unsigned long long)ck->step);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const size_t nfloats = ((size_t)ftell(f) - 24) / sizeof(float);
    assert_true(nfloats < (1 << 20));
    assert_int_equal(pw_jobckpt_read_latest(dir, ck, st, nfloats), 0);
    fseek(f, 100, SEEK_SET);
    const int byte = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(byte ^ 0xff, f);
    fclose(f);
    assert_int_equal(pw_jobckpt_read_latest(dir, ck, st, nfloats), PC_ECORRUPT);
    free(ck);
    free(st);
    cluster_down(&c);
}

/* The table's delta-stream bounds on server i now (psc_deltas with cap 0). */
static psc_stream_t stream_bounds(psc_t *ps, uint32_t i) {
    psc_stream_req_t q = {.server = i, .table = "emb", .dim = 16};
    psc_stream_t st;
    char why[256];
    const int rc = psc_deltas(ps, &q, &st, why, sizeof why);
    if (rc)
        fail_msg("bounds of server %u: %s: %s", i, pc_err_name(rc), why);
    return st;
}

/* Dense models published for serving while 2 workers train in sync (--publish-dir, every 10
 * steps): each version's card reads and its model loads; its watermark names the table and
 * both servers in map order with the table's uid; heads never go back from one version to the
 * next; and the last version (published at the end, after every push was acknowledged) holds
 * exactly the servers' final heads. The servers keep change logs (started by a follower's first
 * DELTAS before training), so the heads move. Rank 0, which publishes, runs out of data early:
 * its versions stay on schedule while rank 1 trains on (it published none after its last step). */
static void test_publish_watermark(void **state) {
    (void)state;
    g_server_extra = "--delta-log-entries=1048576";
    cluster_t c;
    cluster_up(&c, TABLE);
    g_server_extra = NULL;
    psc_t *ps;
    psc_opts_t po = {.servers = c.map, .timeout_ms = 10000};
    assert_int_equal(psc_connect(&po, &ps), 0);
    uint64_t keys[4];
    uint8_t found[4];
    float rows[4 * 16];
    for (uint32_t i = 0; i < 2; i++) { /* a follower starts each server's log */
        psc_stream_req_t q = {.server = i,
                              .table = "emb",
                              .dim = 16,
                              .cap = 4,
                              .keys = keys,
                              .found = found,
                              .rows = rows};
        psc_stream_t st;
        const int rc = psc_deltas(ps, &q, &st, NULL, 0);
        assert_true(rc == 0 || rc == PC_ERANGE);
    }
    char srv[64], coord[64], pub[320], parts[640], test[320], batch[32], o0[300], o1[300];
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", c.p0);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", c.grpc0);
    snprintf(pub, sizeof pub, "--publish-dir=%s/pub", g_dir);
    snprintf(parts, sizeof parts, "--train=%s,%s", g_p0, g_p1);
    snprintf(test, sizeof test, "--test=%s", g_test);
    snprintf(batch, sizeof batch, "--batch=%d", B);
    snprintf(o0, sizeof o0, "%s/pub0.json", g_dir);
    snprintf(o1, sizeof o1, "%s/pub1.json", g_dir);
    char early[64]; /* rank 0, the publisher, runs out of data at a third of its share */
    snprintf(early, sizeof early, "--max-samples=%d", ROWS / 6);
    const char *w0[] = {
        srv,   coord, "--world=2",          "--rank=0",           parts,           test,
        batch, pub,   "--publish-every=10", "--publish-keep=100", "--job=publish", early,
        NULL};
    const char *w1[] = {
        srv,   coord, "--world=2",          "--rank=1",           parts,           test,
        batch, pub,   "--publish-every=10", "--publish-keep=100", "--job=publish", NULL};
    pid_t r0 = worker(w0, o0), r1 = worker(w1, o1);
    assert_int_equal(pu_reap(r0, 120), 0);
    assert_int_equal(pu_reap(r1, 120), 0);
    const uint64_t steps = (uint64_t)json_num(o0, "steps");
    psc_stream_t end[2] = {stream_bounds(ps, 0), stream_bounds(ps, 1)};
    print_message("%llu steps; servers' final heads %llu, %llu (uids %llu, %llu)\n",
                  (unsigned long long)steps, (unsigned long long)end[0].head,
                  (unsigned long long)end[1].head, (unsigned long long)end[0].uid,
                  (unsigned long long)end[1].uid);
    assert_true(end[0].head > 0 && end[1].head > 0);
    uint64_t prev[2] = {0, 0}, nversions = 0, last = 0;
    for (uint64_t s = 1; s <= steps; s++) {
        char path[600], why[256], *text;
        snprintf(path, sizeof path, "%s/pub/dense-%020llu/watermark", g_dir, (unsigned long long)s);
        if (pc_fs_read_all(path, 1 << 16, &text, NULL))
            continue;
        assert_true(s % 10 == 0 || s == steps); /* on schedule, or the final one */
        nversions++;
        last = s;
        unsigned long long idx[2], uid[2], head[2];
        char table[64];
        assert_int_equal(sscanf(text,
                                "emberps-watermark 1\ntable %63s\nserver %llu %llu %llu\n"
                                "server %llu %llu %llu\n",
                                table, &idx[0], &uid[0], &head[0], &idx[1], &uid[1], &head[1]),
                         7);
        free(text);
        assert_string_equal(table, "emb");
        for (int i = 0; i < 2; i++) {
            assert_true(idx[i] == (unsigned long long)i && uid[i] == end[i].uid);
            assert_true(head[i] >= prev[i] && head[i] <= end[i].head);
            prev[i] = head[i];
        }
        pw_model_card_t card;
        snprintf(path, sizeof path, "%s/pub/dense-%020llu/card", g_dir, (unsigned long long)s);
        assert_int_equal(pw_model_card_read(path, &card, why, sizeof why), 0);
        assert_int_equal(card.model.max_batch, B);
        pw_model_t *m;
        assert_int_equal(pw_model_create(&card.model, pw_backend_cpu(), &m), 0);
        snprintf(path, sizeof path, "%s/pub/dense-%020llu/model", g_dir, (unsigned long long)s);
        assert_int_equal(pw_model_load(m, path), 0);
        pw_model_destroy(m);
    }
    print_message("%llu versions, the last of step %llu: heads %llu, %llu\n",
                  (unsigned long long)nversions, (unsigned long long)last,
                  (unsigned long long)prev[0], (unsigned long long)prev[1]);
    assert_true(last == steps && nversions == steps / 10 + (steps % 10 != 0));
    assert_true(prev[0] == end[0].head && prev[1] == end[1].head);
    psc_close(ps);
    cluster_down(&c);
}

/* Steps of a --step-log file: start[r] and end[r] (ns, 0 when absent) for rounds < cap. */
static void read_step_log(const char *path, uint64_t *start, uint64_t *end, size_t cap) {
    memset(start, 0, cap * sizeof *start);
    memset(end, 0, cap * sizeof *end);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int rank;
    unsigned long long round, ns;
    char what[8];
    while (fscanf(f, "%d %llu %7s %llu", &rank, &round, what, &ns) == 4)
        if (round < cap)
            (strcmp(what, "start") == 0 ? start : end)[round] = ns;
    fclose(f);
}

/* The SSP bound from both workers' step logs: when a worker starts step r, every worker has
 * ended steps 0 .. r - S - 1 (so it is at most S steps ahead of the slowest). Returns the most
 * steps any worker was ahead of the slowest when it started a step. */
static int ssp_check(const char *log0, const char *log1, int S, int min_starts) {
    enum { CAP = 4096 };
    static uint64_t st[2][CAP], en[2][CAP];
    read_step_log(log0, st[0], en[0], CAP);
    read_step_log(log1, st[1], en[1], CAP);
    int most = 0, starts = 0;
    for (int a = 0; a < 2; a++)
        for (int r = 0; r < CAP; r++) {
            if (!st[a][r])
                continue;
            starts++;
            for (int b = 0; b < 2; b++) {
                int done = 0; /* steps of b ended before a started r */
                while (done < CAP && en[b][done] && en[b][done] <= st[a][r])
                    done++;
                if (r - done > most)
                    most = r - done;
                if (r - S - 1 >= 0)
                    assert_true(en[b][r - S - 1] && en[b][r - S - 1] <= st[a][r]);
            }
        }
    assert_true(starts >= min_starts);
    return most;
}

static void test_consistency_modes(void **state) {
    (void)state;
    const double auc0 = base_auc();
    /* async: pulls ahead, pushes not awaited, dense rounds applied up to 2 late; converges to
     * about the sync model (200 steps: staleness costs about 0.01 AUC) */
    cluster_t c;
    cluster_up(&c, RTABLE);
    rjob_t j = {.c = &c, .job = "async", .policy = "wait", .rejoin_ms = 5000};
    j.extra[0] = "--mode=async";
    snprintf(j.out[0], sizeof j.out[0], "%s/as0.json", g_dir);
    snprintf(j.out[1], sizeof j.out[1], "%s/as1.json", g_dir);
    pid_t p0 = rworker(&j, 0, j.out[0]), p1 = rworker(&j, 1, j.out[1]);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    const double auc_async = json_num(j.out[0], "auc");
    assert_true(json_num(j.out[0], "samples") == RROWS);
    assert_true(json_num(j.out[1], "samples") == RROWS);
    cluster_down(&c);
    /* ssp:2 with a straggler: rank 0 takes batches of RB, rank 1 of RB / 8, so rank 1 keeps
     * running into the bound; the logs show it never passes it */
    cluster_up(&c, RTABLE);
    enum { S = 2 };
    char log0[300], log1[300], l0[320], l1[320], small[32];
    snprintf(log0, sizeof log0, "%s/ssp0.log", g_dir);
    snprintf(log1, sizeof log1, "%s/ssp1.log", g_dir);
    snprintf(l0, sizeof l0, "--step-log=%s", log0);
    snprintf(l1, sizeof l1, "--step-log=%s", log1);
    snprintf(small, sizeof small, "--batch=%d", RB / 8);
    unlink(log0);
    unlink(log1);
    rjob_t k = {.c = &c, .job = "ssp", .policy = "wait", .rejoin_ms = 5000};
    k.extra[0] = "--mode=ssp:2";
    snprintf(k.out[0], sizeof k.out[0], "%s/ssp0.json", g_dir);
    snprintf(k.out[1], sizeof k.out[1], "%s/ssp1.json", g_dir);
    k.extra[1] = l0;
    p0 = rworker(&k, 0, k.out[0]);
    k.extra[1] = l1;
    k.extra[2] = small;
    p1 = rworker(&k, 1, k.out[1]);
    assert_int_equal(pu_reap(p0, 120), 0);
    assert_int_equal(pu_reap(p1, 120), 0);
    cluster_down(&c);
    const double auc_ssp = json_num(k.out[0], "auc");
    const int most = ssp_check(log0, log1, S, 100);
    const double ahead0 = json_num(k.out[0], "max_ahead"), ahead1 = json_num(k.out[1], "max_ahead");
    print_message("sync AUC %.5f, async %.5f, ssp:%d with a straggler %.5f; most steps ahead of "
                  "the slowest (logs) %d, reported by the workers %.0f, %.0f\n",
                  auc0, auc_async, S, auc_ssp, most, ahead0, ahead1);
    assert_true(fabs(auc_async - auc0) < ASYNC_TOL);
    assert_true(auc_ssp > AUC_MIN);
    assert_true(json_num(k.out[1], "samples") == RROWS);
    assert_int_equal(most, S); /* bounded, and the bound was reached */
    assert_true(ahead0 <= S && ahead1 <= S && ahead1 >= 1);
}

/* Whether name matches one of the comma-separated patterns of list. */
static bool name_chosen(const char *name, const char *list) {
    char pat[256];
    for (const char *p = list; *p;) {
        const size_t len = strcspn(p, ",");
        snprintf(pat, sizeof pat, "%.*s", (int)len, p);
        if (fnmatch(pat, name, 0) == 0)
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

int main(int argc, char **argv) {
    pc_log_set_level(PC_LOG_ERROR);
    pu_bin = argc > 1 ? argv[1] : "build/bin/ps-server";
    g_worker = argc > 2 ? argv[2] : "build/bin/ps-worker";
    const char *slash = strrchr(pu_bin, '/');
    snprintf(g_psctl, sizeof g_psctl, "%.*spsctl", slash ? (int)(slash - pu_bin + 1) : 0, pu_bin);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_equivalence),
        cmocka_unit_test(test_unequal_data_and_errors),
        cmocka_unit_test(test_idle_member_rate),
        cmocka_unit_test(test_push_refused),
        cmocka_unit_test(test_push_order_three_workers),
        cmocka_unit_test(test_worker_restart),
        cmocka_unit_test(test_all_restarted),
        cmocka_unit_test(test_misconfigured_rejoin),
        cmocka_unit_test(test_eval_longer_than_timeout),
        cmocka_unit_test(test_eval_regroup_after_eval),
        cmocka_unit_test(test_worker_lost),
        cmocka_unit_test(test_server_restart),
        cmocka_unit_test(test_primary_kill_with_replicas),
        cmocka_unit_test(test_unclean_promotion_told),
        cmocka_unit_test(test_reshard_mid_training),
        cmocka_unit_test(test_job_rollback),
        cmocka_unit_test(test_consistency_modes),
        cmocka_unit_test(test_worker_hung),
        cmocka_unit_test(test_worker_replaced),
        cmocka_unit_test(test_server_rollback),
        cmocka_unit_test(test_server_restart_at_cut),
        cmocka_unit_test(test_publish_watermark),
    };
    /* argv[3]: the scenarios to run, a comma-separated list of names or patterns (fnmatch);
     * ctest runs them in parts (tests/CMakeLists.txt), so its summary names the part that failed */
    struct CMUnitTest chosen[sizeof tests / sizeof tests[0]];
    size_t n = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (argc <= 3 || name_chosen(tests[i].name, argv[3]))
            chosen[n++] = tests[i];
    if (!n) {
        fprintf(stderr, "test_dist: no scenario matches %s\n", argv[3]);
        return 2;
    }
    return _cmocka_run_group_tests("test_dist", chosen, n, setup, teardown);
}
