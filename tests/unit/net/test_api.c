/* The API handlers without a transport: method names, codes and statuses, and requests that once
 * broke them (found by fuzz_api) or that sit at the edges (empty batches, empty names). */
#include "test_util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emberps.pb-c.h"
#include "pc_error.h"
#include "ps_api.h"
#include "ps_coord.h"

static ps_catalog_t *cat(void) {
    ps_catalog_t *c;
    assert_int_equal(ps_catalog_create(&c), 0);
    ps_table_config_t t;
    ps_table_config_defaults(&t);
    assert_int_equal(ps_table_config_parse(&t, "name=emb,dim=4", NULL, 0), 0);
    assert_int_equal(ps_catalog_add(c, &t), 0);
    return c;
}

static void test_methods_and_statuses(void **state) {
    (void)state;
    for (int m = 0; m < PS_API_NMETHODS; m++) {
        const char *p = ps_api_path((ps_api_method_t)m);
        assert_int_equal(ps_api_method(p, strlen(p)), m);
    }
    assert_int_equal(ps_api_method("/emberps.ParameterServer/", 25), -1);
    assert_int_equal(ps_api_method("/emberps.ParameterServer/Pul", 28), -1);
    assert_int_equal(ps_api_method("/other.Service/Pull", 19), -1);
    assert_int_equal(ps_api_method("/emberps.Coordinator/KvGet", 26), PS_API_KV_GET);
    assert_int_equal(ps_api_method("/emberps.Coordinator/Pull", 25), -1);
    assert_true(ps_api_is_admin(PS_API_CREATE_TABLE) && !ps_api_is_admin(PS_API_PULL));
    assert_int_equal(pc_err_to_grpc(PC_EDIM), PS_ST_INVALID_ARGUMENT);
    assert_int_equal(pc_err_to_grpc(PC_ENOTFOUND), PS_ST_NOT_FOUND);
    assert_int_equal(pc_err_to_grpc(PC_ETOOBIG), PS_ST_RESOURCE_EXHAUSTED);
    assert_int_equal(pc_err_to_grpc(PC_EWRONGSLOT), PS_ST_FAILED_PRECONDITION);
    assert_int_equal(pc_err_to_grpc(PC_EIO), PS_ST_INTERNAL);
}

static void test_edge_requests(void **state) {
    (void)state;
    ps_catalog_t *c = cat();
    ps_api_env_t env = {.cat = c, .max_keys = 10};
    ps_api_reply_t r;
    /* fuzz_api: Push of "emb" with no keys and an empty grads field (NULL data). */
    const uint8_t push_empty[] = {0x0a, 0x03, 'e', 'm', 'b'};
    ps_api_call(&env, PS_API_PUSH, push_empty, sizeof push_empty, true, &r);
    assert_int_equal(r.status, PS_ST_OK);
    Emberps__PushResponse *p = emberps__push_response__unpack(NULL, r.len, r.body);
    assert_non_null(p);
    assert_int_equal(p->applied, 0);
    emberps__push_response__free_unpacked(p, NULL);
    ps_api_reply_free(&r);
    /* An empty message: table name missing. */
    ps_api_call(&env, PS_API_PULL, NULL, 0, true, &r);
    assert_int_equal(r.status, PS_ST_INVALID_ARGUMENT);
    ps_api_reply_free(&r);
    /* Pull of no keys: an empty, valid reply. */
    ps_api_call(&env, PS_API_PULL, push_empty, sizeof push_empty, true, &r);
    assert_int_equal(r.status, PS_ST_OK);
    ps_api_reply_free(&r);
    /* Unknown method number, and Checkpoint without a checkpointer. */
    ps_api_call(&env, PS_API_NMETHODS, NULL, 0, true, &r);
    assert_int_equal(r.status, PS_ST_UNIMPLEMENTED);
    assert_int_equal(r.err, PC_EUNSUPPORTED);
    ps_api_call(&env, PS_API_CHECKPOINT, NULL, 0, true, &r);
    assert_int_equal(r.status, PS_ST_FAILED_PRECONDITION);
    assert_int_equal(r.err, PC_ESTATE);
    ps_api_call(&env, PS_API_GET_CLUSTER_MAP, NULL, 0, true, &r);
    assert_int_equal(r.status, PS_ST_UNAVAILABLE);
    assert_int_equal(r.err, PC_EUNAVAIL);
    ps_catalog_destroy(c);
}

