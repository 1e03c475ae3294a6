/* pc_half: fp32 <-> bf16 / fp16 conversions. Every 16-bit value both ways, and millions of
 * floats (a stride over all 2^32 bit patterns, random ones, the rounding ties, the fp16
 * overflow and subnormal edges, NaN payloads): the portable code against an independent
 * reference (GCC's _Float16, and exact rounding in double for bf16), and the vector kernels
 * (when this CPU has them) bit for bit against the portable code, at every array length mod 8. */
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_half.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool is_nan16(uint16_t h) {
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

/* Reference fp32 -> bf16, round to nearest even, computed in double (finite and Inf only). */
static uint16_t ref_bf16(float f) {
    const uint32_t u = f2u(f);
    const uint16_t lo = (uint16_t)(u >> 16);
    if ((u & 0xffff) == 0)
        return lo;
    const uint16_t hi = (uint16_t)(lo + 1); /* the next bf16 away from zero (may be Inf) */
    const double x = fabs((double)f), a = fabs((double)u2f((uint32_t)lo << 16));
    double b = fabs((double)u2f((uint32_t)hi << 16));
    if (isinf(b)) /* rounding past FLT_MAX: the bf16 grid continues one step above */
        b = a + ldexp(1.0, 128 - 8);
    if (x - a < b - x)
        return lo;
    if (x - a > b - x)
        return hi;
    return (lo & 1) ? hi : lo;
}

/* Reference fp32 -> fp16 (finite and Inf): GCC's software conversion. */
static uint16_t ref_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t v;
    memcpy(&v, &h, 2);
    return v;
}

/* The two neighbours of x in a 16-bit type (equal when x is representable), from the nearest
 * rounding, which test_many_floats checks against the independent references above. */
static void neighbours(bool f16, float x, uint16_t *lo, uint16_t *hi) {
    const uint16_t n = f16 ? pc_f32_to_f16(x) : pc_f32_to_bf16(x);
    const float d = f16 ? pc_f16_to_f32(n) : pc_bf16_to_f32(n);
    *lo = *hi = n;
    if (d == x)
        return;
    if (fabsf(d) < fabsf(x))
        *hi = (uint16_t)(n + 1); /* sign-magnitude: +1 is one step away from zero */
    else
        *lo = (uint16_t)(n - 1);
}

static float dec16(bool f16, uint16_t h) {
    return f16 ? pc_f16_to_f32(h) : pc_bf16_to_f32(h);
}

