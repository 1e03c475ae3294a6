/* ps_coord_etcd.c: the coordinator store on etcd (see ps_coord_etcd.h).
 *
 * DESIGN
 * - Transport: etcd's v3 API over gRPC with psgrpc (the gRPC C core channel, TLS and deadlines
 *   EmberPS already uses), messages from proto/etcd.proto through protobuf-c. Not etcd's JSON
 *   gateway: that would take an HTTP client and base64 on every key and value for nothing.
 * - Security: "etcds://" speaks TLS with the caller's CA (and client certificate, for etcd's
 *   --client-cert-auth), checking each member's certificate for the host name the URL gives it;
 *   "etcd://" is plaintext. EmberPS's own token is never sent to etcd.
 * - Members: a channel per member, one of them current: any member answers (followers forward
 *   writes to the leader). A call failing with PC_EUNAVAIL (member gone, election in progress,
 *   "no leader") or not answered within 2 s (a member cut off from the leader, or stopped, holds
 *   requests while its connection stays open: one channel over every member, gRPC's
 *   pick_first, stayed with it) is retried with backoff (25 ms doubling to 400 ms) on the next
 *   member, until the operation's deadline (one for all the calls of an operation). etcd's
 *   "too many requests" is retried the same way; its "database space exceeded" (the quota:
 *   compact etcd, --auto-compaction-retention) is PC_ENOSPC. Puts are idempotent; a
 *   set-if-absent whose transaction says "exists" after a retried attempt checks whether the
 *   value there is its own (the earlier attempt was applied, its answer lost) and then
 *   succeeds.
 * - Leases: the store remembers the etcd lease it gave each key. Setting a key again with a
 *   lease first keeps that lease alive (LeaseKeepAlive: etcd's bidirectional stream, used for
 *   one request and its answer) and then puts the value under it; a lease etcd no longer knows
 *   (TTL 0: it expired, its keys are gone) is replaced by a new grant. A heartbeat costs two
 *   calls, and an expired key reads as absent, as in the memory store.
 * - set-if-absent: one transaction comparing the key's create revision with 0 (an absent key
 *   has none) and putting on success; exactly one of racing writers succeeds. A lease granted
 *   for a set-if-absent that lost is revoked.
 * - list: a range over [PREFIX + prefix, its successor) sorted by key, limit max, read in pages
 *   (each after the last key of the one before, at the first one's revision): a page whose answer
 *   passes gRPC's message limit (8 MiB: nine values of 1 MiB) is asked again half as long. Values
 *   over PS_COORD_LIST_BYTES in all, or more than max keys, mark it truncated. The lease left
 *   of a leased key comes from LeaseTimeToLive (one call per lease met, all within the list's
 *   one deadline: past it, or when a call fails, the time left reads as 1 ms, "leased,
 *   unknown"), in whole seconds; a key's revision is its mod_revision (every put changes it, so a
 * heartbeat shows at once).
 */
#include "ps_coord_etcd.h"

#include "etcd.pb-c.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pc_time.h"

#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <arpa/inet.h>

#define DEFAULT_PREFIX       "/emberps/"
#define PREFIX_MAX           128
#define TARGET_MAX           2048
#define LEASE_BUCKETS        256
#define BACKOFF_MS           25
#define BACKOFF_MAX_MS       400
#define ATTEMPT_MS           2000 /* one attempt's deadline: a member waiting for a leader is left */
#define LEASE_ATTEMPT_MIN_MS 250  /* op_end's attempts at least, with leases */
#define MEMBERS_MAX          16

typedef struct lease {
    struct lease *next;
    char *key;
    int64_t id;
    int64_t ttl; /* seconds */
} lease_t;

typedef struct etcd {
    psg_t *g[MEMBERS_MAX]; /* a channel per member */
    int ng;
    atomic_int cur; /* the member calls go to (the next one after a failed attempt) */
    char url[TARGET_MAX];
    char prefix[PREFIX_MAX];
    size_t plen;
    int timeout_ms;
    pthread_mutex_t mu; /* the lease map */
    lease_t *leases[LEASE_BUCKETS];
    atomic_uint shortest_lease_ms; /* of the leased sets so far (0: none): see op_end */
} etcd_t;

