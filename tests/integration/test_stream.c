/* The delta stream end to end (docs/wire.md "The delta stream"): ps-server processes on loopback,
 * libpsclient's psc_scan and psc_deltas, and a follower that applies them to a table of its own:
 *  - following a table while pushes go on, from an empty start (a scan, then deltas): at the
 *    end every key's row and presence equal the server's, compared key by key; the scan started
 *    the table's change log (servers start one when a follower first asks);
 *  - evictions (capacity_rows) reach the follower as absent keys;
 *  - a first DELTAS of a table starts its log and answers PC_ERANGE (it holds nothing from
 *    before), and position 0 stays refused (the log's base lies beyond it);
 *  - the bounds query (cap 0): the uid and the log's bounds, 0 and 0 without a log, never
 *    PC_ERANGE, and it starts no log;
 *  - a follower further behind than the server's log (--delta-log-entries=64) gets PC_ERANGE
 *    with the bounds, scans again and converges;
 *  - a table reset by a fresh claim (a new uid) answers PC_ESTATE to the old uid;
 *  - two servers, each followed by its map index; a server index the map lacks, an unknown
 *    table, a wrong dim, a part out of range, a part larger than the buffers, a server without a
 *    change log: clean errors;
 *  - a backup's copy (PC_STREAM_BACKUP) of a primary whose slots two servers back up, in 4
 *    parts: each gets exactly the keys of the slots it backs up, a server backing up none gets
 *    nothing, a server the map lacks and a copy without its map version are refused.
 * argv[1] is the ps-server binary. Every wait is bounded. */
#include "proc_util.h"
#include "table_check.h"

#include "emberps/psclient.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "psclient_repl.h"

enum { CAP = 4096 };

static void assert_has(const char *s, const char *part) {
    if (!strstr(s, part))
        fail_msg("'%s' does not contain '%s'", s, part);
}

static psc_t *connect_to(const char *servers) {
    psc_opts_t o = {.servers = servers, .timeout_ms = 5000, .retries = 4};
    psc_t *c;
    assert_int_equal(psc_connect(&o, &c), 0);
    return c;
}

typedef struct follower {
    psc_t *c;
    uint32_t server, dim;
    const char *table;
    ps_table_t *t; /* the follower's copy */
    uint64_t uid, pos;
    uint64_t keys[CAP];
    uint8_t found[CAP];
    float rows[CAP * 16];
    int scans, rescans;
} follower_t;

/* Apply the rows of one reply: present keys loaded, absent ones erased. */
static void apply(follower_t *f, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (f->found[i])
            assert_int_equal(
                ps_table_load(f->t, 1, &f->keys[i], f->rows + (size_t)i * f->dim, NULL, NULL, NULL),
                0);
        else
            assert_int_equal(ps_table_erase(f->t, &f->keys[i], 1, NULL), 0);
    }
}

static psc_stream_req_t req(follower_t *f) {
    return (psc_stream_req_t){.server = f->server,
                              .table = f->table,
                              .dim = f->dim,
                              .uid = f->uid,
                              .from = f->pos,
                              .cap = CAP,
                              .keys = f->keys,
                              .found = f->found,
                              .rows = f->rows};
}

/* Start over: an empty copy, every part scanned, the stream's position from the first part. */
static void rescan(follower_t *f, const char *spec) {
    ps_table_destroy(f->t);
    f->t = tc_create(spec);
    f->uid = 0;
    const uint32_t parts = 8;
    uint64_t next = 0;
    for (uint32_t p = 0; p < parts; p++) {
        psc_stream_req_t q = req(f);
        q.part = p;
        q.parts = parts;
        psc_stream_t out;
        char why[600];
        int rc = psc_scan(f->c, &q, &out, why, sizeof why);
        if (rc)
            fail_msg("scan part %u: %s: %s", p, pc_err_name(rc), why);
        if (!p) {
            f->uid = out.uid;
            next = out.next; /* the log's head before the first part: deltas cover the rest */
        }
        apply(f, out.n);
    }
    f->pos = next;
    f->scans++;
}

