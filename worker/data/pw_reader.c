/* pw_reader.c: see pw_reader.h.
 *
 * DESIGN: a ring of queue + 1 preallocated batches; the consumer holds at most one (the batch it
 * was last given, released at its next call), the reader thread fills the others. zlib's gzFile
 * reads plain and gzip files alike (gzopen is transparent to uncompressed input), so every file
 * is a gzFile (a regular file on stdin too, through gzdopen). Streams are read as their bytes
 * come, through one line assembler (lines_in_t): TCP producers on a libuv loop, stdin by poll
 * and read (zlib's gzFile would wait for 256 KiB), gzip on stdin inflated as it arrives. Counts:
 * one set per source (atomics the reader thread adds to and any thread reads; the first bad line's
 * reason written once under mu) and the stream's totals; the reason the stream stopped (`why`) is
 * written by the reader thread before it finishes, under mu. A line's bookkeeping is two halves in
 * stream order, line_admit before parsing and line_commit after, so parsing can move to other
 * threads between them (the parse pool below) without changing what the reader gives. A batch's
 * dedup (opts.dedup) is a job for the pool too: the batch is handed over unready, and the consumer
 * waits for `ready` (pool threads take dedup jobs before chunks, oldest first).
 */
#include "pw_reader.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pw_unique.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>
#include <zlib.h>

#define LINE_MAX_BYTES (1u << 20)
#define LOG_BAD_MAX    20
#define MIN_LINES_RATE 1000
#define PARSE_ERR_MAX  160 /* a parse error's reason */

/* What one source gave (pw_reader_source_t without the copy's plainness). */
typedef struct src_count {
    atomic_uint_least64_t lines, samples, bad;
    uint64_t first_bad_line; /* under mu */
    char first_bad[PW_READER_REASON_MAX];
    bool resumed; /* lines of it were skipped for a resume (the reader thread's) */
} src_count_t;

struct pw_reader {
    pw_reader_opts_t o;
    pw_csv_spec_t csv; /* o.csv points here */
    char **paths;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* one condition: batches and space both signal it */
    pw_batch_t *slots;
    size_t *caps;            /* keys each slot's key (and dedup) arrays hold; they grow */
    pw_unique_t uniq;        /* opts.dedup without parse threads: the reader thread's */
    bool *ready;             /* per slot, under mu: handed over and its dedup done */
    struct parse_pool *pool; /* the reader thread's parse threads, which also dedup (or NULL) */
    size_t nslots, head, count;
    bool holding, done, stop;
    int err;
    char why[PW_READER_WHY_MAX]; /* one line: why the stream stopped ("" none) */
    uint64_t consumed;
    uint64_t tail_lines; /* lines after the last batch (bad or blank), counted at the end */
    int tcp_port;        /* bound port of the TCP source: 0 not yet, < 0 none or failed */
    atomic_uint_least64_t lines, samples, bad, bytes;
    atomic_uint_least64_t epoch; /* the pass being read, from 1 */
    src_count_t *src;            /* per path */
};

static void batch_free(pw_batch_t *b) {
    pc_sfree(b->labels);
    pc_sfree(b->dense);
    pc_sfree(b->keys);
    pc_sfree(b->fields);
    pc_sfree(b->vals);
    pc_sfree(b->key_off);
    pc_sfree(b->ukeys);
    pc_sfree(b->inv);
}

/* A batch of up to `batch` samples whose key arrays hold key_cap keys; with `dedup` its ukeys and
 * inv too (they grow with the key arrays: batch_reserve). */
static int batch_alloc(pw_batch_t *b, size_t batch, size_t key_cap, bool dedup) {
    memset(b, 0, sizeof *b);
    b->labels = pc_smalloc(PC_MEM_BATCH, batch * sizeof *b->labels);
    b->dense = pc_smalloc(PC_MEM_BATCH, batch * PW_DENSE_MAX * sizeof *b->dense);
    b->key_off = pc_smalloc(PC_MEM_BATCH, (batch + 1) * sizeof *b->key_off);
    b->keys = pc_smalloc(PC_MEM_BATCH, key_cap * sizeof *b->keys);
    b->fields = pc_smalloc(PC_MEM_BATCH, key_cap * sizeof *b->fields);
    b->vals = pc_smalloc(PC_MEM_BATCH, key_cap * sizeof *b->vals);
    if (dedup) {
        b->ukeys = pc_smalloc(PC_MEM_BATCH, key_cap * sizeof *b->ukeys);
        b->inv = pc_smalloc(PC_MEM_BATCH, key_cap * sizeof *b->inv);
    }
    return b->labels && b->dense && b->key_off && b->keys && b->fields && b->vals &&
                   (!dedup || (b->ukeys && b->inv))
               ? 0
               : PC_ENOMEM;
}

/* A sample as a batch takes it: a pw_sample_t parsed on the reader thread, or one in the batch a
 * parse thread filled from a chunk. */
typedef struct sample_ref {
    float label;
    uint32_t ndense, nkeys;
    const float *dense;
    const uint64_t *keys;
    const uint16_t *field;
    const float *val;
} sample_ref_t;

static sample_ref_t ref_of(const pw_sample_t *s) {
    return (sample_ref_t){s->label, s->ndense, s->nkeys, s->dense, s->keys, s->field, s->val};
}

/* The sample batch b holds at j. */
static sample_ref_t ref_at(const pw_batch_t *b, size_t j) {
    const size_t k0 = b->key_off[j];
    return (sample_ref_t){b->labels[j],
                          b->ndense,
                          (uint32_t)(b->key_off[j + 1] - k0),
                          b->dense + j * b->ndense,
                          b->keys + k0,
                          b->fields + k0,
                          b->vals + k0};
}

/* *a, resized to n elements of `size` bytes; false (and *a as it was) when out of memory. */
static bool resize(void *a, size_t n, size_t size) {
    void *q = pc_srealloc(PC_MEM_BATCH, *(void **)a, n * size);
    if (q)
        *(void **)a = q;
    return q != NULL;
}

/* Grow b's key arrays (and its dedup arrays when it has them) to hold `need` keys (*cap, what
 * they hold, becomes at least that). */
static int batch_reserve(pw_batch_t *b, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    const size_t nc = 2 * *cap > need ? 2 * *cap : need;
    bool ok = resize(&b->keys, nc, sizeof *b->keys);
    ok &= resize(&b->fields, nc, sizeof *b->fields);
    ok &= resize(&b->vals, nc, sizeof *b->vals);
    if (b->ukeys) {
        ok &= resize(&b->ukeys, nc, sizeof *b->ukeys);
        ok &= resize(&b->inv, nc, sizeof *b->inv);
    }
    if (!ok)
        return PC_ENOMEM;
    *cap = nc;
    return 0;
}

