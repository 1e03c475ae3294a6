/* pc_alloc.c: counted allocation (see pc_alloc.h). */
#include "pc_alloc.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_uint_least64_t g_used[PC_MEM_NTAGS];
static atomic_long g_fail_after = -1; /* test fault injection: -1 = off */

void pc_mem_fail_after(long n) {
    atomic_store(&g_fail_after, n);
}

long pc_mem_fail_remaining(void) {
    return atomic_load(&g_fail_after);
}

/* True when this allocation must fail (fault injection). */
static int injected_failure(void) {
    long n = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
    if (n < 0)
        return 0;
    while (n > 0 && !atomic_compare_exchange_weak(&g_fail_after, &n, n - 1))
        ;
    return n == 0;
}

static void count_add(pc_mem_tag_t tag, size_t n) {
    atomic_fetch_add_explicit(&g_used[tag], n, memory_order_relaxed);
}

static void count_sub(pc_mem_tag_t tag, size_t n) {
    atomic_fetch_sub_explicit(&g_used[tag], n, memory_order_relaxed);
}

void *pc_malloc(pc_mem_tag_t tag, size_t size) {
    if (injected_failure())
        return NULL;
    void *p = malloc(size ? size : 1);
    if (p)
        count_add(tag, size);
    return p;
}

void *pc_calloc(pc_mem_tag_t tag, size_t count, size_t size) {
    if ((size && count > SIZE_MAX / size) || injected_failure())
        return NULL;
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p)
        count_add(tag, count * size);
    return p;
}

void *pc_realloc(pc_mem_tag_t tag, void *p, size_t old_size, size_t new_size) {
    if (injected_failure())
        return NULL;
    void *q = realloc(p, new_size ? new_size : 1);
    if (!q)
        return NULL;
    count_sub(tag, old_size);
    count_add(tag, new_size);
    return q;
}

void pc_free(pc_mem_tag_t tag, void *p, size_t size) {
    if (!p)
        return;
    count_sub(tag, size);
    free(p);
}

/* ---- self-sized blocks: [header][user bytes] ---- */

typedef union shdr {
    struct {
        size_t size;
        pc_mem_tag_t tag;
    } h;
    max_align_t align; /* the user block keeps malloc's alignment */
} shdr_t;

void *pc_smalloc(pc_mem_tag_t tag, size_t size) {
    if (size > SIZE_MAX - sizeof(shdr_t) || injected_failure())
        return NULL;
    shdr_t *h = malloc(sizeof *h + size);
    if (!h)
        return NULL;
    h->h.size = size;
    h->h.tag = tag;
    count_add(tag, size);
    return h + 1;
}

