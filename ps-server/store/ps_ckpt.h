/* ps_ckpt.h: checkpoints, restore and export/import of a catalog's tables.
 *
 * A checkpoint is a directory DIR/ckpt-<20-digit id>/ holding one row file per table
 * (t-<name>.rows, see ps_rowfile.h) and MANIFEST.json (format version, id, parent, kind, and per
 * table: config, cut clock, update version, row and tombstone counts, file size and XXH3, the
 * table's uid and the position of its delta stream at the cut: ps_ckpt_tables). It is
 * built as ckpt-<id>.tmp/, every file fsynced, the manifest written last, then published by
 * renaming the directory and fsyncing DIR. A directory that is not published (crash, full disk)
 * is never chosen by restore and is removed by the next checkpoint; nor is one a rollback
 * abandoned (ckpt-<id>.abandoned, ps_ckpt_rollback).
 *
 * Consistency: each table is captured by a snapshot (ps_table_snapshot_begin): every row at one
 * cut between whole push calls, also while pushes continue. All tables are cut before any is
 * written (one after another, a few microseconds apart).
 *
 * Cold tables (ps_tier.h): their cold tables are frozen (no spills, no erases) while the cuts
 * are placed and the tier's RocksDB checkpoint is taken into cold/ (SST files hard-linked,
 * memtables flushed first), then thawed; their RAM rows are written from the snapshots like any
 * table's, always in full. The manifest lists cold/'s files with their sizes. Restoring such a
 * checkpoint replaces the tier's database by a copy of cold/ and loads the RAM rows on top (RAM
 * is the newer copy of a row held in both), so it needs a tier with no table attached: restore
 * at start, into an empty catalog.
 *
 * Incremental checkpoints hold only rows changed since the parent's cut, plus tombstones of rows
 * removed meanwhile; restore applies base + increments in order. With full_every = N, every Nth
 * checkpoint is full (folding the chain); retention keeps the newest `keep` checkpoints and
 * every checkpoint they depend on.
 *
 * Thread rule: a ps_ckpt_t is single-owner (one checkpoint or restore at a time); the catalog
 * and its tables stay usable by other threads throughout.
 */
#ifndef PS_CKPT_H
#define PS_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_catalog.h"
#include "ps_tier.h"

typedef struct ps_ckpt ps_ckpt_t;

typedef struct ps_ckpt_opts {
    const char *dir;     /* created if missing; borrowed for the checkpointer's lifetime */
    uint32_t keep;       /* restore points to keep, >= 1 */
    uint32_t full_every; /* 1: every checkpoint full; N: one full, then N - 1 incrementals */
    ps_tier_t *tier;     /* the catalog's cold tier (borrowed), NULL when it has none */
    bool read_only;      /* restore only (a serving replica reading a training server's
                          * directory): nothing in dir is created, removed or written, and
                          * ps_ckpt_write answers PC_ESTATE */
} ps_ckpt_opts_t;

typedef struct ps_ckpt_result {
    uint64_t id, parent; /* parent 0 for a full checkpoint */
    bool incremental;
    uint64_t rows, tombstones, bytes;
    double seconds;
} ps_ckpt_result_t;

/* A checkpointer for `cat` (borrowed) writing into o->dir (created if missing). Removes
 * unpublished leftovers, unless o->read_only (then dir need not exist yet). */
int ps_ckpt_create(ps_catalog_t *cat, const ps_ckpt_opts_t *o, ps_ckpt_t **out);
void ps_ckpt_destroy(ps_ckpt_t *c);

/* Write a checkpoint of every table (incremental when the chain allows). PC_ENOSPC / PC_EIO on
 * disk errors: nothing is published, the previous checkpoints are untouched. PC_ESTATE: a
 * read-only checkpointer. */
int ps_ckpt_write(ps_ckpt_t *c, ps_ckpt_result_t *res);

