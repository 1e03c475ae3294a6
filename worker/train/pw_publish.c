/* pw_publish.c: see pw_publish.h. The training thread decides and snapshots (pw_publish_step);
 * the publisher's thread writes versions, reads the watermark and prunes.
 *
 * DESIGN
 * - One mutex guards `pending` (the snapshot not yet taken by the thread), `busy`, `stop` and
 *   the stats; the thread writes files without it. Everything else is the training thread's.
 */
#include "pw_publish.h"

#include "pc_alloc.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_model_io.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MARKS_MAX PC_MAX_SERVERS /* servers of a map */

typedef struct snap {
    uint8_t *img; /* the dense model file (NULL: none) */
    size_t size;
    uint64_t step;
} snap_t;

struct pw_publish {
    char dir[4096];
    int64_t every;
    double every_s;
    int keep;
    pw_model_card_t card;
    pw_emb_t *emb;
    /* the training thread's */
    uint64_t last_step; /* the last step offered */
    uint64_t last_ns;   /* when */
    bool offered;
    bool due; /* abandoned to a step (pw_publish_abandon): the next step goes at once */
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    snap_t pending;
    bool busy, stop;
    pw_publish_stats_t st;
    uint64_t fail_streak;
    pthread_t thread;
    pw_emb_mark_t marks[MARKS_MAX]; /* the thread's */
};

/* ---- versions on disk ---- */

/* The watermark text of the store's marks now into buf (cap bytes). */
static int watermark_text(pw_publish_t *p, char *buf, size_t cap, size_t *len, char *why,
                          size_t whycap) {
    size_t n = 0;
    int rc = 0;
    if (p->emb && p->emb->ops->watermark)
        rc = p->emb->ops->watermark(p->emb, p->marks, MARKS_MAX, &n, why, whycap);
    if (rc)
        return rc;
    size_t l = (size_t)snprintf(buf, cap, "emberps-watermark 1\ntable %s\n", p->card.table_name);
    for (size_t i = 0; i < n && l < cap; i++)
        l += (size_t)snprintf(buf + l, cap - l, "server %zu %" PRIu64 " %" PRIu64 "\n", i,
                              p->marks[i].uid, p->marks[i].head);
    if (l >= cap)
        return PC_ETOOBIG;
    *len = l;
    return 0;
}

/* Write version s: DIR/dense-<S>.tmp/{model,card,watermark}, renamed to dense-<S>, DIR fsynced;
 * then prune. why gets the failing part. */
static int version_write(pw_publish_t *p, const snap_t *s, char *why, size_t whycap) {
    char tmp[4200], fin[4200], path[4300];
    snprintf(tmp, sizeof tmp, "%s/dense-%020" PRIu64 ".tmp", p->dir, s->step);
    snprintf(fin, sizeof fin, "%s/dense-%020" PRIu64, p->dir, s->step);
    pc_fs_rm_tree(tmp);
    int rc = pc_fs_mkdirs(tmp);
    const char *what = "its directory";
    if (!rc) {
        what = "model";
        snprintf(path, sizeof path, "%s/model", tmp);
        rc = pc_fs_write_atomic(path, s->img, s->size);
    }
    if (!rc) {
        what = "card";
        snprintf(path, sizeof path, "%s/card", tmp);
        rc = pw_model_card_write(path, &p->card);
    }
    char wm[MARKS_MAX * 64 + 128];
    size_t wlen = 0;
    if (!rc) {
        what = "watermark";
        char detail[512] = "";
        rc = watermark_text(p, wm, sizeof wm, &wlen, detail, sizeof detail);
        if (rc && detail[0])
            snprintf(why, whycap, "the servers' marks: %s", detail);
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/watermark", tmp);
        rc = pc_fs_write_atomic(path, wm, wlen);
    }
    if (!rc) {
        what = "the rename";
        rc = pc_fs_replace_dir(tmp, fin, p->dir); /* the same step again: a rollback */
    }
    if (rc) {
        if (!why[0])
            snprintf(why, whycap, "%s: %s", what, pc_strerror(rc));
        pc_fs_rm_tree(tmp);
        return rc;
    }
    pc_fs_prune_numbered(p->dir, "dense-", s->step, (size_t)p->keep); /* and later ones */
    return 0;
}

