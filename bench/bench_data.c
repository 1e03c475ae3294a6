/* bench_data.c: `ps-bench data`: sample parsing and generation speed.
 *
 * 1M generated Criteo lines (--quick 300k, --smoke 20k; --keys=N) held in memory, then:
 *  - baseline: splitting the same bytes into lines (memchr) and touching every byte: the rate
 *    no parser can beat;
 *  - pw_parse_line on every line (one thread): parse_lines_per_s and its ratio to the baseline;
 *  - the reader (its own thread, batches of 1024 through the queue) over the same data written
 *    to a file: lines/s as a trainer would see them, parsing on the reader thread and on 1, 2
 *    and 4 parse threads (up to the CPUs there are; unpinned, whatever --pin says);
 *  - ps-datagen's generator: rows/s.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_time.h"
#include "pw_datagen.h"
#include "pw_parse.h"
#include "pw_reader.h"

/* Criteo parse rate over n lines in data (median of 3), next to a line-scan baseline of the
 * same bytes (*scan, lines/s) and their median ratio (*ratio). */
double bench_parse_rate(const char *data, size_t len, uint64_t n, double *scan, double *ratio) {
    double base[3], parse[3], rat[3];
    static pw_sample_t s;
    for (int k = 0; k < 3; k++) {
        uint64_t t0 = pc_time_mono_ns();
        uint64_t lines = 0, sum = 0;
        for (const char *p = data, *e = data + len; p < e; lines++) {
            const char *nl = memchr(p, '\n', (size_t)(e - p));
            for (const char *q = p; q < nl; q++)
                sum += (unsigned char)*q;
            p = nl + 1;
        }
        base[k] = (double)lines / pc_time_sec_since(t0);
        if (sum == 42)
            printf(" ");
        t0 = pc_time_mono_ns();
        uint64_t ok = 0;
        for (const char *p = data, *e = data + len; p < e;) {
            const char *nl = memchr(p, '\n', (size_t)(e - p));
            ok += pw_parse_line(PW_FMT_CRITEO, NULL, p, (size_t)(nl - p + 1), &s, NULL, 0) == 0;
            p = nl + 1;
        }
        parse[k] = (double)ok / pc_time_sec_since(t0);
        if (ok != n)
            abort();
        rat[k] = parse[k] / base[k];
    }
    *scan = bench_median3(base);
    *ratio = bench_median3(rat);
    return bench_median3(parse);
}

/* Generate n Criteo lines with the default planted model into a malloc'ed buffer. */
char *bench_gen_lines(uint64_t n, size_t *len_out, double *rows_per_s) {
    pw_datagen_opts_t go;
    pw_datagen_defaults(&go);
    pw_datagen_t *gen;
    if (pw_datagen_create(&go, &gen))
        abort();
    size_t cap = n * 256 + 1024, len = 0;
    char *data = malloc(cap);
    char line[768];
    const uint64_t t0 = pc_time_mono_ns();
    for (uint64_t r = 0; r < n; r++) {
        const size_t l = pw_datagen_row(gen, 0, r, line, NULL);
        if (len + l > cap) {
            cap *= 2;
            data = realloc(data, cap);
        }
        memcpy(data + len, line, l);
        len += l;
    }
    if (rows_per_s)
        *rows_per_s = (double)n / pc_time_sec_since(t0);
    pw_datagen_destroy(gen);
    *len_out = len;
    return data;
}

/* The reader over the n lines of path, batches of 1024, with `threads` parse threads: lines/s as
 * a trainer taking the batches sees them (best of 2). */
