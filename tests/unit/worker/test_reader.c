/* The reader: plain and gzip files give the same samples in file order, across epochs; files are
 * split by rank; bad lines are counted and skipped, and too many stop the stream with PC_EPARSE;
 * a missing file is PC_EIO; resuming at pw_reader_consumed() continues exactly; closing early
 * never hangs. A TCP source gives the same samples as the file its producers send (in odd chunk
 * sizes, a last line without newline, two producers at once); CSV headers are skipped per file
 * and per connection. Samples with more features than a batch's first allocation holds grow
 * every slot of the queue on its own (libsvm, 40-119 features a sample, batch 4). Counts per
 * source (lines read, samples, malformed, the first malformed line; blank lines skipped), and
 * the error-rate rule on small files (at a file's end), each stop said in one line naming the
 * file; a resume skips no stream's lines, judges a file entered near its end by a large enough
 * rest only, and counts lines after the last batch as consumed. Every test runs twice, parsing on
 * the reader thread and on 3 parse threads, and parse threads (1, 2, 5) give exactly the batches,
 * counts and stops of the reader thread. */
#include "table_check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include "pc_error.h"
#include "pw_datagen.h"
#include "pc_log.h"
#include "pw_reader.h"

static char g_dir[256];

/* Write `rows` generated lines (with a bad line every `bad_every` lines, 0: none) to path,
 * gzip-compressed when gz. */
static void write_data(const char *path, uint64_t rows, uint64_t seed, int bad_every, bool gz) {
    pw_datagen_opts_t o;
    pw_datagen_defaults(&o);
    o.seed = seed;
    o.vocab_max = 10000;
    pw_datagen_t *gen;
    assert_int_equal(pw_datagen_create(&o, &gen), 0);
    FILE *f = gz ? NULL : fopen(path, "w");
    gzFile g = gz ? gzopen(path, "wb") : NULL;
    assert_true(f || g);
    char line[1024];
    for (uint64_t r = 0; r < rows; r++) {
        size_t n = pw_datagen_row(gen, 0, r, line, NULL);
        if (bad_every && r % (uint64_t)bad_every == 7 % (uint64_t)bad_every)
            n = (size_t)sprintf(line, "garbage line %llu\n", (unsigned long long)r);
        if (gz)
            assert_int_equal(gzwrite(g, line, (unsigned)n), (int)n);
        else
            assert_int_equal(fwrite(line, 1, n, f), n);
    }
    if (gz)
        gzclose(g);
    else
        fclose(f);
    pw_datagen_destroy(gen);
}

typedef struct seen {
    uint64_t samples, lines;
    double label_sum;
    uint64_t key_hash;
} seen_t;

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* A deduplicating reader's unique keys: distinct, in first-seen order, and feature j's key is
 * ukeys[inv[j]]. */
static void check_unique(const pw_batch_t *b) {
    const size_t nk = b->key_off[b->n];
    assert_true(b->nu <= nk && (nk == 0 || b->nu > 0));
    uint32_t next = 0; /* the first-seen order: a new index is the next one */
    for (size_t j = 0; j < nk; j++) {
        assert_true(b->inv[j] < b->nu && b->ukeys[b->inv[j]] == b->keys[j]);
        assert_true(b->inv[j] <= next);
        next += b->inv[j] == next;
    }
    assert_int_equal(next, b->nu); /* every unique key used */
    uint64_t *sorted = malloc((b->nu + 1) * sizeof *sorted);
    memcpy(sorted, b->ukeys, b->nu * sizeof *sorted);
    qsort(sorted, b->nu, sizeof *sorted, cmp_u64);
    for (size_t i = 1; i < b->nu; i++)
        assert_true(sorted[i - 1] != sorted[i]); /* no key twice */
    free(sorted);
}

static int drain(pw_reader_t *r, seen_t *s, size_t max_batches) {
    memset(s, 0, sizeof *s);
    const pw_batch_t *b;
    for (size_t k = 0; k < max_batches && (b = pw_reader_next(r)); k++) {
        s->samples += b->n;
        s->lines += b->lines;
        if (b->ukeys)
            check_unique(b);
        for (size_t i = 0; i < b->n; i++) {
            s->label_sum += b->labels[i];
            for (size_t j = b->key_off[i]; j < b->key_off[i + 1]; j++)
                s->key_hash = s->key_hash * 31 + b->keys[j];
        }
    }
    return pw_reader_error(r);
}

/* Parse threads of every reader opts() sets up: main runs the tests with 0 and with 3 (which
 * also dedup each batch). */
static int g_parse_threads;

static pw_reader_opts_t opts(const char *const *paths, size_t n) {
    return (pw_reader_opts_t){.format = PW_FMT_CRITEO,
                              .paths = paths,
                              .npaths = n,
                              .world = 1,
                              .batch = 256,
                              .queue = 2,
                              .epochs = 1,
                              .max_error_rate = 0.05,
                              .parse_threads = g_parse_threads,
                              .dedup = g_parse_threads > 0};
}

/* A reader with o read to its end without error, then closed: the samples seen and its totals. */
static void read_through(const pw_reader_opts_t *o, seen_t *s, pw_reader_stats_t *st) {
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(o, &r), 0);
    assert_int_equal(drain(r, s, SIZE_MAX), 0);
    pw_reader_stats(r, st);
    pw_reader_close(r);
}

static void test_plain_gzip_epochs(void **state) {
    (void)state;
    char plain[300], gz[300];
    snprintf(plain, sizeof plain, "%s/a.tsv", g_dir);
    snprintf(gz, sizeof gz, "%s/a.tsv.gz", g_dir);
    write_data(plain, 5000, 1, 0, false);
    write_data(gz, 5000, 1, 0, true);
    const char *p1[] = {plain}, *p2[] = {gz};
    pw_reader_opts_t o = opts(p1, 1);
    pw_reader_t *r;
    seen_t a, b;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &a, SIZE_MAX), 0);
    pw_reader_close(r);
    o = opts(p2, 1);
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &b, SIZE_MAX), 0);
    pw_reader_stats_t st;
    pw_reader_stats(r, &st);
    pw_reader_close(r);
    assert_int_equal(a.samples, 5000);
    assert_int_equal(a.lines, 5000);
    assert_true(a.key_hash == b.key_hash && a.label_sum == b.label_sum);
    assert_int_equal(st.bad, 0);
    o = opts(p1, 1);
    o.epochs = 3;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &b, SIZE_MAX), 0);
    pw_reader_close(r);
    assert_int_equal(b.samples, 15000);
}

