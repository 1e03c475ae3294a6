/* Named tables: add, acquire, drop while held, list, reuse of a dropped name; claims (which job
 * trains a table), also racing. */
#include "test_util.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pc_error.h"
#include "ps_catalog.h"

static void cfg_named(ps_table_config_t *c, const char *spec) {
    ps_table_config_defaults(c);
    assert_int_equal(ps_table_config_parse(c, spec, NULL, 0), 0);
}

static void test_catalog(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    cfg_named(&c, "name=users,dim=8");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    assert_int_equal(ps_catalog_add(cat, &c), PC_EEXIST);
    cfg_named(&c, "name=ads,dim=16,optimizer=ftrl");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    c.dim = 0;
    assert_int_equal(ps_catalog_add(cat, &c), PC_EINVAL);
    assert_int_equal(ps_catalog_changes(cat), 2); /* tables put; a refused one is no change */

    char names[4][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(cat, names, 4), 2);
    assert_string_equal(names[0], "ads");
    assert_string_equal(names[1], "users");

    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "nope", &t), PC_ENOTFOUND);
    assert_int_equal(ps_catalog_acquire(cat, "users", &t), 0);
    assert_int_equal(ps_table_dim(t), 8);
    uint64_t k = 1;
    float row[8];
    assert_int_equal(ps_catalog_drop(cat, "users"), 0);
    assert_int_equal(ps_catalog_changes(cat), 3);
    assert_int_equal(ps_catalog_acquire(cat, "users", &t) == PC_ENOTFOUND, 1);
    /* still usable by its holder after the drop */
    assert_int_equal(ps_table_pull(t, &k, 1, row, 8), 0);
    /* the name can be reused at once, with another shape */
    cfg_named(&c, "name=users,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_table_t *t2;
    assert_int_equal(ps_catalog_acquire(cat, "users", &t2), 0);
    assert_int_equal(ps_table_dim(t2), 4);
    ps_catalog_release(cat, t); /* destroys the dropped table */
    ps_catalog_release(cat, t2);
    assert_int_equal(ps_catalog_drop(cat, "users"), 0);
    assert_int_equal(ps_catalog_drop(cat, "users"), PC_ENOTFOUND);
    assert_int_equal(ps_catalog_list(cat, names, 4), 1);
    ps_catalog_destroy(cat);
}

/* At most PS_CATALOG_TABLES_MAX live tables (a checkpoint and replication carry that many: a
 * table past it was left out of both): one more is refused, a dropped one makes room, and a
 * table replaced under its name needs none. */
static void test_table_limit(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    char spec[64];
    for (int i = 0; i < PS_CATALOG_TABLES_MAX; i++) {
        snprintf(spec, sizeof spec, "name=t%d,dim=4", i);
        cfg_named(&c, spec);
        assert_int_equal(ps_catalog_add(cat, &c), 0);
    }
    cfg_named(&c, "name=one_more,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), PC_ETOOBIG);
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "one_more", &t), PC_ENOTFOUND);
    cfg_named(&c, "name=t7,dim=8"); /* a replacement */
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_catalog_set(cat, t), 0);
    assert_int_equal(ps_catalog_drop(cat, "t3"), 0);
    cfg_named(&c, "name=one_more,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    assert_int_equal(ps_catalog_list(cat, NULL, 0), PS_CATALOG_TABLES_MAX);
    /* a restore installs every table of its checkpoint, past the limit too (one written before
     * it may hold more); a new one is refused still */
    cfg_named(&c, "name=restored,dim=4");
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_catalog_set(cat, t), 0);
    assert_int_equal(ps_catalog_list(cat, NULL, 0), PS_CATALOG_TABLES_MAX + 1);
    cfg_named(&c, "name=newer,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), PC_ETOOBIG);
    ps_catalog_destroy(cat);
}

/* Installing a table made aside (a restore, a replica's swap): put refuses a taken name,
 * replace a free one, set takes both; a holder of the old table keeps it usable, and the name
 * is never without a table (acquire sees the old or the new one). */
