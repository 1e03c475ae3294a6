/* The wire codec: headers and batch bodies round-trip; every malformed field is refused with
 * the documented error and nothing is read outside the body. */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"
#include "pc_wire.h"

static const pc_wire_limits_t LIM = {1u << 20, 1000, 0};

static void test_header_roundtrip(void **state) {
    (void)state;
    pc_wire_hdr_t h = {.op = PC_OP_PUSH,
                       .flags = PC_WIRE_RESPONSE,
                       .id = 0x0102030405060708ull,
                       .status = PC_EWRONGSLOT,
                       .body_len = 4096,
                       .map_version = 77},
                  g;
    uint8_t b[PC_WIRE_HDR];
    pc_wire_hdr_encode(&h, b);
    assert_memory_equal(b, "EMBR\x01\x03", 6); /* magic, version, op: as docs/wire.md says */
    assert_int_equal(pc_wire_hdr_decode(b, 1u << 20, &g), 0);
    assert_int_equal(g.op, h.op);
    assert_int_equal(g.flags, h.flags);
    assert_int_equal(g.id, h.id);
    assert_int_equal(g.status, h.status);
    assert_int_equal(g.body_len, h.body_len);
    assert_int_equal(g.map_version, h.map_version);
    /* Over the body limit: PC_ETOOBIG, header still filled in. */
    assert_int_equal(pc_wire_hdr_decode(b, 4095, &g), PC_ETOOBIG);
    assert_int_equal(g.id, h.id);
    /* Magic, version, op, flags. */
    uint8_t x[PC_WIRE_HDR];
    memcpy(x, b, sizeof x);
    x[0] ^= 1;
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    memcpy(x, b, sizeof x);
    x[4] = 2;
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    memcpy(x, b, sizeof x);
    x[5] = 0;
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    x[5] = PC_OP_MAX_ + 1;
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    memcpy(x, b, sizeof x);
    x[7] = 0x80;
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    /* Statuses: a positive one (a pull's rc that says nothing was written, rows untouched), or
     * one on a request. */
    pc_wire_hdr_t y = h;
    y.status = 5;
    pc_wire_hdr_encode(&y, x);
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    y.status = PC_EINVAL;
    y.flags = 0;
    pc_wire_hdr_encode(&y, x);
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), PC_EPARSE);
    y.status = 0;
    pc_wire_hdr_encode(&y, x);
    assert_int_equal(pc_wire_hdr_decode(x, 1u << 20, &g), 0);
}

