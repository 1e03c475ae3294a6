/* TLS and the token on the binary data plane, end to end: ps-server processes on loopback with
 * the certificates of deploy/make-certs.sh, libpsclient's psc_connect2, raw sockets and
 * a short ps-worker run.
 *  - pulls, pushes and lookups over TLS equal those over plain TCP (two servers with the same
 *    table), also replies of several MiB, 8 in flight, through a server whose per-connection
 *    reply queue is at its minimum (64 KiB: connections pause and resume with records still
 *    in their TLS session);
 *  - a client that trusts another CA fails psc_connect2 with PC_ETLS and "<addr>: TLS:
 *    certificate verify failed: unable to get local issuer certificate"; a name the certificate
 *    does not carry fails the same way (hostname mismatch);
 *  - a plaintext client to a TLS server fails at once with PC_ETLS and the server's reason,
 *    garbage bytes are closed, and the server goes on serving TLS clients; a TLS client to a
 *    plaintext server fails with PC_ETLS;
 *  - TLS 1.3 with AES-128-GCM whatever the client prefers, TLS 1.2 with ECDHE and AES-128-GCM;
 *    TLS 1.1 and TLS 1.2 suites without forward secrecy or AEAD refused (openssl s_client);
 *  - tls_client_auth=require: without a client certificate refused (PC_ETLS), with it served;
 *    a TLS 1.2 client offering its last session again: full handshakes, never resumed;
 *  - TLS and a token: a wrong token is PC_EAUTH with the server's message ("bad token");
 *  - a TLS client that sends lookups and never reads (pc_tls over a raw socket): the server counts
 *    the ciphertext as unsent reply bytes and stops reading that connection at its cap, while a
 *    reading client is served; all of it goes once the non-reader does;
 *  - ps-worker trains against a TLS + token server (--tls-ca, --token) and fails without them.
 * argv: ps-server, ps-worker, make-certs.sh. Every wait is bounded. */
#include "proc_util.h"
#include "raw_frame.h"
#include "table_check.h"

#include "emberps/psclient.h"
#include "pc_error.h"
#include "pc_tls.h"
#include "pc_wire.h"
#include "pw_datagen.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

static const char *g_worker, *g_certs_sh;
static char g_dir[256], g_certs[300];
static const char *TABLE = "--tables=name=emb,dim=8,optimizer=adagrad,shards=4";
enum { D = 8 };

/* A certificate file of g_certs ("ca.pem") into buf. */
static const char *cert(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_certs, name);
    return buf;
}

/* A flag "--name=<g_certs>/file" into buf. */
static const char *cert_flag(char *buf, size_t cap, const char *flag, const char *name) {
    snprintf(buf, cap, "--%s=%s/%s", flag, g_certs, name);
    return buf;
}

typedef struct tls_files {
    char ca[400], cert[400], key[400];
} tls_files_t;

/* psc_connect2 to 127.0.0.1:port; tls: CA file name (NULL: plain), client cert/key names (may be
 * NULL), server_name; returns the code, the detail in why. */
static int connect_tls(int port, const char *token, const char *ca, const char *client,
                       const char *server_name, char *why, size_t cap, psc_t **out) {
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_opts_t o = {.servers = one,
                    .token = token,
                    .timeout_ms = 10000,
                    .retries = 2,
                    .connect_timeout_ms = 5000};
    tls_files_t f;
    psc_tls_opts_t t = {.server_name = server_name};
    if (ca)
        t.ca = cert(f.ca, sizeof f.ca, ca);
    if (client) {
        char name[64];
        snprintf(name, sizeof name, "%s.pem", client);
        t.cert = cert(f.cert, sizeof f.cert, name);
        snprintf(name, sizeof name, "%s.key", client);
        t.key = cert(f.key, sizeof f.key, name);
    }
    *out = NULL;
    return psc_connect2(&o, ca ? &t : NULL, why, cap, out);
}

static void assert_has(const char *text, const char *part) {
    if (!strstr(text, part))
        fail_msg("\"%s\" does not contain \"%s\"", text, part);
}

