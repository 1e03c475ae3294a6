/* ps_optim.c: initializers and server-side optimizers for table rows.
 *
 * DESIGN: each optimizer is a plain loop over the row that the compiler vectorizes (no
 * -ffast-math: results are reproducible and comparable with a double-precision reference).
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

/* The row loops are compiled twice, for AVX2 and baseline x86-64, and the loader picks one
 * (GCC target_clones, ifunc); results are identical bit for bit (no FMA contraction in ISO C).
 * Not under TSan: its runtime is not initialized yet when ifunc resolvers run (crash at load). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define PS_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define PS_MULTIVERSION
#endif

PS_MULTIVERSION bool ps__grad_finite(const float *g, uint32_t dim) {
    /* An element is Inf or NaN exactly when its exponent bits are all ones. OR-ing integer
     * flags is associative, so this vectorizes (a float sum would be a serial chain). */
    uint32_t bad = 0;
    for (uint32_t i = 0; i < dim; i++) {
        uint32_t bits;
        memcpy(&bits, &g[i], sizeof bits);
        bad |= (bits & 0x7f800000u) == 0x7f800000u;
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
    t++;
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

PS_MULTIVERSION void ps__optim_step(const ps_optim_t *o, float *w, float *s, const float *g) {
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
