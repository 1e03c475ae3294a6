/* ps_rowfile.c: writer and reader of row files (format in ps_rowfile.h).
 *
 * DESIGN: one 1 MiB buffer per writer; the XXH3 streaming state hashes exactly the bytes that
 * reach the file. The reader trusts nothing: it checks the footer's magic and that the file size
 * equals what header, config and footer counts imply before any callback, and the checksum after
 * the last byte.
 */
#include "ps_rowfile.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_hash.h"
#include "pc_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC       "EMBRROWS"
#define END_MAGIC   "EMBREND1"
#define FORMAT      1u
#define ROW_FORMAT  1u
#define HEADER_SIZE (8 + 4 * 6 + 8 + 4)
#define FOOTER_SIZE (8 * 3 + 8)
#define ROW_HDR     (8 + 2 + 1 + 1)
#define BUF_SIZE    (1u << 20)
#define READ_BATCH  4096u

struct ps_rowfile_w {
    int fd;
    char path[4096];
    uint32_t dim, state_len;
    uint64_t rows, tombs, bytes;
    int tomb_phase; /* rows may not follow tombstones */
    int err;
    XXH3_state_t hash;
    size_t used;
    uint8_t buf[BUF_SIZE];
};

static int flush_buf(ps_rowfile_w_t *w) {
    size_t off = 0;
    while (off < w->used) {
        ssize_t n = write(w->fd, w->buf + off, w->used - off);
        if (n < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            PC_ERROR("row file %s: write: %s", w->path, strerror(e));
            return e == ENOSPC ? PC_ENOSPC : PC_EIO;
        }
        off += (size_t)n;
    }
    w->used = 0;
    return 0;
}

static int put(ps_rowfile_w_t *w, const void *p, size_t n) {
    if (w->err)
        return w->err;
    XXH3_64bits_update(&w->hash, p, n);
    w->bytes += n;
    const uint8_t *s = p;
    while (n) {
        size_t k = BUF_SIZE - w->used < n ? BUF_SIZE - w->used : n;
        memcpy(w->buf + w->used, s, k);
        w->used += k;
        s += k;
        n -= k;
        if (w->used == BUF_SIZE && (w->err = flush_buf(w)))
            return w->err;
    }
    return 0;
}

static int put_u32(ps_rowfile_w_t *w, uint32_t v) {
    return put(w, &v, 4);
}
static int put_u64(ps_rowfile_w_t *w, uint64_t v) {
    return put(w, &v, 8);
}

