/* pw_reader.c: see pw_reader.h.
 *
 * DESIGN: a ring of queue + 1 preallocated batches; the consumer holds at most one (the batch it
 * was last given, released at its next call), the reader thread fills the others. zlib's gzFile
 * reads plain and gzip files alike (gzopen is transparent to uncompressed input), so every
 * source is a gzFile; stdin is wrapped with gzdopen.
 */
#include "pw_reader.h"

#include "pc_error.h"
#include "pc_log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define LINE_MAX_BYTES (1u << 20)
#define LOG_BAD_MAX    20
#define MIN_LINES_RATE 1000

struct pw_reader {
    pw_reader_opts_t o;
    char **paths;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* one condition: batches and space both signal it */
    pw_batch_t *slots;
    size_t nslots, head, count;
    bool holding, done, stop;
    int err;
    uint64_t consumed;
    size_t key_cap; /* per batch */
    atomic_uint_least64_t lines, samples, bad, bytes;
};

static void batch_free(pw_batch_t *b) {
    free(b->labels);
    free(b->dense);
    free(b->keys);
    free(b->fields);
    free(b->vals);
    free(b->key_off);
}

static int batch_alloc(pw_batch_t *b, size_t batch, size_t key_cap) {
    memset(b, 0, sizeof *b);
    b->labels = malloc(batch * sizeof *b->labels);
    b->dense = malloc(batch * PW_DENSE_MAX * sizeof *b->dense);
    b->key_off = malloc((batch + 1) * sizeof *b->key_off);
    b->keys = malloc(key_cap * sizeof *b->keys);
    b->fields = malloc(key_cap * sizeof *b->fields);
    b->vals = malloc(key_cap * sizeof *b->vals);
    return b->labels && b->dense && b->key_off && b->keys && b->fields && b->vals ? 0 : PC_ENOMEM;
}