/* The length of url's etcd scheme ("etcd://" or "etcds://"), 0 for another URL. */
static size_t scheme_len(const char *url) {
    if (url && strncmp(url, PS_COORD_ETCD_SCHEME, strlen(PS_COORD_ETCD_SCHEME)) == 0)
        return strlen(PS_COORD_ETCD_SCHEME);
    if (url && strncmp(url, PS_COORD_ETCDS_SCHEME, strlen(PS_COORD_ETCDS_SCHEME)) == 0)
        return strlen(PS_COORD_ETCDS_SCHEME);
    return 0;
}

bool ps_coord_is_etcd(const char *url) {
    return scheme_len(url) > 0;
}

/* ---- calls ------------------------------------------------------------------------------- */

/* An operation's deadline (CLOCK_MONOTONIC ns: timeout_ms for all its calls) and the longest
 * one attempt of it waits on a member before the next member is asked. */
typedef struct dl {
    uint64_t end_ns;
    int attempt_ms;
} dl_t;

/* The deadline of an operation started now. Once the store has kept a lease alive, the first
 * attempt of every operation waits at most a quarter of the shortest such lease
 * (LEASE_ATTEMPT_MIN_MS at least; the attempts after it ATTEMPT_MS, so a member merely slow, a
 * large range, still gets an answer out): one member that holds requests unanswered (stopped, cut
 * off from its leader) kept an attempt waiting ATTEMPT_MS, as long as the default lease, and the
 * thread that renews the lease (a server's controller, its reads too) renewed it too late: the key
 * expired and a healthy primary's backup took over. */
static dl_t op_end(const etcd_t *e) {
    dl_t d = {pc_time_mono_ns() + (uint64_t)e->timeout_ms * 1000000u, ATTEMPT_MS};
    const uint32_t lease = atomic_load(&e->shortest_lease_ms);
    const uint32_t q = lease / 4 < LEASE_ATTEMPT_MIN_MS ? LEASE_ATTEMPT_MIN_MS : lease / 4;
    if (lease && q < (uint32_t)d.attempt_ms)
        d.attempt_ms = (int)q;
    return d;
}

/* Note a set with a lease of lease_ms (op_end). */
static void note_lease_ms(etcd_t *e, uint32_t lease_ms) {
    uint32_t cur = atomic_load(&e->shortest_lease_ms);
    while (lease_ms && (!cur || lease_ms < cur) &&
           !atomic_compare_exchange_weak(&e->shortest_lease_ms, &cur, lease_ms))
        ;
}

/* The deadline of an operation's last call, which settles what the others did (the check of a
 * retried set-if-absent, the revoke of its lease): one attempt at least, past end_ns if need be
 * (a retry that met the deadline would else leave a key under an unknown lease), of at most the
 * store's timeout (a heartbeat's store has a quarter lease). */
static dl_t tail_end(const etcd_t *e, dl_t d) {
    const int ms = e->timeout_ms < d.attempt_ms ? e->timeout_ms : d.attempt_ms;
    const uint64_t one = pc_time_mono_ns() + (uint64_t)ms * 1000000u;
    return (dl_t){one > d.end_ns ? one : d.end_ns, d.attempt_ms};
}

/* An attempt's failure as the operation sees it: etcd's RESOURCE_EXHAUSTED (PC_ETOOBIG, bare)
 * is its quota when the message says so (PC_ENOSPC) and its request limiter otherwise (tried
 * again, as PC_EUNAVAIL), unless the message is gRPC's own size limit. */
static int attempt_rc(int rc, const char *msg) {
    if (rc != PC_ETOOBIG)
        return rc;
    if (strstr(msg, "database space exceeded"))
        return PC_ENOSPC;
    return strstr(msg, "too many requests") ? PC_EUNAVAIL : rc;
}

/* Call `method` with message q and unpack the answer as `desc` into *out. PC_EUNAVAIL and an
 * attempt's deadline (ATTEMPT_MS: a member cut off from the leader holds requests for seconds)
 * are retried with backoff on the next member until d.end_ns (CLOCK_MONOTONIC: op_end; the calls
 * of an operation share it), each attempt waiting d.attempt_ms at most; *retried (may be NULL)
 * tells whether an earlier attempt may have been applied (its answer was lost). Out of time:
 * PC_ETIMEDOUT when an attempt timed out (it may have been applied: a caller must not take it for
 * undone), else PC_EUNAVAIL. */