static void test_batch_roundtrip_and_errors(void **state) {
    (void)state;
    _Alignas(8) static uint8_t body[4096];
    const uint32_t n = 5, dim = 4;
    size_t hl = pc_wire_batch_head_encode("emb.v2", n, dim, body);
    assert_int_equal(hl, 16 + 8);
    uint64_t keys[5] = {1, 2, 3, UINT64_MAX, 0};
    float g[20];
    for (int i = 0; i < 20; i++)
        g[i] = (float)i * 0.5f;
    memcpy(body + hl, keys, sizeof keys);
    memcpy(body + hl + sizeof keys, g, sizeof g);
    uint32_t len = (uint32_t)pc_wire_batch_body_len(PC_OP_PUSH, 6, n, dim);
    assert_int_equal(len, hl + sizeof keys + sizeof g);
    pc_wire_batch_t b;
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), 0);
    assert_string_equal(b.name, "emb.v2");
    assert_int_equal(b.n, n);
    assert_int_equal(b.dim, dim);
    assert_memory_equal(b.keys, keys, sizeof keys);
    assert_memory_equal(b.vals, g, sizeof g);
    /* The same keys as a pull: the gradients are then extra bytes. */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PULL, body, len, &LIM, &b), PC_EINVAL);
    uint32_t plen = (uint32_t)pc_wire_batch_body_len(PC_OP_PULL, 6, n, dim);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PULL, body, plen, &LIM, &b), 0);
    assert_null(b.vals);
    /* Short, long, truncated prefix. */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len - 4, &LIM, &b), PC_EINVAL);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len + 4, &LIM, &b), PC_EINVAL);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, 15, &LIM, &b), PC_EINVAL);
    /* Not a batch op. */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PING, body, len, &LIM, &b), PC_EINVAL);
    uint8_t save[16];
    memcpy(save, body, 16);
    /* Name length 0 and over the maximum; nonzero reserved fields; bad padding; NUL in name. */
    body[0] = 0;
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
    body[0] = 65;
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
    memcpy(body, save, 16);
    body[2] = 1; /* a bf16 push: its gradients take half the bytes, so the length is wrong */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
    body[2] = 3; /* no such element type */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EUNSUPPORTED);
    body[2] = 0;
    body[3] = 1; /* 256 */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EUNSUPPORTED);
    memcpy(body, save, 16);
    /* The last u32: a push's generation epoch (0 as encoded); any other op must carry 0. */
    assert_int_equal(b.epoch, 0);
    pc_wire_batch_set_epoch(body, 256);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), 0);
    assert_int_equal(b.epoch, 256);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PULL, body, plen, &LIM, &b), PC_EINVAL);
    assert_int_equal(pc_wire_batch_decode(PC_OP_LOOKUP, body, plen, &LIM, &b), PC_EINVAL);
    memcpy(body, save, 16);
    body[16 + 7] = 'x'; /* padding after "emb.v2" */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
    body[16 + 7] = 0;
    body[16 + 2] = 0; /* NUL inside the name */
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
    body[16 + 2] = 'b';
    /* Too many keys (checked before the length), dims 0 and over the maximum. */
    uint32_t big = 1001;
    memcpy(body + 4, &big, 4);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_ETOOBIG);
    memcpy(body, save, 16);
    uint32_t d0 = 0, dbig = PC_WIRE_DIM_MAX + 1;
    memcpy(body + 8, &d0, 4);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EDIM);
    memcpy(body + 8, &dbig, 4);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EDIM);
    /* n * dim large enough to overflow 32 bits must not wrap into a small valid length. */
    pc_wire_limits_t wide = {UINT32_MAX, UINT32_MAX, 0};
    uint32_t hn = 0x40000000u, hd = 1024;
    memcpy(body, save, 16);
    memcpy(body + 4, &hn, 4);
    memcpy(body + 8, &hd, 4);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &wide, &b), PC_EINVAL);
}

/* Compressed rows: a typed batch round-trips, its length follows the element type, a reply's
 * flags carry the type (responses only), and a request may not carry type bits. */
