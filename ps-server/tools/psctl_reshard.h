/* psctl_reshard.h: `psctl [--coordinator=ADDR] reshard ...`: live resharding of a cluster whose
 * servers run with --cluster-coordinator (docs/server.md "Live resharding").
 *
 *   reshard add ADDR        list ADDR in the cluster map (a new version; it has no role yet)
 *                           and ask for a layout in which it is primary of about 1 / (k + 1) of
 *                           the slots of each of the k servers with slots; prints the map to
 *                           start ADDR's ps-server with (--cluster-map)
 *   reshard remove ADDR     ask for a layout in which ADDR has no role (its slots to their
 *                           first backup, its backup places to other servers)
 *   reshard status          how many slots still differ from the layout asked for
 *   reshard wait [SECONDS]  wait (default 120 s) until none does: exit 0, else 1
 *
 * DESIGN: psctl only writes: a new map version for an added server (set-if-absent as the next
 * version, like any map change) and the target (`cluster/target`, ps_mapstore.h). The primaries
 * move their slots there themselves, step by step (ps_repl.h), so a resharding survives psctl
 * ending and any server restarting. ADDR is a server's data-plane address as the map lists it.
 */
#ifndef PSCTL_RESHARD_H
#define PSCTL_RESHARD_H

#include <stdbool.h>

#include "emberps/psgrpc.h"

typedef struct psctl_reshard_opts {
    const char *coordinator; /* a ps-server's gRPC address or etcd://... */
    const psg_opts_t *sec;   /* TLS and token for a ps-server coordinator */
    int timeout_ms;
    bool json;
} psctl_reshard_opts_t;

/* Run `reshard ARGS...`; returns psctl's exit status (2: usage). */
int psctl_reshard(const psctl_reshard_opts_t *o, int nargs, char **args);

#endif