/* Append sample s to batch b (whose key arrays hold *cap keys). */
static int batch_add(pw_batch_t *b, size_t *cap, const sample_ref_t *s) {
    const size_t base = b->key_off[b->n];
    if (batch_reserve(b, cap, base + s->nkeys))
        return PC_ENOMEM;
    b->labels[b->n] = s->label;
    if (b->n == 0)
        b->ndense = s->ndense;
    memcpy(b->dense + b->n * b->ndense, s->dense, b->ndense * sizeof(float));
    memcpy(b->keys + base, s->keys, s->nkeys * sizeof(uint64_t));
    memcpy(b->fields + base, s->field, s->nkeys * sizeof(uint16_t));
    memcpy(b->vals + base, s->val, s->nkeys * sizeof(float));
    b->n++;
    b->key_off[b->n] = base + s->nkeys;
    return 0;
}

/* ==== reader thread ======================================================================== */

/* The slot to fill next, waiting for space; NULL when told to stop. */
static pw_batch_t *slot_acquire(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->stop && r->count == r->nslots)
        pthread_cond_wait(&r->cv, &r->mu);
    pw_batch_t *b = r->stop ? NULL : &r->slots[(r->head + r->count) % r->nslots];
    pthread_mutex_unlock(&r->mu);
    if (b) {
        b->n = 0;
        b->lines = 0;
        b->key_off[0] = 0;
    }
    return b;
}

static void pool_dedup(struct parse_pool *p, pw_batch_t *b);

/* Hand batch b (the slot the reader thread fills) to the consumer, with its unique keys when
 * asked (opts.dedup): found here, or by a parse thread while the consumer waits for the batch to
 * be ready. 0, or PC_ENOMEM with nothing handed over. */
static int slot_publish(pw_reader_t *r, pw_batch_t *b) {
    const size_t i = (size_t)(b - r->slots);
    const bool later = r->o.dedup && r->pool;
    if (r->o.dedup && !later) {
        const int rc = pw_unique(&r->uniq, b->keys, b->key_off[b->n], b->ukeys, b->inv, &b->nu);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&r->mu);
    r->ready[i] = !later;
    r->count++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (later)
        pool_dedup(r->pool, b);
    return 0;
}

