/* pc_feature.h: feature keys, how a categorical value of a field becomes a 64-bit table key.
 *
 * Every component that names a row by its feature (the parsers of worker/data, psctl's lookup
 * by field and value, tests) derives the key here, so that a worker, a tool and a server agree
 * bit for bit on which row a value owns.
 *
 * DESIGN: a value is a 64-bit number (Criteo's 8 hex digits, a libsvm/libffm index) or a byte
 * string (CSV categoricals), which is first hashed to a number with pc_hash64 and
 * PC_HASH_SEED_FEATURE. The number is mixed with a salt made of the field, (field + 1) times
 * the 64-bit golden ratio, whose high 32 bits differ between fields so that 32-bit values of
 * different fields never collide; one XXH3 hash (pc_hash_u64, PC_HASH_SEED_FEATURE) of the
 * salted value is the key. A field's empty value gets its own key, that of the value 2^40, which
 * no 32-bit categorical can take.
 * These keys are a stable format: they are stored in checkpoints and exported tables, so a model
 * trained by one version must find its rows in the next. Never change the functions, the salt
 * or the seed; a new derivation needs a new function.
 *
 * Thread rule: pure functions, thread-safe.
 */
#ifndef PC_FEATURE_H
#define PC_FEATURE_H

#include <stddef.h>
#include <stdint.h>

/* Fields are numbered 0..PC_FEATURE_FIELDS_MAX-1 by every parser and tool (a sample stores its
 * fields in 16 bits); the key functions themselves take any field. */
#define PC_FEATURE_FIELDS_MAX 1024

/* The key of value `value` of field `field` (Criteo categoricals are 32-bit values). */
uint64_t pc_feature_key(uint32_t field, uint64_t value);

/* The key of a categorical value given as bytes (CSV): value[0..len) is hashed first, then keyed
 * as pc_feature_key. `value` is borrowed for the call and need not be terminated. */
uint64_t pc_text_key(uint32_t field, const char *value, size_t len);

/* The key of field `field` left empty (one per field: one-embedding-per-field models need it). */
uint64_t pc_missing_key(uint32_t field);

#endif
