/* pw_cpu_interact.h: DLRM's pairwise dot interaction on the CPU, fused (no f x f matrices): a
 * template, included once per vector block width by pw_backend_cpu.c (and by test_layers, which
 * checks each width). Before each inclusion define
 *   IK_LANES    the lanes of a block: 8 or 16;
 *   IK_NAME(x)  the names it defines, e.g. x##_8;
 *   IK_ATTR     the functions' attribute (CPU_VEC: target clones), or nothing;
 * it defines IK_NAME(interact) and IK_NAME(interact_grad) (static), with the signatures of
 * pw_backend_t's interact and interact_grad (and, for them, IK_NAME(transpose), IK_NAME(vblock),
 * IK_NAME(vlane), and the IK_RB, IK_ZT_MAX, IK_FP_MAX constants once), and undefines the three.
 * Inside, it defines and then undefines IB, RB, ZT_MAX, FP_MAX, LO_LANES, HI_LANES, ROUNDS,
 * VSHUFFLE, vblock_t, vlane_t and transpose: the includer must not use these names.
 *
 * DESIGN
 * - Dot products are summed in blocks of IB lanes held in a GCC vector; the compiler does not
 *   vectorize the plain loop, it unrolls it into scalars. A block is one register: 16 lanes for
 *   AVX-512, 8 for AVX2 (pw_backend_cpu.c picks by the CPU). A 16-lane vector on AVX2 (two
 *   registers) GCC 12 spilled to the stack and moved through general registers lane by lane: 6
 *   times slower (1024 samples of 27 x 16 on an AMD EPYC without AVX-512: forward 3.2 ms
 *   against 0.55 in 8 lanes, gradient 3.2 against 0.70), the interaction then half of a DLRM
 *   step. On AVX-512 (an Intel Cooper Lake) 16 lanes measured 0.30 and 0.37 ms.
 * - RB output rows at a time, so that each block loaded feeds RB independent sums (one row at a
 *   time, a sum's chain of adds and a load per multiply held both kernels to a third of the FPU;
 *   2, 3, 5, 6 or 8 rows: slower, at either width).
 * - The forward transposes a sample's z (zt: d x fp, f padded with zeros to whole blocks; IB x IB
 *   blocks by shuffles), and row i's products with rows j < i are the first i lanes of its
 *   blocks, copied into its packed row. The gradient writes dz_i = sum over j != i of
 *   g_(max(i,j), min(i,j)) z_j, d in blocks.
 * - Each sum runs over e (forward) or j (gradient) in order, a multiply then an add (C11
 *   contracts nothing), so both widths and every target variant give the same bits, and the
 *   same as one row at a time.
 */
#ifndef PW_CPU_INTERACT_ONCE
#define PW_CPU_INTERACT_ONCE
enum {
    IK_RB = 4,        /* output rows a block's sums run for at once */
    IK_ZT_MAX = 8192, /* floats of zt on the stack */
    IK_FP_MAX = 1024, /* padded fields the forward's row results hold (more: pairs) */
};
#endif

#define IB        IK_LANES
#define RB        IK_RB
#define ZT_MAX    IK_ZT_MAX
#define FP_MAX    IK_FP_MAX
#define vblock_t  IK_NAME(vblock)
#define vlane_t   IK_NAME(vlane)
#define transpose IK_NAME(transpose)
typedef float vblock_t __attribute__((vector_size(IB * sizeof(float))));
typedef int vlane_t __attribute__((vector_size(IB * sizeof(int))));
/* The interleaving of two blocks' low and high halves (clang spells GCC's shuffle otherwise). */
#if IK_LANES == 16
#define LO_LANES 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define HI_LANES 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#define ROUNDS   4
#elif IK_LANES == 8
#define LO_LANES 0, 8, 1, 9, 2, 10, 3, 11
#define HI_LANES 4, 12, 5, 13, 6, 14, 7, 15
#define ROUNDS   3
#else
#error "IK_LANES: 8 or 16"
#endif
#if defined(__clang__)
#define VSHUFFLE(a, b, lanes) __builtin_shufflevector(a, b, lanes)
#else
#define VSHUFFLE(a, b, lanes) __builtin_shuffle(a, b, (vlane_t){lanes})
#endif

