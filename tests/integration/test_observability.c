/* Worker observability end to end, on 127.0.0.1 (args: BIN_DIR SOURCE_DIR):
 *
 * 1. ps-worker --local reading its training data from a pipe this test feeds: after the first
 *    part, /metrics (--metrics-port=0, the port read from its log) has every worker metric, with
 *    step, samples and pull waits above 0, one epoch, a group of 1 and a finite loss; after the
 *    rest the run ends with status 0 and the endpoint is gone.
 * 2. --metrics-log: every line a JSON object; progress rows with time, step, samples,
 *    samples_per_s, loss; evaluation rows with an AUC above 0.5 and a logloss; samples and time
 *    never go back.
 * 3. psctl plot: the SVG is well-formed XML (libxml2) with the title, the axis labels and both
 *    legends as text, a polyline with a point per loss row and one with a point per evaluation;
 *    the PNG has its signature and an IHDR of PSCTL_PLOT_WIDTH x PSCTL_PLOT_HEIGHT; a log that is
 *    not JSON is exit 1.
 * 4. deploy/grafana/emberps.json parses, has a Prometheus datasource variable, and every metric
 *    an expression or variable query names is in a ps-server's /metrics (tables, checkpoints,
 *    the cold tier, gRPC and the replication's controller on) or in the worker's of test 1: the
 *    dashboard cannot drift.
 *
 * Every wait is bounded; children are killed on the way out.
 */
#include "test_util.h"

#include "pc_time.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../ps-server/tools/psctl_plot.h"

static const char *g_bin, *g_src;
static char g_dir[64] = "/tmp/ember-obs-XXXXXX";
static char *g_worker_scrape; /* test 1's /metrics text, for test 4 */
static pid_t g_children[4];

static void path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

/* ---- processes ---- */

/* Start argv with stdin from in_fd (-1: /dev/null), stdout and stderr into files of g_dir. */
static pid_t spawn(char *const *argv, int in_fd, const char *out_name, const char *err_name) {
    char out[256], err[256];
    path(out, sizeof out, out_name);
    path(err, sizeof err, err_name);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY);
        dup2(fd, 0);
        dup2(open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
        dup2(open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
        execv(argv[0], argv);
        _exit(127);
    }
    for (size_t i = 0; i < sizeof g_children / sizeof g_children[0]; i++)
        if (!g_children[i]) {
            g_children[i] = pid;
            break;
        }
    return pid;
}

/* Wait up to `seconds` for pid; its exit status, or -1 (then it is killed). */
static int wait_exit(pid_t pid, double seconds) {
    const uint64_t t0 = pc_time_mono_ns();
    int st;
    while (pc_time_sec_since(t0) < seconds) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            for (size_t i = 0; i < sizeof g_children / sizeof g_children[0]; i++)
                if (g_children[i] == pid)
                    g_children[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        pc_time_sleep_ms(20);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static int run(char *const *argv, double seconds) {
    return wait_exit(spawn(argv, -1, "run.out", "run.err"), seconds);
}

/* The whole of file `name` in g_dir (NUL-terminated; freed by the caller), or NULL. */
static char *slurp(const char *name, size_t *len) {
    char p[256];
    path(p, sizeof p, name);
    FILE *f = fopen(p, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t got; b && (got = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap)
            b = realloc(b, cap *= 2);
    }
    fclose(f);
    if (b)
        b[n] = '\0';
    if (len)
        *len = n;
    return b;
}

/* The port in "metrics on http://127.0.0.1:PORT/metrics" of log `name`, waiting up to 30 s. */
static int metrics_port(const char *name) {
    const uint64_t t0 = pc_time_mono_ns();
    while (pc_time_sec_since(t0) < 30) {
        char *t = slurp(name, NULL);
        const char *m = t ? strstr(t, "metrics on http://127.0.0.1:") : NULL;
        const int port = m ? atoi(m + strlen("metrics on http://127.0.0.1:")) : 0;
        free(t);
        if (port > 0)
            return port;
        pc_time_sleep_ms(50);
    }
    fail_msg("no \"metrics on http://127.0.0.1:PORT\" in %s within 30 s", name);
    return 0;
}

/* ---- HTTP ---- */

/* GET path from 127.0.0.1:port: the body of a 200 (freed by the caller), or NULL. */
static char *http_get(int port, const char *p) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return NULL;
    }
    char req[256];
    const int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", p);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    for (ssize_t got; b && (got = read(fd, b + len, cap - len - 1)) > 0;) {
        len += (size_t)got;
        if (len + 1 == cap)
            b = realloc(b, cap *= 2);
    }
    close(fd);
    if (!b)
        return NULL;
    b[len] = '\0';
    char *body = strstr(b, "\r\n\r\n");
    if (strncmp(b, "HTTP/1.", 7) || strncmp(b + 9, "200", 3) || !body) {
        free(b);
        return NULL;
    }
    memmove(b, body + 4, strlen(body + 4) + 1);
    return b;
}