int ps_rowfile_create(const char *path, const ps_rowfile_meta_t *meta, ps_rowfile_w_t **out) {
    size_t clen = strnlen(meta->config, sizeof meta->config);
    if (clen == sizeof meta->config || meta->dim == 0 || meta->dim > PS_DIM_MAX)
        return PC_EINVAL;
    ps_rowfile_w_t *w = pc_malloc(PC_MEM_SCRATCH, sizeof *w);
    if (!w)
        return PC_ENOMEM;
    memset(w, 0, offsetof(ps_rowfile_w_t, buf));
    snprintf(w->path, sizeof w->path, "%s", path);
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        PC_ERROR("row file %s: open: %s", path, strerror(e));
        pc_free(PC_MEM_SCRATCH, w, sizeof *w);
        return e == ENOSPC ? PC_ENOSPC : PC_EIO;
    }
    w->dim = meta->dim;
    w->state_len = meta->state_len;
    XXH3_64bits_reset(&w->hash);
    put(w, MAGIC, 8);
    put_u32(w, FORMAT);
    put_u32(w, meta->dim);
    put_u32(w, meta->state_len);
    put_u32(w, meta->optimizer);
    put_u32(w, meta->cut_clock);
    put_u32(w, meta->flags);
    put_u64(w, meta->version);
    put_u32(w, (uint32_t)clen);
    put(w, meta->config, clen);
    if (w->err) {
        int rc = w->err;
        ps_rowfile_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ps_rowfile_add_rows(ps_rowfile_w_t *w, const ps_row_view_t *rows, size_t n) {
    if (w->tomb_phase)
        return PC_EINVAL;
    for (size_t i = 0; i < n && !w->err; i++) {
        uint8_t hdr[ROW_HDR];
        memcpy(hdr, &rows[i].key, 8);
        memcpy(hdr + 8, &rows[i].tick, 2);
        hdr[10] = rows[i].freq;
        hdr[11] = ROW_FORMAT;
        put(w, hdr, sizeof hdr);
        put(w, rows[i].weights, (size_t)w->dim * sizeof(float));
        if (w->state_len)
            put(w, rows[i].state, (size_t)w->state_len * sizeof(float));
        w->rows++;
    }
    return w->err;
}

int ps_rowfile_add_tombs(ps_rowfile_w_t *w, const uint64_t *keys, size_t n) {
    w->tomb_phase = 1;
    put(w, keys, n * sizeof(uint64_t));
    w->tombs += n;
    return w->err;
}

int ps_rowfile_finish(ps_rowfile_w_t *w, uint64_t *rows, uint64_t *tombs, uint64_t *bytes,
                      uint64_t *checksum) {
    uint64_t counts[2] = {w->rows, w->tombs};
    XXH3_64bits_update(&w->hash, counts, sizeof counts);
    uint64_t h = XXH3_64bits_digest(&w->hash);
    int rc = w->err;
    if (!rc && w->used + FOOTER_SIZE > BUF_SIZE)
        rc = flush_buf(w); /* make room: the footer goes around put(), unhashed */
    if (!rc) {
        memcpy(w->buf + w->used, counts, sizeof counts);
        memcpy(w->buf + w->used + 16, &h, 8);
        memcpy(w->buf + w->used + 24, END_MAGIC, 8);
        w->used += FOOTER_SIZE;
        w->bytes += FOOTER_SIZE;
        rc = flush_buf(w);
    }
    if (!rc && fsync(w->fd) != 0) {
        int e = errno;
        PC_ERROR("row file %s: fsync: %s", w->path, strerror(e));
        rc = e == ENOSPC ? PC_ENOSPC : PC_EIO;
    }
    if (close(w->fd) != 0 && !rc)
        rc = PC_EIO;
    if (rc)
        unlink(w->path);
    if (rows)
        *rows = w->rows;
    if (tombs)
        *tombs = w->tombs;
    if (bytes)
        *bytes = w->bytes;
    if (checksum)
        *checksum = h;
    pc_free(PC_MEM_SCRATCH, w, sizeof *w);
    return rc;
}

void ps_rowfile_abort(ps_rowfile_w_t *w) {
    if (!w)
        return;
    close(w->fd);
    unlink(w->path);
    pc_free(PC_MEM_SCRATCH, w, sizeof *w);
}

/* ---- reader ------------------------------------------------------------------------------ */

typedef struct reader {
    int fd;
    const char *path;
    XXH3_state_t hash;
    uint8_t *buf;
    size_t len, pos; /* buffered bytes [pos, len) */
} reader_t;

/* Read exactly n bytes (hashed when `hash`). */
static int get(reader_t *r, void *dst, size_t n, int hash) {
    uint8_t *d = dst;
    while (n) {
        if (r->pos == r->len) {
            ssize_t k = read(r->fd, r->buf, BUF_SIZE);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return k == 0 ? PC_ECORRUPT : PC_EIO;
            r->len = (size_t)k;
            r->pos = 0;
        }
        size_t k = r->len - r->pos < n ? r->len - r->pos : n;
        memcpy(d, r->buf + r->pos, k);
        if (hash)
            XXH3_64bits_update(&r->hash, d, k);
        r->pos += k;
        d += k;
        n -= k;
    }
    return 0;
}

static int corrupt(const char *path, const char *why) {
    PC_ERROR("row file %s: %s", path, why);
    return PC_ECORRUPT;
}

int ps_rowfile_read(const char *path, ps_rowfile_meta_t *meta, ps_keys_fn tombs_fn,
                    ps_rowfile_rows_fn rows_fn, void *ctx) {
    reader_t r = {.path = path};
    r.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r.fd < 0) {
        int e = errno;
        PC_ERROR("row file %s: open: %s", path, strerror(e));
        return e == ENOENT ? PC_ENOTFOUND : PC_EIO;
    }
    r.buf = pc_malloc(PC_MEM_SCRATCH, BUF_SIZE);
    uint64_t *keys = pc_malloc(PC_MEM_SCRATCH, READ_BATCH * sizeof *keys);
    float *w = NULL; /* READ_BATCH rows of weights, then of state: sized from the header */
    uint16_t *ticks = pc_malloc(PC_MEM_SCRATCH, READ_BATCH * sizeof *ticks);
    uint8_t *freqs = pc_malloc(PC_MEM_SCRATCH, READ_BATCH);
    size_t w_bytes = 0;
    int rc = 0;
    struct stat st;
    if (!r.buf || !keys || !ticks || !freqs) {
        rc = PC_ENOMEM;
        goto out;
    }
    /* A read that fails is PC_EIO, not damage (as get's): a restore stops on it instead of
     * falling back to an older checkpoint as it does for a damaged file. */
    if (fstat(r.fd, &st) != 0) {
        rc = PC_EIO;
        goto out;
    }
    if (st.st_size < HEADER_SIZE + FOOTER_SIZE) {
        rc = corrupt(path, "shorter than header and footer");
        goto out;
    }
    /* Footer first: counts and magic. */
    uint8_t foot[FOOTER_SIZE];
    const ssize_t got = pread(r.fd, foot, FOOTER_SIZE, st.st_size - FOOTER_SIZE);
    if (got < 0) {
        rc = PC_EIO;
        goto out;
    }
    if (got != FOOTER_SIZE || memcmp(foot + 24, END_MAGIC, 8) != 0) {
        rc = corrupt(path, "missing footer (truncated?)");
        goto out;
    }
    uint64_t counts[2], want_hash;
    memcpy(counts, foot, 16);
    memcpy(&want_hash, foot + 16, 8);
    XXH3_64bits_reset(&r.hash);
    uint8_t hdr[HEADER_SIZE];
    if ((rc = get(&r, hdr, HEADER_SIZE, 1)))
        goto out;
    if (memcmp(hdr, MAGIC, 8) != 0) {
        rc = corrupt(path, "bad magic");
        goto out;
    }
    ps_rowfile_meta_t m;
    memset(&m, 0, sizeof m);
    uint32_t format, clen;
    memcpy(&format, hdr + 8, 4);
    memcpy(&m.dim, hdr + 12, 4);
    memcpy(&m.state_len, hdr + 16, 4);
    memcpy(&m.optimizer, hdr + 20, 4);
    memcpy(&m.cut_clock, hdr + 24, 4);
    memcpy(&m.flags, hdr + 28, 4);
    memcpy(&m.version, hdr + 32, 8);
    memcpy(&clen, hdr + 40, 4);
    if (format != FORMAT) {
        rc = corrupt(path, "unsupported format version");
        goto out;
    }
    if (m.dim == 0 || m.dim > PS_DIM_MAX || m.state_len > 2 * PS_DIM_MAX + 1 ||
        clen >= sizeof m.config || (m.flags & ~PS_ROWFILE_INCREMENTAL)) {
        rc = corrupt(path, "header values out of range");
        goto out;
    }
    const uint64_t rec = ROW_HDR + (uint64_t)(m.dim + m.state_len) * 4;
    if (counts[0] > (uint64_t)st.st_size / rec || counts[1] > (uint64_t)st.st_size / 8 ||
        (uint64_t)HEADER_SIZE + clen + counts[0] * rec + counts[1] * 8 + FOOTER_SIZE !=
            (uint64_t)st.st_size) {
        rc = corrupt(path, "size does not match its counts (truncated?)");
        goto out;
    }
    if ((rc = get(&r, m.config, clen, 1)))
        goto out;
    m.config[clen] = '\0';
    m.rows = counts[0];
    m.tombs = counts[1];
    m.checksum = want_hash;
    m.bytes = (uint64_t)st.st_size;
    if (meta)
        *meta = m;
    /* Tombstones first (small; read again below for the checksum). */
    const off_t tomb_off = (off_t)(HEADER_SIZE + clen + counts[0] * rec);
    for (uint64_t i = 0; tombs_fn && i < counts[1] && !rc; i += READ_BATCH) {
        size_t n = counts[1] - i < READ_BATCH ? (size_t)(counts[1] - i) : READ_BATCH;
        if (pread(r.fd, keys, n * 8, tomb_off + (off_t)(i * 8)) != (ssize_t)(n * 8))
            rc = PC_EIO;
        else
            rc = tombs_fn(ctx, keys, n);
    }
    /* Rows, in batches. */
    w_bytes = (size_t)READ_BATCH * (m.dim + m.state_len) * sizeof *w;
    w = pc_malloc(PC_MEM_SCRATCH, w_bytes);
    if (!w) {
        rc = PC_ENOMEM;
        goto out;
    }
    float *states = m.state_len ? w + (size_t)READ_BATCH * m.dim : NULL;
    for (uint64_t i = 0; i < counts[0] && !rc;) {
        size_t n = 0;
        for (; n < READ_BATCH && i < counts[0]; n++, i++) {
            uint8_t rh[ROW_HDR];
            if ((rc = get(&r, rh, ROW_HDR, 1)))
                break;
            if (rh[11] != ROW_FORMAT) {
                rc = corrupt(path, "unknown row format byte");
                break;
            }
            memcpy(&keys[n], rh, 8);
            memcpy(&ticks[n], rh + 8, 2);
            freqs[n] = rh[10];
            if ((rc = get(&r, w + (size_t)n * m.dim, (size_t)m.dim * 4, 1)))
                break;
            if (m.state_len &&
                (rc = get(&r, states + (size_t)n * m.state_len, (size_t)m.state_len * 4, 1)))
                break;
        }
        if (!rc && n && rows_fn)
            rc = rows_fn(ctx, n, keys, w, states, ticks, freqs);
    }
    for (uint64_t i = 0; i < counts[1] && !rc; i++) { /* hash the tombstones */
        uint64_t k;
        rc = get(&r, &k, 8, 1);
    }
    if (!rc) {
        XXH3_64bits_update(&r.hash, counts, sizeof counts);
        if (XXH3_64bits_digest(&r.hash) != want_hash)
            rc = corrupt(path, "checksum mismatch");
    }
out:
    pc_free(PC_MEM_SCRATCH, r.buf, BUF_SIZE);
    pc_free(PC_MEM_SCRATCH, keys, READ_BATCH * sizeof *keys);
    pc_free(PC_MEM_SCRATCH, w, w ? w_bytes : 0);
    pc_free(PC_MEM_SCRATCH, ticks, READ_BATCH * sizeof *ticks);
    pc_free(PC_MEM_SCRATCH, freqs, READ_BATCH);
    close(r.fd);
    return rc;
}
