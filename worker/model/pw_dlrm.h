/* pw_dlrm.h: DLRM (Naumov et al. 2019) dense part over a backend.
 *
 *   bottom = MLP(dense)                  ReLU after every bottom layer; last width = emb dim d
 *   z      = [bottom, e_1 .. e_F]        F = nfields + 1 vectors of dim d per sample
 *   inter  = <z_i, z_j> for i > j        pw_interact_forward (batched GEMM)
 *   logit  = MLP([bottom, inter])        ReLU between top layers, none after the last (width 1)
 *
 * The embeddings e_f come from the caller (pulled from a table) and their gradients go back to
 * the caller (pushed); the model owns the MLPs. Activations of the last forward are kept for
 * backward, for up to max_batch samples. Every float pointer is the backend's device memory.
 *
 * Thread rule: a model is used by one thread at a time.
 */
#ifndef PW_DLRM_H
#define PW_DLRM_H

#include "pw_layers.h"

typedef struct pw_dlrm_config {
    int ndense, nfields, dim;
    int nbottom, bottom[PW_MLP_MAX]; /* widths after the input; the last must equal dim */
    int ntop, top[PW_MLP_MAX];       /* widths after the input; the last must be 1 */
    int max_batch;
    uint64_t seed;
} pw_dlrm_config_t;

typedef struct pw_dlrm pw_dlrm_t;

/* PC_EINVAL for an inconsistent configuration, PC_ENOMEM. */
int pw_dlrm_create(const pw_dlrm_config_t *c, pw_backend_t *be, pw_dlrm_t **out);
void pw_dlrm_destroy(pw_dlrm_t *m);

/* dense: batch x ndense; emb: batch x nfields x dim -> logits: batch. */
int pw_dlrm_forward(pw_dlrm_t *m, int batch, const float *dense, const float *emb, float *logits);
/* After forward: dlogits (batch) -> parameter gradients accumulated, demb (batch x nfields x dim)
 * written. */
int pw_dlrm_backward(pw_dlrm_t *m, const float *dlogits, float *demb);

/* The layers (for optimizers, saving, tests): bottom then top, *n of them. */
pw_linear_t *pw_dlrm_layers(pw_dlrm_t *m, int *n);
void pw_dlrm_zero_grad(pw_dlrm_t *m);

#endif
