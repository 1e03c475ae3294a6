/* pw_unique.h: the unique keys of a batch, in first-seen order, with each feature's index among
 * them. A step pulls and pushes one row per unique key (pw_step.h); the reader can compute them
 * as it fills a batch (pw_reader_opts_t.dedup), off the training thread.
 *
 * DESIGN: open addressing over a power-of-two table at least twice the batch's feature count,
 * keyed by pc_hash_u64 with its own seed; the table is kept between calls (it grows to the
 * largest batch) and cleared per batch. The order of ukeys is a function of the keys alone, so
 * every caller (reader or trainer) gives the same rows in the same order.
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
} pw_unique_t;

/* keys[0..nk) -> ukeys[0..*nu) and inv[j] = the index of keys[j] in ukeys (ukeys and inv hold
 * nk). PC_ENOMEM. */
int pw_unique(pw_unique_t *u, const uint64_t *keys, size_t nk, uint64_t *ukeys, uint32_t *inv,
              size_t *nu);
void pw_unique_free(pw_unique_t *u);

#endif
