/* ps_optim.h: row math of the table (internal): initializers and optimizer steps.
 *
 * Pure functions over one row; the table calls them under the row's shard lock. Kept apart from
 * the hash and slab code so the math can be read, tested and vectorized on its own.
 * Thread rule: everything here is reentrant; a ps_optim_t is read-only once filled.
 */
#ifndef PS_OPTIM_H
#define PS_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "ps_table.h"

struct ps_optim;

/* The row math for one instruction set: a table of functions chosen at run time (the table
 * never assumes the build machine's CPU). "scalar" is plain C compiled for the baseline target
 * and always present; "avx2" uses AVX2 and FMA intrinsics and is offered only when the CPU has
 * both. The two agree within float rounding (FMA rounds once where the scalar code rounds twice;
 * sums of squares are reassociated); each is deterministic, so one machine always produces the
 * same rows. */
typedef struct ps_optim_kernels {
    const char *name;
    /* True when every element of g[0..dim) is finite. */
    bool (*grad_finite)(const float *g, uint32_t dim);
    /* One optimizer step on row w with state s for gradient g (finite; not modified). */
    void (*step)(const struct ps_optim *o, float *w, float *s, const float *g);
} ps_optim_kernels_t;

/* The kernels called `name`, or NULL when there are none of that name or this CPU cannot run
 * them. name NULL: the fastest this CPU runs. Returns a static table (never freed). */
const ps_optim_kernels_t *ps__optim_kernels(const char *name);

/* Hyperparameters in the precision the hot path uses, and the kernels that apply them. */
typedef struct ps_optim {
    ps_optim_kind_t kind;
    uint32_t dim;
    float lr, beta1, beta2, eps, adagrad_init, ftrl_beta, l1, l2;
    float weight_decay, clip_value, clip_norm;
    const ps_optim_kernels_t *k; /* ps__optim_kernels(NULL) unless a test picks others */
} ps_optim_t;

/* Fill o from cfg, with the fastest kernels of this CPU. */
void ps__optim_from_config(const ps_table_config_t *cfg, ps_optim_t *o);

/* State words per row for an optimizer of rows of `dim`. */
uint32_t ps__optim_state_len(ps_optim_kind_t kind, uint32_t dim);

/* Write the state of a fresh row. */
void ps__optim_init_state(const ps_optim_t *o, float *state);

/* True when every element of g (o->dim floats) is finite. */
static inline bool ps__grad_finite(const ps_optim_t *o, const float *g) {
    return o->k->grad_finite(g, o->dim);
}

/* One optimizer step on row w with state s for gradient g (finite; not modified). Order:
 * clip elements, clip the norm, add weight decay, then the optimizer's update. */
static inline void ps__optim_step(const ps_optim_t *o, float *w, float *s, const float *g) {
    o->k->step(o, w, s, g);
}

/* The initial row of `key`: a deterministic function of (seed, key). */
void ps__init_row(ps_init_kind_t kind, float scale, uint64_t seed, uint64_t key, uint32_t dim,
                  float *out);

#endif
