/* bench_py.c: `ps-bench py`: the Python package (python/emberps) against the C client it wraps.
 *
 * A ps-server process (one event loop) runs pinned to CPU 0 with two tables, b64 (dim 64) and
 * d16 (dim 16), both Adagrad; the clients run on CPU 1 (--no-pin: unpinned). The Python side is
 * `/usr/bin/python3 -m emberps.bench` (python/emberps/bench.py: Debian's torch needs Debian's
 * interpreter), given this build's libpsclient and binaries; it fills a universe of 1M keys
 * (--quick 200k, --smoke 20k) and times Client.pull of random batches of 4096 keys, one call at
 * a time, in rounds. Before each of its rounds it hands over through a pipe and this process
 * times the same loop through psc_pull on the same keys and server (c_pull_rows_per_s), so the
 * two alternate. py_vs_c = the medians' ratio (goal >= 0.8). The Python side adds
 * torch_step_overhead (a DLRM step with emberps.torch.EmbeddingBag / with a local
 * nn.EmbeddingBag, goal <= 1.5) and, except with --smoke, torch_auc_minus_worker
 * (examples/torch_dlrm.py against ps-worker on generated data, goal >= -0.005); see its text.
 * Without python3, numpy or cffi the Python keys are missing and py_skipped says why.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "emberps/psclient.h"
#include "pc_fs.h"

#define BATCH  4096
#define NBATCH 64
#define DIM    64
#define GOLDEN UINT64_C(0x9E3779B97F4A7C15) /* python/emberps/bench.py's universe: i * GOLDEN */
/* The Python side's bounds: silent between two rounds (its start: importing, filling keys), and
 * its whole run (its AUC figure trains ps-worker and PyTorch, each bounded there: 600 + 3600 s) */
#define PY_SILENCE_S 300
#define PY_RUN_S     4500

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One C round: blocking pulls of random batches for `secs`; rows/s (negative: the error). */
static double c_round(psc_t *c, const uint64_t *batches, float *rows, double secs) {
    long n = 0;
    const double t0 = now_s();
    double el;
    do {
        int rc = psc_pull(c, "b64", batches + (size_t)(n % NBATCH) * BATCH, BATCH, DIM, rows);
        if (rc)
            return rc;
        n++;
    } while ((el = now_s() - t0) < secs);
    return (double)n * BATCH / el;
}

/* Run the Python side with the sync pipes; its output into out_path. Returns its pid. */
static pid_t spawn_python(const bench_opts_t *o, const char *servers, int rfd, int wfd,
                          uint64_t nkeys, double secs, const char *out_path) {
    char bin[600], srv[128], sync[32], bindir[620], keys[48], seconds[48];
    bench_sibling("ps-server", bin, sizeof bin);
    *strrchr(bin, '/') = '\0'; /* the binaries' directory */
    snprintf(srv, sizeof srv, "--servers=%s", servers);
    snprintf(sync, sizeof sync, "--sync=%d,%d", rfd, wfd);
    snprintf(bindir, sizeof bindir, "--bin-dir=%s", bin);
    /* the C rounds' keys and length: both sides' rounds alike */
    snprintf(keys, sizeof keys, "--keys=%llu", (unsigned long long)nkeys);
    snprintf(seconds, sizeof seconds, "--seconds=%g", secs);
    const char *size = o->smoke ? "--smoke" : o->quick ? "--quick" : NULL; /* NULL: full */
    char *args[] = {BENCH_PYTHON, "-m",    "emberps.bench", srv,          sync, bindir,
                    keys,         seconds, "--json",        (char *)size, NULL};
    return bench_python(args, out_path, false);
}

