/* sv_sparse.h: a serving replica's embedding rows, laid out as the training cluster holds them.
 *
 * The replica keeps the cluster map of the training servers (pc_cluster.h) and one catalog
 * (ps_catalog.h) per training server, holding that server's rows of every followed table. A
 * lookup routes each key by its slot to the owning server's catalog, as libpsclient routes it to
 * the server, and answers what that server's Lookup answers: the row and found = 1 for a key the
 * replica holds; for a missing key the table's initial row or zeros (its `missing` setting),
 * found = 0. Tables take the training servers' settings with the replica's own eviction, TTL and
 * admission switched off: rows change only through sv_follow (sv_follow.h), which mirrors the
 * servers' evictions as erasures. Cold tables (cold=true) are refused: their rows are not in RAM
 * and cannot be streamed.
 *
 * Thread rule: thread-safe. Lookups, sv_sparse_rows and sv_sparse_checksum may run on any
 * number of threads while the follower writes (each table has its own shard locks; a table being
 * replaced stays valid for the lookups that acquired it). Tables are added before a follower
 * starts (sv_sparse_add_table*), and sv_sparse_destroy needs every other call finished.
 *
 * Ownership: the replica owns its catalogs and tables. sv_sparse_catalog returns a borrowed
 * catalog, valid until sv_sparse_destroy. Caller buffers are borrowed for the call only.
 */
#ifndef SV_SPARSE_H
#define SV_SPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_cluster.h"
#include "ps_catalog.h"
#include "ps_table.h"

typedef struct sv_sparse sv_sparse_t;

/* A replica of the cluster described by `map_text` (pc_cluster.h's text form, e.g. libpsclient's
 * psc_map_text; copied), with no tables yet. PC_EPARSE for a bad map (err, may be NULL, gets one
 * line), PC_ENOMEM. */
int sv_sparse_create(const char *map_text, sv_sparse_t **out, char *err, size_t errlen);
/* Destroys every table. NULL is a no-op. */
void sv_sparse_destroy(sv_sparse_t *s);

/* The replica's form of a training table's settings: `in` with capacity_rows, ttl_ticks,
 * admit_threshold and admit_decay_ticks off. PC_EUNSUPPORTED for a cold table, PC_EINVAL for a
 * bad config; err (may be NULL) gets one line naming the table. */
int sv_sparse_replica_config(const ps_table_config_t *in, ps_table_config_t *out, char *err,
                             size_t errlen);

/* Add table cfg (its replica form) to every server's catalog, empty. PC_EEXIST, PC_EUNSUPPORTED
 * (cold), PC_EINVAL, PC_ENOMEM; err gets one line. On failure no catalog holds it. */
int sv_sparse_add_table(sv_sparse_t *s, const ps_table_config_t *cfg, char *err, size_t errlen);
/* The same, but a cold table (which a replica cannot hold) is skipped with a warning: 0. For
 * "every table" of the servers or of a checkpoint. */
int sv_sparse_add_unless_cold(sv_sparse_t *s, const ps_table_config_t *cfg, char *err,
                              size_t errlen);

/* Call fn(ctx, cfg) for each table of a settings text as psc_tables gives it (one
 * "name=...,dim=..." line per table), in order; stops at fn's first non-zero return and returns
 * it. PC_EINVAL (a line over 4 KiB), ps_catalog_spec_parse's errors; err gets one line. */
int sv_sparse_specs_each(const char *settings, int (*fn)(void *ctx, const ps_table_config_t *cfg),
                         void *ctx, char *err, size_t errlen);

/* Add tables from a settings text as psc_tables gives it (one "name=...,dim=..." line per
 * table): those named in `names` (comma-separated, e.g. "emb,ads"), or every table when `names`
 * is NULL or "" but the cold ones (a replica cannot hold them: skipped with a warning; named,
 * one is an error). PC_ENOTFOUND when a named table is not in the text; the errors of
 * sv_sparse_add_table (the tables added before the failure stay). */
int sv_sparse_add_tables(sv_sparse_t *s, const char *settings, const char *names, char *err,
                         size_t errlen);

/* The map's servers (catalogs), its text form (snprintf-like), and the map itself (borrowed,
 * immutable, valid until destroy). */
size_t sv_sparse_servers(const sv_sparse_t *s);
size_t sv_sparse_map_text(const sv_sparse_t *s, char *buf, size_t cap);
const pc_cluster_map_t *sv_sparse_map(const sv_sparse_t *s);
/* Address of server i ("host:port"; valid until destroy), NULL when out of range. */
const char *sv_sparse_server_addr(const sv_sparse_t *s, uint32_t server);
/* Catalog of server i (borrowed, valid until destroy), NULL when out of range. */
ps_catalog_t *sv_sparse_catalog(sv_sparse_t *s, uint32_t server);

/* Names of the tables (sorted) into names[0..cap); returns how many there are. */
size_t sv_sparse_tables(sv_sparse_t *s, char (*names)[PS_TABLE_NAME_MAX], size_t cap);
/* The replica config of table `name` copied to *cfg. PC_ENOTFOUND. */
int sv_sparse_table_config(sv_sparse_t *s, const char *name, ps_table_config_t *cfg);