static void keys_of(int i, uint64_t *keys, float *g, size_t n) {
    uint64_t rng = 77 + (uint64_t)i;
    for (size_t j = 0; j < n; j++) {
        keys[j] = tu_rand(&rng) % 300000 * 0x9E3779B97F4A7C15ULL;
        if (g)
            for (int e = 0; e < D; e++)
                g[j * D + e] = tu_gauss(&rng) * 0.1f;
    }
}

/* Pulls, pushes, lookups over TLS equal those over plain TCP; replies of several MiB. */
static void test_tls_equals_plain(void **state) {
    (void)state;
    char sc[340], sk[340], why[1024];
    const int pp = pu_free_port(), pt = pu_free_port();
    const char *plain[] = {TABLE, NULL};
    const char *tls[] = {TABLE, cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
                         cert_flag(sk, sizeof sk, "tls-key", "server.key"),
                         "--reply-queue-bytes=65536", NULL};
    pid_t sp = pu_spawn(pp, g_dir, plain, NULL), st = pu_spawn(pt, g_dir, tls, NULL);
    psc_t *a, *b;
    assert_int_equal(connect_tls(pp, NULL, NULL, NULL, NULL, why, sizeof why, &a), 0);
    int rc = connect_tls(pt, NULL, "ca.pem", NULL, NULL, why, sizeof why, &b);
    if (rc)
        fail_msg("TLS connect: %s (%s)", psc_err_name(rc), why);
    enum { N = 1000, BIG = 200000 }; /* BIG x 8 floats: a 6.4 MB reply */
    static uint64_t keys[BIG];
    static float g[N * D], x[BIG * D], y[BIG * D];
    static uint8_t fx[N], fy[N];
    for (int i = 0; i < 20; i++) {
        keys_of(i, keys, g, N);
        assert_int_equal(psc_pull(a, "emb", keys, N, D, x), 0);
        assert_int_equal(psc_pull(b, "emb", keys, N, D, y), 0);
        assert_memory_equal(x, y, N * D * sizeof(float));
        psc_push_result_t ra, rb;
        assert_int_equal(psc_push(a, "emb", keys, N, D, g, &ra), 0);
        assert_int_equal(psc_push(b, "emb", keys, N, D, g, &rb), 0);
        assert_int_equal(ra.applied, rb.applied);
    }
    assert_int_equal(psc_lookup(a, "emb", keys, N, D, x, fx), 0);
    assert_int_equal(psc_lookup(b, "emb", keys, N, D, y, fy), 0);
    assert_memory_equal(x, y, N * D * sizeof(float));
    assert_memory_equal(fx, fy, N);
    /* several MiB per reply, 8 in flight over one TLS connection with a 64 KiB reply queue */
    keys_of(99, keys, NULL, BIG);
    assert_int_equal(psc_pull(a, "emb", keys, BIG, D, x), 0);
    static float rows[8][BIG * D];
    uint64_t ids[8];
    for (int k = 0; k < 8; k++)
        assert_int_equal(psc_pull_async(b, "emb", keys, BIG, D, rows[k], NULL, NULL, &ids[k]), 0);
    for (int k = 0; k < 8; k++) {
        rc = psc_wait_detail(b, ids[k], why, sizeof why);
        if (rc)
            fail_msg("big pull %d over TLS: %s (%s)", k, psc_err_name(rc), why);
        assert_memory_equal(rows[k], x, sizeof rows[k]);
    }
    /* a large push (6.4 MB of gradients) through TLS too */
    static float gb[BIG * D];
    for (size_t j = 0; j < (size_t)BIG * D; j++)
        gb[j] = (float)(j % 7) * 0.01f;
    assert_int_equal(psc_push(a, "emb", keys, BIG, D, gb, NULL), 0);
    assert_int_equal(psc_push(b, "emb", keys, BIG, D, gb, NULL), 0);
    assert_int_equal(psc_pull(a, "emb", keys, BIG, D, x), 0);
    assert_int_equal(psc_pull(b, "emb", keys, BIG, D, y), 0);
    assert_memory_equal(x, y, sizeof x);
    psc_close(a);
    psc_close(b);
    pu_stop(sp);
    pu_stop(st);
}

