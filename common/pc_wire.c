/* pc_wire.c: see pc_wire.h and docs/wire.md. */
#include "pc_wire.h"

#include "pc_error.h"

#include <string.h>

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
    if (h->op < PC_OP_HELLO || h->op > PC_OP_MAX_ || (h->flags & ~PC_WIRE_RESPONSE))
        return PC_EPARSE;
    return h->body_len > max_body ? PC_ETOOBIG : 0;
}

size_t pc_wire_batch_head_len(size_t name_len) {
    return PC_WIRE_PREFIX + ((name_len + 7) & ~(size_t)7);
}

uint64_t pc_wire_batch_body_len(pc_wire_op_t op, size_t name_len, uint32_t n, uint32_t dim) {
    uint64_t len = pc_wire_batch_head_len(name_len) + (uint64_t)n * 8;
    if (op == PC_OP_PUSH)
        len += (uint64_t)n * dim * 4;
    return len;
}

size_t pc_wire_batch_head_encode(const char *name, uint32_t n, uint32_t dim, uint8_t *out) {
    const size_t nl = strlen(name), hl = pc_wire_batch_head_len(nl);
    memset(out, 0, hl);
    put16(out, (uint16_t)nl);
    put32(out + 4, n);
    put32(out + 8, dim);
    memcpy(out + PC_WIRE_PREFIX, name, nl);
    return hl;
}

int pc_wire_batch_decode(pc_wire_op_t op, const uint8_t *body, uint32_t len,
                         const pc_wire_limits_t *lim, pc_wire_batch_t *out) {
    if (op != PC_OP_PULL && op != PC_OP_PUSH && op != PC_OP_LOOKUP)
        return PC_EINVAL;
    if (len < PC_WIRE_PREFIX)
        return PC_EINVAL;
    const uint32_t nl = get16(body), n = get32(body + 4), dim = get32(body + 8);
    if (nl == 0 || nl > PC_WIRE_NAME_MAX || get16(body + 2) || get32(body + 12))
        return PC_EINVAL;
    if (n > lim->max_keys)
        return PC_ETOOBIG;
    if (dim == 0 || dim > PC_WIRE_DIM_MAX)
        return PC_EDIM;
    const size_t hl = pc_wire_batch_head_len(nl);
    if ((uint64_t)len != pc_wire_batch_body_len((pc_wire_op_t)op, nl, n, dim))
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
    out->keys = (const uint64_t *)(const void *)(body + hl);
    out->vals = op == PC_OP_PUSH ? (const float *)(const void *)(body + hl + (size_t)n * 8) : NULL;
    return 0;
}
