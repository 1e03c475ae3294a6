/* pw_telemetry.c: the trainer's snapshot, its Prometheus text and the metrics log (see
 * pw_telemetry.h for the contract).
 *
 * DESIGN: `cur` is the snapshot the training thread writes under `mu` and the HTTP thread reads
 * under it; everything else (the rate window, the log) is the training thread's alone. The
 * render copies the snapshot out first and formats without the lock, so a slow scrape never
 * holds up a step.
 */
#include "pw_telemetry.h"

#include "pc_error.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_metrics.h"
#include "pc_time.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- types ---- */

typedef struct snap {
    pw_telemetry_step_t s;
    double samples_per_s;
    double auc, logloss; /* NaN before the first evaluation */
    uint64_t test_samples, evals;
} snap_t;

struct pw_telemetry {
    pthread_mutex_t mu;
    snap_t cur; /* under mu */
    pc_hist_t pull_wait;
    char model[32];
    int rank;
    uint64_t t0;                  /* start (monotonic) */
    uint64_t win_ns;              /* the rate window's start (monotonic) */
    uint64_t win_samples;         /* samples at its start */
    uint64_t seen;                /* the step's samples count last published */
    uint64_t trained;             /* under mu: samples trained on, never down (a rollback's
                                   * are not taken back: they were trained) */
    pc_metrics_t *http;           /* NULL: no endpoint */
    FILE *log;                    /* NULL: no log */
    uint64_t row_ns, row_samples; /* the previous row's time (monotonic) and samples */
    bool log_failed;              /* a write failed (logged once; no more rows) */
    char log_path[512];           /* for the failure's message */
};

/* ---- Prometheus text ---- */