/* Certificates that do not verify, plaintext against TLS and TLS against plaintext. */
static void test_tls_refusals(void **state) {
    (void)state;
    char sc[340], sk[340], why[1024], want[200];
    const int pt = pu_free_port(), pp = pu_free_port();
    const char *tls[] = {TABLE, cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
                         cert_flag(sk, sizeof sk, "tls-key", "server.key"), NULL};
    const char *plain[] = {TABLE, NULL};
    pid_t st = pu_spawn(pt, g_dir, tls, NULL), sp = pu_spawn(pp, g_dir, plain, NULL);
    psc_t *c;
    /* another CA */
    int rc = connect_tls(pt, NULL, "other-ca.pem", NULL, NULL, why, sizeof why, &c);
    print_message("other CA: %s: %s\n", psc_err_name(rc), why);
    assert_int_equal(rc, PC_ETLS);
    assert_null(c);
    snprintf(want, sizeof want,
             "127.0.0.1:%d: TLS: certificate verify failed: unable to get local issuer certificate",
             pt);
    assert_string_equal(why, want);
    /* the right CA, a name the certificate does not carry */
    rc = connect_tls(pt, NULL, "ca.pem", NULL, "db.example.com", why, sizeof why, &c);
    print_message("wrong name: %s: %s\n", psc_err_name(rc), why);
    assert_int_equal(rc, PC_ETLS);
    assert_has(why, "TLS: certificate verify failed: hostname mismatch");
    /* a CA file that does not exist */
    rc = connect_tls(pt, NULL, "nope.pem", NULL, NULL, why, sizeof why, &c);
    assert_int_equal(rc, PC_ENOTFOUND);
    assert_has(why, "nope.pem");
    /* plaintext to the TLS server: PC_ETLS at once, with the server's reason */
    double t0 = pu_now();
    rc = connect_tls(pt, NULL, NULL, NULL, NULL, why, sizeof why, &c);
    print_message("plaintext to TLS: %s: %s (%.3f s)\n", psc_err_name(rc), why, pu_now() - t0);
    assert_int_equal(rc, PC_ETLS);
    assert_has(why, "takes TLS connections only");
    assert_true(pu_now() - t0 < 2.0);
    /* garbage bytes: closed (read gives EOF), no hang */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)pt),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(write(fd, "GET / HTTP/1.0\r\n\r\n", 18), 18);
    char buf[64];
    assert_int_equal(read(fd, buf, sizeof buf), 0);
    close(fd);
    /* TLS to the plaintext server */
    rc = connect_tls(pp, NULL, "ca.pem", NULL, NULL, why, sizeof why, &c);
    print_message("TLS to plaintext: %s: %s\n", psc_err_name(rc), why);
    assert_int_equal(rc, PC_ETLS);
    assert_has(why, "TLS: the server answered in plaintext");
    /* the TLS server still serves */
    rc = connect_tls(pt, NULL, "ca.pem", NULL, "localhost", why, sizeof why, &c);
    if (rc)
        fail_msg("TLS connect after the refusals: %s (%s)", psc_err_name(rc), why);
    uint64_t k[3] = {1, 2, 3};
    float r[3 * D];
    assert_int_equal(psc_pull(c, "emb", k, 3, D, r), 0);
    psc_close(c);
    pu_stop(st);
    pu_stop(sp);
}

/* `openssl s_client` (args after the address) with 127.0.0.1:port: the lines of its output
 * that say what a handshake gave ("New, ...", "Reused, ...") and any error, in buf. */
