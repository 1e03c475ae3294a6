/* pw_unique.c: see pw_unique.h. */
#include "pw_unique.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_hash.h"

#include <string.h>

/* A cleared table of at least 2 * n entries. */
static int table_for(pw_unique_t *u, size_t n) {
    size_t hc = 16;
    while (hc < 2 * n)
        hc <<= 1;
    if (hc > u->cap) {
        pc_sfree(u->tab);
        u->mask = 0;
        if (!(u->tab = pc_smalloc(PC_MEM_MODEL, hc * sizeof *u->tab)))
            return u->cap = 0, PC_ENOMEM;
        u->cap = hc;
    }
    memset(u->tab, 0, hc * sizeof *u->tab);
    u->mask = hc - 1;
    return 0;
}

/* The entry of key: its own, or the empty one where it would go. */
static size_t probe(const pw_unique_t *u, const uint64_t *ukeys, uint64_t key) {
    size_t h = pc_hash_u64(key, PC_HASH_SEED_DEDUP) & u->mask;
    while (u->tab[h] && ukeys[u->tab[h] - 1] != key)
        h = (h + 1) & u->mask;
    return h;
}

int pw_unique(pw_unique_t *u, const uint64_t *keys, size_t nk, uint64_t *ukeys, uint32_t *inv,
              size_t *nu) {
    int rc = table_for(u, nk);
    if (rc)
        return rc;
    size_t n = 0;
    for (size_t j = 0; j < nk; j++) {
        const uint64_t key = keys[j];
        const size_t h = probe(u, ukeys, key);
        if (!u->tab[h]) {
            ukeys[n] = key;
            u->tab[h] = (uint32_t)++n;
        }
        inv[j] = u->tab[h] - 1;
    }
    *nu = n;
    return 0;
}

int pw_unique_index(pw_unique_t *u, const uint64_t *ukeys, size_t n) {
    int rc = table_for(u, n);
    for (size_t i = 0; !rc && i < n; i++) {
        const size_t h = probe(u, ukeys, ukeys[i]);
        if (u->tab[h])
            rc = PC_EINVAL;
        else
            u->tab[h] = (uint32_t)(i + 1);
    }
    if (rc)
        u->mask = 0; /* nothing indexed: every key absent */
    return rc;
}

/* Lines a batch of finds runs ahead: the table entry of key i + FIND_AHEAD is prefetched, then
 * at i + FIND_AHEAD / 2 the key that entry names. The set is usually out of cache (a whole dense
 * step ran since it was built), so one find at a time waited on two misses in a row. */
enum { FIND_AHEAD = 16 };

void pw_unique_find_many(const pw_unique_t *u, const uint64_t *ukeys, const uint64_t *keys,
                         size_t n, uint32_t *idx) {
    if (!u->mask) {
        for (size_t i = 0; i < n; i++)
            idx[i] = PW_UNIQUE_NONE;
        return;
    }
    size_t ring[FIND_AHEAD]; /* the first entry of keys a - FIND_AHEAD .. a - 1 */
    for (size_t a = 0; a < n + FIND_AHEAD; a++) {
        if (a >= FIND_AHEAD) { /* key a - FIND_AHEAD: its lines are in (its slot reused below) */
            const size_t i = a - FIND_AHEAD;
            size_t h = ring[i % FIND_AHEAD];
            while (u->tab[h] && ukeys[u->tab[h] - 1] != keys[i])
                h = (h + 1) & u->mask;
            idx[i] = u->tab[h] ? u->tab[h] - 1 : PW_UNIQUE_NONE;
        }
        const size_t b = a - FIND_AHEAD / 2; /* the key its entry names */
        if (a >= FIND_AHEAD / 2 && b < n) {
            const uint32_t e = u->tab[ring[b % FIND_AHEAD]];
            if (e)
                __builtin_prefetch(&ukeys[e - 1], 0, 3);
        }
        if (a < n) { /* key a's entry */
            const size_t h = pc_hash_u64(keys[a], PC_HASH_SEED_DEDUP) & u->mask;
            ring[a % FIND_AHEAD] = h;
            __builtin_prefetch(&u->tab[h], 0, 3);
        }
    }
}

void pw_unique_free(pw_unique_t *u) {
    pc_sfree(u->tab);
    u->tab = NULL;
    u->cap = u->mask = 0;
}
