/* ps_coord_etcd.h: the coordinator store (ps_coord.h's interface) kept in an etcd cluster.
 *
 * A job coordinated through etcd has no coordinator process of its own to lose: workers (and a
 * ps-server's Coordinator service, --coordinator-store) keep the rendezvous keys, membership
 * leases and reader positions in etcd, which stays available while a majority of its members
 * does. docs/training.md ("The coordinator on etcd") has the operator's side.
 *
 * URL: "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]": etcd's client endpoints (every member, or
 * some) and the key prefix EmberPS's keys live under (default "/emberps/"; a job's keys are
 * PREFIX + the key). Hosts are resolved to IPv4 addresses once, at open. "etcds://..." is the
 * same over TLS (etcd's https client URLs).
 *
 * Semantics as the memory store's, with etcd's granularity: a key set with lease_ms > 0 expires
 * ceil(lease_ms / 1000) seconds after its last set, at least etcd's minimum TTL (about 2 s with
 * etcd's default election timeout); if_absent is atomic across every client of the cluster.
 * Errors: PC_EUNAVAIL when no member answered until the timeout (calls are retried meanwhile:
 * an etcd member dying or a leader election costs a pause, not an error), PC_ETIMEDOUT,
 * PC_ETOOBIG (key or value over ps_coord.h's limits), and PC_EINVAL for a bad URL at open.
 *
 * Thread rule: every function of the store is thread-safe (one gRPC channel).
 */
#ifndef PS_COORD_ETCD_H
#define PS_COORD_ETCD_H

#include <stdbool.h>

#include "emberps/psgrpc.h"
#include "ps_coord.h"

#define PS_COORD_ETCD_SCHEME  "etcd://"
#define PS_COORD_ETCDS_SCHEME "etcds://"

/* Whether url names an etcd cluster (starts with "etcd://" or "etcds://"). */
bool ps_coord_is_etcd(const char *url);

/* A store on the etcd cluster of url. sec (borrowed for the call; may be NULL): with etcds://,
 * the TLS files of the channel (tls_ca, tls_cert, tls_key; the name checked is the URL's first
 * host); EmberPS's token is never sent to etcd. timeout_ms bounds each operation, retries included.
 * No network I/O happens yet: a cluster that is down shows at the first operation. */
int ps_coord_store_etcd(const char *url, const psg_opts_t *sec, int timeout_ms,
                        ps_coord_store_t *out);

#endif