/* "name value" with a HELP and TYPE line. */
static size_t metric(char *buf, size_t cap, size_t len, const char *name, const char *type,
                     const char *help, double v) {
    len = pc_prom_appendf(buf, cap, len, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    if (isnan(v))
        return pc_prom_appendf(buf, cap, len, "%s NaN\n", name);
    return pc_prom_appendf(buf, cap, len, "%s %.17g\n", name, v);
}

static size_t render(void *ctx, char *buf, size_t cap) {
    pw_telemetry_t *tm = ctx;
    pthread_mutex_lock(&tm->mu);
    const snap_t n = tm->cur;
    const uint64_t trained = tm->trained;
    pthread_mutex_unlock(&tm->mu);
    const pw_telemetry_step_t *s = &n.s;
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    len = pc_prom_appendf(buf, cap, len,
                          "# HELP emberps_worker_info the worker's model and rank\n"
                          "# TYPE emberps_worker_info gauge\n"
                          "emberps_worker_info{model=\"%s\",rank=\"%d\"} 1\n",
                          tm->model, tm->rank);
    len = metric(buf, cap, len, "emberps_worker_uptime_seconds", "gauge",
                 "seconds since training started", pc_time_sec_since(tm->t0));
    len = metric(buf, cap, len, "emberps_worker_step", "gauge",
                 "optimizer steps taken (distributed: the group's count)", (double)s->step);
    len = metric(buf, cap, len, "emberps_worker_epoch", "gauge",
                 "the pass over the training data being read, from 1", (double)s->epoch);
    len = metric(buf, cap, len, "emberps_worker_samples_total", "counter",
                 "samples trained on by this worker (a job rollback takes none back)",
                 (double)trained);
    len = metric(buf, cap, len, "emberps_worker_samples_per_second", "gauge",
                 "training speed over the last second or more", n.samples_per_s);
    len = metric(buf, cap, len, "emberps_worker_loss", "gauge", "the latest batch's loss", s->loss);
    len = metric(buf, cap, len, "emberps_worker_loss_ewma", "gauge",
                 "moving average of the batch losses (weight 0.99)", s->loss_ewma);
    len = metric(buf, cap, len, "emberps_worker_eval_auc", "gauge",
                 "AUC of the latest evaluation (NaN before one)", n.auc);
    len = metric(buf, cap, len, "emberps_worker_eval_logloss", "gauge",
                 "logloss of the latest evaluation (NaN before one)", n.logloss);
    len = metric(buf, cap, len, "emberps_worker_evals_total", "counter", "evaluations run",
                 (double)n.evals);
    len = pc_prom_appendf(buf, cap, len,
                          "# HELP emberps_worker_pull_wait_seconds waits of the training thread "
                          "for pulled rows\n# TYPE emberps_worker_pull_wait_seconds histogram\n");
    len = pc_hist_render(&tm->pull_wait, "emberps_worker_pull_wait_seconds", "", buf, cap, len);
    static const char *const k_class[4] = {"pull", "dense", "push", "mark"};
    len = pc_prom_appendf(buf, cap, len,
                          "# HELP emberps_worker_sched_queued_jobs scheduler jobs waiting to "
                          "start, by class (push: the push queue)\n"
                          "# TYPE emberps_worker_sched_queued_jobs gauge\n");
    for (int i = 0; i < 4; i++)
        len =
            pc_prom_appendf(buf, cap, len, "emberps_worker_sched_queued_jobs{class=\"%s\"} %llu\n",
                            k_class[i], (unsigned long long)s->queued[i]);
    len = metric(buf, cap, len, "emberps_worker_sched_inflight_bytes", "gauge",
                 "scheduler credits in use: bytes of the pulls, pushes and allreduce chunks on the "
                 "wire",
                 (double)s->inflight_bytes);
    len = metric(buf, cap, len, "emberps_worker_sched_credit_bytes", "gauge",
                 "the scheduler's credit limit (bytes in flight at most)", (double)s->credit_bytes);
    len = metric(buf, cap, len, "emberps_worker_pulled_bytes_total", "counter",
                 "bytes of pull requests started", (double)s->pulled_bytes);
    len = metric(buf, cap, len, "emberps_worker_pushed_bytes_total", "counter",
                 "bytes of pushes started", (double)s->pushed_bytes);
    len = metric(buf, cap, len, "emberps_worker_group_generation", "gauge",
                 "the membership generation (0 without a group)", (double)s->generation);
    len = metric(buf, cap, len, "emberps_worker_group_size", "gauge",
                 "workers in the current generation", (double)s->group_size);
    len = metric(buf, cap, len, "emberps_worker_rollbacks_total", "counter",
                 "job rollbacks taken part in", (double)s->rollbacks);
    len = metric(buf, cap, len, "emberps_worker_server_reconnects_total", "counter",
                 "connections to servers made again after a loss", (double)s->reconnects);
    len = metric(buf, cap, len, "emberps_worker_lost_pushes_total", "counter",
                 "pushes a server failure cut short", (double)s->lost_pushes);
    len = metric(buf, cap, len, "emberps_worker_unclean_slots_total", "counter",
                 "slots the servers promoted to a backup that had not caught up (rows may have "
                 "gone back)",
                 (double)s->unclean_slots);
    return len;
}

/* ---- the log ---- */

/* A JSON number, or null for NaN and infinities (JSON has neither). */
static int json_num(char *buf, size_t cap, double v) {
    return isfinite(v) ? snprintf(buf, cap, "%.9g", v) : snprintf(buf, cap, "null");
}

static void log_row(pw_telemetry_t *tm, const char *kind, const snap_t *n) {
    if (!tm->log || tm->log_failed)
        return;
    /* the speed since the previous row (evaluations included: what the curve's x axis costs) */
    const uint64_t now = pc_time_mono_ns();
    char loss[32], ewma[32], rate[32], line[512];
    json_num(loss, sizeof loss, n->s.loss);
    json_num(ewma, sizeof ewma, n->s.loss_ewma);
    json_num(rate, sizeof rate,
             now > tm->row_ns
                 ? (double)(n->s.samples - tm->row_samples) / ((double)(now - tm->row_ns) * 1e-9)
                 : NAN);
    tm->row_ns = now;
    tm->row_samples = n->s.samples;
    int len = snprintf(line, sizeof line,
                       "{\"kind\":\"%s\",\"time\":%.3f,\"unix_time\":%.3f,\"step\":%llu,"
                       "\"epoch\":%llu,\"samples\":%llu,\"samples_per_s\":%s,\"loss\":%s,"
                       "\"loss_ewma\":%s",
                       kind, pc_time_sec_since(tm->t0), (double)pc_time_wall_ns() * 1e-9,
                       (unsigned long long)n->s.step, (unsigned long long)n->s.epoch,
                       (unsigned long long)n->s.samples, rate, loss, ewma);
    if (strcmp(kind, "eval") == 0 && len > 0 && (size_t)len < sizeof line) {
        char auc[32], ll[32];
        json_num(auc, sizeof auc, n->auc);
        json_num(ll, sizeof ll, n->logloss);
        len += snprintf(line + len, sizeof line - (size_t)len,
                        ",\"auc\":%s,\"logloss\":%s,\"test_samples\":%llu", auc, ll,
                        (unsigned long long)n->test_samples);
    }
    if (len > 0 && (size_t)len + 2 < sizeof line)
        len += snprintf(line + len, sizeof line - (size_t)len, "}\n");
    if (len <= 0 || (size_t)len >= sizeof line ||
        fwrite(line, 1, (size_t)len, tm->log) != (size_t)len || fflush(tm->log)) {
        PC_ERROR("train: cannot write the metrics log %s: %s", tm->log_path, strerror(errno));
        tm->log_failed = true;
    }
}

/* ---- API ---- */

int pw_telemetry_open(const pw_telemetry_opts_t *o, pw_telemetry_t **out) {
    if (!o || !out)
        return PC_EINVAL;
    pw_telemetry_t *tm = calloc(1, sizeof *tm);
    if (!tm)
        return PC_ENOMEM;
    pthread_mutex_init(&tm->mu, NULL);
    snprintf(tm->model, sizeof tm->model, "%s", o->model ? o->model : "");
    tm->rank = o->rank;
    tm->t0 = tm->win_ns = tm->row_ns = pc_time_mono_ns();
    tm->cur.auc = tm->cur.logloss = NAN;
    tm->cur.s.loss = tm->cur.s.loss_ewma = NAN;
    tm->cur.s.group_size = 1;
    int rc = 0;
    if (o->log_path && o->log_path[0]) {
        snprintf(tm->log_path, sizeof tm->log_path, "%s", o->log_path);
        tm->log = fopen(o->log_path, "a");
        if (!tm->log) {
            PC_ERROR("train: cannot open the metrics log %s: %s", o->log_path, strerror(errno));
            rc = PC_EIO;
        }
    }
    if (!rc && o->port >= 0)
        rc = pc_metrics_start(o->host ? o->host : "127.0.0.1", o->port,
                              o->max_conns ? o->max_conns : 16, render, tm, &tm->http);
    if (rc) {
        pw_telemetry_close(tm);
        return rc;
    }
    *out = tm;
    return 0;
}

void pw_telemetry_close(pw_telemetry_t *tm) {
    if (!tm)
        return;
    pc_metrics_stop(tm->http); /* joins the HTTP thread: no render after this */
    if (tm->log)
        fclose(tm->log);
    pthread_mutex_destroy(&tm->mu);
    free(tm);
}

int pw_telemetry_port(const pw_telemetry_t *tm) {
    return tm && tm->http ? pc_metrics_port(tm->http) : -1;
}

void pw_telemetry_publish(pw_telemetry_t *tm, const pw_telemetry_step_t *s) {
    const uint64_t now = pc_time_mono_ns();
    double rate = NAN;
    const bool back = s->samples < tm->seen; /* a job rollback: what the model holds went back */
    const uint64_t more = back ? 0 : s->samples - tm->seen;
    tm->seen = s->samples;
    if (back) { /* the windows start again there (a difference would wrap around) */
        tm->win_ns = now;
        tm->win_samples = s->samples;
        tm->row_samples = s->samples < tm->row_samples ? s->samples : tm->row_samples;
    } else if (now - tm->win_ns >= 1000000000ull) { /* a new window */
        rate = (double)(s->samples - tm->win_samples) / ((double)(now - tm->win_ns) * 1e-9);
        tm->win_ns = now;
        tm->win_samples = s->samples;
    } else if (tm->win_ns == tm->t0 && now > tm->t0) { /* the first second: since the start */
        rate = (double)s->samples / ((double)(now - tm->t0) * 1e-9);
    }
    pthread_mutex_lock(&tm->mu);
    tm->cur.s = *s;
    tm->trained += more;
    if (!isnan(rate))
        tm->cur.samples_per_s = rate;
    pthread_mutex_unlock(&tm->mu);
}

void pw_telemetry_pull_wait(pw_telemetry_t *tm, uint64_t ns) {
    pc_hist_add(&tm->pull_wait, ns);
}

void pw_telemetry_eval(pw_telemetry_t *tm, double auc, double logloss, uint64_t test_samples) {
    pthread_mutex_lock(&tm->mu);
    tm->cur.auc = auc;
    tm->cur.logloss = logloss;
    tm->cur.test_samples = test_samples;
    tm->cur.evals++;
    const snap_t n = tm->cur;
    pthread_mutex_unlock(&tm->mu);
    log_row(tm, "eval", &n);
}

void pw_telemetry_log_progress(pw_telemetry_t *tm) {
    pthread_mutex_lock(&tm->mu);
    const snap_t n = tm->cur;
    pthread_mutex_unlock(&tm->mu);
    log_row(tm, "progress", &n);
}