static void test_rank_split(void **state) {
    (void)state;
    char f[3][300];
    const char *paths[3];
    for (int i = 0; i < 3; i++) {
        snprintf(f[i], sizeof f[i], "%s/part%d.tsv", g_dir, i);
        write_data(f[i], 1000 * (uint64_t)(i + 1), 10 + (uint64_t)i, 0, false);
        paths[i] = f[i];
    }
    seen_t s0, s1;
    pw_reader_opts_t o = opts(paths, 3);
    o.world = 2;
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &s0, SIZE_MAX), 0);
    pw_reader_close(r);
    o.rank = 1;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &s1, SIZE_MAX), 0);
    pw_reader_close(r);
    assert_int_equal(s0.samples, 1000 + 3000); /* files 0 and 2 */
    assert_int_equal(s1.samples, 2000);
}

static void test_bad_lines_and_errors(void **state) {
    (void)state;
    char few[300], many[300], missing[300];
    snprintf(few, sizeof few, "%s/few.tsv", g_dir);
    snprintf(many, sizeof many, "%s/many.tsv", g_dir);
    snprintf(missing, sizeof missing, "%s/nope.tsv", g_dir);
    write_data(few, 4000, 3, 100, false); /* 1% bad */
    write_data(many, 4000, 3, 2, false);  /* 50% bad */
    const char *p1[] = {few}, *p2[] = {many}, *p3[] = {missing};
    pw_reader_t *r;
    seen_t s;
    pw_reader_opts_t o = opts(p1, 1);
    pw_reader_stats_t st;
    read_through(&o, &s, &st);
    assert_int_equal(st.bad, 40);
    assert_int_equal(s.samples, 3960);
    assert_int_equal(s.lines, 4000); /* bad lines count toward the offsets */
    o = opts(p2, 1);
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &s, SIZE_MAX), PC_EPARSE);
    pw_reader_close(r);
    o = opts(p3, 1);
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &s, SIZE_MAX), PC_EIO);
    pw_reader_close(r);
    o.batch = 0;
    assert_int_equal(pw_reader_open(&o, &r), PC_EINVAL);
}

static void test_resume_and_early_close(void **state) {
    (void)state;
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/r1.tsv", g_dir);
    snprintf(b, sizeof b, "%s/r2.tsv", g_dir);
    write_data(a, 3000, 21, 50, false);
    write_data(b, 2000, 22, 0, false);
    const char *paths[] = {a, b};
    pw_reader_opts_t o = opts(paths, 2);
    o.epochs = 2;
    pw_reader_t *r;
    seen_t all, head, tail;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &all, SIZE_MAX), 0);
    pw_reader_close(r);
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &head, 13), 0); /* a "checkpoint" after 13 batches */
    const uint64_t at = pw_reader_consumed(r);
    pw_reader_close(r); /* early: the reader thread is blocked on a full queue */
    assert_int_equal(at, head.lines);
    o.skip_lines = at;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &tail, SIZE_MAX), 0);
    pw_reader_close(r);
    assert_int_equal(head.samples + tail.samples, all.samples);
    assert_int_equal(head.lines + tail.lines, all.lines);
    assert_true(fabs(head.label_sum + tail.label_sum - all.label_sum) < 1e-6);
}

/* A resume that enters a file near its end judges the file's rest by the error-rate rule only
 * when that rest is large enough (one bad line in the 50 lines after the skip is not 2% of the
 * file); lines after the last full batch (bad ones here) are consumed at the end, so a worker
 * resumed from there reads nothing again. */
static void test_resume_tail(void **state) {
    (void)state;
    char a[300];
    snprintf(a, sizeof a, "%s/tail.tsv", g_dir);
    write_data(a, 3000, 23, 0, false);
    FILE *f = fopen(a, "a"); /* one bad line near the end, 3 more after the last full batch */
    fputs("bad line in the last 50\n", f);
    fclose(f);
    const char *paths[] = {a};
    pw_reader_opts_t o = opts(paths, 1);
    o.max_error_rate = 0.01;
    o.batch = 3001; /* one batch of every line but the bad one */
    seen_t all;
    pw_reader_stats_t st;
    read_through(&o, &all, &st);
    assert_int_equal(all.samples, 3000);
    pw_reader_t *r;
    o.batch = 100; /* 30 full batches, then the bad line alone */
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &all, SIZE_MAX), 0);
    assert_int_equal(pw_reader_consumed(r), 3001); /* 3000 before: the bad line read again */
    pw_reader_close(r);
    o.skip_lines = 2951; /* 49 good lines and the bad one left */
    assert_int_equal(pw_reader_open(&o, &r), 0);
    seen_t tail;
    assert_int_equal(drain(r, &tail, SIZE_MAX), 0); /* PC_EPARSE before: 1 of 50 > 1% */
    assert_int_equal(tail.samples, 49);
    assert_int_equal(pw_reader_consumed(r), 3001);
    pw_reader_close(r);
    /* the pass after a resumed one reads the file whole: judged at its end again (10% bad over
     * 5%: stopped; the first pass, 50 lines after the skip, was not judged) */
    char b[300];
    snprintf(b, sizeof b, "%s/tail2.tsv", g_dir);
    write_data(b, 100, 24, 10, false);
    const char *p2[] = {b};
    o = opts(p2, 1);
    o.epochs = 2;
    o.skip_lines = 50;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &tail, SIZE_MAX), PC_EPARSE);
    print_message("second pass: %s\n", pw_reader_error_text(r));
    pw_reader_close(r);
}