/* zt (d x fp) = the transpose of zs (f x d), rows f..fp of zs read as zeros. IB x IB blocks in
 * log2(IB) rounds that interleave rows p and p + IB / 2 (each round rotates the bits of (row,
 * column) by one, so log2(IB) make the transpose); the tail of d element by element.
 * always_inline: the caller's target variant compiles it. */
static inline __attribute__((always_inline)) void transpose(const float *restrict zs, int f, int d,
                                                            float *restrict zt, int fp) {
    int eb = 0;
    for (; eb + IB <= d; eb += IB)
        for (int jb = 0; jb < fp; jb += IB) {
            vblock_t r[IB], t[IB];
            for (int k = 0; k < IB; k++) {
                if (jb + k < f)
                    memcpy(&r[k], zs + (size_t)(jb + k) * d + eb, sizeof r[k]);
                else
                    r[k] = (vblock_t){0};
            }
            for (int round = 0; round < ROUNDS; round++) {
                for (int p = 0; p < IB / 2; p++) {
                    t[2 * p] = VSHUFFLE(r[p], r[p + IB / 2], LO_LANES);
                    t[2 * p + 1] = VSHUFFLE(r[p], r[p + IB / 2], HI_LANES);
                }
                memcpy(r, t, sizeof r);
            }
            for (int k = 0; k < IB; k++)
                memcpy(zt + (size_t)(eb + k) * fp + jb, &r[k], sizeof r[k]);
        }
    for (int j = 0; j < f; j++)
        for (int e = eb; e < d; e++)
            zt[(size_t)e * fp + j] = zs[(size_t)j * d + e];
}

IK_ATTR static void IK_NAME(interact)(pw_backend_t *be, int n, int f, int d,
                                      const float *restrict z, float *restrict out, int ldo) {
    (void)be;
    const int fp = (f + IB - 1) / IB * IB, np = f * (f - 1) / 2;
    _Alignas(64) float zt[ZT_MAX];
    const bool tr = (size_t)fp * d <= ZT_MAX && fp <= FP_MAX;
    if (tr)
        memset(zt, 0, (size_t)fp * d * sizeof(float)); /* the padding stays zero */
    for (int s = 0; s < n; s++) {
        const float *restrict zs = z + (size_t)s * f * d;
        float *restrict o = out + (size_t)s * ldo;
        if (!tr) { /* the same sums, pair by pair */
            for (int i = 1; i < f; i++)
                for (int j = 0; j < i; j++) {
                    const float *zi = zs + (size_t)i * d, *zj = zs + (size_t)j * d;
                    float acc = zi[0] * zj[0];
                    for (int e = 1; e < d; e++)
                        acc += zi[e] * zj[e];
                    o[i * (i - 1) / 2 + j] = acc;
                }
            continue;
        }
        transpose(zs, f, d, zt, fp);
        /* Rows i .. i + nr - 1 need the same blocks (those below i); the group stops where a row
         * needs one more. */
        for (int i = 1, nr; i < f; i += nr) {
            const int nb = (i + IB - 1) / IB, last = nb * IB + 1 < f ? nb * IB + 1 : f;
            nr = last - i < RB ? last - i : RB;
            const float *restrict zr[RB]; /* the group's rows (its last repeated past nr) */
            for (int r = 0; r < RB; r++)
                zr[r] = zs + (size_t)(i + (r < nr ? r : nr - 1)) * d;
            _Alignas(64) float res[RB][FP_MAX];
            for (int jb = 0; jb < nb * IB; jb += IB) {
                vblock_t acc[RB], v;
                memcpy(&v, zt + jb, sizeof v);
                for (int r = 0; r < RB; r++)
                    acc[r] = v * zr[r][0];
                for (int e = 1; e < d; e++) {
                    memcpy(&v, zt + (size_t)e * fp + jb, sizeof v);
                    for (int r = 0; r < RB; r++)
                        acc[r] += zr[r][e] * v;
                }
                for (int r = 0; r < RB; r++)
                    memcpy(res[r] + jb, &acc[r], sizeof acc[r]);
            }
            /* In row order: the lanes past row ii land in rows after it, written later; the last
             * rows store exactly what is theirs (past np: the caller's columns). */
            for (int r = 0; r < nr; r++)
                for (int ii = i + r, jb = 0; jb < ii; jb += IB) {
                    const int at = ii * (ii - 1) / 2 + jb;
                    const int k = at + IB <= np && ii + 1 < f ? IB : ii - jb < IB ? ii - jb : IB;
                    memcpy(o + at, res[r] + jb, (size_t)k * sizeof(float));
                }
        }
    }
}

