/* ps_optim.c: initializers and server-side optimizers for table rows.
 *
 * DESIGN: the row math exists twice, as a kernel table per instruction set (ps_optim_kernels_t),
 * picked once at run time by ps__optim_kernels(NULL):
 *  - "scalar": plain loops compiled for the baseline target (the compiler vectorizes them with
 *    SSE2; no -ffast-math, so they are exactly the textbook formulas in float);
 *  - "avx2": the same formulas with AVX2 + FMA intrinsics, 8 floats a step, the tail of a row
 *    that is not a multiple of 8 through masked loads and stores (lanes past the row read as
 *    zero and are never written, so no row is ever read or written out of bounds). Offered when
 *    __builtin_cpu_supports says the CPU has AVX2 and FMA; the functions carry target
 *    attributes, so the rest of the build stays baseline x86-64.
 * The two differ only by rounding: FMA rounds once where the scalar code rounds twice, and row
 * sums (rowwise Adagrad, clip_norm) add in 8 lanes instead of one by one. test_optim checks both
 * against a double-precision reference and against each other, on odd dims and NaN gradients.
 * (An earlier version used GCC target_clones, which resolves through ifunc: that cannot run
 * under TSan, and it hid which code a test had exercised.)
 *
 * Gradient preprocessing (clipping, weight decay) copies into a stack buffer only when one of
 * those options is on, so the common path reads the caller's gradient directly.
 *
 * Initial rows come from a splitmix64 stream seeded with XXH3(key, table seed): the same
 * (seed, key) gives the same row in every process, on every server, after every restart.
 */
#include "ps_optim.h"
#include "pc_hash.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PS_HAVE_AVX2 1
#endif

void ps__optim_from_config(const ps_table_config_t *cfg, ps_optim_t *o) {
    o->kind = (ps_optim_kind_t)cfg->optimizer;
    o->dim = (uint32_t)cfg->dim;
    o->lr = (float)cfg->lr;
    o->beta1 = (float)cfg->beta1;
    o->beta2 = (float)cfg->beta2;
    o->eps = (float)cfg->eps;
    o->adagrad_init = (float)cfg->adagrad_init;
    o->ftrl_beta = (float)cfg->ftrl_beta;
    o->l1 = (float)cfg->l1;
    o->l2 = (float)cfg->l2;
    o->weight_decay = (float)cfg->weight_decay;
    o->clip_value = (float)cfg->clip_value;
    o->clip_norm = (float)cfg->clip_norm;
    o->k = ps__optim_kernels(NULL);
}

uint32_t ps__optim_state_len(ps_optim_kind_t kind, uint32_t dim) {
    switch (kind) {
        case PS_OPT_SGD:
            return 0;
        case PS_OPT_ADAGRAD:
            return dim;
        case PS_OPT_ROWWISE_ADAGRAD:
            return 1;
        case PS_OPT_ADAM:
            return 2 * dim + 1;
        case PS_OPT_FTRL:
            return 2 * dim;
    }
    return 0;
}

void ps__optim_init_state(const ps_optim_t *o, float *s) {
    uint32_t n = ps__optim_state_len(o->kind, o->dim);
    if (o->kind == PS_OPT_ADAGRAD || o->kind == PS_OPT_ROWWISE_ADAGRAD) {
        for (uint32_t i = 0; i < n; i++)
            s[i] = o->adagrad_init;
    } else if (n) {
        memset(s, 0, n * sizeof(float)); /* adam: m = v = 0, t = 0 (all-zero bits) */
    }
}

/* ---- scalar kernels ------------------------------------------------------------------- */

/* The exponent bits of 2^56: an element at or above it in magnitude (Inf and NaN too: all ones)
 * is refused, since its square summed over a row (row-wise Adagrad: up to PS_DIM_MAX of them) or
 * into an accumulator would overflow to Inf, which would freeze the row (g / Inf) or make it NaN
 * (Inf - Inf) for good: 1024 x (2^56)^2 = 2^122, below FLT_MAX. */
#define GRAD_EXP_MAX 0x5b800000u

static bool scalar_grad_finite(const float *g, uint32_t dim) {
    /* OR-ing integer flags is associative, so this vectorizes (a float sum would be a serial
     * chain). */
    uint32_t bad = 0;
    for (uint32_t i = 0; i < dim; i++) {
        uint32_t bits;
        memcpy(&bits, &g[i], sizeof bits);
        bad |= (bits & 0x7f800000u) >= GRAD_EXP_MAX;
    }
    return bad == 0;
}

