/* ps_api.c: the API handlers (see ps_api.h). One function per method: unpack (protobuf-c, NULL
 * on malformed input), check, run, pack. */
#include "ps_api.h"

#include "emberps.pb-c.h"
#include "ps_coord.h"
#include "pc_error.h"
#include "pc_time.h"
#include "pc_wire.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "/emberps.ParameterServer/"
#define COORD  "/emberps.Coordinator/"

static const char *const k_paths[PS_API_NMETHODS] = {
    PREFIX "Lookup",          PREFIX "Pull",          PREFIX "Push",       PREFIX "CreateTable",
    PREFIX "DropTable",       PREFIX "ListTables",    PREFIX "TableStats", PREFIX "Checkpoint",
    PREFIX "ListCheckpoints", PREFIX "GetClusterMap", PREFIX "Health",     PREFIX "Restore",
    PREFIX "ResetTable",      COORD "KvSet",          COORD "KvGet",       COORD "KvList"};

int ps_api_method(const char *path, size_t len) {
    for (int m = 0; m < PS_API_NMETHODS; m++)
        if (strlen(k_paths[m]) == len && memcmp(path, k_paths[m], len) == 0)
            return m;
    return -1;
}

const char *ps_api_path(ps_api_method_t m) {
    return m < PS_API_NMETHODS ? k_paths[m] : NULL;
}

bool ps_api_is_admin(int m) {
    return m == PS_API_CREATE_TABLE || m == PS_API_DROP_TABLE || m == PS_API_CHECKPOINT ||
           m == PS_API_RESTORE || m == PS_API_RESET_TABLE;
}

void ps_api_fail(ps_api_reply_t *r, int err, const char *fmt, ...) {
    r->err = err;
    r->status = pc_err_to_grpc(err);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
}

static void fail_pc(ps_api_reply_t *r, int e, const char *what) {
    ps_api_fail(r, e, "%s: %s", what ? what : "", pc_strerror(e));
}

static void *budget_alloc(void *data, size_t size) {
    ps_api_budget_t *b = data;
    const size_t cost = size + 16; /* malloc's own header */
    if (cost > b->left)
        return NULL;
    b->left -= cost;
    return malloc(size);
}

static void budget_free(void *data, void *p) {
    (void)data; /* not given back: an unpack frees only when it fails */
    free(p);
}

ProtobufCAllocator *ps_api_budget(ps_api_budget_t *b, size_t len) {
    b->a = (ProtobufCAllocator){budget_alloc, budget_free, b};
    b->left = (len > SIZE_MAX / PS_API_DECODE_FACTOR - (1u << 20) ? SIZE_MAX
                                                                  : PS_API_DECODE_FACTOR * len) +
              (1u << 20);
    return &b->a;
}

void ps_api_reply_pack(ps_api_reply_t *r, const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    r->body = malloc(len ? len : 1);
    if (!r->body) {
        ps_api_fail(r, PC_ENOMEM, "out of memory");
        return;
    }
    r->len = protobuf_c_message_pack(m, r->body);
    r->status = PS_ST_OK;
}

/* The table named in a request, acquired; NULL with r failed. */
static ps_table_t *table_of(const ps_api_env_t *env, const char *name, ps_api_reply_t *r) {
    ps_table_t *t;
    if (!name || !name[0]) {
        ps_api_fail(r, PC_EINVAL, "table name missing");
        return NULL;
    }
    int rc = ps_catalog_acquire(env->cat, name, &t);
    if (rc) {
        ps_api_fail(r, rc, "no table %s", name);
        return NULL;
    }
    return t;
}

/* Common checks of a keyed batch: count and ownership. */
static bool keys_ok(const ps_api_env_t *env, const uint64_t *keys, size_t n, ps_api_reply_t *r) {
    if (n > env->max_keys) {
        ps_api_fail(r, PC_ETOOBIG, "too many keys in one request");
        return false;
    }
    if (env->owns && !env->owns(env->ctx, keys, n)) {
        uint64_t v = 0;
        char *text = env->map_text ? env->map_text(env->ctx, &v) : NULL;
        free(text);
        ps_api_fail(r, PC_EWRONGSLOT,
                    "wrong slot: a key belongs to another server (map version %llu)",
                    (unsigned long long)v);
        return false;
    }
    return true;
}

