/* pw_backend_cpu.c: the CPU backend: OpenBLAS for GEMM, plain loops (auto-vectorized) for the
 * rest. Device memory is host memory (calloc). Stateless: one static table serves every thread.
 * These loops are also the reference the GPU backend is tested against.
 *
 * DESIGN
 * - The loops of a training step (CPU_VEC) are compiled three times, for x86-64 (SSE2, what the
 *   portable build targets), x86-64-v3 (AVX2) and x86-64-v4 (AVX-512), and the loader picks the
 *   best the machine has (GCC target_clones, an ifunc; not in sanitizer builds). C11 mode keeps
 *   FP contraction off and no loop reassociates a sum, so every variant computes the same bits.
 * - Loops never branch on data to skip a load (relu_grad): a branch the predictor cannot learn
 *   costs more than the load, and the branch-free form vectorizes.
 * - OpenBLAS's kernels (pw_blas_select): a DYNAMIC_ARCH OpenBLAS (Debian's) picks them by the
 *   CPU's model number when it is loaded, before main. A CPU newer than the library gets its
 *   oldest x86-64 kernels: Debian 12's 0.3.21 on an Emerald Rapids (family 6, model 207) runs
 *   Prescott's SSE3 sgemm at 30 GFLOP/s where its SkylakeX kernels reach 145 on the same core.
 *   The library reads OPENBLAS_CORETYPE only as it loads, so a program that finds such a
 *   fallback sets the variable to the newest kernels the CPU's feature flags allow and executes
 *   itself again (same pid and arguments), once: the variable, set, stops a second pass. */
#include "pw_backend.h"

#include "pc_alloc.h"
#include "pc_log.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Not under the sanitizers: an ifunc resolver runs before their runtimes start (a TSan build
 * crashed before main), and they test the code, not its speed. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define CPU_VEC    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define CPU_CLONES 1
#else
#define CPU_VEC
#define CPU_CLONES 0
#endif

/* ---- OpenBLAS's kernels (see DESIGN) ---- */

#define BLAS_ENV      "OPENBLAS_CORETYPE"
#define BLAS_FELL_ENV "EMBER_OPENBLAS_FALLBACK" /* what OpenBLAS chose before the re-execution */

