/* bench_gpu.c: `ps-bench gpu`: the DLRM training step on a backend (the GPU by default), next to
 * the same model in PyTorch on the same device, the GEMM share of the backend's peak, and what
 * overlapping the transfers buys.
 *
 * Model (bench/dlrm_torch.py is the same in PyTorch): 13 dense features, 26 fields of one
 * feature each (Zipf keys over 1M ids per field), dim D, bottom 13-512-256-D, top
 * (D + 351)-512-256-1, Adam on the dense layers. Configurations: batch 4096 and 32768, D 16 and
 * 64 (--quick: 4096 only; --smoke: batch 256, D 16, a few steps, for the test suite).
 *
 * The step is the worker's own (pw_step.h, on the model table pw_model.h; "step":"pw_step" in
 * the JSON): the batch's unique keys (pw_unique), its inputs and unique rows staged on the
 * device, rows gathered per feature, pooled by the model, forward and backward, the row
 * gradients pooled back and summed per unique row, back to the host while the dense optimizer
 * steps. The embedding table's own update is not in it (it runs on the servers), while
 * PyTorch's step includes its sparse SGD update: the comparison favours neither by much at
 * these sizes, and the note says so. Figures per configuration:
 *  - samples_per_s with transfers overlapped (the next step's upload during this step's compute,
 *    the gradients' download during the optimizer) and serialized, and their ratio (overlap);
 *  - gemm_share: the step's GEMM FLOPs per second over the backend's sgemm peak (8192^3; --smoke
 *    256^3), measured in the same run;
 *  - torch_samples_per_s and ember_vs_torch, when python3 with torch is there (not --smoke).
 * Without the device the area prints why and reports skipped: no figures are invented.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pc_rand.h"
#include "pc_time.h"
#include "pw_backend.h"
#include "pw_model.h"
#include "pw_step.h"

enum { FIELDS = 26, DENSE = 13, VOCAB = 1000000 };

/* One step's inputs as the worker has them on the host (backend host memory: pinned): a batch,
 * its unique keys (pw_unique, as the trainer's slots) and their rows. */
typedef struct inputs {
    pw_batch_t b;
    uint64_t *ukeys;
    uint32_t *inv;
    float *urows, *ugrads;
    pw_step_input_t in;
} inputs_t;

static void *halloc(pw_backend_t *be, size_t bytes) {
    void *p = be->host_alloc(be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "ps-bench gpu: out of host memory\n");
        exit(1);
    }
    return p;
}

