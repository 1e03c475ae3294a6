/* pc_wire.c: see pc_wire.h and docs/wire.md. */
#include "pc_wire.h"

#include "pc_cluster.h"
#include "pc_error.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian and arrays are used in place"
#endif

static inline void put16(uint8_t *p, uint16_t v) {
    memcpy(p, &v, 2);
}
static inline void put32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static inline void put64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
}
static inline uint16_t get16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

void pc_wire_hdr_encode(const pc_wire_hdr_t *h, uint8_t out[PC_WIRE_HDR]) {
    put32(out, PC_WIRE_MAGIC);
    out[4] = PC_WIRE_VERSION;
    out[5] = h->op;
    put16(out + 6, h->flags);
    put64(out + 8, h->id);
    put32(out + 16, (uint32_t)h->status);
    put32(out + 20, h->body_len);
    put64(out + 24, h->map_version);
}

int pc_wire_hdr_decode(const uint8_t in[PC_WIRE_HDR], uint32_t max_body, pc_wire_hdr_t *h) {
    h->op = in[5];
    h->flags = get16(in + 6);
    h->id = get64(in + 8);
    h->status = (int32_t)get32(in + 16);
    h->body_len = get32(in + 20);
    h->map_version = get64(in + 24);
    if (get32(in) != PC_WIRE_MAGIC || in[4] != PC_WIRE_VERSION)
        return PC_EPARSE;
    if (h->op < PC_OP_HELLO || h->op > PC_OP_MAX_)
        return PC_EPARSE;
    const uint16_t allowed =
        (h->flags & PC_WIRE_RESPONSE) ? PC_WIRE_RESPONSE | PC_WIRE_DTYPE_MASK : 0;
    if ((h->flags & ~allowed) || pc_wire_hdr_dtype(h) > PC_WIRE_DTYPE_MAX_)
        return PC_EPARSE;
    if (h->status > 0 || (h->status && !(h->flags & PC_WIRE_RESPONSE)))
        return PC_EPARSE; /* statuses are 0 or negative codes, and only replies carry one */
    return h->body_len > max_body ? PC_ETOOBIG : 0;
}

size_t pc_wire_batch_head_len(size_t name_len) {
    return PC_WIRE_PREFIX + ((name_len + 7) & ~(size_t)7);
}

const char *pc_wire_dtype_name(unsigned t) {
    static const char *const names[] = {"f32", "bf16", "f16"};
    return t <= PC_WIRE_DTYPE_MAX_ ? names[t] : "?";
}

uint64_t pc_wire_batch_body_len_typed(pc_wire_op_t op, size_t name_len, uint32_t n, uint32_t dim,
                                      pc_wire_dtype_t t) {
    uint64_t len = pc_wire_batch_head_len(name_len) + (uint64_t)n * 8;
    if (op == PC_OP_PUSH)
        len += (uint64_t)n * dim * pc_wire_dtype_size(t);
    return len;
}

uint64_t pc_wire_batch_body_len(pc_wire_op_t op, size_t name_len, uint32_t n, uint32_t dim) {
    return pc_wire_batch_body_len_typed(op, name_len, n, dim, PC_WIRE_F32);
}

size_t pc_wire_batch_head_encode(const char *name, uint32_t n, uint32_t dim, uint8_t *out) {
    return pc_wire_batch_head_encode_typed(name, n, dim, PC_WIRE_F32, out);
}

size_t pc_wire_batch_head_encode_typed(const char *name, uint32_t n, uint32_t dim,
                                       pc_wire_dtype_t t, uint8_t *out) {
    const size_t nl = strlen(name), hl = pc_wire_batch_head_len(nl);
    memset(out, 0, hl);
    put16(out, (uint16_t)nl);
    put16(out + 2, (uint16_t)t);
    put32(out + 4, n);
    put32(out + 8, dim);
    memcpy(out + PC_WIRE_PREFIX, name, nl);
    return hl;
}

void pc_wire_batch_set_epoch(uint8_t *head, uint32_t epoch) {
    put32(head + 12, epoch);
}

