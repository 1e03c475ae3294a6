/* ps-serve's gRPC handlers (serve/sv_api.h) driven directly through sv_api_call, on a pinned
 * replica of versions built on disk with no server process (serve_fixture.h).
 *
 * What is checked: Predict from Criteo lines and from keyed samples scores what the model's own
 * evaluation (pw_step_eval, on a model loaded from the version's files, rows looked up in the
 * training servers' catalogs) scores, and what DLRM's forward in double precision on the same
 * weights and rows scores, within 1e-6, and both forms agree exactly; every bad input
 * answers its documented code and the replica answers the next request; LoadVersion of another
 * step, a missing one and a damaged one (refused, counted, the current version keeps serving);
 * Follow on a pinned-only replica; ListVersions and ServeStatus; and versions swapped while
 * threads call Predict: no call fails and every reply's scores are those of the version it
 * names.
 *
 * DESIGN: one fixture for the group (two versions, steps 100 and 200, with different dense
 * weights; a damaged step 300 is added by test_versions), one replica created pinned to the
 * newest. The tests run in order and leave the replica serving; each says which version it
 * expects. The reference scores of each version are computed once in the group setup.
 */
#include "test_util.h"

#include <pthread.h>
#include <string.h>

#include "emberps.pb-c.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_step.h"
#include "serve_fixture.h"
#include "sv_api.h"

#define V1     100
#define V2     200
#define VBAD   300
#define VSHAPE 250

static sf_t g_f;
static sv_serve_t *g_s;
static sv_api_env_t g_env;
static float g_ref[2][SF_NLINES];   /* the scores of the fixture's lines: versions V1, V2 */
static double g_refd[2][SF_NLINES]; /* the same in double precision */
static int m_predict, m_status, m_versions, m_load, m_follow, m_lookup, m_health;

static int method(const char *path) {
    const int m = sv_api_method(path, strlen(path));
    assert_true(m >= 0);
    return m;
}

/* Pack msg, call method m; returns the reply's code (r to free by the caller). */
static int call(const sv_api_env_t *env, int m, const ProtobufCMessage *msg, ps_api_reply_t *r) {
    const size_t n = msg ? protobuf_c_message_get_packed_size(msg) : 0;
    uint8_t *buf = malloc(n + 1);
    assert_non_null(buf);
    if (msg)
        protobuf_c_message_pack(msg, buf);
    sv_api_call((void *)env, m, buf, n, true, r);
    free(buf);
    assert_int_equal(r->status, pc_err_to_grpc(r->err));
    return r->err;
}

/* The call fails with code; its message holds `has` (may be NULL). */
static void expect_fail(const sv_api_env_t *env, int m, const ProtobufCMessage *msg, int code,
                        const char *has) {
    ps_api_reply_t r;
    const int rc = call(env, m, msg, &r);
    if (rc != code || (has && !strstr(r.msg, has)))
        fail_msg("method %d: got %s (%s), want %s with \"%s\"", m, pc_err_name(rc), r.msg,
                 pc_err_name(code), has ? has : "");
    assert_null(r.body);
    ps_api_reply_free(&r);
}

/* ---- the references: the model's own evaluation, and DLRM in double precision ------------------
 */
/* Scores of lines[0..n) by version step's model files, rows from the training servers. */
static void reference(uint64_t step, char (*lines)[512], size_t n, float *probs) {
    char dir[256], path[300], err[200];
    snprintf(dir, sizeof dir, "%s/step-%020" PRIu64, g_f.versions, step);
    pw_model_card_t card;
    snprintf(path, sizeof path, "%s/card", dir);
    assert_int_equal(pw_model_card_read(path, &card, err, sizeof err), 0);
    pw_model_t *m;
    assert_int_equal(pw_model_create(&card.model, pw_backend_cpu(), &m), 0);
    snprintf(path, sizeof path, "%s/model", dir);
    assert_int_equal(pw_model_load(m, path), 0);
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, PW_OPT_ADAM);
    pw_step_config_t sc = {.be = pw_backend_cpu(), .model = m, .ndense = card.ndense, .opt = &oc};
    pw_step_t *st;
    assert_int_equal(pw_step_create(&sc, &st), 0);
    pw_sample_t *s = malloc(sizeof *s);
    const size_t kcap = n * PW_CRITEO_CAT;
    float *labels = calloc(n, sizeof(float)), *dense = calloc(n * PW_CRITEO_DENSE, sizeof(float));
    float *vals = calloc(kcap, sizeof(float));
    uint64_t *keys = calloc(kcap, sizeof(uint64_t));
    uint16_t *fields = calloc(kcap, sizeof(uint16_t));
    size_t *off = calloc(n + 1, sizeof(size_t));
    assert_true(s && labels && dense && vals && keys && fields && off);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(
            pw_parse_line(PW_FMT_CRITEO, NULL, lines[i], strlen(lines[i]), s, err, sizeof err), 0);
        assert_int_equal(s->nkeys, PW_CRITEO_CAT);
        memcpy(dense + i * PW_CRITEO_DENSE, s->dense, PW_CRITEO_DENSE * sizeof(float));
        memcpy(keys + off[i], s->keys, s->nkeys * sizeof(uint64_t));
        memcpy(fields + off[i], s->field, s->nkeys * sizeof(uint16_t));
        memcpy(vals + off[i], s->val, s->nkeys * sizeof(float));
        off[i + 1] = off[i] + s->nkeys;
    }
    pw_batch_t b = {.n = n,
                    .ndense = PW_CRITEO_DENSE,
                    .labels = labels,
                    .dense = dense,
                    .keys = keys,
                    .fields = fields,
                    .vals = vals,
                    .key_off = off};
    float *rows = pw_step_eval_rows(st, off[n]);
    assert_non_null(rows);
    sf_lookup(&g_f, keys, off[n], rows, NULL);
    assert_int_equal(pw_step_eval(st, &b, probs), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(probs[i] > 0 && probs[i] < 1);
    free(s);
    free(labels);
    free(dense);
    free(vals);
    free(keys);
    free(fields);
    free(off);
    pw_step_destroy(st);
    pw_model_destroy(m);
}