static void test_typed_batches(void **state) {
    (void)state;
    _Alignas(8) static uint8_t body[4096];
    const uint32_t n = 3, dim = 5;
    const uint64_t keys[3] = {7, 8, 9};
    uint16_t g[15];
    for (int i = 0; i < 15; i++)
        g[i] = (uint16_t)(0x3c00 + i);
    assert_string_equal(pc_wire_dtype_name(PC_WIRE_F32), "f32");
    assert_string_equal(pc_wire_dtype_name(PC_WIRE_BF16), "bf16");
    assert_string_equal(pc_wire_dtype_name(PC_WIRE_F16), "f16");
    assert_string_equal(pc_wire_dtype_name(3), "?");
    for (int t = PC_WIRE_BF16; t <= PC_WIRE_F16; t++) {
        const pc_wire_dtype_t dt = (pc_wire_dtype_t)t;
        size_t hl = pc_wire_batch_head_encode_typed("emb", n, dim, dt, body);
        assert_int_equal(hl, 24);
        assert_int_equal(body[2], t); /* the u16 at offset 2 */
        assert_int_equal(body[3], 0);
        memcpy(body + hl, keys, sizeof keys);
        memcpy(body + hl + sizeof keys, g, sizeof g);
        const uint32_t len = (uint32_t)pc_wire_batch_body_len_typed(PC_OP_PUSH, 3, n, dim, dt);
        assert_int_equal(len, hl + sizeof keys + sizeof g);
        assert_int_equal(len + sizeof g, pc_wire_batch_body_len(PC_OP_PUSH, 3, n, dim));
        pc_wire_batch_t b;
        assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), 0);
        assert_int_equal(b.dtype, dt);
        assert_null(b.vals);
        assert_non_null(b.vals16);
        assert_memory_equal(b.vals16, g, sizeof g);
        assert_memory_equal(b.keys, keys, sizeof keys);
        /* as f32 it would need twice the gradient bytes */
        assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len + sizeof g, &LIM, &b),
                         PC_EINVAL);
        /* a typed pull: the same length as an f32 one */
        const uint32_t plen = (uint32_t)pc_wire_batch_body_len_typed(PC_OP_PULL, 3, n, dim, dt);
        assert_int_equal(plen, pc_wire_batch_body_len(PC_OP_PULL, 3, n, dim));
        assert_int_equal(pc_wire_batch_decode(PC_OP_LOOKUP, body, plen, &LIM, &b), 0);
        assert_int_equal(b.dtype, dt);
        assert_null(b.vals16);
        /* reply sizes: 2 bytes an element */
        assert_int_equal(pc_wire_reply_len_typed(PC_OP_PULL, 10, 4, dt), 80);
        assert_int_equal(pc_wire_reply_len_typed(PC_OP_LOOKUP, 10, 4, dt), 90);
        assert_int_equal(pc_wire_reply_len_typed(PC_OP_PUSH, 10, 4, dt), 24);
    }
    char msg[160];
    assert_int_equal(
        pc_wire_reply_check_typed(PC_OP_PULL, 1000, 600, PC_WIRE_BF16, 1u << 20, msg, sizeof msg),
        PC_ETOOBIG);
    assert_string_equal(msg, "pull of 1000 rows x dim 600 in bf16 = 1.14 MiB over the reply "
                             "limit of 1 MiB");
    assert_int_equal(
        pc_wire_reply_check_typed(PC_OP_PULL, 1000, 500, PC_WIRE_F16, 1u << 20, msg, sizeof msg),
        0); /* 1,000,000 bytes: fits in f16, not in f32 */
    assert_int_equal(pc_wire_reply_check(PC_OP_PULL, 1000, 500, 1u << 20, msg, sizeof msg),
                     PC_ETOOBIG);
    /* Header flags: a reply's element type; none in a request; type 3 is no type. */
    uint8_t hb[PC_WIRE_HDR];
    pc_wire_hdr_t h = {.op = PC_OP_PULL,
                       .flags = PC_WIRE_RESPONSE | (PC_WIRE_F16 << PC_WIRE_DTYPE_SHIFT),
                       .id = 5},
                  g2;
    pc_wire_hdr_encode(&h, hb);
    assert_int_equal(pc_wire_hdr_decode(hb, 1u << 20, &g2), 0);
    assert_int_equal(pc_wire_hdr_dtype(&g2), PC_WIRE_F16);
    h.flags = PC_WIRE_RESPONSE;
    pc_wire_hdr_encode(&h, hb);
    assert_int_equal(pc_wire_hdr_decode(hb, 1u << 20, &g2), 0);
    assert_int_equal(pc_wire_hdr_dtype(&g2), PC_WIRE_F32);
    h.flags = PC_WIRE_RESPONSE | PC_WIRE_DTYPE_MASK;
    pc_wire_hdr_encode(&h, hb);
    assert_int_equal(pc_wire_hdr_decode(hb, 1u << 20, &g2), PC_EPARSE);
    h.flags = PC_WIRE_BF16 << PC_WIRE_DTYPE_SHIFT; /* a request with type bits */
    pc_wire_hdr_encode(&h, hb);
    assert_int_equal(pc_wire_hdr_decode(hb, 1u << 20, &g2), PC_EPARSE);
    h.flags = PC_WIRE_RESPONSE | 0x8;
    pc_wire_hdr_encode(&h, hb);
    assert_int_equal(pc_wire_hdr_decode(hb, 1u << 20, &g2), PC_EPARSE);
}

