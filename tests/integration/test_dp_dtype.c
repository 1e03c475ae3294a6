/* Compressed rows on the data plane (docs/wire.md "Compressed rows"), end to end:
 *  - two ps-servers with a 2-way map, tables of dim 8 and 13 (a tail that is not a multiple of
 *    8): pulls, lookups and pushes in bf16 and f16 give exactly the fp32 results converted
 *    (rows: the table's rows rounded; pushes: a local table given the rounded gradients holds the
 *    same rows afterwards), calls spread over both servers and within one;
 *  - f32 and typed frames interleaved on the same connections (one client switching its type
 *    between asynchronous calls in flight, and an f32 client beside it);
 *  - raw frames: a typed PULL's reply says its type in the flags and carries 2 bytes an element,
 *    an f32 reply's flags are exactly "response" (what a client of wire v1 requires); an unknown
 *    type is PC_EUNSUPPORTED with a message naming it, a typed push of the wrong length
 *    PC_EINVAL, and the connection lives;
 *  - f16 gradients beyond 65504 arrive as Inf and are skipped (skipped_nonfinite);
 *  - a server of wire v1 (a stand-in in this process that answers as the old decoder did):
 *    a typed call fails with PC_EUNSUPPORTED and a detail that says why; f32 calls work.
 * argv[1] is the ps-server binary. Every wait is bounded. */
#include "proc_util.h"
#include "raw_frame.h"
#include "table_check.h"

#include "emberps/psclient.h"
#include "pc_error.h"
#include "pc_half.h"
#include "pc_wire.h"

#include <pthread.h>
#include <stdatomic.h>

static const char *TABLES = "name=emb,dim=8,optimizer=adagrad,shards=4;"
                            "name=odd,dim=13,optimizer=adam,lr=0.01";

static psc_t *connect_to(const char *servers) {
    psc_opts_t o = {.servers = servers, .timeout_ms = 5000, .retries = 8};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

/* x rounded to wire type t and back (what the other end sees). */
static void round_trip(int t, const float *x, float *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = t == PSC_WIRE_BF16  ? pc_bf16_to_f32(pc_f32_to_bf16(x[i]))
                 : t == PSC_WIRE_F16 ? pc_f16_to_f32(pc_f32_to_f16(x[i]))
                                     : x[i];
}

static void batch(int i, uint64_t *keys, float *g, int n, int dim) {
    uint64_t rng = 900 + (uint64_t)i;
    for (int j = 0; j < n; j++) {
        keys[j] = tu_rand(&rng) % 3000 * 0x9E3779B97F4A7C15ULL;
        for (int e = 0; e < dim; e++)
            g[j * dim + e] = tu_gauss(&rng) * 0.1f;
    }
}

static void assert_bits_equal(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4))
            fail_msg("element %zu: %a, expected %a", i, (double)a[i], (double)b[i]);
}

