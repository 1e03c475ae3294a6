/* pc_half.c: see pc_half.h (the rules, and why two kernel tables). */
#include "pc_half.h"

#include <stdbool.h>
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define PC_HAVE_F16C 1
#endif

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ==== portable ============================================================================= */

uint16_t pc_f32_to_bf16(float f) {
    const uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, set the quiet bit */
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* ties to even; may reach Inf */
}

float pc_bf16_to_f32(uint16_t h) {
    return u2f((uint32_t)h << 16);
}

uint16_t pc_f32_to_f16(float f) {
    const uint32_t u = f2u(f), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) /* NaN: quiet, the top 9 payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and up round past 65504 (a tie to the even 65536): Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) /* a normal fp16: drop 13 bits, ties to even, carry into the exponent */
        return (uint16_t)(sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10)));
    const uint32_t e = a >> 23; /* a subnormal fp16 (or 0): value / 2^-24, rounded */
    if (e < 102)                /* below 2^-25: rounds to 0 */
        return sign;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may become 0x400, the smallest normal: the same encoding */
    return (uint16_t)(sign | q);
}

float pc_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) /* Inf, or NaN made quiet */
        return u2f(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp == 0) /* 0 or subnormal: mant * 2^-24, exact in fp32 */
        return u2f(sign | f2u((float)mant * 0x1p-24f));
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* ---- stochastic rounding ---------------------------------------------------------------- *
 * Element i of a call draws r = hash32(key + i * golden) (a 32-bit finalizer: counter-based, so
 * the vector kernels compute the same bits lane by lane), and rounds away from zero when r lies
 * below the cut-off bits' share of 2^32: rem / 2^cut, the distance to the lower neighbour in
 * units of the gap (fp32 values are evenly spaced between two 16-bit neighbours). */

static inline uint32_t sr_key(uint64_t seed) {
    return (uint32_t)(seed ^ (seed >> 32));
}

static inline uint32_t sr_bits(uint32_t key, uint32_t i) {
    uint32_t x = key + i * 0x9E3779B9u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static inline uint16_t bf16_sr1(float f, uint32_t r) {
    const uint32_t u = f2u(f);
    if ((u & 0x7f800000u) == 0x7f800000u) /* Inf, NaN */
        return pc_f32_to_bf16(f);
    uint32_t h = (u >> 16) + (r < ((u & 0xffffu) << 16));
    if ((h & 0x7f80u) == 0x7f80u)
        h--; /* past the largest finite: stay finite */
    return (uint16_t)h;
}

static inline uint16_t f16_sr1(float f, uint32_t r) {
    const uint32_t u = f2u(f), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a >= 0x7f800000u) /* Inf, NaN: as nearest rounding */
        return pc_f32_to_f16(f);
    if (a > 0x477fe000u) /* past 65504: the largest finite (a weight never becomes Inf) */
        return (uint16_t)(sign | 0x7bffu);
    if (a >= 0x38800000u) /* normal: 13 bits cut; a carry may bump the exponent */
        return (uint16_t)(sign | (((a >> 13) - (112u << 10)) + (r < ((a & 0x1fffu) << 19))));
    const uint32_t e = a >> 23;
    if (e < 94) /* below 2^-32 (0 included): 0; its chance of 2^-24 would be under 2^-8 */
        return sign;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..32 */
    const uint64_t rem = mant & ((UINT64_C(1) << shift) - 1);
    return (uint16_t)(sign | ((uint32_t)((uint64_t)mant >> shift) +
                              (r < (uint32_t)(rem << (32 - shift)))));
}

static void p_to_bf16_sr_from(const float *src, uint16_t *dst, size_t i, size_t n, uint32_t key) {
    for (; i < n; i++)
        dst[i] = bf16_sr1(src[i], sr_bits(key, (uint32_t)i));
}

static void p_to_f16_sr_from(const float *src, uint16_t *dst, size_t i, size_t n, uint32_t key) {
    for (; i < n; i++)
        dst[i] = f16_sr1(src[i], sr_bits(key, (uint32_t)i));
}

static void p_to_bf16_sr(const float *src, uint16_t *dst, size_t n, uint64_t seed) {
    p_to_bf16_sr_from(src, dst, 0, n, sr_key(seed));
}

static void p_to_f16_sr(const float *src, uint16_t *dst, size_t n, uint64_t seed) {
    p_to_f16_sr_from(src, dst, 0, n, sr_key(seed));
}

static void p_to_bf16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = pc_f32_to_bf16(src[i]);
}

static void p_from_bf16(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = pc_bf16_to_f32(src[i]);
}

static void p_to_f16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = pc_f32_to_f16(src[i]);
}

static void p_from_f16(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = pc_f16_to_f32(src[i]);
}

/* ==== F16C + AVX2 ========================================================================== */

#ifdef PC_HAVE_F16C
#define F16C_FN __attribute__((target("avx2,f16c")))

/* 8 x u32 (each <= 0xffff) -> 8 x u16 at dst: pack per 128-bit lane, then put lanes in order. */
static F16C_FN inline void v_store16(uint16_t *dst, __m256i v) {
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128((__m128i *)(void *)dst, _mm256_castsi256_si128(p));
}

static F16C_FN void v_to_bf16(const float *src, uint16_t *dst, size_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                  one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                  quiet = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        const __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        v_store16(dst + i, v);
    }
    p_to_bf16(src + i, dst + i, n - i);
}

static F16C_FN void v_from_bf16(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), u);
    }
    p_from_bf16(src + i, dst + i, n - i);
}

static F16C_FN void v_to_f16(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    p_to_f16(src + i, dst + i, n - i);
}