/* Deltas until caught up (bounded); rescans on PC_ERANGE / PC_ESTATE. */
static void follow(follower_t *f, const char *spec) {
    for (int i = 0; i < 10000; i++) {
        psc_stream_req_t q = req(f);
        psc_stream_t out;
        char why[600];
        int rc = psc_deltas(f->c, &q, &out, why, sizeof why);
        if (rc == PC_ERANGE || rc == PC_ESTATE) {
            f->rescans++;
            rescan(f, spec);
            continue;
        }
        if (rc)
            fail_msg("deltas from %llu: %s: %s", (unsigned long long)f->pos, pc_err_name(rc), why);
        assert_true(out.from == f->pos && out.next == f->pos + out.n);
        apply(f, out.n);
        f->pos = out.next;
        if (!out.n && out.next == out.head)
            return;
    }
    fail_msg("the follower did not catch up");
}

/* Every key of keys[0..n): presence and row at the server (LOOKUP) equal the follower's. */
static void compare(psc_t *c, follower_t *f, const uint64_t *keys, size_t n) {
    float *a = malloc(n * f->dim * 4), *b = malloc(n * f->dim * 4);
    uint8_t *fa = malloc(n), *fb = malloc(n);
    assert_int_equal(psc_lookup(c, f->table, keys, n, f->dim, a, fa), 0);
    assert_int_equal(ps_table_lookup(f->t, keys, n, b, n * f->dim, fb), 0);
    size_t present = 0;
    for (size_t i = 0; i < n; i++) {
        if (fa[i] != fb[i])
            fail_msg("key %zu: found %d at the server, %d at the follower", i, fa[i], fb[i]);
        if (fa[i] && memcmp(a + i * f->dim, b + i * f->dim, f->dim * 4))
            fail_msg("key %zu: rows differ", i);
        present += fa[i];
    }
    print_message("%zu keys compared, %zu present, every row equal (%d scans, %d rescans)\n", n,
                  present, f->scans, f->rescans);
    assert_true(present > 0);
    free(a);
    free(b);
    free(fa);
    free(fb);
}

static void push_round(psc_t *c, const char *table, uint32_t dim, int r, uint64_t *keys, int n,
                       int pool) {
    float *g = malloc((size_t)n * dim * 4);
    uint64_t rng = 77 + (uint64_t)r;
    for (int i = 0; i < n; i++) {
        keys[i] = (uint64_t)(tu_rand(&rng) % (uint64_t)pool + 1) * 0x9E3779B97F4A7C15ULL;
        for (uint32_t e = 0; e < dim; e++)
            g[(size_t)i * dim + e] = tu_gauss(&rng) * 0.1f;
    }
    assert_int_equal(psc_push(c, table, keys, (size_t)n, dim, g, NULL), 0);
    free(g);
}

