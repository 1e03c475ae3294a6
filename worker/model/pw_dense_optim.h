/* pw_dense_optim.h: optimizers of the worker's dense parameters (MLP weights and biases).
 *
 * The embeddings are updated on the servers (ps_table.h); these update the dense tower on the
 * worker after gradients are averaged. One optimizer instance per parameter tensor keeps its
 * state (Adagrad accumulator, Adam moments and step count).
 *   sgd      w -= lr * g
 *   adagrad  G += g^2; w -= lr * g / (sqrt(G) + eps)
 *   adam     m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; t++;
 *            w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 *
 * Thread rule: an instance is used by one thread at a time.
 */
#ifndef PW_DENSE_OPTIM_H
#define PW_DENSE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "pw_backend.h"

typedef struct pw_opt_config {
    pw_opt_kind_t kind;
    float lr, beta1, beta2, eps, adagrad_init;
} pw_opt_config_t;

void pw_opt_config_defaults(pw_opt_config_t *c, pw_opt_kind_t kind);

typedef struct pw_opt {
    pw_backend_t *be; /* borrowed */
    pw_opt_config_t c;
    size_t n;
    float *s1, *s2; /* device memory: adagrad G; adam m, v (NULL when unused) */
    uint64_t t;     /* steps taken (adam's bias correction) */
} pw_opt_t;

/* State for n parameters on `be`. PC_ENOMEM. */
int pw_opt_init(pw_opt_t *o, pw_backend_t *be, const pw_opt_config_t *c, size_t n);
void pw_opt_free(pw_opt_t *o);
/* One step on w[0..n) with gradient g (device memory), on the backend. */
void pw_opt_step(pw_opt_t *o, float *w, const float *g);

#endif
