/* bench_dist.c: `ps-bench dist`: training against a ps-server process vs the same model local.
 *
 * ps-datagen data (300k rows; --quick 100k, --smoke 10k; --keys sets it), the DLRM
 * (26 fields, dim 16, 13-64-16, 128-64-1, batch 1024, Adagrad table). The worker (this process:
 * its training and reader threads, the scheduler's threads and libpsclient's I/O thread) runs
 * pinned to CPU 1, a ps-server (one event loop) pinned to CPU 0; the baseline is the same
 * training with the table in process, also on CPU 1. Figures: local_samples_per_s;
 * dist_sync_samples_per_s (sync: every pull waits for the previous step's push); and
 * dist_samples_per_s in async mode (rows of the next 2 batches pulled while one computes,
 * pushes not awaited); dist_vs_local = async / local. The two sides do not use the same CPUs:
 * the server's core does the table's work of the distributed runs, which the local run does on
 * the worker's core, so above 1 is the second core's share, not communication hidden alone.
 *
 * Priority vs FIFO under a bandwidth limit (root only: `ip netns`, `tc`): the server runs in a
 * network namespace of its own behind a veth pair shaped by tc tbf on both ends to about the
 * bytes per second the async run moved at local speed (so the link is the scarce resource), and
 * the async run is repeated with --order=fifo and =priority (credits 256 KiB, chunks 64 KiB, so
 * the order is decided in the scheduler, not in socket buffers), 3 times each order, alternating,
 * a fresh server each; twice: with the pulls just in time (--pull-ahead=0: the pull of the next
 * batch is queued after the pushes of the step before, the case priority scheduling is for) and
 * 2 batches ahead (the default: pulls queued before those pushes anyway). priority_vs_fifo =
 * median priority samples/s / median FIFO samples/s with pulls just in time,
 * priority_vs_fifo_ahead2 the same with pulls ahead; the pull stalls are printed. Without root
 * the figures are reported as skipped with the reason; --smoke skips them (a run of this phase
 * did not finish twice: the cause is not found yet).
 *
 * Then a worker restart: two ps-worker processes (world 2, sync, unpinned) train against the
 * same server (also the coordinator); once rank 1 has taken 10 steps (a third of its share when
 * that is fewer) it is killed with SIGKILL and started again at once. restart_first_step_s: from
 * the new process's start to its first completed step (its JSON: connecting, rejoining the group,
 * taking the dense state, reading from its position, one step); restart_wall_s: from the spawn
 * until the coordinator records its first new step (adds exec and the poll, 5 ms).
 *
 * Compressed rows (docs/wire.md): the same model trained against the server with rows and
 * gradients on the wire in f32, bf16 and f16 (--wire-dtype; sync, so each run is deterministic and
 * any difference is the rounding's), on ps-datagen data of the same size with a quarter as many
 * test rows, two rounds in alternating order (f32 bf16 f16, f16 bf16 f32), a fresh table each run.
 * auc_bf16_minus_f32 and auc_f16_minus_f32: the test AUC of each type minus f32's (means over the
 * rounds; the goal is >= -0.001); sync_bf16_vs_f32 and sync_f16_vs_f32: mean samples/s against
 * f32's.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_fs.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_coord_client.h"
#include "pw_datagen.h"
#include "pw_train.h"

/* The AUC and speed of training against the server in each wire type (see the file's comment). */
typedef struct wire_auc {
    double auc[3], sps[3]; /* by PSC_WIRE_*: mean test AUC, mean samples/s over the rounds */
    double auc_spread;     /* the largest difference between two rounds of one type */
} wire_auc_t;

