/* ps_mapstore.h: the cluster map's versions and the resharding target in the coordinator.
 *
 * Keys (docs/server.md "Replicas and failover", "Live resharding"):
 * - `cluster/map/<20-digit version>`: each map version, written once (set-if-absent) as the one
 *   after the newest: the first writer of a version decides that change. Versions are consecutive
 *   from the first one written, so the newest is found from any known version by reading the next
 *   ones until one is absent (never by listing them all).
 * - `cluster/map-newest`: a hint (the version last written), read first by a reader with no map.
 * - `cluster/target`: the layout an operator asked for (psctl reshard); the primaries move their
 *   slots there (ps_repl.h). Its version is not used.
 * - `cluster/run/<addr>`: how a server's last run ended, written by that server: `running` from
 *   its start, `stopped checkpoint=<id>` once it stopped with exactly the rows of checkpoint
 *   <id> (written last, no push taken after it; 0: empty tables, a first start that failed),
 *   `stopped` when its rows were in no checkpoint. A server starting again learns from it
 *   whether the rows it starts with are those its last run ended with. Records are never
 *   removed: a new cluster on the same coordinator and addresses inherits them.
 * ps-server's replication (ps_repl.c) and psctl use these, through any ps_coord_store_t.
 *
 * Thread rule: none of its own (the store's).
 */
#ifndef PS_MAPSTORE_H
#define PS_MAPSTORE_H

#include <stdbool.h>
#include <stdint.h>

#include "pc_cluster.h"
#include "ps_coord.h"

/* Map version v: 0, PC_ENOTFOUND, PC_EPARSE (logged), or the store's error. */
int ps_mapstore_get(const ps_coord_store_t *st, uint64_t v, pc_cluster_map_t **out);

/* The newest map version, from `from` (a version known to be there; 0: the hint, else `guess`)
 * on; *out NULL (and 0) when the store has none. */
int ps_mapstore_newest(const ps_coord_store_t *st, uint64_t from, uint64_t guess,
                       pc_cluster_map_t **out);

/* Write m under its version if nobody has: 0, PC_EEXIST (another writer won), or the store's
 * error. The hint follows a win. */
int ps_mapstore_put(const ps_coord_store_t *st, const pc_cluster_map_t *m);

/* The resharding target: 0, PC_ENOTFOUND (none asked), PC_EPARSE (logged) or the store's
 * error. *revision (may be NULL): its revision in the store (0: none), whatever it holds;
 * PS_MAPSTORE_UNVERSIONED when the coordinator is older than key revisions (a ps-server before
 * them answers none for a key it holds). */
#define PS_MAPSTORE_UNVERSIONED UINT64_MAX
int ps_mapstore_get_target(const ps_coord_store_t *st, pc_cluster_map_t **out, uint64_t *revision);

/* Replace the resharding target read at `revision` (ps_mapstore_get_target's; 0: none was
 * there): PC_EEXIST when another was written since (plan again from it: two operators'
 * resharding at once must not lose one), else 0 or the store's error. At
 * PS_MAPSTORE_UNVERSIONED it is written over whatever is there (the last writer wins). */
int ps_mapstore_put_target(const ps_coord_store_t *st, const pc_cluster_map_t *target,
                           uint64_t revision);

/* A server at `addr` starts from checkpoint `restored` (0: empty tables): *went_back is set when
 * a run of it is on record that did not stop with exactly those rows (a crash, a kill, a stop
 * without a checkpoint, another checkpoint restored); the record (`none` when there is none)
 * goes to last. 0 or the store's error. Then ps_mapstore_run_start. */
int ps_mapstore_run_read(const ps_coord_store_t *st, const char *addr, uint64_t restored,
                         bool *went_back, char *last, size_t cap);

/* The record of the server at `addr` reads `running`. */
int ps_mapstore_run_start(const ps_coord_store_t *st, const char *addr);

/* The server at `addr` stopped with the rows of checkpoint `ckpt` (at_ckpt), or with rows in no
 * checkpoint. */
int ps_mapstore_run_end(const ps_coord_store_t *st, const char *addr, bool at_ckpt, uint64_t ckpt);

/* Put back a record ps_mapstore_run_read found (`last`): a start that failed took no push. */
int ps_mapstore_run_restore(const ps_coord_store_t *st, const char *addr, const char *last);

/* Every server's run record: (*out)[i].key its address, .value its record (pc_kv_entries_free).
 * 0 or the store's error. */
int ps_mapstore_runs(const ps_coord_store_t *st, pc_kv_entry_t **out, size_t *n);

#endif
