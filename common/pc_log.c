/* pc_log.c: the logger behind PC_LOG and its rate limit (see pc_log.h for the contract). */
#include "pc_log.h"
#include "pc_error.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static struct {
    FILE *sink;
    atomic_int level;
    char ident[64];
} g_log = {NULL, PC_LOG_INFO, "ember"};

void pc_log_init(FILE *sink, pc_log_level_t level, const char *ident) {
    g_log.sink = sink;
    atomic_store(&g_log.level, (int)level);
    if (ident)
        snprintf(g_log.ident, sizeof g_log.ident, "%s", ident);
}

void pc_log_set_level(pc_log_level_t level) {
    atomic_store(&g_log.level, (int)level);
}

pc_log_level_t pc_log_get_level(void) {
    return (pc_log_level_t)atomic_load_explicit(&g_log.level, memory_order_relaxed);
}

bool pc_log_enabled(pc_log_level_t level) {
    return (int)level <= atomic_load_explicit(&g_log.level, memory_order_relaxed);
}

int pc_log_level_parse(const char *s, pc_log_level_t *out) {
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++) {
        if (s && strcasecmp(s, names[i]) == 0) {
            *out = (pc_log_level_t)i;
            return 0;
        }
    }
    return PC_EINVAL;
}

/* Format and write one line; `suppressed` > 0 appends " [N more suppressed]". */
static void log_vwrite(pc_log_level_t level, const char *file, int line, uint64_t suppressed,
                       const char *fmt, va_list ap) {
    static const char letters[] = "EWIDT";
    char buf[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, letters[level], g_log.ident, base, line);
    if (n < 0)
        return;
    if ((size_t)n < sizeof buf) {
        int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
        if (m > 0)
            n += m;
    }
    if (suppressed && (size_t)n < sizeof buf) {
        int m = snprintf(buf + n, sizeof buf - (size_t)n, " [%llu more suppressed]",
                         (unsigned long long)suppressed);
        if (m > 0)
            n += m;
    }
    if ((size_t)n >= sizeof buf - 1) /* truncated: keep the newline */
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    FILE *out = g_log.sink ? g_log.sink : stderr;
    flockfile(out);
    fwrite(buf, 1, (size_t)n, out);
    fflush(out);
    funlockfile(out);
}

void pc__log_write(pc_log_level_t level, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, file, line, 0, fmt, ap);
    va_end(ap);
}

void pc__log_write_limited(pc_log_level_t level, const char *file, int line, uint64_t suppressed,
                           const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, file, line, suppressed, fmt, ap);
    va_end(ap);
}

/* ==== rate limit ============================================================================ */

void pc_log_limit_init(pc_log_limit_t *l, uint32_t lines, uint32_t window_ms) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->lines = lines ? lines : 1;
    l->window_ms = window_ms ? window_ms : 1;
}

void pc_log_limit_close(pc_log_limit_t *l) {
    pthread_mutex_destroy(&l->mu);
}

bool pc_log_limit_take(pc_log_limit_t *l, uint64_t now_ms, uint64_t *suppressed) {
    pthread_mutex_lock(&l->mu);
    if (l->used == 0 || now_ms - l->window_start_ms >= l->window_ms) { /* a new window */
        l->window_start_ms = now_ms;
        l->used = 0;
    }
    const bool ok = l->used < l->lines;
    if (ok) {
        l->used++;
        *suppressed = l->suppressed;
        l->suppressed = 0;
    } else {
        l->suppressed++;
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}

uint64_t pc_log_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
