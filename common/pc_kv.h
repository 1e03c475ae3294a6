/* pc_kv.h: one live key of a coordinator listing (KvList), as the coordinator's store returns
 * it and as its clients receive it.
 *
 * Thread rule: plain data.
 */
#ifndef PC_KV_H
#define PC_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct pc_kv_entry {
    char *key;              /* malloc'ed, NUL-terminated */
    void *value;            /* malloc'ed */
    size_t len;             /* of value */
    uint32_t lease_left_ms; /* 0: no lease (the key stays) */
    /* Changes with every set of the key, even to the same value (etcd's mod_revision; the
     * memory store's count of sets, from the wall clock's nanoseconds at its start): a heartbeat
     * shows as a new revision, which a lease's time left (whole seconds on etcd) cannot show. 0:
     * unknown. */
    uint64_t revision;
} pc_kv_entry_t;

/* Free n entries (their keys and values) and the array; entries may be partly filled (NULL
 * fields). NULL is a no-op. */
void pc_kv_entries_free(pc_kv_entry_t *e, size_t n);

/* A malloc'ed copy of p[0..n) with a NUL after it (n may be 0, and p then NULL: values are
 * bytes, often text); NULL when out of memory. Every coordinator store copies keys and values
 * out with it. */
void *pc_kv_dup(const void *p, size_t n);

/* d = copies of key[0..klen) and value[0..vlen) (pc_kv_dup), lease_left_ms and revision 0. 0, or
 * PC_ENOMEM with d's fields NULL or owned (pc_kv_entries_free frees them). */
int pc_kv_entry_fill(pc_kv_entry_t *d, const void *key, size_t klen, const void *value,
                     size_t vlen);

#endif
