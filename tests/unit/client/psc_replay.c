/* psc_replay SERVER TABLE DIM N OUT: a fixed sequence of libpsclient calls whose results the
 * Python package's test repeats through its binding and compares byte for byte
 * (python/tests/test_client.py, test_same_as_c):
 *   keys[i] = splitmix64(i) for i < N, then keys[N + i] = keys[i] (every key twice);
 *   pull(keys) -> rows A; push(keys, g) with g[i][j] = ((i * 7 + j) % 13 - 6) / 64;
 *   pull(keys) -> rows B; lookup(keys[0..N) and N keys never pulled: splitmix64(10^9 + i))
 *   -> rows C and found F.
 * OUT gets A, B, C (float32) and F (uint8), in that order. Exit 0, or 1 with the error. */
#include "emberps/psclient.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t x) {
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

static int fail(psc_t *c, int rc, const char *what) {
    fprintf(stderr, "psc_replay: %s: %s\n", what, psc_strerror(rc));
    psc_close(c);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: psc_replay SERVER TABLE DIM N OUT\n");
        return 2;
    }
    const char *table = argv[2];
    const uint32_t dim = (uint32_t)atoi(argv[3]);
    const size_t n = (size_t)atol(argv[4]), m = 2 * n;
    psc_opts_t o = {.servers = argv[1], .timeout_ms = 10000};
    psc_t *c = NULL;
    int rc = psc_connect(&o, &c);
    if (rc)
        return fail(c, rc, "connect");
    uint64_t *keys = malloc(m * sizeof *keys), *lk = malloc(m * sizeof *lk);
    float *a = malloc(m * dim * 4), *b = malloc(m * dim * 4), *g = malloc(m * dim * 4);
    float *cc = malloc(m * dim * 4);
    uint8_t *found = malloc(m);
    if (!keys || !lk || !a || !b || !g || !cc || !found)
        return fail(c, -2, "malloc");
    for (size_t i = 0; i < n; i++) {
        keys[i] = keys[n + i] = lk[i] = splitmix64(i);
        lk[n + i] = splitmix64(1000000000u + i);
    }
    for (size_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < dim; j++)
            g[i * dim + j] = (float)((int)((i * 7 + j) % 13) - 6) / 64.0f;
    if ((rc = psc_pull(c, table, keys, m, dim, a)))
        return fail(c, rc, "pull");
    if ((rc = psc_push(c, table, keys, m, dim, g, NULL)))
        return fail(c, rc, "push");
    if ((rc = psc_pull(c, table, keys, m, dim, b)))
        return fail(c, rc, "pull");
    if ((rc = psc_lookup(c, table, lk, m, dim, cc, found)))
        return fail(c, rc, "lookup");
    FILE *f = fopen(argv[5], "wb");
    if (!f || fwrite(a, 4, m * dim, f) != m * dim || fwrite(b, 4, m * dim, f) != m * dim ||
        fwrite(cc, 4, m * dim, f) != m * dim || fwrite(found, 1, m, f) != m || fclose(f))
        return fail(c, -10, "write OUT");
    psc_close(c);
    free(keys);
    free(lk);
    free(a);
    free(b);
    free(g);
    free(cc);
    free(found);
    return 0;
}
