/* pw_metrics.h: evaluation metrics of binary classifiers.
 *
 * pw_auc is the exact ROC AUC: the probability that a random positive scores above a random
 * negative, ties counting one half, computed by sorting (O(n log n)) with tied scores given their
 * average rank. NaN when there are no positives or no negatives. pw_logloss is the mean binary
 * cross-entropy with probabilities clamped to [1e-7, 1 - 1e-7].
 *
 * Thread rule: pure functions (pw_auc allocates scratch).
 */
#ifndef PW_METRICS_H
#define PW_METRICS_H

#include <stddef.h>

/* labels are 0 or 1 (anything > 0.5 counts as positive). PC_ENOMEM -> returns NaN. */
double pw_auc(const float *scores, const float *labels, size_t n);
double pw_logloss(const float *probs, const float *labels, size_t n);

#endif
