/* bench_gpu.c: `ps-bench gpu`: the DLRM training step on a backend (the GPU by default), next to
 * the same model in PyTorch on the same device, the GEMM share of the backend's peak, and what
 * overlapping the transfers buys.
 *
 * Model (bench/dlrm_torch.py is the same in PyTorch): 13 dense features, 26 fields of one
 * feature each (Zipf keys over 1M ids per field), dim D, bottom 13-512-256-D, top
 * (D + 351)-512-256-1, Adam on the dense layers. Configurations: batch 4096 and 32768, D 16 and
 * 64 (--quick: 4096 only; --smoke: batch 256, D 16, a few steps, for the test suite).
 *
 * The step is the worker's (pw_train.c step_compute): the batch's inputs and its unique rows go
 * to the device, rows are gathered per feature, pooled, the model runs forward and backward, the
 * row gradients are pooled back and summed per unique row, come back to the host, and the dense
 * optimizer steps. The embedding table's own update is not in it (it runs on the servers), while
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

#include "bench_util.h"
#include "pc_error.h"
#include "pc_hash.h"
#include "pc_log.h"
#include "pc_rand.h"
#include "pc_time.h"
#include "pw_backend.h"
#include "pw_dense_optim.h"
#include "pw_dlrm.h"

enum { FIELDS = 26, DENSE = 13, VOCAB = 1000000 };

/* One step's inputs as the worker has them on the host (backend host memory: pinned). */
typedef struct inputs {
    int n;
    size_t nk, nu;
    float *labels, *dense, *vals, *urows;
    size_t *off;
    uint16_t *field;
    uint32_t *inv;
} inputs_t;

/* The same inputs on the device. */
typedef struct dinputs {
    float *labels, *dense, *vals, *urows;
    size_t *off;
    uint16_t *field;
    uint32_t *inv;
} dinputs_t;

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

/* A Criteo-shaped batch: Zipf keys per field, deduplicated into unique rows. */
static void inputs_make(pw_backend_t *be, int n, int dim, uint64_t seed, inputs_t *in) {
    uint64_t rng = seed;
    in->n = n;
    in->nk = (size_t)n * FIELDS;
    in->labels = halloc(be, (size_t)n * sizeof(float));
    in->dense = halloc(be, (size_t)n * DENSE * sizeof(float));
    in->vals = halloc(be, in->nk * sizeof(float));
    in->off = halloc(be, ((size_t)n + 1) * sizeof(size_t));
    in->field = halloc(be, in->nk * sizeof(uint16_t));
    in->inv = halloc(be, in->nk * sizeof(uint32_t));
    size_t cap = 16;
    while (cap < 2 * in->nk)
        cap <<= 1;
    uint64_t *keys = calloc(cap, sizeof *keys);
    uint32_t *slot = calloc(cap, sizeof *slot);
    in->nu = 0;
    for (int s = 0; s < n; s++) {
        in->labels[s] = pc_rand_unit(&rng) < 0.25 ? 1.0f : 0.0f;
        for (int j = 0; j < DENSE; j++)
            in->dense[(size_t)s * DENSE + j] = (float)pc_rand_unit(&rng);
        in->off[s] = (size_t)s * FIELDS;
        for (int f = 0; f < FIELDS; f++) {
            const size_t j = (size_t)s * FIELDS + f;
            /* a power law over [0, VOCAB): id = VOCAB^u - 1 */
            const uint64_t id = (uint64_t)(pow(VOCAB, pc_rand_unit(&rng)) - 1);
            const uint64_t key = ((uint64_t)f << 40) | id;
            size_t h = pc_hash_u64(key, 7) & (cap - 1);
            while (slot[h] && keys[h] != key)
                h = (h + 1) & (cap - 1);
            if (!slot[h]) {
                keys[h] = key;
                slot[h] = (uint32_t)++in->nu;
            }
            in->inv[j] = slot[h] - 1;
            in->field[j] = (uint16_t)f;
            in->vals[j] = 1.0f;
        }
    }
    in->off[n] = in->nk;
    free(keys);
    free(slot);
    in->urows = halloc(be, in->nu * (size_t)dim * sizeof(float));
    for (size_t i = 0; i < in->nu * (size_t)dim; i++)
        in->urows[i] = (float)((pc_rand_unit(&rng) - 0.5) * 0.1);
}

