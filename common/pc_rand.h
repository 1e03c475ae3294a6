/* pc_rand.h: deterministic random numbers for data generation, tests and benchmarks.
 *
 * pc_rand is splitmix64 over a caller-held state (cheap, good enough for sampling; not for
 * secrets). pc_zipf draws from a Zipf distribution over 1..n by rejection-inversion (Hormann and
 * Derflinger 1996): O(1) per draw for any n and any exponent s > 0, s != 1 handled as s -> 1
 * limit by the helpers.
 *
 * Thread rule: states are caller-owned; a pc_zipf_t is read-only after init (shareable).
 */
#ifndef PC_RAND_H
#define PC_RAND_H

#include <stdint.h>

/* Next 64 random bits; advances *state. */
static inline uint64_t pc_rand(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double pc_rand_unit(uint64_t *state) {
    return (double)(pc_rand(state) >> 11) * 0x1p-53;
}

typedef struct pc_zipf {
    double s, n, hx1, hn, sdiv;
} pc_zipf_t;

void pc_zipf_init(pc_zipf_t *z, uint64_t n, double s);
/* A draw in 1..n (1 the most frequent). */
uint64_t pc_zipf_next(const pc_zipf_t *z, uint64_t *state);

#endif
