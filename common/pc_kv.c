/* pc_kv.c: see pc_kv.h. */
#include "pc_kv.h"

#include <stdlib.h>

void pc_kv_entries_free(pc_kv_entry_t *e, size_t n) {
    if (!e)
        return;
    for (size_t i = 0; i < n; i++) {
        free(e[i].key);
        free(e[i].value);
    }
    free(e);
}
