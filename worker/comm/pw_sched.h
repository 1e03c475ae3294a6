/* pw_sched.h: the worker's communication scheduler: one queue for everything a worker sends, in
 * priority order under a credit (bytes in flight) limit, as in P3 and ByteScheduler.
 *
 * Two lanes share the credits. The server lane starts asynchronous libpsclient calls (pulls,
 * pushes) from the scheduler's dispatch thread; any number may be in flight. The ordered lane
 * runs one job at a time, in submission order, on its own thread: the dense allreduce chunks (a
 * collective must be entered in the same order by every worker, so priority never reorders this
 * lane) and the per-step markers that wait for a step's pushes.
 *
 * Dispatch: among the queued jobs that are ready (no `after`, or `after` done) - every ready
 * server-lane job and the head of the ordered lane while that lane is idle - the best one starts
 * when its bytes fit the credits left, or when nothing is in flight (so a job larger than the
 * limit still runs). Best: the lowest `prio`, then the earliest submitted; with `fifo` set only
 * the earliest submitted (the baseline the priority order is measured against). When the best
 * job does not fit, nothing else starts: bulk work never holds credits an urgent job is waiting
 * for longer than it takes to finish what is already in flight.
 *
 * A job whose `after` failed fails with the same code without running. A store whose calls end
 * before they return (local training's table) runs them on the dispatch thread, one at a time,
 * beside the caller's compute.
 *
 * Thread rules: submit, wait, cancel and drain from the owner thread; pw_sched_complete from any
 * thread (libpsclient's I/O thread). A job's memory (and the buffers its run function uses) stays
 * valid and untouched by the caller from submit until pw_sched_wait returned for it (or drain).
 */
#ifndef PW_SCHED_H
#define PW_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pw_sched pw_sched_t;
typedef struct pw_job pw_job_t;

typedef enum { PW_JOB_PULL, PW_JOB_DENSE, PW_JOB_PUSH, PW_JOB_MARK, PW_JOB_NCLASS } pw_job_class_t;

struct pw_job {
    /* set by the caller before pw_sched_submit */
    pw_job_class_t cls; /* statistics */
    bool ordered;       /* the ordered lane (else the server lane) */
    int prio;           /* lower first */
    size_t bytes;       /* what it puts on the wire: the credits it holds while running */
    pw_job_t *after;    /* start only once this job is done (NULL, or never submitted: none) */
    /* Server lane: start an asynchronous call and return 0, its end reported through
     * pw_sched_complete(j, rc); or return an error (the job ends with it). Ordered lane: do the
     * work and return its result. */
    int (*run)(pw_job_t *j);
    void *ctx;
    /* the scheduler's */
    pw_sched_t *sched;
    int state, rc;
    uint64_t seq;
    pw_job_t *next;
};

typedef struct pw_sched_opts {
    size_t credit_bytes; /* bytes in flight at most (0: 4 MiB) */
    bool fifo;           /* ignore priorities: submission order */
} pw_sched_opts_t;

typedef struct pw_sched_stats {
    uint64_t jobs[PW_JOB_NCLASS], bytes[PW_JOB_NCLASS]; /* started, by class */
    uint64_t queued[PW_JOB_NCLASS];        /* now: submitted, not started yet, by class */
    uint64_t inflight_bytes, credit_bytes; /* now: credits held by running jobs; the limit */
} pw_sched_stats_t;

int pw_sched_create(const pw_sched_opts_t *o, pw_sched_t **out);
/* Waits for running jobs, fails queued ones with PC_ECANCELED, stops the threads. NULL: no-op. */
void pw_sched_destroy(pw_sched_t *s);

/* Queue j (its caller fields set). */
void pw_sched_submit(pw_sched_t *s, pw_job_t *j);
/* A server-lane job's asynchronous call ended. */
void pw_sched_complete(pw_job_t *j, int rc);
/* Wait until j is done and return its result; a job never submitted (state 0) returns 0. */
int pw_sched_wait(pw_sched_t *s, pw_job_t *j);
bool pw_sched_done(const pw_sched_t *s, const pw_job_t *j);
/* j may be submitted again (it must be done or never submitted). */
void pw_sched_reset(pw_job_t *j);

/* Fail every queued ordered-lane job with rc (the group broke: its collectives cannot run);
 * jobs that depend on them fail in turn. Then wait until nothing is queued or running. */
void pw_sched_abort_ordered(pw_sched_t *s, int rc);
/* Wait until nothing is queued or running. */
void pw_sched_drain(pw_sched_t *s);

void pw_sched_stats(pw_sched_t *s, pw_sched_stats_t *out);

#endif