void *pc_scalloc(pc_mem_tag_t tag, size_t count, size_t size) {
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = pc_smalloc(tag, count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void *pc_srealloc(pc_mem_tag_t tag, void *p, size_t size) {
    if (!p)
        return pc_smalloc(tag, size);
    if (size > SIZE_MAX - sizeof(shdr_t) || injected_failure())
        return NULL;
    shdr_t *old = (shdr_t *)p - 1;
    const size_t old_size = old->h.size;
    const pc_mem_tag_t t = old->h.tag;
    shdr_t *h = realloc(old, sizeof *h + size);
    if (!h)
        return NULL;
    h->h.size = size;
    count_sub(t, old_size);
    count_add(t, size);
    return h + 1;
}

bool pc_sappend_u64(uint64_t **v, size_t *n, size_t *cap, uint64_t x) {
    if (*n == *cap) {
        const size_t ncap = *cap ? 2 * *cap : 4096;
        uint64_t *nv = pc_srealloc(PC_MEM_SCRATCH, *v, ncap * sizeof *nv);
        if (!nv)
            return false;
        *v = nv;
        *cap = ncap;
    }
    (*v)[(*n)++] = x;
    return true;
}

void pc_sfree(void *p) {
    if (!p)
        return;
    shdr_t *h = (shdr_t *)p - 1;
    count_sub(h->h.tag, h->h.size);
    free(h);
}

/* Mappings of at least HUGE bytes start on a 2 MiB boundary and only ever move to another 2 MiB
 * boundary: mremap to an address not congruent mod 2 MiB would split every transparent huge page
 * of the region back into 4 KiB pages. */
#define HUGE ((size_t)2 << 20)

/* Reserve `size` bytes of address space at a 2 MiB boundary (PROT_NONE placeholder, or usable
 * memory when `usable`). Returns NULL on failure. */
static void *map_aligned(size_t size, int usable) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - HUGE - page)
        return NULL;
    size = (size + page - 1) & ~(page - 1); /* the tail unmapped below must start on a page */
    size_t span = size + HUGE;
    int prot = usable ? PROT_READ | PROT_WRITE : PROT_NONE;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (usable ? 0 : MAP_NORESERVE);
    char *p = mmap(NULL, span, prot, flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    size_t tail = (size_t)((p + span) - (a + size));
    if (tail)
        munmap(a + size, tail);
    return a;
}

void *pc_vm_alloc(pc_mem_tag_t tag, size_t size) {
    if (size == 0 || injected_failure())
        return NULL;
    void *p;
    if (size >= HUGE) {
        p = map_aligned(size, 1);
    } else {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            p = NULL;
    }
    if (p)
        count_add(tag, size);
    return p;
}

void *pc_vm_resize(pc_mem_tag_t tag, void *p, size_t old_size, size_t new_size) {
    if (!p)
        return pc_vm_alloc(tag, new_size);
    if (new_size == 0 || injected_failure())
        return NULL;
    void *q = MAP_FAILED;
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer does not follow mremap: the moved pages keep the old range's shadow, and a
     * later mapping at the old address (another shard's) inherits it, which it reports as races
     * between unrelated locks. Under TSan, copy into a new mapping instead (munmap is seen). */
    if ((q = map_aligned(new_size, 1))) {
        memcpy(q, p, old_size < new_size ? old_size : new_size);
        munmap(p, old_size);
    } else {
        q = MAP_FAILED;
    }
#else
    if (new_size >= HUGE && ((uintptr_t)p & (HUGE - 1)) == 0) {
        /* In place when the address space behind is free, else onto an aligned placeholder. */
        q = mremap(p, old_size, new_size, 0);
        if (q == MAP_FAILED) {
            void *dst = map_aligned(new_size, 0);
            if (dst) {
                q = mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
                if (q == MAP_FAILED)
                    munmap(dst, new_size);
            }
        }
    } else if (new_size >= HUGE) {
        /* Small region growing large: copy once into an aligned mapping. */
        q = map_aligned(new_size, 1);
        if (q) {
            memcpy(q, p, old_size < new_size ? old_size : new_size);
            munmap(p, old_size);
        } else {
            q = MAP_FAILED;
        }
    } else {
        q = mremap(p, old_size, new_size, MREMAP_MAYMOVE);
    }
#endif
    if (q == MAP_FAILED)
        return NULL;
    count_sub(tag, old_size);
    count_add(tag, new_size);
    return q;
}

void pc_vm_free(pc_mem_tag_t tag, void *p, size_t size) {
    if (!p)
        return;
    munmap(p, size);
    count_sub(tag, size);
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

void pc_vm_advise_huge(void *p, size_t size, size_t used) {
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
    /* Pages touched before the advice stay 4 KiB until khugepaged gets to them; collapse the
     * fully covered 2 MiB ranges of the used part now (synchronous; older kernels answer
     * EINVAL, ignored). The unused part is left alone so it stays unpopulated. */
    uintptr_t b = ((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1);
    uintptr_t e = ((uintptr_t)p + (used < size ? used : size)) & ~(uintptr_t)(HUGE - 1);
    if (e > b)
        madvise((void *)b, e - b, MADV_COLLAPSE);
#else
    (void)p;
    (void)size;
    (void)used;
#endif
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Touched lazily, a page read before its first write maps the shared zero page; the write then
 * replaces it and flushes the TLB of every CPU the process runs on (an IPI to each). One call
 * spares both. */
void pc_vm_populate(void *p, size_t size) {
    if (p && size)
        madvise(p, size, MADV_POPULATE_WRITE);
}

uint64_t pc_mem_used(pc_mem_tag_t tag) {
    if ((unsigned)tag >= PC_MEM_NTAGS)
        return 0;
    return atomic_load_explicit(&g_used[tag], memory_order_relaxed);
}

const char *pc_mem_tag_name(pc_mem_tag_t tag) {
    switch (tag) {
#define PC__MEM_NAME(name, str) \
    case PC_MEM_##name:         \
        return str;
        PC_MEM_TAG_MAP(PC__MEM_NAME)
#undef PC__MEM_NAME
        default:
            return "unknown";
    }
}
