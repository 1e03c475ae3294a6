/* pw_step.h: one training step of a model on a backend: a batch and its unique rows staged on
 * the device, forward, loss, backward, the rows' gradients back; and the evaluation of a batch.
 *
 * The trainer, `ps-bench gpu` and the tests run exactly this code, so a figure measured on the
 * step is a figure of the worker.
 *
 * DESIGN
 * - Input: a batch as the reader gives it (pw_batch_t, host memory), its unique keys' index per
 *   feature (inv, from pw_unique) and the unique rows pulled for it (urows, nu x row_dim). For
 *   transfers to overlap with compute these host arrays should be the backend's host memory
 *   (host_alloc: pinned on a GPU).
 * - Buffer sets: a step's device inputs live in one of two sets, chosen by the caller (the
 *   trainer uses the round's parity). pw_step_stage uploads into a set asynchronously (the copy
 *   lane), so step t+1's inputs move while step t computes from the other set; a third set is
 *   evaluation's. Device memory grows to the largest batch seen and is kept.
 * - A step is pw_step_compute (queues gather, forward, loss, backward and the per-unique-row
 *   gradient sums, scaled) then pw_step_finish (gradients and loss back on the copy lane, the
 *   dense optimizer stepped meanwhile when asked, then waits). Between the two the caller may
 *   stage the next batch. Gradients of duplicate keys are summed here: the caller pushes one
 *   gradient per unique key.
 * - The step owns the dense optimizer state (one pw_opt_t per parameter tensor: weights, then
 *   biases, per layer); the model stays the caller's.
 * - Backends with host memory (the CPU) compute straight from the host arrays: staging is free.
 * - Errors: PC_ENOMEM for device memory; a failed device is PC_EIO from pw_step_finish /
 *   pw_step_eval with the backend's message logged.
 *
 * Thread rule: a step is used by one thread (the backend's) at a time.
 */
#ifndef PW_STEP_H
#define PW_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_dense_optim.h"
#include "pw_model.h"
#include "pw_reader.h"
#include "pw_unique.h"

typedef struct pw_step pw_step_t;

typedef struct pw_step_config {
    pw_backend_t *be;           /* borrowed: outlives the step */
    pw_model_t *model;          /* borrowed: outlives the step */
    int ndense;                 /* dense values per sample of the batches; 0: a constant 1
                                 * stands in (the model's ndense is then 1) */
    const pw_opt_config_t *opt; /* the dense optimizer (copied) */
} pw_step_config_t;

/* A batch with its unique rows, in host memory (borrowed until the step that staged it was
 * finished). */
typedef struct pw_step_input {
    const pw_batch_t *b;
    const uint32_t *inv; /* nk: feature -> unique row */
    size_t nu;
    const float *urows; /* nu x row_dim */
} pw_step_input_t;

/* PC_EINVAL (ndense does not fit the model), PC_ENOMEM. */
int pw_step_create(const pw_step_config_t *c, pw_step_t **out);
void pw_step_destroy(pw_step_t *st); /* NULL: nothing */

/* The batch fits the model: its dense width, its fields in range. PC_EINVAL (logged). */
int pw_step_check(const pw_step_t *st, const pw_batch_t *b);
/* The same check, saying why in one line instead of logging (a server refusing a request).
 * Reads only: may run beside the step's use by another thread. */
int pw_step_check_why(const pw_step_t *st, const pw_batch_t *b, char *why, size_t cap);

/* Upload in's arrays into buffer set `set` (0 or 1), asynchronously. PC_ENOMEM. */
int pw_step_stage(pw_step_t *st, int set, const pw_step_input_t *in);

/* Queue the step on set `set` (staged): rows gathered per feature (unless the model reads them
 * through inv: pw_model_reads_unique), forward, BCE loss, backward (the model's parameter
 * gradients), and the unique rows' gradients summed and scaled by `scale`, to come back into
 * ugrads (host, nu x row_dim) at pw_step_finish. PC_ENOMEM, PC_EINVAL (a batch over the model's
 * max_batch). */
int pw_step_compute(pw_step_t *st, int set, float scale, float *ugrads);

/* After pw_step_compute on a host-memory backend: whether the step's loss is finite (a diverged
 * model's NaN or Inf, known before its gradients go anywhere). Other backends: true (known at
 * pw_step_finish). */
bool pw_step_loss_finite(const pw_step_t *st);

/* Finish the computed step: gradients and loss to the host, the dense optimizer stepped on the
 * model's gradients first when apply_dense (while they move, whatever the loss: the trainer
 * passes false and steps with pw_step_apply once the loss is known finite), then wait. *loss:
 * the batch's mean loss. PC_EIO when the device failed. */
int pw_step_finish(pw_step_t *st, bool apply_dense, double *loss);

/* One dense optimizer step on the model's current gradients. */
void pw_step_apply(pw_step_t *st);

/* The optimizer state, 2 per parameter layer (weights, biases), *n of them. */
pw_opt_t *pw_step_opts(pw_step_t *st, int *n);

/* Evaluation: host memory for nk rows (a row per feature) to fill before pw_step_eval (valid
 * until the next call of either), NULL when out of memory. */
float *pw_step_eval_rows(pw_step_t *st, size_t nk);
/* Forward on batch b with its rows in pw_step_eval_rows' buffer: probs (host, b->n) get the
 * predicted probabilities. PC_ENOMEM, PC_EINVAL, PC_EIO. */
int pw_step_eval(pw_step_t *st, const pw_batch_t *b, float *probs);

#endif
