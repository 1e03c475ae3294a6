/* pw_sched.c: see pw_sched.h. */
#include "pw_sched.h"

#include "pc_error.h"

#include <pthread.h>
#include <stdlib.h>

enum { J_IDLE, J_QUEUED, J_RUNNING, J_DONE };

struct pw_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* any change: a job queued, started or done; stop */
    pw_job_t *queue;         /* server lane, in submission order */
    pw_job_t *oq, *oq_tail;  /* ordered lane, in submission order */
    pw_job_t *ocur;          /* handed to the ordered thread */
    bool orunning;           /* the ordered thread runs a job */
    size_t credit, inflight; /* bytes */
    int running;             /* jobs started and not done */
    bool fifo, stop;
    uint64_t seq;
    pw_sched_stats_t st;
    pthread_t dispatch, ordered;
    bool threads;
};

static void finish_locked(pw_sched_t *s, pw_job_t *j, int rc) {
    if (j->state == J_QUEUED)
        s->st.queued[j->cls]--;
    if (j->state == J_RUNNING) {
        s->inflight -= j->bytes;
        s->running--;
    }
    j->state = J_DONE;
    j->rc = rc;
    pthread_cond_broadcast(&s->cv);
}

static void start_stats(pw_sched_t *s, const pw_job_t *j) {
    s->st.jobs[j->cls]++;
    s->st.bytes[j->cls] += j->bytes;
}

static bool before(const pw_sched_t *s, const pw_job_t *a, const pw_job_t *b) {
    if (!b)
        return true;
    if (!s->fifo && a->prio != b->prio)
        return a->prio < b->prio;
    return a->seq < b->seq;
}

/* A dependency never submitted (or reset) counts as done. */
static bool dep_ready(const pw_job_t *j) {
    return !j->after || j->after->state == J_DONE || j->after->state == J_IDLE;
}

static int dep_rc(const pw_job_t *j) {
    return j->after && j->after->state == J_DONE ? j->after->rc : 0;
}

/* Jobs whose dependency failed end with its code; returns the best ready job (or NULL) and its
 * predecessor in the server queue (*prev, NULL for the head or an ordered job). */
static pw_job_t *pick_locked(pw_sched_t *s, pw_job_t **prev) {
    pw_job_t *best = NULL, *p = NULL;
    for (pw_job_t **pp = &s->queue; *pp;) {
        pw_job_t *j = *pp;
        if (dep_rc(j)) {
            *pp = j->next;
            finish_locked(s, j, dep_rc(j));
            continue;
        }
        if (dep_ready(j) && before(s, j, best)) {
            best = j;
            *prev = p;
        }
        p = j;
        pp = &j->next;
    }
    pw_job_t *o = s->oq;
    if (o && !s->ocur && !s->orunning && dep_ready(o)) {
        if (dep_rc(o)) { /* dependency failed: end it, look at the next one */
            s->oq = o->next;
            if (!s->oq)
                s->oq_tail = NULL;
            finish_locked(s, o, dep_rc(o));
            return pick_locked(s, prev);
        }
        if (before(s, o, best)) {
            best = o;
            *prev = NULL;
        }
    }
    if (best && s->inflight && s->inflight + best->bytes > s->credit)
        return NULL; /* waits for credits; nothing behind it overtakes */
    return best;
}