IK_ATTR static void IK_NAME(interact_grad)(pw_backend_t *be, int n, int f, int d,
                                           const float *restrict z, const float *restrict grad,
                                           int ldg, float *restrict dz) {
    (void)be;
    for (int s = 0; s < n; s++) {
        const float *restrict zs = z + (size_t)s * f * d;
        const float *restrict g = grad + (size_t)s * ldg;
        float *restrict dzs = dz + (size_t)s * f * d;
        int eb = 0;
        for (; eb + IB <= d; eb += IB)
            for (int i = 0, nr; i < f; i += nr) { /* rows i .. i + nr - 1 */
                nr = f - i < RB ? f - i : RB;
                const float *restrict gr[RB]; /* row r's packed coefficients (j < its row) */
                for (int r = 0; r < RB; r++) {
                    const int ir = i + (r < nr ? r : nr - 1);
                    gr[r] = g + ir * (ir - 1) / 2;
                }
                vblock_t acc[RB], v;
                for (int r = 0; r < RB; r++)
                    acc[r] = (vblock_t){0};
                for (int j = 0; j < i; j++) { /* below the group: g_(row, j) */
                    memcpy(&v, zs + (size_t)j * d + eb, sizeof v);
                    for (int r = 0; r < RB; r++)
                        acc[r] += gr[r][j] * v;
                }
                for (int j = i; j < i + nr; j++) { /* inside it: the diagonal skipped */
                    memcpy(&v, zs + (size_t)j * d + eb, sizeof v);
                    for (int r = 0; r < nr; r++) {
                        if (j < i + r)
                            acc[r] += gr[r][j] * v;
                        else if (j > i + r)
                            acc[r] += g[j * (j - 1) / 2 + i + r] * v;
                    }
                }
                for (int j = i + nr; j < f; j++) { /* above: g_(j, row), consecutive rows */
                    memcpy(&v, zs + (size_t)j * d + eb, sizeof v);
                    const float *gj = g + j * (j - 1) / 2 + i;
                    for (int r = 0; r < RB; r++)
                        acc[r] += gj[r < nr ? r : nr - 1] * v;
                }
                for (int r = 0; r < nr; r++)
                    memcpy(dzs + (size_t)(i + r) * d + eb, &acc[r], sizeof acc[r]);
            }
        for (int i = 0; i < f && eb < d; i++) /* the tail of d, lane by lane in the same order */
            for (int e = eb; e < d; e++) {
                float acc = 0;
                for (int j = 0; j < i; j++)
                    acc += g[i * (i - 1) / 2 + j] * zs[(size_t)j * d + e];
                for (int j = i + 1; j < f; j++)
                    acc += g[j * (j - 1) / 2 + i] * zs[(size_t)j * d + e];
                dzs[(size_t)i * d + e] = acc;
            }
    }
}

#undef IB
#undef RB
#undef ZT_MAX
#undef FP_MAX
#undef vblock_t
#undef vlane_t
#undef transpose
#undef LO_LANES
#undef HI_LANES
#undef ROUNDS
#undef VSHUFFLE
#undef IK_LANES
#undef IK_NAME
#undef IK_ATTR
