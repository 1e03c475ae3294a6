/* pw_split.c: see pw_split.h. */
#include "pw_split.h"

#include "pc_error.h"
#include "pc_log.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct row {
    double key;
    size_t idx, off, len; /* len includes the newline */
} row_t;

static int row_cmp(const void *a, const void *b) {
    const row_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The whole file, NUL-terminated, in *out (free it). PC_EIO (cannot open or read), PC_ENOMEM. */
static int slurp(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return PC_EIO;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? 0 : PC_ENOMEM;
    for (size_t got; !rc && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb)
                rc = PC_ENOMEM;
            else
                buf = nb, cap *= 2;
        }
    }
    if (!rc && ferror(f))
        rc = PC_EIO;
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static bool write_rows(const char *path, const char *buf, const char *hdr, size_t hlen,
                       const row_t *rows, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = 0; ok && i < n; i++) {
        ok = fwrite(buf + rows[i].off, 1, rows[i].len, f) == rows[i].len;
        if (ok && (rows[i].len == 0 || buf[rows[i].off + rows[i].len - 1] != '\n'))
            ok = fputc('\n', f) != EOF;
    }
    return fclose(f) == 0 && ok;
}

int pw_split_by_column(const char *in, char sep, bool header, int col, double test_fraction,
                       const char *train_out, const char *test_out, uint64_t *ntrain,
                       uint64_t *ntest) {
    if (!(test_fraction > 0 && test_fraction < 1) || col < 0)
        return PC_EINVAL;
    size_t len;
    char *buf;
    int src = slurp(in, &buf, &len);
    if (src) {
        PC_ERROR("split: cannot read %s: %s", in, pc_strerror(src));
        return src;
    }
    size_t cap = 1024, n = 0, p = 0, hlen = 0;
    row_t *rows = malloc(cap * sizeof *rows);
    int rc = rows ? 0 : PC_ENOMEM;
    for (size_t lineno = 1; !rc && p < len; lineno++) {
        const char *nl = memchr(buf + p, '\n', len - p);
        const size_t e = nl ? (size_t)(nl - buf) + 1 : len;
        if (header && lineno == 1) {
            hlen = e;
            p = e;
            continue;
        }
        const char *c = buf + p, *end = buf + e;
        size_t blank = 0;
        while (c + blank < end && isspace((unsigned char)c[blank]))
            blank++;
        if (c + blank == end) { /* a blank line (a trailing one, CRLF's too): no row */
            p = e;
            continue;
        }
        for (int k = 0; k < col && c; k++) {
            c = memchr(c, sep, (size_t)(end - c));
            c = c ? c + 1 : NULL;
        }
        char *stop = NULL;
        /* strtod skips leading blanks, newlines included: an empty last column must not read
         * the next line's number */
        const double key = c && c < end && !isspace((unsigned char)*c) ? strtod(c, &stop) : NAN;
        const bool whole =
            stop && stop <= end &&
            (stop == end || *stop == sep || *stop == '\r' || *stop == '\n'); /* not "123abc" */
        if (!c || !stop || stop == c || !whole || !isfinite(key)) {
            PC_ERROR("split: %s:%zu: column %d is not a number", in, lineno, col + 1);
            rc = PC_EPARSE;
            break;
        }
        if (n == cap) {
            row_t *nr = realloc(rows, 2 * cap * sizeof *rows);
            if (!nr) {
                rc = PC_ENOMEM;
                break;
            }
            rows = nr;
            cap *= 2;
        }
        rows[n] = (row_t){key, n, p, e - p};
        n++;
        p = e;
    }
    if (!rc) {
        qsort(rows, n, sizeof *rows, row_cmp);
        const size_t ntr = n - (size_t)llround((double)n * test_fraction);
        if (!write_rows(train_out, buf, buf, hlen, rows, ntr) ||
            !write_rows(test_out, buf, buf, hlen, rows + ntr, n - ntr)) {
            PC_ERROR("split: cannot write %s or %s", train_out, test_out);
            rc = PC_EIO;
        } else {
            if (ntrain)
                *ntrain = ntr;
            if (ntest)
                *ntest = n - ntr;
        }
    }
    free(rows);
    free(buf);
    return rc;
}