int pc_wire_batch_decode(pc_wire_op_t op, const uint8_t *body, uint32_t len,
                         const pc_wire_limits_t *lim, pc_wire_batch_t *out) {
    if (op != PC_OP_PULL && op != PC_OP_PUSH && op != PC_OP_LOOKUP)
        return PC_EINVAL;
    if (len < PC_WIRE_PREFIX)
        return PC_EINVAL;
    const uint32_t nl = get16(body), t = get16(body + 2), n = get32(body + 4),
                   dim = get32(body + 8);
    const uint32_t epoch = get32(body + 12);
    if (nl == 0 || nl > PC_WIRE_NAME_MAX || (epoch && op != PC_OP_PUSH))
        return PC_EINVAL;
    if (t > PC_WIRE_DTYPE_MAX_)
        return PC_EUNSUPPORTED;
    if (n > lim->max_keys)
        return PC_ETOOBIG;
    if (dim == 0 || dim > PC_WIRE_DIM_MAX)
        return PC_EDIM;
    const size_t hl = pc_wire_batch_head_len(nl);
    if ((uint64_t)len != pc_wire_batch_body_len_typed(op, nl, n, dim, (pc_wire_dtype_t)t))
        return PC_EINVAL;
    for (size_t i = nl; i < hl - PC_WIRE_PREFIX; i++) /* padding is zero */
        if (body[PC_WIRE_PREFIX + i])
            return PC_EINVAL;
    memcpy(out->name, body + PC_WIRE_PREFIX, nl);
    out->name[nl] = '\0';
    if (memchr(out->name, '\0', nl))
        return PC_EINVAL;
    out->n = n;
    out->dim = dim;
    out->dtype = (pc_wire_dtype_t)t;
    out->epoch = epoch;
    out->keys = (const uint64_t *)(const void *)(body + hl);
    const void *vals = op == PC_OP_PUSH ? body + hl + (size_t)n * 8 : NULL;
    out->vals = t == PC_WIRE_F32 ? vals : NULL;
    out->vals16 = t == PC_WIRE_F32 ? NULL : vals;
    return 0;
}

/* ==== reply sizes ========================================================================== */

uint64_t pc_wire_reply_len(pc_wire_op_t op, uint64_t n, uint32_t dim) {
    return pc_wire_reply_len_typed(op, n, dim, PC_WIRE_F32);
}

uint64_t pc_wire_reply_len_typed(pc_wire_op_t op, uint64_t n, uint32_t dim, pc_wire_dtype_t t) {
    const uint64_t es = pc_wire_dtype_size(t);
    switch (op) {
        case PC_OP_PULL:
            return n * dim * es;
        case PC_OP_LOOKUP:
            return n * dim * es + n;
        case PC_OP_PUSH:
            return 3 * sizeof(uint64_t);
        default:
            return 0;
    }
}

/* "8 GiB", "64 MiB", "1.5 KiB", "100 B": about three digits in the largest unit that fits. */
static void fmt_bytes(uint64_t v, char *out, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)v;
    int u = 0;
    while (x >= 1024 && u < 5) {
        x /= 1024;
        u++;
    }
    snprintf(out, cap, x >= 100 ? "%.0f %s" : "%.3g %s", x, units[u]);
}

int pc_wire_reply_check(pc_wire_op_t op, uint64_t n, uint32_t dim, uint64_t max_reply, char *msg,
                        size_t cap) {
    return pc_wire_reply_check_typed(op, n, dim, PC_WIRE_F32, max_reply, msg, cap);
}

int pc_wire_reply_check_typed(pc_wire_op_t op, uint64_t n, uint32_t dim, pc_wire_dtype_t t,
                              uint64_t max_reply, char *msg, size_t cap) {
    const uint64_t len = pc_wire_reply_len_typed(op, n, dim, t);
    if (!max_reply || len <= max_reply)
        return 0;
    if (msg && cap) {
        char have[32], lim[32];
        fmt_bytes(len, have, sizeof have);
        fmt_bytes(max_reply, lim, sizeof lim);
        snprintf(msg, cap, "%s of %llu rows x dim %u%s%s = %s over the reply limit of %s",
                 op == PC_OP_LOOKUP ? "lookup" : "pull", (unsigned long long)n, dim,
                 t == PC_WIRE_F32 ? "" : " in ", t == PC_WIRE_F32 ? "" : pc_wire_dtype_name(t),
                 have, lim);
    }
    return PC_ETOOBIG;
}

/* ==== claims ================================================================================ */

/* A string of `len` bytes without NUL into out (cap > len). */
static int get_text(const uint8_t *p, size_t len, char *out) {
    memcpy(out, p, len);
    out[len] = '\0';
    return memchr(p, '\0', len) ? PC_EINVAL : 0;
}

size_t pc_wire_claim_len(size_t name_len, size_t job_len) {
    return pc_wire_batch_head_len(name_len) + job_len;
}

