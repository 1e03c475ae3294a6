/* bench_serve.c: `ps-bench serve`: a ps-serve replica fed by a real training job, under load.
 *
 * The job first, as tests/integration/serve_e2e.sh runs it: ps-datagen data (40k training rows;
 * --smoke 6k, full 200k; 4096 test rows), 2 ps-servers sharing a cluster map (server 0 the
 * coordinator; table emb, dim 16, Adagrad), a ps-serve replica started before training
 * (--follow=MAP --publish-dir --versions), and 2 sync ps-workers (DLRM: dim 16, 26 fields,
 * 13-64-16, 128-64-1; batch 256) writing coordinated checkpoints every 10 steps (--ckpt-every,
 * --ckpt-dir, --server-grpc: the versions), rank 0 publishing its dense model every 10 steps.
 * Once they end and the replica serves the final model with every source caught up:
 *  1. Predict latency: batches of 32 Criteo lines of the test file (the text the daemon parses,
 *     not keyed samples) at an offered 1,000 requests/s, open loop: 3 client threads (a psg_t
 *     each) send on a fixed schedule and a latency runs from the scheduled send, so queueing
 *     counts. Baseline: Health round trips through the same threads at the same rate.
 *  2. Predict throughput, closed loop (8 threads, one call each at a time), against the same
 *     model in PyTorch (bench/serve_torch.py: the published dense weights loaded into
 *     emberps.dlrm.DLRM, the replica's rows of the samples' keys in an nn.EmbeddingBag padded to
 *     the replica's row count, key -> index by searchsorted; no parsing, no RPC), batch 32,
 *     rounds alternating through pipes; the medians' ratio is predict_vs_torch. The first
 *     batch's scores of both are compared (torch_max_abs_diff).
 *  3. Freshness, with the workers gone: a thread of this process pushes random rows into emb
 *     (libpsclient, batches of 1,000, paced at 150k rows/s) while probes push a new marker key
 *     each (one row, gradient 0.5) and poll the replica's Lookup (gRPC) until the key is there
 *     with a row other than its initial one; a probe's time runs from the push's acknowledgement.
 *     Baseline: the marker push's own round trip. The replica's lag is sampled meanwhile.
 *  4. Version swaps: Predict at 1,000/s as in 1; the p99 of a steady window, then of a window in
 *     which LoadVersion(the one before the newest), LoadVersion(the newest), Follow run back
 *     to back; every failed Predict counted.
 * CPUs (unless --no-pin): the daemon on the first CPU this process may use and this process (the
 * load's threads and gRPC's) on the second, in phases 1, 2 and 4; the torch process runs on the
 * daemon's CPU with one thread, in turns with it, so both get the same one core. The training
 * servers and the workers are never pinned; phase 3 pins nothing (servers, follower, pushes and
 * probes share the machine).
 *
 * DESIGN: every process is started by spawn() into a table of pids (children die with this
 * process: PR_SET_PDEATHSIG) and stopped by stop_all() on every way out; every wait is bounded
 * (the job, the catch-up, each call's deadline). The logs stay in the run's directory, which is
 * removed at the end unless the run failed (the path is printed).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "emberps.pb-c.h"
#include "emberps/psclient.h"
#include "emberps/psgrpc.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_time.h"
#include "pw_parse.h"

enum {
    BATCH = 32,       /* samples per Predict */
    POOL = 4096,      /* test lines the requests cycle through */
    OPEN_THREADS = 3, /* open-loop clients */
    CLOSED_THREADS = 8,
    MAXPROC = 8,
    MAXLAT = 1 << 20,
    DIM = 16,
};

#define SERVING   "/emberps.Serving/"
#define PS_LOOKUP "/emberps.ParameterServer/Lookup"
#define PS_HEALTH "/emberps.ParameterServer/Health"
#define RATE      1000.0 /* offered Predict requests/s */

typedef struct bench {
    const bench_opts_t *o;
    char dir[256], bin[600], map[256], sgrpc[128];
    pid_t pid[MAXPROC];
    const char *pname[MAXPROC];
    int npid, dport[2], gport[2], sport;
    pid_t serve_pid;
    psg_t *admin; /* to ps-serve: status, versions, swaps */
    uint8_t **req;
    size_t *req_len;
    int nreq;
    char **lines;
    size_t nlines;
    uint64_t final_step;
    double secs;
} bench_t;

static double now_s(void) {
    return (double)pc_time_mono_ns() * 1e-9;
}

static void sleep_until(double t) {
    struct timespec ts = {(time_t)t, (long)((t - floor(t)) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ==== processes ============================================================================ */

/* Start argv[0] (a path) with stdout and stderr appended to log, on every CPU this process may
 * use; it dies with this process. Its pid goes into the table under `name`. */
static pid_t spawn(bench_t *b, const char *name, char *const argv[], const char *log) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        cpu_set_t all;
        CPU_ZERO(&all);
        for (int i = 0; i < b->o->ncpu; i++)
            CPU_SET(b->o->cpu[i], &all);
        if (b->o->ncpu)
            sched_setaffinity(0, sizeof all, &all);
        const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        fprintf(stderr, "%s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (b->npid < MAXPROC) {
        b->pname[b->npid] = name;
        b->pid[b->npid++] = pid;
    }
    return pid;
}

/* Forget a pid that was reaped. */
static void forget(bench_t *b, pid_t pid) {
    for (int i = 0; i < b->npid; i++)
        if (b->pid[i] == pid)
            b->pid[i] = 0;
}

/* SIGTERM every process still running, then reap each (SIGKILL after 5 s: bench_stop). */
static void stop_all(bench_t *b) {
    for (int i = 0; i < b->npid; i++)
        if (b->pid[i] > 0)
            kill(b->pid[i], SIGTERM);
    for (int i = 0; i < b->npid; i++)
        if (b->pid[i] > 0)
            bench_stop(b->pid[i]);
    b->npid = 0;
}

/* Every thread of process pid onto the CPUs of mask (a bit per index into o->cpu); no-op
 * without pinning. */
static void pin_proc(const bench_t *b, pid_t pid, unsigned mask) {
    if (!b->o->pin || !b->o->ncpu)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < b->o->ncpu; i++)
        if (mask & (1u << (i < 31 ? i : 31)))
            CPU_SET(b->o->cpu[i], &set);
    if (!CPU_COUNT(&set))
        CPU_SET(b->o->cpu[0], &set);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.')
            sched_setaffinity(atoi(e->d_name), sizeof set, &set);
    if (d)
        closedir(d);
}

/* The CPU masks of the phases: the daemon's CPU (A), this process's (B: A too with one CPU),
 * and all. */
#define CPU_A   1u
#define CPU_ALL 0xffffffffu
static unsigned cpu_b(const bench_t *b) {
    return b->o->ncpu > 1 ? 2u : 1u;
}

/* CPU seconds (user + system) process pid has used so far; 0 when unreadable. */
static double cpu_seconds(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the fields after the command name */
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void print_log_tail(const char *path) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "tail -n 15 '%s' >&2", path);
    fflush(stdout);
    if (system(cmd) != 0)
        fprintf(stderr, "  (no log %s)\n", path);
}

