/* bench_rpc.c: `ps-bench rpc`: the binary data plane against Redis on loopback.
 *
 * A ps-server process (the one next to ps-bench, one event loop) and a redis-server (no
 * persistence) both run pinned to CPU 0; the client runs on CPU 1 (--no-pin: unpinned). 1M keys
 * (--quick 200k, --smoke 5k), dim 16 and 64, Adagrad, batches of 1000, one client thread:
 *  - data plane pull and push rows/s with 1 and 8 requests in flight (libpsclient);
 *  - Redis holding the same keys with the same float vectors (the rows the server returns), read
 *    through hiredis by pipelined MGET of 8-byte binary keys, and by HMGET over 16 hashes (the
 *    layout TensorFlow Recommenders-Addons' Redis backend uses), 1 and 8 batches in flight;
 *  - a loopback TCP stream with the same pinning (a sender process on the server's CPU writing
 *    256,000-byte chunks, the size of a dim-64 pull reply; the receiver on the client's CPU):
 *    pull_vs_loopback, the data plane's pull bytes/s (dim 64, 8 in flight) over the stream's,
 *    three pairs of samples alternating, the median of the pairs' ratios;
 *  - latency of 26-key lookups at a fixed rate against Redis MGET of the same 26 keys, and the
 *    loopback round trip (PING) of both, back to back and (the data plane's) at the same rate;
 *    the lookups and the round trip again against a second ps-server that busy-polls
 *    (--poll-us, same settings and pinning): lookup_poll_p99_vs_rtt_p50.
 *  - pull and push over the gRPC API (dim 64, unary calls, 1 and 8 in flight: 8 threads) and
 *    gRPC Lookup latency at the same fixed rate.
 *  - data plane pull over TLS against plain TCP (dim 64, 8 in flight): a second ps-server with a
 *    self-signed certificate (openssl CLI) and the same settings and pinning, three pairs of
 *    samples of the two alternating (tls_pull_vs_plain: the median of the pairs' ratios).
 *  - gRPC Pull over TLS against plain gRPC (dim 64, 8 in flight): a third ps-server whose gRPC
 *    port serves TLS (its own self-signed certificate), same settings and pinning as the first,
 *    three pairs of samples alternating (tls_grpc_pull_vs_plain: the median of their ratios).
 *  - compressed rows (docs/wire.md): data plane pull and push with rows and gradients in bf16
 *    against f32 (psc_set_wire_type), dim 64 and 16, 8 in flight, three pairs of samples
 *    alternating (pull_bf16_vs_f32, push_bf16_vs_f32: dim 64, the median of the pairs' ratios;
 *    the _16 keys the same at dim 16).
 * Samples of the data plane and of Redis alternate. Calls at a fixed rate are timed from when
 * each was due, not when it went out (a stall counts for every call it delays: no coordinated
 * omission; since 2026-11-30); percentiles are nearest-rank. Figures for issue notes and docs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "emberps.pb-c.h"
#include "emberps/psclient.h"
#include "emberps/psgrpc.h"
#include "pc_fs.h"
#include "pc_time.h"
#include "pc_wire.h"
#include "ps_api.h"

enum { B = 1000, W = 8, LK = 26, HBUCKETS = 16 };

typedef struct ctx {
    const bench_opts_t *o;
    uint64_t nkeys;
    double secs;
    psc_t *ps;
    psg_t *grpc;
    redisContext *rd;
    int ps_port, rd_port, grpc_port;
} ctx_t;

/* ==== processes ============================================================================ */

static double now_s(void) {
    return (double)pc_time_mono_ns() * 1e-9;
}

/* ==== data plane =========================================================================== */

typedef struct slot {
    uint64_t keys[B];
    float *buf;
    uint64_t id;
    bool busy;
} slot_t;

/* Rows/s of pulls (push = false) or pushes with `inflight` calls in flight. */
static double dp_rate(ctx_t *x, const char *table, uint32_t dim, int inflight, bool push,
                      uint64_t seed) {
    slot_t s[W];
    uint64_t rng = seed;
    for (int i = 0; i < inflight; i++) {
        s[i].buf = malloc((size_t)B * dim * sizeof(float));
        for (size_t j = 0; j < (size_t)B * dim; j++)
            s[i].buf[j] = 1e-4f;
        s[i].busy = false;
    }
    uint64_t rows = 0;
    const double t0 = now_s();
    for (int next = 0;; next = (next + 1) % inflight) {
        slot_t *q = &s[next];
        if (q->busy) {
            if (psc_wait(x->ps, q->id))
                abort();
            rows += B;
            q->busy = false;
        }
        if (now_s() - t0 >= x->secs)
            break;
        for (int i = 0; i < B; i++)
            q->keys[i] = bench_key(bench_rand(&rng) % x->nkeys);
        int rc =
            push ? psc_push_async(x->ps, table, q->keys, B, dim, q->buf, NULL, NULL, NULL, &q->id)
                 : psc_pull_async(x->ps, table, q->keys, B, dim, q->buf, NULL, NULL, &q->id);
        if (rc)
            abort();
        q->busy = true;
    }
    for (int i = 0; i < inflight; i++) {
        if (s[i].busy && psc_wait(x->ps, s[i].id))
            abort();
        rows += s[i].busy ? B : 0;
        free(s[i].buf);
    }
    return (double)rows / (now_s() - t0);
}

/* ==== pairs of samples ===================================================================== */