size_t pc_wire_claim_encode(const char *name, const char *job, uint32_t mode, uint32_t epoch,
                            uint8_t *out) {
    const size_t nl = strlen(name), jl = strlen(job), hl = pc_wire_batch_head_len(nl);
    if (nl == 0 || nl > PC_WIRE_NAME_MAX || jl > PC_WIRE_JOB_MAX || mode > UINT16_MAX)
        return 0;
    memset(out, 0, hl);
    put16(out, (uint16_t)nl);
    put16(out + 2, (uint16_t)mode);
    put32(out + 4, (uint32_t)jl);
    put32(out + 8, epoch);
    memcpy(out + PC_WIRE_PREFIX, name, nl);
    memcpy(out + hl, job, jl);
    return hl + jl;
}

int pc_wire_claim_decode(const uint8_t *body, uint32_t len, pc_wire_claim_t *out) {
    if (len < PC_WIRE_PREFIX)
        return PC_EINVAL;
    const uint32_t nl = get16(body), jl = get32(body + 4);
    if (nl == 0 || nl > PC_WIRE_NAME_MAX || jl > PC_WIRE_JOB_MAX || get32(body + 12))
        return PC_EINVAL;
    const size_t hl = pc_wire_batch_head_len(nl);
    if ((uint64_t)len != (uint64_t)hl + jl)
        return PC_EINVAL;
    for (size_t i = PC_WIRE_PREFIX + nl; i < hl; i++)
        if (body[i])
            return PC_EINVAL;
    out->mode = get16(body + 2);
    out->epoch = get32(body + 8);
    if (get_text(body + PC_WIRE_PREFIX, nl, out->name) || get_text(body + hl, jl, out->job))
        return PC_EINVAL;
    return 0;
}

#define CLAIM_REPLY_PREFIX 32u

size_t pc_wire_claim_reply_len(const pc_wire_claim_reply_t *r) {
    size_t pl = strnlen(r->previous, PC_WIRE_JOB_MAX), cl = strnlen(r->config, PC_WIRE_CFG_MAX);
    return CLAIM_REPLY_PREFIX + pl + cl;
}

size_t pc_wire_claim_reply_encode(const pc_wire_claim_reply_t *r, uint8_t *out) {
    size_t pl = strnlen(r->previous, PC_WIRE_JOB_MAX), cl = strnlen(r->config, PC_WIRE_CFG_MAX);
    memset(out, 0, CLAIM_REPLY_PREFIX);
    put32(out, r->action);
    put32(out + 4, r->dim);
    put64(out + 8, r->rows);
    put64(out + 16, r->version);
    put16(out + 24, (uint16_t)pl);
    put16(out + 26, (uint16_t)cl);
    memcpy(out + CLAIM_REPLY_PREFIX, r->previous, pl);
    memcpy(out + CLAIM_REPLY_PREFIX + pl, r->config, cl);
    return CLAIM_REPLY_PREFIX + pl + cl;
}

int pc_wire_claim_reply_decode(const uint8_t *body, uint32_t len, pc_wire_claim_reply_t *out) {
    if (len < CLAIM_REPLY_PREFIX)
        return PC_EINVAL;
    const uint32_t pl = get16(body + 24), cl = get16(body + 26);
    if (pl > PC_WIRE_JOB_MAX || cl > PC_WIRE_CFG_MAX || get32(body + 28) ||
        (uint64_t)len != (uint64_t)CLAIM_REPLY_PREFIX + pl + cl)
        return PC_EINVAL;
    out->action = get32(body);
    if (out->action >= PC_WIRE_CLAIM_ACTIONS)
        return PC_EINVAL;
    out->dim = get32(body + 4);
    out->rows = get64(body + 8);
    out->version = get64(body + 16);
    if (get_text(body + CLAIM_REPLY_PREFIX, pl, out->previous) ||
        get_text(body + CLAIM_REPLY_PREFIX + pl, cl, out->config))
        return PC_EINVAL;
    return 0;
}

/* ---- the delta stream ---- */

size_t pc_wire_stream_len(size_t name_len, uint32_t flags) {
    return pc_wire_batch_head_len(name_len) + (flags & PC_STREAM_COLD ? 24 : 16);
}

size_t pc_wire_stream_encode(const pc_wire_stream_t *q, uint8_t *out) {
    const size_t nl = strlen(q->name), hl = pc_wire_batch_head_len(nl);
    if (nl == 0 || nl > PC_WIRE_NAME_MAX)
        return 0;
    memset(out, 0, hl);
    put16(out, (uint16_t)nl);
    put16(out + 2, (uint16_t)q->flags);
    put32(out + 4, q->max);
    put32(out + 8, q->part);
    put32(out + 12, q->parts);
    memcpy(out + PC_WIRE_PREFIX, q->name, nl);
    put64(out + hl, q->from);
    put64(out + hl + 8, q->uid);
    if (!(q->flags & PC_STREAM_COLD))
        return hl + 16;
    put64(out + hl + 16, q->start);
    return hl + 24;
}