static void test_wide_samples(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/wide.svm", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    enum { ROWS = 400 };
    for (int i = 0; i < ROWS; i++) {
        fprintf(f, "%d", i % 2);
        for (int j = 0; j < 40 + i % 80; j++)
            fprintf(f, " %d:%d", i * 1000 + j, j + 1);
        fputc('\n', f);
    }
    fclose(f);
    const char *p[] = {path};
    pw_reader_opts_t o = opts(p, 1);
    o.format = PW_FMT_LIBSVM;
    o.batch = 4;
    o.queue = 3;
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    int row = 0;
    for (const pw_batch_t *b; (b = pw_reader_next(r));)
        for (size_t i = 0; i < b->n; i++, row++) {
            const size_t n = b->key_off[i + 1] - b->key_off[i];
            assert_int_equal(n, 40 + row % 80);
            assert_true(b->labels[i] == (float)(row % 2));
            for (size_t j = 0; j < n; j++)
                assert_true(b->vals[b->key_off[i] + j] == (float)(j + 1));
        }
    assert_int_equal(pw_reader_error(r), 0);
    assert_int_equal(row, ROWS);
    pw_reader_close(r);
}

/* Write `lines` (NULL-terminated) to path. */
static void write_lines(const char *path, const char *const *lines) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (size_t i = 0; lines[i]; i++)
        fputs(lines[i], f);
    fclose(f);
}

/* Drain the reader of paths (Criteo, rate as given): its error. */
static int read_all_of(const char *const *paths, size_t n, double rate, int epochs,
                       pw_reader_t **out) {
    pw_reader_opts_t o = opts(paths, n);
    o.max_error_rate = rate;
    o.epochs = epochs;
    assert_int_equal(pw_reader_open(&o, out), 0);
    seen_t s;
    return drain(*out, &s, SIZE_MAX);
}

/* Per-source counts: lines read, samples, malformed lines and the first malformed line, per
 * file and over epochs; blank lines are none of them (but count toward positions); another
 * rank's file is not this reader's. */
static void test_source_counts(void **state) {
    (void)state;
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/sa.tsv", g_dir);
    snprintf(b, sizeof b, "%s/sb.tsv", g_dir);
    write_data(a, 50, 31, 25, false); /* lines 8 and 33 bad: 4% */
    FILE *f = fopen(a, "a");
    fputs("\n\r\n", f); /* two blank lines */
    fclose(f);
    write_data(b, 30, 32, 0, false);
    const char *paths[] = {a, b};
    pw_reader_opts_t o = opts(paths, 2);
    o.epochs = 2;
    pw_reader_t *r;
    seen_t s;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &s, SIZE_MAX), 0);
    assert_string_equal(pw_reader_error_text(r), "");
    pw_reader_source_t sa, sb;
    assert_int_equal(pw_reader_source_stats(r, 0, &sa), 0);
    assert_int_equal(pw_reader_source_stats(r, 1, &sb), 0);
    assert_int_equal(pw_reader_source_stats(r, 2, &sb), PC_ENOTFOUND);
    pw_reader_stats_t st;
    pw_reader_stats(r, &st);
    assert_string_equal(sa.path, a); /* the reader's copy: valid until close */
    pw_reader_close(r);
    assert_true(sa.lines == 100 && sa.samples == 96 && sa.bad == 4);
    assert_int_equal(sa.first_bad_line, 8);
    assert_string_equal(sa.first_bad, "line 8: expected 40 tab-separated fields, got 1");
    assert_true(sb.lines == 60 && sb.samples == 60 && sb.bad == 0 && sb.first_bad_line == 0);
    assert_string_equal(sb.first_bad, "");
    assert_true(st.lines == 160 && st.samples == 156 && st.bad == 4);
    assert_int_equal(s.lines, 2 * (52 + 30)); /* positions count the blank lines */
    /* rank 0 of 2: file 1 is rank 1's */
    o.world = 2;
    o.epochs = 1;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &s, SIZE_MAX), 0);
    assert_int_equal(pw_reader_source_stats(r, 1, &sb), PC_ENOTFOUND);
    assert_int_equal(pw_reader_source_stats(r, 0, &sa), 0);
    assert_true(sa.lines == 50 && sa.samples == 48);
    pw_reader_close(r);
}

/* The error-rate rule holds for small files (checked at a file's end): 5 bad of 50 is over 0.05
 * and stops the stream with one line naming the file; 2 of 50 is not. A file without a usable
 * line says so; an empty file is no error for the reader (the trainer decides); a missing file
 * is named. */
static void test_small_file_rate(void **state) {
    (void)state;
    char over[300], under[300], bad[300], empty[300], missing[300];
    snprintf(over, sizeof over, "%s/over.tsv", g_dir);
    snprintf(under, sizeof under, "%s/under.tsv", g_dir);
    snprintf(bad, sizeof bad, "%s/allbad.tsv", g_dir);
    snprintf(empty, sizeof empty, "%s/empty.tsv", g_dir);
    snprintf(missing, sizeof missing, "%s/missing.tsv", g_dir);
    write_data(over, 50, 41, 10, false);  /* 5 bad */
    write_data(under, 50, 41, 25, false); /* 2 bad */
    write_lines(bad, (const char *const[]){"1\tx\n", "0 3:1\n", "garbage\n", NULL});
    write_lines(empty, (const char *const[]){NULL});
    char want[600];
    const char *p[] = {over};
    pw_reader_t *r;
    assert_int_equal(read_all_of(p, 1, 0.05, 1, &r), PC_EPARSE);
    snprintf(want, sizeof want,
             "%s: 5 of 50 lines malformed, over max_error_rate 0.05 (first: line 8: expected 40 "
             "tab-separated fields, got 1)",
             over);
    assert_string_equal(pw_reader_error_text(r), want);
    pw_reader_close(r);
    assert_int_equal(read_all_of(p, 1, 0.1, 1, &r), 0); /* exactly at the limit: allowed */
    pw_reader_close(r);
    p[0] = under;
    assert_int_equal(read_all_of(p, 1, 0.05, 1, &r), 0);
    pw_reader_close(r);
    p[0] = bad;
    assert_int_equal(read_all_of(p, 1, 0.05, 1, &r), PC_EPARSE);
    snprintf(want, sizeof want,
             "%s: no usable samples: 3 lines read, 3 malformed (first: line 1: expected 40 "
             "tab-separated fields, got 2)",
             bad);
    assert_string_equal(pw_reader_error_text(r), want);
    pw_reader_close(r);
    assert_int_equal(read_all_of(p, 1, 1.0, 1, &r), 0); /* all may be bad: the caller decides */
    pw_reader_close(r);
    p[0] = empty;
    assert_int_equal(read_all_of(p, 1, 0.05, 1, &r), 0);
    pw_reader_source_t st;
    assert_int_equal(pw_reader_source_stats(r, 0, &st), 0);
    assert_true(st.lines == 0 && st.samples == 0 && st.bad == 0);
    pw_reader_close(r);
    p[0] = missing;
    assert_int_equal(read_all_of(p, 1, 0.05, 1, &r), PC_EIO);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", missing);
    assert_string_equal(pw_reader_error_text(r), want);
    pw_reader_close(r);
}