static void test_install(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    ps_table_t *t, *held, *now;
    cfg_named(&c, "name=emb,dim=8");
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_catalog_replace(cat, t), PC_ENOTFOUND); /* t destroyed */
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_catalog_set(cat, t), 0); /* new */
    assert_int_equal(ps_catalog_acquire(cat, "emb", &held), 0);
    assert_ptr_equal(held, t);
    cfg_named(&c, "name=emb,dim=4");
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_catalog_put(cat, t), PC_EEXIST); /* t destroyed */
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_catalog_set(cat, t), 0); /* in place of the held one */
    assert_int_equal(ps_catalog_acquire(cat, "emb", &now), 0);
    assert_true(now == t && ps_table_dim(now) == 4 && ps_table_dim(held) == 8);
    uint64_t k = 1;
    float row[8];
    assert_int_equal(ps_table_pull(held, &k, 1, row, 8), 0);
    ps_catalog_release(cat, held); /* destroys the old table */
    ps_catalog_release(cat, now);
    char names[2][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(cat, names, 2), 1);
    ps_catalog_destroy(cat);
}

/* A spec a server takes from a user must name its table (no silent "default"); errors quote the
 * spec; the bare engine's parse keeps its default name for in-process tables. */
static void test_spec_needs_name(void **state) {
    (void)state;
    ps_table_config_t c, before;
    char err[300];
    ps_table_config_defaults(&c);
    before = c;
    assert_int_equal(ps_catalog_spec_parse("dim=8", &c, err, sizeof err), PC_EINVAL);
    assert_string_equal(err, "table spec 'dim=8': name= is required");
    assert_memory_equal(&c, &before, sizeof c);
    assert_int_equal(ps_catalog_spec_parse("name=,dim=8", &c, err, sizeof err), PC_EINVAL);
    assert_string_equal(err, "table spec 'name=,dim=8': name= is required");
    assert_int_equal(ps_catalog_spec_parse("", &c, err, sizeof err), PC_EINVAL);
    assert_int_equal(ps_catalog_spec_parse("name=ads,dim=0", &c, err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, "table spec 'name=ads,dim=0': dim: 0 is outside"));
    assert_int_equal(ps_catalog_spec_parse("name=ads,bogus=1", &c, err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, "unknown setting 'bogus'"));
    assert_int_equal(ps_catalog_spec_parse("name=ads,shards=3", &c, err, sizeof err), PC_EINVAL);
    assert_int_equal(ps_catalog_spec_parse("name=ads,dim=8,optimizer=adam", &c, NULL, 0), 0);
    assert_string_equal(c.name, "ads");
    assert_int_equal(c.dim, 8);
    ps_table_config_t d;
    ps_table_config_defaults(&d);
    assert_true(c.lr == d.lr); /* the rest are the table's defaults */
    assert_int_equal(c.shards, d.shards);
    /* the engine alone: no name needed */
    assert_int_equal(ps_table_config_parse(&d, "dim=8", NULL, 0), 0);
    ps_table_t *t;
    assert_int_equal(ps_table_create(&d, &t), 0);
    ps_table_destroy(t);
}

static int claim(ps_catalog_t *cat, const char *job, ps_claim_mode_t mode, ps_claim_result_t *r) {
    char err[256];
    return ps_catalog_claim(cat, "emb", job, mode, 0, r, err, sizeof err);
}

/* One push of key 1 (a trained table). */
static void push_one(ps_catalog_t *cat) {
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
    uint64_t k = 1;
    float g[4] = {1, 1, 1, 1};
    assert_int_equal(ps_table_push(t, &k, 1, g, 4, NULL), 0);
    ps_catalog_release(cat, t);
}