static void do_rows(const ps_api_env_t *env, int m, const uint8_t *req, size_t len,
                    ps_api_reply_t *r) {
    const char *name;
    size_t n;
    const uint64_t *keys;
    Emberps__LookupRequest *lq = NULL;
    Emberps__PullRequest *pq = NULL;
    if (m == PS_API_LOOKUP) {
        if (!(lq = emberps__lookup_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len,
                                                   req))) {
            ps_api_fail(r, PC_EPARSE, "malformed LookupRequest");
            return;
        }
        name = lq->table, n = lq->n_keys, keys = lq->keys;
    } else {
        if (!(pq = emberps__pull_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len,
                                                 req))) {
            ps_api_fail(r, PC_EPARSE, "malformed PullRequest");
            return;
        }
        name = pq->table, n = pq->n_keys, keys = pq->keys;
    }
    ps_table_t *t = keys_ok(env, keys, n, r) ? table_of(env, name, r) : NULL;
    char msg[sizeof r->msg];
    if (t && pc_wire_reply_check(m == PS_API_LOOKUP ? PC_OP_LOOKUP : PC_OP_PULL, n, ps_table_dim(t),
                                 env->max_reply, msg, sizeof msg)) {
        ps_api_fail(r, PC_ETOOBIG, "%s", msg); /* before any row is read or allocated */
        ps_catalog_release(env->cat, t);
        t = NULL;
    }
    if (t) {
        const uint32_t dim = ps_table_dim(t);
        float *rows = malloc(n * dim * sizeof(float) + 1);
        uint8_t *found = m == PS_API_LOOKUP ? malloc(n + 1) : NULL;
        int rc = !rows || (m == PS_API_LOOKUP && !found) ? PC_ENOMEM
                 : m == PS_API_LOOKUP ? ps_table_lookup(t, keys, n, rows, n * dim, found)
                                      : ps_table_pull(t, keys, n, rows, n * dim);
        if (rc) {
            fail_pc(r, rc, name);
        } else if (m == PS_API_LOOKUP) {
            Emberps__LookupResponse resp = EMBERPS__LOOKUP_RESPONSE__INIT;
            resp.dim = dim;
            resp.rows = (ProtobufCBinaryData){n * dim * sizeof(float), (uint8_t *)rows};
            resp.found = (ProtobufCBinaryData){n, found};
            ps_api_reply_pack(r, &resp.base);
        } else {
            Emberps__PullResponse resp = EMBERPS__PULL_RESPONSE__INIT;
            resp.dim = dim;
            resp.rows = (ProtobufCBinaryData){n * dim * sizeof(float), (uint8_t *)rows};
            ps_api_reply_pack(r, &resp.base);
        }
        free(rows);
        free(found);
        ps_catalog_release(env->cat, t);
    }
    if (lq)
        emberps__lookup_request__free_unpacked(lq, NULL);
    if (pq)
        emberps__pull_request__free_unpacked(pq, NULL);
}

static void do_push(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__PushRequest *q =
        emberps__push_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed PushRequest");
        return;
    }
    ps_table_t *t = keys_ok(env, q->keys, q->n_keys, r) ? table_of(env, q->table, r) : NULL;
    if (t) {
        const size_t nf = q->n_keys * ps_table_dim(t);
        if (q->grads.len != nf * sizeof(float)) {
            ps_api_fail(r, PC_EDIM, "grads: %zu bytes, want %zu keys x dim %u x 4", q->grads.len,
                        q->n_keys, ps_table_dim(t));
        } else {
            /* bytes arrive unaligned inside the message copy: align for the table */
            float *g = malloc(q->grads.len + 1);
            ps_push_result_t res = {0, 0, 0};
            char why[240] = "";
            int rc = g ? 0 : PC_ENOMEM;
            if (g) {
                if (q->grads.len) /* data is NULL for an empty field */
                    memcpy(g, q->grads.data, q->grads.len);
                rc = env->push
                         ? env->push(env->ctx, t, q->keys, q->n_keys, g, nf, &res, why, sizeof why)
                         : ps_table_push(t, q->keys, q->n_keys, g, nf, &res);
            }
            free(g);
            if (rc && why[0]) {
                ps_api_fail(r, rc, "%s: %s", q->table, why);
            } else if (rc) {
                fail_pc(r, rc, q->table);
            } else {
                Emberps__PushResponse resp = EMBERPS__PUSH_RESPONSE__INIT;
                resp.applied = res.applied;
                resp.skipped_nonfinite = res.skipped_nonfinite;
                resp.dropped_unadmitted = res.dropped_unadmitted;
                ps_api_reply_pack(r, &resp.base);
            }
        }
        ps_catalog_release(env->cat, t);
    }
    emberps__push_request__free_unpacked(q, NULL);
}