static inline __attribute__((always_inline)) void step_sgd(const ps_optim_t *o, float *restrict w,
                                                           const float *restrict g) {
    const float lr = o->lr;
    for (uint32_t i = 0; i < o->dim; i++)
        w[i] -= lr * g[i];
}

static inline __attribute__((always_inline)) void
step_adagrad(const ps_optim_t *o, float *restrict w, float *restrict G, const float *restrict g) {
    const float lr = o->lr, eps = o->eps;
    for (uint32_t i = 0; i < o->dim; i++) {
        G[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (sqrtf(G[i]) + eps);
    }
}

static inline __attribute__((always_inline)) void step_rowwise_adagrad(const ps_optim_t *o,
                                                                       float *restrict w,
                                                                       float *restrict G,
                                                                       const float *restrict g) {
    float sq = 0.0f;
    for (uint32_t i = 0; i < o->dim; i++)
        sq += g[i] * g[i];
    G[0] += sq / (float)o->dim;
    const float scale = o->lr / (sqrtf(G[0]) + o->eps);
    for (uint32_t i = 0; i < o->dim; i++)
        w[i] -= scale * g[i];
}

static inline __attribute__((always_inline)) void
step_adam(const ps_optim_t *o, float *restrict w, float *restrict s, const float *restrict g) {
    const uint32_t d = o->dim;
    float *restrict m = s, *restrict v = s + d;
    uint32_t t;
    memcpy(&t, &s[2 * d], sizeof t);
    t += t != UINT32_MAX; /* saturates: wrapped to 0, the bias corrections would divide by 0 */
    memcpy(&s[2 * d], &t, sizeof t);
    const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    /* Bias corrections in double: beta^t underflows gracefully and stays accurate for large t. */
    const float c1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float c2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    const float lr = o->lr;
    for (uint32_t i = 0; i < d; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] -= lr * (m[i] * c1) / (sqrtf(v[i] * c2) + eps);
    }
}

static inline __attribute__((always_inline)) void
step_ftrl(const ps_optim_t *o, float *restrict w, float *restrict s, const float *restrict g) {
    const uint32_t d = o->dim;
    float *restrict z = s, *restrict n = s + d;
    const float alpha = o->lr, beta = o->ftrl_beta, l1 = o->l1, l2 = o->l2;
    for (uint32_t i = 0; i < d; i++) {
        const float n_new = n[i] + g[i] * g[i];
        const float sigma = (sqrtf(n_new) - sqrtf(n[i])) / alpha;
        z[i] += g[i] - sigma * w[i];
        n[i] = n_new;
        const float az = fabsf(z[i]);
        const float sgn = z[i] < 0.0f ? -1.0f : 1.0f;
        const float denom = (beta + sqrtf(n_new)) / alpha + l2;
        w[i] = az <= l1 ? 0.0f : -(z[i] - sgn * l1) / denom;
    }
}

static void scalar_step(const ps_optim_t *o, float *w, float *s, const float *g) {
    float buf[PS_DIM_MAX];
    const uint32_t d = o->dim;
    if (o->clip_value > 0.0f || o->clip_norm > 0.0f || o->weight_decay != 0.0f) {
        memcpy(buf, g, d * sizeof(float));
        if (o->clip_value > 0.0f) {
            const float c = o->clip_value;
            for (uint32_t i = 0; i < d; i++)
                buf[i] = buf[i] > c ? c : (buf[i] < -c ? -c : buf[i]);
        }
        if (o->clip_norm > 0.0f) {
            double sq = 0.0;
            for (uint32_t i = 0; i < d; i++)
                sq += (double)buf[i] * buf[i];
            const double norm = sqrt(sq);
            if (norm > o->clip_norm) {
                const float k = (float)(o->clip_norm / norm);
                for (uint32_t i = 0; i < d; i++)
                    buf[i] *= k;
            }
        }
        if (o->weight_decay != 0.0f) {
            for (uint32_t i = 0; i < d; i++)
                buf[i] += o->weight_decay * w[i];
        }
        g = buf;
    }
    switch (o->kind) {
        case PS_OPT_SGD:
            step_sgd(o, w, g);
            break;
        case PS_OPT_ADAGRAD:
            step_adagrad(o, w, s, g);
            break;
        case PS_OPT_ROWWISE_ADAGRAD:
            step_rowwise_adagrad(o, w, s, g);
            break;
        case PS_OPT_ADAM:
            step_adam(o, w, s, g);
            break;
        case PS_OPT_FTRL:
            step_ftrl(o, w, s, g);
            break;
    }
}