static void test_claims(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    cfg_named(&c, "name=emb,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_claim_result_t r;
    char err[256], owner[PS_OWNER_MAX];
    assert_int_equal(ps_catalog_claim(cat, "nope", "a", PS_CLAIM_CHECK, 0, &r, err, sizeof err),
                     PC_ENOTFOUND);
    assert_int_equal(claim(cat, "", PS_CLAIM_CHECK, &r), PC_EINVAL); /* a job needs a name */
    /* an untrained table: job a gets it; a again: continued; inspect changes nothing */
    assert_int_equal(claim(cat, "a", PS_CLAIM_CHECK, &r), 0);
    assert_int_equal(r.action, PS_CLAIMED_NEW);
    push_one(cat);
    assert_int_equal(claim(cat, "a", PS_CLAIM_FRESH, &r), 0);
    assert_int_equal(r.action, PS_CLAIMED_CONTINUED); /* its own rows are not emptied */
    assert_int_equal(r.version, 1);
    assert_int_equal(claim(cat, "", PS_CLAIM_INSPECT, &r), 0);
    assert_int_equal(r.action, PS_CLAIMED_NONE);
    assert_string_equal(r.previous, "a");
    /* job b: refused, with a message naming a; warm-start takes the rows over */
    assert_int_equal(ps_catalog_claim(cat, "emb", "b", PS_CLAIM_CHECK, 0, &r, err, sizeof err),
                     PC_EOWNED);
    assert_non_null(strstr(err, "job 'a'"));
    assert_int_equal(claim(cat, "b", PS_CLAIM_WARM_START, &r), 0);
    assert_int_equal(r.action, PS_CLAIMED_WARM_STARTED);
    assert_int_equal(r.rows, 1);
    /* job c with fresh: an empty table with the same settings, owned by c */
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0); /* a call still holding the old */
    const uint64_t changes = ps_catalog_changes(cat);
    assert_int_equal(claim(cat, "c", PS_CLAIM_FRESH, &r), 0);
    assert_int_equal(r.action, PS_CLAIMED_RESET);
    assert_int_equal(ps_catalog_changes(cat), changes + 1); /* a replaced table: a change */
    assert_string_equal(r.previous, "b");
    assert_int_equal(ps_table_count(t), 1); /* the holder's table is intact until released */
    ps_catalog_release(cat, t);
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
    assert_int_equal(ps_table_count(t), 0);
    assert_int_equal(ps_table_version(t), 0);
    assert_int_equal(ps_table_dim(t), 4);
    ps_table_owner(t, owner, sizeof owner);
    assert_string_equal(owner, "c");
    ps_catalog_release(cat, t);
    /* a table pushed to by a client that claimed nothing is refused too; reset with job "" */
    assert_int_equal(claim(cat, "", PS_CLAIM_FRESH, &r), 0);
    push_one(cat);
    assert_int_equal(ps_catalog_claim(cat, "emb", "d", PS_CLAIM_CHECK, 0, &r, err, sizeof err),
                     PC_EOWNED);
    assert_non_null(strstr(err, "claimed no job"));
    char names[2][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(cat, names, 2), 1); /* one table through all of it */
    ps_catalog_destroy(cat);
}

/* Generation fences: the owner raises its table's fence (never lowers it); another job, an
 * epoch 0 or an epoch with another mode are refused; a table installed over one of the same
 * owner (a live restore) keeps the higher fence, one of another owner does not, and a new owner
 * starts at 0. */
static void test_fence(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    cfg_named(&c, "name=emb,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_claim_result_t r;
    char err[256];
    assert_int_equal(claim(cat, "a", PS_CLAIM_CHECK, &r), 0);
    assert_int_equal(ps_catalog_claim(cat, "emb", "a", PS_CLAIM_FENCE, 0, &r, err, sizeof err),
                     PC_EINVAL);
    assert_int_equal(ps_catalog_claim(cat, "emb", "a", PS_CLAIM_CHECK, 3, &r, err, sizeof err),
                     PC_EINVAL);
    assert_int_equal(ps_catalog_claim(cat, "emb", "b", PS_CLAIM_FENCE, 3, &r, err, sizeof err),
                     PC_EOWNED);
    assert_non_null(strstr(err, "job 'a'"));
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
    assert_int_equal(ps_table_fence(t), 0);
    assert_int_equal(ps_catalog_claim(cat, "emb", "a", PS_CLAIM_FENCE, 3, &r, err, sizeof err), 0);
    assert_int_equal(r.action, PS_CLAIMED_CONTINUED);
    assert_int_equal(ps_catalog_claim(cat, "emb", "a", PS_CLAIM_FENCE, 3, &r, err, sizeof err), 0);
    assert_int_equal(ps_catalog_claim(cat, "emb", "a", PS_CLAIM_FENCE, 2, &r, err, sizeof err),
                     PC_EFENCED);
    assert_int_equal(ps_table_fence(t), 3); /* an older generation's fence lowers nothing */
    ps_catalog_release(cat, t);
    /* a live restore of a's table (fence 1 in its checkpoint): keeps 3 */
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_table_set_owner(t, "a"), 0);
    ps_table_raise_fence(t, 1);
    assert_int_equal(ps_catalog_set(cat, t), 0);
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
    assert_int_equal(ps_table_fence(t), 3);
    ps_catalog_release(cat, t);
    /* another owner's table in its place: its own fence */
    assert_int_equal(ps_table_create(&c, &t), 0);
    assert_int_equal(ps_table_set_owner(t, "z"), 0);
    assert_int_equal(ps_catalog_set(cat, t), 0);
    assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
    assert_int_equal(ps_table_fence(t), 0);
    ps_table_raise_fence(t, 5);
    assert_int_equal(ps_table_set_owner(t, "z"), 0); /* the same owner: kept */
    assert_int_equal(ps_table_fence(t), 5);
    assert_int_equal(ps_table_set_owner(t, "y"), 0); /* a new owner: from nothing */
    assert_int_equal(ps_table_fence(t), 0);
    ps_catalog_release(cat, t);
    ps_catalog_destroy(cat);
}