static int setup(void **state) {
    (void)state;
    tc_tmpdir(g_dir, sizeof g_dir, "reader");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tc_rmdir(g_dir);
    return 0;
}

/* ---- TCP source ---- */

typedef struct producer {
    int port;
    const char *data;
    size_t len, chunk; /* send in pieces of `chunk` bytes (varying a little) */
    bool reset;        /* end with a reset (RST), not a close (FIN) */
} producer_t;

static void *produce(void *arg) {
    producer_t *p = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    for (size_t off = 0, k = 0; off < p->len; k++) {
        size_t n = p->chunk + k % 5;
        n = n > p->len - off ? p->len - off : n;
        ssize_t w = send(fd, p->data + off, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        off += (size_t)w;
    }
    if (p->reset) { /* the data is on its way first: a reset discards what is not sent */
        usleep(100 * 1000);
        const struct linger lg = {.l_onoff = 1, .l_linger = 0};
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    }
    close(fd);
    return NULL;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*len + 1);
    assert_int_equal(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static void test_tcp_source(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/tcp.tsv", g_dir);
    write_data(path, 3000, 4, 500, false); /* with bad lines */
    const char *p1[] = {path}, *tcp[] = {"tcp://127.0.0.1:0"};
    pw_reader_opts_t o = opts(p1, 1);
    pw_reader_t *r;
    seen_t file, net;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(pw_reader_tcp_port(r), -1); /* no TCP source */
    assert_int_equal(drain(r, &file, SIZE_MAX), 0);
    pw_reader_close(r);
    size_t len;
    char *data = read_all(path, &len);
    data[--len] = '\0'; /* the last line loses its newline */
    /* One producer, odd chunks: the same samples in the same order. */
    o = opts(tcp, 1);
    o.tcp_end_idle_ms = 200;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    producer_t pa = {.port = pw_reader_tcp_port(r), .data = data, .len = len, .chunk = 7};
    assert_true(pa.port > 0);
    pthread_t th[2];
    pthread_create(&th[0], NULL, produce, &pa);
    assert_int_equal(drain(r, &net, SIZE_MAX), 0);
    pthread_join(th[0], NULL);
    pw_reader_stats_t st;
    pw_reader_stats(r, &st);
    pw_reader_close(r);
    assert_int_equal(net.samples, file.samples);
    assert_true(net.key_hash == file.key_hash && net.label_sum == file.label_sum);
    assert_int_equal(st.bad, 6);
    /* Two producers at once, each half the lines: every sample once. */
    const char *mid = strchr(data + len / 2, '\n') + 1;
    producer_t h1 = {.data = data, .len = (size_t)(mid - data), .chunk = 1000},
               h2 = {.data = mid, .len = len - (size_t)(mid - data), .chunk = 333};
    assert_int_equal(pw_reader_open(&o, &r), 0);
    h1.port = h2.port = pw_reader_tcp_port(r);
    pthread_create(&th[0], NULL, produce, &h1);
    pthread_create(&th[1], NULL, produce, &h2);
    assert_int_equal(drain(r, &net, SIZE_MAX), 0);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    pw_reader_close(r);
    assert_int_equal(net.samples, file.samples);
    assert_true(net.label_sum == file.label_sum);
    /* A resumed reader skips no lines of a stream: its producer sends from where it knows. */
    o.skip_lines = 1000;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    pa.port = pw_reader_tcp_port(r);
    pthread_create(&th[0], NULL, produce, &pa);
    assert_int_equal(drain(r, &net, SIZE_MAX), 0);
    pthread_join(th[0], NULL);
    pw_reader_close(r);
    assert_int_equal(net.samples, file.samples);
    o.skip_lines = 0;
    /* A stream before a file: positions count the file's lines only (a resume skips none of the
     * stream's), so a resume at the position after both skips the file's lines exactly. */
    const char *mixed[] = {"tcp://127.0.0.1:0", path};
    pw_reader_opts_t om = opts(mixed, 2);
    om.tcp_end_idle_ms = 200;
    assert_int_equal(pw_reader_open(&om, &r), 0);
    pa.port = pw_reader_tcp_port(r);
    pthread_create(&th[0], NULL, produce, &pa);
    seen_t both;
    assert_int_equal(drain(r, &both, SIZE_MAX), 0);
    pthread_join(th[0], NULL);
    assert_int_equal(both.samples, 2 * file.samples);
    assert_int_equal(pw_reader_consumed(r), 3000); /* the file's lines, not 6000 */
    pw_reader_close(r);
    om.skip_lines = 1000; /* part of the file: the stream whole, the file's last 2000 lines */
    seen_t rest;
    o = opts(p1, 1);
    o.skip_lines = 1000;
    read_through(&o, &rest, &st);
    assert_int_equal(pw_reader_open(&om, &r), 0);
    pa.port = pw_reader_tcp_port(r);
    pthread_create(&th[0], NULL, produce, &pa);
    assert_int_equal(drain(r, &both, SIZE_MAX), 0);
    pthread_join(th[0], NULL);
    assert_int_equal(both.samples, file.samples + rest.samples);
    assert_int_equal(pw_reader_consumed(r), 3000);
    pw_reader_close(r);
    o = opts(tcp, 1);
    o.tcp_end_idle_ms = 200;
    /* Closing while nobody connected returns promptly; a bad address is PC_EINVAL. */
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_true(pw_reader_tcp_port(r) > 0);
    pw_reader_close(r);
    const char *badaddr[] = {"tcp://127.0.0.1"};
    o = opts(badaddr, 1);
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(pw_reader_tcp_port(r), -1);
    assert_null(pw_reader_next(r));
    assert_int_equal(pw_reader_error(r), PC_EINVAL);
    pw_reader_close(r);
    free(data);
}

/* A producer whose connection fails (a reset) in the middle of a line: the lines before it are
 * samples, the cut line is counted malformed even though what arrived of it parses (its last
 * key cut short), never a sample. */
static void test_tcp_cut_line(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/cut.tsv", g_dir);
    write_data(path, 51, 5, 0, false);
    size_t len;
    char *data = read_all(path, &len);
    len -= 4; /* line 51 without its newline and the last 3 characters of its last key */
    const char *tcp[] = {"tcp://127.0.0.1:0"};
    pw_reader_opts_t o = opts(tcp, 1);
    o.tcp_end_idle_ms = 200;
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    producer_t pa = {
        .port = pw_reader_tcp_port(r), .data = data, .len = len, .chunk = 4096, .reset = true};
    pthread_t th;
    pthread_create(&th, NULL, produce, &pa);
    seen_t net;
    assert_int_equal(drain(r, &net, SIZE_MAX), 0);
    pthread_join(th, NULL);
    pw_reader_stats_t st;
    pw_reader_stats(r, &st);
    pw_reader_close(r);
    assert_int_equal(net.samples, 50);
    assert_int_equal(st.bad, 1);
    free(data);
}

/* NUL bytes are data, whatever a C string says: a line with one inside is refused (it is not
 * cut at the NUL and taken), a line of NULs is malformed (not blank), and an over-long line
 * with a NUL past its first MiB is one malformed line that takes nothing of the next; plain and
 * gzip files alike. */
static void test_nul_bytes(void **state) {
    (void)state;
    char good[300], path[300];
    snprintf(good, sizeof good, "%s/nul_good.tsv", g_dir);
    write_data(good, 100, 6, 0, false);
    size_t len;
    char *data = read_all(good, &len);
    const char *second = strchr(data, '\n') + 1, *third = strchr(second, '\n') + 1;
    const size_t n1 = (size_t)(second - data), n2 = (size_t)(third - second);
    const size_t nlong = (1u << 20) + 100;
    char *longl = malloc(nlong + 2), *cut = malloc(n2);
    memset(longl, 'a', nlong);
    memcpy(longl + nlong, "\0\n", 2);
    memcpy(cut, second, n2);
    cut[n2 / 2] = '\0'; /* line 2 again, a NUL in its middle */
    for (int gz = 0; gz < 2; gz++) {
        snprintf(path, sizeof path, "%s/nul.tsv%s", g_dir, gz ? ".gz" : "");
        gzFile g = gzopen(path, gz ? "wb" : "wbT"); /* T: written as is */
        assert_non_null(g);
        const struct {
            const char *p;
            size_t n;
        } parts[] = {
            {data, n1}, {cut, n2}, {"\0\0\0\n", 4}, {longl, nlong + 2}, {second, len - n1}};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            assert_int_equal(gzwrite(g, parts[i].p, (unsigned)parts[i].n), (int)parts[i].n);
        gzclose(g);
        const char *p1[] = {path};
        const pw_reader_opts_t o = opts(p1, 1);
        seen_t s;
        pw_reader_stats_t st;
        read_through(&o, &s, &st);
        assert_int_equal(s.samples, 100);
        assert_int_equal(st.bad, 3);
        assert_int_equal(s.lines, 103);
    }
    free(longl);
    free(cut);
    free(data);
}

/* CSV: the header of each file is skipped and not counted. */
/* ---- stdin ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct piper {
    int fd;           /* the pipe's write end */
    const char *data; /* first part: `first` bytes, then a pause until `go` (or 10 s) */
    size_t first, len;
    atomic_bool go;
} piper_t;

static void *pipe_main(void *arg) {
    piper_t *p = arg;
    for (size_t off = 0; off < p->len;) {
        if (off == p->first)
            for (double t0 = now_s(); !atomic_load(&p->go) && now_s() - t0 < 10;)
                usleep(1000);
        const size_t end = off < p->first ? p->first : p->len;
        const ssize_t w = write(p->fd, p->data + off, end - off);
        if (w <= 0)
            break; /* the reader went */
        off += (size_t)w;
    }
    close(p->fd);
    return NULL;
}

/* A reader of stdin as a pipe (the test's fd 0 for the time): `data` sent, `first` bytes of it
 * then a pause. */
static pw_reader_t *open_stdin(pw_reader_opts_t *o, piper_t *p, pthread_t *th, int *saved) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    *saved = dup(0);
    assert_int_equal(dup2(fds[0], 0), 0);
    close(fds[0]);
    p->fd = fds[1];
    pthread_create(th, NULL, pipe_main, p);
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(o, &r), 0);
    return r;
}

