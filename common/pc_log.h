/* pc_log.h: leveled logging.
 *
 * One macro per level; each checks the level before formatting anything, so a disabled DEBUG line
 * costs one relaxed atomic load. Lines carry a UTC timestamp, the level letter, the process
 * identity set by main() (e.g. "ps-server[shard 1]") and the source location:
 *
 *   2026-11-21T05:58:01.123Z I ps-server[shard 1] table.c:88 created table "ads" dim=64
 *
 * DESIGN: the sink, level and identity are the one piece of process-wide state in common/; main()
 * sets them once with pc_log_init() before starting threads (later level changes are atomic).
 * Each line is written with a single fwrite under the stream lock, so lines from different
 * threads never interleave. Log where an error is handled, not at every hop.
 * A source that can log once per bad input from outside (a library's own messages, one per
 * malformed request) goes through a rate limit, pc_log_limit_t: a fixed window with a line budget
 * whose overflow is counted, and the next line let through says how many were suppressed. The
 * limit is the caller's (one per source, inside its context), not global state.
 *
 * Thread rule: PC_LOG and friends are thread-safe; pc_log_init() is for main() only. A
 * pc_log_limit_t is thread-safe between its _init and _close.
 */
#ifndef PC_LOG_H
#define PC_LOG_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    PC_LOG_ERROR = 0,
    PC_LOG_WARN = 1,
    PC_LOG_INFO = 2,
    PC_LOG_DEBUG = 3,
    PC_LOG_TRACE = 4,
} pc_log_level_t;

/* Set the sink (borrowed, must outlive all logging; NULL = stderr), the level and the identity
 * (copied; NULL keeps the current one). */
void pc_log_init(FILE *sink, pc_log_level_t level, const char *ident);

void pc_log_set_level(pc_log_level_t level);
pc_log_level_t pc_log_get_level(void);
bool pc_log_enabled(pc_log_level_t level);

/* Parse "error" | "warn" | "info" | "debug" | "trace". Returns 0 or PC_EINVAL. */
int pc_log_level_parse(const char *s, pc_log_level_t *out);

void pc__log_write(pc_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* pc__log_write with " [N more suppressed]" appended when suppressed > 0. */
void pc__log_write_limited(pc_log_level_t level, const char *file, int line, uint64_t suppressed,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A rate limit for one source of log lines: at most `lines` lines per window of `window_ms`
 * milliseconds (a fixed window that starts at the first line after the previous one ended). */
typedef struct pc_log_limit {
    pthread_mutex_t mu;
    uint32_t lines, window_ms;
    uint32_t used;            /* lines let through in the current window */
    uint64_t window_start_ms; /* monotonic */
    uint64_t suppressed;      /* refused since the last line let through */
} pc_log_limit_t;

/* Caller-provided memory: init before use (lines >= 1, window_ms >= 1), close after. */
void pc_log_limit_init(pc_log_limit_t *l, uint32_t lines, uint32_t window_ms);
void pc_log_limit_close(pc_log_limit_t *l);

/* Whether one more line may be written at now_ms (a monotonic clock). When it may, *suppressed
 * gets the number of lines refused since the last one let through (and that count restarts);
 * otherwise the refusal is counted. */
bool pc_log_limit_take(pc_log_limit_t *l, uint64_t now_ms, uint64_t *suppressed);

/* Monotonic milliseconds, the clock PC_LOG_LIMITED passes to pc_log_limit_take. */
uint64_t pc_log_now_ms(void);

#define PC_LOG(level, ...)                                         \
    do {                                                           \
        if (pc_log_enabled(level))                                 \
            pc__log_write(level, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* PC_LOG through the rate limit `lim` (a pc_log_limit_t *): a line over the limit is counted,
 * not formatted; the next line let through ends in " [N more suppressed]". */
#define PC_LOG_LIMITED(lim, level, ...)                                                   \
    do {                                                                                  \
        uint64_t pc_sup_;                                                                 \
        if (pc_log_enabled(level) && pc_log_limit_take((lim), pc_log_now_ms(), &pc_sup_)) \
            pc__log_write_limited(level, __FILE__, __LINE__, pc_sup_, __VA_ARGS__);       \
    } while (0)

#define PC_ERROR(...) PC_LOG(PC_LOG_ERROR, __VA_ARGS__)
#define PC_WARN(...)  PC_LOG(PC_LOG_WARN, __VA_ARGS__)
#define PC_INFO(...)  PC_LOG(PC_LOG_INFO, __VA_ARGS__)
#define PC_DEBUG(...) PC_LOG(PC_LOG_DEBUG, __VA_ARGS__)
#define PC_TRACE(...) PC_LOG(PC_LOG_TRACE, __VA_ARGS__)

#endif
