/* pw_datagen.c: see pw_datagen.h. */
#include "pw_datagen.h"

#include "pc_error.h"
#include "pc_hash.h"
#include "pc_rand.h"
#include "pw_metrics.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define NF     26
#define ND     13
#define EDIM   4
#define NPAIRS 24
#define CALIB  20000
#define W_STD  0.2  /* per-value weights */
#define E_STD  0.25 /* per-value embedding components */

/* ---- options --------------------------------------------------------------------------------- */

#define T pw_datagen_opts_t
static const pc_setting_t k_settings[] = {
    PC_SETTING_INT(T, seed, 0, 9.2e18, "1", "seed of the planted model and the rows"),
    PC_SETTING_INT(T, rows, 0, 1e13, "1000000", "training rows"),
    PC_SETTING_INT(T, test_rows, 0, 1e10, "100000",
                   "held-out rows (the oracle is measured on them)"),
    PC_SETTING_INT(T, vocab_min, 2, 4294967295.0, "10", "smallest field vocabulary"),
    PC_SETTING_INT(T, vocab_max, 2, 4294967295.0, "10000000", "largest field vocabulary"),
    PC_SETTING_DOUBLE(T, positive_rate, 0.001, 0.999, "0.25", "mean label"),
    PC_SETTING_DOUBLE(T, zipf_s, 0.01, 10, "1.1", "Zipf exponent of categorical values"),
    PC_SETTING_DOUBLE(T, interaction, 0, 100, "2", "strength of pairwise field interactions"),
    PC_SETTING_DOUBLE(T, missing_rate, 0, 0.99, "0.02", "fraction of empty categorical values"),
};
#undef T
#define NSETTINGS (sizeof k_settings / sizeof k_settings[0])

const pc_setting_t *pw_datagen_settings(size_t *n) {
    *n = NSETTINGS;
    return k_settings;
}

void pw_datagen_defaults(pw_datagen_opts_t *o) {
    memset(o, 0, sizeof *o);
    if (pc_settings_defaults(k_settings, NSETTINGS, o))
        abort(); /* a default violates its own bounds: a bug in the table above */
}

/* ---- the model ------------------------------------------------------------------------------- */

/* Derived constants of a model: vocabularies, dense scales, pairs. */
typedef struct model {
    pc_zipf_t zipf[NF];
    uint64_t vocab[NF];
    double dense_mean[ND], dense_a[ND], dense_center[ND];
    uint8_t pa[NPAIRS], pb[NPAIRS];
} model_t;

