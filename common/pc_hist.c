/* pc_hist.c: see pc_hist.h. */
#include "pc_hist.h"

#include <stdarg.h>
#include <stdio.h>

size_t pc_prom_appendf(char *buf, size_t cap, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, fmt, ap);
    va_end(ap);
    return n > 0 ? len + (size_t)n : len;
}

size_t pc_hist_render(const pc_hist_t *h, const char *name, const char *labels, char *buf,
                      size_t cap, size_t len) {
    const char *sep = labels[0] ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i < PC_HIST_N; i++) {
        cum += atomic_load_explicit(&((pc_hist_t *)h)->bucket[i], memory_order_relaxed);
        if (i < PC_HIST_N - 1)
            len = pc_prom_appendf(buf, cap, len, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels,
                                  sep, pc_hist_bounds_us[i] * 1e-6, (unsigned long long)cum);
        else
            len = pc_prom_appendf(buf, cap, len, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels,
                                  sep, (unsigned long long)cum);
    }
    const uint64_t sum = atomic_load_explicit(&((pc_hist_t *)h)->sum_ns, memory_order_relaxed);
    len = pc_prom_appendf(buf, cap, len, "%s_sum{%s} %.9f\n", name, labels, (double)sum * 1e-9);
    return pc_prom_appendf(buf, cap, len, "%s_count{%s} %llu\n", name, labels,
                           (unsigned long long)cum);
}
