/* sv_model.h: a served dense model: the trainer's model, rebuilt from a published directory and
 * run forward by several request threads at once.
 *
 * A model directory (a published dense model DIR/dense-<step>/, or a version DIR/step-<S>/ of a
 * job's coordinated checkpoints: docs/serving.md) holds `model` (the dense model file,
 * pw_model_io.h) and `card` (pw_model_card.h: the format, the model's settings, the table). The
 * model is created from the card exactly as the trainer creates it and its weights loaded from
 * the file, so its forward is the trainer's evaluation (pw_step_eval), bit for bit on the same
 * backend.
 *
 * DESIGN
 * - A model (pw_model_t) and its step are used by one thread at a time, so a served model is a
 *   pool of `evaluators`, each a model instance with its step and its row buffer; a request
 *   takes a free one (sv_model_acquire, waiting when all are busy) and gives it back. Every
 *   instance loads the same file: they are equal.
 * - Loading verifies everything before the model is offered: the card parses and names a known
 *   model, the file's checksum and shapes match it (PC_ECORRUPT, PC_EDIM), and a warm-up forward
 *   on a synthetic batch runs on every evaluator (first-touch of the buffers, and a NaN check of
 *   the scores: a model that cannot score is refused, PC_ECORRUPT).
 * - The step of a model (its training step) is the number in its directory's name.
 *
 * Thread rule: sv_model_acquire / sv_model_release and the getters are thread-safe; an
 * evaluator is used by the thread that acquired it until it releases it.
 */
#ifndef SV_MODEL_H
#define SV_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_model_card.h"
#include "pw_reader.h"

typedef struct sv_model sv_model_t;
typedef struct sv_eval sv_eval_t;

typedef struct sv_model_opts {
    const char *dir;  /* the model directory (model + card) */
    uint64_t step;    /* its training step (the version's name) */
    int evaluators;   /* instances, >= 1 (one per request thread) */
    int max_batch;    /* samples per forward, at most */
    pw_backend_t *be; /* borrowed: the device (NULL: the CPU) */
    /* borrowed, with a device that is not host memory: every use of `be` by any model sharing
     * it (loads and frees, an instance at a time, and scores) is under this lock and binds the
     * backend to the calling thread first (a GPU backend is used by one thread at a time); NULL:
     * none (the CPU) */
    pthread_mutex_t *device_mu;
} sv_model_opts_t;

/* Load and verify o->dir (see DESIGN). why gets one line on failure. PC_ENOTFOUND (no model or
 * card), PC_ECORRUPT, PC_EDIM, PC_EPARSE (the card), PC_EINVAL, PC_ENOMEM. */
int sv_model_load(const sv_model_opts_t *o, sv_model_t **out, char *why, size_t cap);
/* Another reference to m (a swap that keeps the model over new rows); returns m. */
sv_model_t *sv_model_ref(sv_model_t *m);
/* Drop a reference; the last frees the model. NULL: nothing; no evaluator may be out then. */
void sv_model_destroy(sv_model_t *m);

const pw_model_card_t *sv_model_card(const sv_model_t *m);
/* The card's CSV column spec, parsed (meaningful for the CSV format only). */
const pw_csv_spec_t *sv_model_csv(const sv_model_t *m);
uint64_t sv_model_step(const sv_model_t *m);
/* The cards describe the same model and stream: format, widths, fields, dim, table. A new
 * model is swapped in only over one with the same shape (else the replica's rows would not fit
 * it). why gets the first difference. */
bool sv_model_card_compatible(const pw_model_card_t *a, const pw_model_card_t *b, char *why,
                              size_t cap);

/* A free evaluator (waits for one). */
sv_eval_t *sv_model_acquire(sv_model_t *m);
void sv_model_release(sv_model_t *m, sv_eval_t *e);

/* The row buffer of an evaluator for nk features (nk x row_dim floats), to fill with each
 * feature's row before sv_eval_run; NULL when out of memory. */
float *sv_eval_rows(sv_eval_t *e, size_t nk);
/* Batch b fits the model: its dense width and its fields (pw_step_check_why). PC_EINVAL with
 * why. Thread-safe (reads only). */
int sv_model_check(const sv_model_t *m, const pw_batch_t *b, char *why, size_t cap);
/* Score batch b (checked): probs[0..b->n) the predicted probabilities. PC_EINVAL (b->n over
 * max_batch), PC_EIO. */
int sv_eval_run(sv_eval_t *e, const pw_batch_t *b, float *probs, char *why, size_t cap);

#endif