/* ==== gRPC ================================================================================= */

/* Call `path` with a message; the unpacked reply (NULL on failure: *rc the code, logged when
 * say). */
static void *call(psg_t *c, const char *path, const ProtobufCMessage *m,
                  const ProtobufCMessageDescriptor *rd, int timeout_ms, bool say, int *rc) {
    const size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len + 1), *resp = NULL;
    size_t rl = 0;
    char msg[256] = "";
    if (!buf)
        abort();
    protobuf_c_message_pack(m, buf);
    int e = psg_request(c, path, buf, len, timeout_ms, &resp, &rl, NULL, msg, sizeof msg);
    free(buf);
    void *p = NULL;
    if (!e && !(p = protobuf_c_message_unpack(rd, NULL, rl, resp)))
        e = PC_ECORRUPT;
    free(resp);
    if (e && say)
        fprintf(stderr, "ps-bench serve: %s: %s: %s\n", path, pc_err_name(e), msg);
    if (rc)
        *rc = e;
    return p;
}

static Emberps__ServeStatusResponse *serve_status(bench_t *b) {
    Emberps__ServeStatusRequest q = EMBERPS__SERVE_STATUS_REQUEST__INIT;
    return call(b->admin, SERVING "ServeStatus", &q.base,
                &emberps__serve_status_response__descriptor, 10000, false, NULL);
}

/* The largest lag (entries) over the sources, and whether every source follows with lag 0. */
static uint64_t max_lag(const Emberps__ServeStatusResponse *s, bool *caught_up) {
    uint64_t m = 0;
    bool ok = s->n_sources > 0;
    for (size_t i = 0; i < s->n_sources; i++) {
        m = s->sources[i]->lag_entries > m ? s->sources[i]->lag_entries : m;
        ok = ok && s->sources[i]->lag_entries == 0 && !strcmp(s->sources[i]->state, "following");
    }
    if (caught_up)
        *caught_up = ok;
    return m;
}

/* One Predict of request i; 0 or the error. */
static int predict(psg_t *c, const bench_t *b, int i) {
    uint8_t *resp = NULL;
    size_t rl = 0;
    int e = psg_request(c, SERVING "Predict", b->req[i], b->req_len[i], 10000, &resp, &rl, NULL,
                        NULL, 0);
    if (!e) {
        Emberps__PredictResponse *p = emberps__predict_response__unpack(NULL, rl, resp);
        e = p && p->n_scores == BATCH ? 0 : PC_ECORRUPT;
        emberps__predict_response__free_unpacked(p, NULL);
    }
    free(resp);
    return e;
}

static int health(psg_t *c) {
    uint8_t *resp = NULL, none = 0;
    size_t rl = 0;
    int e = psg_request(c, PS_HEALTH, &none, 0, 10000, &resp, &rl, NULL, NULL, 0);
    free(resp);
    return e;
}

static psg_t *client(const bench_t *b) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", b->sport);
    const psg_opts_t go = {.addr = addr, .max_message = 64u << 20};
    psg_t *c = NULL;
    if (psg_create(&go, &c))
        abort();
    return c;
}

/* ==== the job ============================================================================== */

/* Wait (bounded) for a port file with `want` numbers; 0 with them in v, or -1. */
static int read_ports(const char *path, int *v, int want, double secs) {
    for (const double t0 = now_s(); now_s() - t0 < secs; usleep(20000)) {
        FILE *f = fopen(path, "r");
        int got = 0;
        while (f && got < want && fscanf(f, "%d", &v[got]) == 1)
            got++;
        if (f)
            fclose(f);
        if (got == want)
            return 0;
    }
    return -1;
}

/* ps-datagen into dir: train.tsv split in two halves (part-0, part-1) and test.tsv. */
static int make_data(bench_t *b, long rows) {
    char gen[700], rowsarg[48], out[300], tout[300], log[300];
    snprintf(gen, sizeof gen, "%s/ps-datagen", b->bin);
    snprintf(rowsarg, sizeof rowsarg, "--rows=%ld", rows);
    snprintf(out, sizeof out, "--out=%s/train.tsv", b->dir);
    snprintf(tout, sizeof tout, "--test-out=%s/test.tsv", b->dir);
    snprintf(log, sizeof log, "%s/datagen.log", b->dir);
    char *argv[] = {gen, rowsarg, "--test-rows=4096", out, tout, "--seed=7", NULL};
    const pid_t pid = spawn(b, "ps-datagen", argv, log);
    int st = -1;
    if (bench_wait_exit(pid, 600, &st)) /* (killed past ten minutes) */
        fprintf(stderr, "ps-bench serve: ps-datagen ran past 600 s: killed\n");
    forget(b, pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        print_log_tail(log);
        return -1;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/train.tsv", b->dir);
    FILE *in = fopen(path, "r"), *part[2];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/part-%d", b->dir, i);
        part[i] = fopen(path, "w");
    }
    if (!in || !part[0] || !part[1])
        abort();
    char *line = NULL;
    size_t cap = 0;
    for (long n = 0; getline(&line, &cap, in) > 0; n++)
        fputs(line, part[n < rows / 2 ? 0 : 1]);
    free(line);
    fclose(in);
    fclose(part[0]);
    fclose(part[1]);
    return 0;
}

