/* pw_publish.h: the dense publisher: the trainer's dense model, published for serving replicas
 * every so many steps or seconds while it trains.
 *
 * A serving replica (ps-serve) follows the servers' tables through the delta stream and needs
 * the dense model that goes with those rows. The group's rank 0 (or a lone worker, --local too)
 * offers its model after each step (pw_publish_step); when one is due (`every` steps or
 * `every_s` seconds since the last, whichever first) the publisher takes a snapshot of the
 * weights there (pw_dense_image: a copy, microseconds) and a thread of its own writes
 *
 *   DIR/dense-<S>/        S: the step, 20 digits
 *     model               the dense model file (pw_model_io.h: pw_model_save's bytes)
 *     card                the model card (pw_model_card.h)
 *     watermark           "emberps-watermark 1\n" "table NAME\n", then per training server in
 *                         cluster-map order "server I UID HEAD\n": the table's uid there and its
 *                         change log's head (pw_emb.h's watermark; 0: no log yet); no server
 *                         lines for an in-process table (--local)
 *
 * built in DIR/dense-<S>.tmp/ (each file fsynced) and renamed into place, DIR fsynced. The
 * replica pairs the model with a sparse state at least as new as the watermark: with every
 * server followed up to its HEAD, its rows include every push of steps before S.
 *
 * DESIGN
 * - Why the watermark holds: the trainer offers step S's model only after round S - 1 was
 *   applied; in sync and ssp modes that round's marker waited until every worker's pushes of
 *   the step were acknowledged, and a server logs a change before it answers, so heads read
 *   afterwards cover them (the thread reads them later still: a watermark can only be newer than
 *   needed, never older). In async mode the marker does not wait for pushes: the watermark
 *   covers the pushes acknowledged when it is read, and pushes of the last async_window steps may
 *   still be in flight (their rows reach the replica later, as in async training itself).
 * - Training never waits for the disk or the servers: one snapshot is pending at most; a newer
 *   due snapshot replaces a pending one the thread has not started (counted in `skipped`). The
 *   only work on the training thread is the copy of the weights.
 * - Retention: after each publish the `keep` newest versions up to S stay; versions after S (a
 *   job rolled back, or restarted from an older step) and older ones go, so the newest directory
 *   is always this run's; a step below the last offered (a rollback) is published at once; a
 *   job rollback removes the versions after its step before the servers restore
 *   (pw_publish_abandon). A
 *   replica that loads a version should open its files promptly (keep >= 2 gives it a publish
 *   interval); leftovers of a crash (*.tmp) go at open. A step published again (after a
 *   rollback) replaces the old directory (removed, then renamed).
 * - Failures (a full disk, a server down while reading the heads) are logged (the first of a
 *   series, then every 100th) and counted; training goes on.
 *
 * Thread rule: open, step and close from one thread (the trainer's); the publisher's thread
 * calls the store's watermark op only (thread-safe by pw_emb.h's contract).
 */
#ifndef PW_PUBLISH_H
#define PW_PUBLISH_H

#include <stdbool.h>
#include <stdint.h>

#include "pw_emb.h"
#include "pw_model.h"
#include "pw_model_card.h"

typedef struct pw_publish pw_publish_t;

typedef struct pw_publish_opts {
    const char *dir;             /* where versions go (created); copied */
    int64_t every;               /* steps between publishes (0: by time only) */
    double every_s;              /* seconds between publishes (0: by steps only) */
    int keep;                    /* versions kept, >= 1 */
    const pw_model_card_t *card; /* copied */
    pw_emb_t *emb;               /* borrowed, outlives the publisher: its watermark op (may be
                                  * NULL, as may the op: no server lines) */
} pw_publish_opts_t;

typedef struct pw_publish_stats {
    uint64_t published; /* versions written */
    uint64_t failed;    /* versions that could not be written (logged) */
    uint64_t skipped;   /* snapshots replaced by a newer one before they were written */
    uint64_t last_step; /* the newest version written (0: none) */
} pw_publish_stats_t;

/* Create DIR, remove its leftover dense-*.tmp, start the thread. PC_EINVAL (no dir, keep < 1,
 * neither every nor every_s), PC_EIO / PC_ENOSPC (the directory), PC_ENOMEM, PC_ESYS. */
int pw_publish_open(const pw_publish_opts_t *o, pw_publish_t **out);

/* After step `step` (m's weights are that step's): when a version is due (`every` steps or
 * `every_s` seconds after the last offered; a step below the last offered, the job rolled back;
 * or `force`) and step was not offered already, snapshot m's weights for the thread. 0, or
 * PC_ENOMEM (this one is not published; logged). */
int pw_publish_step(pw_publish_t *p, const pw_model_t *m, uint64_t step, bool force);

/* Whether pw_publish_step(p, m, step, force) would take a snapshot now (a caller that must
 * make the step's pushes acknowledged first asks). */
bool pw_publish_due(const pw_publish_t *p, uint64_t step, bool force);

/* Before a job rollback to step `step` (the servers are about to restore a checkpoint of it),
 * and when a job resumes from one (--resume=checkpoint: the servers restored it): the versions
 * after it go now, a snapshot of a later step not yet written is dropped and one being written
 * waits for the write, then goes too. A replica then never pairs an abandoned model with the
 * restored rows (their tables' new uids would pass for newer ones). The next pw_publish_step
 * publishes at once (the rollback's own step). */
void pw_publish_abandon(pw_publish_t *p, uint64_t step);

/* Wait until the thread wrote everything offered (tests, the end of a run). */
void pw_publish_flush(pw_publish_t *p);

void pw_publish_stats(pw_publish_t *p, pw_publish_stats_t *out);

/* Write what is pending, stop the thread, free. NULL: nothing. */
void pw_publish_close(pw_publish_t *p);

/* Stop without writing what is pending (a write under way ends first), free: a worker that is no
 * longer its group's rank 0 (a regroup) must not write, nor prune the versions after its step,
 * once the new rank 0 publishes. NULL: nothing. */
void pw_publish_discard(pw_publish_t *p);

#endif
