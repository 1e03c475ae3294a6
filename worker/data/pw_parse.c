/* pw_parse.c: see pw_parse.h. Hand-rolled scanners (no strtod on the hot path for integers and
 * hex, no copies of the line): parsing must keep up with training. */
#include "pw_parse.h"

#include "pc_error.h"
#include "pc_feature.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const pw_format_names[] = {"criteo", "libsvm", "libffm", "csv", NULL};

int pw_format_parse(const char *name, pw_format_t *out) {
    for (int i = 0; pw_format_names[i]; i++)
        if (strcmp(name, pw_format_names[i]) == 0) {
            *out = (pw_format_t)i;
            return 0;
        }
    return PC_EINVAL;
}

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return PC_EPARSE;
}

/* At most 40 bytes of [p, e) for a message: its length for "%.*s", and "..." when cut. */
#define SHOW_MAX 40
static int show_len(const char *p, const char *e) {
    return e - p > SHOW_MAX ? SHOW_MAX : (int)(e - p);
}
static const char *show_more(const char *p, const char *e) {
    return e - p > SHOW_MAX ? "..." : "";
}

/* A decimal integer in [p, e) (optional sign); false when empty, malformed or over 18 digits. */
static bool scan_int(const char *p, const char *e, int64_t *out) {
    bool neg = false;
    if (p < e && (*p == '-' || *p == '+'))
        neg = *p++ == '-';
    if (p == e || e - p > 18)
        return false;
    int64_t v = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (*p - '0');
    }
    *out = neg ? -v : v;
    return true;
}

/* 1-8 hex digits in [p, e). */
static bool scan_hex32(const char *p, const char *e, uint32_t *out) {
    if (p == e || e - p > 8)
        return false;
    uint32_t v = 0;
    for (; p < e; p++) {
        const char c = *p;
        uint32_t d = c >= '0' && c <= '9'   ? (uint32_t)(c - '0')
                     : c >= 'a' && c <= 'f' ? (uint32_t)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (uint32_t)(c - 'A' + 10)
                                            : 16u;
        if (d == 16)
            return false;
        v = v << 4 | d;
    }
    *out = v;
    return true;
}

/* A finite number in [p, e) (strtod on a bounded copy). */
static bool scan_float(const char *p, const char *e, float *out) {
    char buf[64];
    const size_t n = (size_t)(e - p);
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    char *end;
    double v = strtod(buf, &end);
    if (*end || !isfinite(v) || fabs(v) > 3.4e38)
        return false;
    *out = (float)v;
    return true;
}

/* log1p of small counts from a table (most Criteo counts are small); built once. */
#define LOG1P_TABLE 4096
static float g_log1p[LOG1P_TABLE];
static pthread_once_t g_log1p_once = PTHREAD_ONCE_INIT;

static void log1p_init(void) {
    for (int i = 0; i < LOG1P_TABLE; i++)
        g_log1p[i] = (float)log1p((double)i);
}

static inline float count_feature(int64_t v) {
    if (v <= 0)
        return 0.0f;
    return v < LOG1P_TABLE ? g_log1p[v] : (float)log1p((double)v);
}

static int parse_criteo(const char *p, const char *e, pw_sample_t *s, char *err, size_t el) {
    const char *f[1 + PW_CRITEO_DENSE + PW_CRITEO_CAT + 1];
    int nf = 0;
    f[nf++] = p;
    for (const char *q = p; (q = memchr(q, '\t', (size_t)(e - q))); q++) {
        if (nf == 1 + PW_CRITEO_DENSE + PW_CRITEO_CAT) { /* count the rest, for the message */
            for (; q; q = memchr(q + 1, '\t', (size_t)(e - q - 1)))
                nf++;
            break;
        }
        f[nf++] = q + 1;
    }
    if (nf != 1 + PW_CRITEO_DENSE + PW_CRITEO_CAT)
        return fail(err, el, "expected 40 tab-separated fields, got %d", nf);
    f[nf] = e + 1; /* field i spans f[i] .. f[i + 1] - 1 */
    int64_t v;
    if (!scan_int(f[0], f[1] - 1, &v) || (v != 0 && v != 1))
        return fail(err, el, "label is not 0 or 1");
    s->label = (float)v;
    s->ndense = PW_CRITEO_DENSE;
    for (int i = 0; i < PW_CRITEO_DENSE; i++) {
        const char *a = f[1 + i], *b = f[2 + i] - 1;
        if (a == b) {
            s->dense[i] = 0;
            continue;
        }
        if (!scan_int(a, b, &v))
            return fail(err, el, "integer field %d is not an integer", i + 1);
        s->dense[i] = count_feature(v);
    }
    s->nkeys = PW_CRITEO_CAT;
    for (int i = 0; i < PW_CRITEO_CAT; i++) {
        const char *a = f[1 + PW_CRITEO_DENSE + i], *b = f[2 + PW_CRITEO_DENSE + i] - 1;
        uint32_t h;
        if (a == b)
            s->keys[i] = pc_missing_key((uint32_t)i);
        else if (scan_hex32(a, b, &h))
            s->keys[i] = pc_feature_key((uint32_t)i, h);
        else
            return fail(err, el, "categorical field %d is not 1-8 hex digits", i + 1);
        s->field[i] = (uint16_t)i;
        s->val[i] = 1.0f;
    }
    return 0;
}

/* libsvm (ffm = false) or libffm: label, then space-separated [field:]idx:val items. */
static int parse_svm(const char *p, const char *e, bool ffm, pw_sample_t *s, char *err, size_t el) {
    while (p < e && (*p == ' ' || *p == '\t'))
        p++;
    const char *q = p;
    while (q < e && *q != ' ' && *q != '\t')
        q++;
    float label;
    if (!scan_float(p, q, &label))
        return fail(err, el, "expected a number as the label, got '%.*s%s'", show_len(p, q), p,
                    show_more(p, q));
    s->label = label > 0 ? 1.0f : 0.0f;
    s->ndense = 0;
    s->nkeys = 0;
    for (p = q; p < e;) {
        while (p < e && (*p == ' ' || *p == '\t'))
            p++;
        if (p == e)
            break;
        q = p;
        while (q < e && *q != ' ' && *q != '\t')
            q++;
        /* item [p, q): split at ':' */
        const char *c1 = memchr(p, ':', (size_t)(q - p));
        const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(q - c1 - 1)) : NULL;
        if (!c1 || (ffm && !c2) || (!ffm && c2))
            return fail(err, el, "feature %u: expected %s, got '%.*s%s'", s->nkeys + 1,
                        ffm ? "field:idx:val" : "idx:val", show_len(p, q), p, show_more(p, q));
        int64_t field = 0, idx;
        const char *ib = p, *ie = c1, *vb = c1 + 1;
        if (ffm) {
            if (!scan_int(p, c1, &field) || field < 0 || field >= PW_FIELDS_MAX)
                return fail(err, el, "field out of range 0..%d", PW_FIELDS_MAX - 1);
            ib = c1 + 1;
            ie = c2;
            vb = c2 + 1;
        }
        float val;
        if (!scan_int(ib, ie, &idx) || idx < 0)
            return fail(err, el, "feature index is not a non-negative integer");
        if (!scan_float(vb, q, &val))
            return fail(err, el, "feature value is not a finite number");
        if (s->nkeys == PW_KEYS_MAX) {
            if (err && el)
                snprintf(err, el, "more than %d features", PW_KEYS_MAX);
            return PC_ETOOBIG;
        }
        s->keys[s->nkeys] = pc_feature_key((uint32_t)field, (uint64_t)idx);
        s->field[s->nkeys] = (uint16_t)field;
        s->val[s->nkeys] = val;
        s->nkeys++;
        p = q;
    }
    return 0;
}

/* ==== CSV ================================================================================= */

static bool sep_name(const char *v, char *out) {
    static const struct {
        const char *name;
        char c;
    } k[] = {{"comma", ','}, {"tab", '\t'},  {"semicolon", ';'},
             {"pipe", '|'},  {"space", ' '}, {"colon", ':'}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(v, k[i].name) == 0) {
            *out = k[i].c;
            return true;
        }
    return false;
}

static int spec_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return PC_EINVAL;
}

static int spec_columns(char *v, pw_csv_spec_t *o, char *err, size_t el) {
    static const char *const kinds[] = {"skip", "label", "cat", "cats", "num", "log"};
    int labels = 0;
    for (char *save = NULL, *t = strtok_r(v, ":", &save); t; t = strtok_r(NULL, ":", &save)) {
        if (o->ncols == PW_CSV_COLS_MAX)
            return spec_fail(err, el, "more than %d columns", PW_CSV_COLS_MAX);
        int k = -1;
        for (int i = 0; i < 6; i++)
            if (strcmp(t, kinds[i]) == 0)
                k = i;
        if (k < 0)
            return spec_fail(err, el, "column kind '%s' (label|cat|cats|num|log|skip)", t);
        o->col[o->ncols++] = (uint8_t)k;
        labels += k == PW_COL_LABEL;
        o->ncat += k == PW_COL_CAT || k == PW_COL_CATS;
        o->nnum += k == PW_COL_NUM || k == PW_COL_LOG;
    }
    if (labels != 1)
        return spec_fail(err, el, "columns need exactly one label");
    if (o->ncat + o->nnum == 0)
        return spec_fail(err, el, "columns need at least one cat, cats, num or log column");
    if (o->ncat > PW_FIELDS_MAX || o->nnum > PW_DENSE_MAX)
        return spec_fail(err, el, "over %d categorical or %d numeric columns", PW_FIELDS_MAX,
                         PW_DENSE_MAX);
    return 0;
}

int pw_csv_spec_parse(const char *text, pw_csv_spec_t *out, char *err, size_t errlen) {
    pw_csv_spec_t o = {.sep = ',', .multi_sep = '|', .threshold = 0.5f};
    char buf[2048];
    if (!text || strlen(text) >= sizeof buf)
        return spec_fail(err, errlen, "spec missing or over %zu bytes", sizeof buf - 1);
    strcpy(buf, text);
    int rc = 0;
    for (char *save = NULL, *it = strtok_r(buf, ",", &save); it && !rc;
         it = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(it, '=');
        if (!eq) {
            rc = spec_fail(err, errlen, "'%s' is not name=value", it);
            break;
        }
        *eq = '\0';
        const char *v = eq + 1;
        char *end;
        if (strcmp(it, "columns") == 0) {
            rc = o.ncols ? spec_fail(err, errlen, "columns given twice%s", "")
                         : spec_columns(eq + 1, &o, err, errlen);
        } else if (strcmp(it, "threshold") == 0) {
            double t = strtod(v, &end);
            if (*end || !*v || !isfinite(t))
                rc = spec_fail(err, errlen, "threshold '%s' is not a number", v);
            o.threshold = (float)t;
        } else if (strcmp(it, "header") == 0) {
            if (strcmp(v, "0") && strcmp(v, "1"))
                rc = spec_fail(err, errlen, "header is 0 or 1");
            o.header = v[0] == '1';
        } else if (strcmp(it, "sep") == 0) {
            if (!sep_name(v, &o.sep))
                rc = spec_fail(err, errlen, "sep '%s' (comma|tab|semicolon|pipe|space|colon)", v);
        } else if (strcmp(it, "multi_sep") == 0) {
            if (!sep_name(v, &o.multi_sep))
                rc = spec_fail(err, errlen, "multi_sep '%s' (pipe|semicolon|space|comma|colon)", v);
        } else {
            rc = spec_fail(err, errlen, "unknown CSV setting '%s'", it);
        }
    }
    if (!rc && o.ncols == 0)
        rc = spec_fail(err, errlen, "columns=... is required");
    if (!rc && o.multi_sep == o.sep)
        rc = spec_fail(err, errlen, "multi_sep equals sep");
    if (!rc)
        *out = o;
    return rc;
}

/* The CSV cell at *p in [*p, e): its value [*vb, *ve) (quotes removed; doubled quotes kept as
 * they are, which is fine for hashing). *p moves past the separator; *more tells whether a
 * separator followed (another cell comes). False on a broken quote, or (comma-separated) a quote
 * in an unquoted cell. A quoted value cannot hold a line break (lines are read one by one). */
static bool csv_cell(const char **p, const char *e, char sep, const char **vb, const char **ve,
                     bool *more) {
    const char *q = *p;
    if (q < e && *q == '"') {
        const char *c = q + 1;
        for (;; c++) {
            if (c >= e)
                return false;
            if (*c == '"') {
                if (c + 1 < e && c[1] == '"') {
                    c++;
                    continue;
                }
                break;
            }
        }
        *vb = q + 1;
        *ve = c++;
        if (c < e && *c != sep)
            return false;
        *more = c < e;
        *p = *more ? c + 1 : e;
        return true;
    }
    const char *c = memchr(q, sep, (size_t)(e - q));
    *vb = q;
    *ve = c ? c : e;
    if (sep == ',' && memchr(q, '"', (size_t)(*ve - q)))
        return false; /* a quote inside an unquoted cell of comma-separated values (RFC 4180:
                       * none; it is where a quoted value's line break, which a line reader
                       * cannot see, leaves a cell); other separators' data may hold 12" */
    *more = c != NULL;
    *p = c ? c + 1 : e;
    return true;
}

static bool csv_key(pw_sample_t *s, uint32_t field, const char *a, const char *b) {
    if (s->nkeys == PW_KEYS_MAX)
        return false;
    s->keys[s->nkeys] = a == b ? pc_missing_key(field) : pc_text_key(field, a, (size_t)(b - a));
    s->field[s->nkeys] = (uint16_t)field;
    s->val[s->nkeys] = 1.0f;
    s->nkeys++;
    return true;
}

static int parse_csv(const pw_csv_spec_t *sp, const char *p, const char *e, pw_sample_t *s,
                     char *err, size_t el) {
    s->nkeys = 0;
    s->ndense = (uint32_t)sp->nnum;
    uint32_t field = 0, dense = 0;
    int col = 0;
    for (bool more = true; more; col++) {
        const char *a, *b;
        if (col == sp->ncols) { /* count the rest, for the message */
            for (; more; col++)
                if (!csv_cell(&p, e, sp->sep, &a, &b, &more))
                    break;
            return fail(err, el, "expected %d columns, got %s%d", sp->ncols, more ? "over " : "",
                        col);
        }
        if (!csv_cell(&p, e, sp->sep, &a, &b, &more))
            return fail(err, el,
                        "column %d: a broken quote (unterminated, or inside an unquoted "
                        "value)",
                        col + 1);
        float v;
        switch ((pw_col_t)sp->col[col]) {
            case PW_COL_SKIP:
                break;
            case PW_COL_LABEL:
                if (!scan_float(a, b, &v))
                    return fail(err, el, "label (column %d) is not a number", col + 1);
                s->label = v >= sp->threshold ? 1.0f : 0.0f;
                break;
            case PW_COL_NUM:
            case PW_COL_LOG:
                if (a == b) {
                    v = 0;
                } else if (!scan_float(a, b, &v)) {
                    return fail(err, el, "column %d is not a finite number", col + 1);
                } else if (sp->col[col] == PW_COL_LOG) {
                    v = v > 0 ? (float)log1p(v) : 0.0f;
                }
                s->dense[dense++] = v;
                break;
            case PW_COL_CAT:
                if (!csv_key(s, field, a, b))
                    goto too_many;
                field++;
                break;
            case PW_COL_CATS:
                for (const char *x = a; x < b;) {
                    const char *y = memchr(x, sp->multi_sep, (size_t)(b - x));
                    if (!y)
                        y = b;
                    if (y > x && !csv_key(s, field, x, y))
                        goto too_many;
                    x = y + 1;
                }
                field++;
                break;
        }
    }
    if (col != sp->ncols)
        return fail(err, el, "expected %d columns, got %d", sp->ncols, col);
    return 0;
too_many:
    if (err && el)
        snprintf(err, el, "more than %d features", PW_KEYS_MAX);
    return PC_ETOOBIG;
}

void pw_format_shape(pw_format_t fmt, const pw_csv_spec_t *csv, int *nfields, int *ndense) {
    switch (fmt) {
        case PW_FMT_CRITEO:
            *nfields = PW_CRITEO_CAT;
            *ndense = PW_CRITEO_DENSE;
            return;
        case PW_FMT_CSV:
            *nfields = csv ? csv->ncat : 0;
            *ndense = csv ? csv->nnum : 0;
            return;
        case PW_FMT_LIBSVM:
            *nfields = 1;
            *ndense = 0;
            return;
        case PW_FMT_LIBFFM:
            break;
    }
    *nfields = 0;
    *ndense = 0;
}

int pw_parse_line(pw_format_t fmt, const pw_csv_spec_t *csv, const char *line, size_t len,
                  pw_sample_t *s, char *err, size_t errlen) {
    if (len && line[len - 1] == '\n')
        len--;
    if (len && line[len - 1] == '\r')
        len--;
    if (memchr(line, '\0', len))
        return fail(err, errlen, "NUL byte in line");
    const char *e = line + len;
    pthread_once(&g_log1p_once, log1p_init);
    switch (fmt) {
        case PW_FMT_CRITEO:
            return parse_criteo(line, e, s, err, errlen);
        case PW_FMT_LIBSVM:
            return parse_svm(line, e, false, s, err, errlen);
        case PW_FMT_LIBFFM:
            return parse_svm(line, e, true, s, err, errlen);
        case PW_FMT_CSV:
            if (!csv)
                return fail(err, errlen, "CSV without a column spec");
            return parse_csv(csv, line, e, s, err, errlen);
    }
    return PC_EINVAL;
}
