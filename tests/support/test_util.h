/* test_util.h: helpers shared by EmberPS tests (cmocka-based). */
#ifndef TEST_UTIL_H
#define TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* Deterministic test RNG (splitmix64). */
static inline uint64_t tu_rand(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static inline double tu_unit(uint64_t *s) {
    return (double)(tu_rand(s) >> 11) * 0x1p-53;
}

static inline float tu_gauss(uint64_t *s) {
    double u1 = tu_unit(s) + 1e-300, u2 = tu_unit(s);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* |a - b| <= atol + rtol * |b|, with a message naming what differs. */
#define TU_ASSERT_CLOSE(a, b, rtol, atol, ...)                                        \
    do {                                                                              \
        double a_ = (a), b_ = (b);                                                    \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_))) {                           \
            print_error(__VA_ARGS__);                                                 \
            print_error(": got %.9g want %.9g (diff %.3g)\n", a_, b_, fabs(a_ - b_)); \
            fail();                                                                   \
        }                                                                             \
    } while (0)

/* A "Name: N kB" field of process pid's /proc status (field with its colon: "VmHWM:"), in KiB;
 * -1 when absent. */
static inline long tu_proc_kb(int pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    const size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0)
            kb = atol(line + n);
    if (f)
        fclose(f);
    return kb;
}

#endif