static void test_follow(void **state) {
    (void)state;
    char dir[256], one[64];
    tc_tmpdir(dir, sizeof dir, "stream");
    const char *spec = "name=emb,dim=8,optimizer=adagrad,shards=4";
    const char *cap_spec = "name=cap,dim=4,optimizer=sgd,capacity_rows=400,shards=2";
    char tables[200];
    snprintf(tables, sizeof tables, "--tables=%s;%s", spec, cap_spec);
    int port = pu_free_port();
    const char *extra[] = {tables, NULL}; /* the default: logs started by followers */
    pid_t srv = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one);
    follower_t *f = calloc(1, sizeof *f);
    *f = (follower_t){.c = c, .server = 0, .dim = 8, .table = "emb"};
    enum { ROUNDS = 30, N = 500, POOL = 3000 };
    static uint64_t keys[ROUNDS * N];
    for (int r = 0; r < 5; r++)
        push_round(c, "emb", 8, r, keys + r * N, N, POOL);
    /* the bounds query starts nothing: head and oldest 0 (no log) however often it is asked */
    psc_stream_t b;
    char bwhy[600];
    for (int i = 0; i < 2; i++) {
        memset(&b, 0xff, sizeof b);
        assert_int_equal(psc_deltas(c, &(psc_stream_req_t){.table = "emb", .from = 12345}, &b, bwhy,
                                    sizeof bwhy),
                         0);
        assert_true(b.uid != 0 && b.head == 0 && b.oldest == 0 && b.n == 0);
        assert_true(b.from == 12345 && b.next == 12345);
    }
    rescan(f, spec);         /* a follower starting late: the rows so far by scan */
    assert_true(f->pos > 0); /* the scan started the table's log, whose base lies past 0 */
    static uint64_t extra_keys[N];
    push_round(c, "emb", 8, 99, extra_keys, N, POOL); /* N entries: [pos, pos + N) */
    assert_int_equal(psc_deltas(c, /* from 0 is not held: no PC_ERANGE for a bounds query */
                                &(psc_stream_req_t){.table = "emb", .dim = 8, .uid = f->uid}, &b,
                                bwhy, sizeof bwhy),
                     0);
    assert_true(b.uid == f->uid && b.oldest == f->pos && b.head == f->pos + N && b.n == 0);
    for (int r = 5; r < ROUNDS; r++) {
        push_round(c, "emb", 8, r, keys + r * N, N, POOL);
        if (r % 3 == 0)
            follow(f, spec); /* follow while pushes go on */
    }
    follow(f, spec);
    compare(c, f, keys, ROUNDS * N);
    assert_int_equal(f->rescans, 0);
    /* evictions: a table of 400 rows (in 2 shards) given 2000 keys */
    ps_table_destroy(f->t);
    memset(f, 0, sizeof *f);
    *f = (follower_t){.c = c, .server = 0, .dim = 4, .table = "cap"};
    f->t = tc_create(cap_spec);
    static uint64_t ck[4 * N];
    for (int r = 0; r < 4; r++) {
        push_round(c, "cap", 4, 100 + r, ck + r * N, N, 2000);
        follow(f, cap_spec);
    }
    compare(c, f, ck, 4 * N);
    ps_table_destroy(f->t);
    /* a fresh claim replaces the table: the old uid is refused */
    psc_stream_req_t q = req(f);
    psc_stream_t out;
    char why[600];
    q.table = "emb";
    q.dim = 8;
    q.from = 0;
    assert_int_equal(psc_scan(c,
                              &(psc_stream_req_t){.table = "emb",
                                                  .dim = 8,
                                                  .parts = 1,
                                                  .cap = 100,
                                                  .keys = f->keys,
                                                  .found = f->found,
                                                  .rows = f->rows},
                              &out, why, sizeof why),
                     PC_ETOOBIG); /* about 3000 rows in one part, for buffers of 100 */
    assert_has(why, "more parts");
    q.uid = 0;
    q.parts = 8;
    assert_int_equal(psc_scan(c, &q, &out, why, sizeof why), 0);
    const uint64_t uid = out.uid;
    psc_claim_t cl;
    assert_int_equal(psc_claim(c, "emb", "job-b", PSC_CLAIM_FRESH, &cl), 0);
    q.uid = uid;
    q.from = out.next;
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_ESTATE);
    assert_has(why, "was replaced");
    /* bad requests */
    q.uid = 0;
    q.server = 3;
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_EINVAL);
    assert_has(why, "no server 3");
    q.server = 0;
    q.table = "nope";
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_ENOTFOUND);
    q.table = "emb";
    q.dim = 4;
    q.from = 0;
    assert_int_equal(psc_scan(c, &q, &out, why, sizeof why), PC_EDIM);
    q.dim = 8;
    q.part = 8;
    assert_int_equal(psc_scan(c, &q, &out, why, sizeof why), PC_EINVAL);
    q.part = 0;
    q.cap = 0; /* a scan needs buffers (a DELTAS of cap 0 is the bounds query) */
    assert_int_equal(psc_scan(c, &q, &out, why, sizeof why), PC_EINVAL);
    q.table = NULL;
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_EINVAL);
    psc_close(c);
    free(f);
    pu_stop(srv);
    tc_rmdir(dir);
}