int bench_py_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "py", &o);
    signal(SIGPIPE, SIG_IGN);
    const uint64_t nkeys = o.keys > 0 ? (uint64_t)o.keys
                           : o.smoke  ? 20000
                           : o.quick  ? 200000
                                      : 1000000;
    const double secs = o.seconds > 0 ? o.seconds : o.smoke ? 0.2 : o.quick ? 1.0 : 2.0;
    char dir[256];
    bench_tmpdir("py", dir, sizeof dir);
    const char *extra[] = {
        "--tables=name=b64,dim=64,optimizer=adagrad;name=d16,dim=16,optimizer=adagrad", NULL};
    int port;
    const pid_t ps = bench_ps_server(&o, "py", dir, "py", extra, &port, NULL);
    if (ps < 0) {
        pc_fs_rm_tree(dir);
        return 1;
    }
    bench_pin(&o, 1);
    char servers[64];
    snprintf(servers, sizeof servers, "127.0.0.1:%d", port);
    psc_opts_t co = {.servers = servers, .timeout_ms = 60000};
    psc_t *c = NULL;
    if (psc_connect(&co, &c)) {
        fprintf(stderr, "ps-bench py: cannot connect to %s\n", servers);
        bench_stop(ps);
        pc_fs_rm_tree(dir);
        return 1;
    }
    uint64_t *batches = malloc(sizeof(uint64_t) * BATCH * NBATCH);
    float *rows = malloc(sizeof(float) * BATCH * DIM);
    if (!batches || !rows)
        abort();
    uint64_t rng = 7;
    for (size_t i = 0; i < (size_t)BATCH * NBATCH; i++)
        batches[i] = (bench_rand(&rng) % nkeys + 1) * GOLDEN;

    int to_py[2], from_py[2];
    bench_sync_pipes(to_py, from_py);
    char out_path[320];
    snprintf(out_path, sizeof out_path, "%s/python.out", dir);
    printf("ps-bench py: %llu keys, dim %d, batches of %d, server on CPU 0, clients on CPU 1\n",
           (unsigned long long)nkeys, DIM, BATCH);
    fflush(stdout);
    pid_t py = spawn_python(&o, servers, to_py[0], from_py[1], nkeys, secs, out_path);
    close(to_py[0]);
    close(from_py[1]);
    double rates[16];
    int nr = 0, failed = 0;
    char ch;
    /* Python asks ('r') before each of its rounds (after filling the keys): a C round first.
     * Its rounds and start take seconds: a Python silent for PY_SILENCE_S hangs (not waited). */
    int got = 0;
    while ((got = bench_read_byte(from_py[0], PY_SILENCE_S, &ch)) == 1 && ch == 'r' && nr < 16) {
        const double r = c_round(c, batches, rows, secs);
        if (r < 0) {
            fprintf(stderr, "ps-bench py: psc_pull: %s\n", psc_strerror((int)r));
            failed = 1;
            break;
        }
        rates[nr++] = r;
        if (write(to_py[1], "g", 1) != 1)
            break;
    }
    close(to_py[1]);
    close(from_py[0]);
    int st = 0; /* (one that went silent hangs: killed after a few seconds) */
    if (bench_wait_exit(py, got < 0 ? 5 : PY_RUN_S, &st))
        fprintf(stderr, "ps-bench py: the Python side %s %d s: killed\n",
                got < 0 ? "was silent for" : "ran past", got < 0 ? PY_SILENCE_S : PY_RUN_S);
    psc_close(c);
    bench_stop(ps);
    free(batches);
    free(rows);

    cJSON *root = bench_python_result(out_path, NULL, 0);
    unlink(out_path);
    rmdir(dir);
    if (!root) {
        root = cJSON_CreateObject();
        char why[200];
        snprintf(why, sizeof why,
                 "%s -m emberps.bench exited with status %d (numpy, cffi: "
                 "deploy/install-deps.sh)",
                 BENCH_PYTHON, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        cJSON_AddStringToObject(root, "py_skipped", why);
        printf("  %s\n", why);
    }
    if (nr) {
        const double cr = bench_quantile(rates, (size_t)nr, 0.5);
        cJSON_AddNumberToObject(root, "c_pull_rows_per_s", cr);
        const cJSON *pr = cJSON_GetObjectItem(root, "py_pull_rows_per_s");
        if (cJSON_IsNumber(pr)) {
            cJSON_AddNumberToObject(root, "py_vs_c", pr->valuedouble / cr);
            printf("pull, dim 64, batch %d: python %.2fM rows/s, C %.2fM rows/s: py_vs_c %.2f "
                   "(goal >= 0.8)\n",
                   BATCH, pr->valuedouble / 1e6, cr / 1e6, pr->valuedouble / cr);
        }
    }
    const cJSON *ov = cJSON_GetObjectItem(root, "torch_step_overhead");
    if (cJSON_IsNumber(ov))
        printf("torch DLRM step, EmberPS embeddings / local nn.EmbeddingBag: %.2f (goal <= 1.5)\n",
               ov->valuedouble);
    const cJSON *am = cJSON_GetObjectItem(root, "torch_auc_minus_worker");
    if (cJSON_IsNumber(am))
        printf("torch AUC - ps-worker AUC: %+.4f (goal >= -0.005)\n", am->valuedouble);
    bench_emit_json(&o, root);
    return failed;
}
