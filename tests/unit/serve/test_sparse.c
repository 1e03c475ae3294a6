/* sv_sparse (serve/sv_sparse.h) in process: tables from a settings text (replica form: no
 * eviction, TTL or admission; a cold table refused by name, left out of every table), keys routed
 * by slot to their server's catalog, lookups that answer like the training server's (rows and
 * found; initial rows or zeros for a missing key), a staging table swapped in whole, the
 * order-independent checksum; rows loaded from the servers' checkpoints land only in the catalog
 * of their slot's primary (a replicated server's checkpoint holds its backup rows too). */
#include "table_check.h"

#include "pc_error.h"
#include "ps_ckpt.h"
#include "sv_sparse.h"

static const char *k_map = "version=3;servers=10.0.0.1:1,10.0.0.2:2,10.0.0.3:3;"
                           "slots=0-5000:0,5001-11000:1,11001-16383:2";

static void test_tables(void **state) {
    (void)state;
    sv_sparse_t *s;
    char err[300];
    assert_int_equal(sv_sparse_create("version=1;servers=x", &s, err, sizeof err), PC_EPARSE);
    assert_non_null(strstr(err, "cluster map"));
    assert_int_equal(sv_sparse_create(k_map, &s, err, sizeof err), 0);
    assert_int_equal(sv_sparse_servers(s), 3);
    assert_string_equal(sv_sparse_server_addr(s, 1), "10.0.0.2:2");
    assert_null(sv_sparse_server_addr(s, 3));
    const char *text = "name=a,dim=4,capacity_rows=100,ttl_ticks=50,admit_threshold=3\n"
                       "name=b,dim=2,missing=zeros\n"
                       "name=c,dim=2,cold=true,capacity_rows=10\n";
    assert_int_equal(sv_sparse_add_tables(s, text, "a,nope", err, sizeof err), PC_ENOTFOUND);
    assert_int_equal(sv_sparse_add_tables(s, text, "c", err, sizeof err), PC_EUNSUPPORTED);
    assert_non_null(strstr(err, "table c is cold"));
    assert_int_equal(sv_sparse_add_tables(s, text, "b", err, sizeof err), 0);
    assert_int_equal(sv_sparse_add_tables(s, text, "b", err, sizeof err), PC_EEXIST);
    ps_table_config_t cfg;
    assert_int_equal(sv_sparse_table_config(s, "a", &cfg), 0); /* added before "nope" failed */
    sv_sparse_destroy(s);
    assert_int_equal(sv_sparse_create(k_map, &s, err, sizeof err), 0);
    assert_int_equal(sv_sparse_add_tables(s, text, "a,b", err, sizeof err), 0);
    assert_int_equal(sv_sparse_table_config(s, "a", &cfg), 0);
    assert_int_equal(cfg.capacity_rows, 0);
    assert_int_equal(cfg.ttl_ticks, 0);
    assert_int_equal(cfg.admit_threshold, 0);
    assert_int_equal(cfg.dim, 4);
    char names[4][PS_TABLE_NAME_MAX];
    assert_int_equal(sv_sparse_tables(s, names, 4), 2);
    assert_string_equal(names[0], "a");
    assert_string_equal(names[1], "b");
    sv_sparse_t *every; /* every table: the cold one is left out, the others come */
    assert_int_equal(sv_sparse_create(k_map, &every, err, sizeof err), 0);
    assert_int_equal(sv_sparse_add_tables(every, text, NULL, err, sizeof err), 0);
    assert_int_equal(sv_sparse_tables(every, names, 4), 2);
    assert_int_equal(sv_sparse_table_config(every, "c", &cfg), PC_ENOTFOUND);
    sv_sparse_destroy(every);
    for (uint32_t i = 0; i < 3; i++) { /* every server's catalog holds both */
        ps_table_t *t;
        assert_int_equal(ps_catalog_acquire(sv_sparse_catalog(s, i), "b", &t), 0);
        ps_catalog_release(sv_sparse_catalog(s, i), t);
    }
    sv_sparse_destroy(s);
}

