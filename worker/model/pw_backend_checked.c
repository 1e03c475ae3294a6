/* pw_backend_checked.c: "cpu:checked", the CPU backend with the GPU's memory rule enforced.
 *
 * Code written for the backend table must never touch device memory from the host, nor hand a
 * host pointer to a math function; on a GPU either is a crash or garbage, and CI has no GPU.
 * This backend makes both visible on the CPU: device memory is mmap'ed and kept PROT_NONE
 * outside backend calls (a host access faults at once), and every pointer a math function takes
 * must lie in a device allocation (else abort with the function's name). Each call opens every
 * allocation for its duration, so it is slow: for tests, not training.
 *
 * DESIGN: the table embeds the CPU table's functions and a registry of allocations (base,
 * length). Single owner, like every backend instance.
 */
#include "pw_backend.h"

#include "pc_error.h"
#include "pc_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct region {
    char *base;
    size_t len; /* mapped length (whole pages) */
} region_t;

typedef struct checked {
    pw_backend_t t; /* first: the table handed out */
    region_t *r;
    size_t n, cap;
} checked_t;

static void protect_all(checked_t *k, int prot) {
    for (size_t i = 0; i < k->n; i++)
        if (mprotect(k->r[i].base, k->r[i].len, prot) != 0) {
            perror("cpu:checked: mprotect");
            abort();
        }
}

static bool is_device(const checked_t *k, const void *p) {
    for (size_t i = 0; i < k->n; i++)
        if ((const char *)p >= k->r[i].base && (const char *)p < k->r[i].base + k->r[i].len)
            return true;
    return false;
}

/* Every pointer of a call must be device memory (NULL passes: optional outputs). */
static void require_device(const checked_t *k, const char *fn, const void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] && !is_device(k, p[i])) {
            fprintf(stderr, "cpu:checked: %s got a host pointer (argument %zu of its pointers)\n",
                    fn, i);
            abort();
        }
}

/* A math function: its pointers checked, device memory open while the CPU table runs it. */
#define CK(fn, params, args, ...)                                   \
    static void ck_##fn params {                                    \
        checked_t *k = (checked_t *)be;                             \
        const void *const ptrs[] = {__VA_ARGS__};                   \
        require_device(k, #fn, ptrs, sizeof ptrs / sizeof ptrs[0]); \
        protect_all(k, PROT_READ | PROT_WRITE);                     \
        pw_backend_cpu()->fn args;                                  \
        protect_all(k, PROT_NONE);                                  \
    }

static void *ck_alloc(pw_backend_t *be, size_t bytes) {
    checked_t *k = (checked_t *)be;
    if (!bytes)
        return NULL;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page;
    if (k->n == k->cap) {
        const size_t cap = k->cap ? 2 * k->cap : 64;
        region_t *r = realloc(k->r, cap * sizeof *r);
        if (!r)
            return NULL;
        k->r = r;
        k->cap = cap;
    }
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* zeroed */
    if (p == MAP_FAILED)
        return NULL;
    k->r[k->n++] = (region_t){p, len};
    return p;
}

static void ck_free(pw_backend_t *be, void *p) {
    checked_t *k = (checked_t *)be;
    if (!p)
        return;
    for (size_t i = 0; i < k->n; i++)
        if (k->r[i].base == p) {
            munmap(p, k->r[i].len);
            k->r[i] = k->r[--k->n];
            return;
        }
    fprintf(stderr, "cpu:checked: free of a pointer that is not a device allocation\n");
    abort();
}

static void ck_upload(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    checked_t *k = (checked_t *)be;
    if (!is_device(k, dst) || is_device(k, src)) {
        fprintf(stderr, "cpu:checked: upload needs a device destination and a host source\n");
        abort();
    }
    protect_all(k, PROT_READ | PROT_WRITE);
    memcpy(dst, src, bytes);
    protect_all(k, PROT_NONE);
}

static void ck_download(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    checked_t *k = (checked_t *)be;
    if (is_device(k, dst) || !is_device(k, src)) {
        fprintf(stderr, "cpu:checked: download needs a host destination and a device source\n");
        abort();
    }
    protect_all(k, PROT_READ | PROT_WRITE);
    memcpy(dst, src, bytes);
    protect_all(k, PROT_NONE);
}

static void ck_close(pw_backend_t *be) {
    checked_t *k = (checked_t *)be;
    if (k->n)
        PC_WARN("cpu:checked: %zu device allocations not freed", k->n);
    for (size_t i = 0; i < k->n; i++)
        munmap(k->r[i].base, k->r[i].len);
    free(k->r);
    free(k);
}

CK(copy, (pw_backend_t * be, void *dst, const void *src, size_t bytes), (be, dst, src, bytes), dst,
   src)
CK(zero, (pw_backend_t * be, void *p, size_t bytes), (be, p, bytes), p)
CK(gemm,
   (pw_backend_t * be, bool ta, bool tb, int m, int n, int kk, float alpha, const float *a,
    const float *b, float beta, float *c),
   (be, ta, tb, m, n, kk, alpha, a, b, beta, c), a, b, c)
CK(gemm_batched,
   (pw_backend_t * be, bool ta, bool tb, int m, int n, int kk, float alpha, const float *a,
    size_t sa, const float *b, size_t sb, float beta, float *c, size_t sc, int count),
   (be, ta, tb, m, n, kk, alpha, a, sa, b, sb, beta, c, sc, count), a, b, c)