/* A figure against its baseline (TLS against plain, pull against a loopback stream): PAIRS pairs
 * of samples, alternating (drift in the machine hits both); the figures are the medians of the
 * samples and of the pairs' ratios, which one burst of load on the shared machine cannot move. */
enum { PAIRS = 3 }; /* bench_median3 */
typedef struct pairs {
    double a[PAIRS], base[PAIRS], ratio[PAIRS];
} pairs_t;

static void fig_add(pairs_t *f, int i, double a, double base) {
    f->a[i] = a;
    f->base[i] = base;
    f->ratio[i] = a / base;
}

/* Rows/s of pulls (or pushes) with rows in bf16 (a) against f32 (base), 8 in flight: PAIRS pairs
 * of samples, the order alternating within the pairs. */
static void wire_pairs(ctx_t *x, const char *table, uint32_t dim, bool push, pairs_t *f) {
    for (int r = 0; r < PAIRS; r++) {
        double rate[2];
        for (int j = 0; j < 2; j++) {
            const int t = (r + j) % 2; /* 0: f32 first, 1: bf16 first */
            if (psc_set_wire_type(x->ps, t ? PSC_WIRE_BF16 : PSC_WIRE_F32))
                abort();
            rate[t] = dp_rate(x, table, dim, W, push, 70 + (uint64_t)r);
        }
        fig_add(f, r, rate[1], rate[0]);
    }
    if (psc_set_wire_type(x->ps, PSC_WIRE_F32))
        abort();
}

/* ==== loopback TCP stream ================================================================== */

/* Bytes/s of one TCP stream on loopback for x->secs: a child process pinned as the servers are
 * writes `chunk`-byte buffers as fast as it can; this thread (the client's CPU) reads them into
 * a buffer of that size. The bound a data plane reply stream could reach with no work per byte
 * but the kernel's copies. -1 on a socket error (said on stderr). */
static double loopback_rate(ctx_t *x, size_t chunk) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al)) {
        fprintf(stderr, "ps-bench rpc: loopback stream: %s\n", strerror(errno));
        if (l >= 0)
            close(l);
        return -1;
    }
    const pid_t pid = fork();
    if (pid == 0) { /* the sender, on the servers' CPU; it ends when the reader closes */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        bench_pin(x->o, 0);
        const int fd = accept(l, NULL, NULL);
        char *buf = calloc(1, chunk);
        for (;;)
            for (size_t off = 0; off < chunk;) {
                const ssize_t n = write(fd, buf + off, chunk - off);
                if (n <= 0)
                    _exit(0);
                off += (size_t)n;
            }
    }
    close(l);
    const int fd = pid > 0 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    char *buf = malloc(chunk);
    double rate = -1;
    if (fd >= 0 && buf && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        uint64_t bytes = 0;
        const double t0 = now_s();
        ssize_t n = 1;
        while (n > 0 && now_s() - t0 < x->secs)
            if ((n = read(fd, buf, chunk)) > 0)
                bytes += (uint64_t)n;
        rate = n > 0 ? (double)bytes / (now_s() - t0) : -1;
    }
    if (rate < 0)
        fprintf(stderr, "ps-bench rpc: loopback stream failed\n");
    if (fd >= 0)
        close(fd);
    free(buf);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return rate;
}

/* ==== data plane over TLS ================================================================== */

/* A self-signed certificate for 127.0.0.1 into dir/<name>.pem and dir/<name>.key (openssl CLI;
 * the paths go to cert and key, cap bytes each). 0, or -1 said on stderr. */
static int make_cert(const char *dir, const char *name, char *cert, char *key, size_t cap) {
    char cmd[1024];
    snprintf(cert, cap, "%s/%s.pem", dir, name);
    snprintf(key, cap, "%s/%s.key", dir, name);
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 "
             "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout '%s' -out '%s' "
             ">/dev/null 2>&1",
             key, cert);
    if (system(cmd) != 0) {
        fprintf(stderr, "ps-bench rpc: cannot make a certificate (is openssl installed?)\n");
        return -1;
    }
    return 0;
}

/* Every key of the run pulled once from a second server's b64 table (c), creating its rows. */
static void fill_b64(const ctx_t *x, psc_t *c) {
    static uint64_t keys[B];
    float *rows = malloc((size_t)B * 64 * sizeof(float));
    for (uint64_t k = 0; rows && k < x->nkeys; k += B) {
        const size_t n = x->nkeys - k < B ? (size_t)(x->nkeys - k) : B;
        for (size_t i = 0; i < n; i++)
            keys[i] = bench_key(k + i);
        if (psc_pull(c, "b64", keys, n, 64, rows))
            abort();
    }
    free(rows);
}

/* Pull rows/s at dim 64, 8 in flight, over TLS (a second server, pinned as the first)
 * and over the plain connection x->ps, alternating; *plain and *ratio get the medians of the
 * plain samples and of the pairs' ratios. Returns the TLS figure, or -1 when the TLS server
 * cannot be set up (said on stderr). */