static void finish(pw_reader_t *r, int err) {
    pthread_mutex_lock(&r->mu);
    r->done = true;
    if (!r->err)
        r->err = err;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The stream stops with this reason (reader thread; the first reason stays). */
static void set_why(pw_reader_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_why(pw_reader_t *r, const char *fmt, ...) {
    pthread_mutex_lock(&r->mu);
    if (!r->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->why, sizeof r->why, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&r->mu);
}

static bool stopping(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    bool s = r->stop;
    pthread_mutex_unlock(&r->mu);
    return s;
}

typedef struct cursor {
    pw_reader_t *r;
    pw_batch_t *b;
    uint64_t skip;
    size_t src;  /* the source being read (index into paths) */
    bool stream; /* it is stdin or a TCP source: no lines of it are skipped for a resume */
    pw_sample_t s;
} cursor_t;

/* The error-rate rule (pw_reader.h): source i is over max_error_rate, judged at its end
 * (`at_end`, any size) or once it has MIN_LINES_RATE lines. PC_EPARSE with the reason set. A
 * source a resume entered part-way is judged by its rest only when that has MIN_LINES_RATE
 * lines: a few lines after the skip are no sample of the whole. */
static int check_rate(pw_reader_t *r, size_t i, bool at_end) {
    src_count_t *sc = &r->src[i];
    const uint64_t lines = atomic_load(&sc->lines), bad = atomic_load(&sc->bad),
                   samples = atomic_load(&sc->samples);
    if (((!at_end || sc->resumed) && lines < MIN_LINES_RATE) ||
        (double)bad <= r->o.max_error_rate * (double)lines)
        return 0;
    char first[PW_READER_REASON_MAX];
    pthread_mutex_lock(&r->mu);
    memcpy(first, sc->first_bad, sizeof first);
    pthread_mutex_unlock(&r->mu);
    if (samples == 0)
        set_why(r, "%s: no usable samples: %llu lines read, %llu malformed (first: %s)",
                r->paths[i], (unsigned long long)lines, (unsigned long long)bad, first);
    else
        set_why(r, "%s: %llu of %llu lines malformed, over max_error_rate %g%s (first: %s)",
                r->paths[i], (unsigned long long)bad, (unsigned long long)lines,
                r->o.max_error_rate, at_end ? "" : ", stopped early", first);
    return PC_EPARSE;
}

/* What the reader does with a line before it is parsed (line_admit). */
enum { LINE_KEEP, LINE_STOP, LINE_DROP };
/* What a kept line is: its kind decides whether it is parsed (line_commit). */
enum { LINE_TEXT, LINE_BLANK, LINE_LONG };

static int line_kind(const char *line, size_t len, bool too_long) {
    if (too_long)
        return LINE_LONG;
    return len == 0 || (len == 1 && line[0] == '\n') ||
                   (len == 2 && line[0] == '\r' && line[1] == '\n')
               ? LINE_BLANK
               : LINE_TEXT;
}

/* The first half of a line's bookkeeping, in stream order before it is parsed: every 4096 lines
 * the reader looks whether it is told to stop (skipped ones too); a CSV header and lines of files
 * skipped for a resume are dropped (their bytes counted, the lines not: resume offsets skip them
 * anyway; a stream's producer sends from where it knows, so none of its lines are skipped). */
static int line_admit(cursor_t *c, uint64_t lineno, size_t len) {
    pw_reader_t *r = c->r;
    if ((lineno & 4095) == 0 && stopping(r))
        return LINE_STOP;
    const bool header = lineno == 1 && r->o.format == PW_FMT_CSV && r->csv.header;
    if (header || (c->skip && !c->stream)) {
        if (!header) {
            c->skip--;
            r->src[c->src].resumed = true;
        }
        atomic_fetch_add_explicit(&r->bytes, len, memory_order_relaxed);
        return LINE_DROP;
    }
    return LINE_KEEP;
}

/* pw_parse_line, and a sample with a field at or above o.fields (the model's) is malformed too:
 * a line the format takes that the model cannot (a libffm field past the model's count). */
static int parse_line(const pw_reader_t *r, const char *line, size_t len, pw_sample_t *s, char *err,
                      size_t el) {
    int rc = pw_parse_line(r->o.format, &r->csv, line, len, s, err, el);
    for (uint32_t j = 0; !rc && r->o.fields && j < s->nkeys; j++)
        if (s->field[j] >= r->o.fields) {
            snprintf(err, el, "feature %u: field %u, the model has %u fields", j + 1,
                     (unsigned)s->field[j], r->o.fields);
            rc = PC_EPARSE;
        }
    return rc;
}

/* The second half, in stream order once the line (`len` bytes) is parsed (prc and err:
 * pw_parse_line's answer for a LINE_TEXT line; s: its sample when prc is 0): its bytes are
 * counted and it counts toward the batch's positions; blank lines end there; the rest are
 * counted, bad lines logged and counted, samples batched. 0, 1 when the reader is to stop, or a
 * fatal error. */
static int line_commit(cursor_t *c, const char *where, uint64_t lineno, size_t len, int kind,
                       int prc, const char *err, const sample_ref_t *s, uint64_t *bad_here) {
    pw_reader_t *r = c->r;
    src_count_t *sc = &r->src[c->src];
    atomic_fetch_add_explicit(&r->bytes, len, memory_order_relaxed);
    if (!c->stream) /* positions count the lines a resume skips: never a stream's */
        c->b->lines++;
    if (kind == LINE_BLANK)
        return 0;
    atomic_fetch_add_explicit(&r->lines, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sc->lines, 1, memory_order_relaxed);
    if (kind == LINE_LONG) {
        prc = PC_ETOOBIG;
        err = "line longer than 1 MiB";
    }
    if (prc) {
        atomic_fetch_add(&r->bad, 1);
        const uint64_t before = atomic_fetch_add(&sc->bad, 1); /* the source's, every epoch */
        if (before == 0) {
            pthread_mutex_lock(&r->mu);
            sc->first_bad_line = lineno;
            if (strcmp(where, r->paths[c->src])) /* a TCP producer: say which */
                snprintf(sc->first_bad, sizeof sc->first_bad, "%s:%llu: %s", where,
                         (unsigned long long)lineno, err);
            else
                snprintf(sc->first_bad, sizeof sc->first_bad, "line %llu: %s",
                         (unsigned long long)lineno, err);
            pthread_mutex_unlock(&r->mu);
        }
        ++*bad_here;
        if (before < LOG_BAD_MAX) /* per source, not per pass over it */
            PC_WARN("%s:%llu: %s", where, (unsigned long long)lineno, err);
        return check_rate(r, c->src, false);
    }
    int rc = batch_add(c->b, &r->caps[c->b - r->slots], s);
    if (rc)
        return rc;
    atomic_fetch_add_explicit(&r->samples, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sc->samples, 1, memory_order_relaxed);
    if (c->b->n == r->o.batch) {
        if ((rc = slot_publish(r, c->b))) {
            c->b = NULL; /* not handed over, and never to be */
            return rc;
        }
        if (!(c->b = slot_acquire(r)))
            return 1;
    }
    return 0;
}

/* One line of a source (`len` bytes, its newline included when it had one; `too_long` when the
 * line was cut at LINE_MAX_BYTES), parsed here on the reader thread: admitted, parsed and
 * committed at once. 0, 1 when the reader is to stop, or a fatal error. */
static int take_line(cursor_t *c, const char *where, uint64_t lineno, const char *line, size_t len,
                     bool too_long, uint64_t *bad_here) {
    const int a = line_admit(c, lineno, len);
    if (a != LINE_KEEP)
        return a == LINE_STOP;
    const int kind = line_kind(line, len, too_long);
    char err[PARSE_ERR_MAX] = "";
    const int prc = kind == LINE_TEXT ? parse_line(c->r, line, len, &c->s, err, sizeof err) : 0;
    const sample_ref_t s = ref_of(&c->s);
    return line_commit(c, where, lineno, len, kind, prc, err, &s, bad_here);
}

/* ==== parse threads (file sources) ========================================================= */

/* With parse_threads > 0 the reader thread reads a file's lines into chunks of up to
 * CHUNK_LINES lines (admitting each as take_line does), hands each chunk to the parse threads
 * and commits the parsed chunks in stream order, line by line, through line_commit: counts,
 * positions, logs, the error-rate rule and the batches are those of parsing on the reader thread.
 * The ring holds 2 chunks per parse thread and 2 more, so the reader fills one while the threads
 * parse and the oldest waits to be committed. */
#define CHUNK_LINES 256
#define CHUNK_TEXT  (128u << 10) /* bytes of text after which a chunk is handed over */

typedef struct chunk_line {
    uint64_t lineno;
    size_t len; /* its bytes as read */
    size_t off; /* its text in the chunk (LINE_TEXT) */
    int kind, prc;
    uint32_t sample; /* its sample in the chunk's `out` (parsed, prc 0) */
} chunk_line_t;

typedef struct chunk {
    size_t n; /* lines */
    chunk_line_t line[CHUNK_LINES];
    char *text;
    size_t text_len, text_cap;
    /* filled by a parse thread */
    int rc;         /* PC_ENOMEM when its key arrays could not grow: nothing of it is committed */
    bool parsed;    /* under the pool's mu */
    pw_batch_t out; /* the samples of its good lines, in order (allocated with the pool) */
    size_t out_cap; /* keys out's arrays hold */
    char err[CHUNK_LINES][PARSE_ERR_MAX];
} chunk_t;

typedef struct parse_thread {
    struct parse_pool *p;
    pthread_t th;
    pw_sample_t s; /* its scratch sample */
} parse_thread_t;

typedef struct parse_pool {
    pw_reader_t *r;
    parse_thread_t *th;
    int nth; /* started */
    chunk_t *ring;
    size_t nring;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    uint64_t submitted, taken, committed; /* chunk sequence numbers; ring slot = seq % nring */
    pw_batch_t **dq; /* batches handed over whose dedup is to do, oldest first (taken first) */
    size_t dq_head, dq_n;
    bool quit;
} parse_pool_t;

/* A parse thread finds batch b's unique keys, then b is ready for the consumer. Out of memory
 * stops the stream with PC_ENOMEM. */
static void dedup_batch(pw_reader_t *r, pw_unique_t *u, pw_batch_t *b) {
    const int rc = pw_unique(u, b->keys, b->key_off[b->n], b->ukeys, b->inv, &b->nu);
    pthread_mutex_lock(&r->mu);
    if (rc && !r->err) {
        r->err = rc;
        r->stop = true;
        if (!r->why[0]) /* before any reason the cut-short source would give */
            snprintf(r->why, sizeof r->why, "out of memory finding a batch's unique keys");
    }
    r->ready[b - r->slots] = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void pool_dedup(parse_pool_t *p, pw_batch_t *b) {
    pthread_mutex_lock(&p->mu);
    p->dq[(p->dq_head + p->dq_n++) % p->r->nslots] = b;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

static void parse_chunk(const pw_reader_t *r, chunk_t *k, pw_sample_t *s) {
    k->rc = 0;
    k->out.n = 0;
    k->out.key_off[0] = 0;
    for (size_t i = 0; i < k->n && !k->rc; i++) {
        chunk_line_t *l = &k->line[i];
        if (l->kind != LINE_TEXT)
            continue;
        l->prc = parse_line(r, k->text + l->off, l->len, s, k->err[i], PARSE_ERR_MAX);
        if (l->prc)
            continue;
        l->sample = (uint32_t)k->out.n;
        const sample_ref_t ref = ref_of(s);
        k->rc = batch_add(&k->out, &k->out_cap, &ref);
    }
}

static void *parse_main(void *arg) {
    parse_thread_t *t = arg;
    parse_pool_t *p = t->p;
    pw_unique_t uniq = {0};
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->taken == p->submitted && !p->dq_n)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->dq_n) { /* first: the consumer may be waiting for it */
            pw_batch_t *b = p->dq[p->dq_head];
            p->dq_head = (p->dq_head + 1) % p->r->nslots;
            p->dq_n--;
            pthread_mutex_unlock(&p->mu);
            dedup_batch(p->r, &uniq, b);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        if (p->taken == p->submitted) /* quit, and nothing left */
            break;
        chunk_t *k = &p->ring[p->taken++ % p->nring];
        pthread_mutex_unlock(&p->mu);
        parse_chunk(p->r, k, &t->s);
        pthread_mutex_lock(&p->mu);
        k->parsed = true;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    pw_unique_free(&uniq);
    return NULL;
}

static void pool_free(parse_pool_t *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nth; i++)
        pthread_join(p->th[i].th, NULL);
    for (size_t i = 0; p->ring && i < p->nring; i++) {
        pc_sfree(p->ring[i].text);
        batch_free(&p->ring[i].out);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pc_sfree(p->ring);
    pc_sfree(p->dq);
    pc_sfree(p->th);
    pc_sfree(p);
}

/* n parse threads for reader r; NULL when out of memory or threads (the caller stops). */
static parse_pool_t *pool_new(pw_reader_t *r, int n) {
    parse_pool_t *p = pc_scalloc(PC_MEM_BATCH, 1, sizeof *p);
    if (!p)
        return NULL;
    p->r = r;
    p->nring = 2 * (size_t)n + 2;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->ring = pc_scalloc(PC_MEM_BATCH, p->nring, sizeof *p->ring);
    p->th = pc_scalloc(PC_MEM_BATCH, (size_t)n, sizeof *p->th);
    p->dq = pc_scalloc(PC_MEM_BATCH, r->nslots, sizeof *p->dq);
    bool ok = p->ring && p->th && p->dq;
    for (size_t i = 0; ok && i < p->nring; i++) {
        p->ring[i].out_cap = CHUNK_LINES * 32;
        ok = batch_alloc(&p->ring[i].out, CHUNK_LINES, p->ring[i].out_cap, false) == 0;
    }
    for (int i = 0; ok && i < n; i++) {
        p->th[i].p = p;
        ok = pthread_create(&p->th[i].th, NULL, parse_main, &p->th[i]) == 0;
        p->nth += ok;
    }
    if (!ok) {
        pool_free(p);
        return NULL;
    }
    return p;
}

/* Commit the oldest handed-over chunk, waiting until it is parsed (or, with `discard`, only wait
 * and drop it). 0, 1 to stop, or a fatal error. */
static int commit_chunk(cursor_t *c, parse_pool_t *p, const char *where, uint64_t *bad_here,
                        bool discard) {
    chunk_t *k = &p->ring[p->committed % p->nring];
    pthread_mutex_lock(&p->mu);
    while (!k->parsed)
        pthread_cond_wait(&p->done, &p->mu);
    k->parsed = false; /* the slot is the reader's again: no thread takes it before a submit */
    pthread_mutex_unlock(&p->mu);
    int rc = discard ? 0 : k->rc;
    for (size_t i = 0; !rc && !discard && i < k->n; i++) {
        const chunk_line_t *l = &k->line[i];
        const bool sample = l->kind == LINE_TEXT && !l->prc;
        const sample_ref_t s = sample ? ref_at(&k->out, l->sample) : (sample_ref_t){0};
        rc = line_commit(c, where, l->lineno, l->len, l->kind, l->prc, k->err[i], &s, bad_here);
    }
    k->n = 0;
    k->text_len = 0;
    p->committed++;
    return rc;
}

/* Hand the chunk being filled to the parse threads (when it has lines), then commit the parsed
 * chunks at the ring's head, waiting for the oldest while the ring is full. */
static int submit_chunk(cursor_t *c, parse_pool_t *p, const char *where, uint64_t *bad_here) {
    if (p->ring[p->submitted % p->nring].n) {
        pthread_mutex_lock(&p->mu);
        p->submitted++;
        pthread_cond_signal(&p->work);
        pthread_mutex_unlock(&p->mu);
    }
    int rc = 0;
    while (!rc && p->committed < p->submitted) {
        if (p->submitted - p->committed < p->nring) { /* room: commit only what is ready */
            pthread_mutex_lock(&p->mu);
            const bool ready = p->ring[p->committed % p->nring].parsed;
            pthread_mutex_unlock(&p->mu);
            if (!ready)
                break;
        }
        rc = commit_chunk(c, p, where, bad_here, false);
    }
    return rc;
}

/* One line read from a file, for the parse threads: admitted now, committed once parsed. */
static int feed_line(cursor_t *c, parse_pool_t *p, const char *where, uint64_t lineno,
                     const char *line, size_t len, bool too_long, uint64_t *bad_here) {
    const int a = line_admit(c, lineno, len);
    if (a != LINE_KEEP)
        return a == LINE_STOP;
    chunk_t *k = &p->ring[p->submitted % p->nring];
    chunk_line_t *l = &k->line[k->n];
    *l = (chunk_line_t){.lineno = lineno, .len = len, .kind = line_kind(line, len, too_long)};
    if (l->kind == LINE_TEXT) {
        if (k->text_len + len > k->text_cap) {
            const size_t cap = k->text_len + len > CHUNK_TEXT ? k->text_len + len : CHUNK_TEXT;
            char *t = pc_srealloc(PC_MEM_BATCH, k->text, cap);
            if (!t)
                return PC_ENOMEM;
            k->text = t;
            k->text_cap = cap;
        }
        memcpy(k->text + k->text_len, line, len);
        l->off = k->text_len;
        k->text_len += len;
    }
    k->n++;
    return k->n == CHUNK_LINES || k->text_len >= CHUNK_TEXT ? submit_chunk(c, p, where, bad_here)
                                                            : 0;
}

/* The end of a file (or of reading it, rc != 0): hand over what is left and commit everything;
 * after an error or a stop, wait for the threads and drop what they parsed. */
static int drain_chunks(cursor_t *c, parse_pool_t *p, const char *where, uint64_t *bad_here,
                        int rc) {
    if (!rc)
        rc = submit_chunk(c, p, where, bad_here);
    while (p->committed < p->submitted) {
        int crc = commit_chunk(c, p, where, bad_here, rc != 0);
        if (!rc)
            rc = crc;
    }
    p->ring[p->submitted % p->nring].n = 0; /* a partial chunk not handed over */
    p->ring[p->submitted % p->nring].text_len = 0;
    return rc;
}

/* One file source (or stdin): read, parse (here, or on the parse threads of p), batch. 0, or a
 * fatal error. */
static int read_source(cursor_t *c, parse_pool_t *p, const char *path, char *line) {
    const int fd = strcmp(path, "-") == 0 ? dup(0) : -1;
    gzFile gz = fd >= 0 ? gzdopen(fd, "rb") : strcmp(path, "-") ? gzopen(path, "rb") : NULL;
    if (!gz && fd >= 0)
        close(fd); /* gzdopen failed: the descriptor is still ours */
    if (!gz) {
        set_why(c->r, "%s: cannot open: %s", path, strerror(errno));
        return PC_EIO;
    }
    gzbuffer(gz, 256 << 10);
    uint64_t lineno = 0, bad_here = 0;
    int rc = 0;
    /* A line's length is what gzgets read (the stream position moved by), not strlen: a NUL
     * byte inside a line must reach the parser, which refuses the line */
    z_off_t at = gztell(gz);
    while (!rc && gzgets(gz, line, LINE_MAX_BYTES)) {
        const z_off_t now = gztell(gz);
        const size_t len = (size_t)(now - at);
        at = now;
        const bool too_long = len == LINE_MAX_BYTES - 1 && line[len - 1] != '\n';
        if (!too_long && len && line[len - 1] != '\n') { /* the last line, or a cut one */
            int gerr;
            (void)gzerror(gz, &gerr);
            if (gerr != Z_OK && gerr != Z_STREAM_END)
                break; /* damaged data ended it: not parsed (the error below says why) */
        }
        lineno++;
        if (too_long) { /* drop the rest of the line */
            char tail[4096];
            while (gzgets(gz, tail, sizeof tail)) {
                const z_off_t end = gztell(gz);
                const bool newline = tail[end - at - 1] == '\n'; /* gzgets read >= 1 byte */
                atomic_fetch_add_explicit(&c->r->bytes, (uint64_t)(end - at), /* skipped too */
                                          memory_order_relaxed);
                at = end;
                if (newline)
                    break;
            }
        }
        rc = p ? feed_line(c, p, path, lineno, line, len, too_long, &bad_here)
               : take_line(c, path, lineno, line, len, too_long, &bad_here);
    }
    if (p)
        rc = drain_chunks(c, p, path, &bad_here, rc);
    if (rc == 1)
        rc = 0;
    int gerr;
    const char *gmsg = gzerror(gz, &gerr);
    if (!rc && gerr != Z_OK && gerr != Z_STREAM_END) {
        set_why(c->r, "%s: %s", path, gerr == Z_ERRNO ? strerror(errno) : gmsg);
        rc = PC_EIO;
    }
    if (bad_here > LOG_BAD_MAX)
        PC_WARN("%s: %llu malformed lines in all", path, (unsigned long long)bad_here);
    gzclose(gz);
    return rc ? rc : check_rate(c->r, c->src, true);
}

/* ==== lines from a byte stream (TCP producers, stdin) ====================================== */

/* Bytes arrive in pieces of any size into buf (LINE_MAX_BYTES); lines are cut at '\n'. A line
 * over LINE_MAX_BYTES is handed over once, cut (too_long), and the rest of it up to its newline
 * dropped. */
typedef struct lines_in {
    char *buf;
    size_t len;
    bool dropping;    /* inside a line over LINE_MAX_BYTES */
    uint64_t dropped; /* bytes of such lines' rests, dropped (the source counts them) */
} lines_in_t;

/* A line for the source: 0 to go on, else what stops it (1: the reader stops; an error). */
typedef int (*line_fn)(void *ctx, const char *line, size_t len, bool too_long);

/* Where the next bytes go, and how many fit. */
static char *lines_room(lines_in_t *l, size_t *cap) {
    *cap = LINE_MAX_BYTES - l->len;
    return l->buf + l->len;
}

/* n bytes arrived at lines_room: every complete line to fn, until it returns non-zero (returned).
 */
static int lines_feed(lines_in_t *l, size_t n, line_fn fn, void *ctx) {
    int rc = 0;
    size_t start = 0, end = l->len + n;
    for (size_t i = l->len; i < end && !rc; i++) {
        if (l->buf[i] != '\n')
            continue;
        if (l->dropping) {
            l->dropping = false;
            l->dropped += i + 1 - start;
        } else {
            rc = fn(ctx, l->buf + start, i + 1 - start, false);
        }
        start = i + 1;
    }
    memmove(l->buf, l->buf + start, end - start);
    l->len = end - start;
    if (!rc && l->len == LINE_MAX_BYTES) { /* a line over the limit: counted once, then dropped */
        if (!l->dropping)
            rc = fn(ctx, l->buf, l->len, true);
        else
            l->dropped += l->len;
        l->dropping = true;
        l->len = 0;
    }
    return rc;
}

/* The stream ended: the bytes of a last line without a newline (0 when there are none, or they
 * are the rest of a line over the limit), taken out. */
static size_t lines_rest(lines_in_t *l) {
    const size_t n = l->dropping ? 0 : l->len;
    l->dropped += l->dropping ? l->len : 0;
    l->len = 0;
    return n;
}

/* ==== stdin ================================================================================= */

/* stdin that is not a regular file (a pipe, a terminal, a socket) is read as it comes: poll and
 * read, not zlib's buffered reads, which wait until 256 KiB arrived. So a batch goes out as soon
 * as its last line came, and a close is noticed within STDIN_POLL_MS, whatever the producer
 * does. Gzip data (its magic first) is inflated as it arrives, member after member. A regular
 * file on stdin (`< FILE`) is read like a named file. */
#define STDIN_POLL_MS 20
#define STDIN_READ    (64u << 10)

typedef struct stdin_src {
    cursor_t *c;
    lines_in_t in;
    uint64_t lineno, bad;
    z_stream z;
    bool gz, zinit, member_end;
    bool trailing; /* bytes after the last member that are no member: ignored, as gzread does */
} stdin_src_t;

static int stdin_line(void *ctx, const char *line, size_t len, bool too_long) {
    stdin_src_t *s = ctx;
    return take_line(s->c, "-", ++s->lineno, line, len, too_long, &s->bad);
}

/* n bytes of plain text, through the line assembler. */
static int stdin_text(stdin_src_t *s, const unsigned char *p, size_t n) {
    int rc = 0;
    while (n && !rc) {
        size_t cap;
        char *room = lines_room(&s->in, &cap);
        const size_t k = n < cap ? n : cap;
        memcpy(room, p, k);
        rc = lines_feed(&s->in, k, stdin_line, s);
        p += k;
        n -= k;
    }
    return rc;
}

/* n bytes of gzip data, inflated into the line assembler. */
static int stdin_inflate(stdin_src_t *s, const unsigned char *p, size_t n) {
    s->z.next_in = (unsigned char *)p;
    s->z.avail_in = (unsigned)n;
    int rc = 0;
    while (!rc && s->z.avail_in && !s->trailing) {
        if (s->member_end) { /* another member follows, if the magic says so */
            if (s->z.next_in[0] != 0x1f) {
                s->trailing = true;
                break;
            }
            inflateReset(&s->z);
            s->member_end = false;
        }
        size_t cap;
        char *room = lines_room(&s->in, &cap);
        s->z.next_out = (unsigned char *)room;
        s->z.avail_out = (unsigned)cap;
        const int zr = inflate(&s->z, Z_NO_FLUSH);
        if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
            set_why(s->c->r, "-: gzip data: %s", s->z.msg ? s->z.msg : zError(zr));
            return PC_EIO;
        }
        s->member_end = zr == Z_STREAM_END;
        rc = lines_feed(&s->in, cap - s->z.avail_out, stdin_line, s);
    }
    return rc;
}

/* stdin is a regular file (`< FILE`): read and resumed like a named file. */
static bool stdin_is_file(void) {
    struct stat sb;
    return fstat(0, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int read_stdin(cursor_t *c, char *line) {
    pw_reader_t *r = c->r;
    if (stdin_is_file())
        return read_source(c, NULL, "-", line);
    stdin_src_t *s = pc_scalloc(PC_MEM_BATCH, 1, sizeof *s);
    unsigned char *raw = pc_smalloc(PC_MEM_BATCH, STDIN_READ);
    int rc = s && raw ? 0 : PC_ENOMEM;
    if (s) {
        s->c = c;
        s->in.buf = line;
    }
    size_t got = 0; /* bytes read so far (the magic needs two) */
    unsigned char head[2];
    while (!rc) {
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        const int pr = poll(&pfd, 1, STDIN_POLL_MS);
        if (stopping(r)) {
            rc = 1;
            break;
        }
        if (pr == 0 || (pr < 0 && errno == EINTR))
            continue;
        const ssize_t n = pr < 0 ? -1 : read(0, raw, STDIN_READ);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0) {
            set_why(r, "-: cannot read: %s", strerror(errno));
            rc = PC_EIO;
            break;
        }
        const unsigned char *p = raw;
        size_t k = (size_t)n;
        if (got < 2) { /* the first two bytes decide: gzip's magic, or text */
            while (k && got < 2) {
                head[got++] = *p++;
                k--;
            }
            if (got < 2 && n > 0)
                continue;
            s->gz = got == 2 && head[0] == 0x1f && head[1] == 0x8b;
            if (s->gz && inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK) {
                rc = PC_ENOMEM;
                break;
            }
            s->zinit = s->gz;
            rc = s->gz ? stdin_inflate(s, head, got) : stdin_text(s, head, got);
        }
        if (!rc && k)
            rc = s->gz ? stdin_inflate(s, p, k) : stdin_text(s, p, k);
        if (n == 0)
            break; /* the end */
    }
    if (!rc && s->gz && !s->member_end) {
        set_why(r, "-: gzip data cut short (no end of its last member)");
        rc = PC_EIO;
    }
    const size_t rest = !rc && s ? lines_rest(&s->in) : 0;
    if (rest) /* a last line without a newline */
        rc = stdin_line(s, s->in.buf, rest, false);
    if (rc == 1)
        rc = 0;
    if (s)
        atomic_fetch_add_explicit(&r->bytes, s->in.dropped, memory_order_relaxed);
    if (s && s->bad > LOG_BAD_MAX)
        PC_WARN("-: %llu malformed lines in all", (unsigned long long)s->bad);
    if (s && s->zinit)
        inflateEnd(&s->z);
    pc_sfree(raw);
    pc_sfree(s);
    return rc ? rc : check_rate(r, c->src, true);
}

/* ==== TCP source ========================================================================== */

/* "tcp://HOST:PORT" listens on HOST:PORT (IPv4) for producers; each connection is a stream of
 * lines. The source ends once producers have come and all have gone for tcp_end_idle_ms (or when
 * the reader is closed). Backpressure: while the queue is full the loop blocks in take_line and
 * the producers' TCP windows fill. */
typedef struct tcp_src {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_timer_t timer;
    cursor_t *c;
    int rc;     /* 0, 1 (stop), or an error */
    bool ended; /* tcp_halt: nothing more is taken (a producer that came at the end sent none) */
    int open;
    bool any;
    uint64_t idle_since_ms;
    uint64_t nconn;
} tcp_src_t;

typedef struct tcp_conn {
    uv_tcp_t h;
    tcp_src_t *src;
    lines_in_t in;
    uint64_t lineno, bad;
    char where[48];
} tcp_conn_t;

static bool is_tcp(const char *path) {
    return strncmp(path, "tcp://", 6) == 0;
}

static void tcp_halt(tcp_src_t *t, int rc) {
    if (!t->rc)
        t->rc = rc;
    t->ended = true; /* (the loop's pass goes on: its reads are ignored) */
    uv_stop(&t->loop);
}

static void conn_closed(uv_handle_t *h) {
    tcp_conn_t *k = (tcp_conn_t *)h;
    atomic_fetch_add_explicit(&k->src->c->r->bytes, k->in.dropped, memory_order_relaxed);
    if (k->bad > LOG_BAD_MAX)
        PC_WARN("%s: %llu malformed lines in all", k->where, (unsigned long long)k->bad);
    pc_sfree(k->in.buf);
    pc_sfree(k);
}

static int conn_line(void *ctx, const char *line, size_t len, bool too_long) {
    tcp_conn_t *k = ctx;
    tcp_src_t *t = k->src;
    if (t->rc)
        return t->rc;
    int rc = take_line(t->c, k->where, ++k->lineno, line, len, too_long, &k->bad);
    if (rc)
        tcp_halt(t, rc);
    return rc;
}

/* The start of a line whose producer's connection failed before its newline: what is missing is
 * unknown (a key cut short still parses), so the line counts as malformed, never as a sample. */
static void conn_cut(tcp_conn_t *k, size_t len) {
    tcp_src_t *t = k->src;
    if (t->rc)
        return;
    int rc = line_admit(t->c, ++k->lineno, len);
    if (rc == LINE_KEEP)
        rc = line_commit(t->c, k->where, k->lineno, len, LINE_TEXT, PC_EIO,
                         "the connection failed in this line", NULL, &k->bad);
    else
        rc = rc == LINE_STOP;
    if (rc)
        tcp_halt(t, rc);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    tcp_conn_t *k = (tcp_conn_t *)h;
    size_t cap;
    char *room = lines_room(&k->in, &cap);
    *buf = uv_buf_init(room, (unsigned)cap);
}

static void conn_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    (void)buf;
    tcp_conn_t *k = (tcp_conn_t *)st;
    tcp_src_t *t = k->src;
    if (n > 0) {
        if (!t->ended)
            lines_feed(&k->in, (size_t)n, conn_line, k);
        return;
    }
    if (n == 0)
        return;
    const size_t rest = t->ended ? 0 : lines_rest(&k->in);
    if (rest && n == UV_EOF) /* a last line without a newline */
        conn_line(k, k->in.buf, rest, false);
    else if (rest)
        conn_cut(k, rest);
    if (n != UV_EOF)
        PC_WARN("%s: %s", k->where, uv_strerror((int)n));
    uv_close((uv_handle_t *)st, conn_closed);
    if (--t->open == 0)
        t->idle_since_ms = uv_now(&t->loop);
}

static void on_producer(uv_stream_t *srv, int status) {
    tcp_src_t *t = srv->data;
    if (status < 0 || t->ended) /* (one that came at the end: closed with the loop, unread) */
        return;
    tcp_conn_t *k = pc_scalloc(PC_MEM_BATCH, 1, sizeof *k);
    if (!k || !(k->in.buf = pc_smalloc(PC_MEM_BATCH, LINE_MAX_BYTES))) {
        pc_sfree(k);
        tcp_halt(t, PC_ENOMEM);
        return;
    }
    k->src = t;
    uv_tcp_init(&t->loop, &k->h);
    k->h.data = NULL; /* marks a connection for close_any */
    if (uv_accept(srv, (uv_stream_t *)&k->h) < 0) {
        uv_close((uv_handle_t *)&k->h, conn_closed);
        return;
    }
    snprintf(k->where, sizeof k->where, "tcp producer %llu", (unsigned long long)++t->nconn);
    t->open++;
    t->any = true;
    uv_read_start((uv_stream_t *)&k->h, conn_alloc, conn_read);
}

static void tcp_tick(uv_timer_t *tm) {
    tcp_src_t *t = tm->data;
    if (stopping(t->c->r))
        tcp_halt(t, 1);
    else if (t->any && t->open == 0 &&
             uv_now(&t->loop) - t->idle_since_ms >= t->c->r->o.tcp_end_idle_ms)
        tcp_halt(t, 0);
}

static void close_any(uv_handle_t *h, void *arg) {
    (void)arg;
    if (uv_is_closing(h))
        return;
    uv_close(h, h->type == UV_TCP && h->data == NULL ? conn_closed : NULL);
}

static void set_port(pw_reader_t *r, int port) {
    pthread_mutex_lock(&r->mu);
    r->tcp_port = port;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int read_tcp(cursor_t *c, const char *path) {
    pw_reader_t *r = c->r;
    char host[64];
    int port;
    const char *colon = strrchr(path + 6, ':');
    struct sockaddr_in addr;
    if (!colon || (size_t)(colon - path - 6) >= sizeof host ||
        sscanf(colon + 1, "%d", &port) != 1 || port < 0 || port > 65535) {
        set_why(r, "%s: not tcp://HOST:PORT", path);
        set_port(r, -1);
        return PC_EINVAL;
    }
    memcpy(host, path + 6, (size_t)(colon - path - 6));
    host[colon - path - 6] = '\0';
    tcp_src_t *t = pc_scalloc(PC_MEM_BATCH, 1, sizeof *t);
    if (!t) {
        set_port(r, -1);
        return PC_ENOMEM;
    }
    t->c = c;
    int rc = uv_loop_init(&t->loop);
    if (rc) {
        pc_sfree(t);
        set_port(r, -1);
        return PC_ESYS;
    }
    uv_tcp_init(&t->loop, &t->listener);
    t->listener.data = t;
    uv_timer_init(&t->loop, &t->timer);
    t->timer.data = t;
    int uerr = uv_ip4_addr(host, port, &addr);
    if (!uerr)
        uerr = uv_tcp_bind(&t->listener, (const struct sockaddr *)&addr, 0);
    if (!uerr)
        uerr = uv_listen((uv_stream_t *)&t->listener, 64, on_producer);
    if (uerr) {
        set_why(r, "%s: cannot listen: %s", path, uv_strerror(uerr));
        rc = PC_EIO;
        set_port(r, -1);
    } else {
        struct sockaddr_storage sa;
        int len = sizeof sa;
        uv_tcp_getsockname(&t->listener, (struct sockaddr *)&sa, &len);
        const int bound = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        PC_INFO("reader: listening for samples on %s:%d", host, bound);
        set_port(r, bound);
        uv_timer_start(&t->timer, tcp_tick, 20, 20);
        uv_run(&t->loop, UV_RUN_DEFAULT);
        rc = t->rc == 1 ? 0 : t->rc;
    }
    /* Connections carry data = NULL (their tcp_conn_t is the handle); listener and timer have
     * data = t and are embedded. */
    uv_walk(&t->loop, close_any, NULL);
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
    pc_sfree(t);
    return rc ? rc : check_rate(r, c->src, true);
}

static void *reader_main(void *arg) {
    pw_reader_t *r = arg;
    char *line = pc_smalloc(PC_MEM_BATCH, LINE_MAX_BYTES);
    cursor_t *c =
        pc_scalloc(PC_MEM_BATCH, 1, sizeof *c); /* the sample is large: not on the stack */
    if (!line || !c) {
        pc_sfree(line);
        pc_sfree(c);
        finish(r, PC_ENOMEM);
        return NULL;
    }
    c->r = r;
    c->skip = r->o.skip_lines;
    int rc = 0;
    bool files = false;
    for (size_t i = 0; i < r->o.npaths; i++)
        files |= i % r->o.world == r->o.rank && !is_tcp(r->paths[i]) && strcmp(r->paths[i], "-");
    if ((files || r->o.dedup) && r->o.parse_threads > 0 &&
        !(r->pool = pool_new(r, r->o.parse_threads))) {
        set_why(r, "cannot start %d parse threads", r->o.parse_threads);
        rc = PC_ENOMEM;
    }
    c->b = rc ? NULL : slot_acquire(r);
    bool stdin_read = false;
    for (int e = 0; e < r->o.epochs && !rc && c->b && !stopping(r); e++) {
        atomic_store(&r->epoch, (uint64_t)e + 1);
        for (size_t i = 0; i < r->o.npaths && !rc && c->b && !stopping(r); i++) {
            if (i % r->o.world != r->o.rank)
                continue;
            if (strcmp(r->paths[i], "-") == 0 || is_tcp(r->paths[i])) { /* streams: once */
                if (e > 0)
                    continue;
                if (strcmp(r->paths[i], "-") == 0 && stdin_read)
                    continue;
                stdin_read |= strcmp(r->paths[i], "-") == 0;
            }
            c->src = i;
            r->src[i].resumed = false; /* (set again when lines of it are skipped) */
            c->stream = is_tcp(r->paths[i]) || (strcmp(r->paths[i], "-") == 0 && !stdin_is_file());
            if (c->stream && c->skip)
                PC_INFO("reader: %s: a stream has no resume offsets: its lines are not skipped "
                        "(%llu lines still to skip go to the files after it)",
                        r->paths[i], (unsigned long long)c->skip);
            /* streams are parsed here: a producer sets its pace (no waiting for a chunk) */
            rc = is_tcp(r->paths[i])             ? read_tcp(c, r->paths[i])
                 : strcmp(r->paths[i], "-") == 0 ? read_stdin(c, line)
                                                 : read_source(c, r->pool, r->paths[i], line);
        }
    }
    if (!rc && c->b && c->b->n && !stopping(r)) /* the last, partial batch */
        rc = slot_publish(r, c->b);
    else if (!rc && c->b && !c->b->n && c->b->lines && !stopping(r)) {
        /* lines after the last batch (bad or blank): consumed at the end */
        pthread_mutex_lock(&r->mu);
        r->tail_lines = c->b->lines;
        pthread_mutex_unlock(&r->mu);
    }
    pool_free(r->pool); /* after every batch's dedup */
    r->pool = NULL;
    if (r->tcp_port == 0) /* never reached: wake pw_reader_tcp_port waiters */
        set_port(r, -1);
    pc_sfree(line);
    pc_sfree(c);
    finish(r, rc);
    return NULL;
}

/* ==== consumer side ======================================================================== */

/* Free everything of a reader whose thread is not running (never started, or joined). */
static void reader_free(pw_reader_t *r) {
    for (size_t i = 0; r->slots && i < r->nslots; i++)
        batch_free(&r->slots[i]);
    for (size_t i = 0; r->paths && i < r->o.npaths; i++)
        pc_sfree(r->paths[i]);
    pc_sfree(r->slots);
    pc_sfree(r->caps);
    pc_sfree(r->ready);
    pw_unique_free(&r->uniq);
    pc_sfree(r->paths);
    pc_sfree(r->src);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    pc_sfree(r);
}

int pw_reader_open(const pw_reader_opts_t *o, pw_reader_t **out) {
    if (!o || !out || !o->npaths || !o->paths || o->world < 1 || o->rank >= o->world ||
        o->batch < 1 || o->queue < 1 || o->epochs < 1 || o->max_error_rate < 0 ||
        o->max_error_rate > 1 || o->parse_threads < -1 ||
        o->parse_threads > PW_READER_PARSE_THREADS_MAX)
        return PC_EINVAL;
    pw_reader_t *r = pc_scalloc(PC_MEM_BATCH, 1, sizeof *r);
    if (!r)
        return PC_ENOMEM;
    r->o = *o;
    if (o->format == PW_FMT_CSV) {
        if (!o->csv) {
            pc_sfree(r);
            return PC_EINVAL;
        }
        r->csv = *o->csv;
    }
    r->o.csv = &r->csv;
    if (o->parse_threads < 0) {
        cpu_set_t set;
        const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        r->o.parse_threads = cpus / 4 < 4 ? cpus / 4 : 4;
    }
    r->tcp_port = -1; /* until a TCP source is found below */
    for (size_t i = 0; i < o->npaths; i++)
        if (i % o->world == o->rank && is_tcp(o->paths[i]))
            r->tcp_port = 0;
    r->nslots = o->queue + 1;
    r->slots = pc_scalloc(PC_MEM_BATCH, r->nslots, sizeof *r->slots);
    r->caps = pc_scalloc(PC_MEM_BATCH, r->nslots, sizeof *r->caps);
    r->ready = pc_scalloc(PC_MEM_BATCH, r->nslots, sizeof *r->ready);
    r->paths = pc_scalloc(PC_MEM_BATCH, o->npaths, sizeof *r->paths);
    r->src = pc_scalloc(PC_MEM_BATCH, o->npaths, sizeof *r->src);
    int rc = r->slots && r->caps && r->ready && r->paths && r->src ? 0 : PC_ENOMEM;
    for (size_t i = 0; !rc && i < o->npaths; i++) {
        const size_t len = strlen(o->paths[i]) + 1;
        if ((r->paths[i] = pc_smalloc(PC_MEM_BATCH, len)))
            memcpy(r->paths[i], o->paths[i], len);
        else
            rc = PC_ENOMEM;
    }
    for (size_t i = 0; !rc && i < r->nslots; i++) {
        r->caps[i] = o->batch * 32;
        rc = batch_alloc(&r->slots[i], o->batch, r->caps[i], o->dedup);
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->consumed = o->skip_lines;
    if (!rc && pthread_create(&r->thread, NULL, reader_main, r))
        rc = PC_ESYS;
    if (rc) {
        reader_free(r); /* no thread to join */
        return rc;
    }
    *out = r;
    return 0;
}

const pw_batch_t *pw_reader_next(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    if (r->holding) { /* release the batch handed out last time */
        r->head = (r->head + 1) % r->nslots;
        r->count--;
        r->holding = false;
        pthread_cond_broadcast(&r->cv);
    }
    while ((r->count == 0 || !r->ready[r->head]) && !r->done && !r->err)
        pthread_cond_wait(&r->cv, &r->mu);
    const pw_batch_t *b = NULL;
    if (r->count && r->ready[r->head] && !r->err) {
        b = &r->slots[r->head];
        r->holding = true;
        r->consumed += b->lines;
    } else if (!r->err && r->done) { /* the end: the lines no batch carried are consumed too */
        r->consumed += r->tail_lines;
        r->tail_lines = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return b;
}

int pw_reader_error(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    int e = r->err;
    pthread_mutex_unlock(&r->mu);
    return e;
}

const char *pw_reader_error_text(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    const char *w = r->err ? r->why : ""; /* set with err, or before it (never after) */
    pthread_mutex_unlock(&r->mu);
    return w;
}

int pw_reader_tcp_port(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    while (r->tcp_port == 0 && !r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    int p = r->tcp_port > 0 ? r->tcp_port : -1;
    pthread_mutex_unlock(&r->mu);
    return p;
}

uint64_t pw_reader_consumed(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    uint64_t c = r->consumed;
    pthread_mutex_unlock(&r->mu);
    return c;
}

void pw_reader_stats(pw_reader_t *r, pw_reader_stats_t *s) {
    s->lines = atomic_load(&r->lines);
    s->samples = atomic_load(&r->samples);
    s->bad = atomic_load(&r->bad);
    s->bytes = atomic_load(&r->bytes);
    s->epoch = atomic_load(&r->epoch);
}

int pw_reader_source_stats(pw_reader_t *r, size_t i, pw_reader_source_t *out) {
    if (i >= r->o.npaths || i % r->o.world != r->o.rank)
        return PC_ENOTFOUND;
    const src_count_t *sc = &r->src[i];
    out->path = r->paths[i];
    out->lines = atomic_load(&sc->lines);
    out->samples = atomic_load(&sc->samples);
    out->bad = atomic_load(&sc->bad);
    pthread_mutex_lock(&r->mu);
    out->first_bad_line = sc->first_bad_line;
    memcpy(out->first_bad, sc->first_bad, sizeof out->first_bad);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void pw_reader_close(pw_reader_t *r) {
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    reader_free(r);
}
