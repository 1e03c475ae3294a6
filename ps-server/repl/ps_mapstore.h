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
 * ps-server's replication (ps_repl.c) and psctl use these, through any ps_coord_store_t.
 *
 * Thread rule: none of its own (the store's).
 */
#ifndef PS_MAPSTORE_H
#define PS_MAPSTORE_H

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

/* The resharding target: 0, PC_ENOTFOUND (none asked), PC_EPARSE (logged) or the store's error. */
int ps_mapstore_get_target(const ps_coord_store_t *st, pc_cluster_map_t **out);

/* Replace the resharding target. */
int ps_mapstore_put_target(const ps_coord_store_t *st, const pc_cluster_map_t *target);

#endif
