/* sv_api.c: see sv_api.h. One function per method: unpack (protobuf-c, NULL on malformed
 * input), check, run, pack; Predict's batch is built in one growing set of arrays per call. */
#include "sv_api.h"

#include "emberps.pb-c.h"
#include "pc_error.h"
#include "pc_time.h"
#include "pc_wire.h"
#include "pw_parse.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SERVING "/emberps.Serving/"

enum {
    SV_PREDICT = PS_API_NMETHODS, /* after ParameterServer's and Coordinator's indexes */
    SV_STATUS,
    SV_LIST_VERSIONS,
    SV_LOAD_VERSION,
    SV_FOLLOW,
    SV_END
};

static const char *const k_paths[SV_END - SV_PREDICT] = {SERVING "Predict", SERVING "ServeStatus",
                                                         SERVING "ListVersions",
                                                         SERVING "LoadVersion", SERVING "Follow"};

int sv_api_method(const char *path, size_t len) {
    for (int m = SV_PREDICT; m < SV_END; m++) {
        const char *p = k_paths[m - SV_PREDICT];
        if (strlen(p) == len && memcmp(path, p, len) == 0)
            return m;
    }
    return ps_api_method(path, len);
}

bool sv_api_is_admin(int m) {
    return m == SV_LOAD_VERSION || m == SV_FOLLOW || (m < PS_API_NMETHODS && ps_api_is_admin(m));
}

/* ---- Predict: the batch ---------------------------------------------------------------------
 * Arrays of a pw_batch_t grown as samples are added. */
typedef struct bbuf {
    pw_batch_t b;
    size_t kcap; /* keys, fields, vals hold kcap */
} bbuf_t;

static void bbuf_free(bbuf_t *x) {
    free(x->b.labels);
    free(x->b.dense);
    free(x->b.keys);
    free(x->b.fields);
    free(x->b.vals);
    free(x->b.key_off);
}

/* Room for `more` features after the ones held. */
static int bbuf_reserve(bbuf_t *x, size_t more) {
    const size_t nk = x->b.key_off[x->b.n], need = nk + more;
    if (need <= x->kcap)
        return 0;
    size_t cap = x->kcap ? x->kcap : 256;
    while (cap < need)
        cap *= 2;
    uint64_t *k = realloc(x->b.keys, cap * sizeof *k);
    if (k)
        x->b.keys = k;
    uint16_t *f = realloc(x->b.fields, cap * sizeof *f);
    if (f)
        x->b.fields = f;
    float *v = realloc(x->b.vals, cap * sizeof *v);
    if (v)
        x->b.vals = v;
    if (!k || !f || !v)
        return PC_ENOMEM;
    x->kcap = cap;
    return 0;
}

/* Room for n samples of ndense values, and the feature arrays allocated (never NULL: the step
 * stages them also when no sample has a feature). */
static int bbuf_init(bbuf_t *x, size_t n, size_t ndense) {
    memset(x, 0, sizeof *x);
    x->b.ndense = ndense;
    x->b.labels = calloc(n ? n : 1, sizeof(float));
    x->b.dense = calloc(n * ndense + 1, sizeof(float));
    x->b.key_off = calloc(n + 1, sizeof(size_t));
    return x->b.labels && x->b.dense && x->b.key_off ? bbuf_reserve(x, 1) : PC_ENOMEM;
}

/* Append one sample: its dense values and features (vals NULL: 1 each). */
static int bbuf_add(bbuf_t *x, const float *dense, const uint64_t *keys, const uint16_t *fields,
                    const float *vals, size_t nk) {
    int rc = bbuf_reserve(x, nk);
    if (rc)
        return rc;
    const size_t s = x->b.n, at = x->b.key_off[s];
    if (x->b.ndense)
        memcpy(x->b.dense + s * x->b.ndense, dense, x->b.ndense * sizeof(float));
    if (nk) { /* a sample without features may come with NULL arrays (protobuf-c) */
        memcpy(x->b.keys + at, keys, nk * sizeof *keys);
        memcpy(x->b.fields + at, fields, nk * sizeof *fields);
    }
    for (size_t j = 0; j < nk; j++)
        x->b.vals[at + j] = vals ? vals[j] : 1.0f;
    x->b.key_off[s + 1] = at + nk;
    x->b.n++;
    return 0;
}

