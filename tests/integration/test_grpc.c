/* The gRPC API end to end against ps-server processes, through psgrpc and protobuf-c messages:
 *  - Pull, Push and Lookup equal an in-process table given the same calls;
 *  - administration: CreateTable/DropTable/ListTables/TableStats/Checkpoint/ListCheckpoints/
 *    GetClusterMap/Health, with the token and the admin token enforced;
 *  - bad input: malformed protobuf, unknown method, wrong gradient size, unknown table, too many
 *    keys, a message over the size limit, a key of another server's slot: the right status and,
 *    through psg_request, the server's exact error code (codes that share a status included),
 *    and the server keeps serving;
 *  - psctl's exit codes and JSON output; psctl key against pc_feature's keys;
 *  - a Lookup or Pull whose rows would exceed max_reply_bytes: PC_ETOOBIG (RESOURCE_EXHAUSTED)
 *    with a message naming the sizes, without the server building the reply.
 * argv[1] is ps-server, argv[2] psctl. Every wait is bounded. */
#include "proc_util.h"
#include "raw_frame.h"
#include "table_check.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <sys/stat.h>

#include "emberps.pb-c.h"
#include "emberps/psgrpc.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_feature.h"
#include "ps_api.h"
#include "ps_catalog.h"

static const char *g_psctl;
static const char *TABLE = "name=emb,dim=8,optimizer=adagrad,shards=4";
enum { D = 8 };

/* One call: packs `req`, returns the status; on OK *resp holds the reply bytes (free them),
 * else msg the server's message. */
static int call_why(psg_t *c, int m, const ProtobufCMessage *req, uint8_t **resp, size_t *len,
                    char *msg, size_t cap) {
    size_t rl = protobuf_c_message_get_packed_size(req);
    uint8_t *rb = malloc(rl + 1);
    protobuf_c_message_pack(req, rb);
    int st = psg_call(c, ps_api_path((ps_api_method_t)m), rb, rl, 5000, resp, len, msg, cap);
    free(rb);
    return st;
}

static int call(psg_t *c, int m, const ProtobufCMessage *req, uint8_t **resp, size_t *len) {
    char msg[256];
    return call_why(c, m, req, resp, len, msg, sizeof msg);
}

/* The same call seen as the client's error code (psg_request): 0 or the server's PC_E* code. */
static int call_pc(psg_t *c, int m, const ProtobufCMessage *req) {
    size_t rl = protobuf_c_message_get_packed_size(req), len;
    uint8_t *rb = malloc(rl + 1), *resp;
    protobuf_c_message_pack(req, rb);
    int rc =
        psg_request(c, ps_api_path((ps_api_method_t)m), rb, rl, 5000, &resp, &len, NULL, NULL, 0);
    free(rb);
    free(resp);
    return rc;
}

static int call_raw_pc(psg_t *c, const char *path, const void *bytes, size_t n) {
    uint8_t *resp;
    size_t len;
    int rc = psg_request(c, path, bytes, n, 5000, &resp, &len, NULL, NULL, 0);
    free(resp);
    return rc;
}

/* Flip one byte in the middle of a file (a checkpoint that no longer verifies). */
static void flip_middle(const char *path) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true(st.st_size > 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, st.st_size / 2), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, st.st_size / 2), 1);
    close(fd);
}

static int call_raw(psg_t *c, const char *path, const void *bytes, size_t n) {
    uint8_t *resp;
    size_t len;
    int st = psg_call(c, path, bytes, n, 5000, &resp, &len, NULL, 0);
    free(resp);
    return st;
}

static psg_t *client(int grpc_port, const char *token) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", grpc_port);
    psg_t *c;
    const psg_opts_t o = {.addr = addr, .token = token};
    assert_int_equal(psg_create(&o, &c), 0);
    return c;
}