static void *dispatch_main(void *arg) {
    pw_sched_t *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        pw_job_t *prev = NULL, *j = pick_locked(s, &prev);
        if (!j) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        if (j->ordered) {
            s->oq = j->next;
            if (!s->oq)
                s->oq_tail = NULL;
        } else if (prev) {
            prev->next = j->next;
        } else {
            s->queue = j->next;
        }
        j->state = J_RUNNING;
        s->st.queued[j->cls]--;
        s->inflight += j->bytes;
        s->running++;
        start_stats(s, j);
        if (j->ordered) {
            s->ocur = j;
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        int rc = j->run(j);
        pthread_mutex_lock(&s->mu);
        if (rc)
            finish_locked(s, j, rc);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *ordered_main(void *arg) {
    pw_sched_t *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        pw_job_t *j = s->ocur;
        if (!j) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        s->ocur = NULL;
        s->orunning = true;
        pthread_mutex_unlock(&s->mu);
        int rc = j->run(j);
        pthread_mutex_lock(&s->mu);
        s->orunning = false;
        finish_locked(s, j, rc);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int pw_sched_create(const pw_sched_opts_t *o, pw_sched_t **out) {
    pw_sched_t *s = calloc(1, sizeof *s);
    if (!s)
        return PC_ENOMEM;
    s->credit = o && o->credit_bytes ? o->credit_bytes : (size_t)4 << 20;
    s->fifo = o && o->fifo;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->dispatch, NULL, dispatch_main, s)) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return PC_ENOMEM;
    }
    if (pthread_create(&s->ordered, NULL, ordered_main, s)) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->dispatch, NULL);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return PC_ENOMEM;
    }
    s->threads = true;
    *out = s;
    return 0;
}

static void fail_queued_locked(pw_sched_t *s, bool server_lane, int rc) {
    while (s->oq) {
        pw_job_t *j = s->oq;
        s->oq = j->next;
        finish_locked(s, j, rc);
    }
    s->oq_tail = NULL;
    if (s->ocur) { /* handed over, not started: the ordered thread has not taken it */
        finish_locked(s, s->ocur, rc);
        s->ocur = NULL;
    }
    while (server_lane && s->queue) {
        pw_job_t *j = s->queue;
        s->queue = j->next;
        finish_locked(s, j, rc);
    }
}

static void drain_locked(pw_sched_t *s) {
    /* Queued jobs run (their dependencies end sooner or later), running ones end. */
    while (s->queue || s->oq || s->ocur || s->running)
        pthread_cond_wait(&s->cv, &s->mu);
}

void pw_sched_destroy(pw_sched_t *s) {
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    fail_queued_locked(s, true, PC_ECANCELED);
    while (s->running)
        pthread_cond_wait(&s->cv, &s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->dispatch, NULL);
    pthread_join(s->ordered, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void pw_sched_submit(pw_sched_t *s, pw_job_t *j) {
    j->sched = s;
    j->next = NULL;
    j->rc = 0;
    pthread_mutex_lock(&s->mu);
    j->state = J_QUEUED;
    s->st.queued[j->cls]++;
    j->seq = s->seq++;
    if (j->ordered) {
        if (s->oq_tail)
            s->oq_tail->next = j;
        else
            s->oq = j;
        s->oq_tail = j;
    } else {
        pw_job_t **pp = &s->queue;
        while (*pp)
            pp = &(*pp)->next;
        *pp = j;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void pw_sched_complete(pw_job_t *j, int rc) {
    pw_sched_t *s = j->sched;
    pthread_mutex_lock(&s->mu);
    finish_locked(s, j, rc);
    pthread_mutex_unlock(&s->mu);
}

int pw_sched_wait(pw_sched_t *s, pw_job_t *j) {
    pthread_mutex_lock(&s->mu);
    while (j->state != J_DONE && j->state != J_IDLE)
        pthread_cond_wait(&s->cv, &s->mu);
    const int rc = j->rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool pw_sched_done(const pw_sched_t *s, const pw_job_t *j) {
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    const bool d = j->state == J_DONE || j->state == J_IDLE;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
    return d;
}

void pw_sched_reset(pw_job_t *j) {
    j->state = J_IDLE;
    j->rc = 0;
    j->after = NULL;
}

void pw_sched_abort_ordered(pw_sched_t *s, int rc) {
    pthread_mutex_lock(&s->mu);
    fail_queued_locked(s, false, rc);
    pthread_cond_broadcast(&s->cv); /* dependants fail at the next pick */
    drain_locked(s);
    pthread_mutex_unlock(&s->mu);
}

void pw_sched_drain(pw_sched_t *s) {
    pthread_mutex_lock(&s->mu);
    drain_locked(s);
    pthread_mutex_unlock(&s->mu);
}

void pw_sched_stats(pw_sched_t *s, pw_sched_stats_t *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->inflight_bytes = s->inflight;
    out->credit_bytes = s->credit;
    pthread_mutex_unlock(&s->mu);
}
