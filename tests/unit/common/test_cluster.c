/* Cluster map: slot function, even maps, text round trip, validation, reassignment. */
#include "test_util.h"

#include <string.h>

#include "pc_cluster.h"
#include "pc_error.h"

static void test_slot_function(void **state) {
    (void)state;
    /* The slot function is part of the data format: pinned values (changing the hash or its
     * seed would move every key to another server). */
    assert_int_equal(pc_key_slot(0x1234567890abcdefULL), 8364);
    assert_int_equal(pc_key_slot(42), 9577);
    /* Spread: 16M sequential keys give every slot its mean of 1024 within +-20% (6 sigma). */
    static uint32_t hist[PC_NSLOTS];
    const uint64_t n = 16u << 20;
    for (uint64_t k = 0; k < n; k++)
        hist[pc_key_slot(k)]++;
    double mean = (double)n / PC_NSLOTS;
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        assert_true(hist[s] > 0.8 * mean);
        assert_true(hist[s] < 1.2 * mean);
    }
}

static void test_even_and_roundtrip(void **state) {
    (void)state;
    const char *addrs[] = {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"};
    pc_cluster_map_t *m, *p;
    assert_int_equal(pc_cmap_create_even(5, 3, addrs, &m), 0);
    assert_int_equal(pc_cmap_version(m), 5);
    uint32_t total = 0;
    for (uint32_t s = 0; s < 3; s++) {
        uint32_t c = pc_cmap_server_slots(m, s);
        assert_true(c == 5461 || c == 5462);
        total += c;
    }
    assert_int_equal(total, PC_NSLOTS);
    char buf[512];
    size_t need = pc_cmap_format(m, buf, sizeof buf);
    assert_true(need < sizeof buf);
    assert_string_equal(buf, "version=5;servers=127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002;"
                             "slots=0-5461:0,5462-10922:1,10923-16383:2");
    char err[128];
    assert_int_equal(pc_cmap_parse(buf, &p, err, sizeof err), 0);
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        assert_int_equal(pc_cmap_slot_owner(p, s), pc_cmap_slot_owner(m, s));
    assert_int_equal(pc_cmap_find(p, "127.0.0.1:7002"), 2);
    assert_int_equal(pc_cmap_find(p, "127.0.0.1:9"), PC_ENOTFOUND);
    /* Truncated output still reports the needed length. */
    char small[10];
    assert_int_equal(pc_cmap_format(m, small, sizeof small), need);
    assert_int_equal(strlen(small), 9);
    pc_cmap_destroy(p);
    pc_cmap_destroy(m);
}

static void test_parse_errors(void **state) {
    (void)state;
    pc_cluster_map_t *m = NULL;
    char err[128];
    const char *bad[] = {
        "",
        "version=1;servers=a:1;slots=0-16382:0",                   /* slot 16383 missing */
        "version=1;servers=a:1;slots=0-16383:0,5:0",               /* slot 5 twice */
        "version=1;servers=a:1;slots=0-16383:1",                   /* no server 1 */
        "version=0;servers=a:1;slots=0-16383:0",                   /* version 0 */
        "version=9223372036854775808;servers=a:1;slots=0-16383:0", /* no next version after */
        "version=1;servers=a:1,;slots=0-16383:0",                  /* empty address */
        "version=1;servers=a:1;slots=0-16384:0",                   /* slot out of range */
        "version=1;servers=a:1;slots=9-3:0",                       /* reversed range */
        "version=x;servers=a:1;slots=0-16383:0",
        "version=1;servers=a:1;slots=0-16383:0junk",
        "version=1;servers=a:1slots=0-16383:0",                   /* missing separator */
        "version=1;servers=a:1,a:1;slots=0-8191:0,8192-16383:1",  /* duplicate server */
        "version=1;servers=a:1;slots=0-16383:0,",                 /* trailing comma */
        "servers=a:1;version=1;slots=0-16383:0",                  /* fields out of order */
        "version=1;servers=a=1;slots=0-16383:0",                  /* '=' in an address */
        "version=1;servers=a:1,a:01;slots=0-8191:0,8192-16383:1", /* one server, two spellings */
        "version=1;servers=a:99999;slots=0-16383:0",              /* port out of range */
        "version=1;servers=a:x;slots=0-16383:0",                  /* port not a number */
        "version=1;servers=a;slots=0-16383:0",                    /* no port */
        "version=1;servers=a:1;slots=0-16383:0;extra=1",          /* unknown field */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        int rc = pc_cmap_parse(bad[i], &m, err, sizeof err);
        if (rc != PC_EPARSE)
            print_error("case %zu '%s' gave %d\n", i, bad[i], rc);
        assert_int_equal(rc, PC_EPARSE);
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(pc_cmap_parse(NULL, &m, err, sizeof err), PC_EINVAL);
    /* the last version the parser reads has no next one: a change is refused, not written as
     * a version no server could read back */
    assert_int_equal(pc_cmap_parse("version=9223372036854775807;servers=a:1;slots=0-16383:0", &m,
                                   err, sizeof err),
                     0);
    assert_int_equal(pc_cmap_add_server(m, "b:2", pc_cmap_version(m) + 1), PC_EINVAL);
    pc_cmap_destroy(m);
}

static void test_assign(void **state) {
    (void)state;
    const char *addrs[] = {"a:1", "b:2"};
    pc_cluster_map_t *m, *c;
    assert_int_equal(pc_cmap_create_even(1, 2, addrs, &m), 0);
    uint64_t key = 42;
    uint32_t slot = pc_key_slot(key);
    uint32_t owner = pc_cmap_key_owner(m, key);
    assert_int_equal(pc_cmap_copy(m, &c), 0);
    assert_int_equal(pc_cmap_assign(c, slot, slot, 1 - owner, 2), 0);
    assert_int_equal(pc_cmap_key_owner(c, key), 1 - owner);
    assert_int_equal(pc_cmap_key_owner(m, key), owner); /* the old map is untouched */
    assert_int_equal(pc_cmap_version(c), 2);
    assert_int_equal(pc_cmap_assign(c, 0, 1, 0, 2), PC_EINVAL); /* version must grow */
    assert_int_equal(pc_cmap_assign(c, 0, 1, 2, 3), PC_EINVAL); /* no such server */
    assert_int_equal(pc_cmap_assign(c, 5, 1, 0, 3), PC_EINVAL);
    assert_int_equal(pc_cmap_create_even(0, 2, addrs, &m), PC_EINVAL);
    const char *twice[] = {"a:1", "a:1"};
    assert_int_equal(pc_cmap_create_even(1, 2, twice, &m), PC_EINVAL);
    pc_cmap_destroy(c);
    pc_cmap_destroy(m);
}

static void test_backups(void **state) {
    (void)state;
    const char *addrs[] = {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"};
    pc_cluster_map_t *m, *p;
    uint32_t b[PC_MAX_BACKUPS];
    assert_int_equal(pc_cmap_create_even(1, 3, addrs, &m), 0);
    assert_false(pc_cmap_replicated(m));
    assert_int_equal(pc_cmap_slot_backups(m, 0, b), 0);
    assert_int_equal(pc_cmap_set_replicas(m, 3), PC_EINVAL); /* not fewer than the servers */
    assert_int_equal(pc_cmap_set_replicas(m, 1), 0);
    assert_true(pc_cmap_replicated(m));
    for (uint32_t s = 0; s < PC_NSLOTS; s += 97) {
        assert_int_equal(pc_cmap_slot_backups(m, s, b), 1);
        assert_int_equal(b[0], (pc_cmap_slot_owner(m, s) + 1) % 3);
        assert_true(pc_cmap_is_backup(m, s, b[0]));
        assert_false(pc_cmap_is_backup(m, s, pc_cmap_slot_owner(m, s)));
    }
    /* Text round trip keeps the backups. */
    char buf[512];
    pc_cmap_format(m, buf, sizeof buf);
    assert_non_null(strstr(buf, "0-5461:0/1"));
    char err[160];
    assert_int_equal(pc_cmap_parse(buf, &p, err, sizeof err), 0);
    char buf2[512];
    pc_cmap_format(p, buf2, sizeof buf2);
    assert_string_equal(buf, buf2);
    pc_cmap_destroy(p);
    /* Two backups. */
    assert_int_equal(pc_cmap_set_replicas(m, 2), 0);
    assert_int_equal(pc_cmap_slot_backups(m, 0, b), 2);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[1], 2);
    /* Server 0 is lost: its slots go to server 1, whose own backups drop 0. */
    pc_cmap_failover_t f;
    assert_int_equal(pc_cmap_fail_server(m, 0, 1, &f), PC_EINVAL); /* version */
    assert_int_equal(pc_cmap_fail_server(m, 0, 2, &f), 0);
    assert_int_equal(f.promoted, pc_cmap_server_slots(m, 1) - 5461);
    assert_int_equal(f.orphaned, 0);
    assert_int_equal(f.unclean, 0);
    assert_int_equal(pc_cmap_version(m), 2);
    assert_int_equal(pc_cmap_server_slots(m, 0), 0);
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        assert_false(pc_cmap_is_backup(m, s, 0));
        assert_false(pc_cmap_is_backup(m, s, pc_cmap_slot_owner(m, s)));
    }
    assert_int_equal(pc_cmap_slot_backups(m, 0, b), 1);
    assert_int_equal(b[0], 2);
    /* Server 0 comes back as a backup where a slot has fewer than 2. */
    uint32_t added;
    assert_int_equal(pc_cmap_add_backup(m, 0, 2, 3, &added), 0);
    assert_int_equal(added, PC_NSLOTS);
    assert_int_equal(pc_cmap_version(m), 3);
    assert_int_equal(pc_cmap_add_backup(m, 0, 2, 4, &added), 0);
    assert_int_equal(added, 0);
    assert_int_equal(pc_cmap_version(m), 3); /* nothing changed: same version */
    /* ... marked as catching up, in the text too, which keeps the mark; server 2, a backup of
     * server 0's slots that server 1 took over, is marked too (it followed server 0, not 1: it
     * was counted in sync, and a promotion of it clean, while server 1's pushes did not wait for
     * it); of server 1's own slots it stays in sync */
    assert_true(pc_cmap_backup_syncing(m, 0, 0));
    assert_true(pc_cmap_backup_syncing(m, 0, 2));
    assert_false(pc_cmap_backup_syncing(m, 6000, 2));
    assert_false(pc_cmap_backup_syncing(m, 0, 1)); /* the primary: no backup */
    pc_cmap_format(m, buf, sizeof buf);
    assert_non_null(strstr(buf, "0-5461:1/2~/0~,5462-10922:1/2/0~,10923-16383:2/1/0~"));
    assert_int_equal(pc_cmap_parse(buf, &p, err, sizeof err), 0);
    assert_true(pc_cmap_backup_syncing(p, 6000, 0));
    assert_false(pc_cmap_backup_syncing(p, 6000, 2));
    pc_cmap_format(p, buf2, sizeof buf2);
    assert_string_equal(buf, buf2);
    /* the mark is no role: the same slot with and without it has the same roles */
    pc_cluster_map_t *q;
    assert_int_equal(pc_cmap_copy(p, &q), 0);
    assert_int_equal(pc_cmap_set_syncing(q, 1, 0, false), 10923);
    assert_int_equal(pc_cmap_set_syncing(q, 1, 0, false), 0);
    assert_false(pc_cmap_backup_syncing(q, 100, 0));
    assert_true(pc_cmap_slot_same(p, q, 100));
    assert_true(pc_cmap_roles_same(p, q));
    /* marked again (a backup copying a primary's table again), then cleared: server 2 (backup of
     * server 1's slots too) keeps its marks, server 0 is no backup of its own slots */
    assert_int_equal(pc_cmap_set_syncing(q, 1, 0, true), 10923);
    assert_int_equal(pc_cmap_set_syncing(q, 1, 0, true), 0);
    assert_int_equal(pc_cmap_set_syncing(q, 0, 0, true), 0);
    assert_true(pc_cmap_backup_syncing(q, 6000, 0));
    assert_false(pc_cmap_backup_syncing(q, 6000, 2));
    assert_true(pc_cmap_roles_same(p, q));
    pc_cmap_format(q, buf2, sizeof buf2);
    assert_string_equal(buf, buf2);
    assert_int_equal(pc_cmap_set_syncing(q, 1, 0, false), 10923);
    /* server 2 caught up with server 1; then server 1 is lost: the backup in sync (2) is
     * promoted, not the first one (0, catching up) */
    assert_int_equal(pc_cmap_set_syncing(p, 1, 2, false), 5462);
    assert_int_equal(pc_cmap_fail_server(p, 1, 4, &f), 0);
    assert_false(pc_cmap_roles_same(p, q));
    assert_int_equal(f.promoted, 10923);
    assert_int_equal(f.unclean, 0);
    assert_int_equal(pc_cmap_slot_owner(p, 7), 2);
    assert_int_equal(pc_cmap_slot_backups(p, 7, b), 1);
    assert_int_equal(b[0], 0);
    assert_true(pc_cmap_backup_syncing(p, 7, 0)); /* the mark moved with its backup */
    /* and then server 2: only a backup catching up is left, promoted as unclean */
    assert_int_equal(pc_cmap_fail_server(p, 2, 5, &f), 0);
    assert_int_equal(f.promoted, PC_NSLOTS);
    assert_int_equal(f.unclean, PC_NSLOTS);
    assert_int_equal(pc_cmap_slot_owner(p, 7), 0);
    assert_false(pc_cmap_backup_syncing(p, 7, 0));
    /* the map counts them, in its text after the version, and later versions carry the count */
    assert_int_equal(pc_cmap_unclean(p), PC_NSLOTS);
    assert_int_equal(pc_cmap_unclean(q), 0);
    pc_cmap_format(q, buf, sizeof buf);
    assert_null(strstr(buf, "unclean")); /* absent while 0 */
    assert_int_equal(pc_cmap_bump(p, 6), 0);
    pc_cmap_format(p, buf, sizeof buf);
    assert_true(strncmp(buf, "version=6;unclean=16384;servers=", 32) == 0);
    pc_cmap_destroy(q);
    assert_int_equal(pc_cmap_parse(buf, &q, err, sizeof err), 0);
    assert_int_equal(pc_cmap_unclean(q), PC_NSLOTS);
    pc_cmap_format(q, buf2, sizeof buf2);
    assert_string_equal(buf, buf2);
    pc_cmap_destroy(q);
    assert_int_equal(pc_cmap_copy(p, &q), 0);
    assert_int_equal(pc_cmap_unclean(q), PC_NSLOTS);
    pc_cmap_unclean_at_least(q, 5); /* a map given anew goes on from the history's count */
    assert_int_equal(pc_cmap_unclean(q), PC_NSLOTS);
    pc_cmap_unclean_at_least(q, PC_NSLOTS + 1);
    assert_int_equal(pc_cmap_unclean(q), PC_NSLOTS + 1);
    pc_cmap_destroy(p);
    pc_cmap_destroy(q);
    /* unclean=0 is read (and not written back); the count saturates at UINT64_MAX */
    assert_int_equal(pc_cmap_parse("version=3;unclean=0;servers=a:1,b:2;slots=0-16383:0/1~", &p,
                                   err, sizeof err),
                     0);
    assert_int_equal(pc_cmap_unclean(p), 0);
    pc_cmap_format(p, buf, sizeof buf);
    assert_string_equal(buf, "version=3;servers=a:1,b:2;slots=0-16383:0/1~");
    pc_cmap_destroy(p);
    assert_int_equal(pc_cmap_parse("version=3;unclean=18446744073709551615;servers=a:1,b:2;"
                                   "slots=0-16383:0/1~",
                                   &p, err, sizeof err),
                     0);
    assert_int_equal(pc_cmap_fail_server(p, 0, 4, &f), 0);
    assert_int_equal(f.unclean, PC_NSLOTS);
    assert_true(pc_cmap_unclean(p) == UINT64_MAX);
    pc_cmap_destroy(p);
    const char *unclean_bad[] = {
        "version=1;unclean=;servers=a:1;slots=0-16383:0",
        "version=1;unclean=x;servers=a:1;slots=0-16383:0",
        "version=1;unclean=1,servers=a:1;slots=0-16383:0",
        "version=1;lost=1;servers=a:1;slots=0-16383:0",
        "version=1;unclean=99999999999999999999;servers=a:1;slots=0-16383:0",
        "version=1;unclean=1;unclean=2;servers=a:1;slots=0-16383:0"};
    for (size_t i = 0; i < sizeof unclean_bad / sizeof *unclean_bad; i++) {
        assert_int_equal(pc_cmap_parse(unclean_bad[i], &p, err, sizeof err), PC_EPARSE);
        assert_non_null(strstr(err, "cluster map"));
    }
    const char *marks_bad[] = {"version=1;servers=a:1,b:2;slots=0-16383:0~",
                               "version=1;servers=a:1,b:2;slots=0-16383:0/1~~"};
    for (size_t i = 0; i < sizeof marks_bad / sizeof *marks_bad; i++)
        assert_int_equal(pc_cmap_parse(marks_bad[i], &p, err, sizeof err), PC_EPARSE);
    /* A lost server with no backups orphans its slots. */
    assert_int_equal(pc_cmap_set_replicas(m, 0), 0);
    assert_int_equal(pc_cmap_fail_server(m, 2, 5, &f), 0);
    assert_int_equal(f.promoted, 0);
    assert_int_equal(f.orphaned, pc_cmap_server_slots(m, 2));
    /* Assigning slots to their backup removes it from their backups. */
    assert_int_equal(pc_cmap_set_replicas(m, 1), 0);
    assert_int_equal(pc_cmap_assign(m, 0, 9, 2, 6), 0);
    assert_false(pc_cmap_is_backup(m, 3, 2));
    assert_int_equal(pc_cmap_bump(m, 6), PC_EINVAL);
    assert_int_equal(pc_cmap_bump(m, 7), 0);
    pc_cmap_destroy(m);
    /* Bad backups are refused with a message. */
    const char *bad[] = {
        "version=1;servers=a:1,b:2;slots=0-16383:0/0",             /* backup = primary */
        "version=1;servers=a:1,b:2,c:3;slots=0-16383:0/1/1",       /* twice */
        "version=1;servers=a:1,b:2;slots=0-16383:0/2",             /* no such server */
        "version=1;servers=a:1,b:2,c:3,d:4;slots=0-16383:0/1/2/3", /* too many */
        "version=1;servers=a:1,b:2;slots=0-16383:0/",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        assert_int_equal(pc_cmap_parse(bad[i], &p, err, sizeof err), PC_EPARSE);
        assert_true(err[0] != '\0');
    }
}

/* Every slot's primary and backups are valid and distinct; returns the primary slots of server. */
static uint32_t check_roles(const pc_cluster_map_t *m, uint32_t server, uint32_t want_backups) {
    uint32_t mine = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        uint32_t b[PC_MAX_BACKUPS];
        const uint32_t n = pc_cmap_slot_backups(m, s, b), o = pc_cmap_slot_owner(m, s);
        assert_true(o < pc_cmap_nservers(m));
        assert_int_equal(n, want_backups);
        for (uint32_t j = 0; j < n; j++) {
            assert_true(b[j] != o && b[j] < pc_cmap_nservers(m));
            for (uint32_t i = 0; i < j; i++)
                assert_true(b[i] != b[j]);
        }
        mine += o == server;
    }
    return mine;
}

