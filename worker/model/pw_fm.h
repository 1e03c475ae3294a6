/* pw_fm.h: factorization machine (Rendle 2010) over a sample's features.
 *
 * Each feature's table row is [w, v_1 .. v_k] (dim k + 1) and its value is x (1 for one-hot
 * categoricals). For a sample with features i:
 *   logit = lin + sum_i w_i x_i + 1/2 sum_j ((sum_i v_ij x_i)^2 - sum_i v_ij^2 x_i^2)
 * where lin is the caller's linear term over dense features. The pairwise term is computed in
 * O(n k) by the sum-of-squares identity. Samples may have any number of features (multi-valued
 * fields interact feature by feature, as in the original FM).
 *
 * Thread rule: pure functions.
 */
#ifndef PW_FM_H
#define PW_FM_H

#include <stddef.h>

#define PW_FM_K_MAX 1024

/* Sample s has features j in [off[s], off[s + 1]) with value val[j] and row rows + j * (k + 1);
 * k <= PW_FM_K_MAX. logits (batch) get the sparse part added. */
void pw_fm_forward(int batch, const size_t *off, const float *val, int k, const float *rows,
                   float *logits);
/* dlogits (batch) -> drows (one row of k + 1 per feature), written. */
void pw_fm_backward(int batch, const size_t *off, const float *val, int k, const float *rows,
                    const float *dlogits, float *drows);

#endif