/* The value of sample `name` (the whole name before '{' or ' '), or NAN when absent. */
static double sample(const char *text, const char *name) {
    const size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) || (l[n] != ' ' && l[n] != '{'))
            continue;
        const char *v = l[n] == '{' ? strchr(l, '}') : l + n;
        return v ? strtod(v + 1 + (l[n] == '{'), NULL) : NAN;
    }
    return NAN;
}

/* ---- set-up ---- */

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(g_dir))
        return -1;
    char gen[256], out[256], test[256], rows[] = "--rows=12000", trows[] = "--test-rows=1000";
    snprintf(gen, sizeof gen, "%s/ps-datagen", g_bin);
    char o1[300], o2[300];
    path(out, sizeof out, "train.tsv");
    path(test, sizeof test, "test.tsv");
    snprintf(o1, sizeof o1, "--out=%s", out);
    snprintf(o2, sizeof o2, "--test-out=%s", test);
    char *argv[] = {gen, rows, trows, o1, o2, NULL};
    return run(argv, 120) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof g_children / sizeof g_children[0]; i++)
        if (g_children[i]) {
            kill(g_children[i], SIGKILL);
            waitpid(g_children[i], NULL, 0);
        }
    free(g_worker_scrape);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- 1. /metrics during a run ---- */

static const char *const k_worker_metrics[] = {
    "emberps_worker_info",
    "emberps_worker_uptime_seconds",
    "emberps_worker_step",
    "emberps_worker_epoch",
    "emberps_worker_samples_total",
    "emberps_worker_samples_per_second",
    "emberps_worker_loss",
    "emberps_worker_loss_ewma",
    "emberps_worker_eval_auc",
    "emberps_worker_eval_logloss",
    "emberps_worker_evals_total",
    "emberps_worker_pull_wait_seconds_bucket",
    "emberps_worker_pull_wait_seconds_sum",
    "emberps_worker_pull_wait_seconds_count",
    "emberps_worker_sched_queued_jobs",
    "emberps_worker_sched_inflight_bytes",
    "emberps_worker_sched_credit_bytes",
    "emberps_worker_pulled_bytes_total",
    "emberps_worker_pushed_bytes_total",
    "emberps_worker_group_generation",
    "emberps_worker_group_size",
    "emberps_worker_rollbacks_total",
    "emberps_worker_server_reconnects_total",
    "emberps_worker_lost_pushes_total",
};

/* Write lines [from, to) of train.tsv to fd. */
static void feed(int fd, const char *data, int from, int to) {
    const char *p = data;
    for (int i = 0; i < from && p; i++)
        p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    const char *e = p;
    for (int i = from; i < to && e && *e; i++)
        e = strchr(e, '\n') ? strchr(e, '\n') + 1 : e + strlen(e);
    for (size_t off = 0, n = p && e ? (size_t)(e - p) : 0; off < n;) {
        const ssize_t w = write(fd, p + off, n - off);
        assert_true(w > 0);
        off += (size_t)w;
    }
}

