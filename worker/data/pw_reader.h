/* pw_reader.h: sample streams into batches, parsed off the training thread.
 *
 * A reader owns one thread that reads its sources line by line, parses them (pw_parse.h) and
 * fills batches into a bounded queue; the trainer takes batches with pw_reader_next. Sources: a
 * list of files (file i belongs to rank i % world, so workers split the files), "-" for stdin;
 * names ending in ".gz" are read through zlib; "tcp://HOST:PORT" listens there (IPv4, port 0:
 * any) for producers that connect and send lines, any number at once, and ends once producers
 * have come and all have gone for tcp_end_idle_ms. Files are read in order, `epochs` times;
 * stdin and TCP streams once (the first epoch). CSV headers (spec header=1) are skipped at the
 * start of every file and every producer connection.
 *
 * Bad lines are counted and skipped, each logged with file:line and the reason (the first 20
 * per source, then a count); blank lines are skipped and not counted (they count toward
 * positions only). The error-rate rule, per source (a path; a TCP source's producers together):
 * when a source ends, any size, and while it is read once it has 1000 lines, more than
 * max_error_rate x its lines malformed stops the reader with PC_EPARSE and a one-line reason
 * naming it (pw_reader_error_text; "no usable samples" when none of its lines parsed). The
 * counts are per source (pw_reader_source_stats) and in total (pw_reader_stats); a source's
 * counts cover every epoch, from skip_lines on. Resume: skip_lines drops
 * that many lines of this rank's files first (good or bad alike; a stream's lines are never
 * skipped: its producer sends from where it knows), so a restarted worker continues exactly
 * after what pw_reader_consumed() reported when its checkpoint was taken. A file entered
 * part-way is judged at its end only by a rest of at least 1000 lines.
 *
 * Parse threads: with parse_threads > 0, files are parsed on that many threads beside the
 * reader thread, in chunks of lines, and committed in stream order: batches, counts, positions,
 * bytes, logs and the error-rate rule are exactly those of parsing on the reader thread. Stdin
 * and TCP sources are always parsed on the reader thread: their producers set the pace, and a
 * batch goes out as soon as its last line came (a chunk would wait for 256 lines). The threads
 * also find each batch's unique keys (dedup), whatever the sources.
 *
 * Thread rule: pw_reader_next / consumed / error_text / close from one consumer thread; stats
 * and source stats from any.
 */
#ifndef PW_READER_H
#define PW_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_parse.h"

/* A batch of samples. Sample i: labels[i], dense[i * ndense ...], and its features
 * keys/fields/vals[key_off[i] .. key_off[i + 1]). With opts.dedup, also its unique keys as
 * pw_unique gives them: ukeys[0..nu) in first-seen order, feature j's key is ukeys[inv[j]]
 * (NULL and 0 without). */
typedef struct pw_batch {
    size_t n, ndense;
    float *labels, *dense;
    uint64_t *keys;
    uint16_t *fields;
    float *vals;
    size_t *key_off;
    uint64_t lines; /* lines of this rank's files this batch covers (samples, bad and blank
                     * lines); a stream's lines are not counted, since a resume never skips them */
    uint64_t *ukeys;
    uint32_t *inv;
    size_t nu;
} pw_batch_t;

typedef struct pw_reader_opts {
    pw_format_t format;
    const pw_csv_spec_t *csv; /* PW_FMT_CSV: the column spec (copied) */
    const char *const *paths; /* "-" is stdin */
    size_t npaths;
    uint32_t rank, world;  /* world >= 1 */
    size_t batch;          /* samples per batch, >= 1 */
    size_t queue;          /* batches buffered ahead, >= 1 */
    int epochs;            /* >= 1 */
    double max_error_rate; /* 0..1 */
    uint64_t skip_lines;
    uint32_t tcp_end_idle_ms; /* TCP source: end after all producers left for this long */
    int parse_threads;        /* 0: the reader thread parses; 1..PW_READER_PARSE_THREADS_MAX; -1: a
                               * quarter of the CPUs this process may run on, at most 4 */
    bool dedup;      /* each batch comes with its unique keys (ukeys, inv, nu), found by a parse
                      * thread (the reader thread without them) once the batch is complete */
    uint32_t fields; /* the model's field count: a line with a field at or above it is malformed
                      * (counted like any other); 0: any field the format takes */
} pw_reader_opts_t;

#define PW_READER_PARSE_THREADS_MAX 64

typedef struct pw_reader pw_reader_t;

/* Start reading. PC_EINVAL for bad options; sources that cannot be opened are reported by
 * pw_reader_error later (PC_EIO), when the reader reaches them. */
int pw_reader_open(const pw_reader_opts_t *o, pw_reader_t **out);

/* The next batch (valid until the next call or close), or NULL at the end of the stream or on a
 * fatal error (see pw_reader_error). */
const pw_batch_t *pw_reader_next(pw_reader_t *r);

/* 0, or why the stream stopped early (PC_EIO, PC_EPARSE for too many bad lines, PC_ENOMEM). */
int pw_reader_error(pw_reader_t *r);

#define PW_READER_WHY_MAX    640
#define PW_READER_REASON_MAX 256

/* One line saying why the stream stopped, naming the source: "train.tsv: no usable samples: 812
 * lines read, 812 malformed (first: line 1: ...)", "x.tsv: cannot open: No such file or
 * directory"; "" while it has not stopped, when it ended normally, or when nothing more than
 * pw_reader_error's code is known (PC_ENOMEM). Owned by the reader: valid until close. */
const char *pw_reader_error_text(pw_reader_t *r);

/* The port this rank's TCP source listens on, waiting until it is bound (the sources before it
 * must be consumed first); -1 at once when the stream has none, or when it could not listen
 * (pw_reader_error says why). Any thread. */
int pw_reader_tcp_port(pw_reader_t *r);

/* Lines of this rank's stream covered by the batches returned so far, plus skip_lines: the
 * skip_lines of a resumed reader. */
uint64_t pw_reader_consumed(pw_reader_t *r);

/* The stream's totals: lines read (not blank lines, CSV headers or lines skipped for a resume),
 * samples (lines that parsed), bad (malformed lines), bytes (every byte, skipped ones too). */
typedef struct pw_reader_stats {
    uint64_t lines, samples, bad, bytes;
    uint64_t epoch; /* the pass the reader thread is in, from 1 (it reads a few batches ahead) */
} pw_reader_stats_t;
void pw_reader_stats(pw_reader_t *r, pw_reader_stats_t *out);

/* What source i (an index into opts.paths) gave so far, over every epoch: lines read, samples and
 * malformed lines as in pw_reader_stats, and the first malformed line ("line 3: 2 fields, want
 * 40"; "tcp producer 1:3: ..." for a TCP source; "" when none). */
typedef struct pw_reader_source {
    const char *path; /* the reader's copy: valid until close */
    uint64_t lines, samples, bad;
    uint64_t first_bad_line; /* 0: none */
    char first_bad[PW_READER_REASON_MAX];
} pw_reader_source_t;

/* Source i's counts (any thread). PC_ENOTFOUND when i is out of range or another rank's file. */
int pw_reader_source_stats(pw_reader_t *r, size_t i, pw_reader_source_t *out);

/* Stop the thread (also early) and free everything. NULL is a no-op. */
void pw_reader_close(pw_reader_t *r);

#endif