/* A request whose decoding would take far more memory than its bytes (half a million unknown
 * varint fields of 2 bytes each: protobuf-c keeps each as a record and a copy, tens of bytes) is
 * refused as malformed; it used to be decoded whole (25 MB for a 1 MB request, gigabytes at the
 * largest message size). The same fields a few at a time decode. */
static void test_decode_budget(void **state) {
    (void)state;
    ps_catalog_t *c = cat();
    ps_api_env_t env = {.cat = c, .max_keys = 10};
    enum { FIELDS = 500000 };
    uint8_t *req = malloc(5 + 2 * FIELDS);
    memcpy(req, (const uint8_t[]){0x0a, 0x03, 'e', 'm', 'b'}, 5);
    for (size_t i = 0; i < FIELDS; i++) { /* field 15, varint 0 */
        req[5 + 2 * i] = 0x78;
        req[6 + 2 * i] = 0x00;
    }
    ps_api_reply_t r;
    ps_api_call(&env, PS_API_PULL, req, 5 + 2 * FIELDS, true, &r);
    assert_int_equal(r.err, PC_EPARSE);
    ps_api_reply_free(&r);
    ps_api_call(&env, PS_API_PULL, req, 5 + 2 * 1000, true, &r);
    assert_int_equal(r.status, PS_ST_OK);
    ps_api_reply_free(&r);
    free(req);
    ps_catalog_destroy(c);
}

/* CreateTable: a spec without name= is refused with a message that says so (no table "default"). */
static void test_create_needs_name(void **state) {
    (void)state;
    ps_catalog_t *c = cat();
    ps_api_env_t env = {.cat = c, .max_keys = 10};
    ps_api_reply_t r;
    uint8_t buf[256];
    Emberps__CreateTableRequest q = EMBERPS__CREATE_TABLE_REQUEST__INIT;
    q.spec = "dim=8";
    size_t n = protobuf_c_message_pack(&q.base, buf);
    ps_api_call(&env, PS_API_CREATE_TABLE, buf, n, true, &r);
    assert_int_equal(r.status, PS_ST_INVALID_ARGUMENT);
    assert_int_equal(r.err, PC_EINVAL);
    assert_string_equal(r.msg, "table spec 'dim=8': name= is required");
    ps_api_reply_free(&r);
    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(c, "default", &t), PC_ENOTFOUND);
    q.spec = "name=ads,dim=8";
    n = protobuf_c_message_pack(&q.base, buf);
    ps_api_call(&env, PS_API_CREATE_TABLE, buf, n, true, &r);
    assert_int_equal(r.status, PS_ST_OK);
    ps_api_reply_free(&r);
    assert_int_equal(ps_catalog_acquire(c, "ads", &t), 0);
    ps_catalog_release(c, t);
    ps_catalog_destroy(c);
}

static int kv_call(const ps_api_env_t *env, int m, const ProtobufCMessage *msg, ps_api_reply_t *r) {
    uint8_t buf[4096];
    const size_t n = protobuf_c_message_pack(msg, buf);
    ps_api_call(env, m, buf, n, true, r);
    return r->status;
}

/* The coordinator's KvSet/KvGet: set, replace, get, absent keys, limits, malformed requests, and
 * a server that is not the coordinator. */
