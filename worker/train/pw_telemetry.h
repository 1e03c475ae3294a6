/* pw_telemetry.h: the trainer's live figures: Prometheus /metrics and the metrics log.
 *
 * The training thread publishes a snapshot after every step (pw_telemetry_publish) and adds each
 * wait for pulled rows to a histogram; an HTTP thread (common/pc_metrics.h, libmicrohttpd)
 * renders the latest snapshot as Prometheus text on GET /metrics when a port is given. The
 * metrics log, when a path is given, gets one JSON object per line: one per progress interval
 * (kind "progress") and one per evaluation (kind "eval", with auc, logloss, test_samples), each
 * with time (seconds since the run started), unix_time, step, epoch, samples, samples_per_s
 * (since the previous row), loss (the latest batch's) and loss_ewma; `psctl plot LOG OUT.svg` draws
 * it. The metric names are listed in docs/training.md (Worker metrics).
 *
 * DESIGN
 * - One snapshot under a mutex: publish copies the trainer's figures in (once a step, never
 *   contended for long), render copies them out, so a scrape sees one step's figures together.
 *   The pull-wait histogram is pc_hist.h's (relaxed atomics, any thread).
 * - samples_per_s is the rate over the last second or more of steps (the whole run before the
 *   first second), so a scrape every few seconds sees the current speed, not the average since
 *   the start.
 * - Log lines are written whole with one fwrite and flushed, so a reader (or psctl plot while
 *   the run goes on) never sees half an object except at the very end of a crash.
 *
 * Thread rule: publish, pull_wait, log_* and close from the training thread; the HTTP thread
 * only renders.
 */
#ifndef PW_TELEMETRY_H
#define PW_TELEMETRY_H

#include <stddef.h>
#include <stdint.h>

typedef struct pw_telemetry pw_telemetry_t;

typedef struct pw_telemetry_opts {
    const char *host;     /* borrowed: the address /metrics listens on (an IPv4 address) */
    int port;             /* -1: no endpoint; 0: any free port (pw_telemetry_port says which) */
    unsigned max_conns;   /* connections the endpoint holds at once (0: 16) */
    const char *log_path; /* borrowed: append JSON lines here (NULL or "": no log) */
    const char *model;    /* borrowed: the model's name (emberps_worker_info) */
    int rank;             /* this worker's rank (emberps_worker_info) */
} pw_telemetry_opts_t;

/* What the trainer publishes after a step (all of it; counters are totals since the start). */
typedef struct pw_telemetry_step {
    uint64_t step, samples, epoch;
    double loss, loss_ewma; /* the latest batch's; the moving average (weight 0.99) */
    uint64_t generation;    /* the membership generation (0 without a group) */
    int group_size;         /* workers in it (1 without a group) */
    uint64_t rollbacks, reconnects, lost_pushes;
    uint64_t unclean_slots; /* promoted to a backup not caught up since the start (pw_train.h) */
    uint64_t queued[4];     /* scheduler jobs queued by class (pw_job_class_t) */
    uint64_t inflight_bytes, credit_bytes; /* scheduler credits held; the limit */
    uint64_t pulled_bytes, pushed_bytes;
} pw_telemetry_step_t;

/* Start the endpoint and open the log as the options say. *out is set even when neither is
 * asked for (publishing then only keeps the snapshot). PC_EINVAL for a bad host, PC_EIO when the
 * port cannot be bound or the log not opened (logged with the reason). */
int pw_telemetry_open(const pw_telemetry_opts_t *o, pw_telemetry_t **out);
/* Stop the endpoint (joins its thread) and close the log. NULL: no-op. */
void pw_telemetry_close(pw_telemetry_t *tm);
/* The endpoint's port, or -1 without one. */
int pw_telemetry_port(const pw_telemetry_t *tm);

void pw_telemetry_publish(pw_telemetry_t *tm, const pw_telemetry_step_t *s);
/* One wait of the training thread for pulled rows. */
void pw_telemetry_pull_wait(pw_telemetry_t *tm, uint64_t ns);
/* An evaluation's result (also on /metrics as emberps_worker_eval_auc, _logloss): an eval row. */
void pw_telemetry_eval(pw_telemetry_t *tm, double auc, double logloss, uint64_t test_samples);
/* Append a progress row with the latest snapshot. A failed write of the log is logged once and
 * ends the log; training goes on (its figures are still on /metrics). */
void pw_telemetry_log_progress(pw_telemetry_t *tm);

#endif
