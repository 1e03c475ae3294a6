/* bench_util.c: helpers for ps-bench (see bench_util.h). */
#include "bench_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emberps/psclient.h"
#include "pc_rand.h"
#include "pc_time.h"
#include "ps_table.h"

void bench_parse_opts(int argc, char **argv, const char *area, bench_opts_t *o) {
    *o = (bench_opts_t){.pin = true};
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE && o->ncpu < 64; c++)
            if (CPU_ISSET(c, &allowed))
                o->cpu[o->ncpu++] = c;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            o->json = true;
        else if (!strcmp(argv[i], "--quick"))
            o->quick = true;
        else if (!strcmp(argv[i], "--smoke"))
            o->smoke = true;
        else if (!strcmp(argv[i], "--no-pin"))
            o->pin = false;
        else if (!strncmp(argv[i], "--seconds=", 10))
            o->seconds = atof(argv[i] + 10);
        else if (!strncmp(argv[i], "--dim=", 6))
            o->dim = atoi(argv[i] + 6);
        else if (!strncmp(argv[i], "--keys=", 7))
            o->keys = atoll(argv[i] + 7);
        else if (!strncmp(argv[i], "--device=", 9))
            o->device = argv[i] + 9;
        else {
            fprintf(stderr,
                    "usage: ps-bench %s [--quick] [--smoke] [--json] [--no-pin] [--seconds=S] "
                    "[--dim=D] [--keys=N] [--device=D]\n",
                    area);
            exit(2);
        }
    }
}

/* The cpu-th (mod their count) of the CPUs this process may use (taskset is respected) into
 * *set; false when they cannot be read. */
static bool pin_set(const bench_opts_t *o, int cpu, cpu_set_t *set) {
    CPU_ZERO(set);
    if (o->ncpu > 0) {
        CPU_SET(o->cpu[cpu % o->ncpu], set);
        return true;
    }
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return false;
    int n = CPU_COUNT(&allowed), want = n ? cpu % n : 0;
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &allowed) && seen++ == want) {
            CPU_SET(c, set);
            break;
        }
    }
    return true;
}

void bench_pin(const bench_opts_t *o, int cpu) {
    cpu_set_t set;
    if (!o->pin || !pin_set(o, cpu, &set))
        return;
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        fprintf(stderr, "ps-bench: could not pin a thread to a CPU; figures are unpinned\n");
}

uint64_t bench_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

uint64_t bench_anon_huge_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

uint64_t bench_rand(uint64_t *s) {
    return pc_rand(s);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_quantile(double *v, size_t n, double q) {
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    const double r = ceil(q * (double)n);
    return v[r < 1 ? 0 : r > (double)n ? n - 1 : (size_t)r - 1];
}

double bench_median3(const double *v) {
    double lo = v[0] < v[1] ? v[0] : v[1], hi = v[0] < v[1] ? v[1] : v[0];
    return v[2] < lo ? lo : (v[2] > hi ? hi : v[2]);
}

uint64_t bench_key(uint64_t i) {
    uint64_t s = i * 2 + 1;
    return bench_rand(&s);
}

/* Threads wait on one barrier with the caller, so the clock starts when all are ready. */
typedef struct gate {
    pthread_barrier_t *barrier;
    void *(*fn)(void *);
    void *ctx;
} gate_t;

static void *gated(void *arg) {
    gate_t *g = arg;
    pthread_barrier_wait(g->barrier);
    return g->fn(g->ctx);
}

double bench_run_threads(int threads, void *(*fn)(void *), void **ctx) {
    enum { MAX_THREADS = 64 };
    pthread_t th[MAX_THREADS];
    gate_t gate[MAX_THREADS];
    pthread_barrier_t barrier;
    if (threads < 1 || threads > MAX_THREADS)
        abort();
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        gate[i] = (gate_t){&barrier, fn, ctx[i]};
        pthread_create(&th[i], NULL, gated, &gate[i]);
    }
    pthread_barrier_wait(&barrier);
    uint64_t t0 = pc_time_mono_ns();
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double secs = pc_time_sec_since(t0);
    pthread_barrier_destroy(&barrier);
    return secs;
}