static void test_coordinator_kv(void **state) {
    (void)state;
    ps_catalog_t *c = cat();
    ps_coord_store_t st;
    assert_int_equal(ps_coord_store_memory(&st), 0);
    ps_api_env_t env = {.cat = c, .max_keys = 10, .coord = &st};
    ps_api_reply_t r;
    Emberps__KvSetRequest set = EMBERPS__KV_SET_REQUEST__INIT;
    Emberps__KvGetRequest get = EMBERPS__KV_GET_REQUEST__INIT;
    set.key = "gen/0/1";
    set.value.data = (uint8_t *)"abc";
    set.value.len = 3;
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_OK);
    ps_api_reply_free(&r);
    set.value.data = (uint8_t *)"wxyz"; /* replaces */
    set.value.len = 4;
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_OK);
    ps_api_reply_free(&r);
    get.key = "gen/0/1";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_OK);
    Emberps__KvGetResponse *g = emberps__kv_get_response__unpack(NULL, r.len, r.body);
    assert_non_null(g);
    assert_true(g->value.len == 4 && memcmp(g->value.data, "wxyz", 4) == 0);
    emberps__kv_get_response__free_unpacked(g, NULL);
    ps_api_reply_free(&r);
    get.key = "gen/0/2";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_NOT_FOUND);
    /* if_absent: the first writer wins, a second is ALREADY_EXISTS and changes nothing. */
    set.key = "gen/1/members";
    set.value = (ProtobufCBinaryData){3, (uint8_t *)"0,1"};
    set.if_absent = true;
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_OK);
    ps_api_reply_free(&r);
    set.value = (ProtobufCBinaryData){1, (uint8_t *)"0"};
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_ALREADY_EXISTS);
    get.key = "gen/1/members";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_OK);
    g = emberps__kv_get_response__unpack(NULL, r.len, r.body);
    assert_true(g && g->value.len == 3 && memcmp(g->value.data, "0,1", 3) == 0);
    /* compare-and-set: KvGet's revision, KvSet's if_revision (a stale one changes nothing;
     * not with if_absent) */
    const uint64_t rev = g->revision;
    assert_true(rev > 0);
    emberps__kv_get_response__free_unpacked(g, NULL);
    ps_api_reply_free(&r);
    set.if_absent = false;
    set.if_revision = rev;
    set.value = (ProtobufCBinaryData){3, (uint8_t *)"0,2"};
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_OK);
    ps_api_reply_free(&r);
    set.value = (ProtobufCBinaryData){3, (uint8_t *)"0,3"};
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_ALREADY_EXISTS);
    set.lease_ms = 1000; /* a stale revision with a lease: refused alike */
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_ALREADY_EXISTS);
    set.lease_ms = 0;
    set.if_absent = true; /* a key at a revision is not absent */
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_INVALID_ARGUMENT);
    set.if_absent = false;
    set.if_revision = 0;
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_OK);
    g = emberps__kv_get_response__unpack(NULL, r.len, r.body);
    assert_true(g && g->value.len == 3 && memcmp(g->value.data, "0,2", 3) == 0);
    assert_true(g->revision > rev);
    emberps__kv_get_response__free_unpacked(g, NULL);
    ps_api_reply_free(&r);
    get.key = "";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_INVALID_ARGUMENT);
    set.key = "";
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_INVALID_ARGUMENT);
    /* Limits: an over-long key, an over-size value (straight to the store: a request of 1 MiB
     * would not fit this test's buffer). */
    char longkey[PS_COORD_KEY_MAX + 2];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    set.key = longkey;
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_RESOURCE_EXHAUSTED);
    assert_int_equal(st.set(st.ctx, "big", "x", (size_t)PS_COORD_VALUE_MAX + 1, false, 0),
                     PC_ETOOBIG);
    /* The servers' keys need the admin token (a worker's plain one rewrote cluster maps and
     * leases); a job's keys, and reads, do not. */
    uint8_t buf[512];
    set.key = "cluster/map/00000000000000000002";
    set.value = (ProtobufCBinaryData){3, (uint8_t *)"map"};
    size_t n = protobuf_c_message_pack(&set.base, buf);
    ps_api_call(&env, PS_API_KV_SET, buf, n, false, &r);
    assert_int_equal(r.status, PS_ST_UNAUTHENTICATED);
    assert_non_null(strstr(r.msg, "need the admin token"));
    ps_api_reply_free(&r);
    get.key = "cluster/map/00000000000000000002";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_NOT_FOUND); /* unwritten */
    set.key = "emberps/run/0/live/0";
    n = protobuf_c_message_pack(&set.base, buf);
    ps_api_call(&env, PS_API_KV_SET, buf, n, false, &r);
    assert_int_equal(r.status, PS_ST_OK);
    ps_api_reply_free(&r);
    set.key = "cluster/alive/x";
    assert_int_equal(kv_call(&env, PS_API_KV_SET, &set.base, &r), PS_ST_OK); /* admin */
    ps_api_reply_free(&r);
    /* Malformed bytes; a server that is not the coordinator. */
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    ps_api_call(&env, PS_API_KV_GET, junk, sizeof junk, true, &r);
    assert_int_equal(r.status, PS_ST_INVALID_ARGUMENT);
    env.coord = NULL;
    get.key = "gen/0/1";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_FAILED_PRECONDITION);
    st.destroy(st.ctx);
    ps_catalog_destroy(c);
}