static void test_lookup_routes(void **state) {
    (void)state;
    sv_sparse_t *s;
    assert_int_equal(sv_sparse_create(k_map, &s, NULL, 0), 0);
    assert_int_equal(
        sv_sparse_add_tables(s, "name=a,dim=4,seed=7\nname=b,dim=2,missing=zeros\n", NULL, NULL, 0),
        0);
    pc_cluster_map_t *m;
    assert_int_equal(pc_cmap_parse(k_map, &m, NULL, 0), 0);
    enum { N = 3000 };
    static uint64_t keys[N];
    static float w[N * 4], got[N * 4], want[N * 4];
    static uint8_t found[N];
    uint64_t rng = 5;
    /* even keys: a row loaded into their owner's catalog; odd keys: never loaded */
    for (size_t i = 0; i < N; i++) {
        keys[i] = tu_rand(&rng);
        for (int e = 0; e < 4; e++)
            w[i * 4 + e] = tu_gauss(&rng);
        if (i % 2 == 0) {
            ps_table_t *t;
            ps_catalog_t *cat = sv_sparse_catalog(s, pc_cmap_key_owner(m, keys[i]));
            assert_int_equal(ps_catalog_acquire(cat, "a", &t), 0);
            assert_int_equal(ps_table_load(t, 1, &keys[i], &w[i * 4], NULL, NULL, NULL), 0);
            ps_catalog_release(cat, t);
        }
    }
    assert_int_equal(sv_sparse_rows(s), N / 2);
    assert_int_equal(sv_sparse_lookup(s, "a", keys, N, got, N * 4 - 1, found), PC_EDIM);
    assert_int_equal(sv_sparse_lookup(s, "nope", keys, N, got, N * 4, found), PC_ENOTFOUND);
    assert_int_equal(sv_sparse_lookup(s, "a", keys, N, got, N * 4, found), 0);
    ps_table_t *ref = tc_create("name=a,dim=4,seed=7");
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(found[i], i % 2 == 0);
        if (i % 2 == 0) {
            assert_memory_equal(&got[i * 4], &w[i * 4], 16);
        } else {
            ps_table_initial_row(ref, keys[i], &want[i * 4]); /* what the server answers */
            assert_memory_equal(&got[i * 4], &want[i * 4], 16);
        }
    }
    ps_table_destroy(ref);
    /* a missing key of a missing=zeros table */
    float z[2] = {1, 1};
    uint8_t f1 = 9;
    assert_int_equal(sv_sparse_lookup(s, "b", keys, 1, z, 2, &f1), 0);
    assert_true(z[0] == 0 && z[1] == 0 && f1 == 0);
    /* checksum: the same figure over a table of every row, visited in any order */
    uint64_t sum, rows;
    assert_int_equal(sv_sparse_checksum(s, "a", &sum, &rows), 0);
    assert_int_equal(rows, N / 2);
    uint64_t want_sum = 0;
    for (size_t i = N; i-- > 0;)
        if (i % 2 == 0)
            want_sum += sv_sparse_row_hash(keys[i], &w[i * 4], 4);
    assert_true(sum == want_sum);
    /* a staging table swapped into server 1: its keys answer the staging rows at once */
    ps_table_t *st;
    assert_int_equal(sv_sparse_staging_create(s, "a", &st), 0);
    size_t in1 = 0;
    for (size_t i = 0; i < N; i += 2) {
        if (pc_cmap_key_owner(m, keys[i]) != 1)
            continue;
        float v[4] = {1, 2, 3, (float)i};
        assert_int_equal(ps_table_load(st, 1, &keys[i], v, NULL, NULL, NULL), 0);
        in1++;
    }
    ps_table_t *held;
    assert_int_equal(ps_catalog_acquire(sv_sparse_catalog(s, 1), "a", &held), 0);
    assert_int_equal(sv_sparse_swap_in(s, 1, st), 0);
    assert_true(ps_table_count(held) > 0); /* an old holder keeps its table until released */
    ps_catalog_release(sv_sparse_catalog(s, 1), held);
    assert_int_equal(sv_sparse_lookup(s, "a", keys, N, got, N * 4, found), 0);
    for (size_t i = 0; i < N; i += 2)
        if (pc_cmap_key_owner(m, keys[i]) == 1)
            assert_true(got[i * 4 + 3] == (float)i && found[i]);
    assert_true(in1 > 100);
    pc_cmap_destroy(m);
    sv_sparse_destroy(s);
}

/* Checkpoint every table of cat into dir (then cat is destroyed) and load that checkpoint, as
 * each of the map's 3 servers', into a replica holding `tables`: the replica (and, when asked,
 * the change-log starts). */