static void do_create(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__CreateTableRequest *q =
        emberps__create_table_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed CreateTableRequest");
        return;
    }
    ps_table_config_t c;
    char err[256];
    int rc = ps_catalog_spec_parse(q->spec, &c, err, sizeof err);
    if (rc) {
        ps_api_fail(r, PC_EINVAL, "%s", err);
    } else if ((rc = ps_catalog_add(env->cat, &c)) == PC_ETOOBIG) {
        ps_api_fail(r, rc, "%s: this server holds %d tables, the most it can", c.name,
                    PS_CATALOG_TABLES_MAX);
    } else if (rc) {
        fail_pc(r, rc, c.name);
    } else {
        char config[2048];
        ps_table_config_format(&c, config, sizeof config);
        Emberps__CreateTableResponse resp = EMBERPS__CREATE_TABLE_RESPONSE__INIT;
        resp.config = config;
        ps_api_reply_pack(r, &resp.base);
    }
    emberps__create_table_request__free_unpacked(q, NULL);
}

static void do_drop(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__DropTableRequest *q =
        emberps__drop_table_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed DropTableRequest");
        return;
    }
    int rc = ps_catalog_drop(env->cat, q->table);
    if (rc) {
        fail_pc(r, rc, q->table);
    } else {
        Emberps__DropTableResponse resp = EMBERPS__DROP_TABLE_RESPONSE__INIT;
        ps_api_reply_pack(r, &resp.base);
    }
    emberps__drop_table_request__free_unpacked(q, NULL);
}

static void do_reset(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__ResetTableRequest *q =
        emberps__reset_table_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed ResetTableRequest");
        return;
    }
    ps_claim_result_t res;
    char err[512];
    int rc = ps_catalog_claim(env->cat, q->table, "", PS_CLAIM_FRESH, 0, &res, err, sizeof err);
    if (rc) {
        ps_api_fail(r, rc, "%s", err);
    } else {
        Emberps__ResetTableResponse resp = EMBERPS__RESET_TABLE_RESPONSE__INIT;
        resp.previous_owner = res.previous;
        resp.rows = res.rows;
        ps_api_reply_pack(r, &resp.base);
    }
    emberps__reset_table_request__free_unpacked(q, NULL);
}

/* Every table's name, sorted (all of them: a fixed 4096 once answered an arbitrary part of a
 * larger catalog). */
static void do_list(const ps_api_env_t *env, ps_api_reply_t *r) {
    char(*names)[PS_TABLE_NAME_MAX] = NULL;
    char **ptrs = NULL;
    size_t cap = 256, n = 0;
    for (;;) { /* until the room holds them all (tables may come meanwhile) */
        free(names);
        names = malloc(cap * sizeof *names);
        if (!names)
            break;
        if ((n = ps_catalog_list(env->cat, names, cap)) <= cap)
            break;
        cap = n + 64;
    }
    if (names)
        ptrs = malloc((n ? n : 1) * sizeof *ptrs);
    if (!names || !ptrs) {
        free(names);
        free(ptrs);
        ps_api_fail(r, PC_ENOMEM, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++)
        ptrs[i] = names[i];
    Emberps__ListTablesResponse resp = EMBERPS__LIST_TABLES_RESPONSE__INIT;
    resp.n_tables = n;
    resp.tables = ptrs;
    ps_api_reply_pack(r, &resp.base);
    free(names);
    free(ptrs);
}

static void do_stats(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__TableStatsRequest *q =
        emberps__table_stats_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed TableStatsRequest");
        return;
    }
    ps_table_t *t = table_of(env, q->table, r);
    if (t) {
        ps_table_stats_t s;
        ps_table_stats(t, &s);
        char config[2048];
        ps_table_config_format(ps_table_config(t), config, sizeof config);
        Emberps__TableStatsResponse resp = EMBERPS__TABLE_STATS_RESPONSE__INIT;
        resp.config = config;
        resp.rows = s.rows;
        resp.bytes_weights = s.bytes_weights;
        resp.bytes_state = s.bytes_state;
        resp.bytes_overhead = s.bytes_keys + s.bytes_meta + s.bytes_index;
        resp.pulled = s.pulled;
        resp.pushed = s.pushed;
        resp.looked_up = s.looked_up;
        resp.evicted = s.evicted_capacity + s.evicted_ttl;
        resp.nonfinite_skipped = s.nonfinite_skipped;
        resp.admit_pending = s.admit_pending;
        resp.spilled = s.spilled;
        resp.cold_reads = s.cold_reads;
        resp.version = ps_table_version(t);
        char owner[PS_OWNER_MAX];
        ps_table_owner(t, owner, sizeof owner);
        resp.owner = owner;
        ps_api_reply_pack(r, &resp.base);
        ps_catalog_release(env->cat, t);
    }
    emberps__table_stats_request__free_unpacked(q, NULL);
}