static void *thread_main(void *arg) {
    pw_publish_t *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->pending.img && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->pending.img) /* stop, nothing left */
            break;
        snap_t s = p->pending;
        p->pending = (snap_t){0};
        p->busy = true;
        pthread_mutex_unlock(&p->mu);
        char why[768] = "";
        const uint64_t t0 = pc_time_mono_ns();
        const int rc = version_write(p, &s, why, sizeof why);
        free(s.img);
        pthread_mutex_lock(&p->mu);
        p->busy = false;
        if (rc) {
            p->st.failed++;
            if (p->fail_streak++ % 100 == 0)
                PC_WARN("publish: the dense model of step %" PRIu64 " was not published to %s: %s "
                        "(%" PRIu64 " failed so far; training goes on)",
                        s.step, p->dir, why, p->st.failed);
        } else {
            p->st.published++;
            p->st.last_step = s.step;
            p->fail_streak = 0;
            PC_DEBUG("publish: step %" PRIu64 " in %s (%.1f ms)", s.step, p->dir,
                     pc_time_sec_since(t0) * 1e3);
        }
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- API ---- */

int pw_publish_open(const pw_publish_opts_t *o, pw_publish_t **out) {
    if (!o || !o->dir || !o->dir[0] || strlen(o->dir) >= 4000 || o->keep < 1 || !o->card ||
        o->every < 0 || o->every_s < 0 || (!o->every && !(o->every_s > 0)))
        return PC_EINVAL;
    pw_publish_t *p = pc_scalloc(PC_MEM_OTHER, 1, sizeof *p);
    if (!p)
        return PC_ENOMEM;
    snprintf(p->dir, sizeof p->dir, "%s", o->dir);
    p->every = o->every;
    p->every_s = o->every_s;
    p->keep = o->keep;
    p->card = *o->card;
    p->emb = o->emb;
    p->last_ns = pc_time_mono_ns();
    int rc = pc_fs_mkdirs(p->dir);
    if (rc) {
        PC_ERROR("publish: cannot create %s: %s", p->dir, pc_strerror(rc));
        pc_sfree(p);
        return rc;
    }
    pc_fs_remove_tmp_numbered(p->dir, "dense-"); /* a crash's leftovers */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, thread_main, p)) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        pc_sfree(p);
        return PC_ESYS;
    }
    *out = p;
    return 0;
}

bool pw_publish_due(const pw_publish_t *p, uint64_t step, bool force) {
    if (p->offered && step == p->last_step) /* offered already */
        return false;
    const uint64_t now = pc_time_mono_ns();
    /* a step below the last offered: the job rolled back; publish at once (the versions after
     * it are abandoned and go), the schedule starts again there */
    const bool back = p->offered && step < p->last_step;
    const bool by_steps = p->every && step >= p->last_step + (uint64_t)p->every;
    const bool by_time = p->every_s > 0 && (double)(now - p->last_ns) * 1e-9 >= p->every_s;
    return force || back || p->due || by_steps || by_time;
}

int pw_publish_step(pw_publish_t *p, const pw_model_t *m, uint64_t step, bool force) {
    if (!pw_publish_due(p, step, force))
        return 0;
    const uint64_t now = pc_time_mono_ns();
    snap_t s = {.step = step};
    int rc = pw_dense_image(m->params, m->nparams, &s.img, &s.size);
    if (rc) {
        PC_WARN("publish: no snapshot of step %" PRIu64 ": %s", step, pc_strerror(rc));
        return rc;
    }
    p->offered = true;
    p->due = false;
    p->last_step = step;
    p->last_ns = now;
    pthread_mutex_lock(&p->mu);
    if (p->pending.img) { /* not started yet: the newer one goes instead */
        free(p->pending.img);
        p->st.skipped++;
    }
    p->pending = s;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void pw_publish_abandon(pw_publish_t *p, uint64_t step) {
    pthread_mutex_lock(&p->mu);
    if (p->pending.img && p->pending.step > step) {
        free(p->pending.img);
        p->pending = (snap_t){0};
    }
    while (p->busy) /* (the thread takes nothing new while mu is held) */
        pthread_cond_wait(&p->cv, &p->mu);
    pc_fs_prune_numbered(p->dir, "dense-", step, (size_t)p->keep);
    pthread_mutex_unlock(&p->mu);
    p->due = true;
}

void pw_publish_flush(pw_publish_t *p) {
    pthread_mutex_lock(&p->mu);
    while (p->pending.img || p->busy)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void pw_publish_stats(pw_publish_t *p, pw_publish_stats_t *out) {
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

void pw_publish_discard(pw_publish_t *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    free(p->pending.img); /* not started: not written */
    p->pending = (snap_t){0};
    pthread_mutex_unlock(&p->mu);
    pw_publish_close(p);
}

void pw_publish_close(pw_publish_t *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    free(p->pending.img); /* none: the thread writes what is pending before it stops */
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pc_sfree(p);
}