/* Samples given as lines of the card's format: parsed as the worker's reader parses them. */
static int from_lines(const sv_api_env_t *env, const pw_model_card_t *c, const pw_csv_spec_t *csv,
                      char **lines, size_t n, bbuf_t *x, ps_api_reply_t *r) {
    pw_sample_t *s = malloc(sizeof *s);
    int rc = s ? 0 : PC_ENOMEM;
    char err[200];
    for (size_t i = 0; !rc && i < n; i++) {
        if ((rc = pw_parse_line(c->format, csv, lines[i], strlen(lines[i]), s, err, sizeof err))) {
            ps_api_fail(r, rc, "sample %zu: %s", i, err);
            break;
        }
        if (s->ndense != (uint32_t)c->ndense) {
            ps_api_fail(r, rc = PC_EDIM, "sample %zu: %u dense values, the model takes %d", i,
                        s->ndense, c->ndense);
            break;
        }
        if (x->b.key_off[x->b.n] + s->nkeys > env->max_keys) {
            ps_api_fail(r, rc = PC_ETOOBIG, "more than max_keys %u features in one request",
                        env->max_keys);
            break;
        }
        if ((rc = bbuf_add(x, s->dense, s->keys, s->field, s->val, s->nkeys)))
            ps_api_fail(r, rc, "out of memory");
    }
    free(s);
    if (!s)
        ps_api_fail(r, PC_ENOMEM, "out of memory");
    return rc;
}

/* Samples with their keys derived by the caller. */
static int from_samples(const sv_api_env_t *env, const pw_model_card_t *c,
                        Emberps__PredictSample **sv, size_t n, bbuf_t *x, ps_api_reply_t *r) {
    uint16_t *fields = NULL;
    size_t fcap = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        const Emberps__PredictSample *p = sv[i];
        const size_t nd = (size_t)c->ndense, nk = p->n_keys;
        if (p->n_dense != nd) {
            ps_api_fail(r, rc = PC_EDIM, "sample %zu: %zu dense values, the model takes %zu", i,
                        p->n_dense, nd);
            break;
        }
        for (size_t j = 0; !rc && j < nd; j++)
            if (!isfinite(p->dense[j]))
                ps_api_fail(r, rc = PC_EINVAL, "sample %zu: dense value %zu is not finite", i, j);
        if (!rc && p->n_fields != nk)
            ps_api_fail(r, rc = PC_EINVAL, "sample %zu: %zu fields for %zu keys", i, p->n_fields,
                        nk);
        if (!rc && p->n_values && p->n_values != nk)
            ps_api_fail(r, rc = PC_EINVAL, "sample %zu: %zu values for %zu keys", i, p->n_values,
                        nk);
        for (size_t j = 0; !rc && j < p->n_values; j++)
            if (!isfinite(p->values[j]))
                ps_api_fail(r, rc = PC_EINVAL, "sample %zu: value %zu is not finite", i, j);
        if (!rc && (nk > PW_KEYS_MAX || x->b.key_off[x->b.n] + nk > env->max_keys))
            ps_api_fail(r, rc = PC_ETOOBIG, "sample %zu: more than %u features", i,
                        nk > PW_KEYS_MAX ? PW_KEYS_MAX : env->max_keys);
        if (!rc && nk > fcap) {
            uint16_t *f = realloc(fields, nk * sizeof *f);
            if (!f)
                ps_api_fail(r, rc = PC_ENOMEM, "out of memory");
            else
                fields = f, fcap = nk;
        }
        for (size_t j = 0; !rc && j < nk; j++) {
            if (p->fields[j] >= PW_FIELDS_MAX)
                ps_api_fail(r, rc = PC_EINVAL, "sample %zu: field %u out of range", i,
                            p->fields[j]);
            else
                fields[j] = (uint16_t)p->fields[j];
        }
        if (!rc &&
            (rc = bbuf_add(x, p->dense, p->keys, fields, p->n_values ? p->values : NULL, nk)))
            ps_api_fail(r, rc, "out of memory");
    }
    free(fields);
    return rc;
}