static void test_behind_log(void **state) {
    (void)state;
    char dir[256], one[64];
    tc_tmpdir(dir, sizeof dir, "streamlog");
    const char *spec = "name=emb,dim=8,optimizer=adagrad";
    char tables[100];
    snprintf(tables, sizeof tables, "--tables=%s", spec);
    int port = pu_free_port();
    const char *extra[] = {tables, "--delta-log-entries=64", NULL};
    pid_t srv = pu_spawn(port, dir, extra, NULL);
    snprintf(one, sizeof one, "127.0.0.1:%d", port);
    psc_t *c = connect_to(one);
    follower_t *f = calloc(1, sizeof *f);
    *f = (follower_t){.c = c, .server = 0, .dim = 8, .table = "emb"};
    f->t = tc_create(spec);
    static uint64_t keys[10 * 300];
    push_round(c, "emb", 8, 1, keys, 300, 1000);
    psc_stream_req_t q = req(f);
    psc_stream_t out;
    char why[600];
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_ERANGE);
    assert_has(why, "had no change log: its log starts now");
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_ERANGE); /* 0 < its base */
    assert_has(why, "position 0 of table emb is not held");
    follow(f, spec); /* rescans */
    assert_int_equal(f->rescans, 1);
    for (int r = 2; r <= 10; r++) {
        push_round(c, "emb", 8, r, keys + (r - 1) * 300, 300, 1000);
        follow(f, spec); /* each round is over 64 keys: a rescan each time */
    }
    compare(c, f, keys, 10 * 300);
    assert_true(f->rescans >= 9);
    ps_table_destroy(f->t);
    free(f);
    psc_close(c);
    pu_stop(srv);
    tc_rmdir(dir);
}

static void test_two_servers_and_no_log(void **state) {
    (void)state;
    char dir[256], map[256], maparg[300], t[100];
    tc_tmpdir(dir, sizeof dir, "stream2");
    int p0 = pu_free_port(), p1 = pu_free_port();
    snprintf(map, sizeof map,
             "version=1;servers=127.0.0.1:%d,127.0.0.1:%d;slots=0-8191:0,8192-16383:1", p0, p1);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    const char *spec = "name=emb,dim=8,optimizer=adagrad";
    snprintf(t, sizeof t, "--tables=%s", spec);
    const char *e0[] = {maparg, t, "--delta-log-entries=100000", NULL},
               *e1[] = {maparg, t, "--delta-log-entries=0", NULL}; /* no change log */
    pid_t s0 = pu_spawn(p0, dir, e0, NULL), s1 = pu_spawn(p1, dir, e1, NULL);
    psc_t *c = connect_to(map);
    static uint64_t keys[2000];
    push_round(c, "emb", 8, 5, keys, 2000, 100000);
    follower_t *f = calloc(1, sizeof *f);
    *f = (follower_t){.c = c, .server = 0, .dim = 8, .table = "emb"};
    f->t = tc_create(spec);
    follow(f, spec); /* server 0's half */
    size_t n0 = 0;
    uint8_t fl[2000];
    float *rows = malloc(2000 * 8 * 4);
    assert_int_equal(ps_table_lookup(f->t, keys, 2000, rows, 2000 * 8, fl), 0);
    for (int i = 0; i < 2000; i++)
        n0 += fl[i];
    print_message("server 0 streamed %zu of 2000 keys\n", n0);
    assert_true(n0 > 700 && n0 < 1300);
    psc_stream_req_t q = req(f);
    q.server = 1;
    q.uid = 0; /* f->uid is server 0's table */
    q.from = 0;
    psc_stream_t out;
    char why[600];
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), PC_EUNSUPPORTED);
    assert_has(why, "no change log");
    q.cap = 0; /* the bounds query: no log, no error */
    assert_int_equal(psc_deltas(c, &q, &out, why, sizeof why), 0);
    assert_true(out.uid != 0 && out.head == 0 && out.oldest == 0);
    q.cap = CAP;
    q.parts = 2; /* a scan needs no log */
    assert_int_equal(psc_scan(c, &q, &out, why, sizeof why), 0);
    assert_int_equal(out.next, 0);
    free(rows);
    ps_table_destroy(f->t);
    free(f);
    psc_close(c);
    pu_stop(s0);
    pu_stop(s1);
    tc_rmdir(dir);
}

/* Keys of server 0's slots, by the backup of their slot in the map below (1: slots 0-4095, 2:
 * 4096-8191), that a backup's scan in 4 parts brings to server `backup` (-1: none of them). */