/* Workers of one job racing with fresh: the table is emptied once. */
typedef struct racer {
    ps_catalog_t *cat;
    ps_claim_result_t r;
    int rc;
} racer_t;

static void *race(void *arg) {
    racer_t *x = arg;
    x->rc = claim(x->cat, "job", PS_CLAIM_FRESH, &x->r);
    push_one(x->cat); /* its first training step */
    return NULL;
}

static void test_claims_race(void **state) {
    (void)state;
    for (int round = 0; round < 50; round++) {
        ps_catalog_t *cat;
        assert_int_equal(ps_catalog_create(&cat), 0);
        ps_table_config_t c;
        cfg_named(&c, "name=emb,dim=4");
        assert_int_equal(ps_catalog_add(cat, &c), 0);
        ps_claim_result_t r;
        assert_int_equal(claim(cat, "old", PS_CLAIM_CHECK, &r), 0);
        push_one(cat);
        enum { N = 4 };
        racer_t x[N];
        pthread_t th[N];
        for (int i = 0; i < N; i++) {
            x[i] = (racer_t){.cat = cat};
            assert_int_equal(pthread_create(&th[i], NULL, race, &x[i]), 0);
        }
        int resets = 0;
        for (int i = 0; i < N; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(x[i].rc, 0);
            resets += x[i].r.action == PS_CLAIMED_RESET;
        }
        assert_int_equal(resets, 1);
        ps_table_t *t;
        assert_int_equal(ps_catalog_acquire(cat, "emb", &t), 0);
        assert_int_equal(ps_table_version(t), N); /* every worker's push, none emptied away */
        ps_catalog_release(cat, t);
        ps_catalog_destroy(cat);
    }
}

/* Attach hooks that take a while (a tier making a column family): attaches racing from several
 * threads each keep a place of the pending list (two that both saw one free place once wrote
 * past its end: ASan's heap-buffer-overflow), and a hook that fails leaves no place taken. */
static int slow_attach(void *ctx, ps_table_t *t, bool keep) {
    (void)ctx, (void)keep;
    usleep(20000);
    return strcmp(ps_table_config(t)->name, "refused") == 0 ? PC_EIO : 0;
}

static void quiet_detach(void *ctx, ps_table_t *t) {
    (void)ctx, (void)t;
}

typedef struct attacher {
    ps_catalog_t *cat;
    ps_table_t *t;
    int rc;
} attacher_t;

static void *attach_main(void *arg) {
    attacher_t *a = arg;
    a->rc = ps_catalog_attach(a->cat, a->t, false);
    return NULL;
}

static void test_attach_race(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    const ps_catalog_hooks_t h = {slow_attach, quiet_detach, NULL};
    ps_catalog_set_hooks(cat, &h);
    enum { N = 7 + 6 }; /* 7 attached one by one, then 6 at once: past the first 8 places */
    attacher_t a[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        ps_table_config_t c;
        char spec[64];
        snprintf(spec, sizeof spec, "name=t%d,dim=4", i);
        cfg_named(&c, i == N - 1 ? "name=refused,dim=4" : spec);
        assert_int_equal(ps_table_create(&c, &a[i].t), 0);
        a[i].cat = cat;
    }
    for (int i = 0; i < 7; i++) {
        attach_main(&a[i]);
        assert_int_equal(a[i].rc, 0);
    }
    for (int i = 7; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, attach_main, &a[i]), 0);
    for (int i = 7; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++)
        assert_int_equal(a[i].rc, i == N - 1 ? PC_EIO : 0);
    for (int i = 0; i < N - 1; i++) /* every attached one is taken in */
        assert_int_equal(ps_catalog_put(cat, a[i].t), 0);
    ps_table_destroy(a[N - 1].t);
    ps_catalog_destroy(cat);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_catalog),         cmocka_unit_test(test_install),
        cmocka_unit_test(test_spec_needs_name), cmocka_unit_test(test_claims),
        cmocka_unit_test(test_claims_race),     cmocka_unit_test(test_attach_race),
        cmocka_unit_test(test_fence),           cmocka_unit_test(test_table_limit)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