static void check_f32(const pc_half_kernels_t *k, const float *src, size_t n) {
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        const float f = src[i];
        const uint16_t hb = pc_f32_to_bf16(f), hf = pc_f32_to_f16(f);
        if (isnan(f)) {
            assert_true((hb & 0x7f80) == 0x7f80 && (hb & 0x40)); /* a quiet NaN */
            assert_int_equal(hb & 0x8000, (f2u(f) >> 16) & 0x8000);
            assert_true(is_nan16(hf) && (hf & 0x200));
            assert_int_equal(hf & 0x8000, (f2u(f) >> 16) & 0x8000);
        } else {
            if (hb != ref_bf16(f))
                fail_msg("bf16 of %a (0x%08x): 0x%04x, expected 0x%04x", f, f2u(f), hb,
                         ref_bf16(f));
            if (hf != ref_f16(f))
                fail_msg("fp16 of %a (0x%08x): 0x%04x, expected 0x%04x", f, f2u(f), hf, ref_f16(f));
        }
        a[i] = hb;
    }
    /* Stochastic rounding (portable): one of the two neighbours, bracketing x. */
    const pc_half_kernels_t *p = pc_half_kernels("portable");
    for (int f16 = 0; f16 < 2; f16++) {
        (f16 ? p->to_f16_sr : p->to_bf16_sr)(src, b, n, n * 31 + (size_t)f16);
        for (size_t i = 0; i < n; i++) {
            if (isnan(src[i]))
                continue;
            uint16_t lo, hi;
            neighbours(f16, src[i], &lo, &hi);
            const bool sat = f16 && isfinite(src[i]) && fabsf(src[i]) > 65504.f;
            if (b[i] != lo && b[i] != hi && !(sat && (b[i] & 0x7fff) == 0x7bff) &&
                !(f16 && fabsf(src[i]) < 0x1p-32f && (b[i] & 0x7fff) == 0) &&
                !(!f16 && isfinite(src[i]) && (b[i] & 0x7fff) == 0x7f7f))
                fail_msg("%s sr of %a (0x%08x): 0x%04x, not 0x%04x or 0x%04x",
                         f16 ? "fp16" : "bf16", (double)src[i], f2u(src[i]), b[i], lo, hi);
        }
    }
    if (k) { /* the vector kernels, bit for bit; every offset and length mod 8 */
        const size_t off = n % 7;
        for (uint64_t seed = 1; seed < 8; seed++) { /* odd seeds bf16, even ones fp16 */
            const bool f16 = !(seed & 1);
            (f16 ? p->to_f16_sr : p->to_bf16_sr)(src + off, a + off, n - off, seed);
            (f16 ? k->to_f16_sr : k->to_bf16_sr)(src + off, b + off, n - off, seed);
            for (size_t i = off; i < n; i++)
                if (a[i] != b[i])
                    fail_msg("%s %s sr of 0x%08x: 0x%04x, portable 0x%04x", k->name,
                             f16 ? "fp16" : "bf16", f2u(src[i]), b[i], a[i]);
        }
        for (size_t i = 0; i < n; i++)
            a[i] = pc_f32_to_bf16(src[i]);
        k->to_bf16(src + off, b + off, n - off);
        for (size_t i = off; i < n; i++)
            if (a[i] != b[i])
                fail_msg("%s bf16 of 0x%08x: 0x%04x, portable 0x%04x", k->name, f2u(src[i]), b[i],
                         a[i]);
        for (size_t i = 0; i < n; i++)
            a[i] = pc_f32_to_f16(src[i]);
        k->to_f16(src + off, b + off, n - off);
        for (size_t i = off; i < n; i++)
            if (a[i] != b[i])
                fail_msg("%s fp16 of 0x%08x: 0x%04x, portable 0x%04x", k->name, f2u(src[i]), b[i],
                         a[i]);
    }
    free(a);
    free(b);
}

static void test_all_halves(void **state) {
    (void)state;
    const pc_half_kernels_t *k = pc_half_kernels("f16c");
    printf("kernels: %s (fastest here: %s)\n", k ? "portable and f16c" : "portable only",
           pc_half_kernels(NULL)->name);
    assert_non_null(pc_half_kernels("portable"));
    assert_null(pc_half_kernels("nope"));
    static uint16_t h[65536], back[65536];
    static float f[65536], g[65536];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    /* fp16 -> fp32: exact (the reference: GCC's _Float16); NaN stays NaN, made quiet. */
    for (uint32_t i = 0; i < 65536; i++) {
        f[i] = pc_f16_to_f32(h[i]);
        _Float16 r;
        memcpy(&r, &h[i], 2);
        if (is_nan16(h[i])) {
            assert_true(isnan(f[i]));
            assert_int_equal(f2u(f[i]) & 0x80000000u, (uint32_t)(h[i] & 0x8000) << 16);
            assert_int_equal((f2u(f[i]) >> 13) & 0x3ff, (h[i] & 0x3ff) | 0x200);
        } else {
            assert_int_equal(f2u(f[i]), f2u((float)r));
            assert_int_equal(pc_f32_to_f16(f[i]), h[i]); /* and back, unchanged */
        }
    }
    /* bf16 -> fp32: exact, a shift; and back unchanged (NaN made quiet). */
    for (uint32_t i = 0; i < 65536; i++) {
        const float b = pc_bf16_to_f32(h[i]);
        assert_int_equal(f2u(b), i << 16);
        const uint16_t r = pc_f32_to_bf16(b);
        assert_int_equal(r, isnan(b) ? (h[i] | 0x40) : h[i]);
    }
    if (!k)
        return;
    for (size_t off = 0; off < 8; off++) { /* every alignment of the tail */
        k->from_f16(h + off, g + off, 65536 - off);
        for (uint32_t i = (uint32_t)off; i < 65536; i++)
            if (f2u(g[i]) != f2u(f[i]))
                fail_msg("f16c fp16 0x%04x: 0x%08x, portable 0x%08x", i, f2u(g[i]), f2u(f[i]));
        k->from_bf16(h + off, g + off, 65536 - off);
        for (uint32_t i = (uint32_t)off; i < 65536; i++)
            assert_int_equal(f2u(g[i]), i << 16);
    }
    k->to_f16(f, back, 65536); /* fp16 -> fp32 -> fp16 through the vector kernels */
    for (uint32_t i = 0; i < 65536; i++)
        assert_int_equal(back[i], is_nan16(h[i]) ? (h[i] | 0x200) : h[i]);
}