/* A layer in double: y = w x + b (w is out x in, row-major), relu when asked. */
static void linear_d(const pw_linear_t *l, const double *x, double *y, bool relu) {
    for (int o = 0; o < l->out; o++) {
        double a = l->b[o];
        for (int i = 0; i < l->in; i++)
            a += (double)l->w[(size_t)o * l->in + i] * x[i];
        y[o] = relu && a < 0 ? 0 : a;
    }
}

/* The same scores as reference() by DLRM's definition in double precision, sample by sample:
 * bottom MLP (ReLU throughout) on the dense values, rows summed per field (x their values),
 * the pairwise dot products of [bottom, fields], the top MLP (ReLU but the last) on [bottom,
 * dots], the sigmoid. */
static void reference_double(uint64_t step, char (*lines)[512], size_t n, double *probs) {
    char path[300], err[200];
    snprintf(path, sizeof path, "%s/step-%020" PRIu64 "/card", g_f.versions, step);
    pw_model_card_t card;
    assert_int_equal(pw_model_card_read(path, &card, err, sizeof err), 0);
    const pw_model_config_t *c = &card.model;
    assert_string_equal(c->name, "dlrm");
    assert_false(c->mean);
    pw_model_t *m;
    assert_int_equal(pw_model_create(c, pw_backend_cpu(), &m), 0);
    snprintf(path, sizeof path, "%s/step-%020" PRIu64 "/model", g_f.versions, step);
    assert_int_equal(pw_model_load(m, path), 0);
    assert_int_equal(m->nparams, c->nbottom + c->ntop);
    enum { W = 1024, F = PW_CRITEO_CAT + 1 };
    const int d = c->dim;
    assert_int_equal(d, SF_DIM);
    assert_int_equal(c->nfields, PW_CRITEO_CAT);
    pw_sample_t *s = malloc(sizeof *s);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(
            pw_parse_line(PW_FMT_CRITEO, NULL, lines[i], strlen(lines[i]), s, err, sizeof err), 0);
        double x[W], y[W], z[F * SF_DIM] = {0};
        for (uint32_t j = 0; j < s->ndense; j++)
            x[j] = s->dense[j];
        for (int l = 0; l < c->nbottom; l++) {
            assert_true(m->params[l].out <= W);
            linear_d(&m->params[l], x, y, true);
            memcpy(x, y, (size_t)m->params[l].out * sizeof(double));
        }
        memcpy(z, x, (size_t)d * sizeof(double)); /* z = [bottom, the fields' pooled rows] */
        float row[SF_DIM];
        for (uint32_t j = 0; j < s->nkeys; j++) {
            sf_lookup(&g_f, &s->keys[j], 1, row, NULL);
            for (int e = 0; e < d; e++)
                z[(1 + s->field[j]) * d + e] += (double)s->val[j] * row[e];
        }
        int k = d; /* x = [bottom, dots] */
        for (int a = 1; a < F; a++)
            for (int b = 0; b < a; b++, k++) {
                double dot = 0;
                for (int e = 0; e < d; e++)
                    dot += z[a * d + e] * z[b * d + e];
                x[k] = dot;
            }
        assert_int_equal(k, m->params[c->nbottom].in);
        for (int l = c->nbottom; l < m->nparams; l++) {
            linear_d(&m->params[l], x, y, l + 1 < m->nparams);
            memcpy(x, y, (size_t)m->params[l].out * sizeof(double));
        }
        probs[i] = 1.0 / (1.0 + exp(-x[0]));
    }
    free(s);
    pw_model_destroy(m);
}