/* Restore checkpoint `id` (0: the newest one that verifies, falling back to older ones) into
 * the catalog, replacing tables of the same names. All files are verified (checksums, sizes)
 * before any table is replaced. *restored (may be NULL) gets the id. PC_ENOTFOUND when there is
 * nothing to restore, PC_ECORRUPT when `id` does not verify, or (id 0) when published
 * checkpoints exist and none verifies: a caller must not take that for an empty directory and
 * start empty tables, whose checkpoints would then retire the damaged ones. */
int ps_ckpt_restore(ps_ckpt_t *c, uint64_t id, uint64_t *restored);

/* Restore checkpoint `id` as the point the run goes on from (a job rollback, a server started
 * from a named checkpoint): ps_ckpt_restore, then every published checkpoint newer than `id` is
 * abandoned (renamed ckpt-<id>.abandoned: never restored, its id never given again; removed by
 * the next published checkpoint, so until then an operator can rename it back), so that a
 * restart restoring the newest takes `id`, not the abandoned run's rows. id 0: the newest,
 * nothing abandoned. PC_ESTATE for a read-only checkpointer. PC_EIO after the restore when a
 * newer checkpoint could not be abandoned durably (listed, renamed, the directory fsynced): the
 * tables are `id`'s, but a restart restoring the newest could take the abandoned run's; call it
 * again (a job's rollback fails, a server's start exits 1, and the next try abandons them). */
int ps_ckpt_rollback(ps_ckpt_t *c, uint64_t id, uint64_t *restored);

typedef struct ps_ckpt_entry {
    uint64_t id, parent;
    bool incremental;
    uint64_t rows, tombstones, bytes, created_unix_ns;
    uint32_t tables;
} ps_ckpt_entry_t;

/* Published checkpoints of `dir`, oldest first: up to cap entries, *n gets how many exist. */
int ps_ckpt_list(const char *dir, ps_ckpt_entry_t *out, size_t cap, size_t *n);

/* One table of a checkpoint's manifest: what a follower needs to continue the delta stream
 * (docs/wire.md "The delta stream") from the checkpoint instead of a scan. A serving replica
 * restores a training server's checkpoint into its own catalog, then reads DELTAS of that server
 * from log_position with uid: while the server's table is still the one checkpointed (same
 * uid, the log still holds the position) every change after the cut comes by the stream; else
 * PC_ESTATE / PC_ERANGE, and it scans. */
typedef struct ps_ckpt_table_info {
    char name[PS_TABLE_NAME_MAX];
    uint64_t uid;          /* the checkpointed table's ps_table_uid (0: an older manifest) */
    uint64_t log_position; /* its change-log head before the cut; UINT64_MAX: it kept no log */
    uint64_t rows, version;
    char config[2048]; /* its settings (ps_table_config_format) */
} ps_ckpt_table_info_t;

/* The tables of published checkpoint `id` of dir (0: the newest whose manifest reads and whose
 * row files are there with their sizes; restore checks more, so to match a restore pass the id
 * ps_ckpt_restore restored), from its manifest (for an incremental checkpoint: its own
 * entries); up to cap into out, *n how many there are. PC_ENOTFOUND, PC_ECORRUPT (`id` does not
 * read), PC_EINVAL, PC_ENOMEM, PC_EIO. Reads only. */
int ps_ckpt_tables(const char *dir, uint64_t id, ps_ckpt_table_info_t *out, size_t cap, size_t *n);

/* Write table `t` to a portable row file (optimizer state included when with_state), via a
 * temporary name and rename. A cold table needs its tier: its rows are those in RAM at the cut
 * plus the cold ones not in RAM, read from a RocksDB snapshot taken at the cut. A table has one
 * snapshot at a time: while a checkpoint is writing it, export answers PC_EAGAIN (and a checkpoint
 * meeting an export fails with PC_EAGAIN too); retry. */
int ps_table_export(ps_table_t *t, ps_tier_t *tier, const char *path, bool with_state);

/* Create a table from an exported file in `cat`, named `name` (NULL: the exported name).
 * PC_EEXIST if the name is taken, PC_ECORRUPT for a bad file. */
int ps_table_import(ps_catalog_t *cat, const char *path, const char *name);

#endif