static void inputs_free(pw_backend_t *be, inputs_t *in) {
    void *p[] = {in->labels, in->dense, in->vals, in->urows, in->off, in->field, in->inv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        be->host_free(be, p[i]);
}

static void dinputs_make(pw_backend_t *be, const inputs_t *in, int dim, dinputs_t *d) {
    d->labels = dalloc(be, (size_t)in->n * sizeof(float));
    d->dense = dalloc(be, (size_t)in->n * DENSE * sizeof(float));
    d->vals = dalloc(be, in->nk * sizeof(float));
    d->urows = dalloc(be, in->nu * (size_t)dim * sizeof(float));
    d->off = dalloc(be, ((size_t)in->n + 1) * sizeof(size_t));
    d->field = dalloc(be, in->nk * sizeof(uint16_t));
    d->inv = dalloc(be, in->nk * sizeof(uint32_t));
}

static void dinputs_free(pw_backend_t *be, dinputs_t *d) {
    void *p[] = {d->labels, d->dense, d->vals, d->urows, d->off, d->field, d->inv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        be->free(be, p[i]);
}

/* The inputs to the device, asynchronously (overlapped) or not. */
static void upload(pw_backend_t *be, const inputs_t *in, int dim, dinputs_t *d, bool async) {
    void (*up)(pw_backend_t *, void *, const void *, size_t) =
        async ? be->upload_async : be->upload;
    up(be, d->labels, in->labels, (size_t)in->n * sizeof(float));
    up(be, d->dense, in->dense, (size_t)in->n * DENSE * sizeof(float));
    up(be, d->vals, in->vals, in->nk * sizeof(float));
    up(be, d->urows, in->urows, in->nu * (size_t)dim * sizeof(float));
    up(be, d->off, in->off, ((size_t)in->n + 1) * sizeof(size_t));
    up(be, d->field, in->field, in->nk * sizeof(uint16_t));
    up(be, d->inv, in->inv, in->nk * sizeof(uint32_t));
}

/* Everything a step computes with on the device. */
typedef struct step {
    pw_backend_t *be;
    int n, dim, nl;
    size_t nk, nu;
    pw_dlrm_t *m;
    pw_linear_t *l;
    pw_opt_t opt[16];
    float *rows, *grads, *pooled, *dpooled, *logits, *dlogits, *loss, *ugrads;
    float *hgrads, *hloss; /* host (pinned) */
} step_t;

static void step_init(step_t *st, pw_backend_t *be, int n, int dim, const inputs_t *in) {
    memset(st, 0, sizeof *st);
    st->be = be;
    st->n = n;
    st->dim = dim;
    st->nk = in->nk;
    st->nu = in->nu;
    pw_dlrm_config_t c = {.ndense = DENSE,
                          .nfields = FIELDS,
                          .dim = dim,
                          .nbottom = 3,
                          .bottom = {512, 256, dim},
                          .ntop = 3,
                          .top = {512, 256, 1},
                          .max_batch = n,
                          .seed = 1};
    if (pw_dlrm_create(&c, be, &st->m)) {
        fprintf(stderr, "ps-bench gpu: cannot create the model (device memory?)\n");
        exit(1);
    }
    st->l = pw_dlrm_layers(st->m, &st->nl);
    pw_opt_config_t oc;
    pw_opt_config_defaults(&oc, PW_OPT_ADAM);
    for (int i = 0; i < st->nl; i++)
        if (pw_opt_init(&st->opt[2 * i], be, &oc, (size_t)st->l[i].in * st->l[i].out) ||
            pw_opt_init(&st->opt[2 * i + 1], be, &oc, (size_t)st->l[i].out))
            exit(1);
    const size_t fl = sizeof(float), d = (size_t)dim;
    st->rows = dalloc(be, in->nk * d * fl);
    st->grads = dalloc(be, in->nk * d * fl);
    st->pooled = dalloc(be, (size_t)n * FIELDS * d * fl);
    st->dpooled = dalloc(be, (size_t)n * FIELDS * d * fl);
    st->logits = dalloc(be, (size_t)n * fl);
    st->dlogits = dalloc(be, (size_t)n * fl);
    st->loss = dalloc(be, fl);
    st->ugrads = dalloc(be, in->nu * d * fl);
    st->hgrads = halloc(be, in->nu * d * fl);
    st->hloss = halloc(be, fl);
}

static void step_free(step_t *st) {
    pw_backend_t *be = st->be;
    for (int i = 0; i < 2 * st->nl; i++)
        pw_opt_free(&st->opt[i]);
    pw_dlrm_destroy(st->m);
    void *p[] = {st->rows,   st->grads,   st->pooled, st->dpooled,
                 st->logits, st->dlogits, st->loss,   st->ugrads};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        be->free(be, p[i]);
    be->host_free(be, st->hgrads);
    be->host_free(be, st->hloss);
}

/* One training step on inputs d; with `next` (overlapped) the next step's inputs are uploaded
 * into nd while this one computes. */
static void step_run(step_t *st, const dinputs_t *d, const inputs_t *next, dinputs_t *nd) {
    pw_backend_t *be = st->be;
    const int n = st->n, dim = st->dim;
    const size_t ub = st->nu * (size_t)dim * sizeof(float);
    be->gather_rows(be, st->nk, d->inv, d->urows, dim, st->rows);
    be->pool(be, n, d->off, d->field, d->vals, FIELDS, dim, st->rows, dim, false, st->pooled);
    pw_dlrm_forward(st->m, n, d->dense, st->pooled, st->logits);
    be->bce(be, n, st->logits, d->labels, NULL, st->dlogits, st->loss);
    pw_dlrm_zero_grad(st->m);
    pw_dlrm_backward(st->m, st->dlogits, st->dpooled);
    be->zero(be, st->grads, st->nk * (size_t)dim * sizeof(float));
    be->pool_grad(be, n, d->off, d->field, d->vals, FIELDS, dim, st->dpooled, dim, false,
                  st->grads);
    be->zero(be, st->ugrads, ub);
    be->scatter_add_rows(be, st->nk, d->inv, st->grads, dim, 1.0f, st->ugrads);
    if (next) {
        upload(be, next, dim, nd, true);
        be->download_async(be, st->hgrads, st->ugrads, ub);
        be->download_async(be, st->hloss, st->loss, sizeof(float));
    } else {
        be->download(be, st->hgrads, st->ugrads, ub);
        be->download(be, st->hloss, st->loss, sizeof(float));
    }
    for (int i = 0; i < st->nl; i++) {
        pw_opt_step(&st->opt[2 * i], st->l[i].w, st->l[i].dw);
        pw_opt_step(&st->opt[2 * i + 1], st->l[i].b, st->l[i].db);
    }
    if (next)
        be->copy_wait(be);
}

/* GEMM FLOPs of one step: each layer 3 products (forward, dW, dx; the first layer has no dx),
 * the interaction 2 batched products. */
static double step_gemm_flops(const step_t *st) {
    double f = 0;
    for (int i = 0; i < st->nl; i++)
        f += (i == 0 ? 2.0 : 3.0) * 2.0 * st->n * st->l[i].in * st->l[i].out;
    const double nf = FIELDS + 1;
    return f + 2 * 2.0 * st->n * nf * nf * st->dim;
}

/* Samples per second of `steps` steps (after 3 warm-up steps), overlapped or serialized. */
static double measure(step_t *st, inputs_t *in, dinputs_t *d, int steps, bool overlap) {
    pw_backend_t *be = st->be;
    uint64_t t0 = 0;
    for (int i = 0; i < 3 + steps; i++) {
        if (i == 3) { /* after the warm-up, with the device drained */
            be->download(be, st->hloss, st->loss, sizeof(float));
            t0 = pc_time_mono_ns();
        }
        if (overlap) { /* inputs i are in d[i & 1]; step i+1's go to the other set */
            if (i == 0)
                upload(be, &in[0], st->dim, &d[0], true);
            step_run(st, &d[i & 1], &in[(i + 1) & 1], &d[(i + 1) & 1]);
        } else {
            upload(be, &in[i & 1], st->dim, &d[0], false);
            step_run(st, &d[0], NULL, NULL);
        }
        if (i == 2 + steps)
            return (double)st->n * steps / pc_time_sec_since(t0);
    }
    return 0;
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

/* PyTorch's samples/s for the configuration, from bench/dlrm_torch.py (NAN: unavailable). */
static double torch_rate(int batch, int dim, const char *device, char *why, size_t wl) {
    char cmd[1024], line[2048];
    /* the same device in PyTorch's names: cuda, cuda:N; every CPU backend is "cpu" */
    const char *tdev = strncmp(device, "cpu", 3) == 0 ? "cpu" : device;
    snprintf(cmd, sizeof cmd,
             "python3 %s/bench/dlrm_torch.py --batch %d --dim %d --device %s --json 2>&1",
             EMBER_SOURCE_DIR, batch, dim, tdev);
    FILE *p = popen(cmd, "r");
    double rate = NAN;
    snprintf(why, wl, "no output");
    while (p && fgets(line, sizeof line, p)) {
        cJSON *j = line[0] == '{' ? cJSON_Parse(line) : NULL;
        const cJSON *v = j ? cJSON_GetObjectItem(j, "samples_per_s") : NULL;
        if (cJSON_IsNumber(v))
            rate = v->valuedouble;
        else if (!j)
            snprintf(why, wl, "%.*s", (int)strcspn(line, "\n"), line);
        cJSON_Delete(j);
    }
    if (p)
        pclose(p);
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
    cJSON_AddStringToObject(root, "area", "gpu");
    if (pw_backend_open(device, &be, why, sizeof why)) {
        printf("gpu: SKIPPED: %s\n", why);
        cJSON_AddStringToObject(root, "skipped", why);
        bench_emit_json(&o, root);
        return 0;
    }
    printf("gpu: backend %s\n", be->name);
    cJSON_AddStringToObject(root, "backend", be->name);
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
            dinputs_t d[2];
            step_t st;
            inputs_make(be, n, dim, 1, &in[0]);
            inputs_make(be, n, dim, 2, &in[1]);
            /* the step's buffers are sized by the batch with more unique rows */
            inputs_t *big = in[0].nu >= in[1].nu ? &in[0] : &in[1];
            dinputs_make(be, big, dim, &d[0]);
            dinputs_make(be, big, dim, &d[1]);
            step_init(&st, be, n, dim, big);
            const double ser = measure(&st, in, d, steps, false);
            const double ovl = measure(&st, in, d, steps, true);
            const double gemm_share = step_gemm_flops(&st) * ovl / n / 1e9 / peak;
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
            cJSON_AddNumberToObject(c, "unique_rows", (double)in[0].nu);
            cJSON_AddNumberToObject(c, "samples_per_s", ovl);
            cJSON_AddNumberToObject(c, "samples_per_s_serialized", ser);
            cJSON_AddNumberToObject(c, "overlap", ovl / ser);
            cJSON_AddNumberToObject(c, "gemm_share", gemm_share);
            if (!isnan(tr)) {
                cJSON_AddNumberToObject(c, "torch_samples_per_s", tr);
                cJSON_AddNumberToObject(c, "ember_vs_torch", ovl / tr);
            }
            cJSON_AddItemToArray(configs, c);
            step_free(&st);
            dinputs_free(be, &d[0]);
            dinputs_free(be, &d[1]);
            inputs_free(be, &in[0]);
            inputs_free(be, &in[1]);
        }
    pw_backend_close(be);
    bench_emit_json(&o, root);
    return 0;
}