static void s_client_all(int port, const char *args, char *buf, size_t cap) {
    char cmd[2048], ca[400], line[512];
    snprintf(cmd, sizeof cmd,
             "timeout 20 openssl s_client -connect 127.0.0.1:%d -CAfile '%s' "
             "-verify_return_error %s </dev/null 2>&1",
             port, cert(ca, sizeof ca, "ca.pem"), args);
    buf[0] = '\0';
    size_t at = 0;
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        if ((!strncmp(line, "New, ", 5) || !strncmp(line, "Reused, ", 8) ||
             strstr(line, "error")) &&
            at < cap)
            at += (size_t)snprintf(buf + at, cap - at, "%s", line);
    pclose(f);
}

/* What `openssl s_client` (args after the address) negotiates with 127.0.0.1:port: its
 * "New, <protocol>, Cipher is <suite>" line into buf ("" when it printed none). */
static void s_client(int port, const char *args, char *buf, size_t cap) {
    char out[4096];
    s_client_all(port, args, out, sizeof out);
    const char *l = strstr(out, "New, ");
    snprintf(buf, cap, "%.*s", l ? (int)strcspn(l, "\n") : 0, l ? l : "");
    print_message("s_client %s: %s\n", args, buf);
}

/* Protocols and suites: TLS 1.3 with AES-128-GCM even for a client that prefers AES-256 (the
 * server's order), TLS 1.2 with ECDHE and AES-128-GCM; a TLS 1.2 suite without forward secrecy
 * or AEAD, and TLS 1.1, are refused. */
static void test_tls_versions_and_suites(void **state) {
    (void)state;
    char sc[340], sk[340], got[512];
    const int pt = pu_free_port();
    const char *tls[] = {TABLE, cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
                         cert_flag(sk, sizeof sk, "tls-key", "server.key"), NULL};
    pid_t st = pu_spawn(pt, g_dir, tls, NULL);
    s_client(pt, "-ciphersuites TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256", got, sizeof got);
    assert_string_equal(got, "New, TLSv1.3, Cipher is TLS_AES_128_GCM_SHA256");
    s_client(pt, "-tls1_2", got, sizeof got);
    assert_string_equal(got, "New, TLSv1.2, Cipher is ECDHE-ECDSA-AES128-GCM-SHA256");
    s_client(pt, "-tls1_2 -cipher ECDHE-ECDSA-AES128-SHA:AES128-GCM-SHA256", got, sizeof got);
    assert_string_equal(got, "New, (NONE), Cipher is (NONE)");
    s_client(pt, "-tls1_1 -cipher DEFAULT@SECLEVEL=0", got, sizeof got);
    assert_string_equal(got, "New, (NONE), Cipher is (NONE)");
    pu_stop(st);
}

/* tls_client_auth=require: a client without a certificate is refused, one with it is served;
 * a token on top: the wrong one is PC_EAUTH with the server's message. */
static void test_tls_client_auth_and_token(void **state) {
    (void)state;
    char sc[340], sk[340], sca[340], why[1024];
    const int pt = pu_free_port();
    const char *tls[] = {TABLE,
                         cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
                         cert_flag(sk, sizeof sk, "tls-key", "server.key"),
                         cert_flag(sca, sizeof sca, "tls-ca", "ca.pem"),
                         "--tls-client-auth=require",
                         "--token=s3cret",
                         NULL};
    pid_t st = pu_spawn(pt, g_dir, tls, NULL);
    psc_t *c;
    double t0 = pu_now();
    int rc = connect_tls(pt, "s3cret", "ca.pem", NULL, NULL, why, sizeof why, &c);
    print_message("no client certificate: %s: %s (%.3f s)\n", psc_err_name(rc), why, pu_now() - t0);
    assert_int_equal(rc, PC_ETLS);
    assert_null(c);
    assert_has(why, "TLS: ");
    assert_true(pu_now() - t0 < 2.0);
    rc = connect_tls(pt, "wrong", "ca.pem", "client", NULL, why, sizeof why, &c);
    print_message("wrong token: %s: %s\n", psc_err_name(rc), why);
    assert_int_equal(rc, PC_EAUTH);
    assert_has(why, "bad token");
    rc = connect_tls(pt, "s3cret", "ca.pem", "client", NULL, why, sizeof why, &c);
    if (rc)
        fail_msg("client certificate and token: %s (%s)", psc_err_name(rc), why);
    uint64_t k[3] = {1, 2, 3};
    float r[3 * D];
    assert_int_equal(psc_pull(c, "emb", k, 3, D, r), 0);
    psc_close(c);
    /* a TLS 1.2 client that offers its last session again (openssl -reconnect: five times) gets
     * full handshakes, none resumed (no session cache, no tickets); with client certificates
     * asked, the session offered failed every handshake (no session id context) */
    char certs[400], key[400], args[1200], out[8192];
    snprintf(args, sizeof args, "-tls1_2 -reconnect -cert '%s' -key '%s'",
             cert(certs, sizeof certs, "client.pem"), cert(key, sizeof key, "client.key"));
    s_client_all(pt, args, out, sizeof out);
    int fresh = 0;
    for (const char *l = out; (l = strstr(l, "New, TLSv1.2")) != NULL; l++)
        fresh++;
    print_message("TLS 1.2 reconnects: %d full handshakes, resumed: %s\n", fresh,
                  strstr(out, "Reused,") ? "yes" : "no");
    assert_null(strstr(out, "Reused,"));
    assert_int_equal(fresh, 6);
    pu_stop(st);
}

