/* pw_deepfm.h: DeepFM (Guo et al. 2017): a factorization machine and an MLP that share the
 * embeddings.
 *
 *   rows   one per feature: [w, v_1 .. v_k] (table dim k + 1), value x per feature
 *   fm     = sum_i w_i x_i + pairwise interactions of the v_i x_i   (pw_backend_t.fm)
 *   deep   = MLP([dense, pool_1(v), .., pool_F(v)])  pool_f: the v of field f's features,
 *            summed (or averaged) with their values; ReLU between layers, the last width 1
 *   logit  = fm + deep
 *
 * The model owns the MLP; rows come from the caller (pulled) and their gradients go back to the
 * caller (pushed). forward keeps pointers to its inputs: they must stay valid until backward.
 * Every pointer is the backend's device memory.
 *
 * Thread rule: a model is used by one thread at a time.
 */
#ifndef PW_DEEPFM_H
#define PW_DEEPFM_H

#include "pw_layers.h"

typedef struct pw_deepfm_config {
    int ndense, nfields, k;          /* ndense >= 1; fields 0 .. nfields - 1 */
    int nlayers, widths[PW_MLP_MAX]; /* MLP widths after the input; the last must be 1 */
    bool mean;                       /* mean pooling (else sum) */
    int max_batch;
    uint64_t seed;
} pw_deepfm_config_t;

typedef struct pw_deepfm pw_deepfm_t;

/* PC_EINVAL for an inconsistent configuration, PC_ENOMEM. */
int pw_deepfm_create(const pw_deepfm_config_t *c, pw_backend_t *be, pw_deepfm_t **out);
void pw_deepfm_destroy(pw_deepfm_t *m);

/* dense: batch x ndense; sample s has features j in [off[s], off[s + 1]) with field[j] (<
 * nfields), value val[j] and row rows + j * (k + 1) -> logits (batch), written. */
int pw_deepfm_forward(pw_deepfm_t *m, int batch, const float *dense, const size_t *off,
                      const uint16_t *field, const float *val, const float *rows, float *logits);
/* After forward: dlogits -> MLP gradients accumulated; drows (one row of k + 1 per feature)
 * written. */
int pw_deepfm_backward(pw_deepfm_t *m, const float *dlogits, float *drows);

/* The MLP's layers (for optimizers and saving), *n of them. */
pw_linear_t *pw_deepfm_layers(pw_deepfm_t *m, int *n);

#endif