/* Reply sizes against the reply limit, and the message that names them. */
static void test_reply_limit(void **state) {
    (void)state;
    char msg[160];
    assert_int_equal(pc_wire_reply_len(PC_OP_PULL, 10, 4), 160);
    assert_int_equal(pc_wire_reply_len(PC_OP_LOOKUP, 10, 4), 170);
    assert_int_equal(pc_wire_reply_len(PC_OP_PUSH, 1u << 30, 1024), 24);
    const uint64_t lim = 64u << 20;
    assert_int_equal(pc_wire_reply_check(PC_OP_LOOKUP, 16000, 1024, lim, msg, sizeof msg), 0);
    assert_int_equal(pc_wire_reply_check(PC_OP_PULL, 16384, 1024, lim, msg, sizeof msg), 0);
    assert_int_equal(pc_wire_reply_check(PC_OP_LOOKUP, 16384, 1024, lim, msg, sizeof msg),
                     PC_ETOOBIG); /* 64 MiB of rows + 16 KiB found bytes */
    assert_int_equal(pc_wire_reply_check(PC_OP_LOOKUP, 2097152, 1024, lim, msg, sizeof msg),
                     PC_ETOOBIG);
    assert_string_equal(msg,
                        "lookup of 2097152 rows x dim 1024 = 8 GiB over the reply limit of 64 MiB");
    assert_int_equal(pc_wire_reply_check(PC_OP_PULL, 1000, 300, 1u << 20, msg, sizeof msg),
                     PC_ETOOBIG);
    assert_string_equal(msg,
                        "pull of 1000 rows x dim 300 = 1.14 MiB over the reply limit of 1 MiB");
    /* No limit; PUSH replies are counters; a NULL message is allowed. */
    assert_int_equal(pc_wire_reply_check(PC_OP_PULL, 1u << 30, 1024, 0, msg, sizeof msg), 0);
    assert_int_equal(pc_wire_reply_check(PC_OP_PUSH, 1u << 30, 1024, 1024, NULL, 0), 0);
    assert_int_equal(pc_wire_reply_check(PC_OP_PULL, 1u << 30, 1024, 1024, NULL, 0), PC_ETOOBIG);
}