#ifdef PS_HAVE_AVX2
/* ---- AVX2 + FMA kernels ---------------------------------------------------------------- */

#define AVX2_FN     __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

/* Lanes [0, n) of a vector (n < 8), for the tail of a row. */
AVX2_INLINE __m256i tail_mask(uint32_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Full vectors use plain unaligned loads and stores; the tail masked ones (`full` is a constant
 * at every call, so each body is compiled once per case). */
AVX2_INLINE __m256 ld(const float *p, __m256i m, int full) {
    return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}

AVX2_INLINE void st(float *p, __m256 v, __m256i m, int full) {
    if (full)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, m, v);
}

/* Apply body(i, mask, full) to every 8-float group of a row of d floats. */
#define AVX2_ROW(d, body)                           \
    do {                                            \
        uint32_t i_ = 0;                            \
        const __m256i all_ = _mm256_set1_epi32(-1); \
        for (; i_ + 8 <= (d); i_ += 8)              \
            body(i_, all_, 1);                      \
        if (i_ < (d))                               \
            body(i_, tail_mask((d)-i_), 0);         \
    } while (0)

static AVX2_FN bool avx2_grad_finite(const float *g, uint32_t dim) {
    /* the masked exponent is below 2^31: a signed compare is the unsigned one */
    const __m256i exp = _mm256_set1_epi32(0x7f800000), lim = _mm256_set1_epi32(GRAD_EXP_MAX - 1);
    __m256i bad = _mm256_setzero_si256();
#define BODY(i, m, full)                                                               \
    do {                                                                               \
        const __m256i v = _mm256_castps_si256(ld(g + (i), m, full));                   \
        bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_and_si256(v, exp), lim)); \
    } while (0)
    AVX2_ROW(dim, BODY); /* masked lanes load 0.0f: finite */
#undef BODY
    return _mm256_testz_si256(bad, bad);
}

/* Sum of the 4 lanes of v. */
AVX2_INLINE double hsum_pd(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* Sum of the 8 lanes of v. */
AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Clipping and weight decay into buf (the scalar order: clip elements, clip norm, decay). */
AVX2_INLINE void avx2_preprocess(const ps_optim_t *o, const float *w, const float *g, float *buf) {
    const uint32_t d = o->dim;
    const __m256 c = _mm256_set1_ps(o->clip_value), nc = _mm256_set1_ps(-o->clip_value);
    const int clip = o->clip_value > 0.0f;
#define BODY(i, m, full)                                                       \
    do {                                                                       \
        __m256 v = ld(g + (i), m, full);                                       \
        if (clip) /* min/max keep a NaN-free row as the scalar ternaries do */ \
            v = _mm256_max_ps(_mm256_min_ps(v, c), nc);                        \
        st(buf + (i), v, m, full);                                             \
    } while (0)
    AVX2_ROW(d, BODY);
#undef BODY
    if (o->clip_norm > 0.0f) {
        __m256d sq = _mm256_setzero_pd();
#define BODY(i, m, full)                                                 \
    do {                                                                 \
        const __m256 v = ld(buf + (i), m, full);                         \
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));   \
        const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); \
        sq = _mm256_fmadd_pd(lo, lo, sq);                                \
        sq = _mm256_fmadd_pd(hi, hi, sq);                                \
    } while (0)
        AVX2_ROW(d, BODY);
#undef BODY
        const double norm = sqrt(hsum_pd(sq));
        if (norm > o->clip_norm) {
            const __m256 k = _mm256_set1_ps((float)(o->clip_norm / norm));
#define BODY(i, m, full) st(buf + (i), _mm256_mul_ps(ld(buf + (i), m, full), k), m, full)
            AVX2_ROW(d, BODY);
#undef BODY
        }
    }
    if (o->weight_decay != 0.0f) {
        const __m256 wd = _mm256_set1_ps(o->weight_decay);
#define BODY(i, m, full) \
    st(buf + (i), _mm256_fmadd_ps(wd, ld(w + (i), m, full), ld(buf + (i), m, full)), m, full)
        AVX2_ROW(d, BODY);
#undef BODY
    }
}

/* No restrict here: g may be redirected to buf, which avx2_preprocess wrote through another
 * pointer (the intrinsics need no aliasing promise to be scheduled well). */
