/* pw_unique.c: see pw_unique.h. */
#include "pw_unique.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_hash.h"

#include <string.h>

int pw_unique(pw_unique_t *u, const uint64_t *keys, size_t nk, uint64_t *ukeys, uint32_t *inv,
              size_t *nu) {
    size_t hc = 16;
    while (hc < 2 * nk)
        hc <<= 1;
    if (hc > u->cap) {
        pc_sfree(u->tab);
        if (!(u->tab = pc_smalloc(PC_MEM_MODEL, hc * sizeof *u->tab)))
            return u->cap = 0, PC_ENOMEM;
        u->cap = hc;
    }
    memset(u->tab, 0, hc * sizeof *u->tab);
    size_t n = 0;
    for (size_t j = 0; j < nk; j++) {
        const uint64_t key = keys[j];
        size_t h = pc_hash_u64(key, PC_HASH_SEED_DEDUP) & (hc - 1);
        while (u->tab[h] && ukeys[u->tab[h] - 1] != key)
            h = (h + 1) & (hc - 1);
        if (!u->tab[h]) {
            ukeys[n] = key;
            u->tab[h] = (uint32_t)++n;
        }
        inv[j] = u->tab[h] - 1;
    }
    *nu = n;
    return 0;
}

void pw_unique_free(pw_unique_t *u) {
    pc_sfree(u->tab);
    u->tab = NULL;
    u->cap = 0;
}