static int group_setup(void **state) {
    (void)state;
    pc_log_set_level(PC_LOG_ERROR);
    sf_create(&g_f);
    sf_version(&g_f, V1, 7, 0);
    sf_version(&g_f, V2, 8, 30); /* 30 more rows: the versions' row counts differ */
    reference(V1, g_f.lines, SF_NLINES, g_ref[0]);
    reference(V2, g_f.lines, SF_NLINES, g_ref[1]);
    reference_double(V1, g_f.lines, SF_NLINES, g_refd[0]);
    reference_double(V2, g_f.lines, SF_NLINES, g_refd[1]);
    double worst = 0;
    for (int v = 0; v < 2; v++)
        for (size_t i = 0; i < SF_NLINES; i++) {
            TU_ASSERT_CLOSE(g_ref[v][i], g_refd[v][i], 0, 1e-6, "version %d line %zu", v, i);
            worst = fmax(worst, fabs(g_ref[v][i] - g_refd[v][i]));
        }
    print_message("the model's evaluation vs double precision: %.2g at most\n", worst);
    size_t differ = 0;
    for (size_t i = 0; i < SF_NLINES; i++)
        differ += g_ref[0][i] != g_ref[1][i];
    assert_true(differ > SF_NLINES / 2); /* the versions tell apart by their scores */
    sv_serve_opts_t o = {
        .name = "ctr", .versions_dir = g_f.versions, .evaluators = 4, .max_batch = SF_BATCH};
    assert_int_equal(sv_serve_create(&o, &g_s), 0);
    g_env = (sv_api_env_t){.serve = g_s,
                           .max_batch = SF_BATCH,
                           .max_keys = 1 << 20,
                           .max_reply = 64 << 20,
                           .start_ns = pc_time_mono_ns()};
    m_predict = method("/emberps.Serving/Predict");
    m_status = method("/emberps.Serving/ServeStatus");
    m_versions = method("/emberps.Serving/ListVersions");
    m_load = method("/emberps.Serving/LoadVersion");
    m_follow = method("/emberps.Serving/Follow");
    m_lookup = method("/emberps.ParameterServer/Lookup");
    m_health = method("/emberps.ParameterServer/Health");
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    sv_serve_destroy(g_s);
    sf_destroy(&g_f);
    return 0;
}

/* ---- requests ---------------------------------------------------------------------------------
 */
typedef struct samples {
    size_t n;
    pw_sample_t *s;
    Emberps__PredictSample *ps;
    Emberps__PredictSample **pp;
    uint32_t *fields; /* n x PW_CRITEO_CAT */
} samples_t;

/* The fixture's lines [from, from + n) as keyed samples (values given for even samples only: 1
 * each, as the lines have). */
static void samples_init(samples_t *x, size_t from, size_t n) {
    x->n = n;
    x->s = calloc(n ? n : 1, sizeof *x->s);
    x->ps = calloc(n ? n : 1, sizeof *x->ps);
    x->pp = calloc(n ? n : 1, sizeof *x->pp);
    x->fields = calloc(n * PW_CRITEO_CAT + 1, sizeof *x->fields);
    assert_true(x->s && x->ps && x->pp && x->fields);
    char err[200];
    for (size_t i = 0; i < n; i++) {
        const char *line = g_f.lines[(from + i) % SF_NLINES];
        pw_sample_t *s = &x->s[i];
        assert_int_equal(pw_parse_line(PW_FMT_CRITEO, NULL, line, strlen(line), s, err, sizeof err),
                         0);
        Emberps__PredictSample *p = &x->ps[i];
        emberps__predict_sample__init(p);
        p->n_dense = s->ndense;
        p->dense = s->dense;
        p->n_keys = s->nkeys;
        p->keys = s->keys;
        p->n_fields = s->nkeys;
        p->fields = x->fields + i * PW_CRITEO_CAT;
        for (size_t j = 0; j < s->nkeys; j++)
            p->fields[j] = s->field[j];
        if (i % 2 == 0) {
            p->n_values = s->nkeys;
            p->values = s->val;
        }
        x->pp[i] = p;
    }
}

static void samples_free(samples_t *x) {
    free(x->s);
    free(x->ps);
    free(x->pp);
    free(x->fields);
}

static char *g_lines[SF_NLINES * 2];

static void lines_request(Emberps__PredictRequest *q, size_t from, size_t n) {
    emberps__predict_request__init(q);
    for (size_t i = 0; i < n; i++)
        g_lines[i] = g_f.lines[(from + i) % SF_NLINES];
    q->n_lines = n;
    q->lines = g_lines;
}

/* Predict q: OK, and the reply (to free by the caller). */
static Emberps__PredictResponse *predict_ok(const sv_api_env_t *env,
                                            const Emberps__PredictRequest *q) {
    ps_api_reply_t r;
    if (call(env, m_predict, &q->base, &r) != 0)
        fail_msg("Predict: %s: %s", pc_err_name(r.err), r.msg);
    Emberps__PredictResponse *a = emberps__predict_response__unpack(NULL, r.len, r.body);
    ps_api_reply_free(&r);
    assert_non_null(a);
    return a;
}