/* 2 ps-servers on one cluster map (as deploy/local-cluster.sh starts them). */
static int start_servers(bench_t *b) {
    const int p[2] = {bench_free_port(), bench_free_port()};
    snprintf(b->map, sizeof b->map,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", p[0], p[1]);
    char mapfile[300];
    snprintf(mapfile, sizeof mapfile, "%s/cluster.map", b->dir);
    FILE *f = fopen(mapfile, "w");
    if (!f)
        abort();
    fprintf(f, "%s\n", b->map);
    fclose(f);
    char bin[700];
    snprintf(bin, sizeof bin, "%s/ps-server", b->bin);
    for (int i = 0; i < 2; i++) {
        char port[32], mf[320], idx[32], ckpt[320], pf[320], log[300];
        snprintf(port, sizeof port, "--port=%d", p[i]);
        snprintf(mf, sizeof mf, "--cluster-map-file=%s", mapfile);
        snprintf(idx, sizeof idx, "--server-index=%d", i);
        snprintf(ckpt, sizeof ckpt, "--ckpt-dir=%s/ckpt-%d", b->dir, i);
        snprintf(pf, sizeof pf, "%s/port-%d", b->dir, i);
        char pfarg[340];
        snprintf(pfarg, sizeof pfarg, "--port-file=%s", pf);
        snprintf(log, sizeof log, "%s/server-%d.log", b->dir, i);
        char *argv[] = {bin,
                        port,
                        "--grpc-port=0",
                        "--metrics-port=-1",
                        mf,
                        idx,
                        "--tables=name=emb,dim=16",
                        ckpt,
                        "--ckpt-interval-s=3600",
                        "--ckpt-keep=100",
                        pfarg,
                        "--log-level=warn",
                        i == 0 ? "--coordinator" : NULL,
                        NULL};
        spawn(b, i ? "ps-server 1" : "ps-server 0", argv, log);
        int v[2];
        if (read_ports(pf, v, 2, 15) || v[0] != p[i]) {
            fprintf(stderr, "ps-bench serve: ps-server %d did not start\n", i);
            print_log_tail(log);
            return -1;
        }
        b->dport[i] = v[0];
        b->gport[i] = v[1];
    }
    snprintf(b->sgrpc, sizeof b->sgrpc, "127.0.0.1:%d,127.0.0.1:%d", b->gport[0], b->gport[1]);
    return 0;
}

/* ps-serve, live: following the servers, the published models and the versions. */
static int start_serve(bench_t *b) {
    char bin[700], follow[300], pub[300], ver[300], pf[300], pfarg[320], log[300];
    snprintf(bin, sizeof bin, "%s/ps-serve", b->bin);
    snprintf(follow, sizeof follow, "--follow=%s", b->map);
    snprintf(pub, sizeof pub, "--publish-dir=%s/publish", b->dir);
    snprintf(ver, sizeof ver, "--versions=%s/jobckpt", b->dir);
    snprintf(pf, sizeof pf, "%s/serve.port", b->dir);
    snprintf(pfarg, sizeof pfarg, "--port-file=%s", pf);
    snprintf(log, sizeof log, "%s/serve.log", b->dir);
    char *argv[] = {
        bin, follow, pub, ver, "--grpc-port=0", "--metrics-port=-1", pfarg, "--log-level=warn",
        NULL};
    b->serve_pid = spawn(b, "ps-serve", argv, log);
    int v[2];
    if (read_ports(pf, v, 2, 30)) {
        fprintf(stderr, "ps-bench serve: ps-serve did not start\n");
        print_log_tail(log);
        return -1;
    }
    b->sport = v[0];
    b->admin = client(b);
    return 0;
}

/* The 2 workers, sync, coordinated checkpoints and publishing (rank 0); waits for both (bounded).
 * Returns the training's wall seconds, or -1. */
static double train(bench_t *b, int ckpt_every, double limit_s) {
    char bin[700], srv[300], coord[64], data[640], ckd[300], sg[160];
    snprintf(bin, sizeof bin, "%s/ps-worker", b->bin);
    snprintf(srv, sizeof srv, "--servers=%s", b->map);
    snprintf(coord, sizeof coord, "--coordinator=127.0.0.1:%d", b->gport[0]);
    snprintf(data, sizeof data, "--train=%s/part-0,%s/part-1", b->dir, b->dir);
    snprintf(ckd, sizeof ckd, "--ckpt-dir=%s/jobckpt", b->dir);
    snprintf(sg, sizeof sg, "--server-grpc=%s", b->sgrpc);
    char pub[300], every[48];
    snprintf(pub, sizeof pub, "--publish-dir=%s/publish", b->dir);
    snprintf(every, sizeof every, "--ckpt-every=%d", ckpt_every);
    pid_t w[2];
    char log[2][300];
    const double t0 = now_s();
    for (int r = 1; r >= 0; r--) {
        char rank[16];
        snprintf(rank, sizeof rank, "--rank=%d", r);
        snprintf(log[r], sizeof log[r], "%s/worker-%d.log", b->dir, r);
        char *argv[] = {bin,
                        srv,
                        coord,
                        "--world=2",
                        rank,
                        data,
                        "--job=bench-serve",
                        "--batch=256",
                        "--device=cpu",
                        "--progress-every=0",
                        every,
                        ckd,
                        sg,
                        "--log-level=warn",
                        "--publish-every=10",
                        r == 0 ? pub : NULL, /* rank 0 publishes */
                        NULL};
        w[r] = spawn(b, r ? "ps-worker 1" : "ps-worker 0", argv, log[r]);
    }
    int left = 2, bad = 0;
    bool done[2] = {false, false};
    while (left && now_s() - t0 < limit_s) { /* (the workers only: the daemons stay spawned) */
        bool any = false;
        for (int r = 0; r < 2; r++) {
            int st;
            if (done[r] || waitpid(w[r], &st, WNOHANG) != w[r])
                continue;
            done[r] = any = true;
            forget(b, w[r]);
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st)) {
                fprintf(stderr, "ps-bench serve: ps-worker rank %d failed (status %d)\n", r,
                        WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
                print_log_tail(log[r]);
                bad = 1;
            }
        }
        if (!any)
            usleep(50000);
    }
    if (left)
        fprintf(stderr, "ps-bench serve: training did not end in %.0f s\n", limit_s);
    return left || bad ? -1 : now_s() - t0;
}

/* The newest dense-<S> of the publish directory (0: none). */
static uint64_t newest_published(const bench_t *b) {
    char path[300];
    snprintf(path, sizeof path, "%s/publish", b->dir);
    DIR *d = opendir(path);
    struct dirent *e;
    uint64_t best = 0;
    while (d && (e = readdir(d))) {
        unsigned long long s;
        char tail;
        if (sscanf(e->d_name, "dense-%llu%c", &s, &tail) == 1 && s > best)
            best = s;
    }
    if (d)
        closedir(d);
    return best;
}

/* Wait (bounded) until the replica serves the final model with every source caught up. */
static int wait_caught_up(bench_t *b, double secs) {
    b->final_step = newest_published(b);
    for (const double t0 = now_s(); now_s() - t0 < secs; usleep(50000)) {
        Emberps__ServeStatusResponse *s = serve_status(b);
        bool ok = false;
        if (s) {
            max_lag(s, &ok);
            ok = ok && s->model_version == b->final_step && !s->pinned;
            emberps__serve_status_response__free_unpacked(s, NULL);
        }
        if (ok)
            return 0;
    }
    fprintf(stderr, "ps-bench serve: the replica did not catch up with model %llu in %.0f s\n",
            (unsigned long long)b->final_step, secs);
    return -1;
}

/* ==== Predict requests ===================================================================== */

