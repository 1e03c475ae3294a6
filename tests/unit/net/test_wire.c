/* The wire codec: headers and batch bodies round-trip; every malformed field is refused with
 * the documented error and nothing is read outside the body. */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"
#include "pc_wire.h"

static const pc_wire_limits_t LIM = {1u << 20, 1000};

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
    body[2] = 1;
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
    memcpy(body, save, 16);
    body[13] = 1;
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &LIM, &b), PC_EINVAL);
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
    pc_wire_limits_t wide = {UINT32_MAX, UINT32_MAX};
    uint32_t hn = 0x40000000u, hd = 1024;
    memcpy(body, save, 16);
    memcpy(body + 4, &hn, 4);
    memcpy(body + 8, &hd, 4);
    assert_int_equal(pc_wire_batch_decode(PC_OP_PUSH, body, len, &wide, &b), PC_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_roundtrip),
        cmocka_unit_test(test_batch_roundtrip_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