static int measure_wire_types(const pw_train_config_t *base, int port, const char *dir, uint64_t n,
                              wire_auc_t *out) {
    static const char *const names[3] = {"f32", "bf16", "f16"};
    char tr[300], te[300];
    snprintf(tr, sizeof tr, "%s/auc-train.tsv", dir);
    snprintf(te, sizeof te, "%s/auc-test.tsv", dir);
    pw_datagen_opts_t go;
    pw_datagen_defaults(&go);
    go.rows = (int64_t)n;
    go.test_rows = (int64_t)(n / 4);
    FILE *ft = fopen(tr, "w"), *fe = fopen(te, "w");
    if (!ft || !fe || pw_datagen_run(&go, ft, fe, NULL))
        abort();
    fclose(ft);
    fclose(fe);
    pw_train_config_t c = *base;
    snprintf(c.servers, sizeof c.servers, "127.0.0.1:%d", port);
    snprintf(c.mode, sizeof c.mode, "sync");
    const char *trp[] = {tr}, *tep[] = {te};
    enum { ROUNDS = 2 };
    double auc[3][ROUNDS], sps[3][ROUNDS];
    int rc = 0;
    for (int r = 0; r < ROUNDS && !rc; r++)
        for (int i = 0; i < 3 && !rc; i++) {
            const int t = r % 2 ? 2 - i : i; /* f32 bf16 f16, then f16 bf16 f32 */
            c.wire_dtype = t;
            /* a job of its own: --fresh resets a table another job trained (not its own) */
            snprintf(c.job, sizeof c.job, "wire-%s-%d", names[t], r);
            pw_train_result_t res;
            if ((rc = pw_train_run(&c, PW_FMT_CRITEO, trp, 1, tep, 1, &res)))
                break;
            auc[t][r] = res.auc;
            sps[t][r] = res.samples_per_s;
            printf("  wire %-4s round %d: test AUC %.6f, %.0f samples/s\n", names[t], r, res.auc,
                   res.samples_per_s);
        }
    unlink(tr);
    unlink(te);
    if (rc)
        return -1;
    out->auc_spread = 0;
    for (int t = 0; t < 3; t++) {
        out->auc[t] = out->sps[t] = 0;
        for (int r = 0; r < ROUNDS; r++) {
            out->auc[t] += auc[t][r] / ROUNDS;
            out->sps[t] += sps[t][r] / ROUNDS;
            const double d = fabs(auc[t][r] - auc[t][0]);
            out->auc_spread = d > out->auc_spread ? d : out->auc_spread;
        }
    }
    return 0;
}

/* ps-worker rank `rank` of the restart job, its JSON summary to out. */
static int spawn_worker(const char *bin, int port, int grpc, const char *p0, const char *p1,
                        int rank, const char *out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec '%s' --servers=127.0.0.1:%d --coordinator=127.0.0.1:%d --world=2 --rank=%d "
             "--train='%s','%s' --job=restart --fresh --on-worker-loss=wait "
             "--rejoin-timeout-ms=30000 "
             "--log-level=error --progress-every=0 --json > '%s'",
             bin, port, grpc, rank, p0, p1, out);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    const bench_opts_t unpinned = {.pin = false};
    return bench_spawn(&unpinned, argv);
}

/* Rank 1's recorded step in the restart job (-1 while none). */
static long rank1_step(pw_coord_t *co) {
    void *v;
    size_t len;
    long step = -1;
    if (pw_coord_get(co, "restart/run/0/off/1", &v, &len) == 0) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)len, (const char *)v);
        step = strtol(buf, NULL, 10);
        free(v);
    }
    return step;
}

/* Kill rank 1 after kill_at steps and start it again; its start-to-first-step time (JSON) and the
 * wall time until the coordinator saw its new step. 0, or -1 on a failure. */