/* The replica answers: the fixture's first lines scored as version `step`. */
static void still_serving(uint64_t step) {
    Emberps__PredictRequest q;
    lines_request(&q, 0, 4);
    Emberps__PredictResponse *a = predict_ok(&g_env, &q);
    assert_int_equal(a->n_scores, 4);
    assert_int_equal(a->model_version, step);
    for (size_t i = 0; i < 4; i++)
        TU_ASSERT_CLOSE(a->scores[i], g_ref[step == V1 ? 0 : 1][i], 0, 1e-6, "score %zu", i);
    emberps__predict_response__free_unpacked(a, NULL);
}

/* Predict from lines and from samples: the reference's scores, the version's stamps. */
static void test_predict(void **state) {
    (void)state;
    Emberps__PredictRequest q;
    lines_request(&q, 0, SF_NLINES);
    Emberps__PredictResponse *a = predict_ok(&g_env, &q);
    assert_int_equal(a->n_scores, SF_NLINES);
    assert_int_equal(a->model_version, V2);
    assert_true(a->pinned);
    assert_int_equal(a->n_sparse_positions, 2); /* one per training server */
    for (size_t i = 0; i < SF_NLINES; i++) {
        TU_ASSERT_CLOSE(a->scores[i], g_ref[1][i], 0, 1e-6, "line %zu", i);
        TU_ASSERT_CLOSE(a->scores[i], g_refd[1][i], 0, 1e-6, "line %zu (double)", i);
    }
    samples_t x;
    samples_init(&x, 0, SF_NLINES);
    Emberps__PredictRequest qs = EMBERPS__PREDICT_REQUEST__INIT;
    qs.model = "ctr";
    qs.n_samples = x.n;
    qs.samples = x.pp;
    Emberps__PredictResponse *b = predict_ok(&g_env, &qs);
    assert_int_equal(b->n_scores, SF_NLINES);
    assert_int_equal(b->model_version, V2);
    assert_true(b->pinned);
    assert_int_equal(b->n_sparse_positions, 2);
    for (size_t i = 0; i < SF_NLINES; i++)
        assert_true(a->scores[i] == b->scores[i]); /* same samples, same batch: bit-equal */
    emberps__predict_response__free_unpacked(a, NULL);
    emberps__predict_response__free_unpacked(b, NULL);
    /* a batch of max_batch samples, and one sample alone: the same scores */
    lines_request(&q, 5, SF_BATCH);
    a = predict_ok(&g_env, &q);
    assert_int_equal(a->n_scores, SF_BATCH);
    for (size_t i = 0; i < SF_BATCH; i++)
        TU_ASSERT_CLOSE(a->scores[i], g_ref[1][(5 + i) % SF_NLINES], 0, 1e-6, "sample %zu", i);
    emberps__predict_response__free_unpacked(a, NULL);
    qs.n_samples = 1;
    qs.samples = &x.pp[3];
    b = predict_ok(&g_env, &qs);
    assert_int_equal(b->n_scores, 1);
    TU_ASSERT_CLOSE(b->scores[0], g_ref[1][3], 0, 1e-6, "one sample");
    emberps__predict_response__free_unpacked(b, NULL);
    /* a sample without features (every field empty): scored */
    x.pp[0]->n_keys = x.pp[0]->n_fields = x.pp[0]->n_values = 0;
    qs.samples = x.pp;
    b = predict_ok(&g_env, &qs);
    assert_int_equal(b->n_scores, 1);
    assert_true(b->scores[0] > 0 && b->scores[0] < 1);
    emberps__predict_response__free_unpacked(b, NULL);
    samples_free(&x);
    ps_api_reply_t r;
    assert_int_equal(call(&g_env, m_health, NULL, &r), 0);
    Emberps__HealthResponse *h = emberps__health_response__unpack(NULL, r.len, r.body);
    assert_non_null(h);
    assert_string_equal(h->status, "serving");
    emberps__health_response__free_unpacked(h, NULL);
    ps_api_reply_free(&r);
}

/* One keyed sample (line i) with one defect applied by the caller. */
static void bad_sample(int code, const char *has, void (*spoil)(Emberps__PredictSample *p)) {
    samples_t x;
    samples_init(&x, 0, 3);
    spoil(x.pp[2]);
    Emberps__PredictRequest q = EMBERPS__PREDICT_REQUEST__INIT;
    q.n_samples = x.n;
    q.samples = x.pp;
    expect_fail(&g_env, m_predict, &q.base, code, has);
    samples_free(&x);
    still_serving(V2);
}

