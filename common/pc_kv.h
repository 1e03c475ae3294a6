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
} pc_kv_entry_t;

/* Free n entries (their keys and values) and the array; entries may be partly filled (NULL
 * fields). NULL is a no-op. */
void pc_kv_entries_free(pc_kv_entry_t *e, size_t n);

#endif