static int measure_restart(const char *dir, int port, int grpc, const char *p0, const char *p1,
                           long kill_at, double *first_step, double *wall) {
    char wbin[600], out0[300], out1[300], out1b[300], addr[64];
    bench_sibling("ps-worker", wbin, sizeof wbin);
    snprintf(out0, sizeof out0, "%s/w0.json", dir);
    snprintf(out1, sizeof out1, "%s/w1.json", dir);
    snprintf(out1b, sizeof out1b, "%s/w1b.json", dir);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", grpc);
    pw_coord_t *co;
    if (pw_coord_open(addr, NULL, 5000, &co))
        return -1;
    int w0 = spawn_worker(wbin, port, grpc, p0, p1, 0, out0);
    int w1 = spawn_worker(wbin, port, grpc, p0, p1, 1, out1);
    long before = -1;
    for (uint64_t t0 = pc_time_mono_ns(); pc_time_sec_since(t0) < 60 && before < kill_at;
         usleep(5000))
        before = rank1_step(co);
    int rc = before >= kill_at ? 0 : -1;
    kill(w1, SIGKILL);
    waitpid(w1, NULL, 0);
    const uint64_t t1 = pc_time_mono_ns();
    w1 = spawn_worker(wbin, port, grpc, p0, p1, 1, out1b);
    *wall = -1;
    while (!rc && pc_time_sec_since(t1) < 60 && *wall < 0) {
        long now = rank1_step(co);
        if (now > before && now != -1)
            *wall = pc_time_sec_since(t1);
        usleep(5000);
    }
    int st0 = -1, st1 = -1; /* bounded: a rank 1 that never rejoins leaves rank 0 waiting */
    bench_wait_exit(w0, 300, &st0);
    bench_wait_exit(w1, 60, &st1);
    pw_coord_close(co);
    FILE *f = fopen(out1b, "r");
    char buf[4096] = "";
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
        fclose(f);
    }
    cJSON *j = cJSON_Parse(buf);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "first_step_s");
    *first_step = cJSON_IsNumber(k) ? k->valuedouble : -1;
    cJSON_Delete(j);
    return !rc && st0 == 0 && st1 == 0 && *wall >= 0 && *first_step >= 0 ? 0 : -1;
}

/* The bench's namespace: a veth pair, host end 10.213.77.1, namespace end 10.213.77.2, both
 * shaped to mbit. 0, or -1 (with the reason in why) when the system does not allow it. */
static int netns_up(const char *ns, const char *va, const char *vb, double mbit, char *why,
                    size_t cap) {
    if (geteuid() != 0) {
        snprintf(why, cap, "needs root (ip netns, tc)");
        return -1;
    }
    /* tokens for 2 ms at the rate (a timer tick's worth), at least 32 KB */
    const double burst_kb = mbit * 1e6 / 8 * 0.002 / 1000 > 32 ? mbit * 1e6 / 8 * 0.002 / 1000 : 32;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ip netns add %s && ip link add %s type veth peer name %s && "
             "ip link set %s netns %s && ip addr add 10.213.77.1/24 dev %s && ip link set %s up && "
             "ip netns exec %s ip addr add 10.213.77.2/24 dev %s && "
             "ip netns exec %s ip link set %s up && ip netns exec %s ip link set lo up && "
             "tc qdisc add dev %s root tbf rate %.0fkbit burst %.0fkb latency 200ms && "
             "ip netns exec %s tc qdisc add dev %s root tbf rate %.0fkbit burst %.0fkb "
             "latency 200ms",
             ns, va, vb, vb, ns, va, va, ns, vb, ns, vb, ns, va, mbit * 1000, burst_kb, ns, vb,
             mbit * 1000, burst_kb);
    if (system(cmd) != 0) {
        snprintf(why, cap, "ip netns / veth / tc tbf failed (kernel or container limits)");
        return -1;
    }
    return 0;
}

static void netns_down(const char *ns, const char *va) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip link del %s 2>/dev/null; ip netns del %s 2>/dev/null", va, ns);
    if (system(cmd) != 0)
        fprintf(stderr, "ps-bench dist: could not remove namespace %s\n", ns);
}

/* One pull-ahead setting over the shaped link: medians of FIFO and priority runs. */
typedef struct order_pair {
    double fifo, prio, fifo_wait_s, prio_wait_s;
} order_pair_t;

typedef struct shaped {
    double mbit;
    order_pair_t jit, ahead2; /* pulls just in time (--pull-ahead=0), 2 batches ahead */
    char why[128];            /* set when skipped */
} shaped_t;

/* The async run over the shaped link (its namespace up: server at 10.213.77.2), FIFO and
 * priority order alternating, a fresh server each, pulls `ahead` batches ahead. */