static void *dalloc(pw_backend_t *be, size_t bytes) {
    void *p = be->alloc(be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "ps-bench gpu: out of device memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* A Criteo-shaped batch: one feature per field, Zipf keys over VOCAB ids per field. */
static void inputs_make(pw_backend_t *be, pw_unique_t *u, int n, int dim, uint64_t seed,
                        inputs_t *in) {
    uint64_t rng = seed;
    pw_batch_t *b = &in->b;
    const size_t nk = (size_t)n * FIELDS;
    b->n = (size_t)n;
    b->ndense = DENSE;
    b->labels = halloc(be, (size_t)n * sizeof(float));
    b->dense = halloc(be, (size_t)n * DENSE * sizeof(float));
    b->vals = halloc(be, nk * sizeof(float));
    b->keys = halloc(be, nk * sizeof(uint64_t));
    b->key_off = halloc(be, ((size_t)n + 1) * sizeof(size_t));
    b->fields = halloc(be, nk * sizeof(uint16_t));
    in->inv = halloc(be, nk * sizeof(uint32_t));
    in->ukeys = halloc(be, nk * sizeof(uint64_t));
    for (int s = 0; s < n; s++) {
        b->labels[s] = pc_rand_unit(&rng) < 0.25 ? 1.0f : 0.0f;
        for (int j = 0; j < DENSE; j++)
            b->dense[(size_t)s * DENSE + j] = (float)pc_rand_unit(&rng);
        b->key_off[s] = (size_t)s * FIELDS;
        for (int f = 0; f < FIELDS; f++) {
            const size_t j = (size_t)s * FIELDS + f;
            /* a power law over [0, VOCAB): id = VOCAB^u - 1 */
            const uint64_t id = (uint64_t)(pow(VOCAB, pc_rand_unit(&rng)) - 1);
            b->keys[j] = ((uint64_t)f << 40) | id;
            b->fields[j] = (uint16_t)f;
            b->vals[j] = 1.0f;
        }
    }
    b->key_off[n] = nk;
    size_t nu;
    if (pw_unique(u, b->keys, nk, in->ukeys, in->inv, &nu)) {
        fprintf(stderr, "ps-bench gpu: out of memory\n");
        exit(1);
    }
    in->urows = halloc(be, nu * (size_t)dim * sizeof(float));
    in->ugrads = halloc(be, nu * (size_t)dim * sizeof(float));
    for (size_t i = 0; i < nu * (size_t)dim; i++)
        in->urows[i] = (float)((pc_rand_unit(&rng) - 0.5) * 0.1);
    in->in = (pw_step_input_t){.b = b, .inv = in->inv, .nu = nu, .urows = in->urows};
}

static void inputs_free(pw_backend_t *be, inputs_t *in) {
    void *p[] = {in->b.labels, in->b.dense, in->b.vals, in->b.keys, in->b.key_off,
                 in->b.fields, in->inv,     in->ukeys,  in->urows,  in->ugrads};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        be->host_free(be, p[i]);
}

/* The model of the worker (pw_model.h: DLRM, sum pooling) and the worker's step on it. */
typedef struct bench_step {
    pw_model_t *m;
    pw_step_t *st;
} bench_step_t;

static void bench_step_init(bench_step_t *bs, pw_backend_t *be, int n, int dim) {
    pw_model_config_t c = {.name = "dlrm",
                           .ndense = DENSE,
                           .nfields = FIELDS,
                           .dim = dim,
                           .nbottom = 3,
                           .bottom = {512, 256, dim},
                           .ntop = 3,
                           .top = {512, 256, 1},
                           .max_batch = n,
                           .seed = 1};
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, PW_OPT_ADAM);
    if (pw_model_create(&c, be, &bs->m)) {
        fprintf(stderr, "ps-bench gpu: cannot create the model (device memory?)\n");
        exit(1);
    }
    pw_step_config_t sc = {.be = be, .model = bs->m, .ndense = DENSE, .opt = &oc};
    if (pw_step_create(&sc, &bs->st)) {
        fprintf(stderr, "ps-bench gpu: cannot create the step (device memory?)\n");
        exit(1);
    }
}

static void bench_step_free(bench_step_t *bs) {
    pw_step_destroy(bs->st);
    pw_model_destroy(bs->m);
}

/* GEMM FLOPs of one step: each layer 3 products (forward, dW, dx; the first layer has no dx),
 * the interaction 2 batched products. */
static double step_gemm_flops(const bench_step_t *bs, int n, int dim) {
    double f = 0;
    for (int i = 0; i < bs->m->nparams; i++)
        f += (i == 0 ? 2.0 : 3.0) * 2.0 * n * bs->m->params[i].in * bs->m->params[i].out;
    const double nf = FIELDS + 1;
    return f + 2 * 2.0 * n * nf * nf * dim;
}

/* Samples per second of `steps` steps (after 3 warm-up steps), as the trainer runs them
 * (overlap: step i+1's inputs staged while step i computes, the gradients' download during the
 * dense optimizer) or serialized (each transfer waited for before the next stage of work). */
static double measure(pw_backend_t *be, bench_step_t *bs, inputs_t *in, int steps, bool overlap) {
    uint64_t t0 = 0;
    double loss;
    for (int i = 0; i < 3 + steps; i++) {
        if (i == 3) { /* after the warm-up, with the device drained */
            be->sync(be);
            t0 = pc_time_mono_ns();
        }
        inputs_t *cur = &in[i & 1], *next = &in[(i + 1) & 1];
        const int set = overlap ? i & 1 : 0;
        if (!overlap || i == 0) {
            pw_step_stage(bs->st, set, &cur->in);
            if (!overlap)
                be->copy_wait(be);
        }
        if (pw_step_compute(bs->st, set, 1.0f, cur->ugrads))
            exit(1);
        if (overlap)
            pw_step_stage(bs->st, (i + 1) & 1, &next->in);
        pw_step_finish(bs->st, overlap, &loss);
        if (!overlap) {
            pw_step_apply(bs->st);
            be->sync(be);
        }
    }
    be->sync(be);
    return (double)in[0].b.n * steps / pc_time_sec_since(t0);
}

/* The backend's sgemm GFLOP/s on m^3. */
static double gemm_peak(pw_backend_t *be, int m) {
    const size_t nn = (size_t)m * m * sizeof(float);
    float *a = dalloc(be, nn), *b = dalloc(be, nn), *c = dalloc(be, nn), h;
    be->fill(be, (size_t)m * m, 0.5f, a);
    be->fill(be, (size_t)m * m, 0.25f, b);
    be->gemm(be, false, false, m, m, m, 1.0f, a, b, 0.0f, c);
    be->download(be, &h, c, sizeof h);
    int reps = 0;
    const uint64_t t0 = pc_time_mono_ns();
    do {
        be->gemm(be, false, false, m, m, m, 1.0f, a, b, 0.0f, c);
        be->download(be, &h, c, sizeof h);
        reps++;
    } while (pc_time_sec_since(t0) < 1.0 || reps < 3);
    const double gf = 2.0 * m * m * m * reps / pc_time_sec_since(t0) / 1e9;
    be->free(be, a);
    be->free(be, b);
    be->free(be, c);
    return gf;
}

/* PyTorch's samples/s for the configuration, from bench/dlrm_torch.py (NAN: unavailable): a
 * child of its own (bench_python: it dies with ps-bench), stopped after 10 minutes (a CUDA
 * initialisation that hangs does not hang the bench). */
static double torch_rate(int batch, int dim, const char *device, char *why, size_t wl) {
    char script[600], sb[16], sd[16], dir[256], out_path[300];
    /* the same device in PyTorch's names: cuda, cuda:N; every CPU backend is "cpu" */
    const char *tdev = strncmp(device, "cpu", 3) == 0 ? "cpu" : device;
    snprintf(script, sizeof script, "%s/bench/dlrm_torch.py", EMBER_SOURCE_DIR);
    snprintf(sb, sizeof sb, "%d", batch);
    snprintf(sd, sizeof sd, "%d", dim);
    char *args[] = {BENCH_PYTHON, script,     "--batch",    sb,       "--dim",
                    sd,           "--device", (char *)tdev, "--json", NULL};
    bench_tmpdir("gpu", dir, sizeof dir);
    snprintf(out_path, sizeof out_path, "%s/torch.out", dir);
    int st = 0;
    if (bench_wait_exit(bench_python(args, out_path, true), 600, &st))
        fprintf(stderr, "ps-bench gpu: %s ran for 10 minutes: stopped\n", script);
    char last[400] = "";
    cJSON *r = bench_python_result(out_path, last, sizeof last);
    unlink(out_path);
    rmdir(dir);
    const cJSON *v = r ? cJSON_GetObjectItem(r, "samples_per_s") : NULL;
    const double rate = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!cJSON_IsNumber(v))
        snprintf(why, wl, "%s", last[0] ? last + strspn(last, " ") : "no output");
    cJSON_Delete(r);
    return rate;
}