static void test_reshard_plans(void **state) {
    (void)state;
    pc_cluster_map_t *m, *t, *back;
    char err[128], text[512];
    assert_int_equal(pc_cmap_parse("version=4;servers=a:1,b:2;slots=0-8191:0/1,8192-16383:1/0", &m,
                                   err, sizeof err),
                     0);
    assert_int_equal(pc_cmap_add_server(m, "a:1", 5), PC_EEXIST);
    assert_int_equal(pc_cmap_add_server(m, "c:3", 4), PC_EINVAL); /* not a newer version */
    assert_int_equal(pc_cmap_add_server(m, "c:3", 5), 0);
    assert_int_equal(pc_cmap_nservers(m), 3);
    assert_false(pc_cmap_has_role(m, 2));
    assert_int_equal(pc_cmap_plan_add(m, 0, &t), PC_EINVAL); /* has a role already */
    assert_int_equal(pc_cmap_plan_add(m, 2, &t), 0);
    /* a third of each server's slots, its last ones, keeping the old primary as backup */
    assert_int_equal(check_roles(t, 2, 1), 2 * (8192 / 3));
    assert_int_equal(check_roles(t, 0, 1), 8192 - 8192 / 3);
    assert_int_equal(pc_cmap_slot_owner(t, 8191), 2);
    uint32_t b[PC_MAX_BACKUPS];
    assert_int_equal(pc_cmap_slot_backups(t, 8191, b), 1);
    assert_int_equal(b[0], 0);
    assert_int_equal(pc_cmap_slot_owner(t, 0), 0);
    assert_true(pc_cmap_slot_same(m, t, 0) && !pc_cmap_slot_same(m, t, 8191));
    pc_cmap_format(t, text, sizeof text);
    assert_true(strlen(text) < 200); /* a few ranges */
    /* a new backup (step 1) is marked; one kept keeps its mark */
    const uint32_t b12[] = {1, 2};
    assert_int_equal(pc_cmap_set_backups(m, 8191, b12, 2), 0);
    assert_false(pc_cmap_backup_syncing(m, 8191, 1));
    assert_true(pc_cmap_backup_syncing(m, 8191, 2));
    /* taking the target's roles slot by slot ends in the target; the old primary becomes a
     * backup catching up (it follows the new primary only from now: it was counted in sync, and
     * a promotion of it clean, while the new primary's pushes did not wait for it); a slot whose
     * primary stays keeps its marks */
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        assert_int_equal(pc_cmap_take_slot(m, t, s), 0);
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        assert_true(pc_cmap_slot_same(m, t, s));
    assert_true(pc_cmap_backup_syncing(m, 8191, 0));
    assert_false(pc_cmap_backup_syncing(m, 0, 1));
    /* removing it again: its slots to their first backup (the old primary) */
    assert_int_equal(pc_cmap_plan_remove(m, 2, &back), 0);
    assert_int_equal(check_roles(back, 2, 1), 0);
    assert_false(pc_cmap_has_role(back, 2));
    assert_int_equal(check_roles(back, 0, 1), 8192);
    assert_int_equal(pc_cmap_slot_owner(back, 8191), 0);
    assert_int_equal(pc_cmap_slot_backups(back, 8191, b), 1);
    assert_int_equal(b[0], 1);
    /* removing server 0 of the two left: no backups possible, server 1 takes everything */
    pc_cluster_map_t *one;
    assert_int_equal(pc_cmap_plan_remove(back, 0, &one), 0);
    assert_int_equal(check_roles(one, 1, 0), PC_NSLOTS);
    pc_cluster_map_t *none;
    assert_int_equal(pc_cmap_plan_remove(one, 1, &none), PC_EINVAL); /* the last one */
    /* a backup promoted by a remove counts as a backup no more: the next run's new backup is
     * the least loaded (server 3, promoted over 0-8191, was passed over for server 1, which then
     * backed up 12288 slots and server 3 none) */
    pc_cluster_map_t *four, *less;
    assert_int_equal(pc_cmap_parse("version=1;servers=a:1,b:2,c:3,d:4;slots=0-8191:0/3,"
                                   "8192-12287:2/0,12288-16383:1/2",
                                   &four, err, sizeof err),
                     0);
    assert_int_equal(pc_cmap_plan_remove(four, 0, &less), 0);
    assert_int_equal(pc_cmap_slot_owner(less, 0), 3);
    assert_true(pc_cmap_is_backup(less, 8192, 3));
    pc_cmap_destroy(four);
    pc_cmap_destroy(less);
    /* bad backups refused, nothing changed */
    const uint32_t self[] = {0}, twice[] = {1, 1}, far[] = {7};
    assert_int_equal(pc_cmap_set_backups(m, 0, self, 1), PC_EINVAL);
    assert_int_equal(pc_cmap_set_backups(m, 0, twice, 2), PC_EINVAL);
    assert_int_equal(pc_cmap_set_backups(m, 0, far, 1), PC_EINVAL);
    assert_true(pc_cmap_slot_same(m, t, 0));
    pc_cmap_destroy(m);
    pc_cmap_destroy(t);
    pc_cmap_destroy(back);
    pc_cmap_destroy(one);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slot_function), cmocka_unit_test(test_even_and_roundtrip),
        cmocka_unit_test(test_parse_errors),  cmocka_unit_test(test_assign),
        cmocka_unit_test(test_backups),       cmocka_unit_test(test_reshard_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
