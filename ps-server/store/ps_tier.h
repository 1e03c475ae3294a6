/* ps_tier.h: the cold tier of a server's embedding tables, in RocksDB.
 *
 * One RocksDB database per server (the tier), one column family per cold table ("t.<name>").
 * A row is stored under its key as 8 big-endian bytes; the value is a versioned record:
 *   byte 0: format (1), byte 1: frequency counter, bytes 2-3: zero,
 *   bytes 4-7: clock of the row's last change (u32 LE), then dim weights and state_len
 *   optimizer words as little-endian floats.
 * Tables with config `cold=true` are attached to the tier (ps_tier_attach) and then keep at most
 * capacity_rows rows in RAM; see "cold tier" in ps_table.h for how rows move between the two.
 *
 * The live database is working storage, not durable state: ps_tier_open starts it empty, and
 * durable state is what checkpoints hold (ps_ckpt.h: a RocksDB hard-link checkpoint of the tier
 * plus the RAM rows, taken at one cut). Writes skip RocksDB's WAL for that reason.
 *
 * Disk full: Debian's RocksDB aborts the process on ENOSPC, so the tier refuses writes while the
 * file system holding `dir` has less than min_free_bytes available (checked at most every 20 ms):
 * spills of changed rows fail with PC_ENOSPC (the table keeps them in RAM and refuses new rows),
 * tier checkpoints fail with PC_ENOSPC, reads go on. After a write that fails for another reason
 * (an I/O error; RocksDB's read-only state after a failed flush) writes are refused for a second,
 * then tried again: erases and spills asked then fail with PC_EIO, and a full shard refuses new
 * rows (PC_ENOSPC) as at the watermark.
 *
 * Thread rule: thread-safe, except that ps_tier_close needs every table detached, and a table
 * must not be in use while it is attached or detached.
 */
#ifndef PS_TIER_H
#define PS_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_catalog.h"
#include "ps_table.h"

typedef struct ps_tier ps_tier_t;

typedef struct ps_tier_opts {
    const char *dir;             /* live database directory (emptied at open: only one that is
                                  * empty, or the tier's own, holding its marker EMBERPS-TIER or a
                                  * RocksDB database; any other is PC_EEXIST, left as it is) */
    uint64_t cache_bytes;        /* RocksDB block cache, 0: 256 MiB */
    uint64_t write_buffer_bytes; /* memtable size per table, 0: 64 MiB */
    uint64_t min_free_bytes;     /* free-space watermark, 0: 1 GiB */
} ps_tier_opts_t;

int ps_tier_open(const ps_tier_opts_t *o, ps_tier_t **out);
/* Close the database. Every table must be detached. NULL is a no-op. */
void ps_tier_close(ps_tier_t *tier);

/* Attach cold table t (config cold=true, else PC_EINVAL): open its column family, creating it
 * (fresh: dropping any old one first, so a new table starts empty) and install the table's cold
 * hooks. Attaching an attached table is a no-op. */
int ps_tier_attach(ps_tier_t *tier, ps_table_t *t, bool fresh);
/* Detach t (before destroying it); drop: delete its cold rows with the column family. */
void ps_tier_detach(ps_tier_t *tier, ps_table_t *t, bool drop);
bool ps_tier_attached(const ps_tier_t *tier, const ps_table_t *t);

/* Make `cat` attach its cold tables to the tier when they enter it (fresh, or kept when
 * restored) and detach them, dropping their cold rows, when they are destroyed. */
void ps_tier_bind_catalog(ps_tier_t *tier, ps_catalog_t *cat);

/* Whether writes are allowed now: the watermark (the free-space reading refreshed when stale),
 * and no write failed in the last second. */
bool ps_tier_writable(ps_tier_t *tier);

/* RocksDB checkpoint of the whole tier into `dir` (must not exist): memtables are flushed, SST
 * files hard-linked. The caller freezes the cold tables around it (ps_table_cold_freeze).
 * PC_ENOSPC below the watermark, PC_EIO on other errors. */
int ps_tier_checkpoint(ps_tier_t *tier, const char *dir);

/* Replace the live database by a copy of checkpoint directory `src` (SST files hard-linked,
 * falling back to copies across file systems). No table may be attached (PC_EINVAL). A copy
 * that fails, or does not open (damaged files: PC_ECORRUPT, a checkpoint to go back from),
 * leaves an empty, working database. */
int ps_tier_replace(ps_tier_t *tier, const char *src);

/* A consistent read-only view of one table's cold rows (a RocksDB snapshot). */
typedef struct ps_tier_view ps_tier_view_t;
int ps_tier_view_open(ps_tier_t *tier, const ps_table_t *t, ps_tier_view_t **out);
/* Visit the view's rows in key order, up to 256 per call of fn (pointers valid during the call;
 * nonzero from fn stops the scan with that value). PC_ECORRUPT for a bad record. */
int ps_tier_view_scan(ps_tier_view_t *v, int (*fn)(void *ctx, const ps_cold_row_t *rows, size_t n),
                      void *ctx);
void ps_tier_view_close(ps_tier_view_t *v);

typedef struct ps_tier_stats {
    uint64_t tables;         /* attached */
    uint64_t rows_estimate;  /* RocksDB's estimate of rows over all attached tables */
    uint64_t sst_bytes;      /* live SST files */
    uint64_t free_bytes;     /* available on the file system (last reading) */
    uint64_t min_free_bytes; /* the watermark */
    uint64_t writes_refused; /* puts, deletes and checkpoints refused by the watermark, and
                              * puts and deletes in the second after a failed write */
    uint64_t rows_read, rows_written, rows_deleted;
    uint64_t errors; /* RocksDB calls that failed */
    bool writable;
} ps_tier_stats_t;

int ps_tier_stats(ps_tier_t *tier, ps_tier_stats_t *out);

/* Bytes of one stored record of table t (header + floats). */
size_t ps_tier_record_bytes(const ps_table_t *t);

#endif