static void do_checkpoint(const ps_api_env_t *env, ps_api_reply_t *r) {
    if (!env->checkpoint) {
        ps_api_fail(r, PC_ESTATE, "no checkpoint directory configured");
        return;
    }
    ps_ckpt_result_t res;
    int rc = env->checkpoint(env->ctx, &res);
    if (rc) {
        fail_pc(r, rc, "checkpoint");
        return;
    }
    Emberps__CheckpointResponse resp = EMBERPS__CHECKPOINT_RESPONSE__INIT;
    resp.id = res.id;
    resp.incremental = res.incremental;
    resp.rows = res.rows;
    resp.bytes = res.bytes;
    resp.seconds = res.seconds;
    char dir[PATH_MAX]; /* absolute, for a reader elsewhere (a serving replica restoring it) */
    if (env->ckpt_dir)
        resp.dir = realpath(env->ckpt_dir, dir) ? dir : (char *)env->ckpt_dir;
    ps_api_reply_pack(r, &resp.base);
}

static void do_restore(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__RestoreRequest *q =
        emberps__restore_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed RestoreRequest");
        return;
    }
    const uint64_t id = q->id;
    emberps__restore_request__free_unpacked(q, NULL);
    if (!env->restore) {
        ps_api_fail(r, PC_ESTATE, "no checkpoint directory configured");
        return;
    }
    const uint64_t t0 = pc_time_mono_ns();
    uint64_t got = 0;
    int rc = env->restore(env->ctx, id, &got);
    if (rc == PC_EUNSUPPORTED) {
        ps_api_fail(r, PC_ESTATE,
                    "this server has a cold tier: restore it at start (--restore-id)");
        return;
    }
    if (rc) {
        fail_pc(r, rc, "restore");
        return;
    }
    Emberps__RestoreResponse resp = EMBERPS__RESTORE_RESPONSE__INIT;
    resp.id = got;
    resp.seconds = pc_time_sec_since(t0);
    ps_api_reply_pack(r, &resp.base);
}

static void do_list_ckpts(const ps_api_env_t *env, ps_api_reply_t *r) {
    enum { MAXC = 1024 };
    Emberps__ListCheckpointsResponse resp = EMBERPS__LIST_CHECKPOINTS_RESPONSE__INIT;
    ps_ckpt_entry_t *e = NULL;
    Emberps__CheckpointInfo *info = NULL, **ptrs = NULL;
    size_t n = 0;
    if (env->ckpt_dir) {
        e = malloc(MAXC * sizeof *e);
        info = malloc(MAXC * sizeof *info);
        ptrs = malloc(MAXC * sizeof *ptrs);
        int rc = e && info && ptrs ? ps_ckpt_list(env->ckpt_dir, e, MAXC, &n) : PC_ENOMEM;
        if (rc == PC_ENOTFOUND)
            n = 0;
        else if (rc) {
            fail_pc(r, rc, "list checkpoints");
            n = SIZE_MAX;
        }
    }
    if (n != SIZE_MAX) {
        n = n < MAXC ? n : MAXC;
        for (size_t i = 0; i < n; i++) {
            Emberps__CheckpointInfo ci = EMBERPS__CHECKPOINT_INFO__INIT;
            ci.id = e[i].id;
            ci.parent = e[i].parent;
            ci.incremental = e[i].incremental;
            ci.rows = e[i].rows;
            ci.bytes = e[i].bytes;
            ci.created_unix_ns = e[i].created_unix_ns;
            info[i] = ci;
            ptrs[i] = &info[i];
        }
        resp.n_checkpoints = n;
        resp.checkpoints = ptrs;
        ps_api_reply_pack(r, &resp.base);
    }
    free(e);
    free(info);
    free(ptrs);
}