static void do_predict(const sv_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__PredictRequest *q =
        emberps__predict_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed PredictRequest");
        return;
    }
    const size_t n = q->n_lines ? q->n_lines : q->n_samples;
    sv_served_t *x = sv_serve_acquire(env->serve);
    sv_model_t *m = sv_served_model(x);
    bbuf_t bb = {0};
    float *scores = NULL;
    uint64_t pos[SV_SERVE_SOURCES_MAX];
    if (q->model[0] && strcmp(q->model, sv_serve_name(env->serve)) != 0) {
        ps_api_fail(r, PC_ENOTFOUND, "unknown model '%.64s' (this replica serves '%.64s')",
                    q->model, sv_serve_name(env->serve));
    } else if (q->n_lines && q->n_samples) {
        ps_api_fail(r, PC_EINVAL, "give samples as lines or as samples, not both");
    } else if (!n) {
        ps_api_fail(r, PC_EINVAL, "no samples");
    } else if (n > env->max_batch) {
        ps_api_fail(r, PC_ETOOBIG, "%zu samples, over max_batch %u", n, env->max_batch);
    } else if (!m) {
        ps_api_fail(r, PC_EUNAVAIL, "no dense model yet (none published or loaded)");
    } else {
        const pw_model_card_t *c = sv_model_card(m);
        int rc = bbuf_init(&bb, n, (size_t)c->ndense);
        if (rc)
            ps_api_fail(r, rc, "out of memory");
        else if (q->n_lines)
            rc = from_lines(env, c, sv_model_csv(m), q->lines, n, &bb, r);
        else
            rc = from_samples(env, c, q->samples, n, &bb, r);
        char bad[200];
        if (!rc && (rc = sv_model_check(m, &bb.b, bad, sizeof bad)))
            ps_api_fail(r, rc, "%s", bad);
        if (!rc && !(scores = malloc(n * sizeof *scores)))
            ps_api_fail(r, rc = PC_ENOMEM, "out of memory");
        size_t npos = 0;
        /* the rows a request gathers are bounded as a Lookup's reply: an evaluator keeps its
         * row buffer at the largest it held (max_keys alone let one request pin 384 MiB of
         * dim-64 rows in each evaluator) */
        const size_t nk = rc ? 0 : bb.b.key_off[n];
        const uint64_t gather = env->max_gather ? env->max_gather : env->max_reply;
        if (!rc && (uint64_t)nk * c->row_dim * sizeof(float) > gather)
            ps_api_fail(
                r, rc = PC_ETOOBIG,
                "%zu features of %d floats are %llu bytes of rows, over max_reply_bytes %llu", nk,
                c->row_dim, (unsigned long long)((uint64_t)nk * c->row_dim * sizeof(float)),
                (unsigned long long)gather);
        if (!rc) {
            npos = sv_served_positions(x, pos, SV_SERVE_SOURCES_MAX); /* before the rows */
            sv_eval_t *e = sv_model_acquire(m);
            float *rows = sv_eval_rows(e, nk);
            char why[200] = "";
            if (!rows)
                ps_api_fail(r, rc = PC_ENOMEM, "out of memory");
            else if ((rc = sv_served_lookup(x, c->table_name, bb.b.keys, nk, rows,
                                            nk * (size_t)c->row_dim, NULL)))
                ps_api_fail(r, rc, "table %s: %s", c->table_name, pc_strerror(rc));
            else if ((rc = sv_eval_run(e, &bb.b, scores, why, sizeof why)))
                ps_api_fail(r, rc, "%s", why);
            sv_model_release(m, e);
        }
        if (!rc) {
            Emberps__PredictResponse a = EMBERPS__PREDICT_RESPONSE__INIT;
            a.n_scores = n;
            a.scores = scores;
            a.model_version = sv_model_step(m);
            a.n_sparse_positions = npos;
            a.sparse_positions = pos;
            a.pinned = sv_served_pinned(x);
            ps_api_reply_pack(r, &a.base);
            sv_serve_count(env->serve, n);
        }
    }
    sv_serve_release(env->serve, x);
    free(scores);
    bbuf_free(&bb);
    emberps__predict_request__free_unpacked(q, NULL);
}