static AVX2_FN void avx2_step(const ps_optim_t *o, float *w, float *s, const float *g) {
    float buf[PS_DIM_MAX];
    const uint32_t d = o->dim;
    if (o->clip_value > 0.0f || o->clip_norm > 0.0f || o->weight_decay != 0.0f) {
        avx2_preprocess(o, w, g, buf);
        g = buf;
    }
    const __m256 lr = _mm256_set1_ps(o->lr), eps = _mm256_set1_ps(o->eps);
    switch (o->kind) {
        case PS_OPT_SGD: {
#define BODY(i, m, full) \
    st(w + (i), _mm256_fnmadd_ps(lr, ld(g + (i), m, full), ld(w + (i), m, full)), m, full)
            AVX2_ROW(d, BODY);
#undef BODY
            break;
        }
        case PS_OPT_ADAGRAD: { /* G += g^2; w -= lr * g / (sqrt(G) + eps) */
#define BODY(i, m, full)                                                                 \
    do {                                                                                 \
        const __m256 gv = ld(g + (i), m, full);                                          \
        const __m256 G = _mm256_fmadd_ps(gv, gv, ld(s + (i), m, full));                  \
        st(s + (i), G, m, full);                                                         \
        const __m256 u =                                                                 \
            _mm256_div_ps(_mm256_mul_ps(lr, gv), _mm256_add_ps(_mm256_sqrt_ps(G), eps)); \
        st(w + (i), _mm256_sub_ps(ld(w + (i), m, full), u), m, full);                    \
    } while (0)
            AVX2_ROW(d, BODY);
#undef BODY
            break;
        }
        case PS_OPT_ROWWISE_ADAGRAD: {
            __m256 sq = _mm256_setzero_ps();
#define BODY(i, m, full)                        \
    do {                                        \
        const __m256 gv = ld(g + (i), m, full); \
        sq = _mm256_fmadd_ps(gv, gv, sq);       \
    } while (0)
            AVX2_ROW(d, BODY);
#undef BODY
            s[0] += hsum_ps(sq) / (float)d;
            const __m256 k = _mm256_set1_ps(o->lr / (sqrtf(s[0]) + o->eps));
#define BODY(i, m, full) \
    st(w + (i), _mm256_fnmadd_ps(k, ld(g + (i), m, full), ld(w + (i), m, full)), m, full)
            AVX2_ROW(d, BODY);
#undef BODY
            break;
        }
        case PS_OPT_ADAM: {
            float *mv = s, *vv = s + d;
            uint32_t t;
            memcpy(&t, &s[2 * d], sizeof t);
            t += t != UINT32_MAX; /* saturates, as step_adam's */
            memcpy(&s[2 * d], &t, sizeof t);
            const float b1 = o->beta1, b2 = o->beta2;
            const __m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
            const __m256 ob1 = _mm256_set1_ps(1.0f - b1), ob2 = _mm256_set1_ps(1.0f - b2);
            const __m256 c1 = _mm256_set1_ps((float)(1.0 / (1.0 - pow((double)b1, (double)t))));
            const __m256 c2 = _mm256_set1_ps((float)(1.0 / (1.0 - pow((double)b2, (double)t))));
#define BODY(i, m, full)                                                                       \
    do {                                                                                       \
        const __m256 gv = ld(g + (i), m, full);                                                \
        const __m256 mm = _mm256_fmadd_ps(vb1, ld(mv + (i), m, full), _mm256_mul_ps(ob1, gv)); \
        const __m256 v2 = _mm256_fmadd_ps(vb2, ld(vv + (i), m, full),                          \
                                          _mm256_mul_ps(_mm256_mul_ps(ob2, gv), gv));          \
        st(mv + (i), mm, m, full);                                                             \
        st(vv + (i), v2, m, full);                                                             \
        const __m256 num = _mm256_mul_ps(lr, _mm256_mul_ps(mm, c1));                           \
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(v2, c2)), eps);          \
        st(w + (i), _mm256_sub_ps(ld(w + (i), m, full), _mm256_div_ps(num, den)), m, full);    \
    } while (0)
            AVX2_ROW(d, BODY);
#undef BODY
            break;
        }
        case PS_OPT_FTRL: {
            float *zv = s, *nv = s + d;
            const __m256 alpha = lr, beta = _mm256_set1_ps(o->ftrl_beta);
            const __m256 l1 = _mm256_set1_ps(o->l1), l2 = _mm256_set1_ps(o->l2);
            const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
#define BODY(i, m, full)                                                                          \
    do {                                                                                          \
        const __m256 gv = ld(g + (i), m, full), n0 = ld(nv + (i), m, full);                       \
        const __m256 n1 = _mm256_fmadd_ps(gv, gv, n0);                                            \
        const __m256 sq1 = _mm256_sqrt_ps(n1);                                                    \
        const __m256 sigma = _mm256_div_ps(_mm256_sub_ps(sq1, _mm256_sqrt_ps(n0)), alpha);        \
        const __m256 z = _mm256_add_ps(ld(zv + (i), m, full),                                     \
                                       _mm256_fnmadd_ps(sigma, ld(w + (i), m, full), gv));        \
        st(zv + (i), z, m, full);                                                                 \
        st(nv + (i), n1, m, full);                                                                \
        /* sgn * l1 with sgn = z < 0 ? -1 : 1 (-0.0 counts as positive, as in the scalar code) */ \
        const __m256 neg = _mm256_cmp_ps(z, zero, _CMP_LT_OQ);                                    \
        const __m256 sl1 = _mm256_or_ps(l1, _mm256_and_ps(neg, sign));                            \
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_add_ps(beta, sq1), alpha), l2);   \
        const __m256 wn = _mm256_div_ps(_mm256_sub_ps(sl1, z), denom);                            \
        const __m256 small = _mm256_cmp_ps(_mm256_andnot_ps(sign, z), l1, _CMP_LE_OQ);            \
        st(w + (i), _mm256_blendv_ps(wn, zero, small), m, full);                                  \
    } while (0)
            AVX2_ROW(d, BODY);
