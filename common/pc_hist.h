/* pc_hist.h: lock-free latency histograms, and appending Prometheus text.
 *
 * Fixed buckets from 10 us to 10 s (upper bounds in PC_HIST_BOUNDS), counted with relaxed
 * atomics: any thread may add, any thread may render (a render may see a sample in `count` a
 * moment before its bucket: Prometheus tolerates such skew).
 */
#ifndef PC_HIST_H
#define PC_HIST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define PC_HIST_N 16
/* Upper bounds in microseconds; the last bucket is +Inf. */
static const uint32_t pc_hist_bounds_us[PC_HIST_N - 1] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 1000000, 10000000};

typedef struct pc_hist {
    atomic_uint_least64_t bucket[PC_HIST_N];
    atomic_uint_least64_t sum_ns, count;
} pc_hist_t;

static inline void pc_hist_add(pc_hist_t *h, uint64_t ns) {
    size_t i = 0; /* (in ns: 10.5 us is over the 10 us bound, whatever truncation would say) */
    while (i < PC_HIST_N - 1 && ns > (uint64_t)pc_hist_bounds_us[i] * 1000u)
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

/* Append printf-style text to buf at len (never past cap, NUL-terminated while it fits);
 * returns the length the whole text needs, so a caller can retry with a larger buffer. */
size_t pc_prom_appendf(char *buf, size_t cap, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Append the histogram `name` with `labels` ("op=\"pull\"", or "" for none) in Prometheus text
 * form (cumulative le buckets in seconds, _sum, _count) to buf at *len, up to cap. */
size_t pc_hist_render(const pc_hist_t *h, const char *name, const char *labels, char *buf,
                      size_t cap, size_t len);

#endif