static Emberps__KvListResponse *kv_list(const ps_api_env_t *env, const char *prefix,
                                        uint32_t limit) {
    Emberps__KvListRequest q = EMBERPS__KV_LIST_REQUEST__INIT;
    q.prefix = (char *)prefix;
    q.limit = limit;
    ps_api_reply_t r;
    assert_int_equal(kv_call(env, PS_API_KV_LIST, &q.base, &r), PS_ST_OK);
    Emberps__KvListResponse *l = emberps__kv_list_response__unpack(NULL, r.len, r.body);
    assert_non_null(l);
    ps_api_reply_free(&r);
    return l;
}

static int kv_set_lease(const ps_api_env_t *env, const char *key, uint32_t lease_ms,
                        bool if_absent) {
    Emberps__KvSetRequest q = EMBERPS__KV_SET_REQUEST__INIT;
    q.key = (char *)key;
    q.value = (ProtobufCBinaryData){2, (uint8_t *)"hb"};
    q.lease_ms = lease_ms;
    q.if_absent = if_absent;
    ps_api_reply_t r;
    int st = kv_call(env, PS_API_KV_SET, &q.base, &r);
    ps_api_reply_free(&r);
    return st;
}

/* Membership leases and KvList: a leased key reads as absent once its lease ends (get, list,
 * if_absent), setting it again renews it, listing is by prefix, sorted and limited, and expired
 * keys do not count against the store's limits. */
