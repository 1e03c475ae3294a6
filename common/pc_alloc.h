/* pc_alloc.h: allocation counted by tag.
 *
 * Every large or long-lived allocation in EmberPS goes through these functions with a tag naming
 * what the memory is for, so that metrics can say where the bytes are (rows, optimizer state,
 * index, ...). Counters hold requested bytes, exactly; the caller passes the size back on free.
 *
 * Three families:
 *  - pc_malloc/pc_calloc/pc_realloc/pc_free: the C heap.
 *  - pc_smalloc/pc_scalloc/pc_srealloc/pc_sfree: the C heap, self-sized (zmalloc style: a
 *    16-byte header keeps the size and tag), for code whose frees are far from its allocations
 *    (the worker): drop-in for malloc and free.
 *  - pc_vm_alloc/pc_vm_resize/pc_vm_free: page-aligned anonymous mappings for big arrays (row
 *    slabs, indexes). Resizing uses mremap, so growing a multi-GB array copies nothing; pages are
 *    only resident once touched. Mappings of 2 MiB and more stay 2 MiB-aligned across resizes so
 *    transparent huge pages survive growth; pc_vm_advise_huge() asks for them, pc_vm_populate()
 *    faults a region in at once.
 *
 * DESIGN: counters are process-wide relaxed atomics (the one other process-wide state in common/
 * besides the logger): memory use is a property of the process, and metrics read it from any
 * thread. Allocation failure returns NULL; callers turn it into PC_ENOMEM.
 *
 * Thread rule: all functions are thread-safe.
 */
#ifndef PC_ALLOC_H
#define PC_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PC_MEM_TAG_MAP(XX)                                         \
    XX(ROWS, "rows")       /* table weights and optimizer state */ \
    XX(KEYS, "keys")       /* table keys and per-row metadata */   \
    XX(INDEX, "index")     /* table hash indexes */                \
    XX(SKETCH, "sketch")   /* admission sketches */                \
    XX(SCRATCH, "scratch") /* per-call temporary buffers */        \
    XX(MODEL, "model")     /* a worker's dense model and step */   \
    XX(BATCH, "batch")     /* a worker's batches in flight */      \
    XX(CLIENT, "client")   /* libpsclient's calls and buffers */   \
    XX(OTHER, "other")

typedef enum {
#define PC__MEM_ENUM(name, str) PC_MEM_##name,
    PC_MEM_TAG_MAP(PC__MEM_ENUM)
#undef PC__MEM_ENUM
        PC_MEM_NTAGS
} pc_mem_tag_t;

void *pc_malloc(pc_mem_tag_t tag, size_t size);
void *pc_calloc(pc_mem_tag_t tag, size_t count, size_t size);
/* Like realloc; old_size must be the size `p` was allocated with. On failure `p` stays valid. */
void *pc_realloc(pc_mem_tag_t tag, void *p, size_t old_size, size_t new_size);
/* Free `p` (NULL is a no-op); size must be what it was allocated with. */
void pc_free(pc_mem_tag_t tag, void *p, size_t size);

/* Self-sized: like malloc, calloc (zeroed), realloc (p NULL: a new block under tag; else the
 * block keeps its tag) and free (NULL: nothing). Blocks are 16-byte aligned. */
void *pc_smalloc(pc_mem_tag_t tag, size_t size);
void *pc_scalloc(pc_mem_tag_t tag, size_t count, size_t size);
void *pc_srealloc(pc_mem_tag_t tag, void *p, size_t size);
void pc_sfree(void *p);
/* Append x to the self-sized array *v of *n values (room for *cap; doubled from 4096 when full,
 * under PC_MEM_SCRATCH). false when out of memory (*v, *n and *cap unchanged). */
bool pc_sappend_u64(uint64_t **v, size_t *n, size_t *cap, uint64_t x);

/* Zero-filled, page-aligned mapping of `size` bytes (size > 0). */
void *pc_vm_alloc(pc_mem_tag_t tag, size_t size);
/* Grow or shrink a pc_vm_alloc mapping; contents up to min(old, new) are kept, the region may
 * move. On failure returns NULL and `p` stays valid. */
void *pc_vm_resize(pc_mem_tag_t tag, void *p, size_t old_size, size_t new_size);
void pc_vm_free(pc_mem_tag_t tag, void *p, size_t size);
/* Ask for transparent huge pages on [p, p + size) and collapse the already touched prefix
 * [p, p + used) into huge pages now; advisory, errors ignored. */
void pc_vm_advise_huge(void *p, size_t size, size_t used);
/* Fault [p, p + size) of a pc_vm_* mapping in now, writable (huge pages where advised), for a
 * region about to be written all over; advisory, errors ignored (before Linux 5.14: faults stay
 * lazy). */
void pc_vm_populate(void *p, size_t size);

/* Fault injection for tests (SQLite style): after `n` more successful allocations through this
 * module, every allocation fails until pc_mem_fail_after(-1). Process-wide; tests only. */
void pc_mem_fail_after(long n);
/* Successful allocations left before injected failures start (0: failing now, -1: off). */
long pc_mem_fail_remaining(void);

/* Bytes currently allocated under `tag`. */
uint64_t pc_mem_used(pc_mem_tag_t tag);
/* Tag name ("rows"), or "unknown". */
const char *pc_mem_tag_name(pc_mem_tag_t tag);

#endif
