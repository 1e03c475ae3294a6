/* ps_repl.h: replicas and failover of a ps-server (docs/server.md "Replicas and failover").
 *
 * With a cluster coordinator (etcd, or a ps-server's Coordinator service), the cluster map lives
 * there as consecutive versions, `cluster/map/<version>`, each written once with set-if-absent
 * as the one after the newest: the first writer of a version wins, so every change of roles is
 * decided by exactly one server and fenced by the version it wrote. Every server keeps
 * `cluster/alive/<addr>` under a lease.
 *
 * Each server runs two threads:
 * - The controller, every lease_ms / 4: renews its lease; adopts the newest map (ps_dp_set_map);
 *   publishes the configured map, with `replicas` backups per slot, when the coordinator has
 *   none; promotes itself (the map after pc_cmap_fail_server) when a primary it backs up lost
 *   its lease, or came back (restarted within its lease) with a table other than the one this
 *   server's copy holds rows of; drops a backup of its own slots that lost its lease (so
 *   pushes stop waiting for it); restarted with no role left, joins again as a backup
 *   (pc_cmap_add_backup) unless a resharding target leaves it out; moves the slots it is primary
 *   of towards the resharding target (`psctl reshard`, ps_mapstore.h): the target's servers
 *   become backups, then a handover (pushes held off until the new primary acknowledged every
 *   change) names the new primary, then the backups are set as the target says; and erases the
 *   rows of slots it has no role in after a map change.
 * - The follower: for every primary it backs up, every table, it copies the rows of the slots
 *   it backs up with their optimizer state (SCAN over what it holds, then erasing the keys the
 *   primary did not send: a copy never goes backwards), then follows the primary's change log
 *   with DELTAS that acknowledge what it has applied (PC_STREAM_ACK): the primary answers a
 *   push once its backups hold it (ps_dataplane.h).
 *
 * A restarted only holder: a server that starts with rows older than those its last run ended
 * with (its run record in the coordinator, ps_mapstore.h: it did not stop with exactly the
 * checkpoint it restored) and is confirmed as the primary of slots that no live backup in sync
 * held after its start (every backup was lost before) adds those slots to the map's unclean
 * count in the version that confirms it, so its clients learn that rows went back, as after an
 * unclean promotion. Not in a map without replicas (pc_cmap_unreplicated: workers roll the job
 * back there), nor from a checkpoint an operator named (--restore-id). It takes no push before
 * its record reads `running`; a clean stop records the checkpoint it wrote last
 * (ps_repl_record_end), and a count not yet written leaves `running` for the next start.
 *
 * Fencing: the data plane takes pushes only until the lease's local deadline (3/4 of lease_ms
 * after the renewal was sent: before the coordinator can expire it) and, once the lease lapsed
 * (and at start), not until this server wins a new map version in which it is still a primary:
 * a server that was stopped past its lease (and replaced) never writes under its old map.
 *
 * Thread rule: start and stop from one owner thread; render_metrics from any thread.
 */
#ifndef PS_REPL_H
#define PS_REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_cluster.h"
#include "ps_catalog.h"
#include "ps_coord.h"
#include "ps_dataplane.h"

typedef struct ps_repl ps_repl_t;

typedef struct ps_repl_opts {
    uint32_t self;       /* this server's index in the map */
    uint32_t replicas;   /* backups per slot in a map this server publishes first (0..2) */
    uint32_t lease_ms;   /* liveness lease in the coordinator (>= 200) */
    uint64_t restored;   /* the checkpoint this server started from (0: none) */
    bool restore_chosen; /* an operator named it (--restore-id): going back was asked for */
    /* The other servers' data plane, as ps-worker reaches it (all may be NULL; copied). */
    const char *token, *tls_ca, *tls_cert, *tls_key;
    int (*stopped)(void); /* may be NULL: once it answers nonzero, the start gives up */
} ps_repl_opts_t;

/* Start both threads. store, cat and dp are borrowed and must outlive ps_repl_stop; dp takes no
 * pushes from now until the lease is held (start it with ps_dp_opts_t.fenced). initial is the
 * configured map (copied). The first map is adopted before this returns (20 tries, each bounded
 * by the store's timeout, lease_ms / 4 apart): PC_EUNAVAIL when the coordinator gave none,
 * PC_ECANCELED when o->stopped answered nonzero meanwhile (a stop asked while the server starts).
 */
int ps_repl_start(const ps_coord_store_t *store, ps_catalog_t *cat, ps_dp_t *dp,
                  const pc_cluster_map_t *initial, const ps_repl_opts_t *o, ps_repl_t **out);

/* What the run record needs after the threads stopped (ps_repl_stop fills it). */
typedef struct ps_repl_end {
    ps_coord_store_t store; /* borrowed: the one given to ps_repl_start */
    bool recorded;          /* this run wrote `running` */
    bool pending;           /* rows went back and the map does not count them yet */
    bool took_pushes;       /* its lease was confirmed and the data plane took pushes */
    uint64_t restored;
    char addr[PC_ADDR_MAX], prev[64]; /* this server; the record found at start */
} ps_repl_end_t;

/* Stop the threads and free; end (may be NULL) gets what ps_repl_record_end needs. NULL r: no-op
 * (end zeroed). */
void ps_repl_stop(ps_repl_t *r, ps_repl_end_t *end);

/* Once the server takes no more pushes: record how its run ended. served: it ran, and ckpt is the
 * checkpoint written after its last push (0: none, its rows are lost); not served: its start
 * failed (the record goes back to what it was, unless its lease was confirmed already: then
 * `stopped`). A count still pending leaves `running`. */
void ps_repl_record_end(const ps_repl_end_t *end, bool served, uint64_t ckpt);

/* Append Prometheus lines (map version, promotions, drops, rejoins, lapses, copies, rows) at
 * len; returns the length needed. */
size_t ps_repl_render_metrics(ps_repl_t *r, char *buf, size_t cap, size_t len);

#endif
