/* pw_layers.h: model layers with forward and backward passes over a backend (pw_backend.h).
 *
 * Every float pointer here (parameters, inputs, outputs) is the backend's device memory; a
 * layer's parameters are allocated on the backend it was made with.
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_backend.h"

/* y = x W^T + b, W out x in. */
typedef struct pw_linear {
    pw_backend_t *be; /* borrowed: outlives the layer */
    int in, out;
    float *w, *b;   /* parameters */
    float *dw, *db; /* their gradients */
} pw_linear_t;

/* Allocate a layer on `be` with Xavier-uniform weights from `seed` (the same on every backend)
 * and zero biases. PC_EINVAL, PC_ENOMEM. */
int pw_linear_init(pw_linear_t *l, pw_backend_t *be, int in, int out, uint64_t seed);
void pw_linear_free(pw_linear_t *l);
void pw_linear_zero_grad(pw_linear_t *l);
/* x: batch x in -> y: batch x out. */
void pw_linear_forward(const pw_linear_t *l, int batch, const float *x, float *y);
/* dy: batch x out. Accumulates dW, db; writes dx (batch x in) unless dx is NULL. */
void pw_linear_backward(pw_linear_t *l, int batch, const float *x, const float *dy, float *dx);

/* A multi-layer perceptron: Linear layers with a ReLU after each but the last (after the last
 * too when relu_last). The layers live in the caller's array (so a model can hand all its layers
 * to an optimizer as one array); the MLP keeps its input and every activation of the last
 * forward (up to max_batch rows) for backward. */
#define PW_MLP_MAX 8

typedef struct pw_mlp {
    pw_backend_t *be;
    pw_linear_t *l;
    int nl, max_batch, batch;
    bool relu_last;
    float *act[PW_MLP_MAX + 1]; /* act[0]: input copy; act[i + 1]: output of layer i */
    const float *in;            /* the last forward's input: act[0], or the caller's (borrowed) */
    float *ga, *gb;             /* gradient scratch, max_batch x widest */
} pw_mlp_t;

/* Layers l[0 .. n) get widths in -> widths[0] -> ... -> widths[n - 1] (1 <= n <= PW_MLP_MAX),
 * layer i seeded with seed + i. PC_EINVAL, PC_ENOMEM (then nothing is left allocated). */
int pw_mlp_init(pw_mlp_t *m, pw_backend_t *be, pw_linear_t *l, int in, const int *widths, int n,
                bool relu_last, int max_batch, uint64_t seed);
/* Frees the activations and the layers. */
void pw_mlp_free(pw_mlp_t *m);
/* x: batch x in (copied) -> the output, batch x widths[n - 1], owned by the MLP and valid until
 * the next forward. NULL when batch is not in 1..max_batch. */
const float *pw_mlp_forward(pw_mlp_t *m, int batch, const float *x);
/* The same with x borrowed, not copied: the caller keeps it unchanged until pw_mlp_backward has
 * returned (a model that owns its MLP's input saves a copy of it per step). */
const float *pw_mlp_forward_borrowed(pw_mlp_t *m, int batch, const float *x);
/* After forward: dy (batch x out) -> parameter gradients accumulated, dx (batch x in) written
 * unless NULL. */
void pw_mlp_backward(pw_mlp_t *m, const float *dy, float *dx);

/* DLRM's pairwise dot-product interaction: the backend's fused kernel when it has one (the CPU:
 * the packed triangle straight from z), else as the GPU likes it: per sample one GEMM Z Z^T
 * (strided-batched) and the strict lower triangle of the result. z: n x f x d (f vectors of dim d
 * per sample) -> out row s (at out + s * ldo): <z_i, z_j> for i > j, row-major (1,0), (2,0),
 * (2,1), ...; full: scratch of n x f x f floats (unused, may be NULL, with the fused kernel). */
void pw_interact_forward(pw_backend_t *be, int n, int f, int d, const float *z, float *full,
                         float *out, int ldo);
/* dout row s at dout + s * ldd (f(f-1)/2 values) -> dz: n x f x d (written); full as above. */
void pw_interact_backward(pw_backend_t *be, int n, int f, int d, const float *z, const float *dout,
                          int ldd, float *full, float *dz);

#endif
