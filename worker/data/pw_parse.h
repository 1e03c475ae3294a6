/* pw_parse.h: one sample per text line, in the formats training streams come in.
 *
 *   Criteo TSV  label <TAB> 13 integer fields <TAB> 26 categorical fields (8 hex digits); any
 *               integer or categorical field may be empty; CRLF line endings are accepted.
 *   libsvm      label idx:val idx:val ...          (all features in field 0)
 *   libffm      label field:idx:val ...
 *
 * Labels: Criteo 0/1; libsvm/libffm any number, positive when > 0 (so -1/+1 and 0/1 both work).
 * Categorical values become 64-bit keys by hashing (field, value) (pw_feature_key), so equal
 * values of different fields never share a row. Criteo specifics: an empty categorical field
 * gets its field's "missing" key (every field has exactly one key, as one-embedding-per-field
 * models expect); integer fields x become log1p(max(x, 0)) (counts; the few negative values of
 * the public data are treated as 0), empty ones 0.
 *
 * Errors: PC_EPARSE with a reason in err for anything malformed (field count, non-hex or long
 * categorical, non-numeric label or value, NaN/Inf, index or field out of range), PC_ETOOBIG
 * over PW_KEYS_MAX features. A rejected line leaves *s unspecified; nothing else is affected.
 *
 * Thread rule: pure functions.
 */
#ifndef PW_PARSE_H
#define PW_PARSE_H

#include <stddef.h>
#include <stdint.h>

#define PW_DENSE_MAX    64
#define PW_KEYS_MAX     4096
#define PW_FIELDS_MAX   1024
#define PW_CRITEO_DENSE 13
#define PW_CRITEO_CAT   26

typedef enum { PW_FMT_CRITEO, PW_FMT_LIBSVM, PW_FMT_LIBFFM } pw_format_t;

/* One parsed sample. keys[i] belongs to field[i] with value val[i] (1 for Criteo); keys are in
 * field order as they appeared in the line. */
typedef struct pw_sample {
    float label;
    uint32_t ndense, nkeys;
    float dense[PW_DENSE_MAX];
    uint64_t keys[PW_KEYS_MAX];
    uint16_t field[PW_KEYS_MAX];
    float val[PW_KEYS_MAX];
} pw_sample_t;

/* The key of value `value` of field `field`. */
uint64_t pw_feature_key(uint32_t field, uint64_t value);
/* The key of a Criteo categorical field left empty. */
uint64_t pw_missing_key(uint32_t field);

/* Parse format `fmt` from line[0..len) (no terminator needed; a trailing "\n" or "\r\n" is
 * ignored). */
int pw_parse_line(pw_format_t fmt, const char *line, size_t len, pw_sample_t *s, char *err,
                  size_t errlen);

/* "criteo" | "libsvm" | "libffm" -> format; PC_EINVAL otherwise. */
int pw_format_parse(const char *name, pw_format_t *out);

#endif