static void test_worker_metrics(void **state) {
    (void)state;
    char bin[256], test[256], log[256], a_test[300], a_log[300];
    snprintf(bin, sizeof bin, "%s/ps-worker", g_bin);
    path(test, sizeof test, "test.tsv");
    path(log, sizeof log, "metrics.log");
    snprintf(a_test, sizeof a_test, "--test=%s", test);
    snprintf(a_log, sizeof a_log, "--metrics-log=%s", log);
    char local[] = "--local", dev[] = "--device=cpu", train[] = "--train=-", batch[] = "--batch=64",
         prog[] = "--progress-every=640", ev[] = "--eval-every=4000", port[] = "--metrics-port=0",
         lvl[] = "--log-level=info";
    char *argv[] = {bin, local, dev, train, a_test, batch, prog, ev, port, a_log, lvl, NULL};
    size_t len;
    char *data = slurp("train.tsv", &len);
    assert_non_null(data);
    int fds[2];
    assert_int_equal(pipe2(fds, O_CLOEXEC), 0); /* the child keeps no write end: EOF comes */
    const pid_t pid = spawn(argv, fds[0], "worker.out", "worker.err");
    close(fds[0]);
    feed(fds[1], data, 0, 6000); /* the worker waits for the rest while the test scrapes */
    const int p = metrics_port("worker.err");
    char *text = NULL;
    const uint64_t t0 = pc_time_mono_ns();
    while (pc_time_sec_since(t0) < 60) { /* 20 steps (the reader buffers part of the pipe) */
        free(text);
        text = http_get(p, "/metrics");
        if (text && sample(text, "emberps_worker_samples_total") >= 1280)
            break;
        pc_time_sleep_ms(50);
    }
    assert_non_null(text);
    for (size_t i = 0; i < sizeof k_worker_metrics / sizeof k_worker_metrics[0]; i++)
        if (isnan(sample(text, k_worker_metrics[i])))
            fail_msg("/metrics has no %s:\n%s", k_worker_metrics[i], text);
    assert_true(sample(text, "emberps_worker_step") >= 20); /* 1280 samples / batch 64 */
    assert_true(sample(text, "emberps_worker_samples_total") >= 1280);
    assert_true(sample(text, "emberps_worker_pull_wait_seconds_count") >= 20);
    assert_true(sample(text, "emberps_worker_epoch") == 1);
    assert_true(sample(text, "emberps_worker_group_size") == 1);
    const double loss = sample(text, "emberps_worker_loss_ewma");
    assert_true(loss > 0.05 && loss < 1.5);
    assert_true(sample(text, "emberps_worker_samples_per_second") > 0);
    assert_true(strstr(text, "emberps_worker_info{model=\"dlrm\",rank=\"0\"} 1") != NULL);
    g_worker_scrape = text;
    feed(fds[1], data, 6000, 12000);
    close(fds[1]);
    free(data);
    assert_int_equal(wait_exit(pid, 120), 0);
    char *after = http_get(p, "/metrics"); /* the endpoint lives as long as the run */
    assert_null(after);
}

/* ---- 2. the metrics log ---- */

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void test_metrics_log(void **state) {
    (void)state;
    char *text = slurp("metrics.log", NULL);
    assert_non_null(text);
    int progress = 0, evals = 0, lineno = 0;
    double last_samples = 0, last_time = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        lineno++;
        cJSON *o = cJSON_Parse(l);
        if (!o || !cJSON_IsObject(o))
            fail_msg("metrics log line %d is not a JSON object: %s", lineno, l);
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
        assert_true(cJSON_IsString(kind));
        static const char *const keys[] = {"time", "step",      "samples", "samples_per_s",
                                           "loss", "loss_ewma", "epoch",   "unix_time"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (isnan(num(o, keys[i])))
                fail_msg("metrics log line %d has no number %s: %s", lineno, keys[i], l);
        assert_true(num(o, "samples") >= last_samples && num(o, "time") >= last_time);
        last_samples = num(o, "samples");
        last_time = num(o, "time");
        assert_true(num(o, "step") > 0 && num(o, "loss") > 0);
        if (strcmp(kind->valuestring, "eval") == 0) {
            evals++;
            assert_true(num(o, "auc") > 0.5 && num(o, "auc") < 1);
            assert_true(num(o, "logloss") > 0 && num(o, "test_samples") == 1000);
        } else {
            assert_string_equal(kind->valuestring, "progress");
            assert_true(isnan(num(o, "auc")));
            progress++;
        }
        cJSON_Delete(o);
    }
    free(text);
    /* 12000 samples: a row every 640, an evaluation every 4000 and one at the end */
    assert_int_equal(progress, 12000 / 640);
    assert_int_equal(evals, 12000 / 4000 + 1);
    assert_true(last_samples == 12000);
}

/* ---- 3. the plot ---- */

static void texts(xmlNode *n, char *buf, size_t cap) {
    for (; n; n = n->next) {
        if (n->type == XML_ELEMENT_NODE && !xmlStrcmp(n->name, (const xmlChar *)"text")) {
            xmlChar *c = xmlNodeGetContent(n);
            const size_t len = strlen(buf);
            snprintf(buf + len, cap - len, "%s|", (const char *)c);
            xmlFree(c);
        }
        texts(n->children, buf, cap);
    }
}