static void spoil_dense_count(Emberps__PredictSample *p) {
    p->n_dense = 12;
}
static void spoil_dense_none(Emberps__PredictSample *p) {
    p->n_dense = 0;
}
static void spoil_dense_nan(Emberps__PredictSample *p) {
    p->dense[4] = NAN;
}
static void spoil_dense_inf(Emberps__PredictSample *p) {
    p->dense[0] = -INFINITY;
}
static void spoil_value_nan(Emberps__PredictSample *p) {
    p->n_values = p->n_keys;
    p->values[7] = NAN;
}
static void spoil_value_inf(Emberps__PredictSample *p) {
    p->n_values = p->n_keys;
    p->values[0] = INFINITY;
}
static void spoil_fields_count(Emberps__PredictSample *p) {
    p->n_fields = p->n_keys - 1;
}
static void spoil_fields_none(Emberps__PredictSample *p) {
    p->n_fields = 0;
}
static void spoil_values_count(Emberps__PredictSample *p) {
    p->n_values = 3;
}
static void spoil_field_model(Emberps__PredictSample *p) {
    p->fields[5] = PW_CRITEO_CAT; /* the model has 26 */
}
static void spoil_field_max(Emberps__PredictSample *p) {
    p->fields[5] = PW_FIELDS_MAX;
}
static void spoil_field_huge(Emberps__PredictSample *p) {
    p->fields[0] = UINT32_MAX;
}

/* Every bad input: its code, and the replica answers the next request. */
static void test_bad_input(void **state) {
    (void)state;
    Emberps__PredictRequest q = EMBERPS__PREDICT_REQUEST__INIT;
    expect_fail(&g_env, m_predict, &q.base, PC_EINVAL, "no samples");
    still_serving(V2);
    samples_t x;
    samples_init(&x, 0, 2);
    lines_request(&q, 0, 2);
    q.n_samples = x.n;
    q.samples = x.pp;
    expect_fail(&g_env, m_predict, &q.base, PC_EINVAL, "not both");
    still_serving(V2);
    samples_free(&x);
    bad_sample(PC_EDIM, "sample 2: 12 dense values", spoil_dense_count);
    bad_sample(PC_EDIM, "sample 2: 0 dense values", spoil_dense_none);
    bad_sample(PC_EINVAL, "dense value 4 is not finite", spoil_dense_nan);
    bad_sample(PC_EINVAL, "dense value 0 is not finite", spoil_dense_inf);
    bad_sample(PC_EINVAL, "value 7 is not finite", spoil_value_nan);
    bad_sample(PC_EINVAL, "value 0 is not finite", spoil_value_inf);
    bad_sample(PC_EINVAL, "sample 2: 25 fields for 26 keys", spoil_fields_count);
    bad_sample(PC_EINVAL, "sample 2: 0 fields for 26 keys", spoil_fields_none);
    bad_sample(PC_EINVAL, "sample 2: 3 values for 26 keys", spoil_values_count);
    bad_sample(PC_EINVAL, "the model has 26 fields", spoil_field_model);
    bad_sample(PC_EINVAL, "out of range", spoil_field_max);
    bad_sample(PC_EINVAL, "out of range", spoil_field_huge);
    /* more samples than max_batch (lines and samples) */
    lines_request(&q, 0, SF_BATCH + 1);
    expect_fail(&g_env, m_predict, &q.base, PC_ETOOBIG, "over max_batch");
    samples_init(&x, 0, SF_BATCH + 1);
    Emberps__PredictRequest qs = EMBERPS__PREDICT_REQUEST__INIT;
    qs.n_samples = x.n;
    qs.samples = x.pp;
    expect_fail(&g_env, m_predict, &qs.base, PC_ETOOBIG, "over max_batch");
    samples_free(&x);
    still_serving(V2);
    /* more features than max_keys: 4 samples of 26 over 100 */
    sv_api_env_t small = g_env;
    small.max_keys = 100;
    lines_request(&q, 0, 4);
    expect_fail(&small, m_predict, &q.base, PC_ETOOBIG, "max_keys 100");
    samples_init(&x, 0, 4);
    qs.n_samples = x.n;
    qs.samples = x.pp;
    expect_fail(&small, m_predict, &qs.base, PC_ETOOBIG, "sample 3: more than 100 features");
    samples_free(&x);
    lines_request(&q, 0, 3); /* 78 features: under it */
    Emberps__PredictResponse *a = predict_ok(&small, &q);
    assert_int_equal(a->n_scores, 3);
    emberps__predict_response__free_unpacked(a, NULL);
    /* more bytes of rows than max_reply: 78 rows of 64 bytes over 4096 (52: under it) */
    small = g_env;
    small.max_reply = 4096;
    expect_fail(&small, m_predict, &q.base, PC_ETOOBIG,
                "4992 bytes of rows, over max_reply_bytes 4096");
    lines_request(&q, 0, 2);
    a = predict_ok(&small, &q);
    assert_int_equal(a->n_scores, 2);
    emberps__predict_response__free_unpacked(a, NULL);
    /* an unknown model */
    lines_request(&q, 0, 2);
    q.model = "ranker";
    expect_fail(&g_env, m_predict, &q.base, PC_ENOTFOUND, "unknown model 'ranker'");
    q.model = (char *)protobuf_c_empty_string;
    still_serving(V2);
    /* a malformed line, named by its sample; a line of the wrong shape */
    char *bad[3] = {g_f.lines[0], "1\t2\tnot a criteo line", g_f.lines[2]};
    q.n_lines = 3;
    q.lines = bad;
    expect_fail(&g_env, m_predict, &q.base, PC_EPARSE, "sample 1: ");
    char nan_line[600];
    snprintf(nan_line, sizeof nan_line, "%s", g_f.lines[4]);
    char *tab = strchr(nan_line, '\t');
    memcpy(tab + 1, "nan", 3); /* the first count */
    bad[1] = g_f.lines[1];
    bad[2] = nan_line;
    expect_fail(&g_env, m_predict, &q.base, PC_EPARSE, "sample 2: ");
    bad[2] = "";
    expect_fail(&g_env, m_predict, &q.base, PC_EPARSE, "sample 2: ");
    still_serving(V2);
    /* malformed protobuf, for every method that reads a request */
    const uint8_t junk[] = {0x0a, 0xff, 0x01, 'x'}; /* a field of 255 bytes, 1 there */
    const int readers[] = {m_predict, m_lookup, m_load};
    for (size_t i = 0; i < 3; i++) {
        ps_api_reply_t r;
        sv_api_call(&g_env, readers[i], junk, sizeof junk, true, &r);
        assert_int_equal(r.err, PC_EPARSE);
        assert_int_equal(r.status, PS_ST_INVALID_ARGUMENT);
        assert_non_null(strstr(r.msg, "malformed"));
        ps_api_reply_free(&r);
    }
    still_serving(V2);
}

