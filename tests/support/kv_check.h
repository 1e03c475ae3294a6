/* kv_check.h: the coordinator store's contract (ps_coord.h) checked the same way on every store
 * (the in-process one, etcd, a server's Coordinator service): racing writers of which exactly
 * one wins, and compare-and-set on revisions. */
#ifndef KV_CHECK_H
#define KV_CHECK_H

#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_error.h"
#include "ps_coord.h"

#define KC_ABSENT UINT64_MAX /* a racer's `rev`: set-if-absent instead of set_if */

typedef struct kc_racer {
    ps_coord_store_t *st;
    const char *key;
    uint64_t rev;
    atomic_int *wins;
    int id;
    int rc; /* asserted by the main thread: cmocka's asserts belong to the test's thread */
} kc_racer_t;

static void *kc_race(void *arg) {
    kc_racer_t *r = arg;
    char v[16];
    snprintf(v, sizeof v, "r%d", r->id);
    r->rc = r->rev == KC_ABSENT ? r->st->set(r->st->ctx, r->key, v, strlen(v), true, 0)
                                : r->st->set_if(r->st->ctx, r->key, v, strlen(v), r->rev, 0);
    if (r->rc == 0)
        atomic_fetch_add(r->wins, 1);
    return NULL;
}

/* Six threads write key at once, each its own value (set_if at rev, or if absent: KC_ABSENT):
 * exactly one wins, the others are refused (PC_EEXIST) and change nothing. */
static inline void kc_race_one_wins(ps_coord_store_t *st, const char *key, uint64_t rev) {
    atomic_int wins = 0;
    pthread_t th[6];
    kc_racer_t rr[6];
    for (int i = 0; i < 6; i++) {
        rr[i] = (kc_racer_t){st, key, rev, &wins, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, kc_race, &rr[i]), 0);
    }
    int winner = -1;
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        if (rr[i].rc)
            assert_int_equal(rr[i].rc, PC_EEXIST); /* the losers: refused, nothing else */
        else
            winner = i;
    }
    assert_int_equal(atomic_load(&wins), 1);
    void *v = NULL;
    size_t len = 0;
    char want[16];
    snprintf(want, sizeof want, "r%d", winner);
    assert_int_equal(st->get(st->ctx, key, &v, &len), 0);
    assert_true(len == strlen(want) && memcmp(v, want, len) == 0);
    free(v);
}

/* Compare-and-set on key (absent at first): revision 0 writes only an absent key; a write at the
 * revision read wins once and moves the revision; a stale revision is refused and changes
 * nothing; one with a lease leaves the key with that lease; of writers that read one revision
 * exactly one wins. */
static inline void kc_cas_check(ps_coord_store_t *st, const char *key) {
    void *v = NULL;
    size_t len = 0;
    uint64_t r0 = 0, r1 = 0, r2 = 0;
    assert_int_equal(st->get_rev(st->ctx, key, &v, &len, &r0), PC_ENOTFOUND);
    assert_int_equal(st->set_if(st->ctx, key, "a", 1, 0, 0), 0);
    assert_int_equal(st->set_if(st->ctx, key, "b", 1, 0, 0), PC_EEXIST); /* there now */
    assert_int_equal(st->get_rev(st->ctx, key, &v, &len, &r1), 0);
    assert_true(len == 1 && !memcmp(v, "a", 1) && r1 > 0);
    free(v);
    assert_int_equal(st->set_if(st->ctx, key, "c", 1, r1, 0), 0);
    assert_int_equal(st->set_if(st->ctx, key, "d", 1, r1, 0), PC_EEXIST); /* stale */
    assert_int_equal(st->get_rev(st->ctx, key, &v, &len, &r2), 0);
    assert_true(len == 1 && !memcmp(v, "c", 1) && r2 != r1);
    free(v);
    assert_int_equal(st->set(st->ctx, key, "e", 1, false, 0), 0); /* a plain set moves it too */
    assert_int_equal(st->set_if(st->ctx, key, "f", 1, r2, 0), PC_EEXIST);
    assert_int_equal(st->get_rev(st->ctx, key, &v, &len, &r2), 0);
    free(v);
    /* with a lease (a fenced heartbeat): the key has one afterwards */
    assert_int_equal(st->set_if(st->ctx, key, "g", 1, r2, 60000), 0);
    pc_kv_entry_t *e = NULL;
    size_t n = 0;
    bool truncated = false;
    assert_int_equal(st->list(st->ctx, key, 10, &e, &n, &truncated), 0);
    assert_true(n >= 1 && strcmp(e[0].key, key) == 0 && e[0].lease_left_ms > 0 &&
                e[0].revision != r2);
    r2 = e[0].revision;
    pc_kv_entries_free(e, n);
    kc_race_one_wins(st, key, r2);
}

#endif