static void shaped_pair(const bench_opts_t *o, const pw_train_config_t *base,
                        const char *const *trp, const char *ns, const char *pf, int ahead,
                        order_pair_t *out, char *why, size_t cap) {
    char bin[600], portarg[32], pfarg[320], tables[700];
    bench_sibling("ps-server", bin, sizeof bin);
    snprintf(pfarg, sizeof pfarg, "--port-file=%s", pf);
    snprintf(tables, sizeof tables, "--tables=name=emb,dim=%d,seed=%llu,%s", (int)base->dim,
             (unsigned long long)base->seed, base->table);
    double sps[2][3] = {{0}}, waits[2][3] = {{0}};
    for (int rep = 0; rep < 3 && !why[0]; rep++)
        for (int order = 0; order < 2 && !why[0]; order++) { /* fresh server: same state */
            const int port = bench_free_port();
            snprintf(portarg, sizeof portarg, "--port=%d", port);
            char *sargv[] = {"ip",
                             "netns",
                             "exec",
                             (char *)ns,
                             bin,
                             portarg,
                             pfarg,
                             "--host=10.213.77.2",
                             "--insecure-remote", /* the link reaches only this namespace */
                             "--io-threads=1",
                             "--grpc-port=-1",
                             "--metrics-port=-1",
                             "--log-level=warn",
                             tables,
                             NULL};
            unlink(pf);
            const int ps = bench_spawn(o, sargv);
            if (!bench_wait_file(pf, 10)) {
                snprintf(why, cap, "ps-server did not start in the namespace");
                bench_stop(ps);
                break;
            }
            pw_train_config_t c = *base;
            snprintf(c.servers, sizeof c.servers, "10.213.77.2:%d", port);
            snprintf(c.mode, sizeof c.mode, "async");
            c.pull_ahead = ahead;
            c.order = order == 0 ? PW_ORDER_FIFO : PW_ORDER_PRIORITY;
            c.credit_kib = 256;
            c.chunk_kib = 64;
            c.timeout_ms = 10000;
            pw_train_result_t r;
            if (pw_train_run(&c, PW_FMT_CRITEO, trp, 1, NULL, 0, &r))
                snprintf(why, cap, "training over the shaped link failed");
            sps[order][rep] = r.samples_per_s;
            waits[order][rep] = r.pull_wait_s;
            bench_stop(ps);
        }
    out->fifo = bench_median3(sps[0]);
    out->prio = bench_median3(sps[1]);
    out->fifo_wait_s = bench_median3(waits[0]);
    out->prio_wait_s = bench_median3(waits[1]);
}

static void measure_shaped(const bench_opts_t *o, const pw_train_config_t *base,
                           const char *const *trp, double mbit, shaped_t *out) {
    char ns[32], va[16], vb[16], dir[256], pf[300];
    snprintf(ns, sizeof ns, "emberps-bench-%d", (int)getpid());
    snprintf(va, sizeof va, "eb%da", (int)getpid() % 1000000);
    snprintf(vb, sizeof vb, "eb%db", (int)getpid() % 1000000);
    out->mbit = mbit;
    if (netns_up(ns, va, vb, mbit, out->why, sizeof out->why)) {
        netns_down(ns, va);
        return;
    }
    bench_tmpdir("dist-shaped", dir, sizeof dir);
    snprintf(pf, sizeof pf, "%s/port", dir);
    shaped_pair(o, base, trp, ns, pf, 0, &out->jit, out->why, sizeof out->why);
    shaped_pair(o, base, trp, ns, pf, 2, &out->ahead2, out->why, sizeof out->why);
    unlink(pf);
    rmdir(dir);
    netns_down(ns, va);
}

