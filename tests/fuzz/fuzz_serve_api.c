/* libFuzzer-style target: ps-serve's gRPC handlers (sv_api_call) on arbitrary bytes, in process,
 * against a pinned replica of two versions built once in a temporary directory
 * (serve_fixture.h): the first input byte picks the method (Predict, Lookup and LoadVersion most
 * often; ServeStatus, ListVersions, Follow, Health and a write too), the rest is the request
 * message. Never crashes, never leaks, and every reply keeps the contract: a status that is the
 * code's, a body only on success, and a Predict that succeeds scores every sample with a
 * probability and names one of the versions.
 *
 * DESIGN
 * - LLVMFuzzerTestOneInput is the target; with EMBER_LIBFUZZER defined it is all there is (link
 *   with -fsanitize=fuzzer). Without it (the suite's gcc builds, which have no libFuzzer) a small
 *   driver below runs it: the files and directories given (a corpus), then built-in seeds (a
 *   valid message of each method), then -runs=N inputs made from them: a random but well-formed
 *   request half the time (random sample shapes, dense and key values with NaN and Inf, fields
 *   past the model's, counts that disagree), its bytes mutated (flips, inserted, deleted,
 *   duplicated and truncated bytes) the other half, all from -seed=S, within -max_total_time=T.
 *   Run under ASan (build-asan) for the memory checks and leaks.
 * - The replica is created once and destroyed at exit (its directory removed): a LoadVersion
 *   that an input makes stays in effect for the next, as in a daemon.
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "emberps.pb-c.h"
#include "pc_log.h"
#include "pc_time.h"
#include "serve_fixture.h"
#include "sv_api.h"

#define V1 100
#define V2 200

static sf_t g_f;
static sv_serve_t *g_s;
static sv_api_env_t g_env;
static int g_methods[10];
static unsigned long long g_ok[10], g_failed[10]; /* replies per method index of the input */

static void teardown(void) {
    sv_serve_destroy(g_s);
    sf_destroy(&g_f);
}

static int method(const char *path) {
    const int m = sv_api_method(path, strlen(path));
    if (m < 0)
        abort();
    return m;
}

static void setup(void) {
    pc_log_set_level(PC_LOG_ERROR);
    sf_create(&g_f);
    sf_version(&g_f, V1, 7, 0);
    sf_version(&g_f, V2, 8, 10);
    sv_serve_opts_t o = {
        .name = "ctr", .versions_dir = g_f.versions, .evaluators = 2, .max_batch = SF_BATCH};
    SF_CHECK(sv_serve_create(&o, &g_s));
    g_env = (sv_api_env_t){.serve = g_s,
                           .max_batch = SF_BATCH,
                           .max_keys = 2048,
                           .max_reply = 1 << 16,
                           .start_ns = pc_time_mono_ns()};
    const char *paths[10] = {"/emberps.Serving/Predict",        "/emberps.ParameterServer/Lookup",
                             "/emberps.Serving/LoadVersion",    "/emberps.Serving/Predict",
                             "/emberps.ParameterServer/Lookup", "/emberps.Serving/ServeStatus",
                             "/emberps.Serving/ListVersions",   "/emberps.Serving/Follow",
                             "/emberps.ParameterServer/Health", "/emberps.ParameterServer/Push"};
    for (int i = 0; i < 10; i++)
        g_methods[i] = method(paths[i]);
    atexit(teardown);
}

/* How many samples a Predict request holds (0 when it does not parse). */
static size_t samples_in(const uint8_t *req, size_t len) {
    Emberps__PredictRequest *q = emberps__predict_request__unpack(NULL, len, req);
    const size_t n = q ? (q->n_lines ? q->n_lines : q->n_samples) : 0;
    emberps__predict_request__free_unpacked(q, NULL);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_s)
        setup();
    if (size < 1)
        return 0;
    const int m = g_methods[data[0] % 10];
    ps_api_reply_t r;
    sv_api_call(&g_env, m, data + 1, size - 1, true, &r);
    (r.err ? g_failed : g_ok)[data[0] % 10]++;
    if (r.status != pc_err_to_grpc(r.err) || (r.err && r.body) || (!r.body && r.len))
        abort(); /* a status that is not the code's, a body with a failure, bytes it lacks */
    if (!r.err && m == g_methods[0]) {
        Emberps__PredictResponse *a = emberps__predict_response__unpack(NULL, r.len, r.body);
        if (!a || a->n_scores != samples_in(data + 1, size - 1) ||
            (a->model_version != V1 && a->model_version != V2) || !a->pinned)
            abort();
        for (size_t i = 0; i < a->n_scores; i++)
            if (!(a->scores[i] >= 0 && a->scores[i] <= 1))
                abort(); /* NaN included */
        emberps__predict_response__free_unpacked(a, NULL);
    }
    ps_api_reply_free(&r);
    return 0;
}