#undef BODY
            break;
        }
    }
}
#endif /* PS_HAVE_AVX2 */

/* ---- kernel tables --------------------------------------------------------------------- */

static const ps_optim_kernels_t k_scalar = {"scalar", scalar_grad_finite, scalar_step};
#ifdef PS_HAVE_AVX2
static const ps_optim_kernels_t k_avx2 = {"avx2", avx2_grad_finite, avx2_step};
#endif

const ps_optim_kernels_t *ps__optim_kernels(const char *name) {
#ifdef PS_HAVE_AVX2
    __builtin_cpu_init(); /* idempotent; needed when called from another constructor */
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!name)
        return avx2 ? &k_avx2 : &k_scalar;
    if (!strcmp(name, "avx2"))
        return avx2 ? &k_avx2 : NULL;
#else
    if (!name)
        return &k_scalar;
#endif
    return !strcmp(name, "scalar") ? &k_scalar : NULL;
}

/* ---- initializers ---------------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits (exact in float). */
static inline float unit_f(uint64_t *st) {
    return (float)(splitmix64(st) >> 40) * 0x1p-24f;
}

/* Standard normal pair by Box-Muller in double precision. */
static inline void normal_pair(uint64_t *st, double *z0, double *z1) {
    const double u1 = ((double)(splitmix64(st) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    const double u2 = (double)(splitmix64(st) >> 11) * 0x1p-53;
    const double r = sqrt(-2.0 * log(u1));
    *z0 = r * cos(2.0 * M_PI * u2);
    *z1 = r * sin(2.0 * M_PI * u2);
}

void ps__init_row(ps_init_kind_t kind, float scale, uint64_t seed, uint64_t key, uint32_t dim,
                  float *out) {
    uint64_t st = pc_hash_u64(key, seed);
    switch (kind) {
        case PS_INIT_ZEROS:
            memset(out, 0, dim * sizeof(float));
            return;
        case PS_INIT_UNIFORM:
            for (uint32_t i = 0; i < dim; i++)
                out[i] = (2.0f * unit_f(&st) - 1.0f) * scale;
            return;
        case PS_INIT_NORMAL:
            for (uint32_t i = 0; i < dim; i += 2) {
                double z0, z1;
                normal_pair(&st, &z0, &z1);
                out[i] = (float)(z0 * scale);
                if (i + 1 < dim)
                    out[i + 1] = (float)(z1 * scale);
            }
            return;
        case PS_INIT_TRUNC_NORMAL:
            for (uint32_t i = 0; i < dim;) {
                double z[2];
                normal_pair(&st, &z[0], &z[1]);
                for (int j = 0; j < 2 && i < dim; j++)
                    if (fabs(z[j]) <= 2.0)
                        out[i++] = (float)(z[j] * scale);
            }
            return;
    }
}
