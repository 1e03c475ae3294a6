/* ps_optim.h: row math of the table (internal): initializers and optimizer steps.
 *
 * Pure functions over one row; the table calls them under the row's shard lock. Kept apart from
 * the hash and slab code so the math can be read, tested and later vectorized on its own.
 */
#ifndef PS_OPTIM_H
#define PS_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "ps_table.h"

/* Hyperparameters in the precision the hot path uses. */
typedef struct ps_optim {
    ps_optim_kind_t kind;
    uint32_t dim;
    float lr, beta1, beta2, eps, adagrad_init, ftrl_beta, l1, l2;
    float weight_decay, clip_value, clip_norm;
} ps_optim_t;

void ps__optim_from_config(const ps_table_config_t *cfg, ps_optim_t *o);

/* State words per row for an optimizer of rows of `dim`. */
uint32_t ps__optim_state_len(ps_optim_kind_t kind, uint32_t dim);

/* Write the state of a fresh row. */
void ps__optim_init_state(const ps_optim_t *o, float *state);

/* True when every element of g is finite. */
bool ps__grad_finite(const float *g, uint32_t dim);

/* One optimizer step on row w with state s for gradient g (finite; not modified). */
void ps__optim_step(const ps_optim_t *o, float *w, float *s, const float *g);

/* The initial row of `key`: a deterministic function of (seed, key). */
void ps__init_row(ps_init_kind_t kind, float scale, uint64_t seed, uint64_t key, uint32_t dim,
                  float *out);

#endif