static void test_many_floats(void **state) {
    (void)state;
    const pc_half_kernels_t *k = pc_half_kernels("f16c");
    enum { CHUNK = 1 << 20 };
    float *src = malloc(CHUNK * sizeof *src);
    assert_non_null(src);
    size_t n = 0, total = 0;
#define ADD(u)                         \
    do {                               \
        src[n++] = u2f((uint32_t)(u)); \
        if (n == CHUNK) {              \
            check_f32(k, src, n);      \
            total += n;                \
            n = 0;                     \
        }                              \
    } while (0)
    for (uint64_t u = 0; u < (1ull << 32); u += 257) /* a stride over every bit pattern */
        ADD(u);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4 << 20; i++) { /* random patterns */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ADD(x);
    }
    for (uint32_t e = 0; e < 256; e++) /* ties and their neighbours, for both formats */
        for (uint32_t m = 0; m < 64; m++)
            for (int s = 0; s < 2; s++) {
                const uint32_t base = (uint32_t)s << 31 | e << 23 | m << 17;
                ADD(base | 0x1000);
                ADD(base | 0x0fff);
                ADD(base | 0x1001);
                ADD(base | 0x3000);
                ADD(base | 0x8000);
                ADD(base | 0x18000);
                ADD(base | 0x7fff);
                ADD(base | 0x8001);
            }
    for (uint32_t u = 0x477fd000u; u < 0x47801000u; u++) { /* 65504 .. past 65536 */
        ADD(u);
        ADD(u | 0x80000000u);
    }
    for (uint32_t u = 0x32000000u; u < 0x39000000u; u += 13) /* fp16 subnormals and below */
        ADD(u);
    ADD(0x7f800000u); /* Inf, NaNs with every kind of payload */
    ADD(0xff800000u);
    ADD(0x7f800001u);
    ADD(0xff800001u);
    ADD(0x7fc00000u);
    ADD(0x7fbfffffu);
    ADD(0x7f801fffu);
    ADD(0x7f802000u);
    ADD(0x7fffffffu);
    ADD(0x7f7fffffu); /* FLT_MAX: bf16 rounds it to Inf */
    ADD(0x7f7f8000u);
    ADD(0x7f7f7fffu);
    check_f32(k, src, n);
    total += n;
#undef ADD
    printf("%zu floats checked\n", total);
    free(src);
}

/* Stochastic rounding: every result is one of x's two neighbours, the mean over many seeds is x
 * (unbiased within 6 standard errors), a seed repeats its result, representable values and the
 * special ones come out as nearest rounding gives them, and the range edges stay finite. */