/* The number of points of every polyline under n, into counts (at most cap). */
static void polylines(xmlNode *n, int *counts, int *nc, int cap) {
    for (; n; n = n->next) {
        if (n->type == XML_ELEMENT_NODE && !xmlStrcmp(n->name, (const xmlChar *)"polyline") &&
            *nc < cap) {
            xmlChar *pts = xmlGetProp(n, (const xmlChar *)"points");
            int k = 0;
            for (const char *p = (const char *)pts; p && *p;) {
                p += strspn(p, " \t\n");
                if (*p) {
                    k++;
                    p += strcspn(p, " \t\n");
                }
            }
            counts[(*nc)++] = k;
            xmlFree(pts);
        }
        polylines(n->children, counts, nc, cap);
    }
}

static int plot(const char *in_name, const char *out_name) {
    char psctl[256], in[256], out[256];
    snprintf(psctl, sizeof psctl, "%s/psctl", g_bin);
    path(in, sizeof in, in_name);
    path(out, sizeof out, out_name);
    char cmd[] = "plot";
    char *argv[] = {psctl, cmd, in, out, NULL};
    return run(argv, 60);
}

static void test_plot(void **state) {
    (void)state;
    assert_int_equal(plot("metrics.log", "curves.svg"), 0);
    char svg[256];
    path(svg, sizeof svg, "curves.svg");
    xmlDoc *doc = xmlReadFile(svg, NULL, XML_PARSE_NONET);
    assert_non_null(doc); /* well-formed */
    xmlNode *root = xmlDocGetRootElement(doc);
    assert_string_equal((const char *)root->name, "svg");
    static char t[1 << 16];
    t[0] = '\0';
    texts(root, t, sizeof t);
    static const char *const want[] = {"EmberPS training: loss and test AUC",
                                       "samples",
                                       "loss (BCE)",
                                       "test AUC",
                                       "train loss (moving average)",
                                       "batch loss",
                                       "test AUC (per evaluation)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char needle[128];
        snprintf(needle, sizeof needle, "|%s|", want[i]);
        if (!strstr(t, needle) && strncmp(t, needle + 1, strlen(needle + 1)))
            fail_msg("the plot has no text \"%s\": %s", want[i], t);
    }
    /* the series: loss and moving average, a point per row (18 + 4); AUC, a point per eval */
    int counts[4096], nc = 0, rows = 0, aucs = 0;
    polylines(root, counts, &nc, 4096);
    for (int i = 0; i < nc; i++) {
        rows += counts[i] == 12000 / 640 + 4;
        aucs += counts[i] == 4;
    }
    assert_true(rows >= 2);
    assert_true(aucs >= 1);
    xmlFreeDoc(doc);
    /* PNG: signature, IHDR, size */
    assert_int_equal(plot("metrics.log", "curves.png"), 0);
    size_t len;
    unsigned char *png = (unsigned char *)slurp("curves.png", &len);
    assert_non_null(png);
    assert_true(len > 1000);
    assert_memory_equal(png, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(png + 12, "IHDR", 4);
    const unsigned w = (unsigned)png[16] << 24 | png[17] << 16 | png[18] << 8 | png[19];
    const unsigned h = (unsigned)png[20] << 24 | png[21] << 16 | png[22] << 8 | png[23];
    assert_int_equal(w, PSCTL_PLOT_WIDTH);
    assert_int_equal(h, PSCTL_PLOT_HEIGHT);
    free(png);
    /* not a metrics log */
    char bad[256];
    path(bad, sizeof bad, "bad.log");
    FILE *f = fopen(bad, "w");
    fputs("{\"kind\":\"progress\",\"samples\":64,\"loss\":0.6}\nnot json\n", f);
    fclose(f);
    assert_int_equal(plot("bad.log", "bad.svg"), 1);
}

/* ---- 4. the Grafana dashboard ---- */

/* Every emberps_* name in s must be a sample name in one of the scrapes. */
static int check_expr(const char *s, const char *const *scrapes, int n) {
    int found = 0;
    for (const char *p = strstr(s, "emberps_"); p; p = strstr(p, "emberps_")) {
        char name[128];
        size_t k = 0;
        while (k < sizeof name - 1 &&
               (p[k] == '_' || (p[k] >= 'a' && p[k] <= 'z') || (p[k] >= '0' && p[k] <= '9')))
            name[k] = p[k], k++;
        name[k] = '\0';
        bool ok = false;
        for (int i = 0; i < n && !ok; i++)
            ok = !isnan(sample(scrapes[i], name));
        if (!ok)
            fail_msg("the dashboard names %s, which no /metrics has (in: %s)", name, s);
        found++;
        p += k;
    }
    return found;
}

static void walk(const cJSON *j, const char *const *scrapes, int n, int *exprs, int *names) {
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
        if (cJSON_IsString(c) && c->string &&
            (!strcmp(c->string, "expr") || !strcmp(c->string, "query") ||
             !strcmp(c->string, "definition"))) {
            *names += check_expr(c->valuestring, scrapes, n);
            *exprs += !strcmp(c->string, "expr");
        }
        walk(c, scrapes, n, exprs, names);
    }
}