static void test_rows_match_local(void **state) {
    (void)state;
    char dir[256], tables[200];
    tc_tmpdir(dir, sizeof dir, "grpc1");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    psg_t *c = client(gp, NULL);
    ps_table_t *ref = tc_create(TABLE);
    enum { N = PS_CATALOG_TABLES_MAX };
    uint64_t keys[N];
    float g[N * D], y[N * D];
    uint8_t fy[N];
    uint64_t rng = 3;
    for (int it = 0; it < 20; it++) {
        for (int i = 0; i < N; i++) {
            keys[i] = tu_rand(&rng) % 2000;
            for (int e = 0; e < D; e++)
                g[i * D + e] = tu_gauss(&rng) * 0.1f;
        }
        Emberps__PullRequest pq = EMBERPS__PULL_REQUEST__INIT;
        pq.table = "emb";
        pq.n_keys = N;
        pq.keys = keys;
        uint8_t *resp;
        size_t len;
        assert_int_equal(call(c, PS_API_PULL, &pq.base, &resp, &len), 0);
        Emberps__PullResponse *pr = emberps__pull_response__unpack(NULL, len, resp);
        assert_non_null(pr);
        assert_int_equal(pr->dim, D);
        assert_int_equal(ps_table_pull(ref, keys, N, y, N * D), 0);
        assert_int_equal(pr->rows.len, sizeof y);
        assert_memory_equal(pr->rows.data, y, sizeof y);
        emberps__pull_response__free_unpacked(pr, NULL);
        free(resp);
        Emberps__PushRequest sq = EMBERPS__PUSH_REQUEST__INIT;
        sq.table = "emb";
        sq.n_keys = N;
        sq.keys = keys;
        sq.grads = (ProtobufCBinaryData){sizeof g, (uint8_t *)g};
        assert_int_equal(call(c, PS_API_PUSH, &sq.base, &resp, &len), 0);
        Emberps__PushResponse *sr = emberps__push_response__unpack(NULL, len, resp);
        ps_push_result_t lr;
        assert_int_equal(ps_table_push(ref, keys, N, g, N * D, &lr), 0);
        assert_int_equal(sr->applied, lr.applied);
        emberps__push_response__free_unpacked(sr, NULL);
        free(resp);
    }
    Emberps__LookupRequest lq = EMBERPS__LOOKUP_REQUEST__INIT;
    lq.table = "emb";
    lq.n_keys = N;
    lq.keys = keys;
    uint8_t *resp;
    size_t len;
    assert_int_equal(call(c, PS_API_LOOKUP, &lq.base, &resp, &len), 0);
    Emberps__LookupResponse *lr = emberps__lookup_response__unpack(NULL, len, resp);
    assert_int_equal(ps_table_lookup(ref, keys, N, y, N * D, fy), 0);
    assert_memory_equal(lr->rows.data, y, sizeof y);
    assert_int_equal(lr->found.len, N);
    assert_memory_equal(lr->found.data, fy, N);
    emberps__lookup_response__free_unpacked(lr, NULL);
    free(resp);
    psg_destroy(c);
    ps_table_destroy(ref);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_admin_and_tokens(void **state) {
    (void)state;
    char dir[256], ck[300], ckarg[320];
    tc_tmpdir(dir, sizeof dir, "grpc2");
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s", ck);
    char tok[] = "--token=t1", adm[] = "--admin-token=a1";
    const char *extra[] = {ckarg, tok, adm, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    psg_t *none = client(gp, NULL), *user = client(gp, "t1"), *admin = client(gp, "a1");
    uint8_t *resp;
    size_t len;
    Emberps__HealthRequest hq = EMBERPS__HEALTH_REQUEST__INIT;
    assert_int_equal(call(none, PS_API_HEALTH, &hq.base, &resp, &len), PS_ST_UNAUTHENTICATED);
    assert_int_equal(call_pc(none, PS_API_HEALTH, &hq.base), PC_EAUTH);
    /* the admin token opens the other calls too (a server presents it to a remote coordinator
     * for its plain KV calls as for its cluster/ keys) */
    assert_int_equal(call(admin, PS_API_HEALTH, &hq.base, &resp, &len), 0);
    free(resp);
    assert_int_equal(call(user, PS_API_HEALTH, &hq.base, &resp, &len), 0);
    Emberps__HealthResponse *h = emberps__health_response__unpack(NULL, len, resp);
    assert_string_equal(h->status, "serving");
    emberps__health_response__free_unpacked(h, NULL);
    free(resp);
    Emberps__CreateTableRequest cq = EMBERPS__CREATE_TABLE_REQUEST__INIT;
    cq.spec = "name=ads,dim=4,optimizer=adam";
    assert_int_equal(call(user, PS_API_CREATE_TABLE, &cq.base, &resp, &len),
                     PS_ST_UNAUTHENTICATED); /* needs the admin token */
    assert_int_equal(call(admin, PS_API_CREATE_TABLE, &cq.base, &resp, &len), 0);
    free(resp);
    assert_int_equal(call(admin, PS_API_CREATE_TABLE, &cq.base, &resp, &len), PS_ST_ALREADY_EXISTS);
    cq.spec = "name=bad,dim=0";
    assert_int_equal(call(admin, PS_API_CREATE_TABLE, &cq.base, &resp, &len),
                     PS_ST_INVALID_ARGUMENT);
    Emberps__ListTablesRequest tq = EMBERPS__LIST_TABLES_REQUEST__INIT;
    assert_int_equal(call(user, PS_API_LIST_TABLES, &tq.base, &resp, &len), 0);
    Emberps__ListTablesResponse *tl = emberps__list_tables_response__unpack(NULL, len, resp);
    assert_int_equal(tl->n_tables, 1);
    assert_string_equal(tl->tables[0], "ads");
    emberps__list_tables_response__free_unpacked(tl, NULL);
    free(resp);
    Emberps__CheckpointRequest kq = EMBERPS__CHECKPOINT_REQUEST__INIT;
    assert_int_equal(call(user, PS_API_CHECKPOINT, &kq.base, &resp, &len), PS_ST_UNAUTHENTICATED);
    assert_int_equal(call(admin, PS_API_CHECKPOINT, &kq.base, &resp, &len), 0);
    free(resp);
    Emberps__ListCheckpointsRequest lq = EMBERPS__LIST_CHECKPOINTS_REQUEST__INIT;
    assert_int_equal(call(user, PS_API_LIST_CHECKPOINTS, &lq.base, &resp, &len), 0);
    Emberps__ListCheckpointsResponse *cl =
        emberps__list_checkpoints_response__unpack(NULL, len, resp);
    assert_int_equal(cl->n_checkpoints, 1);
    assert_int_equal(cl->checkpoints[0]->id, 1);
    emberps__list_checkpoints_response__free_unpacked(cl, NULL);
    free(resp);
    Emberps__RestoreRequest rq = EMBERPS__RESTORE_REQUEST__INIT; /* back to it while serving */
    rq.id = 1;
    assert_int_equal(call(user, PS_API_RESTORE, &rq.base, &resp, &len), PS_ST_UNAUTHENTICATED);
    assert_int_equal(call(admin, PS_API_RESTORE, &rq.base, &resp, &len), 0);
    Emberps__RestoreResponse *rr = emberps__restore_response__unpack(NULL, len, resp);
    assert_true(rr && rr->id == 1);
    emberps__restore_response__free_unpacked(rr, NULL);
    free(resp);
    rq.id = 99;
    assert_int_equal(call(admin, PS_API_RESTORE, &rq.base, &resp, &len), PS_ST_NOT_FOUND);
    assert_int_equal(call_pc(admin, PS_API_RESTORE, &rq.base), PC_ENOTFOUND);
    /* A checkpoint that does not verify: PC_ECORRUPT at the client (a bare INTERNAL status and
     * PC_EINTERNAL before the codes travelled by name); nothing changes on the server. */
    char rows[400];
    snprintf(rows, sizeof rows, "%s/ckpt-00000000000000000001/t-ads.rows", ck);
    flip_middle(rows);
    rq.id = 1;
    assert_int_equal(call(admin, PS_API_RESTORE, &rq.base, &resp, &len), PS_ST_DATA_LOSS);
    assert_int_equal(call_pc(admin, PS_API_RESTORE, &rq.base), PC_ECORRUPT);
    Emberps__TableStatsRequest sq = EMBERPS__TABLE_STATS_REQUEST__INIT;
    sq.table = "ads";
    assert_int_equal(call(user, PS_API_TABLE_STATS, &sq.base, &resp, &len), 0);
    Emberps__TableStatsResponse *st = emberps__table_stats_response__unpack(NULL, len, resp);
    assert_non_null(strstr(st->config, "optimizer=adam"));
    emberps__table_stats_response__free_unpacked(st, NULL);
    free(resp);
    Emberps__DropTableRequest dq = EMBERPS__DROP_TABLE_REQUEST__INIT;
    dq.table = "ads";
    assert_int_equal(call(admin, PS_API_DROP_TABLE, &dq.base, &resp, &len), 0);
    free(resp);
    assert_int_equal(call(user, PS_API_TABLE_STATS, &sq.base, &resp, &len), PS_ST_NOT_FOUND);
    Emberps__GetClusterMapRequest mq = EMBERPS__GET_CLUSTER_MAP_REQUEST__INIT;
    assert_int_equal(call(user, PS_API_GET_CLUSTER_MAP, &mq.base, &resp, &len), 0);
    Emberps__GetClusterMapResponse *mr = emberps__get_cluster_map_response__unpack(NULL, len, resp);
    assert_non_null(strstr(mr->map, "slots=0-16383:0"));
    emberps__get_cluster_map_response__free_unpacked(mr, NULL);
    free(resp);
    /* ListTables answers every table, sorted (it answered 4096 of them, any); the server holds
     * PS_CATALOG_TABLES_MAX at most, and one more is refused with the reason */
    enum { MANY = PS_CATALOG_TABLES_MAX };
    for (int i = MANY - 1; i >= 0; i--) {
        char spec[64];
        snprintf(spec, sizeof spec, "name=t%04d,dim=1,shards=1", i);
        cq.spec = spec;
        assert_int_equal(call(admin, PS_API_CREATE_TABLE, &cq.base, &resp, &len), 0);
        free(resp);
    }
    cq.spec = "name=one_more,dim=1,shards=1";
    char msg[256];
    assert_int_equal(call_why(admin, PS_API_CREATE_TABLE, &cq.base, &resp, &len, msg, sizeof msg),
                     PS_ST_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "this server holds 256 tables, the most it can"));
    assert_int_equal(call(user, PS_API_LIST_TABLES, &tq.base, &resp, &len), 0);
    tl = emberps__list_tables_response__unpack(NULL, len, resp);
    assert_int_equal(tl->n_tables, MANY);
    for (int i = 0; i < MANY; i++) {
        char want[16];
        snprintf(want, sizeof want, "t%04d", i);
        assert_string_equal(tl->tables[i], want);
    }
    emberps__list_tables_response__free_unpacked(tl, NULL);
    free(resp);
    for (int i = 0; i < MANY; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%04d", i);
        dq.table = name;
        assert_int_equal(call(admin, PS_API_DROP_TABLE, &dq.base, &resp, &len), 0);
        free(resp);
    }
    psg_destroy(none);
    psg_destroy(user);
    psg_destroy(admin);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_bad_input(void **state) {
    (void)state;
    char dir[256], tables[200], map[256], maparg[300];
    tc_tmpdir(dir, sizeof dir, "grpc3");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    int port = pu_free_port();
    /* This server owns half the slots; the other server of the map need not run. */
    snprintf(map, sizeof map,
             "version=3;servers=127.0.0.1:%d,127.0.0.1:1;slots=0-8191:0,8192-16383:1", port);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    char lim[] = "--max-body-bytes=65536", keys[] = "--max-batch-keys=100";
    const char *extra[] = {tables, lim, keys, maparg, NULL};
    int gp = 0;
    pid_t s = pu_spawn(port, dir, extra, &gp);
    psg_t *c = client(gp, NULL);
    const char *pull = ps_api_path(PS_API_PULL), *push = ps_api_path(PS_API_PUSH);
    assert_int_equal(call_raw(c, pull, "\xff\xff\xff\xff", 4), PS_ST_INVALID_ARGUMENT);
    assert_int_equal(call_raw_pc(c, pull, "\xff\xff\xff\xff", 4), PC_EPARSE);
    assert_int_equal(call_raw(c, "/emberps.ParameterServer/Nope", "", 0), PS_ST_UNIMPLEMENTED);
    assert_int_equal(call_raw_pc(c, "/emberps.ParameterServer/Nope", "", 0), PC_EUNSUPPORTED);
    static uint8_t big[100000];
    assert_int_equal(call_raw(c, pull, big, sizeof big), PS_ST_RESOURCE_EXHAUSTED);
    /* refused by gRPC itself, without a code name: the status's own code */
    assert_int_equal(call_raw_pc(c, pull, big, sizeof big), PC_ETOOBIG);
    /* Find keys this server owns, and one it does not. */
    uint64_t own[101], other = 0;
    int n = 0;
    for (uint64_t k = 1; n < 101 || !other; k++) {
        if (pc_key_slot(k) < 8192 && n < 101)
            own[n++] = k;
        else if (pc_key_slot(k) >= 8192 && !other)
            other = k;
    }
    uint8_t *resp;
    size_t len;
    Emberps__PullRequest pq = EMBERPS__PULL_REQUEST__INIT;
    pq.table = "emb";
    pq.keys = own;
    pq.n_keys = 101;
    assert_int_equal(call(c, PS_API_PULL, &pq.base, &resp, &len), PS_ST_RESOURCE_EXHAUSTED);
    assert_int_equal(call_pc(c, PS_API_PULL, &pq.base), PC_ETOOBIG);
    pq.n_keys = 1;
    pq.table = "missing";
    assert_int_equal(call(c, PS_API_PULL, &pq.base, &resp, &len), PS_ST_NOT_FOUND);
    assert_int_equal(call_pc(c, PS_API_PULL, &pq.base), PC_ENOTFOUND);
    pq.table = "emb";
    pq.keys = &other;
    assert_int_equal(call(c, PS_API_PULL, &pq.base, &resp, &len), PS_ST_FAILED_PRECONDITION);
    /* PC_EINTERNAL at the client before the codes travelled by name */
    assert_int_equal(call_pc(c, PS_API_PULL, &pq.base), PC_EWRONGSLOT);
    float g[3] = {1, 2, 3};
    Emberps__PushRequest sq = EMBERPS__PUSH_REQUEST__INIT;
    sq.table = "emb";
    sq.keys = own;
    sq.n_keys = 1;
    sq.grads = (ProtobufCBinaryData){sizeof g, (uint8_t *)g}; /* dim 8 wanted */
    assert_int_equal(call(c, PS_API_PUSH, &sq.base, &resp, &len), PS_ST_INVALID_ARGUMENT);
    assert_int_equal(call_pc(c, PS_API_PUSH, &sq.base), PC_EDIM); /* PC_EINVAL before */
    (void)push;
    pq.keys = own; /* still serving */
    assert_int_equal(call(c, PS_API_PULL, &pq.base, &resp, &len), 0);
    free(resp);
    psg_destroy(c);
    pu_stop(s);
    tc_rmdir(dir);
}

/* 262144 keys of a dim-1024 table would be a 1 GiB reply: refused (64 MiB by default) before
 * any row is read or allocated, with the sizes in the message. */
static void test_reply_limit(void **state) {
    (void)state;
    char dir[256], tables[] = "--tables=name=big,dim=1024,shards=4", msg[256];
    tc_tmpdir(dir, sizeof dir, "grpc6");
    const char *extra[] = {tables, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    psg_t *c = client(gp, NULL);
    const long hwm0 = tu_proc_kb(s, "VmHWM:");
    enum { N = 262144 };
    uint64_t *keys = malloc(N * sizeof *keys);
    for (uint64_t i = 0; i < N; i++)
        keys[i] = i * 7919;
    Emberps__LookupRequest lq = EMBERPS__LOOKUP_REQUEST__INIT;
    lq.table = "big";
    lq.n_keys = N;
    lq.keys = keys;
    Emberps__PullRequest pq = EMBERPS__PULL_REQUEST__INIT;
    pq.table = "big";
    pq.n_keys = N;
    pq.keys = keys;
    const ProtobufCMessage *reqs[2] = {&lq.base, &pq.base};
    const int methods[2] = {PS_API_LOOKUP, PS_API_PULL};
    const char *want[2] = {
        "lookup of 262144 rows x dim 1024 = 1 GiB over the reply limit of 64 MiB",
        "pull of 262144 rows x dim 1024 = 1 GiB over the reply limit of 64 MiB"};
    for (int i = 0; i < 2; i++) {
        size_t rl = protobuf_c_message_get_packed_size(reqs[i]), len = 0;
        uint8_t *rb = malloc(rl), *resp = NULL;
        protobuf_c_message_pack(reqs[i], rb);
        int st = -1;
        const double t0 = pu_now();
        int rc = psg_request(c, ps_api_path((ps_api_method_t)methods[i]), rb, rl, 20000, &resp,
                             &len, &st, msg, sizeof msg);
        print_message("%s: %s, status %d: %s (%.2f s)\n", ps_api_path(methods[i]), pc_err_name(rc),
                      st, msg, pu_now() - t0);
        assert_int_equal(rc, PC_ETOOBIG);
        assert_int_equal(st, PS_ST_RESOURCE_EXHAUSTED);
        assert_non_null(strstr(msg, want[i]));
        assert_true(pu_now() - t0 < 10);
        free(rb);
        free(resp);
    }
    /* Within the limit it is answered. */
    lq.n_keys = 1000;
    uint8_t *resp;
    size_t len;
    assert_int_equal(call(c, PS_API_LOOKUP, &lq.base, &resp, &len), 0);
    free(resp);
    const long hwm1 = tu_proc_kb(s, "VmHWM:");
    print_message("server peak RSS %ld -> %ld KiB\n", hwm0, hwm1);
    assert_true(hwm0 > 0 && hwm1 - hwm0 < 256 * 1024); /* no 1 GiB reply was built */
    free(keys);
    psg_destroy(c);
    pu_stop(s);
    tc_rmdir(dir);
}

/* A Lookup whose rows and found bytes come within a few bytes of the message limit (1 MiB here,
 * the reply limit above it) is refused by the handler with the sizes named, not sent and refused
 * by gRPC's send limit with none (its own fields made it a few bytes larger). */
static void test_reply_at_message_limit(void **state) {
    (void)state;
    char dir[256], tables[] = "--tables=name=emb,dim=8", body[] = "--max-body-bytes=1048576",
                   reply[] = "--max-reply-bytes=4Mi", msg[256] = "";
    tc_tmpdir(dir, sizeof dir, "grpc8");
    const char *extra[] = {tables, body, reply, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    psg_t *c = client(gp, NULL);
    enum { N = 1048576 / 33 }; /* 33 bytes a key: 1048575 bytes of rows and found */
    uint64_t *keys = malloc(N * sizeof *keys);
    for (uint64_t i = 0; i < N; i++)
        keys[i] = i + 1;
    Emberps__LookupRequest lq = EMBERPS__LOOKUP_REQUEST__INIT;
    lq.table = "emb";
    lq.n_keys = N;
    lq.keys = keys;
    size_t rl = protobuf_c_message_get_packed_size(&lq.base), len = 0;
    uint8_t *rb = malloc(rl), *resp = NULL;
    protobuf_c_message_pack(&lq.base, rb);
    const int rc = psg_request(c, ps_api_path(PS_API_LOOKUP), rb, rl, 20000, &resp, &len, NULL, msg,
                               sizeof msg);
    print_message("a Lookup of %d keys of dim 8 under a 1 MiB message limit: %s: %s\n", N,
                  pc_err_name(rc), msg);
    assert_int_equal(rc, PC_ETOOBIG);
    assert_non_null(strstr(msg, "over the reply limit"));
    free(resp);
    free(rb);
    free(keys);
    psg_destroy(c);
    pu_stop(s);
    tc_rmdir(dir);
}

/* A caller without the token is refused by its metadata, before its message is read: three
 * 48 MiB Pushes cost the server no copy of them (the handler read the whole message, then
 * copied it, and only then looked at the token). */
static void test_token_before_body(void **state) {
    (void)state;
    char dir[256], tables[] = "--tables=name=emb,dim=8", token[] = "--token=sekret";
    tc_tmpdir(dir, sizeof dir, "grpc7");
    const char *extra[] = {tables, token, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    psg_t *c = client(gp, NULL);
    const long hwm0 = tu_proc_kb(s, "VmHWM:");
    enum { MB = 48 };
    Emberps__PushRequest q = EMBERPS__PUSH_REQUEST__INIT;
    uint64_t key = 1;
    q.table = "emb";
    q.keys = &key;
    q.n_keys = 1;
    q.grads = (ProtobufCBinaryData){(size_t)MB << 20, calloc((size_t)MB << 20, 1)};
    size_t rl = protobuf_c_message_get_packed_size(&q.base);
    uint8_t *rb = malloc(rl);
    protobuf_c_message_pack(&q.base, rb);
    for (int i = 0; i < 3; i++) {
        uint8_t *resp = NULL;
        size_t len = 0;
        char msg[256] = "";
        const int rc = psg_request(c, ps_api_path(PS_API_PUSH), rb, rl, 20000, &resp, &len, NULL,
                                   msg, sizeof msg);
        free(resp);
        if (i == 0)
            print_message("a %d MiB Push without the token: %s: %s\n", MB, pc_err_name(rc), msg);
        assert_int_equal(rc, PC_EAUTH);
    }
    const long hwm1 = tu_proc_kb(s, "VmHWM:");
    print_message("server peak RSS %ld -> %ld KiB\n", hwm0, hwm1);
    assert_true(hwm0 > 0 && hwm1 - hwm0 < (MB << 10)); /* not even one copy */
    free(q.grads.data);
    free(rb);
    psg_destroy(c);
    pu_stop(s);
    tc_rmdir(dir);
}

/* A server of 300 tables shows every one of them in /metrics (its list was a stack array of 256
 * names read past its end: ASan's stack-buffer-overflow, tables past the 256th missing). */
static void test_many_tables_metrics(void **state) {
    (void)state;
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "grpc9");
    enum { N = PS_CATALOG_TABLES_MAX };
    static char tables[N * 10 + 16]; /* (names alone: a flag's value is at most 4095 bytes) */
    size_t at = (size_t)snprintf(tables, sizeof tables, "--tables=");
    for (int i = 0; i < N; i++)
        at += (size_t)snprintf(tables + at, sizeof tables - at, "%sname=t%03d", i ? ";" : "", i);
    const char *extra[] = {tables, NULL};
    pid_t s = pu_spawn(pu_free_port(), dir, extra, NULL);
    const int mp = pu_last_metrics_port;
    static char out[4 << 20];
    assert_int_equal(http_get(mp, "/metrics", out, sizeof out), 200);
    int seen = 0;
    for (int i = 0; i < N; i++) {
        char line[80];
        snprintf(line, sizeof line, "emberps_table_rows{table=\"t%03d\"} 0\n", i);
        seen += strstr(out, line) != NULL;
    }
    print_message("%d of %d tables in /metrics (%zu bytes)\n", seen, N, strlen(out));
    assert_int_equal(seen, N);
    pu_stop(s);
    tc_rmdir(dir);
}

static void test_metrics(void **state) {
    (void)state;
    char dir[256], tables[200], ck[300], ckarg[320];
    tc_tmpdir(dir, sizeof dir, "grpc5");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(ckarg, sizeof ckarg, "--ckpt-dir=%s", ck);
    const char *extra[] = {tables, ckarg, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    const int mp = pu_last_metrics_port;
    psg_t *c = client(gp, NULL);
    uint64_t keys[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Emberps__PullRequest pq = EMBERPS__PULL_REQUEST__INIT;
    pq.table = "emb";
    pq.keys = keys;
    pq.n_keys = 10;
    uint8_t *resp;
    size_t len;
    assert_int_equal(call(c, PS_API_PULL, &pq.base, &resp, &len), 0);
    free(resp);
    static char out[1 << 16];
    /* The latency histogram is recorded after the reply went out: the client can see the reply
     * first, so wait (bounded) for the count to show. */
    for (double t0 = pu_now(); pu_now() - t0 < 5; usleep(10000)) {
        assert_int_equal(http_get(mp, "/metrics", out, sizeof out), 200);
        if (strstr(out, "emberps_grpc_call_seconds_count{} 1\n"))
            break;
    }
    assert_non_null(strstr(out, "text/plain; version=0.0.4"));
    assert_non_null(strstr(out, "emberps_table_rows{table=\"emb\"} 10\n"));
    assert_non_null(strstr(out, "emberps_grpc_calls_total 1\n"));
    assert_non_null(strstr(out, "emberps_grpc_call_seconds_count{} 1\n"));
    assert_non_null(
        strstr(out, "emberps_dataplane_request_seconds_bucket{op=\"pull\",le=\"+Inf\"} 0"));
    assert_non_null(strstr(out, "emberps_checkpoint_age_seconds -1"));
    assert_int_equal(http_get(mp, "/nope", out, sizeof out), 404);
    psg_destroy(c);
    pu_stop(s);
    tc_rmdir(dir);
}

/* Run psctl with args against the server at 127.0.0.1:gp; its exit status; stdout into out. */
static int psctl(int gp, char *out, size_t cap, const char *const *args) {
    return pu_psctl(g_psctl, gp, out, cap, args);
}

static void test_psctl(void **state) {
    (void)state;
    char dir[256], tables[200], out[8192];
    tc_tmpdir(dir, sizeof dir, "grpc4");
    snprintf(tables, sizeof tables, "--tables=%s", TABLE);
    const char *extra[] = {tables, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"health", NULL}), 0);
    assert_non_null(strstr(out, "status: serving"));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"stats", "nope", NULL}), 1);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"frobnicate", NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"restore", "-1", NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"restore", "1", NULL}),
                     1); /* no checkpoint directory: refused */
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"lookup", "emb", "x", NULL}), 2);
    assert_int_equal(psctl(1, out, sizeof out, (const char *[]){"health", NULL}), 3);
    /* no answer before the deadline (a stopped server): 4, the call may have run; not 3, which
     * says it did not (a script retrying a checkpoint or a create on 3 did it twice) */
    pu_stop_signal(s);
    assert_int_equal(
        psctl(gp, out, sizeof out, (const char *[]){"--timeout-ms=300", "tables", NULL}), 4);
    kill(s, SIGCONT);
    assert_int_equal(
        psctl(gp, out, sizeof out, (const char *[]){"--json", "lookup", "emb", "7", "8", NULL}), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *rows = cJSON_GetObjectItem(j, "rows");
    assert_int_equal(cJSON_GetArraySize(rows), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "values")),
                     D);
    cJSON_Delete(j);
    /* psctl key: the parser's key for a Criteo value and a CSV value, with the owner from the
     * server's map (a lone server owns everything: 0); bad values are usage errors. */
    char want[64];
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"key", "3", "68fd1e64", NULL}), 0);
    snprintf(want, sizeof want, "%llu slot %u owner 0",
             (unsigned long long)pc_feature_key(3, 0x68fd1e64u),
             pc_key_slot(pc_feature_key(3, 0x68fd1e64u)));
    assert_non_null(strstr(out, want));
    assert_int_equal(
        psctl(gp, out, sizeof out,
              (const char *[]){"--csv-value", "--json", "key", "1", "Toy Story", NULL}),
        0);
    snprintf(want, sizeof want, "\"key\":\"%llu\"",
             (unsigned long long)pc_text_key(1, "Toy Story", 9));
    assert_non_null(strstr(out, want));
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"key", "3", "xyz", NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"key", "9999", "1", NULL}), 2);
    /* numbers the worker would not read as such are refused, not read by strtoul's rules (a
     * sign, a 0x, a space; an empty field) */
    static const char *const bad_values[] = {"-1", "0x1f", "+ff", " ff", NULL};
    for (int i = 0; bad_values[i]; i++)
        assert_int_equal(
            psctl(gp, out, sizeof out, (const char *[]){"key", "3", bad_values[i], NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"key", "", "1", NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"lookup", "emb", " -1", NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"lookup", "emb", "", NULL}), 2);
    assert_int_equal(psctl(gp, out, sizeof out, (const char *[]){"restore", " -1", NULL}), 2);
    /* an empty CSV value is the field's missing key, as the worker reads it */
    assert_int_equal(
        psctl(gp, out, sizeof out, (const char *[]){"--csv-value", "--json", "key", "1", "", NULL}),
        0);
    snprintf(want, sizeof want, "\"key\":\"%llu\"", (unsigned long long)pc_missing_key(1));
    assert_non_null(strstr(out, want));
    pu_stop(s);
    tc_rmdir(dir);
}