/* The OpenBLAS kernels this CPU's features run best (NULL: none better than SSE3's). */
static const char *blas_best(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

/* Whether OpenBLAS's choice is one of its pre-AVX2 x86-64 kernel sets (where an unknown CPU
 * lands). */
static bool blas_fell_back(const char *core) {
    static const char *const old[] = {"Prescott", "Core2", "Penryn",      "Dunnington",
                                      "Nehalem",  "Atom",  "Sandybridge", "Unknown"};
    for (size_t i = 0; core && i < sizeof old / sizeof old[0]; i++)
        if (strcmp(core, old[i]) == 0)
            return true;
    return false;
}

static char g_fell[32]; /* the second pass: what OpenBLAS had chosen ("" otherwise) */

const char *pw_blas_core(void) {
    return openblas_get_corename();
}

int pw_blas_threads(int n) {
    if (n >= 0 && !getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS")) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        openblas_set_num_threads(n > 0 ? n : cpus > 2 ? (int)cpus - 1 : 1);
    }
    return openblas_get_num_threads();
}

const char *pw__blas_fell(void) {
    return g_fell;
}

void pw_blas_select(char **argv) {
    const char *set = getenv(BLAS_ENV), *fell = getenv(BLAS_FELL_ENV);
    if (set && fell) {
        snprintf(g_fell, sizeof g_fell, "%s", fell);
        unsetenv(BLAS_FELL_ENV); /* not passed on to child processes */
    }
    const char *core = openblas_get_corename(), *best = blas_best();
    if (set || !argv || !argv[0] || !best || !blas_fell_back(core))
        return;
    if (setenv(BLAS_ENV, best, 1) || setenv(BLAS_FELL_ENV, core, 1))
        return;
    execv("/proc/self/exe", argv);
    PC_WARN("OpenBLAS chose %s kernels for this CPU, and running again with %s=%s failed: dense "
            "math runs several times slower than it could",
            core, BLAS_ENV, best);
    unsetenv(BLAS_ENV);
    unsetenv(BLAS_FELL_ENV);
}

/* ---- memory ---- */

/* Device memory (the model's, counted as such) and host memory (batches) are both the heap. */
static void *cpu_alloc(pw_backend_t *be, size_t bytes) {
    (void)be;
    return bytes ? pc_scalloc(PC_MEM_MODEL, 1, bytes) : NULL;
}

static void *cpu_host_alloc(pw_backend_t *be, size_t bytes) {
    (void)be;
    return bytes ? pc_scalloc(PC_MEM_BATCH, 1, bytes) : NULL;
}

static void cpu_free(pw_backend_t *be, void *p) {
    (void)be;
    pc_sfree(p);
}

static void cpu_copy(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
}

static void cpu_zero(pw_backend_t *be, void *p, size_t bytes) {
    (void)be;
    if (bytes)
        memset(p, 0, bytes);
}

static int cpu_error(pw_backend_t *be, char *msg, size_t len) {
    (void)be;
    if (msg && len)
        msg[0] = 0;
    return 0;
}

static void cpu_copy_wait(pw_backend_t *be) {
    (void)be;
}

static void cpu_close(pw_backend_t *be) {
    (void)be;
}

/* ---- dense math ---- */

static void cpu_gemm(pw_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                     const float *a, const float *b, float beta, float *c) {
    (void)be;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

/* Floats of op(B) that cpu_gemm_batched transposes on the stack (see there). */
enum { BT_MAX = 4096 };

/* One OpenBLAS call per product. A transposed B small enough (the DLRM interaction's Z Z^T, 27
 * x 27 x 16 per sample) is transposed into bt first: OpenBLAS's small-matrix path takes the
 * untransposed product and not the other (1024 products here: 0.38 ms against 0.60, and
 * the same results). */
static void cpu_gemm_batched(pw_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                             const float *a, size_t sa, const float *b, size_t sb, float beta,
                             float *c, size_t sc, int count) {
    float bt[BT_MAX];
    for (int i = 0; i < count; i++) {
        const float *bi = b + i * sb;
        if (tb && (size_t)n * k <= BT_MAX) { /* B stored n x k -> bt k x n */
            for (int j = 0; j < n; j++)
                for (int p = 0; p < k; p++)
                    bt[p * n + j] = bi[j * k + p];
            cpu_gemm(be, ta, false, m, n, k, alpha, a + i * sa, bt, beta, c + i * sc);
        } else {
            cpu_gemm(be, ta, tb, m, n, k, alpha, a + i * sa, bi, beta, c + i * sc);
        }
    }
}

CPU_VEC static void cpu_bias_act(pw_backend_t *be, int rows, int cols, const float *bias, bool relu,
                                 float *y) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            yr[c] += bias[c];
        if (relu) /* NaN stays NaN: a diverged layer reaches the loss's check, not 0 */
            for (int c = 0; c < cols; c++)
                yr[c] = yr[c] > 0 || yr[c] != yr[c] ? yr[c] : 0.0f;
    }
}

CPU_VEC static void cpu_col_sum(pw_backend_t *be, int rows, int cols, const float *x, float beta,
                                float *out) {
    (void)be;
    for (int c = 0; c < cols; c++)
        out[c] *= beta;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[c] += x[(size_t)r * cols + c];
}

CPU_VEC static void cpu_relu_grad(pw_backend_t *be, size_t n, const float *y, const float *dy,
                                  float *dx) {
    (void)be;
    for (size_t i = 0; i < n; i++) {
        const float g = dy[i]; /* loaded always: no branch (see DESIGN) */
        dx[i] = y[i] > 0 ? g : 0.0f;
    }
}

static void cpu_copy2d(pw_backend_t *be, int rows, int cols, const float *src, int lds, float *dst,
                       int ldd) {
    (void)be;
    for (int r = 0; r < rows; r++)
        memmove(dst + (size_t)r * ldd, src + (size_t)r * lds, (size_t)cols * sizeof(float));
}

CPU_VEC static void cpu_add2d(pw_backend_t *be, int rows, int cols, const float *src, int lds,
                              float *dst, int ldd) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)r * ldd + c] += src[(size_t)r * lds + c];
}

