/* pw_datagen.h: Criteo-format samples from a planted model (ps-datagen).
 *
 * The model, a deterministic function of the seed (nothing stored, any vocabulary size):
 *   - field f (26) has a vocabulary of V_f values, log-spaced from vocab_min to vocab_max; a row
 *     draws each field's value from Zipf(zipf_s) over its vocabulary, or leaves it empty with
 *     probability missing_rate;
 *   - each (field, value) has a weight w ~ N(0, 0.2^2) and an embedding e in R^4, components
 *     ~ N(0, 0.25^2);
 *   - 13 dense counts x_j, geometric with means log-spaced from 1 to 1000, enter as
 *     a_j * (log1p(x_j) - mean_j);
 *   - logit = b + sum_f w(f, v_f) + interaction * sum_{(f,g) in P} <e(f, v_f), e(g, v_g)> + dense,
 *     P a seed-chosen set of 24 field pairs; b is set (bisection on 20k calibration rows) so the
 *     mean probability is positive_rate; label ~ Bernoulli(sigmoid(logit)).
 * Categorical values are written as 8 hex digits, a bijection of the value id per field.
 * Row r of the training stream and row r of the test stream are independent deterministic
 * functions of (seed, stream, r). The oracle's AUC and logloss are computed on the test rows from
 * the true probabilities: the best any model can do on that data. A model trained on the rows
 * cannot know the effects of values the training rows never show (a long Zipf tail, 10M-value
 * vocabularies), so two restricted oracles are measured too: the AUC of the true logits with the
 * effects of values seen fewer than 1 (oracle_seen_auc) or 5 (oracle_seen5_auc) times in the
 * training rows left out (set to their prior mean, 0): what the data can teach, roughly.
 *
 * Thread rule: pure, apart from the output streams.
 */
#ifndef PW_DATAGEN_H
#define PW_DATAGEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pc_settings.h"

/* The generator's options. Fill with pw_datagen_defaults(), then set fields directly or through
 * the settings of pw_datagen_settings() (names, bounds, defaults and help are declared there,
 * once; ps-datagen's flags are that table). Types are the settings' storage types. */
typedef struct pw_datagen_opts {
    int64_t seed;                 /* any (the flag takes 0 .. 9.2e18) */
    int64_t rows, test_rows;      /* >= 0 */
    int64_t vocab_min, vocab_max; /* 2 .. 2^32 - 1 */
    double positive_rate;         /* (0, 1) */
    double zipf_s;                /* > 0 */
    double interaction;           /* >= 0 */
    double missing_rate;          /* [0, 1) */
} pw_datagen_opts_t;

/* The settings table behind pw_datagen_opts_t (flags, --help, dumps). Static; *n its length. */
const pc_setting_t *pw_datagen_settings(size_t *n);

/* Every option at its default (pc_settings_defaults over pw_datagen_settings()). */
void pw_datagen_defaults(pw_datagen_opts_t *o);

typedef struct pw_datagen_result {
    double bias;                              /* the calibrated b */
    double train_positive;                    /* mean label of the training rows */
    double oracle_auc, oracle_logloss;        /* on the test rows */
    double oracle_seen_auc, oracle_seen5_auc; /* restricted to values seen >= 1, 5 times (NaN:
                                                 not measured: vocabularies over 2^28 values) */
    uint64_t rows, test_rows;
} pw_datagen_result_t;

/* Write o->rows training lines to train and o->test_rows to test (either may be NULL: not
 * written; the oracle needs the test rows generated, written or not). PC_EINVAL for bad options
 * (the rules in the comments of pw_datagen_opts_t, which the settings' bounds imply), PC_EIO on a
 * write error, PC_ENOMEM. */
int pw_datagen_run(const pw_datagen_opts_t *o, FILE *train, FILE *test, pw_datagen_result_t *res);

/* A generator: the model derived from the options and its calibrated bias, built once. */
typedef struct pw_datagen pw_datagen_t;
int pw_datagen_create(const pw_datagen_opts_t *o, pw_datagen_t **out);
void pw_datagen_destroy(pw_datagen_t *g);
double pw_datagen_bias(const pw_datagen_t *g);

/* Format row r of stream s (0 train, 1 test) as one Criteo line (with "\n") into buf (>= 768
 * bytes); *prob (may be NULL) gets its true probability. Returns the line length. */
size_t pw_datagen_row(const pw_datagen_t *g, int s, uint64_t r, char *buf, double *prob);

#endif