CK(bias_act, (pw_backend_t * be, int rows, int cols, const float *bias, bool relu, float *y),
   (be, rows, cols, bias, relu, y), bias, y)
CK(col_sum, (pw_backend_t * be, int rows, int cols, const float *x, float beta, float *out),
   (be, rows, cols, x, beta, out), x, out)
CK(relu_grad, (pw_backend_t * be, size_t n, const float *y, const float *dy, float *dx),
   (be, n, y, dy, dx), y, dy, dx)
CK(copy2d, (pw_backend_t * be, int rows, int cols, const float *src, int lds, float *dst, int ldd),
   (be, rows, cols, src, lds, dst, ldd), src, dst)
CK(add2d, (pw_backend_t * be, int rows, int cols, const float *src, int lds, float *dst, int ldd),
   (be, rows, cols, src, lds, dst, ldd), src, dst)
CK(scale, (pw_backend_t * be, size_t n, float alpha, float *x), (be, n, alpha, x), x)
CK(fill, (pw_backend_t * be, size_t n, float value, float *x), (be, n, value, x), x)
CK(tril_pack, (pw_backend_t * be, int n, int f, const float *full, float *out, int ldo),
   (be, n, f, full, out, ldo), full, out)
CK(tril_unpack, (pw_backend_t * be, int n, int f, const float *grad, int ldg, float *full),
   (be, n, f, grad, ldg, full), grad, full)
CK(interact, (pw_backend_t * be, int n, int f, int d, const float *z, float *out, int ldo),
   (be, n, f, d, z, out, ldo), z, out)
CK(interact_grad,
   (pw_backend_t * be, int n, int f, int d, const float *z, const float *grad, int ldg, float *dz),
   (be, n, f, d, z, grad, ldg, dz), z, grad, dz)
CK(gather_rows,
   (pw_backend_t * be, size_t n, const uint32_t *idx, const float *src, int d, float *dst),
   (be, n, idx, src, d, dst), idx, src, dst)
CK(scatter_add_rows,
   (pw_backend_t * be, size_t n, const uint32_t *idx, const float *src, int d, float alpha,
    float *dst),
   (be, n, idx, src, d, alpha, dst), idx, src, dst)
CK(pool,
   (pw_backend_t * be, int n, const size_t *off, const uint16_t *field, const float *val, int nf,
    int d, const float *rows, int ld, bool mean, float *out),
   (be, n, off, field, val, nf, d, rows, ld, mean, out), off, field, val, rows, out)
CK(pool_grad,
   (pw_backend_t * be, int n, const size_t *off, const uint16_t *field, const float *val, int nf,
    int d, const float *dout, int ld, bool mean, float *drows),
   (be, n, off, field, val, nf, d, dout, ld, mean, drows), off, field, val, dout, drows)
CK(fm,
   (pw_backend_t * be, int n, const size_t *off, const float *val, int kk, const float *rows,
    float *logits),
   (be, n, off, val, kk, rows, logits), off, val, rows, logits)
CK(fm_grad,
   (pw_backend_t * be, int n, const size_t *off, const float *val, int kk, const float *rows,
    const float *dlogits, float *drows),
   (be, n, off, val, kk, rows, dlogits, drows), off, val, rows, dlogits, drows)
CK(bce,
   (pw_backend_t * be, int n, const float *logits, const float *labels, float *p, float *dlogits,
    float *loss),
   (be, n, logits, labels, p, dlogits, loss), logits, labels, p, dlogits, loss)
CK(opt_step,
   (pw_backend_t * be, const pw_opt_step_args_t *a, size_t n, float *w, const float *g, float *s1,
    float *s2),
   (be, a, n, w, g, s1, s2), w, g, s1, s2)

int pw__backend_checked_open(pw_backend_t **out) {
    checked_t *k = calloc(1, sizeof *k);
    const pw_backend_t *cpu = pw_backend_cpu(); /* host memory, errors, waits: the CPU's */
    if (!k)
        return PC_ENOMEM;
    k->t = (pw_backend_t){
        .abi = PW_BACKEND_ABI,
        .name = "cpu:checked",
        .host_memory = false,
        .alloc = ck_alloc,
        .free = ck_free,
        .upload = ck_upload,
        .download = ck_download,
        .upload_async = ck_upload,
        .download_async = ck_download,
        .copy_wait = cpu->copy_wait,
        .sync = cpu->sync,
        .copy = ck_copy,
        .zero = ck_zero,
        .host_alloc = cpu->host_alloc,
        .host_free = cpu->host_free,
        .error = cpu->error,
        .close = ck_close,
        .gemm = ck_gemm,
        .gemm_batched = ck_gemm_batched,
        .bias_act = ck_bias_act,
        .col_sum = ck_col_sum,
        .relu_grad = ck_relu_grad,
        .copy2d = ck_copy2d,
        .add2d = ck_add2d,
        .scale = ck_scale,
        .fill = ck_fill,
        .tril_pack = ck_tril_pack,
        .tril_unpack = ck_tril_unpack,
        .interact = ck_interact,
        .interact_grad = ck_interact_grad,
        .gather_rows = ck_gather_rows,
        .scatter_add_rows = ck_scatter_add_rows,
        .pool = ck_pool,
        .pool_grad = ck_pool_grad,
        .fm = ck_fm,
        .fm_grad = ck_fm_grad,
        .bce = ck_bce,
        .opt_step = ck_opt_step,
    };
    *out = &k->t;
    return 0;
}