/* ---- the replica's rows ---------------------------------------------------------------------- */
static void do_lookup(const sv_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__LookupRequest *q =
        emberps__lookup_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed LookupRequest");
        return;
    }
    sv_served_t *x = sv_serve_acquire(env->serve);
    const size_t n = q->n_keys;
    const uint32_t dim = q->table[0] ? sv_served_dim(x, q->table) : 0;
    char msg[sizeof r->msg];
    float *rows = NULL;
    uint8_t *found = NULL;
    if (!q->table[0]) {
        ps_api_fail(r, PC_EINVAL, "table name missing");
    } else if (n > env->max_keys) {
        ps_api_fail(r, PC_ETOOBIG, "too many keys in one request");
    } else if (!dim) {
        ps_api_fail(r, PC_ENOTFOUND, "no table %.64s", q->table);
    } else if (pc_wire_reply_check(PC_OP_LOOKUP, n, dim, env->max_reply, msg, sizeof msg)) {
        ps_api_fail(r, PC_ETOOBIG, "%s", msg);
    } else if (!(rows = malloc(n * dim * sizeof *rows + 1)) || !(found = malloc(n + 1))) {
        ps_api_fail(r, PC_ENOMEM, "out of memory");
    } else {
        int rc = sv_served_lookup(x, q->table, q->keys, n, rows, n * dim, found);
        if (rc) {
            ps_api_fail(r, rc, "%s: %s", q->table, pc_strerror(rc));
        } else {
            Emberps__LookupResponse a = EMBERPS__LOOKUP_RESPONSE__INIT;
            a.dim = dim;
            a.rows = (ProtobufCBinaryData){n * dim * sizeof(float), (uint8_t *)rows};
            a.found = (ProtobufCBinaryData){n, found};
            ps_api_reply_pack(r, &a.base);
        }
    }
    sv_serve_release(env->serve, x);
    free(rows);
    free(found);
    emberps__lookup_request__free_unpacked(q, NULL);
}

/* Whether a dense model is served (cheap: no status walk over the replica's tables). */
static bool has_model(const sv_api_env_t *env) {
    sv_served_t *x = sv_serve_acquire(env->serve);
    const bool yes = sv_served_model(x) != NULL;
    sv_serve_release(env->serve, x);
    return yes;
}

static void do_health(const sv_api_env_t *env, ps_api_reply_t *r) {
    Emberps__HealthResponse a = EMBERPS__HEALTH_RESPONSE__INIT;
    a.status = has_model(env) ? "serving" : "no model yet";
    a.uptime_s = (pc_time_mono_ns() - env->start_ns) / 1000000000u;
    ps_api_reply_pack(r, &a.base);
}

/* ---- administration and status ----------------------------------------------------------------
 */
static void do_status(const sv_api_env_t *env, ps_api_reply_t *r) {
    sv_serve_status_t st;
    sv_source_status_t *src = calloc(SV_SERVE_SOURCES_MAX, sizeof *src);
    Emberps__ServeSource *so = calloc(SV_SERVE_SOURCES_MAX, sizeof *so);
    Emberps__ServeSource **sp = calloc(SV_SERVE_SOURCES_MAX, sizeof *sp);
    if (!src || !so || !sp) {
        ps_api_fail(r, PC_ENOMEM, "out of memory");
    } else {
        sv_serve_status(env->serve, &st, src, SV_SERVE_SOURCES_MAX);
        const size_t ns = st.nsources < SV_SERVE_SOURCES_MAX ? st.nsources : SV_SERVE_SOURCES_MAX;
        for (size_t i = 0; i < ns; i++) {
            emberps__serve_source__init(&so[i]);
            so[i].server = src[i].server;
            so[i].state = src[i].state;
            so[i].table_uid = src[i].uid;
            so[i].position = src[i].position;
            so[i].head = src[i].head;
            so[i].lag_entries = src[i].lag_entries;
            so[i].lag_ms = src[i].lag_ms;
            so[i].rows_applied = src[i].rows_applied;
            so[i].rescans = src[i].rescans;
            so[i].error = src[i].error;
            sp[i] = &so[i];
        }
        Emberps__ServeStatusResponse a = EMBERPS__SERVE_STATUS_RESPONSE__INIT;
        a.model = (char *)sv_serve_name(env->serve);
        a.model_version = st.model_step;
        a.pinned = st.pinned;
        a.n_sources = ns;
        a.sources = sp;
        a.rows = st.rows;
        a.predictions = st.predictions;
        a.swaps = st.swaps;
        a.refused_versions = st.refused;
        a.last_refusal = st.last_refusal;
        a.map_version = st.map_version;
        a.relayouts = st.relayouts;
        ps_api_reply_pack(r, &a.base);
    }
    free(src);
    free(so);
    free(sp);
}