static void do_map(const ps_api_env_t *env, ps_api_reply_t *r) {
    uint64_t v = 0;
    char *text = env->map_text ? env->map_text(env->ctx, &v) : NULL;
    if (!text) {
        ps_api_fail(r, PC_EUNAVAIL, "no cluster map");
        return;
    }
    Emberps__GetClusterMapResponse resp = EMBERPS__GET_CLUSTER_MAP_RESPONSE__INIT;
    resp.map = text;
    resp.version = v;
    resp.self = env->shard;
    ps_api_reply_pack(r, &resp.base);
    free(text);
}

static void do_health(const ps_api_env_t *env, ps_api_reply_t *r) {
    char names[1][PS_TABLE_NAME_MAX];
    Emberps__HealthResponse resp = EMBERPS__HEALTH_RESPONSE__INIT;
    resp.status = "serving";
    resp.shard = env->shard;
    resp.uptime_s = (pc_time_mono_ns() - env->start_ns) / 1000000000ull;
    resp.tables = ps_catalog_list(env->cat, names, 0);
    ps_api_reply_pack(r, &resp.base);
}

static void do_kv_set(const ps_api_env_t *env, const uint8_t *req, size_t len, bool admin,
                      ps_api_reply_t *r) {
    if (!env->coord) {
        ps_api_fail(r, PC_ESTATE, "not the coordinator");
        return;
    }
    Emberps__KvSetRequest *q =
        emberps__kv_set_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed KvSetRequest");
        return;
    }
    /* the servers' keys: a worker's (plain) token rewrote cluster maps and leases */
    if (!admin && !strncmp(q->key, PS_COORD_CLUSTER_PREFIX, strlen(PS_COORD_CLUSTER_PREFIX))) {
        ps_api_fail(r, PC_EAUTH,
                    "%.200s: keys under " PS_COORD_CLUSTER_PREFIX " need the admin token", q->key);
        emberps__kv_set_request__free_unpacked(q, NULL);
        return;
    }
    int rc;
    if (!q->if_revision)
        rc = env->coord->set(env->coord->ctx, q->key, q->value.data, q->value.len, q->if_absent,
                             q->lease_ms);
    else if (q->if_absent)
        rc = PC_EINVAL; /* (a key at a revision is not absent) */
    else
        rc = env->coord->set_if(env->coord->ctx, q->key, q->value.data, q->value.len,
                                q->if_revision, q->lease_ms);
    if (rc) {
        fail_pc(r, rc, q->key);
    } else {
        Emberps__KvSetResponse resp = EMBERPS__KV_SET_RESPONSE__INIT;
        ps_api_reply_pack(r, &resp.base);
    }
    emberps__kv_set_request__free_unpacked(q, NULL);
}

static void do_kv_get(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    if (!env->coord) {
        ps_api_fail(r, PC_ESTATE, "not the coordinator");
        return;
    }
    Emberps__KvGetRequest *q =
        emberps__kv_get_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed KvGetRequest");
        return;
    }
    void *v = NULL;
    size_t vl = 0;
    uint64_t rev = 0;
    int rc = q->key[0] ? env->coord->get_rev(env->coord->ctx, q->key, &v, &vl, &rev) : PC_EINVAL;
    if (rc) {
        fail_pc(r, rc, q->key);
    } else {
        Emberps__KvGetResponse resp = EMBERPS__KV_GET_RESPONSE__INIT;
        resp.value.data = v;
        resp.value.len = vl;
        resp.revision = rev;
        ps_api_reply_pack(r, &resp.base);
    }
    free(v);
    emberps__kv_get_request__free_unpacked(q, NULL);
}

