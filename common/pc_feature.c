/* pc_feature.c: feature keys (see pc_feature.h for the format, which must never change). */
#include "pc_feature.h"

#include "pc_hash.h"

uint64_t pc_feature_key(uint32_t field, uint64_t value) {
    /* One hash per key: the field enters as a multiplicative salt whose high 32 bits differ
     * between fields, so 32-bit values (Criteo) of different fields can never meet. */
    const uint64_t salt = (uint64_t)(field + 1) * UINT64_C(0x9E3779B97F4A7C15);
    return pc_hash_u64(value ^ salt, PC_HASH_SEED_FEATURE);
}

uint64_t pc_text_key(uint32_t field, const char *value, size_t len) {
    return pc_feature_key(field, pc_hash64(value, len, PC_HASH_SEED_FEATURE));
}

uint64_t pc_missing_key(uint32_t field) {
    /* A value no 32-bit categorical can take. */
    return pc_feature_key(field, UINT64_C(1) << 40);
}