/* A client that opens a call and sends nothing more (no message, no end of stream) holds a
 * handler thread only for --grpc-call-wait-ms: with one thread, a health check made after it is
 * answered once the stalled call is cancelled (it waited forever before: nothing else was
 * answered until that client went away). A HealthCheckRequest over 1 KiB is refused unread (no
 * token is asked for it, and protobuf-c takes ~40x the bytes of unknown fields). */
static void test_stalled_call(void **state) {
    (void)state;
    char dir[256], addr[64];
    tc_tmpdir(dir, sizeof dir, "grpc5");
    char threads[] = "--grpc-threads=1", wait[] = "--grpc-call-wait-ms=500";
    const char *extra[] = {threads, wait, NULL};
    int gp = 0;
    pid_t s = pu_spawn(pu_free_port(), dir, extra, &gp);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", gp);
    grpc_init();
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(addr, cr, NULL);
    grpc_channel_credentials_release(cr);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice method = grpc_slice_from_static_string("/emberps.ParameterServer/Pull");
    grpc_call *stalled = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method,
                                                  NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    assert_int_equal(grpc_call_start_batch(stalled, &op, 1, (void *)1, NULL), GRPC_CALL_OK);
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(5, GPR_TIMESPAN)),
        NULL);
    assert_true(ev.type == GRPC_OP_COMPLETE && ev.success);
    usleep(100 * 1000); /* the server's one thread takes it */
    psg_t *c = client(gp, NULL);
    const double t0 = pu_now();
    assert_int_equal(call_raw(c, "/grpc.health.v1.Health/Check", "", 0), PS_ST_OK);
    print_message("health answered after %.2f s beside a stalled call\n", pu_now() - t0);
    static char big[4096]; /* unknown varint fields: 0x10 0x00, ... */
    for (size_t i = 0; i + 1 < sizeof big; i += 2)
        big[i] = 0x10;
    assert_int_equal(call_raw_pc(c, "/grpc.health.v1.Health/Check", big, sizeof big), PC_ETOOBIG);
    psg_destroy(c);
    grpc_call_unref(stalled);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
    pu_stop(s);
    tc_rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_grpc PATH-TO-ps-server PATH-TO-psctl\n");
        return 2;
    }
    pu_bin = argv[1];
    g_psctl = argv[2];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_match_local),
        cmocka_unit_test(test_admin_and_tokens),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_psctl),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_reply_limit),
        cmocka_unit_test(test_stalled_call),
        cmocka_unit_test(test_token_before_body),
        cmocka_unit_test(test_reply_at_message_limit),
        cmocka_unit_test(test_many_tables_metrics),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    return rc;
}