static void cpu_scale(pw_backend_t *be, size_t n, float alpha, float *x) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
}

static void cpu_fill(pw_backend_t *be, size_t n, float value, float *x) {
    (void)be;
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

/* ---- DLRM interaction ---- */

static void cpu_tril_pack(pw_backend_t *be, int n, int f, const float *full, float *out, int ldo) {
    (void)be;
    for (int s = 0; s < n; s++) {
        const float *z = full + (size_t)s * f * f;
        float *o = out + (size_t)s * ldo;
        for (int i = 1, k = 0; i < f; i++)
            for (int j = 0; j < i; j++)
                o[k++] = z[i * f + j];
    }
}

static void cpu_tril_unpack(pw_backend_t *be, int n, int f, const float *grad, int ldg,
                            float *full) {
    (void)be;
    for (int s = 0; s < n; s++) {
        const float *g = grad + (size_t)s * ldg;
        float *z = full + (size_t)s * f * f;
        for (int i = 0; i < f; i++)
            z[i * f + i] = 0;
        for (int i = 1, k = 0; i < f; i++)
            for (int j = 0; j < i; j++, k++)
                z[i * f + j] = z[j * f + i] = g[k];
    }
}

/* The fused interaction (pw_cpu_interact.h) in blocks of 8 lanes and of 16: one register of
 * AVX2 and of AVX-512, the table's entries picked for the CPU once, before main (pick_interact;
 * the 16-lane code in AVX2 registers was 6 times slower). */
#define IK_LANES   8
#define IK_NAME(x) x##_8
#define IK_ATTR    CPU_VEC
#include "pw_cpu_interact.h"
#if CPU_CLONES /* (only pick_interact takes them: not built where it cannot, the sanitizers') */
#define IK_LANES   16
#define IK_NAME(x) x##_16
#define IK_ATTR    CPU_VEC
#include "pw_cpu_interact.h"
#endif

/* ---- embeddings ---- */

static void cpu_gather_rows(pw_backend_t *be, size_t n, const uint32_t *idx, const float *src,
                            int d, float *dst) {
    (void)be;
    for (size_t j = 0; j < n; j++)
        memcpy(dst + j * d, src + (size_t)idx[j] * d, (size_t)d * sizeof(float));
}

CPU_VEC static void cpu_scatter_add_rows(pw_backend_t *be, size_t n, const uint32_t *idx,
                                         const float *src, int d, float alpha, float *dst) {
    (void)be;
    for (size_t j = 0; j < n; j++) {
        float *o = dst + (size_t)idx[j] * d;
        const float *g = src + j * d;
        for (int e = 0; e < d; e++)
            o[e] += alpha * g[e];
    }
}

/* Per field of sample s, the factor its features are scaled by: 1 / count for mean, else 1. */
static void field_scale(const size_t *off, const uint16_t *field, int s, int nf, bool mean,
                        float *scale) {
    for (int f = 0; f < nf; f++)
        scale[f] = 0;
    for (size_t j = off[s]; j < off[s + 1]; j++)
        scale[field[j]] += 1;
    for (int f = 0; f < nf; f++)
        scale[f] = mean && scale[f] > 0 ? 1.0f / scale[f] : 1.0f;
}

/* Pooling's loop, feature j's row at rows + j * ld, or with inv at rows + inv[j] * d
 * (pool_unique). always_inline: each CPU_VEC caller compiles its own, the branch folded. */
static inline __attribute__((always_inline)) void
pool_loop(int n, const size_t *off, const uint16_t *field, const float *val, int nf, int d,
          const float *rows, int ld, const uint32_t *inv, bool mean, float *out) {
    float scale[PW_POOL_FIELDS_MAX];
    for (int s = 0; s < n; s++) {
        float *o = out + (size_t)s * nf * d;
        for (size_t i = 0; i < (size_t)nf * d; i++)
            o[i] = 0;
        field_scale(off, field, s, nf, mean, scale);
        for (size_t j = off[s]; j < off[s + 1]; j++) {
            const float w = val[j] * scale[field[j]];
            const float *r = inv ? rows + (size_t)inv[j] * d : rows + j * (size_t)ld;
            float *of = o + (size_t)field[j] * d;
            for (int e = 0; e < d; e++)
                of[e] += w * r[e];
        }
    }
}

/* Its gradient's loop: alpha * (w * g) added to feature j's own row (dst + j * ld), or with inv
 * to row inv[j] of dst (pool_grad_unique: what pool_grad into zeroed rows and then
 * scatter_add_rows add, in the same order). pool_grad's alpha 1 changes no bit (x * 1 is x). */
static inline __attribute__((always_inline)) void
pool_grad_loop(int n, const size_t *off, const uint16_t *field, const float *val, int nf, int d,
               const float *dout, bool mean, float *dst, int ld, const uint32_t *inv, float alpha) {
    float scale[PW_POOL_FIELDS_MAX];
    for (int s = 0; s < n; s++) {
        field_scale(off, field, s, nf, mean, scale);
        for (size_t j = off[s]; j < off[s + 1]; j++) {
            const float w = val[j] * scale[field[j]];
            const float *g = dout + ((size_t)s * nf + field[j]) * d;
            float *o = inv ? dst + (size_t)inv[j] * d : dst + j * (size_t)ld;
            for (int e = 0; e < d; e++)
                o[e] += alpha * (w * g[e]);
        }
    }
}

CPU_VEC static void cpu_pool(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                             const float *val, int nf, int d, const float *rows, int ld, bool mean,
                             float *out) {
    (void)be;
    pool_loop(n, off, field, val, nf, d, rows, ld, NULL, mean, out);
}

CPU_VEC static void cpu_pool_grad(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                                  const float *val, int nf, int d, const float *dout, int ld,
                                  bool mean, float *drows) {
    (void)be;
    pool_grad_loop(n, off, field, val, nf, d, dout, mean, drows, ld, NULL, 1.0f);
}

CPU_VEC static void cpu_pool_unique(pw_backend_t *be, int n, const size_t *off,
                                    const uint16_t *field, const float *val, int nf, int d,
                                    const float *urows, const uint32_t *inv, bool mean,
                                    float *out) {
    (void)be;
    pool_loop(n, off, field, val, nf, d, urows, d, inv, mean, out);
}

CPU_VEC static void cpu_pool_grad_unique(pw_backend_t *be, int n, const size_t *off,
                                         const uint16_t *field, const float *val, int nf, int d,
                                         const float *dout, bool mean, const uint32_t *inv,
                                         float alpha, float *ugrads) {
    (void)be;
    pool_grad_loop(n, off, field, val, nf, d, dout, mean, ugrads, d, inv, alpha);
}

/* sum[e] = sum_j v_je x_j over the features [a, b). */
static void factor_sums(size_t a, size_t b, const float *val, int k, const float *rows,
                        float *sum) {
    memset(sum, 0, (size_t)k * sizeof(float));
    for (size_t i = a; i < b; i++) {
        const float *v = rows + i * (size_t)(k + 1) + 1;
        for (int j = 0; j < k; j++)
            sum[j] += v[j] * val[i];
    }
}

static void cpu_fm(pw_backend_t *be, int n, const size_t *off, const float *val, int k,
                   const float *rows, float *logits) {
    (void)be;
    float sum[PW_FM_K_MAX];
    for (int s = 0; s < n; s++) {
        factor_sums(off[s], off[s + 1], val, k, rows, sum);
        double lin = 0, sq = 0, pair = 0;
        for (size_t i = off[s]; i < off[s + 1]; i++) {
            const float *r = rows + i * (size_t)(k + 1);
            const double x = val[i];
            lin += r[0] * x;
            for (int j = 0; j < k; j++)
                sq += (double)r[1 + j] * r[1 + j] * x * x;
        }
        for (int j = 0; j < k; j++)
            pair += (double)sum[j] * sum[j];
        logits[s] += (float)(lin + 0.5 * (pair - sq));
    }
}

static void cpu_fm_grad(pw_backend_t *be, int n, const size_t *off, const float *val, int k,
                        const float *rows, const float *dlogits, float *drows) {
    (void)be;
    float sum[PW_FM_K_MAX];
    for (int s = 0; s < n; s++) {
        factor_sums(off[s], off[s + 1], val, k, rows, sum);
        const float g = dlogits[s];
        for (size_t i = off[s]; i < off[s + 1]; i++) {
            const float *r = rows + i * (size_t)(k + 1);
            float *d = drows + i * (size_t)(k + 1);
            const float x = val[i];
            d[0] = g * x;
            for (int j = 0; j < k; j++) /* d/dv_ij = x_i sum_j - v_ij x_i^2 */
                d[1 + j] = g * x * (sum[j] - r[1 + j] * x);
        }
    }
}

/* ---- loss and optimizer ---- */

static void cpu_bce(pw_backend_t *be, int n, const float *logits, const float *labels, float *p,
                    float *dlogits, float *loss_out) {
    (void)be;
    double loss = 0;
    for (int i = 0; i < n; i++) {
        const double z = logits[i], y = labels[i];
        /* log(1 + exp(-|z|)) + max(z, 0) - y z: no overflow for any z */
        loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y * z;
        const double s = z >= 0 ? 1 / (1 + exp(-z)) : exp(z) / (1 + exp(z));
        if (p)
            p[i] = (float)s;
        if (dlogits)
            dlogits[i] = (float)((s - y) / n);
    }
    *loss_out = n ? (float)(loss / n) : 0.0f;
}

static void cpu_opt_step(pw_backend_t *be, const pw_opt_step_args_t *a, size_t n, float *w,
                         const float *g, float *s1, float *s2) {
    (void)be;
    switch (a->kind) {
        case PW_OPT_SGD:
            for (size_t i = 0; i < n; i++)
                w[i] -= a->lr * g[i];
            return;
        case PW_OPT_ADAGRAD:
            for (size_t i = 0; i < n; i++) {
                s1[i] += g[i] * g[i];
                w[i] -= a->lr * g[i] / (sqrtf(s1[i]) + a->eps);
            }
            return;
        case PW_OPT_ADAM:
            for (size_t i = 0; i < n; i++) {
                s1[i] = a->beta1 * s1[i] + (1 - a->beta1) * g[i];
                s2[i] = a->beta2 * s2[i] + (1 - a->beta2) * g[i] * g[i];
                w[i] -= a->lr * (s1[i] / a->bc1) / (sqrtf(s2[i] / a->bc2) + a->eps);
            }
            return;
    }
}

static pw_backend_t k_cpu = {
    .abi = PW_BACKEND_ABI,
    .name = "cpu-openblas",
    .host_memory = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .upload_async = cpu_copy,
    .download_async = cpu_copy,
    .copy_wait = cpu_copy_wait,
    .sync = cpu_copy_wait,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .error = cpu_error,
    .close = cpu_close,
    .gemm = cpu_gemm,
    .gemm_batched = cpu_gemm_batched,
    .bias_act = cpu_bias_act,
    .col_sum = cpu_col_sum,
    .relu_grad = cpu_relu_grad,
    .copy2d = cpu_copy2d,
    .add2d = cpu_add2d,
    .scale = cpu_scale,
    .fill = cpu_fill,
    .tril_pack = cpu_tril_pack,
    .tril_unpack = cpu_tril_unpack,
    .interact = interact_8, /* or 16 lanes: pick_interact */
    .interact_grad = interact_grad_8,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .pool = cpu_pool,
    .pool_grad = cpu_pool_grad,
    .pool_unique = cpu_pool_unique,
    .pool_grad_unique = cpu_pool_grad_unique,
    .fm = cpu_fm,
    .fm_grad = cpu_fm_grad,
    .bce = cpu_bce,
    .opt_step = cpu_opt_step,
};

/* 16 lanes where the x86-64-v4 variants run (target_clones' choice: AVX-512 F, BW, CD, DQ and
 * VL); never without clones, where the 16-lane code would run in narrower registers. Before main,
 * so every thread reads a settled table. */
__attribute__((constructor)) static void pick_interact(void) {
#if CPU_CLONES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")) {
        k_cpu.interact = interact_16;
        k_cpu.interact_grad = interact_grad_16;
    }
#endif
}

pw_backend_t *pw_backend_cpu(void) {
    return &k_cpu;
}