static void backup_scan(psc_t *c, uint64_t mv, uint32_t backup, uint64_t *got, uint64_t *stray) {
    static uint64_t keys[CAP];
    static uint8_t found[CAP];
    static float rows[CAP * 16];
    *got = *stray = 0;
    for (uint32_t p = 0; p < 4; p++) {
        psc_stream_req_t q = {.server = 0,
                              .table = "emb",
                              .dim = 16, /* Adagrad: the weights and their accumulators */
                              .part = p,
                              .parts = 4,
                              .from = backup,
                              .cap = CAP,
                              .keys = keys,
                              .found = found,
                              .rows = rows};
        psc_stream_t out;
        char why[600];
        const int rc =
            psc__stream(c, true, &q, PC_STREAM_STATE | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP, mv, 0,
                        &out, why, sizeof why);
        if (rc)
            fail_msg("backup %u's scan, part %u: %s: %s", backup, p, pc_err_name(rc), why);
        for (uint32_t i = 0; i < out.n; i++) {
            const uint32_t slot = pc_key_slot(keys[i]);
            const uint32_t b = slot < 4096 ? 1 : slot < 8192 ? 2 : 9;
            *got += b == backup;
            *stray += b != backup || !found[i];
        }
    }
}

static void test_backup_scan(void **state) {
    (void)state;
    char dir[256], map[400], maparg[450], t[100];
    tc_tmpdir(dir, sizeof dir, "stream3");
    int port[3];
    for (int i = 0; i < 3; i++)
        port[i] = pu_free_port();
    snprintf(map, sizeof map,
             "version=3;servers=127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d;"
             "slots=0-4095:0/1,4096-8191:0/2,8192-16383:1",
             port[0], port[1], port[2]);
    snprintf(maparg, sizeof maparg, "--cluster-map=%s", map);
    snprintf(t, sizeof t, "--tables=name=emb,dim=8,optimizer=adagrad");
    const char *e[] = {maparg, t, NULL};
    pid_t s[3];
    for (int i = 0; i < 3; i++)
        s[i] = pu_spawn(port[i], dir, e, NULL);
    psc_t *c = connect_to(map);
    enum { N = 3000 };
    static uint64_t keys[N];
    static float rows[N * 8];
    uint64_t want[3] = {0};
    for (int i = 0; i < N; i++) {
        keys[i] = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ULL;
        const uint32_t slot = pc_key_slot(keys[i]);
        want[slot < 4096 ? 1 : slot < 8192 ? 2 : 0]++;
    }
    /* pulls insert the rows (no push: server 0's would wait for backups that follow nothing) */
    assert_int_equal(psc_pull(c, "emb", keys, N, 8, rows), 0);
    uint64_t got, stray;
    for (uint32_t b = 1; b <= 2; b++) {
        backup_scan(c, 3, b, &got, &stray);
        print_message("backup %u: %llu keys (of %llu), %llu others\n", b, (unsigned long long)got,
                      (unsigned long long)want[b], (unsigned long long)stray);
        assert_true(got == want[b] && want[b] > 600 && stray == 0);
    }
    backup_scan(c, 3, 0, &got, &stray); /* server 0 backs up nothing of its own */
    assert_true(got == 0 && stray == 0);
    psc_stream_req_t q = {.server = 0,
                          .table = "emb",
                          .dim = 16,
                          .part = 0,
                          .parts = 1,
                          .from = 3,
                          .cap = CAP,
                          .keys = keys,
                          .found = (uint8_t[CAP]){0},
                          .rows = rows};
    psc_stream_t out;
    char why[600];
    const uint32_t fl = PC_STREAM_STATE | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP;
    assert_int_equal(psc__stream(c, true, &q, fl, 3, 0, &out, why, sizeof why), PC_EINVAL);
    assert_has(why, "does not have");
    q.from = 1;
    assert_int_equal(psc__stream(c, true, &q, fl, 2, 0, &out, why, sizeof why), PC_EWRONGSLOT);
    assert_int_equal(
        psc__stream(c, true, &q, PC_STREAM_STATE | PC_STREAM_BACKUP, 3, 0, &out, why, sizeof why),
        PC_EINVAL); /* refused by the client: a backup's copy names its map */
    psc_close(c);
    for (int i = 0; i < 3; i++)
        pu_stop(s[i]);
    tc_rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_stream PATH-TO-ps-server\n");
        return 2;
    }
    pu_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follow),
        cmocka_unit_test(test_behind_log),
        cmocka_unit_test(test_two_servers_and_no_log),
        cmocka_unit_test(test_backup_scan),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pu_kill_all();
    return rc;
}