int bench_gpu_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "gpu", &o);
    pc_log_set_level(PC_LOG_ERROR);
    const char *device = o.device ? o.device : "cuda";
    char why[768];
    pw_backend_t *be;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "gpu");
    if (pw_backend_open(device, &be, why, sizeof why)) {
        printf("gpu: SKIPPED: %s\n", why);
        cJSON_AddStringToObject(root, "skipped", why);
        bench_emit_json(&o, root);
        return 0;
    }
    printf("gpu: backend %s\n", be->name);
    cJSON_AddStringToObject(root, "backend", be->name);
    cJSON_AddStringToObject(root, "step", "pw_step"); /* the worker's own step, not a copy */
    const double peak = gemm_peak(be, o.smoke ? 256 : 8192);
    printf("gpu: sgemm peak %.0f GFLOP/s (%d^3)\n", peak, o.smoke ? 256 : 8192);
    cJSON_AddNumberToObject(root, "gemm_peak_gflops", peak);
    const int batches[] = {4096, 32768}, dims[] = {16, 64};
    cJSON *configs = cJSON_AddArrayToObject(root, "configs");
    for (int bi = 0; bi < 2; bi++)
        for (int di = 0; di < 2; di++) {
            const int n = o.smoke ? 256 : batches[bi], dim = dims[di];
            if ((o.smoke || o.quick) && bi > 0)
                continue;
            if ((o.smoke && di > 0) || (o.dim && o.dim != dim))
                continue;
            const int steps = o.smoke ? 3 : n >= 32768 ? 20 : 50;
            inputs_t in[2];
            bench_step_t bs;
            pw_unique_t u = {0};
            inputs_make(be, &u, n, dim, 1, &in[0]);
            inputs_make(be, &u, n, dim, 2, &in[1]);
            pw_unique_free(&u);
            bench_step_init(&bs, be, n, dim);
            const double ser = measure(be, &bs, in, steps, false);
            const double ovl = measure(be, &bs, in, steps, true);
            const double gemm_share = step_gemm_flops(&bs, n, dim) * ovl / n / 1e9 / peak;
            char err[256];
            if (be->error(be, err, sizeof err)) {
                fprintf(stderr, "ps-bench gpu: the device failed: %s\n", err);
                return 1;
            }
            char twhy[512] = "";
            const double tr = o.smoke ? NAN : torch_rate(n, dim, device, twhy, sizeof twhy);
            printf("gpu: dlrm batch %d dim %d: %.0f samples/s overlapped, %.0f serialized "
                   "(overlap %.2fx); GEMM share of peak %.1f%%; pytorch ",
                   n, dim, ovl, ser, ovl / ser, 100 * gemm_share);
            if (isnan(tr))
                printf("%s\n", o.smoke ? "not run (--smoke)" : twhy);
            else
                printf("%.0f samples/s (ember/pytorch %.2f)\n", tr, ovl / tr);
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "batch", n);
            cJSON_AddNumberToObject(c, "dim", dim);
            cJSON_AddNumberToObject(c, "unique_rows", (double)in[0].in.nu);
            cJSON_AddNumberToObject(c, "samples_per_s", ovl);
            cJSON_AddNumberToObject(c, "samples_per_s_serialized", ser);
            cJSON_AddNumberToObject(c, "overlap", ovl / ser);
            cJSON_AddNumberToObject(c, "gemm_share", gemm_share);
            if (!isnan(tr)) {
                cJSON_AddNumberToObject(c, "torch_samples_per_s", tr);
                cJSON_AddNumberToObject(c, "ember_vs_torch", ovl / tr);
            }
            cJSON_AddItemToArray(configs, c);
            bench_step_free(&bs);
            inputs_free(be, &in[0]);
            inputs_free(be, &in[1]);
        }
    pw_backend_close(be);
    bench_emit_json(&o, root);
    return 0;
}