int pc_wire_stream_decode(const uint8_t *body, uint32_t len, pc_wire_stream_t *out) {
    if (len < PC_WIRE_PREFIX)
        return PC_EINVAL;
    const uint32_t nl = get16(body);
    const uint32_t flags = get16(body + 2);
    if (nl == 0 || nl > PC_WIRE_NAME_MAX || (flags & ~PC_STREAM_FLAGS) ||
        ((flags & PC_STREAM_ACK) && (flags & PC_STREAM_SAME_MAP)) ||
        ((flags & PC_STREAM_BACKUP) && !(flags & PC_STREAM_SAME_MAP)) ||
        ((flags & PC_STREAM_CAUGHT) && !(flags & PC_STREAM_ACK)) ||
        ((flags & PC_STREAM_COLD) && (flags & PC_STREAM_ACK)))
        return PC_EINVAL;
    if ((flags & PC_STREAM_ACK) && (get32(body + 12) || get32(body + 8) >= PC_MAX_SERVERS))
        return PC_EINVAL; /* an acknowledging follower names itself in part; parts is 0 */
    const size_t hl = pc_wire_batch_head_len(nl);
    if ((uint64_t)len != (uint64_t)pc_wire_stream_len(nl, flags))
        return PC_EINVAL;
    for (size_t i = PC_WIRE_PREFIX + nl; i < hl; i++)
        if (body[i])
            return PC_EINVAL;
    if (get_text(body + PC_WIRE_PREFIX, nl, out->name))
        return PC_EINVAL;
    out->flags = flags;
    out->max = get32(body + 4);
    out->part = get32(body + 8);
    out->parts = get32(body + 12);
    out->from = get64(body + hl);
    out->uid = get64(body + hl + 8);
    out->start = flags & PC_STREAM_COLD ? get64(body + hl + 16) : 0;
    if ((flags & PC_STREAM_COLD) && out->part < out->parts && out->start)
        return PC_EINVAL; /* a part of the RAM rows starts nowhere */
    return 0;
}

uint64_t pc_wire_stream_found_off(uint64_t n) {
    return PC_WIRE_STREAM_REPLY_PREFIX + 8 * n;
}

uint64_t pc_wire_stream_rows_off(uint64_t n) {
    return pc_wire_stream_found_off(n) + ((n + 7) & ~(uint64_t)7);
}

uint64_t pc_wire_stream_reply_len(uint64_t n, uint32_t dim) {
    return pc_wire_stream_rows_off(n) + n * dim * 4;
}

void pc_wire_stream_reply_encode(const pc_wire_stream_reply_t *r, uint8_t *out) {
    put64(out, r->uid);
    put64(out + 8, r->from);
    put64(out + 16, r->next);
    put64(out + 24, r->head);
    put64(out + 32, r->oldest);
    put32(out + 40, r->n);
    put32(out + 44, r->dim);
}

int pc_wire_stream_reply_decode(const uint8_t *body, uint32_t len, pc_wire_stream_reply_t *out) {
    if (len < PC_WIRE_STREAM_REPLY_PREFIX)
        return PC_EINVAL;
    out->uid = get64(body);
    out->from = get64(body + 8);
    out->next = get64(body + 16);
    out->head = get64(body + 24);
    out->oldest = get64(body + 32);
    out->n = get32(body + 40);
    out->dim = get32(body + 44);
    if (out->dim > PC_WIRE_STREAM_STRIDE_MAX || pc_wire_stream_reply_len(out->n, out->dim) != len)
        return PC_EINVAL;
    /* each key's found byte 0 or 1, the padding after them 0 (as the requests' checks) */
    const uint8_t *found = body + pc_wire_stream_found_off(out->n);
    const uint64_t flen = pc_wire_stream_rows_off(out->n) - pc_wire_stream_found_off(out->n);
    for (uint64_t i = 0; i < flen; i++)
        if (found[i] > (i < out->n ? 1 : 0))
            return PC_EINVAL;
    return 0;
}

/* ==== dead peers =========================================================================== */

int pc_wire_watch_peer(int fd, uint32_t dead_ms) {
    const int on = 1, idle = (int)(dead_ms / 2000 ? dead_ms / 2000 : 1),
              intvl = (int)(dead_ms / 6000 ? dead_ms / 6000 : 1), cnt = 3;
    const unsigned int user = dead_ms;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof user))
        return PC_ESYS;
    return 0;
}
