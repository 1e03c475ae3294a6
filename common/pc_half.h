/* pc_half.h: fp32 <-> bf16 and fp32 <-> fp16 conversion of arrays, for rows on the wire.
 *
 * The data plane can carry rows and gradients as 16-bit floats (docs/wire.md "Compressed
 * rows"); tables and optimizers stay fp32, so each end converts at the boundary: the server
 * from the table's rows into a reply and from a push's gradients into fp32, the client from the
 * caller's fp32 into a request and from a reply into the caller's fp32.
 *
 * Rules (both directions, every kernel, bit for bit):
 *  - fp32 -> bf16 and fp32 -> fp16 round to nearest, ties to even. Subnormal results are kept
 *    (no flush to zero), -0 stays -0.
 *  - fp16 saturates to infinity: a finite fp32 whose rounded value is over 65504 in magnitude
 *    becomes +-Inf (what IEEE rounding to nearest does); bf16 has fp32's range, so only values
 *    that round past FLT_MAX become Inf.
 *  - Inf stays Inf. NaN stays NaN: the sign and the top payload bits are kept and the quiet bit
 *    is set (a signalling NaN comes out quiet), in both directions.
 *  - bf16 -> fp32 and fp16 -> fp32 are exact (every 16-bit value has an fp32), except that a
 *    signalling fp16 NaN comes out quiet (as F16C does).
 *
 * DESIGN: the loops exist twice, as a kernel table per instruction set (pc_half_kernels_t,
 * chosen at run time like ps_optim's): "portable" (integer arithmetic only, any CPU) and "f16c"
 * (x86-64 with F16C and AVX2, checked with __builtin_cpu_supports: VCVTPS2PH / VCVTPH2PS for
 * fp16, AVX2 integer lanes for bf16, 8 floats a step, the tail through the portable code). The
 * functions carry target attributes, so the rest of the build stays baseline x86-64. The two
 * tables are bit-exact: test_half compares them over all 65536 16-bit values and millions of
 * floats (subnormals, ties, NaN payloads, the fp16 overflow edge).
 *
 * Thread rule: pure functions, thread-safe. Arrays may not overlap.
 */
#ifndef PC_HALF_H
#define PC_HALF_H

#include <stddef.h>
#include <stdint.h>

typedef struct pc_half_kernels {
    const char *name; /* "portable" or "f16c" */
    void (*to_bf16)(const float *src, uint16_t *dst, size_t n);
    void (*from_bf16)(const uint16_t *src, float *dst, size_t n);
    void (*to_f16)(const float *src, uint16_t *dst, size_t n);
    void (*from_f16)(const uint16_t *src, float *dst, size_t n);
    /* Stochastic rounding, for weights stored in 16 bits (ps_table's row_dtype): x between its
     * two neighbours lo < x < hi becomes hi with probability (x - lo) / (hi - lo) (to 2^-32), so
     * a rounding is exact on average and small optimizer updates are not lost as they are to
     * rounding to nearest. Element i's random bits are a hash of (seed, i): the same values and
     * seed give the same result, in both kernel tables. A representable value stays as it is
     * (-0 included); NaN and Inf convert as nearest rounding does. A finite value never becomes
     * Inf (a weight a large step pushed past the range stays at the largest finite, 65504 for
     * f16, instead of poisoning its row for good); f16 values below 2^-32 are 0. */
    void (*to_bf16_sr)(const float *src, uint16_t *dst, size_t n, uint64_t seed);
    void (*to_f16_sr)(const float *src, uint16_t *dst, size_t n, uint64_t seed);
} pc_half_kernels_t;

/* The kernels called `name` ("portable", "f16c"), or NULL when there are none of that name or
 * this CPU cannot run them; NULL name: the fastest this CPU runs. Static storage. */
const pc_half_kernels_t *pc_half_kernels(const char *name);

/* One value, portable code (the reference the kernels match). */
uint16_t pc_f32_to_bf16(float f);
float pc_bf16_to_f32(uint16_t h);
uint16_t pc_f32_to_f16(float f);
float pc_f16_to_f32(uint16_t h);

#endif