static sv_sparse_t *checkpoint_and_load(ps_catalog_t *cat, const char *dir, const char *tables,
                                        sv_sparse_start_t **starts, size_t *nstarts) {
    const ps_ckpt_opts_t o = {.dir = dir, .keep = 1, .full_every = 1};
    ps_ckpt_t *ck;
    assert_int_equal(ps_ckpt_create(cat, &o, &ck), 0);
    ps_ckpt_result_t res;
    assert_int_equal(ps_ckpt_write(ck, &res), 0);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    sv_sparse_t *s;
    assert_int_equal(sv_sparse_create(k_map, &s, NULL, 0), 0);
    assert_int_equal(sv_sparse_add_tables(s, tables, NULL, NULL, 0), 0);
    const char *dirs[3] = {dir, dir, dir};
    char err[512];
    int rc = sv_sparse_load_checkpoints(s, dirs, NULL, 3, NULL, starts, nstarts, err, sizeof err);
    if (rc)
        fail_msg("load: %s", err);
    return s;
}

/* Every server's checkpoint holds every key (replicated servers hold their backup slots' rows
 * beside their own): the replica keeps each row once, in its primary's catalog, so the rows
 * held and the checksum are the cluster's, not three times them. */
static void test_checkpoint_primary_rows(void **state) {
    (void)state;
    char dir[256];
    tc_tmpdir(dir, sizeof dir, "sparseckpt");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t cfg;
    assert_int_equal(ps_catalog_spec_parse("name=a,dim=4", &cfg, NULL, 0), 0);
    assert_int_equal(ps_catalog_add(cat, &cfg), 0);
    enum { N = 2000 };
    static uint64_t keys[N];
    static float w[N * 4];
    uint64_t rng = 11, want_sum = 0;
    for (size_t i = 0; i < N; i++) {
        keys[i] = tu_rand(&rng);
        for (int e = 0; e < 4; e++)
            w[i * 4 + e] = tu_gauss(&rng);
        want_sum += sv_sparse_row_hash(keys[i], &w[i * 4], 4);
    }
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "a", &t), 0);
    assert_int_equal(ps_table_load(t, N, keys, w, NULL, NULL, NULL), 0);
    ps_catalog_release(cat, t);
    sv_sparse_t *s = checkpoint_and_load(cat, dir, "name=a,dim=4\n", NULL, NULL);
    uint64_t sum, rows;
    assert_int_equal(sv_sparse_checksum(s, "a", &sum, &rows), 0);
    assert_int_equal(sv_sparse_rows(s), N);
    assert_int_equal(rows, N);
    assert_true(sum == want_sum);
    static float got[N * 4];
    static uint8_t found[N];
    assert_int_equal(sv_sparse_lookup(s, "a", keys, N, got, N * 4, found), 0);
    for (size_t i = 0; i < N; i++)
        assert_true(found[i] && memcmp(&got[i * 4], &w[i * 4], 16) == 0);
    sv_sparse_destroy(s);
    tc_rmdir(dir);
}

/* A version of more tables than an early guess of 64 per server: every (server, table) gets its
 * start, each once (a fixed-size array once dropped some and read past its end). */
static void test_checkpoint_many_tables(void **state) {
    (void)state;
    enum { NT = 70 };
    char dir[256], spec[NT * 32] = "", one[32];
    tc_tmpdir(dir, sizeof dir, "sparsemany");
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    for (int i = 0; i < NT; i++) {
        snprintf(one, sizeof one, "name=t%d,dim=4", i);
        ps_table_config_t cfg;
        assert_int_equal(ps_catalog_spec_parse(one, &cfg, NULL, 0), 0);
        assert_int_equal(ps_catalog_add(cat, &cfg), 0);
        strcat(spec, one);
        strcat(spec, "\n");
    }
    sv_sparse_start_t *st = NULL;
    size_t nst = 0;
    sv_sparse_t *s = checkpoint_and_load(cat, dir, spec, &st, &nst);
    assert_int_equal(nst, 3 * NT);
    static uint8_t seen[3][NT];
    for (size_t k = 0; k < nst; k++) {
        int t = -1;
        assert_true(st[k].server < 3);
        assert_int_equal(sscanf(st[k].table, "t%d", &t), 1);
        assert_true(t >= 0 && t < NT);
        assert_int_equal(seen[st[k].server][t]++, 0);
    }
    free(st);
    sv_sparse_destroy(s);
    tc_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_lookup_routes),
        cmocka_unit_test(test_checkpoint_primary_rows),
        cmocka_unit_test(test_checkpoint_many_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
