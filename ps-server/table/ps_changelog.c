/* ps_changelog.c: a ring of keys with positions (see ps_changelog.h). */
#include "ps_changelog.h"

#include "pc_alloc.h"
#include "pc_error.h"

#include <pthread.h>
#include <string.h>

struct ps_changelog {
    pthread_mutex_t mu;
    uint64_t base; /* the first entry's position */
    uint64_t head; /* the next position; entry at position p sits at ring[(p - base) % cap] */
    size_t cap;
    uint64_t *ring;
};

int ps_changelog_create(size_t capacity, uint64_t base, ps_changelog_t **out) {
    if (!capacity || capacity > ((size_t)1 << 40) || base > UINT64_MAX / 2)
        return PC_EINVAL;
    ps_changelog_t *l = pc_scalloc(PC_MEM_OTHER, 1, sizeof *l);
    if (!l)
        return PC_ENOMEM;
    l->cap = capacity;
    l->base = l->head = base;
    if (!(l->ring = pc_smalloc(PC_MEM_OTHER, capacity * sizeof *l->ring))) {
        pc_sfree(l);
        return PC_ENOMEM;
    }
    pthread_mutex_init(&l->mu, NULL);
    *out = l;
    return 0;
}

void ps_changelog_destroy(ps_changelog_t *l) {
    if (!l)
        return;
    pthread_mutex_destroy(&l->mu);
    pc_sfree(l->ring);
    pc_sfree(l);
}

/* Copy between the ring (from position pos) and a flat array, in at most two pieces. */
static void ring_copy(const ps_changelog_t *l, uint64_t pos, uint64_t *flat, size_t n, int in) {
    while (n) {
        const size_t at = (size_t)((pos - l->base) % l->cap),
                     run = l->cap - at < n ? l->cap - at : n;
        if (in)
            memcpy(l->ring + at, flat, run * sizeof *flat);
        else
            memcpy(flat, l->ring + at, run * sizeof *flat);
        pos += run;
        flat += run;
        n -= run;
    }
}

void ps_changelog_append(ps_changelog_t *l, const uint64_t *keys, size_t n) {
    if (!l || !n)
        return;
    pthread_mutex_lock(&l->mu);
    if (n > l->cap) { /* only the newest cap of them can be held */
        l->head += n - l->cap;
        keys += n - l->cap;
        n = l->cap;
    }
    ring_copy(l, l->head, (uint64_t *)(uintptr_t)keys, n, 1);
    l->head += n;
    pthread_mutex_unlock(&l->mu);
}

static uint64_t oldest_of(const ps_changelog_t *l) {
    return l->head - l->base > l->cap ? l->head - l->cap : l->base;
}

void ps_changelog_bounds(ps_changelog_t *l, uint64_t *oldest, uint64_t *head) {
    pthread_mutex_lock(&l->mu);
    *oldest = oldest_of(l);
    *head = l->head;
    pthread_mutex_unlock(&l->mu);
}

int ps_changelog_read(ps_changelog_t *l, uint64_t from, size_t max, uint64_t *keys, size_t *n,
                      uint64_t *oldest, uint64_t *head) {
    *n = 0;
    pthread_mutex_lock(&l->mu);
    const uint64_t lo = oldest_of(l), hi = l->head;
    int rc = from < lo || from > hi ? PC_ERANGE : 0;
    if (!rc) {
        *n = hi - from < max ? (size_t)(hi - from) : max;
        ring_copy(l, from, keys, *n, 0);
    }
    pthread_mutex_unlock(&l->mu);
    if (oldest)
        *oldest = lo;
    if (head)
        *head = hi;
    return rc;
}