/* Lookup answers from the replica, and refuses what it must. */
static void test_lookup(void **state) {
    (void)state;
    enum { N = 40 };
    uint64_t keys[N];
    pw_sample_t *s = malloc(sizeof *s);
    char err[200];
    for (size_t i = 0; i < N; i++) { /* keys of the lines (most trained, some not), then others */
        if (i < 30) {
            assert_int_equal(pw_parse_line(PW_FMT_CRITEO, NULL, g_f.lines[i], strlen(g_f.lines[i]),
                                           s, err, sizeof err),
                             0);
            keys[i] = s->keys[i % PW_CRITEO_CAT];
        } else {
            keys[i] = 0x5eed0000u + i;
        }
    }
    free(s);
    float want[N * SF_DIM];
    uint8_t wfound[N];
    sf_lookup(&g_f, keys, N, want, wfound);
    Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
    q.table = SF_TABLE;
    q.n_keys = N;
    q.keys = keys;
    ps_api_reply_t r;
    assert_int_equal(call(&g_env, m_lookup, &q.base, &r), 0);
    Emberps__LookupResponse *a = emberps__lookup_response__unpack(NULL, r.len, r.body);
    ps_api_reply_free(&r);
    assert_non_null(a);
    assert_int_equal(a->dim, SF_DIM);
    assert_int_equal(a->rows.len, sizeof want);
    assert_int_equal(a->found.len, N);
    assert_memory_equal(a->rows.data, want, sizeof want);
    assert_memory_equal(a->found.data, wfound, N);
    size_t nfound = 0;
    for (size_t i = 0; i < N; i++)
        nfound += wfound[i];
    assert_true(nfound > 10 && nfound < N); /* both kinds were asked */
    emberps__lookup_response__free_unpacked(a, NULL);
    q.n_keys = 0; /* no keys: an empty answer */
    assert_int_equal(call(&g_env, m_lookup, &q.base, &r), 0);
    ps_api_reply_free(&r);
    q.n_keys = N;
    q.table = "nope";
    expect_fail(&g_env, m_lookup, &q.base, PC_ENOTFOUND, "no table nope");
    q.table = (char *)protobuf_c_empty_string;
    expect_fail(&g_env, m_lookup, &q.base, PC_EINVAL, "table name missing");
    q.table = SF_TABLE;
    sv_api_env_t small = g_env;
    small.max_keys = N - 1;
    expect_fail(&small, m_lookup, &q.base, PC_ETOOBIG, "too many keys");
    small = g_env;
    small.max_reply = 1024; /* 40 rows of 64 bytes are over it */
    expect_fail(&small, m_lookup, &q.base, PC_ETOOBIG, NULL);
    still_serving(V2);
}