static void test_typed_matches_f32(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], tables[300], one[64];
    tc_tmpdir(dir, sizeof dir, "dpdt");
    const int p0 = pu_free_port(), p1 = pu_free_port();
    snprintf(map, sizeof map,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", p0, p1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(tables, sizeof tables, "--tables=%s", TABLES);
    const char *extra[] = {maparg, tables, NULL};
    pid_t s0 = pu_spawn(p0, dir, extra, NULL), s1 = pu_spawn(p1, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", p0);
    psc_t *c = connect_to(one), *c32 = connect_to(one);
    assert_int_equal(psc_wire_type(c), PSC_WIRE_F32);
    assert_int_equal(psc_set_wire_type(c, 3), PC_EINVAL);
    assert_int_equal(psc_set_wire_type(c, -1), PC_EINVAL);
    assert_int_equal(psc_set_wire_type(NULL, PSC_WIRE_BF16), PC_EINVAL);
    enum { N = 600, DMAX = 13 };
    static uint64_t keys[N];
    static float g[N * DMAX], gr[N * DMAX], x[N * DMAX], y[N * DMAX], yr[N * DMAX];
    static uint8_t fx[N], fy[N];
    static const char *const spec[2] = {"name=emb,dim=8,optimizer=adagrad,shards=4",
                                        "name=odd,dim=13,optimizer=adam,lr=0.01"};
    for (int ti = 0; ti < 2; ti++) {
        const char *name = ti ? "odd" : "emb";
        const uint32_t dim = ti ? 13 : 8;
        ps_table_t *ref = tc_create(spec[ti]);
        for (int i = 0; i < 30; i++) {
            const int t = i % 3; /* f32, bf16, f16 in turn against the same tables */
            assert_int_equal(psc_set_wire_type(c, t), 0);
            assert_int_equal(psc_wire_type(c), t);
            batch(i + 100 * ti, keys, g, N, (int)dim);
            assert_int_equal(psc_pull(c, name, keys, N, dim, x), 0);
            assert_int_equal(ps_table_pull(ref, keys, N, y, N * dim), 0);
            round_trip(t, y, yr, N * dim);
            assert_bits_equal(x, yr, N * dim);
            psc_push_result_t r;
            ps_push_result_t lr;
            assert_int_equal(psc_push(c, name, keys, N, dim, g, &r), 0);
            round_trip(t, g, gr, N * dim); /* the server pushes what arrived */
            assert_int_equal(ps_table_push(ref, keys, N, gr, N * dim, &lr), 0);
            assert_int_equal(r.applied, lr.applied);
            /* the table's rows, in f32: exactly the local table's */
            assert_int_equal(psc_pull(c32, name, keys, N, dim, x), 0);
            assert_int_equal(ps_table_pull(ref, keys, N, y, N * dim), 0);
            assert_bits_equal(x, y, N * dim);
            /* lookups, half of them of absent keys */
            for (int j = 0; j < N; j += 2)
                keys[j] ^= 0x5555000000000000ULL;
            memset(fx, 7, sizeof fx);
            assert_int_equal(psc_lookup(c, name, keys, N, dim, x, fx), 0);
            assert_int_equal(ps_table_lookup(ref, keys, N, y, N * dim, fy), 0);
            round_trip(t, y, yr, N * dim);
            assert_bits_equal(x, yr, N * dim);
            assert_memory_equal(fx, fy, N);
        }
        ps_table_destroy(ref);
    }
    /* Mixed frames on the same connections: asynchronous pulls in flight, the client's type
     * changed between them, and an f32 client's pulls beside them. */
    batch(7, keys, g, N, 8);
    ps_table_t *ref = tc_create(spec[0]);
    static float rows[9][N * 8];
    uint64_t ids[9], id32;
    for (int k = 0; k < 9; k++) {
        assert_int_equal(psc_set_wire_type(c, k % 3), 0);
        assert_int_equal(psc_pull_async(c, "emb", keys, N, 8, rows[k], NULL, NULL, &ids[k]), 0);
    }
    assert_int_equal(psc_pull_async(c32, "emb", keys, N, 8, x, NULL, NULL, &id32), 0);
    for (int k = 0; k < 9; k++)
        assert_int_equal(psc_wait(c, ids[k]), 0);
    assert_int_equal(psc_wait(c32, id32), 0);
    for (int k = 0; k < 9; k++) {
        round_trip(k % 3, x, yr, N * 8);
        assert_bits_equal(rows[k], yr, N * 8);
    }
    /* f16 gradients beyond its range arrive as Inf: skipped, rows unchanged. */
    assert_int_equal(psc_set_wire_type(c, PSC_WIRE_F16), 0);
    uint64_t k4[4] = {11, 12, 13, 14};
    float before[4 * 8], after[4 * 8], big[4 * 8];
    for (int i = 0; i < 4 * 8; i++)
        big[i] = i < 8 ? 1e5f : 0.001f; /* the first row has gradients over 65504 */
    assert_int_equal(psc_pull(c32, "emb", k4, 4, 8, before), 0);
    psc_push_result_t r;
    assert_int_equal(psc_push(c, "emb", k4, 4, 8, big, &r), 0);
    assert_int_equal(r.skipped_nonfinite, 1);
    assert_int_equal(r.applied, 3);
    assert_int_equal(psc_pull(c32, "emb", k4, 4, 8, after), 0);
    assert_memory_equal(before, after, 8 * sizeof(float));
    assert_true(memcmp(before + 8, after + 8, 24 * sizeof(float)) != 0);
    /* bf16 keeps fp32's range: the same gradients are applied. */
    assert_int_equal(psc_set_wire_type(c, PSC_WIRE_BF16), 0);
    assert_int_equal(psc_push(c, "emb", k4, 4, 8, big, &r), 0);
    assert_int_equal(r.skipped_nonfinite, 0);
    assert_int_equal(r.applied, 4);
    /* Errors stay errors in any type. */
    assert_int_equal(psc_pull(c, "emb", keys, 10, 4, x), PC_EDIM);
    assert_int_equal(psc_pull(c, "nope", keys, 10, 8, x), PC_ENOTFOUND);
    ps_table_destroy(ref);
    psc_close(c);
    psc_close(c32);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

/* ---- raw frames ---- */

/* A batch body: n keys (i * 7919), for a push n * dim elements of type t (value v). */
static uint32_t raw_batch(uint8_t op, uint32_t n, uint32_t dim, pc_wire_dtype_t t, uint8_t *out) {
    size_t len = pc_wire_batch_head_encode_typed("emb", n, dim, t, out);
    uint64_t *k = (uint64_t *)(void *)(out + len);
    for (uint32_t i = 0; i < n; i++)
        k[i] = i * 7919;
    len += (size_t)n * 8;
    if (op == PC_OP_PUSH) {
        memset(out + len, 0, (size_t)n * dim * pc_wire_dtype_size(t));
        len += (size_t)n * dim * pc_wire_dtype_size(t);
    }
    return (uint32_t)len;
}

static void test_raw_frames(void **state) {
    (void)state;
    char dir[256], tables[300];
    tc_tmpdir(dir, sizeof dir, "dpdtraw");
    snprintf(tables, sizeof tables, "--tables=%s", TABLES);
    const char *extra[] = {tables, NULL};
    const int port = pu_free_port();
    pid_t s = pu_spawn(port, dir, extra, NULL);
    _Alignas(8) static uint8_t body[1 << 16], reply[1 << 16], ref[1 << 16];
    enum { N = 50 };
    int fd = raw_connect(port);
    /* f32 first: flags exactly "response", rows of 4 bytes */
    uint32_t len = raw_batch(PC_OP_PULL, N, 8, PC_WIRE_F32, body);
    send_frame(fd, PC_OP_PULL, 1, body, len);
    pc_wire_hdr_t h = recv_frame(fd, 1, ref, sizeof ref);
    assert_int_equal(h.status, 0);
    assert_int_equal(h.flags, PC_WIRE_RESPONSE);
    assert_int_equal(h.body_len, N * 8 * 4);
    for (int t = PC_WIRE_BF16; t <= PC_WIRE_F16; t++) {
        len = raw_batch(PC_OP_PULL, N, 8, (pc_wire_dtype_t)t, body);
        send_frame(fd, PC_OP_PULL, 10 + (uint64_t)t, body, len);
        h = recv_frame(fd, 10 + (uint64_t)t, reply, sizeof reply);
        assert_int_equal(h.status, 0);
        assert_int_equal(h.flags, PC_WIRE_RESPONSE | (t << PC_WIRE_DTYPE_SHIFT));
        assert_int_equal(pc_wire_hdr_dtype(&h), t);
        assert_int_equal(h.body_len, N * 8 * 2);
        const float *f = (const float *)(const void *)ref;
        const uint16_t *v = (const uint16_t *)(const void *)reply;
        for (int i = 0; i < N * 8; i++)
            assert_int_equal(v[i], t == PC_WIRE_BF16 ? pc_f32_to_bf16(f[i]) : pc_f32_to_f16(f[i]));
        /* a lookup: rows, then the found bytes */
        send_frame(fd, PC_OP_LOOKUP, 20 + (uint64_t)t, body, len);
        h = recv_frame(fd, 20 + (uint64_t)t, reply, sizeof reply);
        assert_int_equal(h.status, 0);
        assert_int_equal(pc_wire_hdr_dtype(&h), t);
        assert_int_equal(h.body_len, N * 8 * 2 + N);
        for (int i = 0; i < N; i++)
            assert_int_equal(reply[N * 8 * 2 + i], 1);
        /* a push of zero gradients, then one with the f32 length: refused */
        len = raw_batch(PC_OP_PUSH, N, 8, (pc_wire_dtype_t)t, body);
        send_frame(fd, PC_OP_PUSH, 30 + (uint64_t)t, body, len);
        h = recv_frame(fd, 30 + (uint64_t)t, reply, sizeof reply);
        assert_int_equal(h.status, 0);
        assert_int_equal(pc_wire_hdr_dtype(&h), t);
        uint64_t cnt[3];
        memcpy(cnt, reply, sizeof cnt);
        assert_int_equal(cnt[0], N);
        send_frame(fd, PC_OP_PUSH, 40 + (uint64_t)t, body, len + N * 8 * 2);
        h = recv_frame(fd, 40 + (uint64_t)t, reply, sizeof reply);
        assert_int_equal(h.status, PC_EINVAL);
        assert_int_equal(h.flags, PC_WIRE_RESPONSE); /* an error carries no type */
    }
    /* unknown element types: PC_EUNSUPPORTED, named; the connection lives */
    len = raw_batch(PC_OP_PULL, N, 8, PC_WIRE_F32, body);
    for (uint16_t bad = 3; bad < 600; bad += 250) {
        memcpy(body + 2, &bad, 2);
        send_frame(fd, PC_OP_PULL, 50 + bad, body, len);
        h = recv_frame(fd, 50 + bad, reply, sizeof reply);
        assert_int_equal(h.status, PC_EUNSUPPORTED);
        char want[64];
        snprintf(want, sizeof want, "element type %u is not one", bad);
        if (!strstr((const char *)reply, want))
            fail_msg("message: %s", (const char *)reply);
    }
    send_frame(fd, PC_OP_PING, 99, NULL, 0);
    h = recv_frame(fd, 99, reply, sizeof reply);
    assert_int_equal(h.status, 0);
    close(fd);
    pu_stop(s);
    tc_rmdir(dir);
}

/* ---- a server of wire v1 ---- */

/* A stand-in for a ps-server of wire v1 on one connection: HELLO -> its map; a batch whose
 * reserved u16 at offset 2 is not 0 -> PC_EINVAL "invalid argument: malformed batch" (what the
 * old decoder answered); an f32 PULL -> rows of 0.5. */
typedef struct old_server {
    int lfd, port;
    pthread_t th;
} old_server_t;

static void old_reply(int fd, const pc_wire_hdr_t *q, int32_t status, const void *body,
                      uint32_t len) {
    uint8_t h[PC_WIRE_HDR];
    pc_wire_hdr_t r = {.op = q->op,
                       .flags = PC_WIRE_RESPONSE,
                       .id = q->id,
                       .status = status,
                       .body_len = len,
                       .map_version = 1};
    pc_wire_hdr_encode(&r, h);
    send(fd, h, sizeof h, MSG_NOSIGNAL);
    if (len)
        send(fd, body, len, MSG_NOSIGNAL);
}

static void *old_main(void *arg) {
    old_server_t *o = arg;
    int fd = accept(o->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    _Alignas(8) static uint8_t body[1 << 20];
    static float rows[1 << 18];
    for (;;) {
        uint8_t hb[PC_WIRE_HDR];
        size_t got = 0;
        while (got < sizeof hb) {
            ssize_t r = recv(fd, hb + got, sizeof hb - got, 0);
            if (r <= 0)
                goto out;
            got += (size_t)r;
        }
        pc_wire_hdr_t q;
        if (pc_wire_hdr_decode(hb, sizeof body, &q))
            break;
        for (got = 0; got < q.body_len;) {
            ssize_t r = recv(fd, body + got, q.body_len - got, 0);
            if (r <= 0)
                goto out;
            got += (size_t)r;
        }
        if (q.op == PC_OP_HELLO) {
            char map[128];
            int n = snprintf(map, sizeof map, "version=1;servers=127.0.0.1:%d;slots=0-16383:0",
                             o->port);
            old_reply(fd, &q, 0, map, (uint32_t)n);
        } else if (body[2] || body[3]) {
            static const char msg[] = "invalid argument: malformed batch";
            old_reply(fd, &q, PC_EINVAL, msg, sizeof msg - 1);
        } else {
            uint32_t n, dim;
            memcpy(&n, body + 4, 4);
            memcpy(&dim, body + 8, 4);
            for (uint32_t i = 0; i < n * dim; i++)
                rows[i] = 0.5f;
            old_reply(fd, &q, 0, rows, n * dim * 4);
        }
    }
out:
    close(fd);
    return NULL;
}

static void test_old_server(void **state) {
    (void)state;
    old_server_t o = {.lfd = socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(o.lfd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(o.lfd, (struct sockaddr *)&a, &l);
    o.port = ntohs(a.sin_port);
    assert_int_equal(listen(o.lfd, 4), 0);
    assert_int_equal(pthread_create(&o.th, NULL, old_main, &o), 0);
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", o.port);
    psc_t *c = connect_to(one);
    uint64_t keys[3] = {1, 2, 3};
    float x[3 * 4];
    assert_int_equal(psc_pull(c, "emb", keys, 3, 4, x), 0); /* f32 works */
    for (int i = 0; i < 12; i++)
        assert_true(x[i] == 0.5f);
    for (int t = PSC_WIRE_BF16; t <= PSC_WIRE_F16; t++) {
        assert_int_equal(psc_set_wire_type(c, t), 0);
        for (int i = 0; i < 12; i++)
            x[i] = 42.0f;
        uint64_t id;
        char why[600];
        assert_int_equal(psc_pull_async(c, "emb", keys, 3, 4, x, NULL, NULL, &id), 0);
        assert_int_equal(psc_wait_detail(c, id, why, sizeof why), PC_EUNSUPPORTED);
        printf("old server: %s\n", why);
        if (!strstr(why, t == PSC_WIRE_BF16 ? "refused bf16 rows" : "refused f16 rows") ||
            !strstr(why, "f32 only") || !strstr(why, "malformed batch") || !strstr(why, one))
            fail_msg("detail: %s", why);
        for (int i = 0; i < 12; i++) /* nothing written */
            assert_true(x[i] == 42.0f);
        float g[12] = {0};
        assert_int_equal(psc_push(c, "emb", keys, 3, 4, g, NULL), PC_EUNSUPPORTED);
    }
    assert_int_equal(psc_set_wire_type(c, PSC_WIRE_F32), 0);
    assert_int_equal(psc_pull(c, "emb", keys, 3, 4, x), 0);
    psc_close(c);
    shutdown(o.lfd, SHUT_RDWR);
    pthread_join(o.th, NULL);
    close(o.lfd);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_dp_dtype PATH-TO-ps-server\n");
        return 2;
    }
    pu_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_typed_matches_f32),
        cmocka_unit_test(test_raw_frames),
        cmocka_unit_test(test_old_server),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    return rc;
}
