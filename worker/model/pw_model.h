/* pw_model.h: a model as a table of functions: LR, FM, DLRM and DeepFM behind one interface.
 *
 * The trainer, the step (pw_step.h), evaluation and serving call a model only through this
 * header: create it from settings, run forward on a view of a batch, backward from the logits'
 * gradient, and reach its parameters (for the dense optimizer, the allreduce, checkpoints and the
 * model file). A new model is one more pw_model_ops_t in pw_model.c's list.
 *
 * DESIGN
 * - Rows in, rows out. A model sees one embedding row per feature (rows, nk x row_dim: the
 *   trainer gathers them from the batch's unique rows) and gives back one gradient row per
 *   feature (drows, written in full). Whatever a model does with the rows - pool them per field
 *   (DLRM, the deep part of DeepFM), take pairwise factor interactions (FM) - is its own
 *   business: pooling lives in the model, not in the trainer.
 * - The table's row is the model's choice: row_dim = dim (DLRM), dim + 1 ([w, v_1 .. v_dim]: FM,
 *   DeepFM) or 1 (LR, whose rows start at zero: zero_rows). pw_model_row_dim answers it from the
 *   settings, before a table exists.
 * - Parameters are an array of linear layers (pw_layers.h): a model's dense state is its layers'
 *   weights and biases, their gradients sit next to them. backward ZEROES the gradients first and
 *   then writes this batch's (they do not accumulate across calls).
 * - Memory: every pointer of a view and every output is the backend's device memory (pw_backend.h).
 *   forward keeps the view (by value) for backward: its buffers must stay valid and unchanged
 *   until backward returns.
 * - Inputs: dense has ndense values per sample (>= 1: streams without dense features give one
 *   constant 1). Models with fields (DLRM, DeepFM) need field[j] < nfields: pw_model_fields says
 *   how many, and the caller checks its batches (pw_step_check).
 *
 * Thread rule: a model is used by one thread at a time.
 */
#ifndef PW_MODEL_H
#define PW_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_layers.h"

typedef struct pw_model_config {
    char name[16];                   /* "dlrm" | "deepfm" | "fm" | "lr" */
    int ndense;                      /* dense inputs per sample, >= 1 */
    int nfields;                     /* categorical fields (dlrm, deepfm: >= 1; fm, lr: unused) */
    int dim;                         /* embedding dim (dlrm), factors (fm, deepfm); lr: unused */
    bool mean;                       /* pool a field's features by their mean (else sum) */
    int nbottom, bottom[PW_MLP_MAX]; /* dlrm bottom widths (the last = dim) */
    int ntop, top[PW_MLP_MAX];       /* dlrm top / deepfm MLP widths (the last = 1) */
    int max_batch;                   /* samples per forward, at most */
    uint64_t seed;                   /* initial weights */
} pw_model_config_t;

/* A batch as a model sees it (backend device memory, borrowed). */
typedef struct pw_view {
    int n;                  /* samples, 1 .. max_batch */
    size_t nk;              /* features */
    const float *dense;     /* n x ndense */
    const size_t *key_off;  /* n + 1: sample s has features key_off[s] .. key_off[s + 1] - 1 */
    const uint16_t *fields; /* nk */
    const float *vals;      /* nk: each feature's value (1 for one-hot) */
    const float *rows;      /* nk x row_dim: each feature's embedding row; NULL: through inv */
    const float *urows;     /* with rows NULL (pw_model_reads_unique): the unique rows, and */
    const uint32_t *inv;    /* nk: feature j's row is urows + inv[j] * row_dim */
} pw_view_t;

typedef struct pw_model pw_model_t;

/* One model kind. create fills the common part (pw_model_t below) of the object it returns. */
typedef struct pw_model_ops {
    const char *name;
    bool needs_fields; /* pools per field: nfields >= 1 */
    bool zero_rows;    /* its table's rows start at zero */
    int (*row_dim)(const pw_model_config_t *c);
    /* PC_EINVAL (inconsistent settings, logged), PC_ENOMEM. */
    int (*create)(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out);
    /* v -> logits (n, written). */
    int (*forward)(pw_model_t *m, const pw_view_t *v, float *logits);
    /* After forward: dlogits (n) -> parameter gradients (added to zeroed ones) and drows (nk x
     * row_dim, written). */
    int (*backward)(pw_model_t *m, const float *dlogits, float *drows);
    /* Optional (NULL: no): whether this model on its backend reads a view's rows through inv
     * (rows NULL) and backward_unique may follow its forward. */
    bool (*reads_unique)(const pw_model_t *m);
    /* After a forward through inv: parameter gradients as backward, and alpha times each
     * feature's row gradient added to row inv[j] of ugrads (what backward, then the backend's
     * scatter_add_rows, would add, to the bit). */
    int (*backward_unique)(pw_model_t *m, const float *dlogits, float alpha, float *ugrads);
    void (*destroy)(pw_model_t *m);
} pw_model_ops_t;

/* What every model starts with (its own state follows). */
struct pw_model {
    const pw_model_ops_t *ops;
    pw_backend_t *be; /* borrowed: outlives the model */
    pw_model_config_t c;
    int row_dim;
    pw_linear_t *params; /* the layers: weights, biases and their gradients */
    int nparams;
};

/* The kind named `name`: PC_EINVAL (logged, with the known names) when there is none. */
int pw_model_find(const char *name, const pw_model_ops_t **ops);
/* The table row width for settings c (0 when the name is unknown). */
int pw_model_row_dim(const pw_model_config_t *c);
/* Create the model c names on `be`. PC_EINVAL (unknown name, inconsistent widths: logged),
 * PC_ENOMEM. */
int pw_model_create(const pw_model_config_t *c, pw_backend_t *be, pw_model_t **out);
void pw_model_destroy(pw_model_t *m); /* NULL: nothing */

/* Fields the model pools over (field ids must be below it), 0 when it takes any. */
int pw_model_fields(const pw_model_t *m);

int pw_model_forward(pw_model_t *m, const pw_view_t *v, float *logits);
/* Zeroes the parameter gradients, then the model's backward. */
int pw_model_backward(pw_model_t *m, const float *dlogits, float *drows);
/* Whether m takes views through inv (pw_model_ops_t.reads_unique), and the backward after such a
 * forward (only for a model that does). */
bool pw_model_reads_unique(const pw_model_t *m);
int pw_model_backward_unique(pw_model_t *m, const float *dlogits, float alpha, float *ugrads);

/* The dense model file (pw_model_io.h) of the parameters. PC_EIO, PC_ECORRUPT, PC_EDIM. */
int pw_model_save(const pw_model_t *m, const char *path);
int pw_model_load(pw_model_t *m, const char *path);

/* The kinds (defined in their models' files). */
extern const pw_model_ops_t pw_model_dlrm, pw_model_deepfm, pw_model_fm, pw_model_lr;

#endif