/* A TLS connection over a blocking socket (pc_tls), handshake done; its session in *tls. */
static int tls_raw_connect(int port, pc_tls_ctx_t *ctx, pc_tls_t **tls) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 16 << 10;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(pc_tls_new(ctx, "127.0.0.1", tls), 0);
    for (int rc; (rc = pc_tls_handshake(*tls)) != 0;) {
        assert_int_equal(rc, PC_EAGAIN);
        uint8_t out[8192];
        for (size_t n; (n = pc_tls_take(*tls, out, sizeof out)) > 0;)
            assert_int_equal(send(fd, out, n, MSG_NOSIGNAL), (ssize_t)n);
        void *in;
        size_t cap;
        assert_int_equal(pc_tls_inbuf(*tls, &in, &cap), 0);
        const ssize_t r = recv(fd, in, cap, 0);
        assert_true(r > 0);
        pc_tls_received(*tls, (size_t)r);
    }
    return fd;
}

/* A TLS client that sends lookups with 1 MiB replies and never reads: the server counts their
 * ciphertext as unsent and stops reading the connection at reply_queue_bytes (2 MiB); a client
 * that reads is served meanwhile; once the non-reader goes, nothing is left queued. */
static void test_tls_unsent_bounded(void **state) {
    (void)state;
    char sc[340], sk[340], why[1024];
    const int port = pu_free_port();
    const char *tls[] = {
        "--tables=name=wide,dim=256,shards=4", cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
        cert_flag(sk, sizeof sk, "tls-key", "server.key"), "--reply-queue-bytes=2Mi", NULL};
    pid_t s = pu_spawn(port, g_dir, tls, NULL);
    const int mp = pu_last_metrics_port;
    enum { DIM = 256, N = 1024, COUNT = 40 };
    const double reply = (double)N * DIM * 4 + N, cap = 2 << 20;
    const double reply_alloc = reply + 64 * 1024; /* header, TLS records, allocation */
    char ca[400];
    pc_tls_opts_t to = {.ca = cert(ca, sizeof ca, "ca.pem")};
    pc_tls_ctx_t *ctx;
    assert_int_equal(pc_tls_ctx_create(&to, &ctx, why, sizeof why), 0);
    pc_tls_t *t;
    const int fd = tls_raw_connect(port, ctx, &t);
    static uint8_t frame[PC_WIRE_HDR + 64 + 8 * N], sealed[2 * sizeof frame];
    const uint32_t len = (uint32_t)pc_wire_batch_body_len(PC_OP_LOOKUP, 4, N, DIM);
    assert_true(PC_WIRE_HDR + len <= sizeof frame);
    uint8_t *b = frame + PC_WIRE_HDR;
    b += pc_wire_batch_head_encode("wide", N, DIM, b);
    for (uint32_t i = 0; i < N; i++)
        ((uint64_t *)(void *)b)[i] = (uint64_t)i * 7919;
    struct timeval tv = {0, 200000}; /* blocking sends: the server stops reading at its cap */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int sent = 0;
    for (; sent < COUNT; sent++) {
        pc_wire_hdr_t hd = {.op = PC_OP_LOOKUP, .id = 1 + (uint64_t)sent, .body_len = len};
        pc_wire_hdr_encode(&hd, frame);
        size_t n;
        assert_int_equal(pc_tls_seal(t, frame, PC_WIRE_HDR + len, sealed, sizeof sealed, &n), 0);
        if (send(fd, sealed, n, MSG_NOSIGNAL) != (ssize_t)n)
            break;
    }
    double paused = 0;
    for (double t0 = pu_now(); pu_now() - t0 < 5 && paused < 1; usleep(20000))
        paused = metric(mp, "emberps_dataplane_paused_connections");
    const double queued = metric(mp, "emberps_dataplane_reply_queue_bytes");
    const double peak = metric(mp, "emberps_dataplane_reply_queue_peak_bytes");
    print_message("TLS non-reader: %d lookups sent, %.2f MiB unsent (peak %.2f), %g paused\n", sent,
                  queued / (1 << 20), peak / (1 << 20), paused);
    assert_true(paused >= 1);
    assert_true(queued >= reply);           /* the ciphertext counts as unsent */
    assert_true(peak <= cap + reply_alloc); /* and no more than the cap and one reply */
    psc_t *c;
    int rc = connect_tls(port, NULL, "ca.pem", NULL, NULL, why, sizeof why, &c);
    if (rc)
        fail_msg("TLS connect beside the non-reader: %s (%s)", psc_err_name(rc), why);
    uint64_t keys[64];
    static float rows[64 * DIM];
    for (int i = 0; i < 64; i++)
        keys[i] = (uint64_t)i * 31 + 5;
    for (int k = 0; k < 10; k++)
        assert_int_equal(psc_pull(c, "wide", keys, 64, DIM, rows), 0);
    close(fd);
    pc_tls_free(t);
    pc_tls_ctx_destroy(ctx);
    double left = -1;
    for (double t0 = pu_now(); pu_now() - t0 < 5 && left != 0; usleep(20000))
        left = metric(mp, "emberps_dataplane_reply_queue_bytes");
    assert_true(left == 0);
    assert_true(metric(mp, "emberps_dataplane_paused_connections") == 0);
    assert_int_equal(psc_pull(c, "wide", keys, 64, DIM, rows), 0);
    psc_close(c);
    pu_stop(s);
}

