/* pw_fm.h: factorization machine (Rendle 2010) over one key per field.
 *
 * Each feature's table row is [w, v_1 .. v_k] (dim k + 1). For a sample with F feature rows:
 *   logit = lin + sum_f w_f + 1/2 sum_j ((sum_f v_fj)^2 - sum_f v_fj^2)
 * where lin is the caller's linear term over dense features. The pairwise term is computed in
 * O(F k) by the sum-of-squares identity.
 *
 * Thread rule: pure functions.
 */
#ifndef PW_FM_H
#define PW_FM_H

/* rows: batch x nf x (k + 1); logits (batch) get the sparse part added. */
void pw_fm_forward(int batch, int nf, int k, const float *rows, float *logits);
/* dlogits (batch) -> drows (batch x nf x (k + 1)), written. */
void pw_fm_backward(int batch, int nf, int k, const float *rows, const float *dlogits,
                    float *drows);

#endif