/* CLAIM bodies and replies: round trips, and every malformed body refused. */
/* The delta stream's request and reply: round trips, and every malformation refused. */
static void test_stream_codec(void **state) {
    (void)state;
    pc_wire_stream_t q = {.name = "emb",
                          .max = 500,
                          .part = 3,
                          .parts = 8,
                          .from = 1234567,
                          .uid = 0xABCDEF0123456789ULL},
                     d;
    uint8_t b[200];
    const size_t len = pc_wire_stream_encode(&q, b);
    assert_int_equal(len, pc_wire_stream_len(3, 0));
    assert_int_equal(len, 16 + 8 + 16);
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    assert_string_equal(d.name, "emb");
    assert_true(d.max == 500 && d.part == 3 && d.parts == 8 && d.from == 1234567 &&
                d.uid == 0xABCDEF0123456789ULL);
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len - 1, &d), PC_EINVAL); /* short */
    b[16 + 5] = 1; /* a padding byte */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    b[16 + 5] = 0;
    b[2] = 64; /* a flag that does not exist */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    b[2] = PC_STREAM_BACKUP; /* a backup's copy without the map it copies under */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    b[2] = PC_STREAM_STATE | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP; /* `from` names the backup */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    assert_true(d.flags == (PC_STREAM_STATE | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP) &&
                d.from == 1234567);
    b[2] = PC_STREAM_STATE | PC_STREAM_SAME_MAP; /* a copy under the header's map */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    assert_true(d.flags == (PC_STREAM_STATE | PC_STREAM_SAME_MAP));
    b[2] = PC_STREAM_ACK; /* an acknowledging follower with parts != 0 */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    b[2] = 0;
    q.flags = PC_STREAM_STATE | PC_STREAM_ACK;
    q.parts = 0;
    assert_int_equal(pc_wire_stream_encode(&q, b), len);
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    assert_true(d.flags == (PC_STREAM_STATE | PC_STREAM_ACK) && d.part == 3 && d.parts == 0);
    b[8] = b[9] = b[10] = b[11] = 0xff; /* a server index no cluster has */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    b[8] = 3, b[9] = b[10] = b[11] = 0;
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    b[2] = PC_STREAM_ACK | PC_STREAM_SAME_MAP; /* SAME_MAP is for copies (SCAN), not DELTAS */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    b[2] = PC_STREAM_ACK | PC_STREAM_CAUGHT; /* a backup caught up says so with its ACK */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    assert_true(d.flags == (PC_STREAM_ACK | PC_STREAM_CAUGHT));
    b[2] = PC_STREAM_CAUGHT; /* and only with it */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    /* A cold table's walk: 8 bytes more, the page's start key (0 on a part of the RAM rows). */
    q.flags = PC_STREAM_STATE | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP | PC_STREAM_COLD;
    q.part = q.parts = 8;
    q.start = 0xFEDCBA9876543210ULL;
    const size_t clen = pc_wire_stream_encode(&q, b);
    assert_int_equal(clen, len + 8);
    assert_int_equal(clen, pc_wire_stream_len(3, PC_STREAM_COLD));
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)clen, &d), 0);
    assert_true(d.flags == q.flags && d.part == 8 && d.parts == 8 && d.start == q.start);
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL); /* no start */
    b[8] = 2; /* part 2 of 8: RAM rows, which start nowhere */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)clen, &d), PC_EINVAL);
    q.part = 2;
    q.start = 0;
    pc_wire_stream_encode(&q, b);
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)clen, &d), 0);
    assert_true(d.part == 2 && d.start == 0);
    b[2] = PC_STREAM_COLD | PC_STREAM_ACK; /* a walk is a scan, not an acknowledging DELTAS */
    b[12] = b[13] = b[14] = b[15] = 0;
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)clen, &d), PC_EINVAL);
    q.flags = 0;
    q.part = 3;
    q.parts = 8;
    q.start = 77; /* without the flag, neither written nor read */
    assert_int_equal(pc_wire_stream_encode(&q, b), len);
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), 0);
    assert_true(d.start == 0);
    b[0] = 0; /* no name */
    assert_int_equal(pc_wire_stream_decode(b, (uint32_t)len, &d), PC_EINVAL);
    pc_wire_stream_t noname = {.name = ""};
    assert_int_equal(pc_wire_stream_encode(&noname, b), 0);
    /* a reply of 3 rows of dim 2: prefix, keys, found padded to 8, rows */
    assert_int_equal(pc_wire_stream_found_off(3), 48 + 24);
    assert_int_equal(pc_wire_stream_rows_off(3), 48 + 24 + 8);
    assert_int_equal(pc_wire_stream_reply_len(3, 2), 48 + 24 + 8 + 24);
    pc_wire_stream_reply_t r = {7, 10, 13, 20, 5, 3, 2}, e;
    uint8_t rb[104] = {0};
    pc_wire_stream_reply_encode(&r, rb);
    assert_int_equal(pc_wire_stream_reply_decode(rb, 104, &e), 0);
    assert_true(e.uid == 7 && e.from == 10 && e.next == 13 && e.head == 20 && e.oldest == 5 &&
                e.n == 3 && e.dim == 2);
    assert_int_equal(pc_wire_stream_reply_decode(rb, 103, &e), PC_EINVAL);
    assert_int_equal(pc_wire_stream_reply_decode(rb, 40, &e), PC_EINVAL);
    rb[72] = 1; /* found bytes 0 or 1, padding 0 */
    assert_int_equal(pc_wire_stream_reply_decode(rb, 104, &e), 0);
    rb[73] = 2;
    assert_int_equal(pc_wire_stream_reply_decode(rb, 104, &e), PC_EINVAL);
    rb[73] = 0;
    rb[76] = 1;
    assert_int_equal(pc_wire_stream_reply_decode(rb, 104, &e), PC_EINVAL);
    rb[76] = 0;
    r.dim = PC_WIRE_STREAM_STRIDE_MAX + 1;
    pc_wire_stream_reply_encode(&r, rb);
    assert_int_equal(pc_wire_stream_reply_decode(rb, 104, &e), PC_EINVAL);
}

