/* bench_util.h: shared helpers of the ps-bench areas: options, timing, pinning, key streams,
 * memory readings and the final JSON line. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Options every area understands. */
typedef struct bench_opts {
    bool json;          /* print one JSON object as the last line */
    bool quick;         /* reduced sizes, under 60 s */
    bool smoke;         /* tiny sizes, for the test suite: proves the program runs */
    bool pin;           /* pin worker thread i to CPU i */
    double seconds;     /* per measurement */
    int dim;            /* only this dim (0: the area's list) */
    long long keys;     /* only this table size (0: the area's list) */
    const char *device; /* --device=NAME (pw_backend_open), NULL: the area's default */
    /* The CPUs this process may use as started (bench_parse_opts; ncpu 0: ask at each call):
     * bench_pin and bench_spawn count from these, not from the calling thread's own set, which
     * bench_pin has narrowed to one CPU (a server spawned after pinning landed on the client's). */
    int cpu[64];
    int ncpu;
} bench_opts_t;

/* Parse common options from argv[1..]; exits with usage on error. */
void bench_parse_opts(int argc, char **argv, const char *area, bench_opts_t *o);

/* Pin the calling thread to the cpu-th CPU available (mod their count); no-op when pinning is
 * off. */
void bench_pin(const bench_opts_t *o, int cpu);

/* Resident set size of this process in bytes, and the part in transparent huge pages. */
uint64_t bench_rss_bytes(void);
uint64_t bench_anon_huge_bytes(void);

/* The i-th key of a benchmark universe: arbitrary-looking 64-bit ids. */
uint64_t bench_key(uint64_t i);

/* 64 random bits (pc_rand); Zipf draws come from pc_rand.h's pc_zipf. */
uint64_t bench_rand(uint64_t *rng);

/* Data helpers shared by the data and train areas (bench_data.c). */
char *bench_gen_lines(uint64_t n, size_t *len, double *rows_per_s);
double bench_parse_rate(const char *data, size_t len, uint64_t n, double *scan, double *ratio);

/* Median of three samples. */
double bench_median3(const double *v);
/* The q-quantile of v[0..n) (sorted here), nearest rank: the sample at rank ceil(q * n),
 * 1-based; 0 when n is 0. */
double bench_quantile(double *v, size_t n, double q);

/* Insert keys bench_key(0 .. n-1) into t by pulls of 64Ki keys (aborts on error). */
struct ps_table;
void bench_fill(struct ps_table *t, uint64_t n);

/* Run fn(ctx, thread) on `threads` threads started together; returns wall seconds. */
double bench_run_threads(int threads, void *(*fn)(void *), void **ctx);

/* Processes next to the benchmark (ps-server, redis-server): a free loopback port; fork + exec
 * argv with the child pinned to the first CPU available (when pinning; that is CPU 0
 * of bench_pin, whichever CPU the caller is pinned to; it dies with ps-bench); SIGTERM and reap
 * (SIGKILL after 5 s); wait for a child to exit for at most `seconds` (then SIGKILL: -1), its
 * status into *status; wait (bounded) for a file to appear. The path of a binary next to
 * ps-bench. */
int bench_free_port(void);
int bench_spawn(const bench_opts_t *o, char *const argv[]);
/* Run shell command cmd on every CPU (not the one the caller pinned itself to), its stdout into
 * out (cap bytes, NUL-terminated; may be NULL: read and dropped); its exit status, -1 when it
 * could not run or was killed. */
int bench_run_output(const char *cmd, char *out, size_t cap);
void bench_stop(int pid);
int bench_wait_exit(int pid, double seconds, int *status);
/* Read one byte of fd (a pipe from a child) within `seconds`: 1, 0 at its end, -1 on an error or
 * when the time passed (a child that hangs does not hang the benchmark). */
int bench_read_byte(int fd, double seconds, char *ch);
/* Two pipes for a child's sync: to[0] and from[1] are the child's (inherited), to[1] and from[0]
 * the caller's, closed on exec (a child holding them would never see the caller's end). Aborts
 * when none can be made. */
void bench_sync_pipes(int to[2], int from[2]);
bool bench_wait_file(const char *path, double seconds);
void bench_sibling(const char *name, char *buf, size_t cap);
/* The ps-server next to ps-bench on a free data port, started by bench_spawn (pinned to the
 * first CPU) with --io-threads=1 --grpc-port=0 --metrics-port=-1 --log-level=warn and then
 * `extra` (NULL-terminated: tables, TLS files, ...; a later flag wins, so extra may override
 * those), its port file at DIR/port-TAG (removed once read); waits (10 s) until it serves. Returns
 * its pid with its data-plane port in *dport and gRPC port in *gport (may be NULL), or -1 after
 * saying on stderr why (AREA names the bench). A port taken between the pick and the bind: a new
 * one, three tries in all. */
int bench_ps_server(const bench_opts_t *o, const char *area, const char *dir, const char *tag,
                    const char *const *extra, int *dport, int *gport);
/* The same on data port `port` (chosen beforehand: a cluster map names it). */
int bench_ps_server_at(const bench_opts_t *o, const char *area, const char *dir, const char *tag,
                       int port, const char *const *extra, int *dport, int *gport);

/* A new directory $TMPDIR/ps-bench-AREA-XXXXXX (TMPDIR default /tmp) into buf; aborts when it
 * cannot be made. */
void bench_tmpdir(const char *area, char *buf, size_t cap);

/* The Python side of an area (ps-bench py, train): fork + exec BENCH_PYTHON with args (args[0]
 * is BENCH_PYTHON, NULL-terminated), PYTHONPATH the checkout's python/ and EMBERPS_LIBPSCLIENT
 * this build's libpsclient; its stdout (and with merge_stderr its stderr) into out_path. Debian's
 * torch is built for Debian's interpreter, hence /usr/bin/python3. Returns the child's pid. */
#define BENCH_PYTHON "/usr/bin/python3"
int bench_python(char *const args[], const char *out_path, bool merge_stderr);
/* Read what bench_python's child wrote: the last line starting with '{' parsed (NULL when none
 * or unparsable; the caller frees it), every other line printed indented. `last` (may be NULL)
 * gets the last of those other lines, "" when none: why a failed child failed. */
cJSON *bench_python_result(const char *out_path, char *last, size_t cap);

/* Print the JSON object (and free it) as the last line when json is on. */
void bench_emit_json(const bench_opts_t *o, cJSON *root);

#endif