/* Rows of keys[0..n) of `table`, routed by slot to their servers' catalogs: rows gets n x dim
 * floats (rows_len must be n * dim: PC_EDIM otherwise), found (may be NULL) n flags, as
 * ps_table_lookup answers them. PC_ENOTFOUND (no such table), PC_EINVAL, PC_ENOMEM. */
int sv_sparse_lookup(sv_sparse_t *s, const char *table, const uint64_t *keys, size_t n, float *rows,
                     size_t rows_len, uint8_t *found);

/* Rows held over every table and server. */
uint64_t sv_sparse_rows(sv_sparse_t *s);

/* An order-independent checksum of every row `table` holds, over all servers: the sum (mod
 * 2^64) of sv_sparse_row_hash of each row, and the number of rows. Compare it with the same
 * sum computed over the training servers' rows (psc_scan of every part of every server).
 * PC_ENOTFOUND. A consistent answer needs the follower caught up and the servers idle. */
int sv_sparse_checksum(sv_sparse_t *s, const char *table, uint64_t *sum, uint64_t *rows);
/* The hash of one row (its key and its dim weights' bytes) that sv_sparse_checksum sums. */
uint64_t sv_sparse_row_hash(uint64_t key, const float *row, uint32_t dim);

/* ---- for the follower (sv_follow.c) ---- */

/* An empty table of `name`'s replica config, not in any catalog (a rescan's staging table): the
 * caller owns it until sv_sparse_swap_in takes it (or ps_table_destroy). PC_ENOTFOUND. */
int sv_sparse_staging_create(sv_sparse_t *s, const char *name, ps_table_t **out);
/* Put `t` (taken, also on failure) in place of its name's table in server `server`'s catalog
 * in one step (ps_catalog_replace): lookups see the old rows or the new, never a mix. */
int sv_sparse_swap_in(sv_sparse_t *s, uint32_t server, ps_table_t *t);

/* Copy the rows (weights; fresh optimizer state) of `table` in src's catalog of server `server`
 * into dst's (a new layout taking over the rows of a server whose slots did not move; dst not
 * yet followed). Consistent with any position of src's follower from before the call on: rows
 * only move forward while it runs. *rows (may be NULL): dst's rows then. PC_ENOTFOUND, PC_EDIM,
 * PC_EINVAL, PC_ENOMEM. */
int sv_sparse_copy_server(sv_sparse_t *dst, sv_sparse_t *src, uint32_t server, const char *table,
                          uint64_t *rows);

/* Copy every row (weights) of `table` in src, whichever server's catalog holds it, into dst's
 * catalog of its slot's primary in dst's map, replacing dst's rows of the table (a server's at a
 * time, each in one step): a table no training server has any more keeps its last rows in a new
 * layout. *rows (may be NULL): the rows copied. PC_ENOTFOUND, PC_EDIM, PC_EINVAL, PC_ENOMEM. */
int sv_sparse_carry_table(sv_sparse_t *dst, sv_sparse_t *src, const char *table, uint64_t *rows);

/* Where a table's rows of one server came from: the training table's uid and the position of
 * its change log they reflect (what sv_follow starts from). */
typedef struct sv_sparse_start {
    uint32_t server;
    char table[PS_TABLE_NAME_MAX];
    uint64_t uid;
    uint64_t position; /* UINT64_MAX: not known (follow by a scan) */
} sv_sparse_start_t;

/* Load a version's rows from the training servers' checkpoints: for each server i of the map
 * (n must be sv_sparse_servers), checkpoint ids[i] (0: the newest that verifies) of directory
 * dirs[i] (a ps-server --ckpt-dir, opened read-only: nothing there is created, removed or
 * written) is restored aside, and every table the replica holds is replaced by the rows of the
 * checkpoint's table of that name (weights; the replica keeps no optimizer state) whose slots
 * server i is primary of in the replica's map (a replicated server's backup rows are left out:
 * its stream does not carry them). Nothing is
 * replaced unless every server's checkpoint restored and holds every table with the same dim;
 * then each (server, table) is swapped in whole. *starts (starts may be NULL: not wanted) gets
 * an array (the caller frees it) of per (server, table) the checkpointed table's uid and
 * change-log position (UINT64_MAX when it kept no log): what sv_follow_create takes to continue
 * from the checkpoint instead of a scan; *nstarts how many there are (servers x tables);
 * restored (may be NULL, n entries) the ids restored. Blocking (reads every row file); not while a
 * follower runs. Errors: PC_EINVAL, PC_ENOTFOUND (no checkpoint, or a table missing from one),
 * PC_EDIM, PC_ECORRUPT, PC_EIO, PC_ENOMEM; err gets one line naming the directory. */
int sv_sparse_load_checkpoints(sv_sparse_t *s, const char *const *dirs, const uint64_t *ids,
                               size_t n, uint64_t *restored, sv_sparse_start_t **starts,
                               size_t *nstarts, char *err, size_t errlen);

#endif