/* The first POOL test lines, packed as Predict requests of BATCH lines each. */
static int make_requests(bench_t *b) {
    char path[300];
    snprintf(path, sizeof path, "%s/test.tsv", b->dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    b->lines = calloc(POOL, sizeof *b->lines);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (b->nlines < POOL && (n = getline(&line, &cap, f)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        b->lines[b->nlines++] = strdup(line);
    }
    free(line);
    fclose(f);
    b->nreq = (int)(b->nlines / BATCH);
    b->req = calloc((size_t)b->nreq, sizeof *b->req);
    b->req_len = calloc((size_t)b->nreq, sizeof *b->req_len);
    for (int i = 0; i < b->nreq; i++) {
        Emberps__PredictRequest q = EMBERPS__PREDICT_REQUEST__INIT;
        q.n_lines = BATCH;
        q.lines = b->lines + (size_t)i * BATCH;
        b->req_len[i] = emberps__predict_request__get_packed_size(&q);
        b->req[i] = malloc(b->req_len[i] + 1);
        emberps__predict_request__pack(&q, b->req[i]);
    }
    return b->nreq ? 0 : -1;
}

/* ==== open loop: a fixed schedule, latency from the scheduled send ========================= */

typedef struct open_job {
    const bench_t *b;
    psg_t *c;
    bool health; /* Health instead of Predict (the baseline) */
    int idx, nthreads;
    double t0, rate, secs;
    double *lat;
    size_t n;
    uint64_t failed;
    int first_err;
} open_job_t;

static void *open_main(void *arg) {
    open_job_t *j = arg;
    for (long k = 0;; k++) {
        const double at = j->t0 + (double)(j->idx + k * j->nthreads) / j->rate;
        if (at - j->t0 >= j->secs || j->n >= MAXLAT)
            break;
        sleep_until(at);
        const int e = j->health ? health(j->c) : predict(j->c, j->b, (int)(k % j->b->nreq));
        const double l = now_s() - at;
        if (e) {
            j->failed++;
            if (!j->first_err)
                j->first_err = e;
        }
        j->lat[j->n++] = l;
    }
    return NULL;
}

typedef struct lat {
    double p50_us, p99_us, max_us;
    uint64_t n, failed;
    int first_err;
} lat_t;

/* OPEN_THREADS clients (c[]) at `rate` requests/s for secs. */
static lat_t open_loop(const bench_t *b, psg_t **c, bool health_only, double rate, double secs) {
    open_job_t j[OPEN_THREADS];
    pthread_t th[OPEN_THREADS];
    const size_t cap = (size_t)(rate * secs / OPEN_THREADS) + 2;
    const double t0 = now_s() + 0.01;
    for (int i = 0; i < OPEN_THREADS; i++) {
        j[i] = (open_job_t){.b = b,
                            .c = c[i],
                            .health = health_only,
                            .idx = i,
                            .nthreads = OPEN_THREADS,
                            .t0 = t0,
                            .rate = rate,
                            .secs = secs,
                            .lat = malloc(cap * sizeof(double))};
        if (!j[i].lat || pthread_create(&th[i], NULL, open_main, &j[i]))
            abort();
    }
    lat_t r = {0};
    double *all = malloc(cap * OPEN_THREADS * sizeof *all);
    for (int i = 0; i < OPEN_THREADS; i++) {
        pthread_join(th[i], NULL);
        memcpy(all + r.n, j[i].lat, j[i].n * sizeof *all);
        r.n += j[i].n;
        r.failed += j[i].failed;
        if (!r.first_err)
            r.first_err = j[i].first_err;
        free(j[i].lat);
    }
    r.p50_us = bench_quantile(all, r.n, 0.50) * 1e6;
    r.p99_us = bench_quantile(all, r.n, 0.99) * 1e6;
    r.max_us = r.n ? all[r.n - 1] * 1e6 : 0;
    free(all);
    return r;
}

/* ==== closed loop ========================================================================== */

typedef struct closed_job {
    const bench_t *b;
    psg_t *c;
    int idx;
    double secs;
    uint64_t done, failed;
} closed_job_t;

static void *closed_main(void *arg) {
    closed_job_t *j = arg;
    const double t0 = now_s();
    for (int k = j->idx * 7; now_s() - t0 < j->secs; k++) {
        if (predict(j->c, j->b, k % j->b->nreq))
            j->failed++;
        else
            j->done++;
    }
    return NULL;
}

/* Predict requests/s with CLOSED_THREADS calls in flight (clients c[]); *failed the failures. */
static double closed_loop(const bench_t *b, psg_t **c, double secs, uint64_t *failed) {
    closed_job_t j[CLOSED_THREADS];
    void *ctx[CLOSED_THREADS];
    for (int i = 0; i < CLOSED_THREADS; i++) {
        j[i] = (closed_job_t){.b = b, .c = c[i], .idx = i, .secs = secs};
        ctx[i] = &j[i];
    }
    const double wall = bench_run_threads(CLOSED_THREADS, closed_main, ctx);
    uint64_t done = 0;
    for (int i = 0; i < CLOSED_THREADS; i++) {
        done += j[i].done;
        *failed += j[i].failed;
    }
    return (double)done / wall;
}

/* ==== the PyTorch baseline ================================================================= */

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The replica's rows of keys[0..n) through its Lookup (gRPC, in parts). */
static int replica_rows(bench_t *b, const uint64_t *keys, size_t n, float *rows) {
    for (size_t at = 0; at < n; at += 8192) {
        Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
        q.table = "emb";
        q.keys = (uint64_t *)keys + at;
        q.n_keys = n - at < 8192 ? n - at : 8192;
        int rc;
        Emberps__LookupResponse *p = call(b->admin, PS_LOOKUP, &q.base,
                                          &emberps__lookup_response__descriptor, 10000, true, &rc);
        if (!p)
            return rc;
        const bool ok = p->dim == DIM && p->rows.len == q.n_keys * DIM * sizeof(float);
        if (ok)
            memcpy(rows + at * DIM, p->rows.data, p->rows.len);
        emberps__lookup_response__free_unpacked(p, NULL);
        if (!ok)
            return PC_EDIM;
    }
    return 0;
}

/* Files for bench/serve_torch.py: the pool's samples parsed by the daemon's parser (dir/samples),
 * and the replica's rows of their keys padded with random rows to `total` rows (dir/table). */
static int write_torch_inputs(bench_t *b, uint64_t total) {
    const size_t n = (size_t)b->nreq * BATCH;
    float *dense = malloc(n * PW_CRITEO_DENSE * sizeof *dense);
    uint64_t *keys = malloc(n * PW_CRITEO_CAT * sizeof *keys);
    pw_sample_t *s = malloc(sizeof *s);
    char err[200];
    if (!dense || !keys || !s)
        abort();
    for (size_t i = 0; i < n; i++) {
        if (pw_parse_line(PW_FMT_CRITEO, NULL, b->lines[i], strlen(b->lines[i]), s, err,
                          sizeof err) ||
            s->nkeys != PW_CRITEO_CAT || s->ndense != PW_CRITEO_DENSE) {
            fprintf(stderr, "ps-bench serve: test line %zu: %s\n", i, err);
            return -1;
        }
        memcpy(dense + i * PW_CRITEO_DENSE, s->dense, sizeof(float) * PW_CRITEO_DENSE);
        memcpy(keys + i * PW_CRITEO_CAT, s->keys, sizeof(uint64_t) * PW_CRITEO_CAT);
    }
    free(s);
    const size_t nk = n * PW_CRITEO_CAT;
    size_t cap = total > nk ? (size_t)total : nk;
    uint64_t *tk = malloc(cap * sizeof *tk);
    memcpy(tk, keys, nk * sizeof *tk);
    qsort(tk, nk, sizeof *tk, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < nk; i++)
        if (!u || tk[i] != tk[u - 1])
            tk[u++] = tk[i];
    const size_t used = u;
    uint64_t rng = 99;
    while (u < total) /* padding: keys nobody asks for (a collision would only lose a pad row) */
        tk[u++] = bench_rand(&rng) | 1;
    float *rows = malloc(u * DIM * sizeof *rows);
    if (!rows)
        abort();
    int rc = replica_rows(b, tk, used, rows);
    for (size_t i = used * DIM; i < u * DIM; i++)
        rows[i] = (float)((double)(bench_rand(&rng) >> 11) / 9007199254740992.0 * 0.02 - 0.01);
    /* sorted together (key, row) */
    typedef struct kr {
        uint64_t k;
        float r[DIM];
    } kr_t;
    kr_t *pairs = malloc(u * sizeof *pairs);
    for (size_t i = 0; pairs && i < u; i++) {
        pairs[i].k = tk[i];
        memcpy(pairs[i].r, rows + i * DIM, sizeof pairs[i].r);
    }
    if (!pairs)
        abort();
    qsort(pairs, u, sizeof *pairs, cmp_u64); /* the key leads the struct */
    size_t m = 0;
    for (size_t i = 0; i < u; i++)
        if (!m || pairs[i].k != pairs[m - 1].k)
            pairs[m++] = pairs[i];
    char path[300];
    snprintf(path, sizeof path, "%s/table", b->dir);
    FILE *f = rc ? NULL : fopen(path, "w");
    if (f) {
        const uint32_t hdr[2] = {(uint32_t)m, DIM};
        fwrite("EMBTABL1", 1, 8, f);
        fwrite(hdr, sizeof hdr, 1, f);
        for (size_t i = 0; i < m; i++)
            fwrite(&pairs[i].k, 8, 1, f);
        for (size_t i = 0; i < m; i++)
            fwrite(pairs[i].r, sizeof pairs[i].r, 1, f);
        rc = fclose(f) ? -1 : 0;
    }
    snprintf(path, sizeof path, "%s/samples", b->dir);
    f = rc ? NULL : fopen(path, "w");
    if (f) {
        const uint32_t hdr[3] = {(uint32_t)n, PW_CRITEO_DENSE, PW_CRITEO_CAT};
        fwrite("EMBSAMP1", 1, 8, f);
        fwrite(hdr, sizeof hdr, 1, f);
        fwrite(dense, sizeof *dense, n * PW_CRITEO_DENSE, f);
        fwrite(keys, sizeof *keys, nk, f);
        rc = fclose(f) ? -1 : 0;
    }
    free(pairs);
    free(rows);
    free(tk);
    free(dense);
    free(keys);
    return rc ? -1 : 0;
}

typedef struct versus {
    double qps, torch_qps, diff;
    double daemon_cpu, client_cpu; /* CPUs busy during the Predict rounds (1.0: one CPU) */
    uint64_t failed;
    char skipped[300];
    double torch_rounds[8];
    int nt;
} versus_t;

/* Predict closed-loop rounds alternating with bench/serve_torch.py's rounds (one each, `rounds`
 * times); the daemon and the torch process on CPU A. */
static versus_t against_torch(bench_t *b, psg_t **c, int rounds, double secs) {
    versus_t v = {0};
    double qps[8];
    int nq = 0;
    char model[400], table[300], samples[300], out[300];
    snprintf(model, sizeof model, "--model=%s/publish/dense-%020llu/model", b->dir,
             (unsigned long long)b->final_step);
    snprintf(table, sizeof table, "--table=%s/table", b->dir);
    snprintf(samples, sizeof samples, "--samples=%s/samples", b->dir);
    snprintf(out, sizeof out, "%s/torch.out", b->dir);
    int to_py[2], from_py[2];
    bench_sync_pipes(to_py, from_py);
    char script[400], sync[32], secarg[32], rarg[32];
    snprintf(script, sizeof script, "%s/bench/serve_torch.py", EMBER_SOURCE_DIR);
    snprintf(sync, sizeof sync, "--sync=%d,%d", to_py[0], from_py[1]);
    snprintf(secarg, sizeof secarg, "--seconds=%g", secs);
    snprintf(rarg, sizeof rarg, "--rounds=%d", rounds);
    char *args[] = {BENCH_PYTHON, script, model, table, samples, sync, secarg, rarg, NULL};
    /* the child inherits this thread's CPUs: the daemon's */
    cpu_set_t mine;
    sched_getaffinity(0, sizeof mine, &mine);
    pin_proc(b, getpid(), CPU_A);
    const pid_t py = bench_python(args, out, true);
    pin_proc(b, getpid(), cpu_b(b));
    if (b->npid < MAXPROC) {
        b->pname[b->npid] = "python3";
        b->pid[b->npid++] = py;
    }
    close(to_py[0]);
    close(from_py[1]);
    char ch;
    /* python asks ('r') before each of its rounds: a Predict round first (one silent for two
     * minutes hangs: the rest are Predict rounds alone) */
    double busy = 0, dcpu = 0, ccpu = 0;
    while (nq < rounds && bench_read_byte(from_py[0], 120, &ch) == 1 && ch == 'r') {
        const double t0 = now_s(), d0 = cpu_seconds(b->serve_pid), c0 = cpu_seconds(getpid());
        qps[nq++] = closed_loop(b, c, secs, &v.failed);
        busy += now_s() - t0;
        dcpu += cpu_seconds(b->serve_pid) - d0;
        ccpu += cpu_seconds(getpid()) - c0;
        if (write(to_py[1], "g", 1) != 1)
            break;
    }
    close(to_py[1]);
    close(from_py[0]);
    int st = 0;
    (void)bench_wait_exit(py, 60, &st); /* (killed past a minute) */
    forget(b, py);
    while (nq < rounds) { /* no torch: the Predict rounds alone */
        const double t0 = now_s(), d0 = cpu_seconds(b->serve_pid), c0 = cpu_seconds(getpid());
        qps[nq++] = closed_loop(b, c, secs, &v.failed);
        busy += now_s() - t0;
        dcpu += cpu_seconds(b->serve_pid) - d0;
        ccpu += cpu_seconds(getpid()) - c0;
    }
    v.daemon_cpu = busy > 0 ? dcpu / busy : 0;
    v.client_cpu = busy > 0 ? ccpu / busy : 0;
    v.qps = bench_quantile(qps, (size_t)nq, 0.5);
    char last[256];
    cJSON *r = bench_python_result(out, last, sizeof last);
    const cJSON *tq = r ? cJSON_GetObjectItem(r, "torch_predict_qps") : NULL;
    if (cJSON_IsNumber(tq)) {
        v.torch_qps = tq->valuedouble;
        const cJSON *rs = cJSON_GetObjectItem(r, "torch_rounds"), *e;
        cJSON_ArrayForEach(e, rs) if (v.nt < 8) v.torch_rounds[v.nt++] = e->valuedouble;
        /* the first batch's scores against Predict's */
        const cJSON *fs = cJSON_GetObjectItem(r, "torch_first_scores");
        uint8_t *resp = NULL;
        size_t rl = 0;
        Emberps__PredictResponse *p = psg_request(b->admin, SERVING "Predict", b->req[0],
                                                  b->req_len[0], 10000, &resp, &rl, NULL, NULL, 0)
                                          ? NULL
                                          : emberps__predict_response__unpack(NULL, rl, resp);
        free(resp);
        v.diff = -1;
        if (p && cJSON_GetArraySize(fs) == (int)p->n_scores) {
            v.diff = 0;
            for (size_t i = 0; i < p->n_scores; i++) {
                const double d = fabs(cJSON_GetArrayItem(fs, (int)i)->valuedouble - p->scores[i]);
                v.diff = d > v.diff ? d : v.diff;
            }
        }
        emberps__predict_response__free_unpacked(p, NULL);
    } else {
        snprintf(v.skipped, sizeof v.skipped, "%s bench/serve_torch.py: %s", BENCH_PYTHON,
                 last[0] ? last : "no result");
    }
    cJSON_Delete(r);
    return v;
}

/* ==== freshness ============================================================================ */

typedef struct pusher {
    const char *servers;
    double rate; /* rows/s offered */
    atomic_bool stop;
    uint64_t rows;
    double secs;
    int err;
} pusher_t;

/* Random rows of a universe of 1M keys into emb, in batches of 1,000, paced at p->rate. */
static void *pusher_main(void *arg) {
    pusher_t *p = arg;
    enum { PB = 1000 };
    psc_opts_t co = {.servers = p->servers, .timeout_ms = 30000};
    psc_t *c = NULL;
    if ((p->err = psc_connect(&co, &c)))
        return NULL;
    static uint64_t keys[PB];
    static float g[PB * DIM];
    for (int i = 0; i < PB * DIM; i++)
        g[i] = 1e-3f;
    uint64_t rng = 5;
    const double t0 = now_s();
    for (long k = 0; !atomic_load(&p->stop); k++) {
        sleep_until(t0 + (double)k * PB / p->rate);
        for (int i = 0; i < PB; i++)
            keys[i] = bench_key(bench_rand(&rng) % 1000000);
        if ((p->err = psc_push(c, "emb", keys, PB, DIM, g, NULL)))
            break;
        p->rows += PB;
    }
    p->secs = now_s() - t0;
    psc_close(c);
    return NULL;
}

typedef struct fresh {
    double p50_ms, p99_ms, max_ms, push_p50_ms;
    int probes, timeouts;
    double push_rate;
    uint64_t lag_max;
    int err;
} fresh_t;

/* Whether the replica holds key with a row other than `before`; -1 on a failed call. */
static int replica_has(bench_t *b, psg_t *c, uint64_t key, const float *before) {
    Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
    q.table = "emb";
    q.keys = &key;
    q.n_keys = 1;
    int rc;
    Emberps__LookupResponse *p =
        call(c, PS_LOOKUP, &q.base, &emberps__lookup_response__descriptor, 5000, true, &rc);
    (void)b;
    if (!p)
        return -1;
    const int has = p->found.len == 1 && p->found.data[0] && p->rows.len == DIM * sizeof(float) &&
                    memcmp(p->rows.data, before, DIM * sizeof(float)) != 0;
    emberps__lookup_response__free_unpacked(p, NULL);
    return has;
}

static fresh_t freshness(bench_t *b, int probes, double gap_s) {
    fresh_t f = {0};
    pusher_t pu = {.servers = b->map, .rate = 150000};
    pthread_t th;
    if (pthread_create(&th, NULL, pusher_main, &pu))
        abort();
    psc_opts_t co = {.servers = b->map, .timeout_ms = 10000};
    psc_t *pc = NULL;
    psg_t *c = client(b);
    double *lat = malloc((size_t)probes * sizeof *lat), *ack = malloc((size_t)probes * sizeof *ack);
    int n = 0;
    if ((f.err = psc_connect(&co, &pc)))
        goto out;
    usleep(300000); /* the pushes reach their pace */
    float g[DIM], before[DIM];
    for (int i = 0; i < DIM; i++)
        g[i] = 0.5f;
    for (int i = 0; i < probes && !f.err; i++) {
        const uint64_t key = bench_key(5000000000ull + (uint64_t)i); /* a new key each probe */
        if ((f.err = psc_lookup(pc, "emb", &key, 1, DIM, before, NULL)))
            break;
        const double t0 = now_s();
        if ((f.err = psc_push(pc, "emb", &key, 1, DIM, g, NULL)))
            break;
        const double acked = now_s();
        ack[n] = acked - t0;
        int has = 0;
        while (!(has = replica_has(b, c, key, before)) && now_s() - acked < 5)
            usleep(100);
        if (has < 0) {
            f.err = PC_EUNAVAIL;
            break;
        }
        if (!has)
            f.timeouts++;
        lat[n++] = now_s() - acked;
        if (i % 8 == 0) {
            Emberps__ServeStatusResponse *s = serve_status(b);
            if (s) {
                const uint64_t l = max_lag(s, NULL);
                f.lag_max = l > f.lag_max ? l : f.lag_max;
                emberps__serve_status_response__free_unpacked(s, NULL);
            }
        }
        sleep_until(now_s() + gap_s);
    }
out:
    atomic_store(&pu.stop, true);
    pthread_join(th, NULL);
    if (!f.err && pu.err)
        f.err = pu.err;
    f.push_rate = pu.secs > 0 ? (double)pu.rows / pu.secs : 0;
    f.probes = n;
    f.push_p50_ms = bench_quantile(ack, (size_t)n, 0.5) * 1e3;
    f.p50_ms = bench_quantile(lat, (size_t)n, 0.5) * 1e3;
    f.p99_ms = bench_quantile(lat, (size_t)n, 0.99) * 1e3;
    f.max_ms = n ? lat[n - 1] * 1e3 : 0;
    free(lat);
    free(ack);
    psc_close(pc);
    psg_destroy(c);
    return f;
}

/* ==== version swaps ======================================================================== */

typedef struct swapper {
    bench_t *b;
    uint64_t a, bb; /* the two versions */
    double secs;
    int swaps, failed;
    double load_s[4096];
    int nload;
    char why[256];
} swapper_t;

static void *swapper_main(void *arg) {
    swapper_t *s = arg;
    const double t0 = now_s();
    for (int k = 0; now_s() - t0 < s->secs; k++) {
        int rc;
        const double c0 = now_s();
        if (k % 3 < 2) {
            Emberps__LoadVersionRequest q = EMBERPS__LOAD_VERSION_REQUEST__INIT;
            q.step = k % 3 ? s->bb : s->a;
            Emberps__LoadVersionResponse *p =
                call(s->b->admin, SERVING "LoadVersion", &q.base,
                     &emberps__load_version_response__descriptor, 30000, true, &rc);
            if (p && p->step != q.step)
                rc = PC_ESTATE;
            emberps__load_version_response__free_unpacked(p, NULL);
        } else {
            Emberps__FollowRequest q = EMBERPS__FOLLOW_REQUEST__INIT;
            Emberps__FollowResponse *p =
                call(s->b->admin, SERVING "Follow", &q.base, &emberps__follow_response__descriptor,
                     30000, true, &rc);
            emberps__follow_response__free_unpacked(p, NULL);
        }
        if (rc) {
            s->failed++;
            snprintf(s->why, sizeof s->why, "%s", pc_err_name(rc));
        } else {
            s->swaps++;
            if (s->nload < 4096)
                s->load_s[s->nload++] = now_s() - c0;
        }
    }
    return NULL;
}

/* The versions (steps, oldest first) into v; how many. */
static size_t list_versions(bench_t *b, uint64_t *v, size_t cap) {
    Emberps__ListVersionsRequest q = EMBERPS__LIST_VERSIONS_REQUEST__INIT;
    Emberps__ListVersionsResponse *p =
        call(b->admin, SERVING "ListVersions", &q.base,
             &emberps__list_versions_response__descriptor, 10000, true, NULL);
    size_t n = 0;
    for (size_t i = 0; p && i < p->n_versions && n < cap; i++)
        v[n++] = p->versions[i]->step;
    emberps__list_versions_response__free_unpacked(p, NULL);
    return n;
}

/* ==== main ================================================================================= */

static void finish_dir(bench_t *b, bool keep) {
    if (keep) {
        fprintf(stderr, "ps-bench serve: logs kept in %s\n", b->dir);
        return;
    }
    pc_fs_rm_tree(b->dir);
}

int bench_serve_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "serve", &o);
    signal(SIGPIPE, SIG_IGN);
    bench_t b = {.o = &o};
    const long rows = o.smoke ? 6000 : o.quick ? 40000 : 200000;
    b.secs = o.seconds > 0 ? o.seconds : o.smoke ? 0.5 : o.quick ? 4.0 : 10.0;
    const double tsecs = o.smoke ? 0.3 : o.quick ? 1.5 : 3.0; /* per throughput round */
    const int rounds = o.smoke ? 1 : 3;
    const int probes = o.smoke ? 20 : o.quick ? 150 : 500;
    bench_tmpdir("serve", b.dir, sizeof b.dir);
    bench_sibling("ps-server", b.bin, sizeof b.bin);
    *strrchr(b.bin, '/') = '\0';
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "serve");
    psg_t *oc[CLOSED_THREADS] = {0};
    int failed = 1;

    printf("ps-bench serve: a job of 2 ps-servers and 2 sync ps-workers (%ld rows, DLRM dim %d, "
           "26 fields) followed by ps-serve; Predict batches of %d Criteo lines%s\n",
           rows, DIM, BATCH, o.pin ? "" : " (unpinned)");
    const double tj = now_s();
    if (make_data(&b, rows) || start_servers(&b) || start_serve(&b))
        goto done;
    const double train_s = train(&b, o.smoke ? 4 : 10, o.smoke ? 120 : 600);
    if (train_s < 0 || wait_caught_up(&b, 60) || make_requests(&b))
        goto done;
    uint64_t vers[256];
    const size_t nv = list_versions(&b, vers, 256);
    Emberps__ServeStatusResponse *st = serve_status(&b);
    const uint64_t rows_held = st ? st->rows : 0;
    emberps__serve_status_response__free_unpacked(st, NULL);
    printf("job: trained in %.1f s (%.1f s with data and start), model %llu, %zu versions, "
           "replica %llu rows, caught up\n",
           train_s, now_s() - tj, (unsigned long long)b.final_step, nv,
           (unsigned long long)rows_held);
    cJSON_AddNumberToObject(root, "train_seconds", train_s);
    cJSON_AddNumberToObject(root, "model_version", (double)b.final_step);
    cJSON_AddNumberToObject(root, "versions", (double)nv);
    cJSON_AddNumberToObject(root, "replica_rows", (double)rows_held);
    cJSON_AddStringToObject(root, "predict_input", "criteo lines (parsed by the daemon)");
    cJSON_AddNumberToObject(root, "predict_batch", BATCH);
    if (write_torch_inputs(&b, rows_held))
        goto done;

    /* 1. latency at a fixed offered rate; the daemon on CPU A, the clients on CPU B */
    for (int i = 0; i < CLOSED_THREADS; i++)
        oc[i] = client(&b);
    pin_proc(&b, b.serve_pid, CPU_A);
    pin_proc(&b, getpid(), cpu_b(&b));
    for (int i = 0; i < OPEN_THREADS; i++) /* connect and warm */
        for (int k = 0; k < 20; k++)
            predict(oc[i], &b, k);
    const lat_t hl = open_loop(&b, oc, true, RATE, b.secs / 2);
    const lat_t pl = open_loop(&b, oc, false, RATE, b.secs);
    printf("1. Predict (%d lines) at %.0f/s offered, open loop, %d clients: p50 %.0f us, p99 %.0f "
           "us, max %.0f us (goal p99 <= 1000 us); %llu requests, %llu failed\n"
           "   baseline, Health round trip at the same rate: p50 %.0f us, p99 %.0f us\n",
           BATCH, RATE, OPEN_THREADS, pl.p50_us, pl.p99_us, pl.max_us, (unsigned long long)pl.n,
           (unsigned long long)pl.failed, hl.p50_us, hl.p99_us);
    cJSON_AddNumberToObject(root, "predict_rate", RATE);
    cJSON_AddNumberToObject(root, "predict_p50_us", pl.p50_us);
    cJSON_AddNumberToObject(root, "predict_p99_us", pl.p99_us);
    cJSON_AddNumberToObject(root, "predict_max_us", pl.max_us);
    cJSON_AddNumberToObject(root, "predict_failed", (double)pl.failed);
    cJSON_AddNumberToObject(root, "health_p50_us", hl.p50_us);
    cJSON_AddNumberToObject(root, "health_p99_us", hl.p99_us);

    /* 2. throughput against PyTorch, in turns on CPU A */
    const versus_t vs = against_torch(&b, oc, rounds, tsecs);
    printf("2. Predict closed loop, %d in flight: %.0f requests/s = %.0f samples/s (daemon on one "
           "CPU, busy %.0f%%; clients %.0f%% of theirs)\n",
           CLOSED_THREADS, vs.qps, vs.qps * BATCH, vs.daemon_cpu * 100, vs.client_cpu * 100);
    cJSON_AddNumberToObject(root, "predict_daemon_cpu", vs.daemon_cpu);
    cJSON_AddNumberToObject(root, "predict_client_cpu", vs.client_cpu);
    cJSON_AddNumberToObject(root, "predict_qps_max", vs.qps);
    cJSON_AddNumberToObject(root, "predict_samples_per_s_max", vs.qps * BATCH);
    cJSON_AddNumberToObject(root, "predict_qps_failed", (double)vs.failed);
    if (vs.torch_qps > 0) {
        printf("   baseline, PyTorch on the same CPU (1 thread; EmbeddingBag + DLRM, no parsing, "
               "no RPC): %.0f batches/s = %.0f samples/s; predict_vs_torch %.2f (goal >= 2); "
               "scores differ by at most %.2g\n",
               vs.torch_qps, vs.torch_qps * BATCH, vs.qps / vs.torch_qps, vs.diff);
        cJSON_AddNumberToObject(root, "torch_predict_qps", vs.torch_qps);
        cJSON_AddNumberToObject(root, "torch_samples_per_s", vs.torch_qps * BATCH);
        cJSON_AddNumberToObject(root, "predict_vs_torch", vs.qps / vs.torch_qps);
        cJSON_AddNumberToObject(root, "torch_max_abs_diff", vs.diff);
    } else {
        printf("   PyTorch skipped: %s\n", vs.skipped);
        cJSON_AddStringToObject(root, "torch_skipped", vs.skipped);
    }

    /* 3. freshness under training-like pushes; nothing pinned */
    pin_proc(&b, b.serve_pid, CPU_ALL);
    pin_proc(&b, getpid(), CPU_ALL);
    const fresh_t fr = freshness(&b, probes, o.smoke ? 0.005 : 0.01);
    if (fr.err) {
        fprintf(stderr, "ps-bench serve: freshness: %s\n", pc_err_name(fr.err));
        goto done;
    }
    printf("3. freshness, push acknowledged -> row visible on the replica (%d probes, %d timed "
           "out), while pushing %.0f rows/s: p50 %.2f ms, p99 %.2f ms, max %.2f ms (goal p99 <= "
           "1000 ms); replica lag at most %llu entries\n"
           "   baseline, the marker push's own round trip: p50 %.2f ms\n",
           fr.probes, fr.timeouts, fr.push_rate, fr.p50_ms, fr.p99_ms, fr.max_ms,
           (unsigned long long)fr.lag_max, fr.push_p50_ms);
    cJSON_AddNumberToObject(root, "freshness_p50_ms", fr.p50_ms);
    cJSON_AddNumberToObject(root, "freshness_p99_ms", fr.p99_ms);
    cJSON_AddNumberToObject(root, "freshness_max_ms", fr.max_ms);
    cJSON_AddNumberToObject(root, "freshness_probes", fr.probes);
    cJSON_AddNumberToObject(root, "freshness_timeouts", fr.timeouts);
    cJSON_AddNumberToObject(root, "push_rows_per_s", fr.push_rate);
    cJSON_AddNumberToObject(root, "push_ack_p50_ms", fr.push_p50_ms);
    cJSON_AddNumberToObject(root, "lag_entries_max", (double)fr.lag_max);

    /* 4. version swaps under a steady Predict load; pinned as in 1 */
    if (nv < 2) {
        printf("4. version swaps skipped: %zu versions\n", nv);
        cJSON_AddStringToObject(root, "swap_skipped", "fewer than 2 versions");
    } else {
        if (wait_caught_up(&b, 30))
            goto done;
        pin_proc(&b, b.serve_pid, CPU_A);
        pin_proc(&b, getpid(), cpu_b(&b));
        const lat_t steady = open_loop(&b, oc, false, RATE, b.secs);
        swapper_t *sw = calloc(1, sizeof *sw);
        *sw = (swapper_t){.b = &b, .a = vers[nv - 2], .bb = vers[nv - 1], .secs = b.secs};
        pthread_t th;
        if (pthread_create(&th, NULL, swapper_main, sw))
            abort();
        const lat_t during = open_loop(&b, oc, false, RATE, b.secs);
        pthread_join(th, NULL);
        const double load_p50 = bench_quantile(sw->load_s, (size_t)sw->nload, 0.5);
        printf("4. version swaps (LoadVersion %llu, LoadVersion %llu, Follow, back to back): %d "
               "swaps (%d failed%s%s), each %.1f ms (p50); Predict at %.0f/s during them: p99 "
               "%.0f us, %llu of %llu failed (goal 0)\n"
               "   baseline, steady: p99 %.0f us; swap_p99_vs_steady %.2f (goal <= 1.5)\n",
               (unsigned long long)sw->a, (unsigned long long)sw->bb, sw->swaps, sw->failed,
               sw->failed ? ": " : "", sw->why, load_p50 * 1e3, RATE, during.p99_us,
               (unsigned long long)during.failed, (unsigned long long)during.n, steady.p99_us,
               during.p99_us / steady.p99_us);
        cJSON_AddNumberToObject(root, "swap_failed_requests", (double)during.failed);
        cJSON_AddNumberToObject(root, "swap_requests", (double)during.n);
        cJSON_AddNumberToObject(root, "swap_p99_us", during.p99_us);
        cJSON_AddNumberToObject(root, "steady_p99_us", steady.p99_us);
        cJSON_AddNumberToObject(root, "swap_p99_vs_steady", during.p99_us / steady.p99_us);
        cJSON_AddNumberToObject(root, "swaps", sw->swaps);
        cJSON_AddNumberToObject(root, "swap_admin_failed", sw->failed);
        cJSON_AddNumberToObject(root, "swap_ms_p50", load_p50 * 1e3);
        free(sw);
    }
    failed = 0;
done:
    pin_proc(&b, getpid(), CPU_ALL);
    for (int i = 0; i < CLOSED_THREADS; i++)
        psg_destroy(oc[i]);
    psg_destroy(b.admin);
    stop_all(&b);
    finish_dir(&b, failed);
    for (size_t i = 0; i < b.nlines; i++)
        free(b.lines[i]);
    free(b.lines);
    for (int i = 0; i < b.nreq; i++)
        free(b.req[i]);
    free(b.req);
    free(b.req_len);
    if (failed) {
        cJSON_Delete(root);
        return 1;
    }
    bench_emit_json(&o, root);
    return 0;
}