static void close_stdin(piper_t *p, pthread_t th, int saved) {
    dup2(saved, 0); /* the pipe's read end goes: a writer still writing gets EPIPE */
    close(saved);
    atomic_store(&p->go, true);
    pthread_join(th, NULL);
}

/* stdin read as a pipe: a batch goes out as soon as its lines came while the producer pauses
 * (zlib's buffered reads waited for 256 KiB or the end); a close while it pauses returns at
 * once; gzip data through the pipe gives the file's samples. */
static void test_stdin_pipe(void **state) {
    (void)state;
    char path[300], gzpath[300];
    snprintf(path, sizeof path, "%s/stdin.tsv", g_dir);
    snprintf(gzpath, sizeof gzpath, "%s/stdin.tsv.gz", g_dir);
    write_data(path, 1000, 31, 0, false);
    write_data(gzpath, 1000, 31, 0, true);
    const char *p1[] = {path}, *dash[] = {"-"};
    pw_reader_opts_t o = opts(p1, 1);
    seen_t file, piped;
    pw_reader_stats_t st;
    read_through(&o, &file, &st);
    size_t len, gzlen;
    char *data = read_all(path, &len), *gz = read_all(gzpath, &gzlen);
    const char *cut = data; /* 300 lines, then the pause */
    for (int i = 0; i < 300; i++)
        cut = strchr(cut, '\n') + 1;
    o = opts(dash, 1);
    piper_t pp = {.data = data, .first = (size_t)(cut - data), .len = len};
    pthread_t th;
    int saved;
    const double t_open = now_s();
    pw_reader_t *r = open_stdin(&o, &pp, &th, &saved);
    const pw_batch_t *b = pw_reader_next(r); /* while the producer pauses (10 s) */
    const double t_batch = now_s() - t_open;
    print_message("the first batch %.3f s after the open\n", t_batch);
    assert_non_null(b);
    assert_true(t_batch < 5); /* 10 s before: at the producer's next bytes */
    assert_int_equal(b->n, 256);
    const double t0 = now_s();
    pw_reader_close(r); /* the producer still pauses: no more bytes, no end */
    print_message("a batch while the producer paused; closed in %.3f s\n", now_s() - t0);
    assert_true(now_s() - t0 < 2);
    close_stdin(&pp, th, saved);
    /* the whole file, then gzip through the pipe: the file's samples */
    /* (and gzip with bytes after its last member that are no member, padding: ignored, as
     * zlib's gzread does) */
    char *padded = malloc(gzlen + 16);
    memcpy(padded, gz, gzlen);
    memset(padded + gzlen, 0, 16);
    const char *const inputs[3] = {data, gz, padded};
    const size_t lens[3] = {len, gzlen, gzlen + 16};
    for (int z = 0; z < 3; z++) {
        piper_t all = {.data = inputs[z], .len = lens[z], .go = true};
        r = open_stdin(&o, &all, &th, &saved);
        assert_int_equal(drain(r, &piped, SIZE_MAX), 0);
        pw_reader_close(r);
        close_stdin(&all, th, saved);
        assert_int_equal(piped.samples, file.samples);
        assert_true(piped.key_hash == file.key_hash);
    }
    free(padded);
    /* a regular file on stdin (< FILE) is a file: a resume skips its lines */
    saved = dup(0);
    const int fd = open(path, O_RDONLY);
    assert_int_equal(dup2(fd, 0), 0);
    close(fd);
    o.skip_lines = 100;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    assert_int_equal(drain(r, &piped, SIZE_MAX), 0);
    pw_reader_close(r);
    dup2(saved, 0);
    close(saved);
    assert_int_equal(piped.samples, file.samples - 100);
    free(data);
    free(gz);
}