/* The ParameterServer methods that write, the Coordinator's, and paths that are none. */
static void test_refused_methods(void **state) {
    (void)state;
    const ps_api_method_t writes[] = {PS_API_PULL,       PS_API_PUSH,        PS_API_CREATE_TABLE,
                                      PS_API_DROP_TABLE, PS_API_RESET_TABLE, PS_API_CHECKPOINT,
                                      PS_API_RESTORE};
    for (size_t i = 0; i < sizeof writes / sizeof writes[0]; i++) {
        const char *p = ps_api_path(writes[i]);
        const int m = sv_api_method(p, strlen(p));
        assert_int_equal(m, (int)writes[i]);
        expect_fail(&g_env, m, NULL, PC_EREADONLY, "read-only replica");
        const uint8_t junk[] = {0x0a, 0x03, 'e', 'm', 'b', 0x12, 0xff};
        ps_api_reply_t r;
        sv_api_call(&g_env, m, junk, sizeof junk, true, &r);
        assert_int_equal(r.err, PC_EREADONLY);
        assert_int_equal(r.status, PS_ST_FAILED_PRECONDITION);
        ps_api_reply_free(&r);
    }
    assert_true(sv_api_is_admin(m_load) && sv_api_is_admin(m_follow));
    assert_false(sv_api_is_admin(m_predict) || sv_api_is_admin(m_lookup));
    const char *none[] = {"/emberps.Serving/Nope",   "/emberps.Serving/",
                          "/emberps.Serving/Predic", "/emberps.Serving/PredictX",
                          "/other.Serving/Predict",  ""};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
        assert_int_equal(sv_api_method(none[i], strlen(none[i])), -1);
    expect_fail(&g_env, -1, NULL, PC_EUNSUPPORTED, NULL);
    expect_fail(&g_env, 1000, NULL, PC_EUNSUPPORTED, NULL);
    const char *kv = "/emberps.Coordinator/KvGet";
    expect_fail(&g_env, sv_api_method(kv, strlen(kv)), NULL, PC_EUNSUPPORTED, "not served");
    still_serving(V2);
}

/* ---- versions ---------------------------------------------------------------------------------
 */
static Emberps__ServeStatusResponse *status(void) {
    ps_api_reply_t r;
    assert_int_equal(call(&g_env, m_status, NULL, &r), 0);
    Emberps__ServeStatusResponse *a = emberps__serve_status_response__unpack(NULL, r.len, r.body);
    ps_api_reply_free(&r);
    assert_non_null(a);
    return a;
}

static int load(uint64_t step, ps_api_reply_t *r) {
    Emberps__LoadVersionRequest q = EMBERPS__LOAD_VERSION_REQUEST__INIT;
    q.step = step;
    return call(&g_env, m_load, &q.base, r);
}

static void load_ok(uint64_t step) {
    ps_api_reply_t r;
    if (load(step, &r))
        fail_msg("LoadVersion %" PRIu64 ": %s: %s", step, pc_err_name(r.err), r.msg);
    Emberps__LoadVersionResponse *a = emberps__load_version_response__unpack(NULL, r.len, r.body);
    ps_api_reply_free(&r);
    assert_non_null(a);
    assert_int_equal(a->step, step);
    assert_true(a->seconds >= 0);
    emberps__load_version_response__free_unpacked(a, NULL);
}

/* ListVersions: the steps, oldest first, `loaded` on the one served. */
static void expect_versions(const uint64_t *steps, size_t n, uint64_t loaded) {
    ps_api_reply_t r;
    assert_int_equal(call(&g_env, m_versions, NULL, &r), 0);
    Emberps__ListVersionsResponse *a = emberps__list_versions_response__unpack(NULL, r.len, r.body);
    ps_api_reply_free(&r);
    assert_non_null(a);
    assert_int_equal(a->n_versions, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a->versions[i]->step, steps[i]);
        assert_int_equal(a->versions[i]->loaded, steps[i] == loaded);
        assert_true(a->versions[i]->created_unix_ns > 0);
    }
    emberps__list_versions_response__free_unpacked(a, NULL);
}