void bench_emit_json(const bench_opts_t *o, cJSON *root) {
    if (o->json) {
        char *s = cJSON_PrintUnformatted(root);
        printf("%s\n", s);
        fflush(stdout); /* whole, before children sharing stdout print again */
        cJSON_free(s);
    }
    cJSON_Delete(root);
}

void bench_fill(struct ps_table *t, uint64_t n) {
    const size_t chunk = 65536;
    const uint32_t dim = ps_table_dim(t);
    uint64_t *keys = malloc(chunk * sizeof *keys);
    float *rows = malloc(chunk * dim * sizeof *rows);
    if (!keys || !rows)
        abort();
    for (uint64_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? (size_t)(n - off) : chunk;
        for (size_t i = 0; i < m; i++)
            keys[i] = bench_key(off + i);
        if (ps_table_pull(t, keys, m, rows, m * dim))
            abort();
    }
    free(keys);
    free(rows);
}

int bench_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a))
        abort();
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

/* Every CPU into *all (the kernel keeps the ones this process may use). */
static void all_cpus(cpu_set_t *all) {
    CPU_ZERO(all);
    for (int c = 0; c < CPU_SETSIZE; c++)
        CPU_SET(c, all);
}

int bench_spawn(const bench_opts_t *o, char *const argv[]) {
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a bench that aborts leaves no server behind */
        cpu_set_t one; /* CPU 0 of bench_pin even when the caller is pinned elsewhere */
        if (o->pin && pin_set(o, 0, &one)) {
            sched_setaffinity(0, sizeof one, &one);
        } else if (!o->pin) { /* unpinned: every CPU, not the one the caller pinned itself to */
            cpu_set_t all;
            all_cpus(&all);
            sched_setaffinity(0, sizeof all, &all);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

int bench_run_output(const char *cmd, char *out, size_t cap) {
    cpu_set_t mine, all; /* popen's child inherits this thread's set: widened around it */
    const bool had = sched_getaffinity(0, sizeof mine, &mine) == 0;
    all_cpus(&all);
    sched_setaffinity(0, sizeof all, &all);
    FILE *f = popen(cmd, "r");
    if (had)
        sched_setaffinity(0, sizeof mine, &mine);
    if (!f)
        return -1;
    char buf[512];
    const size_t n = fread(out ? out : buf, 1, (out ? cap : sizeof buf) - 1, f);
    (out ? out : buf)[n] = '\0';
    while (fread(buf, 1, sizeof buf, f) > 0) {
    }
    const int st = pclose(f);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int bench_ps_server(const bench_opts_t *o, const char *area, const char *dir, const char *tag,
                    const char *const *extra, int *dport, int *gport) {
    /* a port free when picked may be taken before the server binds it: another, up to 3 times */
    int pid = -1;
    for (int attempt = 0; attempt < 3 && pid < 0; attempt++)
        pid = bench_ps_server_at(o, area, dir, tag, bench_free_port(), extra, dport, gport);
    return pid;
}

int bench_ps_server_at(const bench_opts_t *o, const char *area, const char *dir, const char *tag,
                       int port, const char *const *extra, int *dport, int *gport) {
    char bin[600], pf[320], portarg[32], pfarg[340];
    bench_sibling("ps-server", bin, sizeof bin);
    snprintf(pf, sizeof pf, "%s/port-%s", dir, tag);
    snprintf(portarg, sizeof portarg, "--port=%d", port);
    snprintf(pfarg, sizeof pfarg, "--port-file=%s", pf);
    char *argv[24] = {bin,
                      portarg,
                      pfarg,
                      "--io-threads=1",
                      "--grpc-port=0",
                      "--metrics-port=-1",
                      "--log-level=warn"};
    int a = 7;
    for (; extra && *extra && a < 23; extra++)
        argv[a++] = (char *)*extra;
    argv[a] = NULL;
    const int pid = bench_spawn(o, argv);
    int dp = 0, gp = 0;
    FILE *f = bench_wait_file(pf, 10) ? fopen(pf, "r") : NULL;
    if (!f || fscanf(f, "%d %d", &dp, &gp) != 2 || dp != port) {
        if (f)
            fclose(f);
        fprintf(stderr, "ps-bench %s: %s (%s) did not start\n", area, bin, tag);
        bench_stop(pid);
        return -1;
    }
    fclose(f);
    unlink(pf); /* read: the directory stays removable */
    *dport = dp;
    if (gport)
        *gport = gp;
    return pid;
}

int bench_wait_exit(int pid, double seconds, int *status) {
    for (uint64_t t0 = pc_time_mono_ns(); pc_time_sec_since(t0) < seconds; usleep(10000))
        if (waitpid(pid, status, WNOHANG) == pid)
            return 0;
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return -1;
}

int bench_read_byte(int fd, double seconds, char *ch) {
    const uint64_t t0 = pc_time_mono_ns();
    for (;;) {
        const double left = seconds - pc_time_sec_since(t0);
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        const int n = poll(&p, 1, left > 1 ? 1000 : (int)(left * 1000) + 1);
        if (n < 0 && errno != EINTR)
            return -1;
        if (n > 0) {
            const ssize_t r = read(fd, ch, 1);
            if (r >= 0 || errno != EINTR)
                return r == 1 ? 1 : r == 0 ? 0 : -1;
        }
    }
}

void bench_sync_pipes(int to[2], int from[2]) {
    if (pipe(to) || pipe(from))
        abort();
    (void)fcntl(to[1], F_SETFD, FD_CLOEXEC);
    (void)fcntl(from[0], F_SETFD, FD_CLOEXEC);
}

void bench_stop(int pid) {
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    (void)bench_wait_exit(pid, 5, NULL);
}

bool bench_wait_file(const char *path, double seconds) {
    for (uint64_t t0 = pc_time_mono_ns(); pc_time_sec_since(t0) < seconds; usleep(10000))
        if (access(path, F_OK) == 0)
            return true;
    return false;
}

void bench_sibling(const char *name, char *buf, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0)
        abort();
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash || (size_t)(slash - buf) + 1 + strlen(name) >= cap)
        abort();
    strcpy(slash + 1, name);
}

int bench_python(char *const args[], const char *out_path, bool merge_stderr) {
    char bin[600], lib[700], pypath[600];
    bench_sibling("ps-server", bin, sizeof bin);
    *strrchr(bin, '/') = '\0'; /* the binaries' directory */
    snprintf(lib, sizeof lib, "%s/../lib/libpsclient.so.%d", bin, PSC_VERSION_MAJOR);
    snprintf(pypath, sizeof pypath, "%s/python", EMBER_SOURCE_DIR);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(out_path, "w", stdout) || (merge_stderr && dup2(1, 2) < 0))
            _exit(127);
        setenv("PYTHONPATH", pypath, 1);
        setenv("EMBERPS_LIBPSCLIENT", lib, 1);
        setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
        execv(BENCH_PYTHON, args);
        printf("%s: %s\n", BENCH_PYTHON, strerror(errno));
        _exit(127);
    }
    return pid;
}

cJSON *bench_python_result(const char *out_path, char *last, size_t cap) {
    char line[8192], json[8192] = "";
    if (last)
        last[0] = '\0';
    FILE *f = fopen(out_path, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '{') {
            snprintf(json, sizeof json, "%s", line);
            continue;
        }
        printf("  %s", line);
        if (last)
            snprintf(last, cap, "%.*s", (int)strcspn(line, "\n"), line);
    }
    if (f)
        fclose(f);
    return json[0] ? cJSON_Parse(json) : NULL;
}

void bench_tmpdir(const char *area, char *buf, size_t cap) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    if ((size_t)snprintf(buf, cap, "%s/ps-bench-%s-XXXXXX", base, area) >= cap || !mkdtemp(buf))
        abort();
}
