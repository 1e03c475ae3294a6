/* pc_kv.c: see pc_kv.h. */
#include "pc_kv.h"

#include "pc_error.h"

#include <stdlib.h>
#include <string.h>

void pc_kv_entries_free(pc_kv_entry_t *e, size_t n) {
    if (!e)
        return;
    for (size_t i = 0; i < n; i++) {
        free(e[i].key);
        free(e[i].value);
    }
    free(e);
}

void *pc_kv_dup(const void *p, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        if (n)
            memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

int pc_kv_entry_fill(pc_kv_entry_t *d, const void *key, size_t klen, const void *value,
                     size_t vlen) {
    *d = (pc_kv_entry_t){.key = pc_kv_dup(key, klen), .value = pc_kv_dup(value, vlen), .len = vlen};
    return d->key && d->value ? 0 : PC_ENOMEM;
}