static int call_r(etcd_t *e, const char *method, const ProtobufCMessage *q,
                  const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, bool *retried,
                  dl_t d) {
    if (retried)
        *retried = false;
    const size_t n = protobuf_c_message_get_packed_size(q);
    uint8_t *req = malloc(n ? n : 1);
    if (!req)
        return PC_ENOMEM;
    protobuf_c_message_pack(q, req);
    int rc, backoff = BACKOFF_MS;
    bool lost = false;      /* an attempt timed out: it may have been applied, its answer lost */
    int cap = d.attempt_ms; /* the first attempt's; ATTEMPT_MS after (see op_end) */
    char msg[256] = "";
    for (;;) {
        const int64_t left = ((int64_t)d.end_ns - (int64_t)pc_time_mono_ns()) / 1000000;
        if (left <= 0) {
            rc = PC_ETIMEDOUT;
            break;
        }
        uint8_t *resp = NULL;
        size_t rlen = 0;
        const int attempt = left < cap ? (int)left : cap;
        int m = atomic_load(&e->cur);
        rc = psg_request(e->g[m], method, req, n, attempt, &resp, &rlen, NULL, msg, sizeof msg);
        if (!rc) {
            *out = protobuf_c_message_unpack(desc, NULL, rlen, resp);
            free(resp);
            rc = *out ? 0 : PC_ECORRUPT;
            break;
        }
        free(resp);
        if ((rc = attempt_rc(rc, msg)) != PC_EUNAVAIL && rc != PC_ETIMEDOUT)
            break;
        lost |= rc == PC_ETIMEDOUT;
        cap = ATTEMPT_MS; /* a member merely slow still answers the next attempt */
        if (retried)
            *retried = true;
        /* the next member (unless another thread's failed attempt moved on already) */
        atomic_compare_exchange_strong(&e->cur, &m, (m + 1) % e->ng);
        const int64_t after = ((int64_t)d.end_ns - (int64_t)pc_time_mono_ns()) / 1000000;
        if (after <= backoff) { /* (a write an attempt may have applied is no PC_EUNAVAIL) */
            rc = lost ? PC_ETIMEDOUT : PC_EUNAVAIL;
            break;
        }
        struct timespec ts = {backoff / 1000, (long)(backoff % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
    if (rc && rc != PC_ENOTFOUND)
        PC_DEBUG("coord: etcd %s at %s: %s (%s)", method, e->url, pc_strerror(rc), msg);
    free(req);
    return rc;
}

#define CALL(e, method, q, T, lower, out, d) \
    call_r(e, method, &(q).base, &lower##__descriptor, (ProtobufCMessage **)(out), NULL, d)

/* ---- leases ------------------------------------------------------------------------------ */

static lease_t **lease_slot(etcd_t *e, const char *key) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a: a few dozen keys per process */
    for (const char *p = key; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    lease_t **pp = &e->leases[h % LEASE_BUCKETS];
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

static int grant(etcd_t *e, int64_t ttl, int64_t *id, dl_t d) {
    Emberps__Etcd__LeaseGrantRequest q = EMBERPS__ETCD__LEASE_GRANT_REQUEST__INIT;
    q.ttl = ttl;
    Emberps__Etcd__LeaseGrantResponse *r = NULL;
    int rc = CALL(e, "/etcdserverpb.Lease/LeaseGrant", q, Emberps__Etcd__LeaseGrantResponse,
                  emberps__etcd__lease_grant_response, &r, d);
    if (!rc) {
        if (r->error && r->error[0]) {
            PC_WARN("coord: etcd refused a lease of %lld s: %s", (long long)ttl, r->error);
            rc = PC_EUNAVAIL;
        } else {
            *id = r->id;
        }
        emberps__etcd__lease_grant_response__free_unpacked(r, NULL);
    }
    return rc;
}

/* Keep lease id alive: 0 (alive), PC_ENOTFOUND (expired), or the call's error. */
static int keepalive(etcd_t *e, int64_t id, dl_t d) {
    Emberps__Etcd__LeaseKeepAliveRequest q = EMBERPS__ETCD__LEASE_KEEP_ALIVE_REQUEST__INIT;
    q.id = id;
    Emberps__Etcd__LeaseKeepAliveResponse *r = NULL;
    int rc = CALL(e, "/etcdserverpb.Lease/LeaseKeepAlive", q, Emberps__Etcd__LeaseKeepAliveResponse,
                  emberps__etcd__lease_keep_alive_response, &r, d);
    if (!rc) {
        rc = r->ttl > 0 ? 0 : PC_ENOTFOUND;
        emberps__etcd__lease_keep_alive_response__free_unpacked(r, NULL);
    }
    return rc;
}

/* Revoke lease id within the operation's deadline (past it: the lease ends by its TTL). */
static void revoke(etcd_t *e, int64_t id, dl_t d) {
    Emberps__Etcd__LeaseRevokeRequest q = EMBERPS__ETCD__LEASE_REVOKE_REQUEST__INIT;
    q.id = id;
    Emberps__Etcd__LeaseRevokeResponse *r = NULL;
    if (!CALL(e, "/etcdserverpb.Lease/LeaseRevoke", q, Emberps__Etcd__LeaseRevokeResponse,
              emberps__etcd__lease_revoke_response, &r, d))
        emberps__etcd__lease_revoke_response__free_unpacked(r, NULL);
}

/* The live lease for key with ttl seconds: the one it had (kept alive) or a new grant (*fresh). */
static int lease_for(etcd_t *e, const char *key, int64_t ttl, int64_t *id, bool *fresh, dl_t d) {
    pthread_mutex_lock(&e->mu);
    lease_t *l = *lease_slot(e, key);
    int64_t have = l && l->ttl == ttl ? l->id : 0;
    pthread_mutex_unlock(&e->mu);
    *fresh = false;
    if (have) {
        int rc = keepalive(e, have, d);
        if (!rc) {
            *id = have;
            return 0;
        }
        if (rc != PC_ENOTFOUND)
            return rc;
    }
    int rc = grant(e, ttl, id, d);
    *fresh = !rc;
    return rc;
}

/* Remember (id != 0) or forget (id == 0) key's lease. */
static int lease_note(etcd_t *e, const char *key, int64_t id, int64_t ttl) {
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    lease_t **pp = lease_slot(e, key), *l = *pp;
    if (id && !l) {
        l = calloc(1, sizeof *l);
        if (!l || !(l->key = strdup(key))) {
            free(l);
            rc = PC_ENOMEM;
        } else {
            *pp = l;
        }
    }
    if (!rc && id) {
        l->id = id;
        l->ttl = ttl;
    } else if (!id && l) {
        *pp = l->next;
        free(l->key);
        free(l);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---- the store --------------------------------------------------------------------------- */

/* PREFIX + key into buf (cap PREFIX_MAX + PS_COORD_KEY_MAX + 1). */
static size_t full_key(const etcd_t *e, const char *key, char *buf) {
    memcpy(buf, e->prefix, e->plen);
    const size_t kl = strlen(key);
    memcpy(buf + e->plen, key, kl + 1);
    return e->plen + kl;
}

/* Whether full key fk holds exactly (value, lease): the put of an earlier attempt. */
static bool is_ours(etcd_t *e, const char *fk, size_t fl, const void *value, size_t len,
                    int64_t lease, dl_t d) {
    Emberps__Etcd__RangeRequest q = EMBERPS__ETCD__RANGE_REQUEST__INIT;
    q.key = (ProtobufCBinaryData){fl, (uint8_t *)(uintptr_t)fk};
    Emberps__Etcd__RangeResponse *r = NULL;
    if (CALL(e, "/etcdserverpb.KV/Range", q, Emberps__Etcd__RangeResponse,
             emberps__etcd__range_response, &r, d))
        return false;
    const bool ours = r->n_kvs == 1 && r->kvs[0]->value.len == len && r->kvs[0]->lease == lease &&
                      (!len || !memcmp(r->kvs[0]->value.data, value, len));
    emberps__etcd__range_response__free_unpacked(r, NULL);
    return ours;
}

/* Put `put` in one transaction when the key's create revision is 0 (absent; revision 0) or its
 * mod revision is `revision`: 0, PC_EEXIST (the compare failed), or a call's error. A retried
 * attempt that finds the compare failed checks whether the value there is its own put (an
 * earlier attempt was applied, its answer lost). */
static int txn_put(etcd_t *e, Emberps__Etcd__PutRequest *put, uint64_t revision, dl_t d) {
    Emberps__Etcd__Compare cmp = EMBERPS__ETCD__COMPARE__INIT;
    cmp.result = EMBERPS__ETCD__COMPARE__COMPARE_RESULT__EQUAL;
    cmp.key = put->key;
    if (revision) {
        cmp.target = EMBERPS__ETCD__COMPARE__COMPARE_TARGET__MOD;
        cmp.target_union_case = EMBERPS__ETCD__COMPARE__TARGET_UNION_MOD_REVISION;
        cmp.mod_revision = (int64_t)revision;
    } else {
        cmp.target = EMBERPS__ETCD__COMPARE__COMPARE_TARGET__CREATE;
        cmp.target_union_case = EMBERPS__ETCD__COMPARE__TARGET_UNION_CREATE_REVISION;
        cmp.create_revision = 0;
    }
    Emberps__Etcd__RequestOp op = EMBERPS__ETCD__REQUEST_OP__INIT;
    op.request_case = EMBERPS__ETCD__REQUEST_OP__REQUEST_REQUEST_PUT;
    op.request_put = put;
    Emberps__Etcd__Compare *cmps[] = {&cmp};
    Emberps__Etcd__RequestOp *ops[] = {&op};
    Emberps__Etcd__TxnRequest q = EMBERPS__ETCD__TXN_REQUEST__INIT;
    q.n_compare = 1;
    q.compare = cmps;
    q.n_success = 1;
    q.success = ops;
    Emberps__Etcd__TxnResponse *r = NULL;
    bool retried = false;
    int rc = call_r(e, "/etcdserverpb.KV/Txn", &q.base, &emberps__etcd__txn_response__descriptor,
                    (ProtobufCMessage **)&r, &retried, d);
    if (!rc) {
        rc = r->succeeded ? 0 : PC_EEXIST;
        emberps__etcd__txn_response__free_unpacked(r, NULL);
    }
    if (rc == PC_EEXIST && retried &&
        is_ours(e, (const char *)put->key.data, put->key.len, put->value.data, put->value.len,
                put->lease, tail_end(e, d)))
        rc = 0; /* an attempt whose answer was lost had put it */
    return rc;
}

/* One put: plain, only when absent (if_absent), or at a revision (> 0); with a lease of lease_ms
 * (0: none). */
static int e_put(etcd_t *e, const char *key, const void *value, size_t len, bool if_absent,
                 uint64_t revision, uint32_t lease_ms) {
    int rc = ps_coord_key_check(key, len);
    if (rc)
        return rc;
    if (revision > INT64_MAX) /* etcd's revisions are int64: never this one */
        return PC_EEXIST;
    char fk[PREFIX_MAX + PS_COORD_KEY_MAX + 1];
    const size_t fl = full_key(e, key, fk);
    note_lease_ms(e, lease_ms);
    const dl_t d = op_end(e); /* the lease's calls, the put, the check, the revoke */
    int64_t lid = 0, ttl = 0;
    bool fresh = false;
    if (lease_ms) {
        ttl = ((int64_t)lease_ms + 999) / 1000;
        if ((rc = lease_for(e, key, ttl, &lid, &fresh, d)))
            return rc;
    }
    Emberps__Etcd__PutRequest put = EMBERPS__ETCD__PUT_REQUEST__INIT;
    put.key = (ProtobufCBinaryData){fl, (uint8_t *)fk};
    put.value = (ProtobufCBinaryData){len, (uint8_t *)(uintptr_t)value};
    put.lease = lid;
    if (!if_absent && !revision) {
        Emberps__Etcd__PutResponse *r = NULL;
        rc = CALL(e, "/etcdserverpb.KV/Put", put, Emberps__Etcd__PutResponse,
                  emberps__etcd__put_response, &r, d);
        if (!rc)
            emberps__etcd__put_response__free_unpacked(r, NULL);
    } else {
        rc = txn_put(e, &put, revision, d);
    }
    if (lease_ms && rc && fresh) {
        /* nothing was put under it; or a timed-out attempt was applied after all, and the key
         * goes with the lease: the caller was told the set failed, and no stale holder stays
         * (until the TTL) for others to read */
        revoke(e, lid, tail_end(e, d));
        return rc;
    }
    return rc ? rc : lease_note(e, key, lid, ttl); /* (lid 0: no lease now) */
}

static int e_set(void *ctx, const char *key, const void *value, size_t len, bool if_absent,
                 uint32_t lease_ms) {
    return e_put(ctx, key, value, len, if_absent, 0, lease_ms);
}

static int e_set_if(void *ctx, const char *key, const void *value, size_t len, uint64_t revision,
                    uint32_t lease_ms) {
    return e_put(ctx, key, value, len, revision == 0, revision, lease_ms);
}

static int e_get_rev(void *ctx, const char *key, void **value, size_t *len, uint64_t *revision) {
    etcd_t *e = ctx;
    if (!key || !key[0])
        return PC_EINVAL;
    if (strlen(key) > PS_COORD_KEY_MAX)
        return PC_ENOTFOUND;
    char fk[PREFIX_MAX + PS_COORD_KEY_MAX + 1];
    const size_t fl = full_key(e, key, fk);
    Emberps__Etcd__RangeRequest q = EMBERPS__ETCD__RANGE_REQUEST__INIT;
    q.key = (ProtobufCBinaryData){fl, (uint8_t *)fk};
    Emberps__Etcd__RangeResponse *r = NULL;
    int rc = CALL(e, "/etcdserverpb.KV/Range", q, Emberps__Etcd__RangeResponse,
                  emberps__etcd__range_response, &r, op_end(e));
    if (rc)
        return rc;
    if (!r->n_kvs) {
        rc = PC_ENOTFOUND;
    } else {
        const ProtobufCBinaryData *v = &r->kvs[0]->value;
        if (!(*value = pc_kv_dup(v->data, v->len)))
            rc = PC_ENOMEM;
        else
            *len = v->len;
        if (!rc && revision)
            *revision = (uint64_t)r->kvs[0]->mod_revision;
    }
    emberps__etcd__range_response__free_unpacked(r, NULL);
    return rc;
}

static int e_get(void *ctx, const char *key, void **value, size_t *len) {
    return e_get_rev(ctx, key, value, len, NULL);
}

/* Milliseconds left of lease id (0 when it is gone or cannot be asked by d.end_ns). */
static uint32_t lease_left_ms(etcd_t *e, int64_t id, dl_t d) {
    Emberps__Etcd__LeaseTimeToLiveRequest q = EMBERPS__ETCD__LEASE_TIME_TO_LIVE_REQUEST__INIT;
    q.id = id;
    Emberps__Etcd__LeaseTimeToLiveResponse *r = NULL;
    if (pc_time_mono_ns() >= d.end_ns ||
        call_r(e, "/etcdserverpb.Lease/LeaseTimeToLive", &q.base,
               &emberps__etcd__lease_time_to_live_response__descriptor, (ProtobufCMessage **)&r,
               NULL, d))
        return 0;
    const int64_t ttl = r->ttl;
    emberps__etcd__lease_time_to_live_response__free_unpacked(r, NULL);
    return ttl <= 0 ? 0 : ttl < UINT32_MAX / 1000 ? (uint32_t)(ttl * 1000) : UINT32_MAX;
}

static int e_list(void *ctx, const char *prefix, size_t max, pc_kv_entry_t **out, size_t *n,
                  bool *truncated) {
    etcd_t *e = ctx;
    const dl_t when = op_end(e); /* all of it */
    *out = NULL;
    *n = 0;
    *truncated = false;
    if (!prefix)
        prefix = "";
    if (strlen(prefix) > PS_COORD_KEY_MAX)
        return PC_EINVAL;
    if (max > PS_COORD_LIST_MAX)
        max = PS_COORD_LIST_MAX;
    if (!max)
        return 0;
    char lo[PREFIX_MAX + PS_COORD_KEY_MAX + 2], hi[sizeof lo];
    size_t ll = full_key(e, prefix, lo), hl = ll;
    memcpy(hi, lo, ll);
    /* the successor of the prefix: its last byte below 0xff plus one (the rest dropped) */
    while (hl && (uint8_t)hi[hl - 1] == 0xff)
        hl--;
    if (hl)
        hi[hl - 1] = (char)((uint8_t)hi[hl - 1] + 1);
    pc_kv_entry_t *v = calloc(max, sizeof *v);
    if (!v)
        return PC_ENOMEM;
    Emberps__Etcd__RangeRequest q = EMBERPS__ETCD__RANGE_REQUEST__INIT;
    q.range_end =
        hl ? (ProtobufCBinaryData){hl, (uint8_t *)hi} : (ProtobufCBinaryData){1, (uint8_t *)"\0"};
    q.sort_order = EMBERPS__ETCD__RANGE_REQUEST__SORT_ORDER__ASCEND;
    q.sort_target = EMBERPS__ETCD__RANGE_REQUEST__SORT_TARGET__KEY;
    size_t k = 0, bytes = 0, page = max;
    int restarts = 0;
    int64_t last_lease = 0;
    uint32_t last_left = 0;
    int rc = 0;
    bool done = false;
    while (!rc && !done) {
        q.key = (ProtobufCBinaryData){ll, (uint8_t *)lo};
        q.limit = (int64_t)(page < max - k ? page : max - k);
        Emberps__Etcd__RangeResponse *r = NULL;
        rc =
            call_r(e, "/etcdserverpb.KV/Range", &q.base, &emberps__etcd__range_response__descriptor,
                   (ProtobufCMessage **)&r, NULL, when);
        if (rc == PC_ETOOBIG && q.limit > 1) { /* over gRPC's message limit: smaller pages */
            page = (size_t)q.limit / 2;
            rc = 0;
            continue;
        }
        /* A later page read at the first one's revision fails once etcd compacted past it
         * (OUT_OF_RANGE, which no code of ours is bare for: PC_EINTERNAL): the listing starts
         * over at the revision then current, twice at most (within the operation's deadline, as
         * every call). */
        if (rc == PC_EINTERNAL && q.revision && restarts < 2 && pc_time_mono_ns() < when.end_ns) {
            restarts++;
            pc_kv_entries_free(v, k + 1 < max ? k + 1 : max);
            if (!(v = calloc(max, sizeof *v)))
                return PC_ENOMEM;
            k = bytes = 0;
            q.revision = 0;
            ll = full_key(e, prefix, lo);
            rc = 0;
            continue;
        }
        if (rc)
            break;
        if (!q.revision && r->header) /* the later pages read the first one's revision */
            q.revision = r->header->revision;
        size_t i = 0;
        for (; !rc && i < r->n_kvs && k < max; i++, k++) { /* (etcd may not honour limit) */
            const Emberps__Etcd__KeyValue *kv = r->kvs[i];
            if (bytes + kv->value.len > PS_COORD_LIST_BYTES) {
                *truncated = done = true;
                break;
            }
            bytes += kv->value.len;
            pc_kv_entry_t *d = &v[k];
            const size_t kl = kv->key.len > e->plen ? kv->key.len - e->plen : 0;
            if ((rc = pc_kv_entry_fill(d, kl ? kv->key.data + e->plen : NULL, kl, kv->value.data,
                                       kv->value.len)))
                break;
            d->revision = kv->mod_revision > 0 ? (uint64_t)kv->mod_revision : 0;
            if (kv->lease) {
                if (kv->lease != last_lease) {
                    last_lease = kv->lease;
                    last_left = lease_left_ms(e, kv->lease, when);
                }
                d->lease_left_ms = last_left ? last_left : 1; /* leased: never reads as "none" */
            }
        }
        if (!rc && !done && i < r->n_kvs) /* more than asked for: max reached */
            *truncated = done = true;
        if (!rc && !done && r->more && r->n_kvs) {
            const Emberps__Etcd__KeyValue *kv = r->kvs[r->n_kvs - 1];
            if (k == max || kv->key.len >= sizeof lo) { /* (a key no caller of ours writes) */
                *truncated = done = true;
            } else { /* the next page starts just after the last key */
                memcpy(lo, kv->key.data, kv->key.len);
                lo[kv->key.len] = '\0';
                ll = kv->key.len + 1;
            }
        } else {
            done = true;
        }
        emberps__etcd__range_response__free_unpacked(r, NULL);
    }
    if (rc) {
        pc_kv_entries_free(v, k + 1 < max ? k + 1 : max);
        return rc;
    }
    *out = v;
    *n = k;
    return 0;
}
static void e_destroy(void *ctx) {
    etcd_t *e = ctx;
    if (!e)
        return;
    /* Leases are left to expire: a process that stops is gone from the job after its TTL, as
     * one that dies. */
    for (size_t b = 0; b < LEASE_BUCKETS; b++)
        for (lease_t *l = e->leases[b], *nx; l; l = nx) {
            nx = l->next;
            free(l->key);
            free(l);
        }
    for (int i = 0; i < e->ng; i++)
        psg_destroy(e->g[i]);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* A member of the URL: its gRPC target ("ipv4:a.b.c.d:p") and the host name the URL gives it
 * (its certificate's name under TLS). */
typedef struct member {
    char target[64];
    char host[256];
} member_t;

/* "etcd://h:p,h:p/prefix" -> its members (at most MEMBERS_MAX; *n of them) and the prefix. */
static int parse_url(const char *url, member_t *mem, int *n, char *prefix, size_t pcap) {
    if (!ps_coord_is_etcd(url))
        return PC_EINVAL;
    const char *p = url + scheme_len(url);
    const char *slash = strchr(p, '/');
    const size_t elen = slash ? (size_t)(slash - p) : strlen(p);
    if (!elen || elen >= TARGET_MAX)
        return PC_EINVAL;
    if (slash && slash[1]) {
        const size_t len = strlen(slash);
        if (len + 2 > pcap)
            return PC_EINVAL;
        memcpy(prefix, slash, len + 1);
        if (prefix[len - 1] != '/')
            memcpy(prefix + len, "/", 2);
    } else {
        snprintf(prefix, pcap, "%s", DEFAULT_PREFIX);
    }
    *n = 0;
    for (const char *s = p; s < p + elen;) {
        const char *comma = memchr(s, ',', (size_t)(p + elen - s));
        const char *end = comma ? comma : p + elen;
        member_t *m = &mem[*n];
        const size_t len = (size_t)(end - s);
        if (!len || len >= sizeof m->host || *n == MEMBERS_MAX)
            return PC_EINVAL;
        memcpy(m->host, s, len);
        m->host[len] = '\0';
        char *colon = strrchr(m->host, ':');
        if (!colon || !colon[1] || colon == m->host)
            return PC_EINVAL;
        *colon = '\0';
        const char *port = colon + 1;
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        if (getaddrinfo(m->host, port, &hints, &ai) || !ai) {
            PC_ERROR("coord: etcd endpoint %s:%s does not resolve to an IPv4 address", m->host,
                     port);
            return PC_EINVAL;
        }
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr, ip, sizeof ip);
        freeaddrinfo(ai);
        const int w = snprintf(m->target, sizeof m->target, "ipv4:%s:%s", ip, port);
        if (w < 0 || (size_t)w >= sizeof m->target)
            return PC_EINVAL;
        (*n)++;
        s = comma ? comma + 1 : end;
    }
    return 0;
}

int ps_coord_store_etcd(const char *url, const psg_opts_t *sec, int timeout_ms,
                        ps_coord_store_t *out) {
    if (!url || !out || timeout_ms < 1)
        return PC_EINVAL;
    etcd_t *e = calloc(1, sizeof *e);
    member_t *mem = calloc(MEMBERS_MAX, sizeof *mem);
    if (!e || !mem) {
        free(e);
        free(mem);
        return PC_ENOMEM;
    }
    int n = 0, rc = parse_url(url, mem, &n, e->prefix, sizeof e->prefix);
    if (rc)
        PC_ERROR("coord: '%s' is not etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (at most %d "
                 "members)",
                 url, MEMBERS_MAX);
    snprintf(e->url, sizeof e->url, "%s", url);
    e->plen = strlen(e->prefix);
    e->timeout_ms = timeout_ms;
    for (int i = 0; !rc && i < n; i++) {
        psg_opts_t o = {.addr = mem[i].target, .max_message = 8u << 20};
        if (scheme_len(url) == strlen(PS_COORD_ETCDS_SCHEME)) { /* etcds://: TLS */
            o.tls = 1;
            o.tls_target = mem[i].host;
            if (sec) {
                o.tls_ca = sec->tls_ca;
                o.tls_cert = sec->tls_cert;
                o.tls_key = sec->tls_key;
            }
        }
        if (!(rc = psg_create(&o, &e->g[i])))
            e->ng++;
    }
    free(mem);
    if (rc) {
        for (int i = 0; i < e->ng; i++)
            psg_destroy(e->g[i]);
        free(e);
        return rc;
    }
    pthread_mutex_init(&e->mu, NULL);
    *out = (ps_coord_store_t){.ctx = e,
                              .set = e_set,
                              .get = e_get,
                              .get_rev = e_get_rev,
                              .set_if = e_set_if,
                              .list = e_list,
                              .destroy = e_destroy};
    return 0;
}