static void test_grafana(void **state) {
    (void)state;
    assert_non_null(g_worker_scrape); /* from test 1 */
    char srv[256], tables[] = "--tables=name=emb,dim=8;name=cold,dim=8,cold=true,capacity_rows=100",
                   port[] = "--port=0", grpc[] = "--grpc-port=0", mport[] = "--metrics-port=0",
                   lvl[] = "--log-level=info", ckpt[300], tier[300], dir[256],
                   coord[] = "--coordinator", self[] = "--cluster-coordinator=self";
    snprintf(srv, sizeof srv, "%s/ps-server", g_bin);
    path(dir, sizeof dir, "srv-ckpt");
    snprintf(ckpt, sizeof ckpt, "--ckpt-dir=%s", dir);
    path(dir, sizeof dir, "srv-tier");
    snprintf(tier, sizeof tier, "--tier-dir=%s", dir);
    /* its own coordinator: the replication's controller runs, and its metrics are there */
    char *argv[] = {srv, port, grpc, mport, tables, ckpt, tier, lvl, coord, self, NULL};
    const pid_t pid = spawn(argv, -1, "server.out", "server.err");
    char *server = NULL;
    const int p = metrics_port("server.err");
    const uint64_t t0 = pc_time_mono_ns();
    while (!server && pc_time_sec_since(t0) < 30) {
        server = http_get(p, "/metrics");
        if (!server)
            pc_time_sleep_ms(50);
    }
    kill(pid, SIGTERM);
    assert_int_equal(wait_exit(pid, 60), 0);
    assert_non_null(server);
    char file[512];
    snprintf(file, sizeof file, "%s/deploy/grafana/emberps.json", g_src);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    static char text[1 << 20];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *d = cJSON_Parse(text);
    if (!d)
        fail_msg("%s is not JSON (near: %.40s)", file, cJSON_GetErrorPtr());
    /* a Prometheus datasource variable, and every panel on it */
    const cJSON *vars =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "templating"), "list");
    bool ds = false;
    for (const cJSON *v = vars ? vars->child : NULL; v; v = v->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type"),
                    *q = cJSON_GetObjectItemCaseSensitive(v, "query");
        ds |= cJSON_IsString(type) && !strcmp(type->valuestring, "datasource") &&
              cJSON_IsString(q) && !strcmp(q->valuestring, "prometheus");
    }
    assert_true(ds);
    const cJSON *panels = cJSON_GetObjectItemCaseSensitive(d, "panels");
    int npanels = 0;
    for (const cJSON *pn = panels ? panels->child : NULL; pn; pn = pn->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(pn, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "row"))
            continue;
        const cJSON *uid = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(pn, "datasource"), "uid");
        assert_true(cJSON_IsString(uid) && !strcmp(uid->valuestring, "${DS_PROMETHEUS}"));
        npanels++;
    }
    const char *scrapes[] = {server, g_worker_scrape};
    int exprs = 0, names = 0;
    walk(d, scrapes, 2, &exprs, &names);
    print_message("dashboard: %d panels, %d expressions, %d metric references checked\n", npanels,
                  exprs, names);
    assert_true(npanels >= 20 && exprs >= 40);
    /* every worker metric and every server metric family is on the dashboard */
    for (size_t i = 0; i < sizeof k_worker_metrics / sizeof k_worker_metrics[0]; i++) {
        char base[128];
        snprintf(base, sizeof base, "%s", k_worker_metrics[i]);
        char *suffix = strstr(base, "_seconds_");
        if (suffix)
            suffix[strlen("_seconds")] = '\0';
        if (!strstr(text, base))
            fail_msg("the dashboard does not show %s", base);
    }
    cJSON_Delete(d);
    free(server);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_observability BIN_DIR SOURCE_DIR\n");
        return 2;
    }
    g_bin = argv[1];
    g_src = argv[2];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_metrics),
        cmocka_unit_test(test_metrics_log),
        cmocka_unit_test(test_plot),
        cmocka_unit_test(test_grafana),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