#ifndef EMBER_LIBFUZZER
/* ---- the driver without libFuzzer ------------------------------------------------------------
 */
static uint64_t g_rng;

static uint64_t rnd(uint64_t n) {
    return n ? sf_rand(&g_rng) % n : 0;
}

/* Pack msg after the method byte `sel` into buf (cap bytes); returns the length. */
static size_t pack(uint8_t sel, const ProtobufCMessage *msg, uint8_t *buf, size_t cap) {
    const size_t n = protobuf_c_message_get_packed_size(msg);
    if (n + 1 > cap)
        return 0;
    buf[0] = sel;
    protobuf_c_message_pack(msg, buf + 1);
    return n + 1;
}

static float odd_float(void) {
    const float v[] = {0, 1, -1, 0.5f, 1e30f, -1e-30f, NAN, INFINITY, -INFINITY, 3.25f};
    return rnd(4) ? (float)((int)rnd(2000) - 1000) / 100.0f : v[rnd(10)];
}

/* A random, well-formed request of the method `sel` picks, into buf. */
static size_t make_request(uint8_t sel, uint8_t *buf, size_t cap) {
    enum { NS = SF_BATCH + 2, NK = 40 };
    static Emberps__PredictSample ps[NS];
    static Emberps__PredictSample *pp[NS];
    static float dense[NS][16], vals[NS][NK];
    static uint64_t keys[NS][NK];
    static uint32_t fields[NS][NK];
    static char *lines[NS];
    switch (sel % 10) {
        case 0:
        case 3: {
            Emberps__PredictRequest q = EMBERPS__PREDICT_REQUEST__INIT;
            if (rnd(8) == 0)
                q.model = rnd(2) ? "ctr" : "other";
            const size_t n = rnd(8) == 0 ? rnd(NS + 1) : 1 + rnd(6);
            if (rnd(2)) {
                for (size_t i = 0; i < n; i++)
                    lines[i] = rnd(10) ? g_f.lines[rnd(SF_NLINES)] : "1\t2\t3";
                q.n_lines = n;
                q.lines = lines;
            }
            if (!q.n_lines || rnd(10) == 0) {
                for (size_t i = 0; i < n; i++) {
                    Emberps__PredictSample *p = &ps[i];
                    emberps__predict_sample__init(p);
                    p->n_dense = rnd(8) ? PW_CRITEO_DENSE : rnd(16);
                    p->dense = dense[i];
                    for (size_t j = 0; j < p->n_dense; j++)
                        dense[i][j] = rnd(20) ? (float)rnd(6) : odd_float();
                    p->n_keys = rnd(NK + 1);
                    p->keys = keys[i];
                    p->n_fields = rnd(10) ? p->n_keys : rnd(NK + 1);
                    p->fields = fields[i];
                    p->n_values = rnd(3) ? 0 : rnd(10) ? p->n_keys : rnd(NK + 1);
                    p->values = vals[i];
                    for (size_t j = 0; j < NK; j++) {
                        keys[i][j] = rnd(2) ? rnd(64) : sf_rand(&g_rng);
                        fields[i][j] =
                            rnd(20) ? (uint32_t)rnd(PW_CRITEO_CAT) : (uint32_t)sf_rand(&g_rng);
                        vals[i][j] = rnd(10) ? 1 : odd_float();
                    }
                    pp[i] = p;
                }
                q.n_samples = n;
                q.samples = pp;
            }
            return pack(sel, &q.base, buf, cap);
        }
        case 1:
        case 4: {
            Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
            q.table = rnd(6) ? SF_TABLE : rnd(2) ? "nope" : "";
            q.n_keys = rnd(8) ? rnd(NK) : rnd(NS * NK);
            q.keys = &keys[0][0];
            for (size_t j = 0; j < q.n_keys; j++)
                q.keys[j] = rnd(2) ? rnd(64) : sf_rand(&g_rng);
            return pack(sel, &q.base, buf, cap);
        }
        case 2: {
            Emberps__LoadVersionRequest q = EMBERPS__LOAD_VERSION_REQUEST__INIT;
            const uint64_t steps[] = {V1, V2, 0, 150, UINT64_MAX};
            q.step = rnd(4) ? steps[rnd(5)] : sf_rand(&g_rng);
            return pack(sel, &q.base, buf, cap);
        }
        default:
            buf[0] = sel;
            return 1 + rnd(3); /* an empty message, or a byte or two of junk after it */
    }
}

