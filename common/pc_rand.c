/* pc_rand.c: see pc_rand.h. */
#include "pc_rand.h"

#include <math.h>

/* (exp(x) - 1) / x and log1p(x) / x, accurate near 0. */
static double helper_expm1(double x) {
    return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x / 2;
}
static double helper_log1p(double x) {
    return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x / 2;
}

static double zh(const pc_zipf_t *z, double x) {
    return exp(-z->s * log(x));
}

static double zh_int(const pc_zipf_t *z, double x) {
    double lx = log(x);
    return helper_expm1((1 - z->s) * lx) * lx;
}

static double zh_int_inv(const pc_zipf_t *z, double x) {
    double t = x * (1 - z->s);
    if (t < -1)
        t = -1;
    return exp(helper_log1p(t) * x);
}

void pc_zipf_init(pc_zipf_t *z, uint64_t n, double s) {
    z->s = s;
    z->n = (double)n;
    z->hx1 = zh_int(z, 1.5) - 1;
    z->hn = zh_int(z, z->n + 0.5);
    z->sdiv = 2 - zh_int_inv(z, zh_int(z, 2.5) - zh(z, 2));
}

uint64_t pc_zipf_next(const pc_zipf_t *z, uint64_t *state) {
    for (;;) {
        double u = z->hn + (double)(pc_rand(state) >> 11) * 0x1p-53 * (z->hx1 - z->hn);
        double x = zh_int_inv(z, u);
        double k = floor(x + 0.5);
        if (k < 1)
            k = 1;
        if (k > z->n)
            k = z->n;
        if (k - x <= z->sdiv || u >= zh_int(z, k + 0.5) - zh(z, k))
            return (uint64_t)k;
    }
}
