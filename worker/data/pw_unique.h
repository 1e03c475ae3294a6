/* pw_unique.h: the unique keys of a batch, in first-seen order, with each feature's index among
 * them. A step pulls and pushes one row per unique key (pw_step.h); the reader can compute them
 * as it fills a batch (pw_reader_opts_t.dedup), off the training thread.
 *
 * DESIGN: open addressing over a power-of-two table at least twice the batch's feature count,
 * keyed by pc_hash_u64 with its own seed; the table is kept between calls (it grows to the
 * largest batch) and cleared per batch. The order of ukeys is a function of the keys alone, so
 * every caller (reader or trainer) gives the same rows in the same order.
 *
 * The same table answers membership afterwards (pw_unique_find_many): the trainer keeps one per
 * slot, over the slot's unique keys (pw_unique_index), to split the next batch's keys into
 * those the last step pushes and those it does not (docs/training.md "A lone worker's pulls").
 *
 * Thread rule: a pw_unique_t is used by one thread at a time.
 */
#ifndef PW_UNIQUE_H
#define PW_UNIQUE_H

#include <stddef.h>
#include <stdint.h>

typedef struct pw_unique {
    uint32_t *tab; /* open addressing: index + 1 into ukeys, 0 empty */
    size_t cap;
    size_t mask; /* the part in use: a power of two minus 1 (0: none yet) */
} pw_unique_t;

/* keys[0..nk) -> ukeys[0..*nu) and inv[j] = the index of keys[j] in ukeys (ukeys and inv hold
 * nk). PC_ENOMEM. */
int pw_unique(pw_unique_t *u, const uint64_t *keys, size_t nk, uint64_t *ukeys, uint32_t *inv,
              size_t *nu);
/* Index the distinct keys ukeys[0..n) (kept, not copied: pw_unique_find_many reads them).
 * PC_ENOMEM; PC_EINVAL when two are equal. */
int pw_unique_index(pw_unique_t *u, const uint64_t *ukeys, size_t n);
#define PW_UNIQUE_NONE UINT32_MAX
/* idx[i] = the index of keys[i] in the ukeys of the last pw_unique or pw_unique_index call, or
 * PW_UNIQUE_NONE, for i < n (a batch: the lookups' misses overlap). */
void pw_unique_find_many(const pw_unique_t *u, const uint64_t *ukeys, const uint64_t *keys,
                         size_t n, uint32_t *idx);
void pw_unique_free(pw_unique_t *u);

#endif
