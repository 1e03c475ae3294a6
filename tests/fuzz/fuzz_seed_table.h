/* fuzz_seed_table.h: the one table behind the fuzz seeds. fuzz_seed writes its export and a
 * checkpoint manifest; fuzz_store writes the same table's row file beside fuzzed manifests, so
 * both must build exactly this table. */
#ifndef FUZZ_SEED_TABLE_H
#define FUZZ_SEED_TABLE_H

#include <stdlib.h>

#include "ps_catalog.h"

/* Create table "seed" in cat (one push of five keys) and return it (held by cat). */
static inline ps_table_t *fuzz_seed_table(ps_catalog_t *cat) {
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    if (ps_table_config_parse(&c, "name=seed,dim=3,optimizer=adam,shards=1", NULL, 0) ||
        ps_catalog_add(cat, &c))
        abort();
    ps_table_t *t;
    if (ps_catalog_acquire(cat, "seed", &t))
        abort();
    ps_catalog_release(cat, t);
    uint64_t keys[5] = {1, 2, 3, 4, 5};
    float g[15];
    for (int i = 0; i < 15; i++)
        g[i] = 0.1f * (float)i;
    if (ps_table_push(t, keys, 5, g, 15, NULL))
        abort();
    return t;
}

#endif