static void test_versions(void **state) {
    (void)state;
    Emberps__ServeStatusResponse *st = status();
    assert_string_equal(st->model, "ctr");
    assert_int_equal(st->model_version, V2);
    assert_true(st->pinned);
    assert_int_equal(st->n_sources, 0);
    assert_int_equal(st->refused_versions, 0);
    const uint64_t rows2 = st->rows, swaps = st->swaps, predictions = st->predictions;
    assert_true(predictions > 0);
    emberps__serve_status_response__free_unpacked(st, NULL);
    const uint64_t two[] = {V1, V2};
    expect_versions(two, 2, V2);
    /* another step: served at once, with its own rows */
    load_ok(V1);
    still_serving(V1);
    st = status();
    assert_int_equal(st->model_version, V1);
    assert_true(st->pinned);
    assert_int_equal(st->rows + 30, rows2);
    assert_int_equal(st->swaps, swaps + 1);
    assert_int_equal(st->predictions, predictions + 4);
    emberps__serve_status_response__free_unpacked(st, NULL);
    expect_versions(two, 2, V1);
    /* a step that does not exist: not found, not a refusal */
    ps_api_reply_t r;
    assert_int_equal(load(12345, &r), PC_ENOTFOUND);
    assert_non_null(strstr(r.msg, "12345"));
    ps_api_reply_free(&r);
    still_serving(V1);
    /* a damaged version: its model file's bytes flipped */
    sf_version(&g_f, VBAD, 9, 0);
    char path[300];
    sf_version_file(&g_f, VBAD, "model", path, sizeof path);
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 64, SEEK_SET), 0);
    uint8_t b[8];
    assert_int_equal(fread(b, 1, sizeof b, fp), sizeof b);
    for (size_t i = 0; i < sizeof b; i++)
        b[i] ^= 0x5a;
    assert_int_equal(fseek(fp, 64, SEEK_SET), 0);
    assert_int_equal(fwrite(b, 1, sizeof b, fp), sizeof b);
    fclose(fp);
    assert_int_equal(load(VBAD, &r), PC_ECORRUPT);
    ps_api_reply_free(&r);
    still_serving(V1);
    st = status();
    assert_int_equal(st->model_version, V1);
    assert_int_equal(st->refused_versions, 1);
    assert_non_null(strstr(st->last_refusal, "version 300"));
    emberps__serve_status_response__free_unpacked(st, NULL);
    /* the newest (step 0) is the damaged one: refused again */
    assert_int_equal(load(0, &r), PC_ECORRUPT);
    ps_api_reply_free(&r);
    still_serving(V1);
    const uint64_t three[] = {V1, V2, VBAD};
    expect_versions(three, 3, V1);
    /* Follow: this replica follows no training servers */
    expect_fail(&g_env, m_follow, NULL, PC_ESTATE, "--follow");
    st = status();
    assert_int_equal(st->refused_versions, 2);
    assert_int_equal(st->swaps, swaps + 1);
    assert_true(st->pinned);
    emberps__serve_status_response__free_unpacked(st, NULL);
    load_ok(V2);
    still_serving(V2);
    /* a version of another shape (wider top layers): refused, its clients' requests would not
     * fit; the served model stays */
    assert_true(g_f.card.model.ntop >= 1);
    g_f.card.model.top[0] += 8;
    sf_version(&g_f, VSHAPE, 10, 0);
    g_f.card.model.top[0] -= 8;
    assert_int_equal(load(VSHAPE, &r), PC_EDIM);
    assert_non_null(strstr(r.msg, "top widths"));
    ps_api_reply_free(&r);
    still_serving(V2);
}

/* ---- swaps under load -------------------------------------------------------------------------
 */
enum { THREADS = 4, SWAPS = 8 };

typedef struct loader {
    pthread_t th;
    int id;
    _Atomic int *stop;
    size_t calls, failures, wrong, seen[2];
} loader_t;

static void *predict_loop(void *arg) {
    loader_t *l = arg;
    const size_t from = (size_t)l->id * 5, n = 8;
    char *lines[8];
    for (size_t i = 0; i < n; i++)
        lines[i] = g_f.lines[(from + i) % SF_NLINES];
    Emberps__PredictRequest q = EMBERPS__PREDICT_REQUEST__INIT;
    q.n_lines = n;
    q.lines = lines;
    const size_t len = protobuf_c_message_get_packed_size(&q.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&q.base, buf);
    while (!*l->stop || l->calls < 4) {
        ps_api_reply_t r;
        sv_api_call(&g_env, m_predict, buf, len, true, &r);
        l->calls++;
        Emberps__PredictResponse *a =
            r.err ? NULL : emberps__predict_response__unpack(NULL, r.len, r.body);
        if (!a) {
            l->failures++;
        } else if (a->model_version != V1 && a->model_version != V2) {
            l->wrong++;
        } else {
            const int v = a->model_version == V1 ? 0 : 1;
            l->seen[v]++;
            for (size_t i = 0; i < n; i++)
                if (a->n_scores != n ||
                    fabs(a->scores[i] - g_ref[v][(from + i) % SF_NLINES]) > 1e-6)
                    l->wrong++;
        }
        emberps__predict_response__free_unpacked(a, NULL);
        ps_api_reply_free(&r);
    }
    free(buf);
    return NULL;
}

static void test_swap_under_load(void **state) {
    (void)state;
    _Atomic int stop = 0;
    loader_t l[THREADS];
    for (int i = 0; i < THREADS; i++) {
        l[i] = (loader_t){.id = i, .stop = &stop};
        assert_int_equal(pthread_create(&l[i].th, NULL, predict_loop, &l[i]), 0);
    }
    for (int k = 0; k < SWAPS; k++)
        load_ok(k % 2 ? V2 : V1);
    stop = 1;
    size_t calls = 0, seen[2] = {0, 0};
    for (int i = 0; i < THREADS; i++) {
        pthread_join(l[i].th, NULL);
        assert_int_equal(l[i].failures, 0);
        assert_int_equal(l[i].wrong, 0);
        calls += l[i].calls;
        seen[0] += l[i].seen[0];
        seen[1] += l[i].seen[1];
    }
    print_message("swap under load: %zu calls, %zu of version %d, %zu of %d, %d swaps\n", calls,
                  seen[0], V1, seen[1], V2, SWAPS);
    assert_true(seen[0] > 0 && seen[1] > 0); /* requests ran across the swaps, both versions */
    still_serving(V2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predict),  cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_lookup),   cmocka_unit_test(test_refused_methods),
        cmocka_unit_test(test_versions), cmocka_unit_test(test_swap_under_load),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