/* A line over 1 MiB is one malformed line, the lines around it samples, and every byte of the
 * file is counted (the dropped rest of the long line too), from a file and from stdin. */
static void test_long_line(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/long.tsv", g_dir);
    write_data(path, 20, 41, 0, false);
    size_t len;
    char *data = read_all(path, &len);
    const char *mid = data;
    for (int i = 0; i < 10; i++)
        mid = strchr(mid, '\n') + 1;
    const size_t longlen = (3u << 20) / 2;
    FILE *f = fopen(path, "w");
    fwrite(data, 1, (size_t)(mid - data), f);
    for (size_t i = 0; i + 1 < longlen; i++)
        fputc('x', f);
    fputc('\n', f);
    fwrite(mid, 1, len - (size_t)(mid - data), f);
    fclose(f);
    free(data);
    data = read_all(path, &len);
    const char *p1[] = {path}, *dash[] = {"-"};
    pw_reader_opts_t o = opts(p1, 1);
    o.max_error_rate = 0.1;
    seen_t seen;
    pw_reader_stats_t st;
    for (int src = 0; src < 2; src++) {
        if (src == 0) {
            read_through(&o, &seen, &st);
        } else {
            o = opts(dash, 1);
            o.max_error_rate = 0.1;
            piper_t all = {.data = data, .len = len, .go = true};
            pthread_t th;
            int saved;
            pw_reader_t *r = open_stdin(&o, &all, &th, &saved);
            assert_int_equal(drain(r, &seen, SIZE_MAX), 0);
            pw_reader_stats(r, &st);
            pw_reader_close(r);
            close_stdin(&all, th, saved);
        }
        print_message("%s: %llu samples, %llu bad, %llu of %zu bytes\n", src ? "stdin" : "file",
                      (unsigned long long)seen.samples, (unsigned long long)st.bad,
                      (unsigned long long)st.bytes, len);
        assert_int_equal(seen.samples, 20);
        assert_int_equal(st.bad, 1);
        assert_int_equal(st.bytes, len);
    }
    free(data);
}

static void test_csv_header(void **state) {
    (void)state;
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/a.csv", g_dir);
    snprintf(b, sizeof b, "%s/b.csv", g_dir);
    FILE *f = fopen(a, "w");
    fprintf(f, "user,item,rating\n1,2,5\n1,3,1\n");
    fclose(f);
    f = fopen(b, "w");
    fprintf(f, "user,item,rating\n2,2,4\n");
    fclose(f);
    pw_csv_spec_t sp;
    assert_int_equal(pw_csv_spec_parse("header=1,threshold=4,columns=cat:cat:label", &sp, NULL, 0),
                     0);
    const char *p[] = {a, b};
    pw_reader_opts_t o = opts(p, 2);
    o.format = PW_FMT_CSV;
    o.csv = &sp;
    seen_t s;
    pw_reader_stats_t st;
    read_through(&o, &s, &st);
    assert_true(s.samples == 3 && s.lines == 3 && s.label_sum == 2 && st.bad == 0);
    o.csv = NULL; /* CSV needs its spec */
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(&o, &r), PC_EINVAL);
}