static void do_versions(const sv_api_env_t *env, ps_api_reply_t *r) {
    const size_t cap = 4096;
    sv_version_info_t *v = calloc(cap, sizeof *v);
    Emberps__ServeVersion *sv = calloc(cap, sizeof *sv);
    Emberps__ServeVersion **sp = calloc(cap, sizeof *sp);
    if (!v || !sv || !sp) {
        ps_api_fail(r, PC_ENOMEM, "out of memory");
    } else {
        size_t n = sv_serve_versions(env->serve, v, cap);
        n = n < cap ? n : cap;
        for (size_t i = 0; i < n; i++) {
            emberps__serve_version__init(&sv[i]);
            sv[i].step = v[i].step;
            sv[i].loaded = v[i].loaded;
            sv[i].created_unix_ns = v[i].created_unix_ns;
            sp[i] = &sv[i];
        }
        Emberps__ListVersionsResponse a = EMBERPS__LIST_VERSIONS_RESPONSE__INIT;
        a.n_versions = n;
        a.versions = sp;
        ps_api_reply_pack(r, &a.base);
    }
    free(v);
    free(sv);
    free(sp);
}

static void do_load(const sv_api_env_t *env, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    Emberps__LoadVersionRequest *q =
        emberps__load_version_request__unpack(ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed LoadVersionRequest");
        return;
    }
    char why[200] = "";
    uint64_t step = 0, t0 = pc_time_mono_ns();
    int rc = sv_serve_pin(env->serve, q->step, &step, why, sizeof why);
    if (rc) {
        ps_api_fail(r, rc, "%s", why[0] ? why : pc_strerror(rc));
    } else {
        Emberps__LoadVersionResponse a = EMBERPS__LOAD_VERSION_RESPONSE__INIT;
        a.step = step;
        a.seconds = (double)(pc_time_mono_ns() - t0) / 1e9;
        ps_api_reply_pack(r, &a.base);
    }
    emberps__load_version_request__free_unpacked(q, NULL);
}

static void do_follow(const sv_api_env_t *env, ps_api_reply_t *r) {
    char why[200] = "";
    uint64_t step = 0;
    int rc = sv_serve_follow(env->serve, &step, why, sizeof why);
    if (rc) {
        ps_api_fail(r, rc, "%s", why[0] ? why : pc_strerror(rc));
    } else {
        Emberps__FollowResponse a = EMBERPS__FOLLOW_RESPONSE__INIT;
        a.model_version = step;
        ps_api_reply_pack(r, &a.base);
    }
}

bool sv_api_ready(void *ctx, const char *service) {
    const sv_api_env_t *env = ctx;
    if (strcmp(service, "emberps.Serving") != 0)
        return true; /* "" (the process answers: liveness) and ParameterServer (Lookup) */
    return has_model(env);
}

void sv_api_call(void *ctx, int m, const uint8_t *req, size_t len, bool admin, ps_api_reply_t *r) {
    (void)admin; /* (the replica's methods: none asks more than the method's token) */
    const sv_api_env_t *env = ctx;
    memset(r, 0, sizeof *r);
    if (!req && len)
        len = 0;
    switch (m) {
        case SV_PREDICT:
            do_predict(env, req, len, r);
            return;
        case SV_STATUS:
            do_status(env, r);
            return;
        case SV_LIST_VERSIONS:
            do_versions(env, r);
            return;
        case SV_LOAD_VERSION:
            do_load(env, req, len, r);
            return;
        case SV_FOLLOW:
            do_follow(env, r);
            return;
        case PS_API_LOOKUP:
            do_lookup(env, req, len, r);
            return;
        case PS_API_HEALTH:
            do_health(env, r);
            return;
        case PS_API_PULL:
        case PS_API_PUSH:
        case PS_API_CREATE_TABLE:
        case PS_API_DROP_TABLE:
        case PS_API_RESET_TABLE:
        case PS_API_CHECKPOINT:
        case PS_API_RESTORE:
            ps_api_fail(r, PC_EREADONLY,
                        "%s: ps-serve is a read-only replica; write to the training servers",
                        ps_api_path((ps_api_method_t)m));
            return;
        default:
            ps_api_fail(r, PC_EUNSUPPORTED, "%s is not served by ps-serve",
                        m >= 0 && m < PS_API_NMETHODS ? ps_api_path((ps_api_method_t)m)
                                                      : "this method");
    }
}