static void do_kv_list(const ps_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    if (!env->coord) {
        ps_api_fail(r, PC_ESTATE, "not the coordinator");
        return;
    }
    Emberps__KvListRequest *q =
        emberps__kv_list_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed KvListRequest");
        return;
    }
    const size_t max = q->limit && q->limit < PS_COORD_LIST_MAX ? q->limit : PS_COORD_LIST_MAX;
    pc_kv_entry_t *v = NULL;
    size_t n = 0;
    bool truncated = false;
    int rc = env->coord->list(env->coord->ctx, q->prefix, max, &v, &n, &truncated);
    Emberps__KvEntry *ents = rc ? NULL : calloc(n ? n : 1, sizeof *ents);
    Emberps__KvEntry **ptrs = rc ? NULL : calloc(n ? n : 1, sizeof *ptrs);
    if (!rc && (!ents || !ptrs))
        rc = PC_ENOMEM;
    if (rc) {
        fail_pc(r, rc, q->prefix);
    } else {
        /* as many as the reply may hold (max_reply: the message limit too), then truncated */
        const uint64_t room = env->max_reply ? env->max_reply : UINT64_MAX;
        uint64_t bytes = 2; /* the truncated flag */
        size_t k = 0;
        for (; k < n; k++) {
            emberps__kv_entry__init(&ents[k]);
            ents[k].key = v[k].key;
            ents[k].value.data = v[k].value;
            ents[k].value.len = v[k].len;
            ents[k].lease_left_ms = v[k].lease_left_ms;
            ents[k].revision = v[k].revision;
            ptrs[k] = &ents[k];
            bytes += 1 + 5 + protobuf_c_message_get_packed_size(&ents[k].base); /* tag, length */
            if (bytes > room)
                break;
        }
        Emberps__KvListResponse resp = EMBERPS__KV_LIST_RESPONSE__INIT;
        resp.n_entries = k;
        resp.entries = ptrs;
        resp.truncated = truncated || k < n;
        ps_api_reply_pack(r, &resp.base);
    }
    free(ptrs);
    free(ents);
    pc_kv_entries_free(v, n);
    emberps__kv_list_request__free_unpacked(q, NULL);
}

void ps_api_call(const ps_api_env_t *env, int m, const uint8_t *req, size_t len, bool admin,
                 ps_api_reply_t *r) {
    memset(r, 0, sizeof *r);
    if (!req && len)
        len = 0;
    switch (m) {
        case PS_API_LOOKUP:
        case PS_API_PULL:
            do_rows(env, m, req, len, r);
            return;
        case PS_API_PUSH:
            do_push(env, req, len, r);
            return;
        case PS_API_CREATE_TABLE:
            do_create(env, req, len, r);
            return;
        case PS_API_DROP_TABLE:
            do_drop(env, req, len, r);
            return;
        case PS_API_RESET_TABLE:
            do_reset(env, req, len, r);
            return;
        case PS_API_LIST_TABLES:
            do_list(env, r);
            return;
        case PS_API_TABLE_STATS:
            do_stats(env, req, len, r);
            return;
        case PS_API_CHECKPOINT:
            do_checkpoint(env, r);
            return;
        case PS_API_LIST_CHECKPOINTS:
            do_list_ckpts(env, r);
            return;
        case PS_API_RESTORE:
            do_restore(env, req, len, r);
            return;
        case PS_API_GET_CLUSTER_MAP:
            do_map(env, r);
            return;
        case PS_API_HEALTH:
            do_health(env, r);
            return;
        case PS_API_KV_SET:
            do_kv_set(env, req, len, admin, r);
            return;
        case PS_API_KV_GET:
            do_kv_get(env, req, len, r);
            return;
        case PS_API_KV_LIST:
            do_kv_list(env, req, len, r);
            return;
        default:
            ps_api_fail(r, PC_EUNSUPPORTED, "unknown method");
    }
}

uint64_t ps_api_max_reply(uint64_t reply_limit, uint64_t max_message) {
    const uint64_t fields = 64; /* dim, and the tags and lengths of rows and found */
    const uint64_t in_message = max_message > fields ? max_message - fields : 0;
    return reply_limit < in_message ? reply_limit : in_message;
}

void ps_api_reply_free(ps_api_reply_t *r) {
    free(r->body);
    r->body = NULL;
    r->len = 0;
}