/* ps-worker (a process) with args; its exit status, its stderr into err. */
static int run_worker(const char *const *args, char *err, size_t cap) {
    char tr[320], errf[320];
    snprintf(tr, sizeof tr, "--train=%s/train.tsv", g_dir);
    snprintf(errf, sizeof errf, "%s/worker.err", g_dir);
    const char *argv[32] = {g_worker, "--progress-every=0", "--timeout-ms=20000", tr};
    int a = 4;
    for (int i = 0; args[i] && a < 31; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen(errf, "w", stderr))
            _exit(126);
        execv(g_worker, (char *const *)argv);
        _exit(127);
    }
    int rc = pu_reap(pid, 120);
    err[0] = '\0';
    FILE *f = fopen(errf, "r");
    if (f) {
        err[fread(err, 1, cap - 1, f)] = '\0';
        fclose(f);
    }
    return rc;
}

/* ps-worker against a TLS + token server: trains with --tls-ca and --token, fails without. */
/* hello_timeout_ms: a connection that sends nothing, or part of a ClientHello, is closed after
 * it (both held their buffers for ever); one that finished the handshake and HELLO stays. */
static void test_hello_deadline(void **state) {
    (void)state;
    char sc[340], sk[340];
    const int pt = pu_free_port(), pk = pu_free_port();
    const char *tls[] = {TABLE, cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
                         cert_flag(sk, sizeof sk, "tls-key", "server.key"),
                         "--hello-timeout-ms=500", NULL};
    const char *token[] = {TABLE, "--token=s3cret", "--hello-timeout-ms=500", NULL};
    pid_t st = pu_spawn(pt, g_dir, tls, NULL), sk2 = pu_spawn(pk, g_dir, token, NULL);
    psc_t *c;
    char why[1024];
    assert_int_equal(connect_tls(pt, NULL, "ca.pem", NULL, NULL, why, sizeof why, &c), 0);
    int part = raw_connect(pt), none = raw_connect(pt), plain = raw_connect(pk);
    assert_true(part >= 0 && none >= 0 && plain >= 0);
    assert_int_equal(send(part, "\x16\x03\x01", 3, 0), 3); /* a record header, no more */
    const double a = raw_closed_after(part, 5), b = raw_closed_after(none, 5),
                 d = raw_closed_after(plain, 5);
    print_message("closed after %.2f s (part of a ClientHello), %.2f s (nothing, TLS), %.2f s "
                  "(nothing, token)\n",
                  a, b, d);
    assert_true(a > 0 && b > 0 && d > 0);
    uint64_t k[2] = {1, 2};
    float r[2 * D];
    assert_int_equal(psc_pull(c, "emb", k, 2, D, r), 0); /* admitted: still served */
    psc_close(c);
    close(part);
    close(none);
    close(plain);
    pu_stop(st);
    pu_stop(sk2);
}

