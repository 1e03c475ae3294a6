/* ps_coord.h: the coordinator's state: a small key-value store for rendezvous and job state.
 *
 * One ps-server of a job runs as the coordinator (`--coordinator`); workers reach it through the
 * gRPC Coordinator service (proto/emberps.proto: KvSet, KvGet). Collective groups rendezvous here
 * (Gloo's Store: set, get, wait by polling get), with a key prefix per group generation.
 *
 * Keys may carry a lease (as etcd's): a key set with lease_ms > 0 expires lease_ms after its last
 * set, and from then on reads as absent (get, list, if_absent). Workers keep their membership
 * alive this way (heartbeats: pw_group.h).
 *
 * The state lives behind ps_coord_store_t, a table of functions, so an external store (etcd) can
 * hold it instead of this process; ps_coord_store_memory() is the in-process one (leases on
 * CLOCK_MONOTONIC; a restarted coordinator starts empty). Limits: keys 1..PS_COORD_KEY_MAX
 * bytes, values up to PS_COORD_VALUE_MAX bytes, PS_COORD_KEYS_MAX keys and PS_COORD_BYTES_MAX
 * bytes in all, expired keys not counted (PC_ETOOBIG / PC_EFULL beyond; nothing changes).
 *
 * Thread rule: every function is thread-safe.
 */
#ifndef PS_COORD_H
#define PS_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pc_error.h"
#include "pc_kv.h"

#define PS_COORD_KEY_MAX    512
#define PS_COORD_VALUE_MAX  (1u << 20)
#define PS_COORD_KEYS_MAX   65536
#define PS_COORD_BYTES_MAX  (256u << 20) /* keys and values together */
#define PS_COORD_LIST_MAX   4096         /* entries one list returns at most */
#define PS_COORD_LIST_BYTES (4u << 20)   /* and values of at most this many bytes */

/* The servers' keys (cluster maps, reshard targets, leases, run records): with an admin token
 * set, written only by callers presenting it (KvSet), the servers included; jobs write under
 * their own prefix with the plain token. */
#define PS_COORD_CLUSTER_PREFIX "cluster/"

typedef struct ps_coord_store {
    void *ctx;
    /* Set key to value, replacing it, or with if_absent only when the key is absent (PC_EEXIST
     * otherwise, nothing changes: the first of racing writers wins). lease_ms > 0: the key
     * expires lease_ms after this set (0: never). 0, PC_EINVAL (empty key), PC_ETOOBIG,
     * PC_EFULL, PC_ENOMEM. */
    int (*set)(void *ctx, const char *key, const void *value, size_t len, bool if_absent,
               uint32_t lease_ms);
    /* The value of key (malloc'ed copy; a 0-byte value gives a non-NULL pointer) or
     * PC_ENOTFOUND. */
    int (*get)(void *ctx, const char *key, void **value, size_t *len);
    /* get, with the key's revision (KvList's: it changes with every set of the key, and a
     * revision is never given to two sets of one store, across restarts too). */
    int (*get_rev)(void *ctx, const char *key, void **value, size_t *len, uint64_t *revision);
    /* Compare-and-set: set key to value only when its revision is `revision`, or with revision 0
     * only when it is absent; else PC_EEXIST and nothing changes (of writers that read the same
     * revision, the first wins: a read-modify-write that does not lose another's). lease_ms as
     * set's (a heartbeat fenced against another holder's writes). Errors as set's. */
    int (*set_if)(void *ctx, const char *key, const void *value, size_t len, uint64_t revision,
                  uint32_t lease_ms);
    /* The live keys starting with prefix ("" for all), sorted by key, at most max and
     * PS_COORD_LIST_BYTES of values (then *truncated): *out is a malloc'ed array of *n entries
     * (each key and value malloc'ed; free with pc_kv_entries_free). 0 or PC_ENOMEM. */
    int (*list)(void *ctx, const char *prefix, size_t max, pc_kv_entry_t **out, size_t *n,
                bool *truncated);
    void (*destroy)(void *ctx);
} ps_coord_store_t;

/* A set's key and value against the limits: 0, PC_EINVAL (no key), PC_ETOOBIG. */
static inline int ps_coord_key_check(const char *key, size_t len) {
    const size_t kl = key ? strlen(key) : 0;
    if (!kl)
        return PC_EINVAL;
    return kl > PS_COORD_KEY_MAX || len > PS_COORD_VALUE_MAX ? PC_ETOOBIG : 0;
}

/* The in-process store. PC_ENOMEM. */
int ps_coord_store_memory(ps_coord_store_t *out);

#endif
