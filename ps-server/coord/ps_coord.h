/* ps_coord.h: the coordinator's state: a small key-value store for rendezvous and job state.
 *
 * One ps-server of a job runs as the coordinator (`--coordinator`); workers reach it through the
 * gRPC Coordinator service (proto/emberps.proto: KvSet, KvGet). Collective groups rendezvous here
 * (Gloo's Store: set, get, wait by polling get), with a key prefix per group generation.
 *
 * The state lives behind ps_coord_store_t, a table of functions, so an external store (etcd) can
 * hold it instead of this process; ps_coord_store_memory() is the in-process one. Limits: keys
 * 1..PS_COORD_KEY_MAX bytes, values up to PS_COORD_VALUE_MAX bytes, PS_COORD_KEYS_MAX keys and
 * PS_COORD_BYTES_MAX bytes in all (PC_ETOOBIG / PC_EFULL beyond; nothing changes).
 *
 * Thread rule: every function is thread-safe.
 */
#ifndef PS_COORD_H
#define PS_COORD_H

#include <stdbool.h>
#include <stddef.h>

#define PS_COORD_KEY_MAX   512
#define PS_COORD_VALUE_MAX (1u << 20)
#define PS_COORD_KEYS_MAX  65536
#define PS_COORD_BYTES_MAX (256u << 20) /* keys and values together */

typedef struct ps_coord_store {
    void *ctx;
    /* Set key to value, replacing it, or with if_absent only when the key is absent (PC_EEXIST
     * otherwise, nothing changes: the first of racing writers wins). 0, PC_EINVAL (empty key),
     * PC_ETOOBIG, PC_EFULL, PC_ENOMEM. */
    int (*set)(void *ctx, const char *key, const void *value, size_t len, bool if_absent);
    /* The value of key (malloc'ed copy; a 0-byte value gives a non-NULL pointer) or
     * PC_ENOTFOUND. */
    int (*get)(void *ctx, const char *key, void **value, size_t *len);
    void (*destroy)(void *ctx);
} ps_coord_store_t;

/* The in-process store. PC_ENOMEM. */
int ps_coord_store_memory(ps_coord_store_t *out);

#endif
