/* pc_alloc.c: counted allocation (see pc_alloc.h). */
#include "pc_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static atomic_uint_least64_t g_used[PC_MEM_NTAGS];

static void count_add(pc_mem_tag_t tag, size_t n) {
    atomic_fetch_add_explicit(&g_used[tag], n, memory_order_relaxed);
}

static void count_sub(pc_mem_tag_t tag, size_t n) {
    atomic_fetch_sub_explicit(&g_used[tag], n, memory_order_relaxed);
}

void *pc_malloc(pc_mem_tag_t tag, size_t size) {
    void *p = malloc(size ? size : 1);
    if (p)
        count_add(tag, size);
    return p;
}

void *pc_calloc(pc_mem_tag_t tag, size_t count, size_t size) {
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p)
        count_add(tag, count * size);
    return p;
}

void *pc_realloc(pc_mem_tag_t tag, void *p, size_t old_size, size_t new_size) {
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

void *pc_vm_alloc(pc_mem_tag_t tag, size_t size) {
    if (size == 0)
        return NULL;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    count_add(tag, size);
    return p;
}

void *pc_vm_resize(pc_mem_tag_t tag, void *p, size_t old_size, size_t new_size) {
    if (!p)
        return pc_vm_alloc(tag, new_size);
    if (new_size == 0)
        return NULL;
    void *q = mremap(p, old_size, new_size, MREMAP_MAYMOVE);
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

void pc_vm_advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
#else
    (void)p;
    (void)size;
#endif
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