static void test_claim_codec(void **state) {
    (void)state;
    uint8_t b[512] __attribute__((aligned(8)));
    const size_t len = pc_wire_claim_encode("emb", "job/run/3", 2, 0, b);
    assert_int_equal(len, pc_wire_claim_len(3, 9));
    assert_int_equal(len, PC_WIRE_PREFIX + 8 + 9);
    pc_wire_claim_t q;
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len, &q), 0);
    assert_string_equal(q.name, "emb");
    assert_string_equal(q.job, "job/run/3");
    assert_int_equal(q.mode, 2);
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len - 1, &q), PC_EINVAL); /* short */
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len + 1, &q), PC_EINVAL); /* long */
    assert_int_equal(pc_wire_claim_decode(b, 8, &q), PC_EINVAL);
    b[PC_WIRE_PREFIX + 4] = 1; /* padding */
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len, &q), PC_EINVAL);
    b[PC_WIRE_PREFIX + 4] = 0;
    b[len - 1] = 0; /* a NUL inside the job */
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len, &q), PC_EINVAL);
    b[len - 1] = '3';
    b[12] = 1; /* reserved */
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len, &q), PC_EINVAL);
    b[12] = 0;
    b[4] = 200; /* job_len over the maximum */
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)len, &q), PC_EINVAL);
    char big[200];
    memset(big, 'j', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(pc_wire_claim_encode("emb", big, 0, 0, b), 0); /* refused, nothing written */
    assert_int_equal(pc_wire_claim_encode("", "j", 0, 0, b), 0);
    /* a fence's epoch travels in the prefix's third u32 */
    const size_t fl = pc_wire_claim_encode("emb", "job/run/3", 4, 77, b);
    assert_int_equal(pc_wire_claim_decode(b, (uint32_t)fl, &q), 0);
    assert_int_equal(q.mode, 4);
    assert_int_equal(q.epoch, 77);

    pc_wire_claim_reply_t r = {.action = 3, .dim = 16, .rows = 7, .version = 9}, back;
    snprintf(r.previous, sizeof r.previous, "old/run/0");
    snprintf(r.config, sizeof r.config, "name=emb,dim=16,optimizer=adagrad");
    const size_t rl = pc_wire_claim_reply_encode(&r, b);
    assert_int_equal(rl, pc_wire_claim_reply_len(&r));
    assert_int_equal(pc_wire_claim_reply_decode(b, (uint32_t)rl, &back), 0);
    assert_int_equal(back.action, 3);
    assert_int_equal(back.dim, 16);
    assert_int_equal(back.rows, 7);
    assert_int_equal(back.version, 9);
    assert_string_equal(back.previous, "old/run/0");
    assert_string_equal(back.config, r.config);
    assert_int_equal(pc_wire_claim_reply_decode(b, (uint32_t)rl - 1, &back), PC_EINVAL);
    assert_int_equal(pc_wire_claim_reply_decode(b, 31, &back), PC_EINVAL);
    b[30] = 1; /* reserved */
    assert_int_equal(pc_wire_claim_reply_decode(b, (uint32_t)rl, &back), PC_EINVAL);
    b[30] = 0;
    r.action = PC_WIRE_CLAIM_ACTIONS; /* no such action: psclient indexed a table with it */
    pc_wire_claim_reply_encode(&r, b);
    assert_int_equal(pc_wire_claim_reply_decode(b, (uint32_t)rl, &back), PC_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_roundtrip), cmocka_unit_test(test_batch_roundtrip_and_errors),
        cmocka_unit_test(test_reply_limit),      cmocka_unit_test(test_claim_codec),
        cmocka_unit_test(test_stream_codec),     cmocka_unit_test(test_typed_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