static double tls_pull_rate(ctx_t *x, const bench_opts_t *o, const char *dir, double *plain,
                            double *ratio) {
    char cert[300], key[300];
    if (make_cert(dir, "tls", cert, key, sizeof cert))
        return -1;
    char certarg[320], keyarg[320];
    snprintf(certarg, sizeof certarg, "--tls-cert=%s", cert);
    snprintf(keyarg, sizeof keyarg, "--tls-key=%s", key);
    const char *extra[] = {"--grpc-port=-1", certarg, keyarg,
                           "--tables=name=b64,dim=64,optimizer=adagrad", NULL};
    int port;
    const pid_t pid = bench_ps_server(o, "rpc", dir, "tls", extra, &port, NULL);
    if (pid < 0)
        return -1;
    char addr[64], why[512] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_opts_t co = {.servers = addr, .timeout_ms = 60000};
    psc_tls_opts_t tls = {.ca = cert};
    psc_t *plain_ps = x->ps, *tls_ps = NULL;
    if (psc_connect2(&co, &tls, why, sizeof why, &tls_ps)) {
        fprintf(stderr, "ps-bench rpc: the TLS server: %s\n", why);
        bench_stop(pid);
        return -1;
    }
    fill_b64(x, tls_ps); /* the plain server holds its rows already */
    pairs_t f;
    for (int r = 0; r < PAIRS; r++) {
        x->ps = plain_ps;
        const double p = dp_rate(x, "b64", 64, W, false, 40 + (uint64_t)r);
        x->ps = tls_ps;
        fig_add(&f, r, dp_rate(x, "b64", 64, W, false, 40 + (uint64_t)r), p);
    }
    x->ps = plain_ps;
    psc_close(tls_ps);
    bench_stop(pid);
    unlink(cert);
    unlink(key);
    *plain = bench_median3(f.base);
    *ratio = bench_median3(f.ratio);
    return bench_median3(f.a);
}

/* ==== gRPC API (unary calls; `inflight` threads each with one call at a time) ============== */

static double grpc_rate1(ctx_t *x, const char *table, uint32_t dim, bool push, uint64_t seed);

typedef struct grpc_job {
    ctx_t *x;
    const char *table;
    uint32_t dim;
    bool push;
    uint64_t seed;
    double rate;
} grpc_job_t;

static void *grpc_job_main(void *arg) {
    grpc_job_t *j = arg;
    j->rate = grpc_rate1(j->x, j->table, j->dim, j->push, j->seed);
    return NULL;
}

static double grpc_rate(ctx_t *x, const char *table, uint32_t dim, bool push, int inflight,
                        uint64_t seed) {
    pthread_t th[W];
    grpc_job_t jobs[W];
    double total = 0;
    for (int i = 0; i < inflight; i++) {
        jobs[i] = (grpc_job_t){x, table, dim, push, seed + (uint64_t)i * 1000, 0};
        if (pthread_create(&th[i], NULL, grpc_job_main, &jobs[i]))
            abort();
    }
    for (int i = 0; i < inflight; i++) {
        pthread_join(th[i], NULL);
        total += jobs[i].rate;
    }
    return total;
}

static double grpc_rate1(ctx_t *x, const char *table, uint32_t dim, bool push, uint64_t seed) {
    uint64_t keys[B], rng = seed, rows = 0;
    float *g = calloc((size_t)B * dim, sizeof *g);
    const double t0 = now_s();
    while (now_s() - t0 < x->secs) {
        for (int i = 0; i < B; i++)
            keys[i] = bench_key(bench_rand(&rng) % x->nkeys);
        Emberps__PullRequest pq = EMBERPS__PULL_REQUEST__INIT;
        Emberps__PushRequest sq = EMBERPS__PUSH_REQUEST__INIT;
        const ProtobufCMessage *m = push ? &sq.base : &pq.base;
        pq.table = sq.table = (char *)table;
        pq.keys = sq.keys = keys;
        pq.n_keys = sq.n_keys = B;
        sq.grads = (ProtobufCBinaryData){(size_t)B * dim * 4, (uint8_t *)g};
        size_t len = protobuf_c_message_get_packed_size(m), rl;
        uint8_t *req = malloc(len), *resp;
        protobuf_c_message_pack(m, req);
        int st = psg_call(x->grpc, ps_api_path(push ? PS_API_PUSH : PS_API_PULL), req, len, 10000,
                          &resp, &rl, NULL, 0);
        free(req);
        if (st)
            abort();
        if (!push) { /* decode as a client would */
            Emberps__PullResponse *r = emberps__pull_response__unpack(NULL, rl, resp);
            if (!r || r->rows.len != (size_t)B * dim * 4)
                abort();
            emberps__pull_response__free_unpacked(r, NULL);
        }
        free(resp);
        rows += B;
    }
    free(g);
    return (double)rows / (now_s() - t0);
}

/* ==== gRPC over TLS ======================================================================== */

/* gRPC Pull rows/s at dim 64, 8 in flight, over TLS (a third server, started as the
 * first: one gRPC thread) and over the plain channel x->grpc, alternating; *plain gets the plain
 * figure. Returns the TLS figure, or -1 when the TLS server cannot be set up (said on stderr). */