static void test_worker_tls(void **state) {
    (void)state;
    char sc[340], sk[340], srv[64], ca[340], err[8192];
    const int pt = pu_free_port();
    const char *tls[] = {"--tables=name=emb,dim=16,seed=1",
                         cert_flag(sc, sizeof sc, "tls-cert", "server.pem"),
                         cert_flag(sk, sizeof sk, "tls-key", "server.key"), "--token=t0k", NULL};
    pid_t st = pu_spawn(pt, g_dir, tls, NULL);
    snprintf(srv, sizeof srv, "--servers=127.0.0.1:%d", pt);
    const char *bare[] = {srv, "--token=t0k", NULL};
    assert_int_not_equal(run_worker(bare, err, sizeof err), 0);
    if (!strstr(err, "takes TLS connections only"))
        fail_msg("worker without --tls-ca, stderr:\n%s", err);
    const char *good[] = {srv, "--token=t0k", cert_flag(ca, sizeof ca, "tls-ca", "ca.pem"), NULL};
    const int rc = run_worker(good, err, sizeof err);
    if (rc)
        fail_msg("worker over TLS exited %d, stderr:\n%s", rc, err);
    pu_stop(st);
}

static int setup(void **state) {
    (void)state;
    tc_tmpdir(g_dir, sizeof g_dir, "dptls");
    snprintf(g_certs, sizeof g_certs, "%s/certs", g_dir);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "timeout 60 bash '%s' '%s' >/dev/null 2>&1", g_certs_sh, g_certs);
    if (system(cmd) != 0) {
        fprintf(stderr, "make-certs.sh failed\n");
        return -1;
    }
    char train[320];
    snprintf(train, sizeof train, "%s/train.tsv", g_dir);
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.rows = 3000;
    o.test_rows = 0;
    o.vocab_max = 2000;
    FILE *a = fopen(train, "w");
    if (!a || pw_datagen_run(&o, a, NULL, NULL))
        return -1;
    fclose(a);
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
        fprintf(stderr, "usage: %s PS_SERVER PS_WORKER MAKE_CERTS_SH\n", argv[0]);
        return 2;
    }
    pu_bin = argv[1];
    g_worker = argv[2];
    g_certs_sh = argv[3];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls_equals_plain),
        cmocka_unit_test(test_tls_refusals),
        cmocka_unit_test(test_tls_versions_and_suites),
        cmocka_unit_test(test_tls_client_auth_and_token),
        cmocka_unit_test(test_tls_unsent_bounded),
        cmocka_unit_test(test_hello_deadline),
        cmocka_unit_test(test_worker_tls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