static void test_coordinator_leases(void **state) {
    (void)state;
    ps_coord_store_t st;
    assert_int_equal(ps_coord_store_memory(&st), 0);
    ps_api_env_t env = {.max_keys = 10, .coord = &st};
    assert_int_equal(kv_set_lease(&env, "w/live/1", 60000, false), PS_ST_OK);
    assert_int_equal(kv_set_lease(&env, "w/live/0", 150, false), PS_ST_OK);
    assert_int_equal(kv_set_lease(&env, "w/g/0", 0, false), PS_ST_OK);
    assert_int_equal(kv_set_lease(&env, "w/live/0", 150, true), PS_ST_ALREADY_EXISTS);
    Emberps__KvListResponse *l = kv_list(&env, "w/live/", 0);
    assert_int_equal(l->n_entries, 2);
    assert_string_equal(l->entries[0]->key, "w/live/0");
    assert_string_equal(l->entries[1]->key, "w/live/1");
    assert_true(l->entries[0]->lease_left_ms > 0 && l->entries[0]->lease_left_ms <= 150);
    assert_true(l->entries[1]->lease_left_ms > 150 && l->entries[1]->lease_left_ms <= 60000);
    assert_true(l->entries[0]->value.len == 2 && !l->truncated);
    emberps__kv_list_response__free_unpacked(l, NULL);
    /* a reply limit cuts a listing short: what fits, then truncated (the message was refused) */
    env.max_reply = 60;
    l = kv_list(&env, "w/", 0);
    assert_true(l->truncated && l->n_entries >= 1 && l->n_entries < 3);
    assert_true(emberps__kv_list_response__get_packed_size(l) <= 60);
    emberps__kv_list_response__free_unpacked(l, NULL);
    env.max_reply = 0;
    /* "w/live/1" renewed every 50 ms with a 300 ms lease outlives "w/live/0" (and its own
     * first lease). */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(kv_set_lease(&env, "w/live/1", 300, false), PS_ST_OK);
        usleep(50000);
    }
    Emberps__KvGetRequest get = EMBERPS__KV_GET_REQUEST__INIT;
    ps_api_reply_t r;
    get.key = "w/live/0";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_NOT_FOUND);
    get.key = "w/live/1";
    assert_int_equal(kv_call(&env, PS_API_KV_GET, &get.base, &r), PS_ST_OK);
    ps_api_reply_free(&r);
    l = kv_list(&env, "w/", 0);
    assert_int_equal(l->n_entries, 2); /* w/g/0 (no lease: 0) and w/live/1 */
    assert_string_equal(l->entries[0]->key, "w/g/0");
    assert_int_equal(l->entries[0]->lease_left_ms, 0);
    assert_string_equal(l->entries[1]->key, "w/live/1");
    emberps__kv_list_response__free_unpacked(l, NULL);
    assert_int_equal(kv_set_lease(&env, "w/live/0", 150, true), PS_ST_OK); /* expired: absent */
    /* Limit: the first keys in order, truncated. */
    char k[32];
    for (int i = 4; i >= 0; i--) {
        snprintf(k, sizeof k, "lim/%d", i);
        assert_int_equal(kv_set_lease(&env, k, 0, false), PS_ST_OK);
    }
    l = kv_list(&env, "lim/", 3);
    assert_true(l->n_entries == 3 && l->truncated);
    assert_string_equal(l->entries[0]->key, "lim/0");
    assert_string_equal(l->entries[2]->key, "lim/2");
    emberps__kv_list_response__free_unpacked(l, NULL);
    /* Expired keys sharing hash chains with live ones: reading or setting the expired key never
     * touches its neighbour (2000 of each: many chains hold both). */
    enum { NB = 2000 };
    char k2[32], want[32];
    for (int i = 0; i < NB; i++) {
        snprintf(k, sizeof k, "a/%d", i);
        assert_int_equal(st.set(st.ctx, k, "a", 1, false, 100), 0);
    }
    for (int i = 0; i < NB; i++) {
        snprintf(k2, sizeof k2, "b/%d", i);
        assert_int_equal(st.set(st.ctx, k2, k2, strlen(k2), false, 0), 0);
    }
    usleep(200000);
    for (int i = 0; i < NB; i++) {
        void *val;
        size_t vl;
        snprintf(k, sizeof k, "a/%d", i);
        assert_int_equal(st.get(st.ctx, k, &val, &vl), PC_ENOTFOUND);
        assert_int_equal(st.set(st.ctx, k, "A", 1, true, 0), 0);
    }
    for (int i = 0; i < NB; i++) {
        void *val;
        size_t vl;
        snprintf(k2, sizeof k2, "b/%d", i);
        assert_int_equal(st.get(st.ctx, k2, &val, &vl), 0);
        snprintf(want, sizeof want, "b/%d", i);
        assert_true(vl == strlen(want) && memcmp(val, want, vl) == 0);
        free(val);
        snprintf(k, sizeof k, "a/%d", i);
        assert_int_equal(st.get(st.ctx, k, &val, &vl), 0);
        assert_true(vl == 1 && memcmp(val, "A", 1) == 0);
        free(val);
    }
    /* A listing stops at PS_COORD_LIST_BYTES of values: four 1 MiB values of five. */
    void *big = calloc(1, PS_COORD_VALUE_MAX);
    assert_non_null(big);
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "big/%d", i);
        assert_int_equal(st.set(st.ctx, k, big, PS_COORD_VALUE_MAX, false, 0), 0);
    }
    free(big);
    pc_kv_entry_t *ents;
    size_t ne;
    bool trunc;
    assert_int_equal(st.list(st.ctx, "big/", 100, &ents, &ne, &trunc), 0);
    assert_true(ne == PS_COORD_LIST_BYTES / PS_COORD_VALUE_MAX && trunc);
    assert_string_equal(ents[0].key, "big/0");
    pc_kv_entries_free(ents, ne);
    /* A store full of leased keys refuses more until their leases end. The short leases set
     * above become permanent first: one ending between the fill and the check below would make
     * room (a flake of about 1 run in 15 on a loaded machine). */
    assert_int_equal(st.set(st.ctx, "w/live/0", "", 0, false, 0), 0);
    assert_int_equal(st.set(st.ctx, "w/live/1", "", 0, false, 0), 0);
    size_t n = 0;
    for (; n < PS_COORD_KEYS_MAX; n++) {
        snprintf(k, sizeof k, "fill/%zu", n);
        if (st.set(st.ctx, k, "", 0, false, 1500))
            break;
    }
    assert_true(n > PS_COORD_KEYS_MAX - 2 * NB - 16); /* the keys set above hold places */
    assert_int_equal(st.set(st.ctx, "one/more", "", 0, false, 0), PC_EFULL);
    usleep(1600000);
    int rc = PC_EFULL; /* the leases have ended: bounded retries for a slow machine */
    for (int i = 0; i < 100 && rc == PC_EFULL; i++)
        if ((rc = st.set(st.ctx, "one/more", "", 0, false, 0)) == PC_EFULL)
            usleep(20000);
    assert_int_equal(rc, 0);
    l = kv_list(&env, "fill/", 0);
    assert_int_equal(l->n_entries, 0);
    emberps__kv_list_response__free_unpacked(l, NULL);
    /* Malformed bytes; a server that is not the coordinator. */
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    ps_api_call(&env, PS_API_KV_LIST, junk, sizeof junk, true, &r);
    assert_int_equal(r.status, PS_ST_INVALID_ARGUMENT);
    env.coord = NULL;
    Emberps__KvListRequest q = EMBERPS__KV_LIST_REQUEST__INIT;
    assert_int_equal(kv_call(&env, PS_API_KV_LIST, &q.base, &r), PS_ST_FAILED_PRECONDITION);
    st.destroy(st.ctx);
}