int bench_dist_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "dist", &o);
    signal(SIGPIPE, SIG_IGN);
    pc_log_set_level(PC_LOG_WARN);
    const uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 10000 : o.quick ? 100000 : 300000;
    char dir[256], tr[300], tr1[300];
    bench_tmpdir("dist", dir, sizeof dir);
    snprintf(tr, sizeof tr, "%s/train-0.tsv", dir);
    snprintf(tr1, sizeof tr1, "%s/train-1.tsv", dir);
    pw_datagen_opts_t go;
    pw_datagen_defaults(&go);
    go.rows = n;
    go.test_rows = 0;
    FILE *ft = fopen(tr, "w");
    if (!ft || pw_datagen_run(&go, ft, NULL, NULL))
        abort();
    fclose(ft);
    go.seed++; /* the second share of the restart run */
    if (!(ft = fopen(tr1, "w")) || pw_datagen_run(&go, ft, NULL, NULL))
        abort();
    fclose(ft);
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    c.local_store = pw_emb_local_open;
    c.fresh = true; /* every run against the server starts from new rows */
    const char *trp[] = {tr};
    /* The server: CPU 0 (bench_spawn pins to the first CPU), the same table as local runs. */
    char tables[700];
    snprintf(tables, sizeof tables, "--tables=name=emb,dim=%d,seed=%llu,%s", (int)c.dim,
             (unsigned long long)c.seed, c.table);
    const char *extra[] = {"--coordinator", tables, NULL};
    int port = 0, grpc = 0;
    const int ps = bench_ps_server(&o, "dist", dir, "server", extra, &port, &grpc);
    if (ps < 0) {
        pc_fs_rm_tree(dir); /* (the two shares: n rows each) */
        return 1;
    }
    bench_pin(&o, 1); /* this thread; the reader and client threads inherit it */
    pw_train_result_t local, sync, dist;
    if (pw_train_run(&c, PW_FMT_CRITEO, trp, 1, NULL, 0, &local))
        abort();
    snprintf(c.servers, sizeof c.servers, "127.0.0.1:%d", port);
    int rc = pw_train_run(&c, PW_FMT_CRITEO, trp, 1, NULL, 0, &sync);
    snprintf(c.mode, sizeof c.mode, "async");
    if (!rc)
        rc = pw_train_run(&c, PW_FMT_CRITEO, trp, 1, NULL, 0, &dist);
    snprintf(c.mode, sizeof c.mode, "sync");
    c.servers[0] = '\0';
    /* the link: the bytes per second the async run moved at local speed */
    shaped_t sh = {0};
    const double bytes_per_sample =
        rc ? 0 : (double)(dist.pulled_bytes + dist.pushed_bytes) / (double)dist.samples;
    if (o.smoke) /* a run of the shaped phase once hung (note of issue 6): not in the suite */
        snprintf(sh.why, sizeof sh.why, "not in --smoke runs");
    else if (!rc)
        measure_shaped(&o, &c, trp, bytes_per_sample * local.samples_per_s * 8 / 1e6, &sh);
    double first_step = -1, wall = -1;
    const long steps = (long)(n / 1024), kill_at = steps / 3 < 1    ? 1
                                                   : steps / 3 > 10 ? 10
                                                                    : steps / 3;
    const int rrc =
        rc ? -1 : measure_restart(dir, port, grpc, tr, tr1, kill_at, &first_step, &wall);
    wire_auc_t wa = {0};
    const int wrc = rc || rrc ? -1 : measure_wire_types(&c, port, dir, n, &wa);
    bench_stop(ps);
    char path[320];
    const char *outs[] = {"w0.json", "w1.json", "w1b.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, outs[i]);
        unlink(path);
    }
    unlink(tr1);
    unlink(tr);
    rmdir(dir);
    if (rc || rrc || wrc) {
        fprintf(stderr, "ps-bench dist: distributed training%s failed\n",
                rc    ? ""
                : rrc ? " with a worker restart"
                      : " with compressed rows");
        return 1;
    }
    const double ratio = dist.samples_per_s / local.samples_per_s;
    printf("ps-bench dist: DLRM (26 fields, dim 16), batch 1024, %llu rows, worker on CPU 1%s, "
           "ps-server on CPU 0\n",
           (unsigned long long)n, o.pin ? "" : " (unpinned)");
    printf("%-40s %12.0f samples/s\n", "local (in-process table)", local.samples_per_s);
    printf("%-40s %12.0f samples/s  (%.2f of local; pull stalls %.2f s)\n",
           "1 worker + 1 server, sync", sync.samples_per_s,
           sync.samples_per_s / local.samples_per_s, sync.pull_wait_s);
    printf("%-40s %12.0f samples/s  (%.2f of local; pull stalls %.2f s)\n",
           "1 worker + 1 server, async (pull ahead 2)", dist.samples_per_s, ratio,
           dist.pull_wait_s);
    if (sh.why[0]) {
        printf("%-40s skipped: %s\n", "priority_vs_fifo", sh.why);
    } else {
        const order_pair_t *pp[] = {&sh.jit, &sh.ahead2};
        const char *what[] = {"priority vs FIFO, pulls just in time",
                              "priority vs FIFO, pulls 2 ahead"};
        for (int i = 0; i < 2; i++)
            printf("%-40s %12.0f vs %.0f samples/s (%.2f; pull stalls %.2f vs %.2f s)\n", what[i],
                   pp[i]->prio, pp[i]->fifo, pp[i]->prio / pp[i]->fifo, pp[i]->prio_wait_s,
                   pp[i]->fifo_wait_s);
        printf("%-40s %12.1f Mbit/s each way (tbf)\n", "  (link)", sh.mbit);
    }
    printf("%-40s %12.3f s  (wall, spawn to recorded step: %.3f s)\n",
           "worker restart to its first step", first_step, wall);
    printf("%-40s %12.6f  (bf16 %.6f, f16 %.6f; rounds differ by up to %.1e)\n",
           "test AUC by wire type, f32", wa.auc[0], wa.auc[1], wa.auc[2], wa.auc_spread);
    printf("%-40s %+12.6f  (f16 - f32 %+.6f; goal >= -0.001)\n", "AUC bf16 - f32",
           wa.auc[1] - wa.auc[0], wa.auc[2] - wa.auc[0]);
    printf("%-40s %12.0f samples/s  (bf16 %.0f, f16 %.0f; bf16 / f32 %.2f)\n",
           "sync by wire type, f32", wa.sps[0], wa.sps[1], wa.sps[2], wa.sps[1] / wa.sps[0]);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "dist");
    cJSON_AddNumberToObject(root, "rows", (double)n);
    cJSON_AddNumberToObject(root, "local_samples_per_s", local.samples_per_s);
    cJSON_AddNumberToObject(root, "dist_samples_per_s", dist.samples_per_s);
    cJSON_AddNumberToObject(root, "dist_sync_samples_per_s", sync.samples_per_s);
    cJSON_AddNumberToObject(root, "dist_vs_local", ratio);
    cJSON_AddNumberToObject(root, "pull_wait_s", dist.pull_wait_s);
    if (sh.why[0]) {
        cJSON_AddStringToObject(root, "priority_vs_fifo_skipped", sh.why);
    } else {
        cJSON_AddNumberToObject(root, "link_mbit", sh.mbit);
        cJSON_AddNumberToObject(root, "fifo_samples_per_s", sh.jit.fifo);
        cJSON_AddNumberToObject(root, "priority_samples_per_s", sh.jit.prio);
        cJSON_AddNumberToObject(root, "priority_vs_fifo", sh.jit.prio / sh.jit.fifo);
        cJSON_AddNumberToObject(root, "fifo_pull_wait_s", sh.jit.fifo_wait_s);
        cJSON_AddNumberToObject(root, "priority_pull_wait_s", sh.jit.prio_wait_s);
        cJSON_AddNumberToObject(root, "priority_vs_fifo_ahead2", sh.ahead2.prio / sh.ahead2.fifo);
    }
    cJSON_AddNumberToObject(root, "restart_first_step_s", first_step);
    cJSON_AddNumberToObject(root, "restart_wall_s", wall);
    cJSON_AddNumberToObject(root, "auc_f32", wa.auc[0]);
    cJSON_AddNumberToObject(root, "auc_bf16", wa.auc[1]);
    cJSON_AddNumberToObject(root, "auc_f16", wa.auc[2]);
    cJSON_AddNumberToObject(root, "auc_bf16_minus_f32", wa.auc[1] - wa.auc[0]);
    cJSON_AddNumberToObject(root, "auc_f16_minus_f32", wa.auc[2] - wa.auc[0]);
    cJSON_AddNumberToObject(root, "auc_round_spread", wa.auc_spread);
    cJSON_AddNumberToObject(root, "sync_bf16_vs_f32", wa.sps[1] / wa.sps[0]);
    cJSON_AddNumberToObject(root, "sync_f16_vs_f32", wa.sps[2] / wa.sps[0]);
    bench_emit_json(&o, root);
    return 0;
}
