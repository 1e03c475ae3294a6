/* pw_coll.h: collectives among workers (dense-gradient allreduce), behind a C interface.
 *
 * CPU workers use Gloo (libgloo-dev; TCP transport) through a small C++ shim (pw_gloo.cc); GPU
 * workers will use NCCL behind the same calls. A group of `size` ranks forms by rendezvous in a
 * key-value store given as callbacks (the coordinator's KvSet/KvGet: pw_coord_client.h), under a
 * key prefix that must be new for every group formation (e.g. "job/gen/3"), so a restarted worker
 * re-forms the group under a new generation without stale keys.
 *
 * Errors: PC_ETIMEDOUT (a rank did not come within the timeout, or a peer stopped answering),
 * PC_EUNAVAIL (a peer's connection failed: killed or restarted), PC_EINVAL, PC_EINTERNAL (with
 * the library's message logged). Nothing throws across this interface. After an error the group
 * is unusable: destroy it and form a new one (new prefix). A failed in-place allreduce may leave
 * partial sums in the buffer: keep a copy of the input to redo the step.
 *
 * Thread rule: a group is used by one thread at a time.
 */
#ifndef PW_COLL_H
#define PW_COLL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The rendezvous store. get returns 0 with a malloc'ed value, PC_ENOTFOUND while the key is
 * absent (the group polls), or another error (fatal to the formation). */
typedef struct pw_kv {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *value, size_t len);
    int (*get)(void *ctx, const char *key, void **value, size_t *len);
} pw_kv_t;

typedef struct pw_coll pw_coll_t;

/* Form a group: rank in 0..size-1, peers reached on `host` (this worker's address as the others
 * see it: "127.0.0.1" on one machine), every operation bounded by timeout_ms. Blocks until all
 * ranks joined or the timeout (PC_ETIMEDOUT). A failure of the store itself is its own code
 * (PC_EFULL: the coordinator is full). */
int pw_coll_create(const pw_kv_t *kv, const char *prefix, int rank, int size, const char *host,
                   int timeout_ms, pw_coll_t **out);
void pw_coll_destroy(pw_coll_t *c);

/* buf (n floats) = the sum of every rank's buf, identical on every rank. Large buffers may be
 * split by the caller into chunks (each its own call) so a scheduler can order them. */
int pw_coll_allreduce_sum(pw_coll_t *c, float *buf, size_t n);

/* Wait until every rank got here; timeout_ms > 0 bounds this call instead of the group's
 * timeout (a rank known to be busy longer, e.g. writing a checkpoint). */
int pw_coll_barrier(pw_coll_t *c, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif
