/* pw_model_card.c: see pw_model_card.h. The card's lines are one table (k_lines: name and kind);
 * writing formats each line from the card, reading fills the card from each line and then checks
 * the whole (card_check, shared with writing). */
#include "pw_model_card.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pc_log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- widths ---- */

/* "64,16" -> widths (1 .. PW_MLP_MAX of them, each 1 .. 65536). */
static bool widths_parse(const char *s, int *out, int *n) {
    *n = 0;
    bool ok = *s != '\0';
    for (const char *p = s; ok && *p;) {
        char *end;
        const long v = strtol(p, &end, 10);
        ok = end != p && v >= 1 && v <= 65536 && *n < PW_MLP_MAX && (!*end || *end == ',') &&
             !(*end == ',' && !end[1]);
        if (ok)
            out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return ok;
}

/* widths -> "64,16" ("-" when there are none). */
static void widths_text(const int *w, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", w[i]);
    if (n == 0)
        snprintf(buf, cap, "-");
}

/* ---- from the trainer's settings ---- */

int pw_model_card_from_config(const pw_train_config_t *c, pw_format_t fmt, pw_model_card_t *out) {
    memset(out, 0, sizeof *out);
    out->format = fmt;
    pw_csv_spec_t spec;
    char err[256];
    if (fmt == PW_FMT_CSV) {
        if (pw_csv_spec_parse(c->csv, &spec, err, sizeof err)) {
            PC_ERROR("train: --csv: %s", err);
            return PC_EINVAL;
        }
        snprintf(out->csv, sizeof out->csv, "%s", c->csv);
    }
    int nf, ndense;
    pw_format_shape(fmt, fmt == PW_FMT_CSV ? &spec : NULL, &nf, &ndense);
    pw_model_config_t *mc = &out->model;
    *mc = (pw_model_config_t){.ndense = ndense ? ndense : 1, /* none: a constant 1 stands in */
                              .nfields = c->fields ? (int)c->fields : nf,
                              .dim = (int)c->dim,
                              .mean = c->pooling == PW_POOL_MEAN,
                              .max_batch = (int)c->batch,
                              .seed = (uint64_t)c->seed};
    snprintf(mc->name, sizeof mc->name, "%s", c->model);
    out->ndense = ndense;
    snprintf(out->table_name, sizeof out->table_name, "%s", c->table_name);
    const pw_model_ops_t *ops;
    int rc = pw_model_find(c->model, &ops);
    if (rc)
        return rc;
    const char *bad = !widths_parse(c->bottom, mc->bottom, &mc->nbottom) ? "bottom"
                      : !widths_parse(c->top, mc->top, &mc->ntop)        ? "top"
                                                                         : NULL;
    if (bad) {
        PC_ERROR("train: --%s=%s: 1 to %d widths from 1 to 65536, comma-separated", bad,
                 strcmp(bad, "bottom") == 0 ? c->bottom : c->top, PW_MLP_MAX);
        return PC_EINVAL;
    }
    out->row_dim = ops->row_dim(mc);
    return 0;
}

/* ---- the lines ---- */

typedef enum {
    L_FORMAT,
    L_CSV,
    L_MODEL,
    L_MODEL_NDENSE,
    L_NFIELDS,
    L_DIM,
    L_POOLING,
    L_BOTTOM,
    L_TOP,
    L_MAX_BATCH,
    L_SEED,
    L_NDENSE,
    L_TABLE,
    L_ROW_DIM,
    L_N
} line_t;

static const char *const k_lines[L_N] = {
    [L_FORMAT] = "format",   [L_CSV] = "csv",
    [L_MODEL] = "model",     [L_MODEL_NDENSE] = "model_ndense",
    [L_NFIELDS] = "nfields", [L_DIM] = "dim",
    [L_POOLING] = "pooling", [L_BOTTOM] = "bottom",
    [L_TOP] = "top",         [L_MAX_BATCH] = "max_batch",
    [L_SEED] = "seed",       [L_NDENSE] = "ndense",
    [L_TABLE] = "table",     [L_ROW_DIM] = "row_dim",
};

static const char *const k_pooling[] = {"sum", "mean"};

/* Printf into err (may be NULL) and return rc. */
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* The whole card fits together (see the header's DESIGN); PC_ECORRUPT with a reason. */
static int card_check(const pw_model_card_t *k, char *err, size_t errlen) {
    const pw_model_config_t *m = &k->model;
    if ((unsigned)k->format > PW_FMT_CSV)
        return fail(err, errlen, PC_ECORRUPT, "format %d is not a known format", (int)k->format);
    if (pw_model_row_dim(m) < 1) /* an unknown name (pw_model_find would log) */
        return fail(err, errlen, PC_ECORRUPT, "model '%s' is not one of dlrm, deepfm, fm, lr",
                    m->name);
    const bool dlrm = strcmp(m->name, "dlrm") == 0, deepfm = strcmp(m->name, "deepfm") == 0;
    pw_csv_spec_t spec;
    char why[256];
    if (k->format == PW_FMT_CSV && pw_csv_spec_parse(k->csv, &spec, why, sizeof why))
        return fail(err, errlen, PC_ECORRUPT, "csv: %s", why);
    if (k->format != PW_FMT_CSV && k->csv[0])
        return fail(err, errlen, PC_ECORRUPT, "a csv spec with format %s",
                    pw_format_names[k->format]);
    int nf, nd;
    pw_format_shape(k->format, k->format == PW_FMT_CSV ? &spec : NULL, &nf, &nd);
    if (k->ndense != nd)
        return fail(err, errlen, PC_ECORRUPT, "ndense %d: format %s gives %d dense values",
                    k->ndense, pw_format_names[k->format], nd);
    if (m->ndense != (nd ? nd : 1))
        return fail(err, errlen, PC_ECORRUPT, "model_ndense %d: the stream gives %d (none: 1)",
                    m->ndense, nd);
    if ((dlrm || deepfm) && m->nfields < 1)
        return fail(err, errlen, PC_ECORRUPT, "model %s needs nfields >= 1", m->name);
    if (m->dim < 1 || m->max_batch < 1 || m->nfields < 0 || m->nbottom < 0 ||
        m->nbottom > PW_MLP_MAX || m->ntop < 0 || m->ntop > PW_MLP_MAX)
        return fail(err, errlen, PC_ECORRUPT, "dim, max_batch or widths out of range");
    if (dlrm && (m->nbottom < 1 || m->bottom[m->nbottom - 1] != m->dim))
        return fail(err, errlen, PC_ECORRUPT, "dlrm: the bottom widths must end at dim %d", m->dim);
    if ((dlrm || deepfm) && (m->ntop < 1 || m->top[m->ntop - 1] != 1))
        return fail(err, errlen, PC_ECORRUPT, "%s: the top widths must end at 1", m->name);
    if (k->row_dim != pw_model_row_dim(m))
        return fail(err, errlen, PC_ECORRUPT, "row_dim %d: model %s of dim %d has rows of %d",
                    k->row_dim, m->name, m->dim, pw_model_row_dim(m));
    if (!k->table_name[0])
        return fail(err, errlen, PC_ECORRUPT, "no table name");
    return 0;
}

int pw_model_card_write(const char *path, const pw_model_card_t *k) {
    if (!path || !k)
        return PC_EINVAL;
    char why[256];
    if (card_check(k, why, sizeof why)) {
        PC_ERROR("model card %s: not written: %s", path, why);
        return PC_EINVAL;
    }
    const pw_model_config_t *m = &k->model;
    char bottom[PW_MLP_MAX * 8 + 2], top[PW_MLP_MAX * 8 + 2];
    widths_text(m->bottom, m->nbottom, bottom, sizeof bottom);
    widths_text(m->top, m->ntop, top, sizeof top);
    char buf[4096];
    const int len = snprintf(buf, sizeof buf,
                             PW_MODEL_CARD_MAGIC "\n"
                                                 "format %s\ncsv%s%s\nmodel %s\nmodel_ndense %d\n"
                                                 "nfields %d\ndim %d\npooling %s\nbottom %s\n"
                                                 "top %s\nmax_batch %d\nseed %" PRIu64 "\n"
                                                 "ndense %d\ntable %s\nrow_dim %d\n",
                             pw_format_names[k->format], k->csv[0] ? " " : "", k->csv, m->name,
                             m->ndense, m->nfields, m->dim, k_pooling[m->mean], bottom, top,
                             m->max_batch, m->seed, k->ndense, k->table_name, k->row_dim);
    if (len < 0 || (size_t)len >= sizeof buf)
        return PC_EINVAL; /* cannot happen: the fields are bounded */
    return pc_fs_write_atomic(path, buf, (size_t)len);
}

/* ---- reading ---- */

/* A decimal integer in [lo, hi], the whole of s. */
static bool int_parse(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    if (!*s || *s == ' ' || *s == '+')
        return false;
    const long long v = strtoll(s, &end, 10);
    *out = v;
    return !*end && v >= lo && v <= hi;
}

/* Copy v into dst[cap]: false when it does not fit (or is empty and must not be). */
static bool text_set(char *dst, size_t cap, const char *v, bool may_be_empty) {
    const size_t n = strlen(v);
    if (n >= cap || (!n && !may_be_empty))
        return false;
    memcpy(dst, v, n + 1);
    return true;
}

/* Line `id`'s value v into the card; false when it is not of the line's kind. */
static bool line_set(pw_model_card_t *k, line_t id, const char *v) {
    pw_model_config_t *m = &k->model;
    long long x = 0;
    switch (id) {
        case L_FORMAT: {
            pw_format_t f;
            if (pw_format_parse(v, &f))
                return false;
            k->format = f;
            return true;
        }
        case L_CSV:
            return text_set(k->csv, sizeof k->csv, v, true);
        case L_MODEL:
            return text_set(m->name, sizeof m->name, v, false);
        case L_POOLING:
            if (strcmp(v, "sum") && strcmp(v, "mean"))
                return false;
            m->mean = strcmp(v, "mean") == 0;
            return true;
        case L_BOTTOM:
        case L_TOP: {
            int *w = id == L_BOTTOM ? m->bottom : m->top,
                *n = id == L_BOTTOM ? &m->nbottom : &m->ntop;
            if (strcmp(v, "-") == 0)
                return *n = 0, true;
            return widths_parse(v, w, n);
        }
        case L_TABLE:
            return !strchr(v, ' ') && text_set(k->table_name, sizeof k->table_name, v, false);
        case L_SEED: {
            char *end;
            if (*v < '0' || *v > '9')
                return false;
            m->seed = strtoull(v, &end, 10);
            return !*end;
        }
        case L_MODEL_NDENSE:
            return int_parse(v, 1, PW_DENSE_MAX, &x) && (m->ndense = (int)x, true);
        case L_NFIELDS:
            return int_parse(v, 0, PW_FIELDS_MAX, &x) && (m->nfields = (int)x, true);
        case L_DIM:
            return int_parse(v, 1, 65536, &x) && (m->dim = (int)x, true);
        case L_MAX_BATCH:
            return int_parse(v, 1, 1 << 30, &x) && (m->max_batch = (int)x, true);
        case L_NDENSE:
            return int_parse(v, 0, PW_DENSE_MAX, &x) && (k->ndense = (int)x, true);
        case L_ROW_DIM:
            return int_parse(v, 1, 65537, &x) && (k->row_dim = (int)x, true);
        case L_N:
            break;
    }
    return false;
}

int pw_model_card_read(const char *path, pw_model_card_t *out, char *err, size_t errlen) {
    if (err && errlen)
        err[0] = '\0';
    char *text;
    size_t len;
    int rc = pc_fs_read_all(path, 64 << 10, &text, &len);
    if (rc == PC_ENOTFOUND)
        return fail(err, errlen, rc, "%s: no such file", path);
    if (rc == PC_ETOOBIG)
        return fail(err, errlen, PC_EPARSE, "%s: larger than a model card", path);
    if (rc)
        return fail(err, errlen, rc, "%s: %s", path, pc_strerror(rc));
    pw_model_card_t k;
    memset(&k, 0, sizeof k);
    bool seen[L_N] = {false};
    int lineno = 0;
    char *save = NULL;
    rc = 0;
    if (strlen(text) != len)
        rc = fail(err, errlen, PC_EPARSE, "%s: a NUL byte in the file", path);
    else if (len == 0 || text[len - 1] != '\n')
        rc = fail(err, errlen, PC_EPARSE, "%s: the last line is not terminated (cut short?)", path);
    for (char *line = rc ? NULL : strtok_r(text, "\n", &save); line && !rc;
         line = strtok_r(NULL, "\n", &save)) {
        lineno++; /* strtok_r skips empty lines: an empty line is not a card line anyway */
        if (lineno == 1) {
            if (strcmp(line, PW_MODEL_CARD_MAGIC) != 0)
                rc = fail(err, errlen, PC_EPARSE,
                          "%s: line 1: not a model card (want \"" PW_MODEL_CARD_MAGIC "\")", path);
            continue;
        }
        char *sp = strchr(line, ' ');
        const size_t nl = sp ? (size_t)(sp - line) : strlen(line);
        const char *v = sp ? sp + 1 : "";
        int id = -1;
        for (int i = 0; i < L_N && id < 0; i++)
            if (strlen(k_lines[i]) == nl && strncmp(line, k_lines[i], nl) == 0)
                id = i;
        if (id < 0)
            rc = fail(err, errlen, PC_EPARSE, "%s: line %d: unknown name '%.*s'", path, lineno,
                      (int)(nl > 64 ? 64 : nl), line);
        else if (seen[id])
            rc = fail(err, errlen, PC_EPARSE, "%s: line %d: %s given twice", path, lineno,
                      k_lines[id]);
        else if (!line_set(&k, (line_t)id, v))
            rc = fail(err, errlen, PC_EPARSE, "%s: line %d: bad %s '%.64s'", path, lineno,
                      k_lines[id], v);
        else
            seen[id] = true;
    }
    free(text);
    for (int i = 0; i < L_N && !rc; i++)
        if (!seen[i])
            rc = fail(err, errlen, PC_EPARSE, "%s: no %s line", path, k_lines[i]);
    char why[256];
    if (!rc && (rc = card_check(&k, why, sizeof why)))
        fail(err, errlen, rc, "%s: %s", path, why);
    if (!rc)
        *out = k;
    return rc;
}