static void stochastic(const pc_half_kernels_t *k) {
    static const float xs[] = {0.3f,    -0.3f,   1.0f + 0x1p-9f, 1e-3f,  -7.77e-5f, 123.456f,
                               3e-5f,   -4e-6f,  1e-7f,          6e-8f,  1e-20f,    3.0e38f,
                               65000.f, -0.001f, 0.0123456f,     5e-38f, 2.5e-8f};
    enum { N = 20000 };
    uint16_t out[N];
    for (int f16 = 0; f16 < 2; f16++) {
        for (size_t j = 0; j < sizeof xs / sizeof xs[0]; j++) {
            const float x = xs[j];
            if (f16 && fabsf(x) > 65504.f)
                continue;
            uint16_t lo, hi;
            neighbours(f16, x, &lo, &hi);
            double sum = 0;
            for (int i = 0; i < N; i++) {
                (f16 ? k->to_f16_sr : k->to_bf16_sr)(&x, &out[i], 1, (uint64_t)i * 7919 + j);
                if (out[i] != lo && out[i] != hi)
                    fail_msg("%s sr(%a) = 0x%04x, not 0x%04x or 0x%04x", f16 ? "f16" : "bf16",
                             (double)x, out[i], lo, hi);
                sum += dec16(f16, out[i]);
            }
            const double gap = fabs((double)dec16(f16, hi) - (double)dec16(f16, lo));
            const double mean = sum / N, tol = 6 * 0.5 * gap / sqrt((double)N) + 1e-300;
            if (fabs(mean - (double)x) > tol)
                fail_msg("%s sr(%a): mean %.9g, %.3g from x (tolerance %.3g)", f16 ? "f16" : "bf16",
                         (double)x, mean, mean - (double)x, tol);
        }
        /* A whole array with one seed: elements draw different bits, a repeat is identical. */
        float v[N];
        uint16_t a[N], b[N];
        for (int i = 0; i < N; i++)
            v[i] = 0.3f;
        (f16 ? k->to_f16_sr : k->to_bf16_sr)(v, a, N, 42);
        (f16 ? k->to_f16_sr : k->to_bf16_sr)(v, b, N, 42);
        assert_memory_equal(a, b, sizeof a);
        uint16_t lo, hi;
        neighbours(f16, 0.3f, &lo, &hi);
        int ups = 0;
        for (int i = 0; i < N; i++)
            ups += a[i] == hi;
        const double p = (0.3 - dec16(f16, lo)) / (dec16(f16, hi) - dec16(f16, lo));
        assert_true(fabs(ups - p * N) < 6 * sqrt(p * (1 - p) * N));
        /* Every 16-bit value is kept (NaN as nearest rounding makes it: quiet). */
        for (uint32_t h = 0; h < 65536; h++) {
            const float x = dec16(f16, (uint16_t)h);
            uint16_t r;
            (f16 ? k->to_f16_sr : k->to_bf16_sr)(&x, &r, 1, h);
            const uint16_t want = f16 ? pc_f32_to_f16(x) : pc_f32_to_bf16(x);
            if (r != want)
                fail_msg("%s sr(0x%04x) = 0x%04x, want 0x%04x", f16 ? "f16" : "bf16", h, r, want);
        }
    }
    /* Edges: a finite value stays finite: bf16 at FLT_MAX, f16 at 65504 (65520, which nearest
     * rounding makes Inf, and -1e6 included). */
    const float big[] = {FLT_MAX, -FLT_MAX, 65510.f, 65519.f, 65520.f, -1e6f};
    uint16_t r[6];
    for (uint64_t seed = 0; seed < 64; seed++) {
        k->to_bf16_sr(big, r, 2, seed);
        assert_int_equal(r[0], 0x7f7f); /* FLT_MAX lies between 0x7f7f and Inf */
        assert_int_equal(r[1], 0xff7f);
        k->to_f16_sr(big + 2, r, 4, seed);
        assert_int_equal(r[0], 0x7bff);
        assert_int_equal(r[1], 0x7bff);
        assert_int_equal(r[2], 0x7bff);
        assert_int_equal(r[3], 0xfbff);
    }
}

static void test_stochastic(void **state) {
    (void)state;
    stochastic(pc_half_kernels("portable"));
    const pc_half_kernels_t *k = pc_half_kernels("f16c");
    if (k)
        stochastic(k);
    else
        print_message("no F16C/AVX2 here: the vector kernels are not tested\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stochastic),
        cmocka_unit_test(test_all_halves),
        cmocka_unit_test(test_many_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
