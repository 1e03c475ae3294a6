/* pc_time.h: monotonic and wall clocks in nanoseconds.
 *
 * Durations, deadlines and rates use pc_time_mono_ns() (never jumps); timestamps that leave the
 * process (logs, checkpoint manifests) use pc_time_wall_ns(). Thread-safe.
 */
#ifndef PC_TIME_H
#define PC_TIME_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t pc_time_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t pc_time_wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline double pc_time_sec_since(uint64_t mono_start_ns) {
    return (double)(pc_time_mono_ns() - mono_start_ns) * 1e-9;
}

/* pc_time_mono_ns() time `at` as a timespec: a deadline for a condition variable made by
 * pc_cond_init_mono. */
static inline struct timespec pc_time_mono_ts(uint64_t at) {
    return (struct timespec){(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
}

/* A condition variable whose timed waits count in CLOCK_MONOTONIC (pc_time_mono_ts). */
static inline int pc_cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    const int rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

/* Sleep us microseconds (a signal may end it early). */
static inline void pc_time_sleep_us(uint64_t us) {
    const struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

/* Sleep ms milliseconds (a signal may end it early). */
static inline void pc_time_sleep_ms(int ms) {
    pc_time_sleep_us((uint64_t)ms * 1000);
}

#endif
