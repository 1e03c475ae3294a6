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
 *
 * Thread rule: PC_LOG and friends are thread-safe; pc_log_init() is for main() only.
 */
#ifndef PC_LOG_H
#define PC_LOG_H

#include <stdbool.h>
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

#define PC_LOG(level, ...)                                         \
    do {                                                           \
        if (pc_log_enabled(level))                                 \
            pc__log_write(level, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define PC_ERROR(...) PC_LOG(PC_LOG_ERROR, __VA_ARGS__)
#define PC_WARN(...)  PC_LOG(PC_LOG_WARN, __VA_ARGS__)
#define PC_INFO(...)  PC_LOG(PC_LOG_INFO, __VA_ARGS__)
#define PC_DEBUG(...) PC_LOG(PC_LOG_DEBUG, __VA_ARGS__)
#define PC_TRACE(...) PC_LOG(PC_LOG_TRACE, __VA_ARGS__)

#endif
