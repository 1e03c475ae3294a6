/* ps_coord_remote.h: coordinator stores reached over the network, opened by address.
 *
 * ps_coord_store_remote is a ps-server's Coordinator service (ps-server --coordinator; gRPC
 * emberps.Coordinator KvSet / KvGet / KvList) seen as a ps_coord_store_t, so a worker, psctl and
 * tests use one interface whether the job's state is in a server (its memory, or etcd behind it)
 * or in etcd directly. ps_coord_store_open picks by address: "etcd://..." or "etcds://..." is an
 * etcd cluster (ps_coord_etcd.h), anything else "host:grpc_port" of a ps-server.
 *
 * Errors are the server's codes as psgrpc returns them: PC_ENOTFOUND (an absent key), PC_EEXIST
 * (if_absent lost), PC_EUNAVAIL (unreachable), PC_ETIMEDOUT, PC_ESTATE (a server that is not the
 * coordinator), PC_ETOOBIG / PC_EFULL (its limits).
 *
 * Thread rule: every function of the store is thread-safe (one gRPC channel).
 */
#ifndef PS_COORD_REMOTE_H
#define PS_COORD_REMOTE_H

#include "emberps/psgrpc.h"
#include "ps_coord.h"

/* A store on the Coordinator service at addr ("host:grpc_port"). sec (borrowed for the call; may
 * be NULL: plaintext, no token) gives the token and TLS files (its addr and max_message are not
 * used). timeout_ms bounds each call. No network I/O yet; errors of psg_create. */
int ps_coord_store_remote(const char *addr, const psg_opts_t *sec, int timeout_ms,
                          ps_coord_store_t *out);

/* ps_coord_store_etcd for an etcd URL, ps_coord_store_remote otherwise. */
int ps_coord_store_open(const char *addr, const psg_opts_t *sec, int timeout_ms,
                        ps_coord_store_t *out);

#endif