/* Append sample s to batch b (whose key arrays hold *cap keys). */
static int batch_add(pw_batch_t *b, size_t *cap, const pw_sample_t *s) {
    const size_t base = b->key_off[b->n];
    if (base + s->nkeys > *cap) {
        size_t nc = 2 * *cap + s->nkeys;
        uint64_t *k = realloc(b->keys, nc * sizeof *k);
        if (k)
            b->keys = k;
        uint16_t *f = realloc(b->fields, nc * sizeof *f);
        if (f)
            b->fields = f;
        float *v = realloc(b->vals, nc * sizeof *v);
        if (v)
            b->vals = v;
        if (!k || !f || !v)
            return PC_ENOMEM;
        *cap = nc;
    }
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

static void slot_publish(pw_reader_t *r) {
    pthread_mutex_lock(&r->mu);
    r->count++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void finish(pw_reader_t *r, int err) {
    pthread_mutex_lock(&r->mu);
    r->done = true;
    if (!r->err)
        r->err = err;
    pthread_cond_broadcast(&r->cv);
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
    size_t cap;
    uint64_t skip;
    pw_sample_t s;
} cursor_t;

/* One source: read, parse, batch. 0, or a fatal error. */
static int read_source(cursor_t *c, const char *path, char *line) {
    pw_reader_t *r = c->r;
    gzFile gz = strcmp(path, "-") == 0 ? gzdopen(dup(0), "rb") : gzopen(path, "rb");
    if (!gz) {
        PC_ERROR("reader: cannot open %s", path);
        return PC_EIO;
    }
    gzbuffer(gz, 256 << 10);
    uint64_t lineno = 0, bad_here = 0;
    int rc = 0;
    while (!rc && gzgets(gz, line, LINE_MAX_BYTES)) {
        size_t len = strlen(line);
        lineno++;
        atomic_fetch_add_explicit(&r->bytes, len, memory_order_relaxed);
        bool too_long = len == LINE_MAX_BYTES - 1 && line[len - 1] != '\n';
        if (too_long) { /* drop the rest of the line */
            char tail[4096];
            while (gzgets(gz, tail, sizeof tail) && tail[strlen(tail) - 1] != '\n')
                ;
        }
        if (c->skip) {
            c->skip--;
            continue;
        }
        if ((lineno & 4095) == 0 && stopping(r))
            break;
        atomic_fetch_add_explicit(&r->lines, 1, memory_order_relaxed);
        c->b->lines++;
        char err[160];
        int prc =
            too_long ? PC_ETOOBIG : pw_parse_line(r->o.format, line, len, &c->s, err, sizeof err);
        if (prc) {
            const uint64_t nbad = atomic_fetch_add(&r->bad, 1) + 1;
            if (++bad_here <= LOG_BAD_MAX)
                PC_WARN("%s:%llu: %s", path, (unsigned long long)lineno,
                        too_long ? "line longer than 1 MiB" : err);
            const uint64_t nl = atomic_load(&r->lines);
            if (nl >= MIN_LINES_RATE && (double)nbad > r->o.max_error_rate * (double)nl) {
                PC_ERROR("reader: %llu of %llu lines malformed (over max_error_rate %.4g); "
                         "stopping at %s:%llu",
                         (unsigned long long)nbad, (unsigned long long)nl, r->o.max_error_rate,
                         path, (unsigned long long)lineno);
                rc = PC_EPARSE;
            }
            continue;
        }
        if ((rc = batch_add(c->b, &c->cap, &c->s)))
            break;
        atomic_fetch_add_explicit(&r->samples, 1, memory_order_relaxed);
        if (c->b->n == r->o.batch) {
            slot_publish(r);
            if (!(c->b = slot_acquire(r)))
                break;
        }
    }
    int gerr;
    const char *gmsg = gzerror(gz, &gerr);
    if (!rc && gerr != Z_OK && gerr != Z_STREAM_END) {
        PC_ERROR("reader: %s: %s", path, gmsg);
        rc = PC_EIO;
    }
    if (bad_here > LOG_BAD_MAX)
        PC_WARN("%s: %llu malformed lines in all", path, (unsigned long long)bad_here);
    gzclose(gz);
    return rc;
}

static void *reader_main(void *arg) {
    pw_reader_t *r = arg;
    char *line = malloc(LINE_MAX_BYTES);
    cursor_t *c = calloc(1, sizeof *c); /* the sample is large: not on the stack */
    if (!line || !c) {
        free(line);
        free(c);
        finish(r, PC_ENOMEM);
        return NULL;
    }
    c->r = r;
    c->skip = r->o.skip_lines;
    c->cap = r->key_cap;
    c->b = slot_acquire(r);
    int rc = 0;
    bool stdin_read = false;
    for (int e = 0; e < r->o.epochs && !rc && c->b; e++) {
        for (size_t i = 0; i < r->o.npaths && !rc && c->b; i++) {
            if (i % r->o.world != r->o.rank)
                continue;
            if (strcmp(r->paths[i], "-") == 0) { /* stdin cannot be read twice */
                if (stdin_read)
                    continue;
                stdin_read = true;
            }
            rc = read_source(c, r->paths[i], line);
        }
    }
    if (c->b && c->b->n) /* the last, partial batch */
        slot_publish(r);
    free(line);
    free(c);
    finish(r, rc);
    return NULL;
}

/* ==== consumer side ======================================================================== */

int pw_reader_open(const pw_reader_opts_t *o, pw_reader_t **out) {
    if (!o || !out || !o->npaths || !o->paths || o->world < 1 || o->rank >= o->world ||
        o->batch < 1 || o->queue < 1 || o->epochs < 1 || o->max_error_rate < 0 ||
        o->max_error_rate > 1)
        return PC_EINVAL;
    pw_reader_t *r = calloc(1, sizeof *r);
    if (!r)
        return PC_ENOMEM;
    r->o = *o;
    r->nslots = o->queue + 1;
    r->key_cap = o->batch * 32;
    r->slots = calloc(r->nslots, sizeof *r->slots);
    r->paths = calloc(o->npaths, sizeof *r->paths);
    int rc = r->slots && r->paths ? 0 : PC_ENOMEM;
    for (size_t i = 0; !rc && i < o->npaths; i++)
        if (!(r->paths[i] = strdup(o->paths[i])))
            rc = PC_ENOMEM;
    for (size_t i = 0; !rc && i < r->nslots; i++)
        rc = batch_alloc(&r->slots[i], o->batch, r->key_cap);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->consumed = o->skip_lines;
    if (!rc && pthread_create(&r->thread, NULL, reader_main, r))
        rc = PC_ESYS;
    if (rc) {
        r->done = true; /* no thread to join */
        for (size_t i = 0; r->slots && i < r->nslots; i++)
            batch_free(&r->slots[i]);
        for (size_t i = 0; r->paths && i < o->npaths; i++)
            free(r->paths[i]);
        free(r->slots);
        free(r->paths);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
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
    while (r->count == 0 && !r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    const pw_batch_t *b = NULL;
    if (r->count && !r->err) {
        b = &r->slots[r->head];
        r->holding = true;
        r->consumed += b->lines;
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
}

void pw_reader_close(pw_reader_t *r) {
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    for (size_t i = 0; i < r->nslots; i++)
        batch_free(&r->slots[i]);
    for (size_t i = 0; i < r->o.npaths; i++)
        free(r->paths[i]);
    free(r->slots);
    free(r->paths);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