static double gauss(uint64_t h) { /* N(0, 1) from 64 hash bits (Box-Muller) */
    const double u1 = ((double)(h >> 40) + 0.5) * 0x1p-24, u2 = (double)(h & 0xffffff) * 0x1p-24;
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

static uint64_t param_hash(uint64_t seed, uint32_t f, uint64_t v, uint32_t slot) {
    return pc_hash_u64(pc_hash_u64(v, seed ^ ((uint64_t)f << 40)) ^ slot, PC_HASH_SEED_FEATURE);
}

static void model_init(const pw_datagen_opts_t *o, model_t *m) {
    for (int f = 0; f < NF; f++) {
        const double t = NF > 1 ? (double)f / (NF - 1) : 0;
        m->vocab[f] = (uint64_t)llround(
            exp(log((double)o->vocab_min) * (1 - t) + log((double)o->vocab_max) * t));
        pc_zipf_init(&m->zipf[f], m->vocab[f], o->zipf_s);
    }
    for (int j = 0; j < ND; j++) {
        m->dense_mean[j] = exp(log(1000.0) * j / (ND - 1));
        m->dense_a[j] = 0.3 * gauss(param_hash(o->seed, 100, (uint64_t)j, 7));
        /* E[log1p(x)] for geometric x with this mean, by a short numeric sum */
        const double q = m->dense_mean[j] / (1 + m->dense_mean[j]);
        double e = 0, pk = 1 - q;
        for (int k = 0; k < 20000 && pk > 1e-15; k++, pk *= q)
            e += pk * log1p((double)k);
        m->dense_center[j] = e;
    }
    uint64_t st = o->seed ^ UINT64_C(0x70616972);
    for (int p = 0; p < NPAIRS; p++) {
        m->pa[p] = (uint8_t)(pc_rand(&st) % NF);
        do
            m->pb[p] = (uint8_t)(pc_rand(&st) % NF);
        while (m->pb[p] == m->pa[p]);
    }
}

/* A geometric draw with mean m. */
static uint64_t geometric(uint64_t *st, double m) {
    const double u = pc_rand_unit(st);
    return (uint64_t)floor(log1p(-u) / log(m / (1 + m)));
}

/* How often each (field, value) occurred in the training rows, saturating at 255: to measure the
 * oracle restricted to the values training shows. */
typedef struct seen {
    uint8_t *count[NF]; /* count[f][v], v in 1..vocab[f] */
    int min_count;      /* draw: values seen fewer times contribute nothing */
    bool record;        /* draw: count the row's values */
} seen_t;

#define SEEN_MAX_VALUES (UINT64_C(1) << 28) /* all fields together; beyond: not measured */

/* Draw row r of stream s: the line (when buf) and the logit without bias. With sn: record the
 * row's values, or leave out the effects of values seen fewer than min_count times. */
static double draw(const pw_datagen_opts_t *o, const model_t *m, int s, uint64_t r, char *buf,
                   size_t *len, seen_t *sn) {
    uint64_t st = pc_hash_u64(r, o->seed ^ ((uint64_t)(s + 1) << 56));
    uint64_t dense[ND];
    uint64_t val[NF];
    bool missing[NF];
    double logit = 0;
    for (int j = 0; j < ND; j++) {
        dense[j] = geometric(&st, m->dense_mean[j]);
        logit += m->dense_a[j] * (log1p((double)dense[j]) - m->dense_center[j]);
    }
    double emb[NF][EDIM];
    for (int f = 0; f < NF; f++) {
        missing[f] = pc_rand_unit(&st) < o->missing_rate;
        val[f] = missing[f] ? UINT64_C(1) << 40 : pc_zipf_next(&m->zipf[f], &st);
        uint8_t *cnt = sn && !missing[f] ? &sn->count[f][val[f]] : NULL;
        if (cnt && sn->record)
            *cnt += *cnt < 255;
        if (cnt && !sn->record && *cnt < sn->min_count) { /* unseen: its prior mean, 0 */
            memset(emb[f], 0, sizeof emb[f]);
            continue;
        }
        logit += W_STD * gauss(param_hash(o->seed, (uint32_t)f, val[f], 0));
        for (int k = 0; k < EDIM; k++)
            emb[f][k] = E_STD * gauss(param_hash(o->seed, (uint32_t)f, val[f], 1 + (uint32_t)k));
    }
    if (o->interaction > 0) {
        double it = 0;
        for (int p = 0; p < NPAIRS; p++)
            for (int k = 0; k < EDIM; k++)
                it += emb[m->pa[p]][k] * emb[m->pb[p]][k];
        logit += o->interaction * it;
    }
    if (buf) {
        char *w = buf + 2; /* label written by the caller */
        for (int j = 0; j < ND; j++)
            w += sprintf(w, "%llu\t", (unsigned long long)dense[j]);
        for (int f = 0; f < NF; f++) {
            if (!missing[f]) {
                const uint32_t h = (uint32_t)val[f] * 0x9E3779B1u ^ (uint32_t)f * 0x85EBCA6Bu;
                w += sprintf(w, "%08x", h);
            }
            *w++ = f + 1 < NF ? '\t' : '\n';
        }
        *len = (size_t)(w - buf);
    }
    return logit;
}

static inline double sigmoid(double x) {
    return 1 / (1 + exp(-x));
}

struct pw_datagen {
    pw_datagen_opts_t o;
    model_t m;
    double b;
};

/* The positive rate of bias b over the CALIB logits z. */
static double mean_rate(const double *z, double b) {
    double mean = 0;
    for (int i = 0; i < CALIB; i++)
        mean += sigmoid(b + z[i]);
    return mean / CALIB;
}

/* The bias that gives o->positive_rate, by bisection on CALIB rows of their own stream. */
static int calibrate(const pw_datagen_opts_t *o, const model_t *m, double *out) {
    double *z = malloc(CALIB * sizeof *z);
    if (!z)
        return PC_ENOMEM;
    for (int i = 0; i < CALIB; i++)
        z[i] = draw(o, m, 2, (uint64_t)i, NULL, NULL, NULL);
    /* [-30, 30] when it holds the bias (the data of every run so far, to the bit); else, with
     * large interactions (their spread passes 30), a bracket of the whole spread of z */
    double lo = -30, hi = 30, zmin = z[0], zmax = z[0];
    for (int i = 1; i < CALIB; i++) {
        zmin = z[i] < zmin ? z[i] : zmin;
        zmax = z[i] > zmax ? z[i] : zmax;
    }
    if (mean_rate(z, lo) > o->positive_rate || mean_rate(z, hi) < o->positive_rate) {
        lo = -zmax - 40;
        hi = -zmin + 40;
    }
    for (int it = 0; it < 60; it++) {
        const double b = (lo + hi) / 2;
        if (mean_rate(z, b) < o->positive_rate)
            lo = b;
        else
            hi = b;
    }
    free(z);
    *out = (lo + hi) / 2;
    return 0;
}

static int check(const pw_datagen_opts_t *o);

int pw_datagen_create(const pw_datagen_opts_t *o, pw_datagen_t **out) {
    if (!o || !out || check(o))
        return PC_EINVAL;
    pw_datagen_t *g = malloc(sizeof *g);
    if (!g)
        return PC_ENOMEM;
    g->o = *o;
    model_init(o, &g->m);
    int rc = calibrate(o, &g->m, &g->b);
    if (rc) {
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void pw_datagen_destroy(pw_datagen_t *g) {
    free(g);
}

double pw_datagen_bias(const pw_datagen_t *g) {
    return g->b;
}

/* Row r of stream s into buf, with its probability (see pw_datagen_row); sn as for draw. */
static size_t row(const pw_datagen_t *g, int s, uint64_t r, char *buf, double *prob, seen_t *sn) {
    size_t len = 0;
    const double p = sigmoid(g->b + draw(&g->o, &g->m, s, r, buf, &len, sn));
    uint64_t st = pc_hash_u64(r, g->o.seed ^ UINT64_C(0x6c6162656c) ^ (uint64_t)s);
    buf[0] = pc_rand_unit(&st) < p ? '1' : '0';
    buf[1] = '\t';
    if (prob)
        *prob = p;
    return len;
}

size_t pw_datagen_row(const pw_datagen_t *g, int s, uint64_t r, char *buf, double *prob) {
    return row(g, s, r, buf, prob, NULL);
}

/* The AUC of the true probabilities with the effects of values seen fewer than min_count times
 * in training left out, on the test rows; NaN when not measured. */
static double seen_auc(const pw_datagen_t *g, seen_t *sn, int min_count, float *probs,
                       const float *labels) {
    if (!sn->count[0])
        return NAN;
    sn->record = false;
    sn->min_count = min_count;
    char buf[768];
    for (uint64_t r = 0; r < (uint64_t)g->o.test_rows; r++) {
        double p;
        row(g, 1, r, buf, &p, sn);
        probs[r] = (float)p;
    }
    return pw_auc(probs, labels, g->o.test_rows);
}

static int check(const pw_datagen_opts_t *o) {
    return o->rows >= 0 && o->test_rows >= 0 && o->positive_rate > 0 && o->positive_rate < 1 &&
                   o->zipf_s > 0 && o->vocab_min >= 2 && o->vocab_max >= o->vocab_min &&
                   o->vocab_max < (INT64_C(1) << 32) && o->interaction >= 0 &&
                   o->missing_rate >= 0 && o->missing_rate < 1
               ? 0
               : PC_EINVAL;
}

int pw_datagen_run(const pw_datagen_opts_t *o, FILE *train, FILE *test, pw_datagen_result_t *res) {
    pw_datagen_t *g;
    int rc = pw_datagen_create(o, &g);
    if (rc)
        return rc;
    float *probs = malloc((o->test_rows ? o->test_rows : 1) * sizeof *probs);
    float *labels = malloc((o->test_rows ? o->test_rows : 1) * sizeof *labels);
    if (!probs || !labels) {
        free(probs);
        free(labels);
        pw_datagen_destroy(g);
        return PC_ENOMEM;
    }
    seen_t sn = {.record = true};
    uint64_t total = 0;
    for (int f = 0; f < NF; f++)
        total += g->m.vocab[f] + 1;
    for (int f = 0; f < NF && total <= SEEN_MAX_VALUES && o->test_rows; f++)
        if (!(sn.count[f] = calloc(g->m.vocab[f] + 1, 1))) {
            for (int k = 0; k < f; k++) { /* not measured; everything else goes on */
                free(sn.count[k]);
                sn.count[k] = NULL;
            }
            break;
        }
    char buf[768];
    uint64_t pos = 0;
    for (int s = 0; s < 2 && !rc; s++) {
        FILE *out = s ? test : train;
        const uint64_t n = (uint64_t)(s ? o->test_rows : o->rows);
        for (uint64_t r = 0; r < n && !rc; r++) {
            double p;
            const size_t len = row(g, s, r, buf, &p, s == 0 && sn.count[0] ? &sn : NULL);
            const int y = buf[0] == '1';
            if (s) {
                probs[r] = (float)p;
                labels[r] = (float)y;
            } else {
                pos += (uint64_t)y;
            }
            if (out && fwrite(buf, 1, len, out) != len)
                rc = PC_EIO;
        }
    }
    if (!rc && ((train && fflush(train)) || (test && fflush(test))))
        rc = PC_EIO;
    if (!rc && res) {
        res->bias = g->b;
        res->rows = o->rows;
        res->test_rows = o->test_rows;
        res->train_positive = o->rows ? (double)pos / (double)o->rows : NAN;
        res->oracle_auc = pw_auc(probs, labels, o->test_rows);
        res->oracle_logloss = pw_logloss(probs, labels, o->test_rows);
        res->oracle_seen_auc = seen_auc(g, &sn, 1, probs, labels);
        res->oracle_seen5_auc = seen_auc(g, &sn, 5, probs, labels);
    }
    for (int f = 0; f < NF; f++)
        free(sn.count[f]);
    free(probs);
    free(labels);
    pw_datagen_destroy(g);
    return rc;
}