static double tls_grpc_pull_rate(ctx_t *x, const bench_opts_t *o, const char *dir, double *plain,
                                 double *ratio) {
    *plain = 0;
    char cert[300], key[300];
    if (make_cert(dir, "tlsg", cert, key, sizeof cert))
        return -1;
    char certarg[320], keyarg[320];
    snprintf(certarg, sizeof certarg, "--tls-cert=%s", cert);
    snprintf(keyarg, sizeof keyarg, "--tls-key=%s", key);
    const char *extra[] = {"--grpc-threads=1", certarg, keyarg,
                           "--tables=name=b64,dim=64,optimizer=adagrad", NULL};
    int dpp, gp;
    const pid_t pid = bench_ps_server(o, "rpc", dir, "tlsg", extra, &dpp, &gp);
    if (pid < 0)
        return -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", gp);
    const psg_opts_t go = {.addr = addr, .max_message = 256u << 20, .tls_ca = cert};
    psg_t *plain_g = x->grpc, *tls_g = NULL;
    if (psg_create(&go, &tls_g)) {
        fprintf(stderr, "ps-bench rpc: cannot make a TLS client for %s\n", addr);
        bench_stop(pid);
        return -1;
    }
    /* every key once on the new server first (Pull creates rows): the plain one holds them */
    static uint64_t keys[B];
    int rc = 0;
    for (uint64_t k = 0; !rc && k < x->nkeys; k += B) {
        Emberps__PullRequest q = EMBERPS__PULL_REQUEST__INIT;
        q.table = "b64";
        q.n_keys = x->nkeys - k < B ? (size_t)(x->nkeys - k) : B;
        q.keys = keys;
        for (size_t i = 0; i < q.n_keys; i++)
            keys[i] = bench_key(k + i);
        uint8_t *req = malloc(protobuf_c_message_get_packed_size(&q.base)), *resp = NULL;
        size_t len = protobuf_c_message_pack(&q.base, req), rl;
        char msg[512];
        rc = psg_request(tls_g, ps_api_path(PS_API_PULL), req, len, 10000, &resp, &rl, NULL, msg,
                         sizeof msg);
        if (rc)
            fprintf(stderr, "ps-bench rpc: gRPC over TLS: %s\n", msg);
        free(req);
        free(resp);
    }
    pairs_t fig;
    for (int r = 0; !rc && r < PAIRS; r++) {
        x->grpc = plain_g;
        const double p = grpc_rate(x, "b64", 64, false, W, 50 + (uint64_t)r);
        x->grpc = tls_g;
        fig_add(&fig, r, grpc_rate(x, "b64", 64, false, W, 50 + (uint64_t)r), p);
    }
    x->grpc = plain_g;
    psg_destroy(tls_g);
    bench_stop(pid);
    unlink(cert);
    unlink(key);
    if (rc)
        return -1;
    *plain = bench_median3(fig.base);
    *ratio = bench_median3(fig.ratio);
    return bench_median3(fig.a);
}

/* ==== Redis ================================================================================ */

static void rkey(char out[10], char layout, uint32_t dim, uint64_t key) {
    out[0] = layout;
    out[1] = dim == 16 ? 'a' : 'b';
    memcpy(out + 2, &key, 8);
}

/* Fill Redis with the rows the server holds: string keys (MGET) and 16 hashes (HMGET). */
static void redis_fill(ctx_t *x, const char *table, uint32_t dim) {
    uint64_t keys[B];
    float *rows = malloc((size_t)B * dim * sizeof(float));
    for (uint64_t base = 0; base < x->nkeys; base += B) {
        size_t n = x->nkeys - base < B ? (size_t)(x->nkeys - base) : B;
        for (size_t i = 0; i < n; i++)
            keys[i] = bench_key(base + i);
        if (psc_pull(x->ps, table, keys, n, dim, rows))
            abort();
        for (size_t i = 0; i < n; i++) {
            char k[10], h[12];
            rkey(k, 's', dim, keys[i]);
            snprintf(h, sizeof h, "h%c%02u", dim == 16 ? 'a' : 'b', (unsigned)(keys[i] % HBUCKETS));
            const char *a1[3] = {"SET", k, (const char *)(rows + i * dim)};
            size_t l1[3] = {3, 10, dim * 4};
            redisAppendCommandArgv(x->rd, 3, a1, l1);
            const char *a2[4] = {"HSET", h, (const char *)&keys[i], (const char *)(rows + i * dim)};
            size_t l2[4] = {4, strlen(h), 8, dim * 4};
            redisAppendCommandArgv(x->rd, 4, a2, l2);
        }
        for (size_t i = 0; i < 2 * n; i++) {
            redisReply *r;
            if (redisGetReply(x->rd, (void **)&r) != REDIS_OK)
                abort();
            freeReplyObject(r);
        }
    }
    free(rows);
}

/* Append the commands of one batch; returns how many replies it expects. */
static int redis_batch(ctx_t *x, bool hash, uint32_t dim, uint64_t *rng, int nk) {
    static char kbuf[B][10];
    static uint64_t ids[B];
    static const char *argv[B + 2];
    static size_t lens[B + 2];
    for (int i = 0; i < nk; i++)
        ids[i] = bench_key(bench_rand(rng) % x->nkeys);
    if (!hash) {
        argv[0] = "MGET";
        lens[0] = 4;
        for (int i = 0; i < nk; i++) {
            rkey(kbuf[i], 's', dim, ids[i]);
            argv[i + 1] = kbuf[i];
            lens[i + 1] = 10;
        }
        redisAppendCommandArgv(x->rd, nk + 1, argv, lens);
        return 1;
    }
    int cmds = 0;
    for (int b = 0; b < HBUCKETS; b++) { /* one HMGET per bucket holding keys of the batch */
        char h[12];
        snprintf(h, sizeof h, "h%c%02d", dim == 16 ? 'a' : 'b', b);
        int m = 0;
        argv[0] = "HMGET";
        lens[0] = 5;
        argv[1] = h;
        lens[1] = strlen(h);
        for (int i = 0; i < nk; i++) {
            if (ids[i] % HBUCKETS != (uint64_t)b)
                continue;
            argv[2 + m] = (const char *)&ids[i];
            lens[2 + m] = 8;
            m++;
        }
        if (m) {
            redisAppendCommandArgv(x->rd, m + 2, argv, lens);
            cmds++;
        }
    }
    return cmds;
}

