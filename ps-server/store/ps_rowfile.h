/* ps_rowfile.h: the EmberPS row file, one table's rows in a portable binary file.
 *
 * Used for the RAM rows of checkpoints and for table export/import. Little-endian:
 *
 *   header   "EMBRROWS" u32 format(=1) u32 dim u32 state_len u32 optimizer u32 cut_clock
 *            u32 flags (PS_ROWFILE_INCREMENTAL) u64 version u32 config_len, then config_len
 *            bytes of table settings
 *            ("name=ads,dim=64,..." as ps_table_config_parse reads them)
 *   rows     per row: u64 key, u16 tick, u8 freq, u8 row_format(=1), dim f32 weights,
 *            state_len f32 optimizer state
 *   tombs    u64 keys removed (incremental checkpoints)
 *   footer   u64 rows, u64 tombstones, u64 XXH3-64 of every byte before the footer and of the
 *            two counts, "EMBREND1"
 *
 * Readers check sizes against the footer before reading anything else and the checksum before
 * reporting success, so a truncated or corrupted file is an error (PC_ECORRUPT), never wrong rows.
 * Export without optimizer state writes state_len 0.
 *
 * Thread rule: a writer or reader is single-owner.
 */
#ifndef PS_ROWFILE_H
#define PS_ROWFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_table.h"

typedef struct ps_rowfile_w ps_rowfile_w_t;

/* flags: the file holds only the rows changed since a parent, plus tombstones */
#define PS_ROWFILE_INCREMENTAL 1u

typedef struct ps_rowfile_meta {
    uint32_t dim, state_len, optimizer, cut_clock;
    uint32_t flags;
    uint64_t version;
    char config[2048]; /* table settings as a spec list */
    /* read only (ps_rowfile_read fills them before any callback; create ignores them): the
     * footer's counts and checksum, and the file's size */
    uint64_t rows, tombs, checksum, bytes;
} ps_rowfile_meta_t;

/* Create `path` (truncated) and write the header. */
int ps_rowfile_create(const char *path, const ps_rowfile_meta_t *meta, ps_rowfile_w_t **out);
/* Append rows (views borrowed for the call); state is written when meta.state_len > 0. */
int ps_rowfile_add_rows(ps_rowfile_w_t *w, const ps_row_view_t *rows, size_t n);
/* Append tombstones. */
int ps_rowfile_add_tombs(ps_rowfile_w_t *w, const uint64_t *keys, size_t n);
/* Write the footer, fsync and close. *bytes and *checksum (may be NULL) get the file's size and
 * checksum. The writer is freed whatever happens. */
int ps_rowfile_finish(ps_rowfile_w_t *w, uint64_t *rows, uint64_t *tombs, uint64_t *bytes,
                      uint64_t *checksum);
/* Abandon a writer: close and unlink the file. */
void ps_rowfile_abort(ps_rowfile_w_t *w);

/* Rows come to the reader's callback in batches of up to 4096: keys[n], weights[n * dim],
 * states[n * state_len] (NULL when state_len is 0), ticks[n], freqs[n]. */
typedef int (*ps_rowfile_rows_fn)(void *ctx, size_t n, const uint64_t *keys, const float *weights,
                                  const float *states, const uint16_t *ticks, const uint8_t *freqs);

/* Read `path`: meta, then tombstones (before rows, so that applying them in order restores an
 * incremental), then rows. Any callback may be NULL. PC_ECORRUPT on a bad or truncated file
 * (callbacks may have run before a checksum mismatch is detected at the end); PC_EIO when a read
 * of it fails (a disk error is not damage: a restore stops instead of going back to an older
 * checkpoint). */
int ps_rowfile_read(const char *path, ps_rowfile_meta_t *meta, ps_keys_fn tombs_fn,
                    ps_rowfile_rows_fn rows_fn, void *ctx);

#endif