/* 1 to 4 random edits of buf[0..len) (cap bytes); returns the new length. */
static size_t mutate(uint8_t *buf, size_t len, size_t cap) {
    for (uint64_t k = 1 + rnd(4); k > 0; k--) {
        const size_t at = len ? rnd(len) : 0;
        switch (rnd(6)) {
            case 0:
                if (len)
                    buf[at] ^= (uint8_t)(1u << rnd(8));
                break;
            case 1:
                if (len)
                    buf[at] = (uint8_t)sf_rand(&g_rng);
                break;
            case 2:
                if (len < cap) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = (uint8_t)sf_rand(&g_rng);
                    len++;
                }
                break;
            case 3:
                if (len) {
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
                break;
            case 4: { /* duplicate a chunk in place */
                const size_t n = rnd(len - at + 1);
                if (len + n <= cap) {
                    memmove(buf + at + n, buf + at, len - at);
                    len += n;
                }
                break;
            }
            default:
                len = rnd(len + 1);
        }
    }
    return len;
}

static void run_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return;
    static uint8_t buf[1 << 20];
    const size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    LLVMFuzzerTestOneInput(buf, n);
}

static size_t run_corpus(const char *path) {
    struct stat st;
    if (stat(path, &st))
        return 0;
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return 1;
    }
    DIR *d = opendir(path);
    size_t n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            run_file(p);
            n++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

int main(int argc, char **argv) {
    unsigned long long runs = 2000, seed = 1, max_s = 0;
    size_t corpus = 0;
    for (int i = 1; i < argc; i++) {
        if (sscanf(argv[i], "-runs=%llu", &runs) == 1 ||
            sscanf(argv[i], "-seed=%llu", &seed) == 1 ||
            sscanf(argv[i], "-max_total_time=%llu", &max_s) == 1)
            continue;
        if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [-runs=N] [-seed=S] [-max_total_time=T] [corpus ...]\n",
                    argv[0]);
            return 2;
        }
        corpus += run_corpus(argv[i]);
    }
    g_rng = seed;
    enum { CAP = 1 << 18 };
    uint8_t *buf = malloc(CAP);
    if (!buf)
        return 1;
    for (uint8_t sel = 0; sel < 10; sel++) /* a valid message of each method */
        LLVMFuzzerTestOneInput(buf, make_request(sel, buf, CAP));
    const uint64_t t0 = pc_time_mono_ns();
    unsigned long long done = 0;
    for (; done < runs; done++) {
        if (max_s && pc_time_mono_ns() - t0 > max_s * 1000000000ull)
            break;
        size_t len = make_request((uint8_t)rnd(256), buf, CAP);
        if (rnd(2))
            len = mutate(buf, len, CAP);
        LLVMFuzzerTestOneInput(buf, len);
    }
    free(buf);
    printf("fuzz_serve_api: ok/failed replies: Predict %llu/%llu, Lookup %llu/%llu, LoadVersion "
           "%llu/%llu\n",
           g_ok[0] + g_ok[3], g_failed[0] + g_failed[3], g_ok[1] + g_ok[4],
           g_failed[1] + g_failed[4], g_ok[2], g_failed[2]);
    printf("fuzz_serve_api: %zu corpus inputs, 10 seeds, %llu runs (seed %llu) in %.1f s: no "
           "crash\n",
           corpus, done, seed, (double)(pc_time_mono_ns() - t0) / 1e9);
    return 0;
}
#endif