/* Take `cmds` replies; returns the values they carried (rows). */
static uint64_t redis_take(ctx_t *x, int cmds, uint32_t dim) {
    uint64_t rows = 0;
    for (int c = 0; c < cmds; c++) {
        redisReply *r;
        if (redisGetReply(x->rd, (void **)&r) != REDIS_OK || r->type != REDIS_REPLY_ARRAY)
            abort();
        for (size_t i = 0; i < r->elements; i++)
            rows += r->element[i]->type == REDIS_REPLY_STRING && r->element[i]->len == dim * 4;
        freeReplyObject(r);
    }
    return rows;
}

/* Rows/s of MGET (hash = false) or HMGET batches of B keys, `inflight` batches pipelined. */
static double redis_rate(ctx_t *x, bool hash, uint32_t dim, int inflight, uint64_t seed) {
    uint64_t rng = seed, rows = 0;
    int pending[W], head = 0, n = 0;
    const double t0 = now_s();
    for (;;) {
        while (n < inflight && now_s() - t0 < x->secs) {
            pending[(head + n) % W] = redis_batch(x, hash, dim, &rng, B);
            n++;
        }
        if (!n)
            break;
        rows += redis_take(x, pending[head], dim);
        head = (head + 1) % W;
        n--;
    }
    return (double)rows / (now_s() - t0);
}

/* ==== latency ============================================================================== */

typedef struct lat {
    double p50, p99;
} lat_t;

/* The nearest-rank percentiles (bench_quantile), in us. */
static lat_t percentiles(double *v, size_t n) {
    const double p50 = bench_quantile(v, n, 0.5);
    return (lat_t){p50 * 1e6, bench_quantile(v, n, 0.99) * 1e6};
}

/* 26-key lookups (or MGETs) at `rate` per second for x->secs: per-call latency percentiles,
 * each call timed from when it was due (a stall's queueing counts for the calls it delays; from
 * the actual send it did not: coordinated omission). */
static lat_t lookup_latency(ctx_t *x, bool redis, uint32_t dim, double rate, uint64_t seed) {
    const size_t max = (size_t)(rate * x->secs) + 1;
    double *lat = malloc(max * sizeof *lat);
    uint64_t keys[LK], rng = seed;
    float rows[LK * 64];
    size_t n = 0;
    const double t0 = now_s();
    for (double next = t0; n < max && next - t0 < x->secs; next += 1.0 / rate) {
        while (now_s() < next)
            ;
        if (redis) {
            redis_take(x, redis_batch(x, false, dim, &rng, LK), dim);
        } else {
            for (int i = 0; i < LK; i++)
                keys[i] = bench_key(bench_rand(&rng) % x->nkeys);
            if (psc_lookup(x->ps, "b64", keys, LK, dim, rows, NULL))
                abort();
        }
        lat[n++] = now_s() - next;
    }
    lat_t r = percentiles(lat, n);
    free(lat);
    return r;
}

/* 26-key Lookups over gRPC at `rate` per second: latency percentiles (from each call's due
 * time, as lookup_latency). */
static lat_t grpc_lookup_latency(ctx_t *x, double rate, uint64_t seed) {
    const size_t max = (size_t)(rate * x->secs) + 1;
    double *lat = malloc(max * sizeof *lat);
    uint64_t keys[LK], rng = seed;
    size_t n = 0;
    const double t0 = now_s();
    for (double next = t0; n < max && next - t0 < x->secs; next += 1.0 / rate) {
        while (now_s() < next)
            ;
        for (int i = 0; i < LK; i++)
            keys[i] = bench_key(bench_rand(&rng) % x->nkeys);
        Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
        q.table = "b64";
        q.keys = keys;
        q.n_keys = LK;
        uint8_t req[512], *resp;
        size_t len = emberps__lookup_request__pack(&q, req), rl;
        if (psg_call(x->grpc, ps_api_path(PS_API_LOOKUP), req, len, 10000, &resp, &rl, NULL, 0))
            abort();
        free(resp);
        lat[n++] = now_s() - next;
    }
    lat_t r = percentiles(lat, n);
    free(lat);
    return r;
}

/* Round trips of an empty request: data plane PING over a raw socket, Redis PING; back to back
 * (rate 0) or at `rate` per second (timed from each one's due time, as lookup_latency). */