static double reader_lines_per_s(const char *path, uint64_t n, int threads) {
    double best = 0;
    for (int k = 0; k < 2; k++) {
        const char *paths[] = {path};
        pw_reader_opts_t ro = {.format = PW_FMT_CRITEO,
                               .paths = paths,
                               .npaths = 1,
                               .world = 1,
                               .batch = 1024,
                               .queue = 4,
                               .epochs = 1,
                               .max_error_rate = 0,
                               .parse_threads = threads};
        pw_reader_t *rd;
        const uint64_t t0 = pc_time_mono_ns();
        if (pw_reader_open(&ro, &rd))
            abort();
        uint64_t got = 0;
        for (const pw_batch_t *b; (b = pw_reader_next(rd));)
            got += b->n;
        const double rate = (double)got / pc_time_sec_since(t0);
        if (pw_reader_error(rd) || got != n)
            abort();
        pw_reader_close(rd);
        best = rate > best ? rate : best;
    }
    return best;
}

int bench_data_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "data", &o);
    const uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 20000 : o.quick ? 300000 : 1000000;
    cpu_set_t all_cpus;
    if (sched_getaffinity(0, sizeof all_cpus, &all_cpus))
        abort();
    bench_pin(&o, 0);
    size_t len;
    double gen_rate;
    char *data = bench_gen_lines(n, &len, &gen_rate);

    double base_rate, ratio;
    const double parse_rate = bench_parse_rate(data, len, n, &base_rate, &ratio);
    /* The reader over a file of the same lines. */
    char path[256];
    snprintf(path, sizeof path, "%s/ps-bench-data-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len)
        abort();
    close(fd);
    /* The reader's threads need the cores: unpinned from here on. */
    if (sched_setaffinity(0, sizeof all_cpus, &all_cpus))
        abort();
    const double reader_rate = reader_lines_per_s(path, n, 0);
    const int cpus = CPU_COUNT(&all_cpus);
    const int par_threads = cpus > 4 ? 4 : cpus;
    double par_rate[3] = {0}; /* 1, 2, 4 parse threads (up to par_threads) */
    for (int k = 0, t = 1; t <= par_threads; k++, t *= 2)
        par_rate[k] = reader_lines_per_s(path, n, t);
    const int best_k = par_threads >= 4 ? 2 : par_threads >= 2 ? 1 : 0; /* the most threads run */
    const double best = par_rate[best_k];
    unlink(path);
    free(data);

    printf("ps-bench data: %llu Criteo lines (%.1f MB)\n", (unsigned long long)n,
           (double)len / 1e6);
    printf("%-40s %12.0f lines/s\n", "baseline: split lines, read every byte", base_rate);
    printf("%-40s %12.0f lines/s  (%.2f of the baseline, median of 3)\n",
           "pw_parse_line (Criteo, 1 thread)", parse_rate, ratio);
    printf("%-40s %12.0f lines/s\n", "reader (file -> thread -> batches)", reader_rate);
    for (int k = 0, t = 1; t <= par_threads; k++, t *= 2) {
        char what[64];
        snprintf(what, sizeof what, "reader, %d parse thread%s", t, t > 1 ? "s" : "");
        printf("%-40s %12.0f lines/s  (%.2fx)\n", what, par_rate[k], par_rate[k] / reader_rate);
    }
    printf("%-40s %12.0f rows/s\n", "ps-datagen generator", gen_rate);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "data");
    cJSON_AddNumberToObject(root, "lines", (double)n);
    cJSON_AddNumberToObject(root, "parse_lines_per_s", parse_rate);
    cJSON_AddNumberToObject(root, "scan_lines_per_s", base_rate);
    cJSON_AddNumberToObject(root, "parse_vs_scan", ratio);
    cJSON_AddNumberToObject(root, "reader_lines_per_s", reader_rate);
    cJSON_AddNumberToObject(root, "reader_parse_threads", 1 << best_k);
    cJSON_AddNumberToObject(root, "reader_parallel_lines_per_s", best);
    cJSON_AddNumberToObject(root, "reader_parallel_vs_serial", best / reader_rate);
    cJSON_AddNumberToObject(root, "datagen_rows_per_s", gen_rate);
    bench_emit_json(&o, root);
    return 0;
}
