/* pw_coord_client.h: a worker's client of the coordinator, as the key-value store that
 * collective groups rendezvous in: a ps-server's Coordinator service (ps-server --coordinator;
 * gRPC emberps.Coordinator) or an etcd cluster (ps_coord_etcd.h), the same calls for both.
 *
 * Thread rule: thread-safe (one gRPC channel).
 */
#ifndef PW_COORD_CLIENT_H
#define PW_COORD_CLIENT_H

#include "emberps/psgrpc.h"
#include "pc_kv.h"
#include "pw_coll.h"

#include <stdint.h>

typedef struct pw_coord pw_coord_t;

/* A client of the coordinator at addr: "host:grpc_port" of a ps-server, or
 * "etcd://host:port[,host:port...][/prefix]". sec (borrowed for the call; NULL: plaintext, no
 * token) gives the token and TLS files (psg_opts_t; its addr and max_message are not used; etcd
 * gets the TLS files, not the token). No network I/O yet; errors of psg_create, PC_EINVAL for a
 * bad etcd URL. */
int pw_coord_open(const char *addr, const psg_opts_t *sec, int timeout_ms, pw_coord_t **out);
void pw_coord_close(pw_coord_t *c);

/* KvSet / KvGet. get: 0 with a malloc'ed value, PC_ENOTFOUND, PC_EUNAVAIL (unreachable),
 * PC_ETIMEDOUT, or the code of a refusal as the coordinator sent it (psg_request; PC_ESTATE from
 * a server that is not the coordinator). */
int pw_coord_set(pw_coord_t *c, const char *key, const void *value, size_t len);
/* KvSet only when the key is absent: 0 (stored), PC_EEXIST (it was there; nothing changed), or
 * the errors of pw_coord_set. Racing writers: exactly one gets 0. */
int pw_coord_set_if_absent(pw_coord_t *c, const char *key, const void *value, size_t len);
int pw_coord_get(pw_coord_t *c, const char *key, void **value, size_t *len);
/* KvSet with a lease: the key expires lease_ms after this call unless set again. */
int pw_coord_set_lease(pw_coord_t *c, const char *key, const void *value, size_t len,
                       uint32_t lease_ms);
/* Both: only when the key is absent (an expired lease counts as absent), then with a lease.
 * 0, PC_EEXIST, or the errors of pw_coord_set. */
int pw_coord_set_lease_if_absent(pw_coord_t *c, const char *key, const void *value, size_t len,
                                 uint32_t lease_ms);

/* KvGet with the key's revision (KvList's: it changes with every set of the key; 0 from a
 * coordinator older than revisions). */
int pw_coord_get_rev(pw_coord_t *c, const char *key, void **value, size_t *len, uint64_t *revision);
/* Compare-and-set: only when the key's revision is `revision` (0: only when it is absent), with a
 * lease of lease_ms (0: none). 0, PC_EEXIST (it changed: nothing changed now), or the errors of
 * pw_coord_set. */
int pw_coord_set_if(pw_coord_t *c, const char *key, const void *value, size_t len,
                    uint64_t revision, uint32_t lease_ms);

/* KvList: the live keys under prefix, sorted, at most limit (0: the server's maximum, 4096).
 * *out (malloc'ed; free with pc_kv_entries_free; values NUL-terminated) has *n entries. Errors as
 * pw_coord_get, and PC_ETOOBIG when the list was cut (more keys, or more bytes of values, than
 * one list carries): a caller never takes a key left out for an absent one. */
int pw_coord_list(pw_coord_t *c, const char *prefix, uint32_t limit, pc_kv_entry_t **out,
                  size_t *n);

/* The store as pw_coll.h wants it; keys set through it expire lease_ms after they were set (0:
 * never; the lease of the coordinator's last pw_coord_kv call). */
pw_kv_t pw_coord_kv(pw_coord_t *c, uint32_t lease_ms);

#endif