/* ---- parse threads ---- */

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    return h;
}

/* Everything a reader gave: each batch's fingerprint (every array it holds), the totals and
 * per-source counts, the position, and how it ended. */
typedef struct trace {
    uint64_t batch_hash[4096];
    size_t nbatches;
    uint64_t consumed;
    pw_reader_stats_t st;
    pw_reader_source_t src[3];
    int err;
    char why[PW_READER_WHY_MAX];
} trace_t;

static void trace_reader(pw_reader_opts_t o, int threads, trace_t *t) {
    memset(t, 0, sizeof *t);
    o.parse_threads = threads;
    pw_reader_t *r;
    assert_int_equal(pw_reader_open(&o, &r), 0);
    for (const pw_batch_t *b; (b = pw_reader_next(r));) {
        assert_true(t->nbatches < 4096);
        uint64_t h = mix(UINT64_C(0xcbf29ce484222325), &b->n, sizeof b->n);
        h = mix(h, &b->lines, sizeof b->lines);
        h = mix(h, &b->ndense, sizeof b->ndense);
        h = mix(h, b->labels, b->n * sizeof *b->labels);
        h = mix(h, b->dense, b->n * b->ndense * sizeof *b->dense);
        h = mix(h, b->key_off, (b->n + 1) * sizeof *b->key_off);
        const size_t nk = b->key_off[b->n];
        h = mix(h, b->keys, nk * sizeof *b->keys);
        h = mix(h, b->fields, nk * sizeof *b->fields);
        h = mix(h, b->vals, nk * sizeof *b->vals);
        if (o.dedup) {
            check_unique(b);
            h = mix(h, &b->nu, sizeof b->nu);
            h = mix(h, b->ukeys, b->nu * sizeof *b->ukeys);
            h = mix(h, b->inv, nk * sizeof *b->inv);
        } else {
            assert_true(b->ukeys == NULL && b->nu == 0);
        }
        t->batch_hash[t->nbatches++] = h;
    }
    t->err = pw_reader_error(r);
    snprintf(t->why, sizeof t->why, "%s", pw_reader_error_text(r));
    t->consumed = pw_reader_consumed(r);
    pw_reader_stats(r, &t->st);
    for (size_t i = 0; i < o.npaths && i < 3; i++)
        if (pw_reader_source_stats(r, i, &t->src[i]) == 0)
            t->src[i].path = NULL; /* the reader's copy: gone at close */
    pw_reader_close(r);
}

static void assert_same_trace(const trace_t *a, const trace_t *b) {
    assert_int_equal(a->err, b->err);
    assert_string_equal(a->why, b->why);
    if (!a->err) { /* after a stop, how many batches were handed out depends on timing */
        assert_int_equal(a->nbatches, b->nbatches);
        for (size_t i = 0; i < a->nbatches; i++)
            assert_true(a->batch_hash[i] == b->batch_hash[i]);
        assert_int_equal(a->consumed, b->consumed);
    }
    assert_true(a->st.lines == b->st.lines && a->st.samples == b->st.samples &&
                a->st.bad == b->st.bad && a->st.bytes == b->st.bytes);
    for (int i = 0; i < 3; i++) {
        assert_true(a->src[i].lines == b->src[i].lines && a->src[i].samples == b->src[i].samples &&
                    a->src[i].bad == b->src[i].bad);
        assert_int_equal(a->src[i].first_bad_line, b->src[i].first_bad_line);
        assert_string_equal(a->src[i].first_bad, b->src[i].first_bad);
    }
}

/* Parsing on 1, 2 or 5 threads gives exactly what parsing on the reader thread gives: every
 * batch's arrays, positions, totals, per-file counts and first bad lines, over plain and gzip
 * files with bad, blank, CRLF and over-long lines, two epochs, odd batch sizes, a resume
 * offset, a split by rank, wide libsvm samples, and the same stop (code and text) for a file
 * over the error rate; with dedup, the same unique keys, each batch's checked. */
