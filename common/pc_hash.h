/* pc_hash.h: 64-bit hashing for EmberPS, on top of xxHash (XXH3) from Debian's libxxhash.
 *
 * Every component that hashes a feature id, a key or a byte string goes through these functions
 * so that workers, servers and tools agree bit for bit. Seeds name the purpose of a hash so that
 * different uses (slot mapping, table index, initializers, sketches) are independent.
 *
 * Thread rule: pure functions, thread-safe.
 */
#ifndef PC_HASH_H
#define PC_HASH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Seeds, one per purpose. Changing one changes data placement: they are part of the format. */
#define PC_HASH_SEED_SLOT    UINT64_C(0x736c6f745f6d6170) /* key -> cluster slot */
#define PC_HASH_SEED_INDEX   UINT64_C(0x7461626c655f6978) /* key -> table shard/bucket */
#define PC_HASH_SEED_SKETCH  UINT64_C(0x736b657463685f31) /* key -> admission sketch */
#define PC_HASH_SEED_FEATURE UINT64_C(0x666561747572655f) /* (field, value) -> feature key */
#define PC_HASH_SEED_DEDUP   UINT64_C(0x64656475705f6b79) /* key -> a batch's unique-key map */
#define PC_HASH_SEED_ROUND   UINT64_C(0x726f756e645f7372) /* (key, update) -> rounding bits */
#define PC_HASH_SEED_DEVICE  UINT64_C(0x6465766963655f69) /* a GPU's identity (the trainer) */

/* Hash of an arbitrary byte string. `data` is borrowed for the call. */
static inline uint64_t pc_hash64(const void *data, size_t len, uint64_t seed) {
    return XXH3_64bits_withSeed(data, len, seed);
}

/* Hash of one 64-bit key (its little-endian bytes). */
static inline uint64_t pc_hash_u64(uint64_t key, uint64_t seed) {
    return XXH3_64bits_withSeed(&key, sizeof key, seed);
}

/* Map a 32-bit hash uniformly onto [0, n) without division (Lemire's multiply-shift). */
static inline uint32_t pc_hash_range(uint32_t h, uint32_t n) {
    return (uint32_t)(((uint64_t)h * n) >> 32);
}

#endif
