/* pw_parse.h: one sample per text line, in the formats training streams come in.
 *
 *   Criteo TSV  label <TAB> 13 integer fields <TAB> 26 categorical fields (8 hex digits); any
 *               integer or categorical field may be empty; CRLF line endings are accepted.
 *   libsvm      label idx:val idx:val ...          (all features in field 0)
 *   libffm      label field:idx:val ...
 *   CSV         columns as a column spec says (pw_csv_spec_t): which column is the label (and
 *               its threshold), which are categorical (single- or multi-valued), numeric or
 *               skipped; a header line; RFC 4180 quoting ("a,b" and "" inside quotes).
 *
 * Labels: Criteo 0/1; libsvm/libffm any number, positive when > 0 (so -1/+1 and 0/1 both work).
 * Categorical values become 64-bit keys by hashing (field, value) (pc_feature_key and
 * pc_text_key, common/pc_feature.h), so equal values of different fields never share a row.
 * Criteo specifics: an empty categorical field gets its field's "missing" key (pc_missing_key:
 * every field has exactly one key, as one-embedding-per-field models expect); integer fields x
 * become log1p(max(x, 0)) (counts; the few negative values of the public data are treated as 0),
 * empty ones 0.
 *
 * Errors: PC_EPARSE with a reason in err for anything malformed (field count, non-hex or long
 * categorical, non-numeric label or value, NaN/Inf, index or field out of range), PC_ETOOBIG
 * over PW_KEYS_MAX features. A rejected line leaves *s unspecified; nothing else is affected.
 *
 * Thread rule: pure functions.
 */
#ifndef PW_PARSE_H
#define PW_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_feature.h"

#define PW_DENSE_MAX    64
#define PW_KEYS_MAX     4096
#define PW_FIELDS_MAX   PC_FEATURE_FIELDS_MAX
#define PW_CRITEO_DENSE 13
#define PW_CRITEO_CAT   26

typedef enum { PW_FMT_CRITEO, PW_FMT_LIBSVM, PW_FMT_LIBFFM, PW_FMT_CSV } pw_format_t;

#define PW_CSV_COLS_MAX 256

/* What each CSV column is. CAT: one categorical value (any bytes, hashed; empty: the field's
 * missing key). CATS: several values split at multi_sep (empty: no feature), all in the
 * column's field, to be pooled by the model. NUM: a number (empty: 0). LOG: a count,
 * log1p(max(x, 0)). LABEL: a number, positive when >= threshold. Categorical columns get fields
 * 0, 1, ... and numeric columns dense slots 0, 1, ... in column order. */
typedef enum {
    PW_COL_SKIP,
    PW_COL_LABEL,
    PW_COL_CAT,
    PW_COL_CATS,
    PW_COL_NUM,
    PW_COL_LOG
} pw_col_t;

typedef struct pw_csv_spec {
    char sep, multi_sep;
    bool header;     /* each source's first line is a header (skipped, not counted) */
    float threshold; /* label >= threshold is positive */
    int ncols, ncat, nnum;
    uint8_t col[PW_CSV_COLS_MAX]; /* pw_col_t */
} pw_csv_spec_t;

/* Parse a spec: comma-separated name=value items:
 *   columns=KIND:KIND:...   kinds label|cat|cats|num|log|skip, one per column (required, one
 *                           label, at least one feature column)
 *   threshold=X (default 0.5), header=0|1 (default 0),
 *   sep=comma|tab|semicolon|pipe|space (default comma), multi_sep=pipe|semicolon|space|comma|
 *   colon (default pipe).
 * MovieLens ratings: "header=1,threshold=4,columns=cat:cat:label:skip". PC_EINVAL with a reason
 * in err otherwise. */
int pw_csv_spec_parse(const char *text, pw_csv_spec_t *out, char *err, size_t errlen);

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

/* Parse format `fmt` from line[0..len) (no terminator needed; a trailing "\n" or "\r\n" is
 * ignored). `csv` is the column spec for PW_FMT_CSV and ignored otherwise. */
int pw_parse_line(pw_format_t fmt, const pw_csv_spec_t *csv, const char *line, size_t len,
                  pw_sample_t *s, char *err, size_t errlen);

/* The categorical fields and dense values every sample of a stream has: Criteo 26/13, CSV from
 * its spec, libsvm 1/0; libffm 0/0 (fields come with the data: the model must be told). */
void pw_format_shape(pw_format_t fmt, const pw_csv_spec_t *csv, int *nfields, int *ndense);

/* The formats' names, indexed by pw_format_t, NULL-terminated (an enum setting's choices). */
extern const char *const pw_format_names[];

/* "criteo" | "libsvm" | "libffm" | "csv" -> format; PC_EINVAL otherwise. */
int pw_format_parse(const char *name, pw_format_t *out);

#endif