static void test_parse_threads_same(void **state) {
    (void)state;
    char a[300], b[300], c[300], w[300], over[300];
    snprintf(a, sizeof a, "%s/pt_a.tsv", g_dir);
    snprintf(b, sizeof b, "%s/pt_b.tsv.gz", g_dir);
    snprintf(c, sizeof c, "%s/pt_c.tsv", g_dir);
    snprintf(w, sizeof w, "%s/pt_w.svm", g_dir);
    snprintf(over, sizeof over, "%s/pt_over.tsv", g_dir);
    write_data(a, 3000, 51, 97, false);
    write_data(b, 2000, 52, 0, true);
    write_data(c, 1500, 53, 0, false);
    write_data(over, 3000, 54, 9, false); /* 11% bad: stops once it has 1000 lines */
    FILE *f = fopen(a, "a");
    assert_non_null(f);
    fputs("\n\r\n", f);
    for (int i = 0; i < (3 << 20) / 8; i++) /* a 3 MiB line */
        fputs("1\t2\t3\t4", f);
    fputs("\n\n", f);
    for (int i = 0; i < (600 << 10) / 8; i++) /* a 600 KiB line: a chunk's text grows for it */
        fputs("0\t1\t2\t3", f);
    fputs("\n", f);
    fclose(f);
    size_t len;
    char *text = read_all(c, &len); /* c again, every line ending in CRLF */
    f = fopen(c, "w");
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\n')
            fputc('\r', f);
        fputc(text[i], f);
    }
    fclose(f);
    free(text);
    f = fopen(w, "w");
    for (int i = 0; i < 700; i++) {
        fprintf(f, "%d", i % 2);
        for (int j = 0; j < 1 + (i * 37) % 300; j++)
            fprintf(f, " %d:%d", i * 1000 + j, j % 7 + 1);
        fputc('\n', f);
    }
    fclose(f);
    static trace_t base, got; /* large: not on the stack */
    const char *paths[] = {a, b, c};
    struct {
        const char *const *paths;
        size_t n;
        pw_format_t fmt;
        size_t batch;
        int epochs;
        uint64_t skip;
        uint32_t world, rank;
    } runs[] = {
        {paths, 3, PW_FMT_CRITEO, 37, 2, 0, 1, 0},
        {paths, 3, PW_FMT_CRITEO, 256, 1, 4321, 1, 0},
        {paths, 3, PW_FMT_CRITEO, 1000, 1, 0, 2, 1},
        {(const char *[]){w}, 1, PW_FMT_LIBSVM, 5, 2, 3, 1, 0},
        {(const char *[]){c, over}, 2, PW_FMT_CRITEO, 64, 1, 0, 1, 0},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        pw_reader_opts_t o = opts(runs[k].paths, runs[k].n);
        o.format = runs[k].fmt;
        o.batch = runs[k].batch;
        o.queue = 3;
        o.epochs = runs[k].epochs;
        o.skip_lines = runs[k].skip;
        o.world = runs[k].world;
        o.rank = runs[k].rank;
        o.dedup = k != 1;
        trace_reader(o, 0, &base);
        assert_int_equal(base.err, k == 4 ? PC_EPARSE : 0);
        if (k == 0) { /* 31 bad lines, the 3 MiB and the 600 KiB one, twice */
            assert_int_equal(base.src[0].bad, 2 * 33);
            assert_string_equal(base.src[0].first_bad,
                                "line 8: expected 40 tab-separated fields, got 1");
        }
        for (int threads = 1; threads <= 5; threads += threads == 2 ? 3 : 1) {
            trace_reader(o, threads, &got);
            assert_same_trace(&base, &got);
        }
    }
    pw_reader_opts_t o = opts(paths, 1);
    pw_reader_t *r;
    o.parse_threads = PW_READER_PARSE_THREADS_MAX + 1;
    assert_int_equal(pw_reader_open(&o, &r), PC_EINVAL);
    o.parse_threads = -2;
    assert_int_equal(pw_reader_open(&o, &r), PC_EINVAL);
    o.parse_threads = -1; /* a quarter of the CPUs: whatever it is, the same samples */
    assert_int_equal(pw_reader_open(&o, &r), 0);
    seen_t s;
    assert_int_equal(drain(r, &s, SIZE_MAX), 0);
    pw_reader_close(r);
    assert_int_equal(s.lines, 3000 + 5); /* 2 blank lines, the long one, 1 blank, 600 KiB */
}

/* A gzip file cut short: the reader stops with PC_EIO naming the file, and the piece of a line
 * that decompressed before the cut is neither a sample nor a malformed line (it was parsed: a
 * line cut inside its last key parsed as a sample with another key). Several cut points, at
 * least one of them inside a line. */
static void test_gzip_cut_line(void **state) {
    (void)state;
    char gz[300], cut[310];
    snprintf(gz, sizeof gz, "%s/cut.tsv.gz", g_dir);
    snprintf(cut, sizeof cut, "%s/cut-short.tsv.gz", g_dir);
    write_data(gz, 400, 5, 0, true);
    FILE *f = fopen(gz, "rb");
    assert_non_null(f);
    static char bytes[1 << 20];
    const size_t size = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    assert_true(size > 4000 && size < sizeof bytes);
    int inside = 0;
    for (size_t at = size / 3; at < size - 16; at += size / 7) {
        f = fopen(cut, "wb");
        assert_int_equal(fwrite(bytes, 1, at, f), at);
        fclose(f);
        /* what zlib gives of it: whole lines, and maybe a piece of one */
        gzFile g = gzopen(cut, "rb");
        static char text[1 << 21];
        size_t got = 0;
        int n;
        while ((n = gzread(g, text + got, (unsigned)(sizeof text - got))) > 0)
            got += (size_t)n;
        gzclose(g);
        uint64_t whole = 0;
        for (size_t i = 0; i < got; i++)
            whole += text[i] == '\n';
        inside += got && text[got - 1] != '\n';
        const char *p[] = {cut};
        pw_reader_opts_t o = opts(p, 1);
        o.max_error_rate = 1;
        pw_reader_t *r;
        seen_t sn;
        assert_int_equal(pw_reader_open(&o, &r), 0);
        assert_int_equal(drain(r, &sn, SIZE_MAX), PC_EIO);
        assert_non_null(strstr(pw_reader_error_text(r), "cut-short.tsv.gz"));
        pw_reader_stats_t st;
        pw_reader_stats(r, &st);
        pw_reader_close(r);
        if (st.samples + st.bad != whole)
            fail_msg("cut at %zu: %llu samples and %llu malformed lines, %llu whole lines", at,
                     (unsigned long long)st.samples, (unsigned long long)st.bad,
                     (unsigned long long)whole);
    }
    assert_true(inside > 0);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* test_stdin_pipe's writer outlives the pipe's read end */
    pc_log_set_level(PC_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_gzip_epochs),
        cmocka_unit_test(test_rank_split),
        cmocka_unit_test(test_bad_lines_and_errors),
        cmocka_unit_test(test_resume_and_early_close),
        cmocka_unit_test(test_resume_tail),
        cmocka_unit_test(test_source_counts),
        cmocka_unit_test(test_small_file_rate),
        cmocka_unit_test(test_tcp_source),
        cmocka_unit_test(test_csv_header),
        cmocka_unit_test(test_stdin_pipe),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_wide_samples),
        cmocka_unit_test(test_parse_threads_same),
        cmocka_unit_test(test_tcp_cut_line),
        cmocka_unit_test(test_nul_bytes),
        cmocka_unit_test(test_gzip_cut_line),
    };
    /* Once parsing on the reader thread, once on 3 parse threads (TCP sources: always the
     * reader thread's). */
    int failed = cmocka_run_group_tests_name("reader thread parses", tests, setup, teardown);
    g_parse_threads = 3;
    return failed + cmocka_run_group_tests_name("3 parse threads", tests, setup, teardown);
}