static F16C_FN void v_from_f16(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    p_from_f16(src + i, dst + i, n - i);
}
/* The hash of sr_bits for lanes i..i+7. */
static F16C_FN inline __m256i v_sr_bits(uint32_t key, size_t i) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)i), lane);
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32((int)key),
                                 _mm256_mullo_epi32(idx, _mm256_set1_epi32((int)0x9E3779B9u)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* All ones in the lanes where a < b, unsigned. */
static F16C_FN inline __m256i v_ltu(__m256i a, __m256i b) {
    const __m256i flip = _mm256_set1_epi32((int)0x80000000u);
    return _mm256_cmpgt_epi32(_mm256_xor_si256(b, flip), _mm256_xor_si256(a, flip));
}

static F16C_FN void v_to_bf16_sr(const float *src, uint16_t *dst, size_t n, uint64_t seed) {
    const uint32_t key = sr_key(seed);
    const __m256i expm = _mm256_set1_epi32(0x7f800000), abs = _mm256_set1_epi32(0x7fffffff),
                  lo16 = _mm256_set1_epi32(0xffff), e80 = _mm256_set1_epi32(0x7f80),
                  quiet = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i r = v_sr_bits(key, i);
        const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i up = v_ltu(r, _mm256_slli_epi32(_mm256_and_si256(u, lo16), 16));
        __m256i h = _mm256_sub_epi32(hi, up); /* up is -1 where rounding up */
        h = _mm256_add_epi32(h, _mm256_cmpeq_epi32(_mm256_and_si256(h, e80), e80));
        const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(u, expm), expm);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), expm);
        const __m256i hs = _mm256_or_si256(hi, _mm256_and_si256(nan, quiet));
        v_store16(dst + i, _mm256_blendv_epi8(h, hs, special));
    }
    p_to_bf16_sr_from(src, dst, i, n, key);
}

static F16C_FN void v_to_f16_sr(const float *src, uint16_t *dst, size_t n, uint64_t seed) {
    const uint32_t key = sr_key(seed);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), one = _mm256_set1_epi32(1),
                  m13 = _mm256_set1_epi32(0x1fff), bias = _mm256_set1_epi32(112 << 10),
                  m23 = _mm256_set1_epi32(0x7fffff), imp = _mm256_set1_epi32(0x800000),
                  c126 = _mm256_set1_epi32(126), c32 = _mm256_set1_epi32(32),
                  s8000 = _mm256_set1_epi32(0x8000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i r = v_sr_bits(key, i);
        const __m256 f = _mm256_loadu_ps(src + i);
        const __m256i u = _mm256_castps_si256(f), a = _mm256_and_si256(u, abs);
        const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), s8000);
        /* normal */
        const __m256i upn = v_ltu(r, _mm256_slli_epi32(_mm256_and_si256(a, m13), 19));
        const __m256i qn = _mm256_sub_epi32(_mm256_sub_epi32(_mm256_srli_epi32(a, 13), bias), upn);
        /* subnormal (and below: counts past 31 shift everything out, so those give 0) */
        const __m256i shift = _mm256_sub_epi32(c126, _mm256_srli_epi32(a, 23));
        const __m256i mant = _mm256_or_si256(_mm256_and_si256(a, m23), imp);
        const __m256i mask = _mm256_sub_epi32(_mm256_sllv_epi32(one, shift), one);
        const __m256i thr =
            _mm256_sllv_epi32(_mm256_and_si256(mant, mask), _mm256_sub_epi32(c32, shift));
        const __m256i qs = _mm256_sub_epi32(_mm256_srlv_epi32(mant, shift), v_ltu(r, thr));
        const __m256i normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x387fffff));
        __m256i q = _mm256_or_si256(sign, _mm256_blendv_epi8(qs, qn, normal));
        q = _mm256_blendv_epi8(q, _mm256_or_si256(sign, _mm256_set1_epi32(0x7bff)),
                               _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x477fe000)));
        const __m256i near = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
        q = _mm256_blendv_epi8(q, near, _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f7fffff)));
        v_store16(dst + i, q);
    }
    p_to_f16_sr_from(src, dst, i, n, key);
}
#endif /* PC_HAVE_F16C */

/* ==== kernel tables ======================================================================== */

static const pc_half_kernels_t k_portable = {"portable", p_to_bf16,    p_from_bf16, p_to_f16,
                                             p_from_f16, p_to_bf16_sr, p_to_f16_sr};
#ifdef PC_HAVE_F16C
static const pc_half_kernels_t k_f16c = {"f16c",     v_to_bf16,    v_from_bf16, v_to_f16,
                                         v_from_f16, v_to_bf16_sr, v_to_f16_sr};
#endif

#ifdef PC_HAVE_F16C
/* Whether the CPU has F16C and AVX2, asked once: CPUID traps to the hypervisor on a VM, and the
 * kernels are picked on every batch of the data plane's hot path. */
static bool g_f16c;
static pthread_once_t g_f16c_once = PTHREAD_ONCE_INIT;

static void f16c_probe(void) {
    __builtin_cpu_init(); /* idempotent; needed when called from another constructor */
    /* F16C from CPUID leaf 1 (ECX bit 29: clang's __builtin_cpu_supports has no "f16c"); AVX2
     * through the builtin, which also checks that the OS saves the AVX state. */
    unsigned a, b, c, d;
    g_f16c = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

const pc_half_kernels_t *pc_half_kernels(const char *name) {
#ifdef PC_HAVE_F16C
    pthread_once(&g_f16c_once, f16c_probe);
    const bool f16c = g_f16c;
    if (!name)
        return f16c ? &k_f16c : &k_portable;
    if (!strcmp(name, "f16c"))
        return f16c ? &k_f16c : NULL;
#else
    if (!name)
        return &k_portable;
#endif
    return !strcmp(name, "portable") ? &k_portable : NULL;
}