static lat_t rtt(ctx_t *x, bool redis, double rate) {
    enum { N = 2000 };
    static double lat[N];
    double next = now_s();
    int fd = -1;
    if (!redis) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)x->ps_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(fd, (struct sockaddr *)&a, sizeof a))
            abort();
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof one);
    }
    for (int i = 0; i < N; i++) {
        if (rate > 0)
            for (next += 1.0 / rate; now_s() < next;)
                ;
        const double a = now_s();
        if (redis) {
            redisReply *r = redisCommand(x->rd, "PING");
            freeReplyObject(r);
        } else {
            uint8_t h[PC_WIRE_HDR];
            pc_wire_hdr_t hd = {.op = PC_OP_PING, .id = (uint64_t)i};
            pc_wire_hdr_encode(&hd, h);
            if (send(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
                abort();
            for (size_t got = 0; got < sizeof h;) {
                ssize_t r = recv(fd, h + got, sizeof h - got, 0);
                if (r <= 0)
                    abort();
                got += (size_t)r;
            }
        }
        lat[i] = now_s() - (rate > 0 ? next : a);
    }
    if (fd >= 0)
        close(fd);
    return percentiles(lat, N);
}

/* Lookup latency and the PING round trip against a second ps-server whose event loop busy-polls
 * (--poll-us=POLL_US, docs/wire.md "Latency: busy polling"), same settings and pinning as the
 * first; its rows filled first. lk: 26-key lookups at `rate`; rt: back-to-back PINGs. -1 when it
 * cannot start. */
#define POLL_US "1000"
static int poll_latency(ctx_t *x, const bench_opts_t *o, const char *dir, double rate, lat_t *lk,
                        lat_t *rt) {
    const char *extra[] = {"--grpc-port=-1", "--poll-us=" POLL_US,
                           "--tables=name=b64,dim=64,optimizer=adagrad", NULL};
    int port;
    const pid_t pid = bench_ps_server(o, "rpc", dir, "poll", extra, &port, NULL);
    if (pid < 0)
        return -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_opts_t co = {.servers = addr, .timeout_ms = 60000};
    psc_t *plain_ps = x->ps, *poll_ps = NULL;
    const int plain_port = x->ps_port;
    if (psc_connect(&co, &poll_ps)) {
        fprintf(stderr, "ps-bench rpc: cannot connect to the polling ps-server\n");
        bench_stop(pid);
        return -1;
    }
    fill_b64(x, poll_ps);
    x->ps = poll_ps;
    x->ps_port = port;
    *lk = lookup_latency(x, false, 64, rate, 5);
    *rt = rtt(x, false, 0);
    x->ps = plain_ps;
    x->ps_port = plain_port;
    psc_close(poll_ps);
    bench_stop(pid);
    return 0;
}

/* ==== main ================================================================================= */

/* A failed run: the servers stopped, its directory (port files, logs, the certificate) gone. */
static int give_up(pid_t ps, pid_t rd, const char *dir) {
    bench_stop(ps);
    bench_stop(rd);
    pc_fs_rm_tree(dir);
    return 1;
}

int bench_rpc_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "rpc", &o);
    signal(SIGPIPE, SIG_IGN);
    ctx_t x = {.o = &o};
    x.nkeys = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 5000 : o.quick ? 200000 : 1000000;
    x.secs = o.seconds > 0 ? o.seconds : o.smoke ? 0.2 : o.quick ? 1.0 : 2.0;
    char dir[256];
    bench_tmpdir("rpc", dir, sizeof dir);
    const char *extra[] = {
        "--grpc-threads=1",
        "--tables=name=b16,dim=16,optimizer=adagrad;name=b64,dim=64,optimizer=adagrad", NULL};
    const pid_t ps = bench_ps_server(&o, "rpc", dir, "plain", extra, &x.ps_port, &x.grpc_port);
    if (ps < 0)
        return give_up(-1, -1, dir);
    x.rd_port = bench_free_port();
    char rport[16];
    snprintf(rport, sizeof rport, "%d", x.rd_port);
    char *rargv[] = {"redis-server", "--port",     rport,          "--bind", "127.0.0.1",
                     "--save",       "",           "--appendonly", "no",     "--protected-mode",
                     "no",           "--loglevel", "warning",      NULL};
    pid_t rd = bench_spawn(&o, rargv);
    for (int i = 0; i < 500 && !x.rd; i++) {
        redisContext *r = redisConnectWithTimeout("127.0.0.1", x.rd_port, (struct timeval){1, 0});
        if (r && !r->err && redisSetTimeout(r, (struct timeval){60, 0}) == REDIS_OK)
            x.rd = r; /* (a stalled redis-server fails the bench instead of hanging it) */
        else {
            redisFree(r);
            usleep(10000);
        }
    }
    if (!x.rd) {
        fprintf(stderr, "ps-bench rpc: redis-server did not start (is it installed?)\n");
        return give_up(ps, rd, dir);
    }
    bench_pin(&o, 1); /* the client (and its I/O thread, created below) on the other CPU */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", x.ps_port);
    psc_opts_t co = {.servers = addr, .timeout_ms = 60000};
    char gaddr[64];
    snprintf(gaddr, sizeof gaddr, "127.0.0.1:%d", x.grpc_port);
    const psg_opts_t go = {.addr = gaddr, .max_message = 256u << 20};
    if (psc_connect(&co, &x.ps) || psg_create(&go, &x.grpc)) {
        fprintf(stderr, "ps-bench rpc: cannot connect to ps-server\n");
        return give_up(ps, rd, dir);
    }
    printf("ps-bench rpc: %llu keys, batch %d, %.1f s per sample, server and redis on one CPU, "
           "client on another%s\n",
           (unsigned long long)x.nkeys, B, x.secs, o.pin ? "" : " (unpinned)");
    static const uint32_t dims[2] = {16, 64};
    double pull[2][2], push[2][2], mget[2][2], hmget[2][2];
    for (int d = 0; d < 2; d++) {
        const char *table = d ? "b64" : "b16";
        redis_fill(&x, table, dims[d]);
        for (int f = 0; f < 2; f++) {
            const int inflight = f ? W : 1;
            pull[d][f] = dp_rate(&x, table, dims[d], inflight, false, 10 + (uint64_t)f);
            mget[d][f] = redis_rate(&x, false, dims[d], inflight, 10 + (uint64_t)f);
            hmget[d][f] = redis_rate(&x, true, dims[d], inflight, 10 + (uint64_t)f);
            push[d][f] = dp_rate(&x, table, dims[d], inflight, true, 20 + (uint64_t)f);
            printf("dim %2u, %d in flight: pull %9.0f  push(adagrad) %9.0f  redis MGET %9.0f  "
                   "HMGET %9.0f rows/s  (pull / HMGET %.2f)\n",
                   dims[d], inflight, pull[d][f], push[d][f], mget[d][f], hmget[d][f],
                   pull[d][f] / hmget[d][f]);
        }
    }
    /* Pull bytes at dim 64, 8 in flight, against a loopback TCP stream: pairs alternating. */
    pairs_t lo;
    for (int r = 0; r < PAIRS; r++) {
        const double p = dp_rate(&x, "b64", 64, W, false, 60 + (uint64_t)r) * 64 * 4;
        const double l = loopback_rate(&x, (size_t)B * 64 * 4);
        if (l <= 0) {
            return give_up(ps, rd, dir);
        }
        fig_add(&lo, r, p, l);
    }
    const double lo_pull = bench_median3(lo.a), lo_bytes = bench_median3(lo.base),
                 lo_ratio = bench_median3(lo.ratio);
    printf("dim 64, %d in flight: pull %.0f MB/s, loopback TCP stream %.0f MB/s (pull / "
           "loopback %.2f)\n",
           W, lo_pull * 1e-6, lo_bytes * 1e-6, lo_ratio);
    /* Compressed rows: bf16 against f32, pairs alternating, dims 64 and 16. */
    pairs_t wpull[2], wpush[2]; /* [0] dim 64, [1] dim 16 */
    for (int d = 0; d < 2; d++) {
        const uint32_t dim = d ? 16 : 64;
        const char *table = d ? "b16" : "b64";
        wire_pairs(&x, table, dim, false, &wpull[d]);
        wire_pairs(&x, table, dim, true, &wpush[d]);
        printf("dim %2u, %d in flight, bf16 rows: pull %9.0f (f32 %9.0f, bf16 / f32 %.2f)  push "
               "%9.0f (f32 %9.0f, %.2f) rows/s\n",
               dim, W, bench_median3(wpull[d].a), bench_median3(wpull[d].base),
               bench_median3(wpull[d].ratio), bench_median3(wpush[d].a),
               bench_median3(wpush[d].base), bench_median3(wpush[d].ratio));
    }
    double gpull[2], gpush[2];
    for (int f = 0; f < 2; f++) {
        gpull[f] = grpc_rate(&x, "b64", 64, false, f ? W : 1, 30);
        gpush[f] = grpc_rate(&x, "b64", 64, true, f ? W : 1, 31);
        printf("gRPC API, dim 64, %d in flight: pull %9.0f  push(adagrad) %9.0f rows/s\n",
               f ? W : 1, gpull[f], gpush[f]);
    }
    double tls_plain, tls_ratio, tls_pull = tls_pull_rate(&x, &o, dir, &tls_plain, &tls_ratio);
    if (tls_pull < 0) {
        return give_up(ps, rd, dir);
    }
    printf("data plane over TLS, dim 64, %d in flight: pull %9.0f rows/s, plain %9.0f (TLS / "
           "plain %.2f)\n",
           W, tls_pull, tls_plain, tls_ratio);
    double tls_gplain, tls_gratio,
        tls_gpull = tls_grpc_pull_rate(&x, &o, dir, &tls_gplain, &tls_gratio);
    if (tls_gpull < 0) {
        return give_up(ps, rd, dir);
    }
    printf("gRPC over TLS, dim 64, %d in flight: pull %9.0f rows/s, plain %9.0f (TLS / plain "
           "%.2f)\n",
           W, tls_gpull, tls_gplain, tls_gratio);
    const double rate = o.smoke ? 500 : 2000;
    lat_t lk = lookup_latency(&x, false, 64, rate, 5), rl = lookup_latency(&x, true, 64, rate, 5);
    lat_t prtt = rtt(&x, false, 0), rrtt = rtt(&x, true, 0), paced = rtt(&x, false, rate);
    lat_t glk = grpc_lookup_latency(&x, rate, 5);
    lat_t plk, prt;
    if (poll_latency(&x, &o, dir, rate, &plk, &prt)) {
        return give_up(ps, rd, dir);
    }
    printf("lookup of %d keys (dim 64) at %.0f/s: p50 %.0f us, p99 %.0f us; redis MGET: p50 %.0f "
           "us, p99 %.0f us\n",
           LK, rate, lk.p50, lk.p99, rl.p50, rl.p99);
    printf("loopback round trip (PING): data plane p50 %.0f us p99 %.0f us; redis p50 %.0f us "
           "p99 %.0f us\n",
           prtt.p50, prtt.p99, rrtt.p50, rrtt.p99);
    printf("data plane PING at %.0f/s: p50 %.0f us, p99 %.0f us (an idle server core wakes; "
           "lookup p99 / this p50 %.2f, both paced alike)\n",
           rate, paced.p50, paced.p99, lk.p99 / paced.p50);
    printf("server busy-polling (--poll-us=" POLL_US "): lookup at %.0f/s p50 %.0f us, p99 %.0f "
           "us; PING p50 %.0f us (lookup p99 / PING p50 %.2f)\n",
           rate, plk.p50, plk.p99, prt.p50, plk.p99 / prt.p50);
    printf("gRPC Lookup of %d keys at %.0f/s: p50 %.0f us, p99 %.0f us\n", LK, rate, glk.p50,
           glk.p99);

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "rpc");
    cJSON_AddNumberToObject(root, "keys", (double)x.nkeys);
    cJSON_AddNumberToObject(root, "pull_rows_per_s", pull[1][1]);
    cJSON_AddNumberToObject(root, "push_rows_per_s", push[1][1]);
    cJSON_AddNumberToObject(root, "redis_mget_rows_per_s", mget[1][1]);
    cJSON_AddNumberToObject(root, "redis_hmget_rows_per_s", hmget[1][1]);
    cJSON_AddNumberToObject(root, "pull_vs_redis_hmget", pull[1][1] / hmget[1][1]);
    cJSON_AddNumberToObject(root, "pull_bytes_per_s", lo_pull);
    cJSON_AddNumberToObject(root, "loopback_bytes_per_s", lo_bytes);
    cJSON_AddNumberToObject(root, "pull_vs_loopback", lo_ratio);
    cJSON_AddNumberToObject(root, "lookup_p50_us", lk.p50);
    cJSON_AddNumberToObject(root, "lookup_p99_us", lk.p99);
    cJSON_AddNumberToObject(root, "redis_p50_us", rl.p50);
    cJSON_AddNumberToObject(root, "redis_p99_us", rl.p99);
    cJSON_AddNumberToObject(root, "rtt_p50_us", prtt.p50);
    cJSON_AddNumberToObject(root, "rtt_p99_us", prtt.p99);
    cJSON_AddNumberToObject(root, "lookup_p99_vs_rtt_p50", lk.p99 / prtt.p50);
    cJSON_AddNumberToObject(root, "rtt_paced_p50_us", paced.p50);
    cJSON_AddNumberToObject(root, "rtt_paced_p99_us", paced.p99);
    /* the lookups are paced: against a round trip paced alike (both wake an idle core) */
    cJSON_AddNumberToObject(root, "lookup_p99_vs_paced_rtt_p50", lk.p99 / paced.p50);
    cJSON_AddNumberToObject(root, "lookup_poll_p50_us", plk.p50);
    cJSON_AddNumberToObject(root, "lookup_poll_p99_us", plk.p99);
    cJSON_AddNumberToObject(root, "rtt_poll_p50_us", prt.p50);
    cJSON_AddNumberToObject(root, "lookup_poll_p99_vs_rtt_p50", plk.p99 / prt.p50);
    cJSON_AddNumberToObject(root, "grpc_pull_rows_per_s", gpull[1]);
    cJSON_AddNumberToObject(root, "grpc_push_rows_per_s", gpush[1]);
    cJSON_AddNumberToObject(root, "grpc_pull_rows_per_s_1", gpull[0]);
    cJSON_AddNumberToObject(root, "grpc_push_rows_per_s_1", gpush[0]);
    cJSON_AddNumberToObject(root, "grpc_lookup_p50_us", glk.p50);
    cJSON_AddNumberToObject(root, "grpc_lookup_p99_us", glk.p99);
    cJSON_AddNumberToObject(root, "tls_pull_rows_per_s", tls_pull);
    cJSON_AddNumberToObject(root, "tls_pull_vs_plain", tls_ratio);
    cJSON_AddNumberToObject(root, "tls_grpc_pull_rows_per_s", tls_gpull);
    cJSON_AddNumberToObject(root, "tls_grpc_pull_vs_plain", tls_gratio);
    cJSON_AddNumberToObject(root, "pull_bf16_rows_per_s", bench_median3(wpull[0].a));
    cJSON_AddNumberToObject(root, "pull_f32_rows_per_s", bench_median3(wpull[0].base));
    cJSON_AddNumberToObject(root, "pull_bf16_vs_f32", bench_median3(wpull[0].ratio));
    cJSON_AddNumberToObject(root, "push_bf16_rows_per_s", bench_median3(wpush[0].a));
    cJSON_AddNumberToObject(root, "push_f32_rows_per_s", bench_median3(wpush[0].base));
    cJSON_AddNumberToObject(root, "push_bf16_vs_f32", bench_median3(wpush[0].ratio));
    cJSON_AddNumberToObject(root, "pull_bf16_rows_per_s_16", bench_median3(wpull[1].a));
    cJSON_AddNumberToObject(root, "pull_f32_rows_per_s_16", bench_median3(wpull[1].base));
    cJSON_AddNumberToObject(root, "pull_bf16_vs_f32_16", bench_median3(wpull[1].ratio));
    cJSON_AddNumberToObject(root, "push_bf16_rows_per_s_16", bench_median3(wpush[1].a));
    cJSON_AddNumberToObject(root, "push_f32_rows_per_s_16", bench_median3(wpush[1].base));
    cJSON_AddNumberToObject(root, "push_bf16_vs_f32_16", bench_median3(wpush[1].ratio));
    cJSON *cases = cJSON_AddArrayToObject(root, "cases");
    for (int d = 0; d < 2; d++)
        for (int f = 0; f < 2; f++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "dim", dims[d]);
            cJSON_AddNumberToObject(c, "inflight", f ? W : 1);
            cJSON_AddNumberToObject(c, "pull_rows_per_s", pull[d][f]);
            cJSON_AddNumberToObject(c, "push_rows_per_s", push[d][f]);
            cJSON_AddNumberToObject(c, "redis_mget_rows_per_s", mget[d][f]);
            cJSON_AddNumberToObject(c, "redis_hmget_rows_per_s", hmget[d][f]);
            cJSON_AddItemToArray(cases, c);
        }
    psc_close(x.ps);
    psg_destroy(x.grpc);
    redisFree(x.rd);
    bench_stop(ps);
    bench_stop(rd); /* before the JSON: redis says goodbye on the same stdout */
    bench_emit_json(&o, root);
    pc_fs_rm_tree(dir); /* (the TLS server's certificate and key too) */
    return 0;
}
