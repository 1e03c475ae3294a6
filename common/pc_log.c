/* pc_log.c: the logger behind PC_LOG (see pc_log.h for the contract). */
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

void pc__log_write(pc_log_level_t level, const char *file, int line, const char *fmt, ...) {
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
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
        va_end(ap);
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
