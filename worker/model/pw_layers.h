/* pw_layers.h: model layers with forward and backward passes over a backend (pw_backend.h).
 *
 * Shapes are row-major with the batch first. Backward passes ACCUMULATE parameter gradients
 * (dW, db += ...), so gradients of several uses or micro-batches add up; the caller zeroes them
 * (pw_linear_zero_grad) before a step. Input gradients are written, not accumulated, unless
 * stated otherwise.
 *
 * Thread rule: a layer is used by one thread at a time.
 */
#ifndef PW_LAYERS_H
#define PW_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "pw_backend.h"

/* y = x W^T + b, W out x in. */
typedef struct pw_linear {
    int in, out;
    float *w, *b;   /* parameters */
    float *dw, *db; /* their gradients */
} pw_linear_t;

/* Allocate a layer with Xavier-uniform weights from `seed` and zero biases. PC_ENOMEM. */
int pw_linear_init(pw_linear_t *l, int in, int out, uint64_t seed);
void pw_linear_free(pw_linear_t *l);
void pw_linear_zero_grad(pw_linear_t *l);
/* x: batch x in -> y: batch x out. */
void pw_linear_forward(const pw_backend_t *be, const pw_linear_t *l, int batch, const float *x,
                       float *y);
/* dy: batch x out. Accumulates dW, db; writes dx (batch x in) unless dx is NULL. */
void pw_linear_backward(const pw_backend_t *be, pw_linear_t *l, int batch, const float *x,
                        const float *dy, float *dx);

/* Binary cross-entropy on logits, mean over the batch: returns the loss; p (may be NULL) gets
 * sigmoid(logits); dlogits gets d loss / d logit = (sigmoid(z) - y) / batch. Stable for large
 * |z|. */
double pw_bce_logits(int batch, const float *logits, const float *labels, float *p, float *dlogits);

/* DLRM's pairwise dot-product interaction. z: batch x f x d (f vectors of dim d per sample) ->
 * out: batch x f(f-1)/2, the dots <z_i, z_j> for i > j in row-major lower-triangle order. */
void pw_dot_forward(int batch, int f, int d, const float *z, float *out);
/* dout: batch x f(f-1)/2 -> dz: batch x f x d (written). */
void pw_dot_backward(int batch, int f, int d, const float *z, const float *dout, float *dz);

#endif