static int restore_hook(void *ctx, uint64_t id, uint64_t *restored) {
    (void)ctx;
    if (id == 7)
        return PC_EUNSUPPORTED; /* a server with a cold tier */
    if (id == 9)
        return PC_ENOTFOUND;
    *restored = id ? id : 3;
    return 0;
}

/* Restore: without checkpoints, refused by the server (cold tier), unknown ids, malformed
 * requests, and the id restored (0: the newest). */
static void test_restore(void **state) {
    (void)state;
    ps_api_env_t env = {.max_keys = 10};
    Emberps__RestoreRequest q = EMBERPS__RESTORE_REQUEST__INIT;
    ps_api_reply_t r;
    assert_true(ps_api_is_admin(PS_API_RESTORE));
    assert_int_equal(kv_call(&env, PS_API_RESTORE, &q.base, &r), PS_ST_FAILED_PRECONDITION);
    env.restore = restore_hook;
    q.id = 7;
    assert_int_equal(kv_call(&env, PS_API_RESTORE, &q.base, &r), PS_ST_FAILED_PRECONDITION);
    assert_non_null(strstr(r.msg, "cold tier"));
    assert_int_equal(r.err, PC_ESTATE);
    q.id = 9;
    assert_int_equal(kv_call(&env, PS_API_RESTORE, &q.base, &r), PS_ST_NOT_FOUND);
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    ps_api_call(&env, PS_API_RESTORE, junk, sizeof junk, true, &r);
    assert_int_equal(r.status, PS_ST_INVALID_ARGUMENT);
    q.id = 0;
    assert_int_equal(kv_call(&env, PS_API_RESTORE, &q.base, &r), PS_ST_OK);
    Emberps__RestoreResponse *p = emberps__restore_response__unpack(NULL, r.len, r.body);
    assert_non_null(p);
    assert_int_equal(p->id, 3);
    emberps__restore_response__free_unpacked(p, NULL);
    ps_api_reply_free(&r);
}

static int checkpoint_hook(void *ctx, ps_ckpt_result_t *res) {
    (void)ctx;
    *res = (ps_ckpt_result_t){.id = 5, .rows = 10, .bytes = 100};
    return 0;
}

/* Checkpoint: the reply names the checkpoint directory as an absolute path, for a reader in
 * another working directory (a serving replica), whatever form the server was given. */
static void test_checkpoint_dir(void **state) {
    (void)state;
    char rel[] = "api-ckpt-XXXXXX", want[PATH_MAX], given[64];
    assert_non_null(mkdtemp(rel));
    assert_non_null(realpath(rel, want));
    snprintf(given, sizeof given, "./%s/", rel);
    ps_api_env_t env = {.max_keys = 10, .ckpt_dir = given, .checkpoint = checkpoint_hook};
    ps_api_reply_t r;
    ps_api_call(&env, PS_API_CHECKPOINT, NULL, 0, true, &r);
    assert_int_equal(r.status, PS_ST_OK);
    Emberps__CheckpointResponse *p = emberps__checkpoint_response__unpack(NULL, r.len, r.body);
    assert_non_null(p);
    assert_int_equal(p->id, 5);
    assert_string_equal(p->dir, want);
    assert_true(p->dir[0] == '/');
    emberps__checkpoint_response__free_unpacked(p, NULL);
    ps_api_reply_free(&r);
    rmdir(rel);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_methods_and_statuses),
        cmocka_unit_test(test_edge_requests),
        cmocka_unit_test(test_decode_budget),
        cmocka_unit_test(test_create_needs_name),
        cmocka_unit_test(test_coordinator_kv),
        cmocka_unit_test(test_coordinator_leases),
        cmocka_unit_test(test_restore),
        cmocka_unit_test(test_checkpoint_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
