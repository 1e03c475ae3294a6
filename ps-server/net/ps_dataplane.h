/* ps_dataplane.h: the server side of the binary data plane (pc_wire.h, docs/wire.md).
 *
 * `threads` libuv event loops, each on its own thread, watching one listening socket (the first
 * loop to accept a connection takes it; no SO_REUSEPORT, so a port another server holds is an
 * error at start, not a port shared with it). A connection's frames are executed on its
 * loop as they complete (table calls are thread-safe and short) and answered with one
 * scatter/gather write per response. Requests for keys of slots this server does not own are
 * refused with PC_EWRONGSLOT and the current map; with a token configured, a connection must
 * say HELLO with it before anything else (else PC_EAUTH and the connection is closed). With a
 * certificate configured, connections speak TLS (pc_tls.h) and plaintext ones are refused.
 * Malformed batch bodies get an error and the connection goes on; a frame that breaks the
 * framing (bad magic, version, op) closes the connection after the error is sent; nothing is
 * allocated for a length before it is checked. A PULL or LOOKUP whose reply would exceed
 * lim.max_reply is refused with PC_ETOOBIG (a message naming the sizes) before any work.
 * Unsent replies are bounded per connection and per server (reply_queue, reply_queue_total):
 * over them, connections are not read until their replies drain.
 *
 * Thread rule: start/stop from one owner thread; set_map, set_write_until, stats and repl_lag
 * from any thread.
 */
#ifndef PS_DATAPLANE_H
#define PS_DATAPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_cluster.h"
#include "pc_wire.h"
#include "ps_catalog.h"

typedef struct ps_dp ps_dp_t;

typedef struct ps_dp_opts {
    const char *host;  /* bind address */
    int port;          /* 0: an ephemeral port (see ps_dp_port) */
    int threads;       /* event loops, >= 1 */
    const char *token; /* NULL or "": no authentication */
    /* TLS (pc_tls.h; paths borrowed for ps_dp_start): with tls_cert and tls_key set, every
     * connection must open with a TLS handshake (TLS 1.2+); a plaintext client is answered with
     * PC_ETLS, unencrypted, and closed. tls_client_auth: pc_tls_auth_t (none, request, require;
     * the last two verify client certificates against tls_ca). */
    const char *tls_cert, *tls_key, *tls_ca;
    int tls_client_auth;
    pc_wire_limits_t lim; /* body, batch and reply limits */
    uint32_t self;        /* this server's index in the cluster map */
    /* Unsent reply bytes: a connection stops being read (and executing the frames it has read)
     * while it has reply_queue bytes unsent (push replies waiting for the backups counted with
     * all they hold), until half of that is left; the server stops
     * reading connections that have replies queued while the total is at reply_queue_total,
     * and all of them at 9/8 of it. 0: no cap. */
    uint64_t reply_queue, reply_queue_total;
    /* Replication (docs/server.md "Replicas and failover"): a push waits at most this long for
     * its backups (then PC_ETIMEDOUT: applied here, not confirmed there). 0: 10000. */
    uint64_t ack_timeout_ms;
    /* Start refusing pushes (ps_dp_set_write_until 0): a server whose lease is still to be
     * taken (ps_repl.h) must take none under the map it starts with. */
    bool fenced;
    /* Busy polling (docs/wire.md "Latency: busy polling"): an event loop that handled input polls
     * its sockets without sleeping for this long after it, so a request arriving within that time
     * is read with no wake-up of a sleeping thread or of an idle CPU. 0: sleep in epoll at once. */
    uint32_t poll_us;
    /* A client connection whose peer acknowledges nothing for this long is ended by the kernel
     * (pc_wire_watch_peer: keepalive and TCP_USER_TIMEOUT), with what it held (a part-read
     * request's body, queued replies). 0: 60000. */
    uint32_t dead_peer_ms;
    /* With a token or TLS: a connection that has not finished its TLS handshake and said HELLO
     * with the token within this long is closed (a peer that connects and sends nothing, or a
     * part of a ClientHello, held its buffers, 128 KiB, for ever). 0: 10000. */
    uint32_t hello_ms;
    /* A connection that sent part of a request frame (its header, part of its body) and then
     * nothing for this long is closed, with what the frame held (an admitted peer stopped
     * mid-body held up to max_body for ever: the kernel's keepalives still answered). Idle
     * connections between frames, and ones the server paused, are not timed. 0: 30000. */
    uint32_t frame_ms;
    /* Request bodies too large for a connection's staging buffer (64 KiB) get a buffer of their
     * own; all connections together hold at most body_total bytes of them (one body is always
     * let through, so body_total below lim.max_body still takes the largest): a connection whose
     * next body would pass it is not read until bodies are freed. Such a body must also arrive
     * within frame_ms plus 1 ms per KiB of it from its header on (a sender that trickles a byte
     * now and then held its buffer for ever). 0: no cap. */
    uint64_t body_total;
} ps_dp_opts_t;

/* Bind and start serving `cat` (borrowed) with a copy of `map`. PC_EIO when the address cannot
 * be bound. */
int ps_dp_start(ps_catalog_t *cat, const pc_cluster_map_t *map, const ps_dp_opts_t *o,
                ps_dp_t **out);

int ps_dp_port(const ps_dp_t *dp);

/* Replace the cluster map (copied); requests check ownership against it from now on. */
int ps_dp_set_map(ps_dp_t *dp, const pc_cluster_map_t *map);

/* The same, after `prev` (the map this server followed before, NULL: none): a backup of this
 * server's slots that prev did not name joins a running primary, and holds no push back until it
 * has copied the tables and acknowledged (a backup named from the start holds every push back
 * from the first). */
int ps_dp_set_map_from(ps_dp_t *dp, const pc_cluster_map_t *map, const pc_cluster_map_t *prev);

/* The current map as text (malloc'ed, caller frees) and its version; NULL on ENOMEM. */
char *ps_dp_map_text(ps_dp_t *dp, uint64_t *version);

/* Whether every key belongs to a slot this server owns under the current map. */
bool ps_dp_owns(ps_dp_t *dp, const uint64_t *keys, size_t n);

typedef struct ps_dp_stats {
    uint64_t connections; /* open now */
    uint64_t requests;    /* frames answered */
    uint64_t errors;      /* answered with an error status */
    uint64_t rows_pulled, rows_pushed, rows_looked_up;
    uint64_t bytes_in, bytes_out;
    uint64_t reply_queue_bytes;      /* replies built and not yet written, now (all loops) */
    uint64_t reply_queue_peak_bytes; /* the most reply_queue_bytes has been since start */
    uint64_t paused_connections;     /* not read now: reply_queue(_total) or body_total */
    uint64_t body_bytes;             /* large request bodies held now (body_total) */
    uint64_t body_waits;             /* times a connection waited for body_total, since start */
    uint64_t reply_pool_bytes;       /* idle reply allocations kept for reuse (all loops) */
    uint64_t repl_waiting;           /* push replies waiting for the backups, now */
    uint64_t repl_waited;            /* pushes that waited for them, since start */
    uint64_t repl_timeouts;          /* answered PC_ETIMEDOUT: no backup confirmed in time */
} ps_dp_stats_t;

void ps_dp_stats(ps_dp_t *dp, ps_dp_stats_t *out);

/* Pushes (PC_OP_PUSH) are refused with PC_EUNAVAIL from CLOCK_MONOTONIC time until_ns on (the
 * local end of this server's lease in the coordinator: it cannot prove it is still the primary
 * after it). UINT64_MAX (the default): never. Any thread. */
void ps_dp_set_write_until(ps_dp_t *dp, uint64_t until_ns);

/* One backup's progress on one table: its acknowledged position and the table's head. */
typedef struct ps_dp_lag {
    char table[PS_TABLE_NAME_MAX + 1];
    uint64_t uid;
    uint32_t server; /* the backup's index in the map */
    uint64_t acked, head;
} ps_dp_lag_t;

/* The backups' progress (backups of this server under the current map) into out[0..cap);
 * returns how many there are. Any thread. */
size_t ps_dp_repl_lag(ps_dp_t *dp, ps_dp_lag_t *out, size_t cap);

/* Whether backup `server` (a map index) follows every replicated table of this server (it has
 * acknowledged since its copy) and is at most `slack` change-log entries behind each head now;
 * when not, behind (cap bytes, may be NULL) gets the first table it is behind on. Any thread. */
bool ps_dp_backup_synced(ps_dp_t *dp, uint32_t server, uint64_t slack, char *behind, size_t cap);

/* The newest map version a request refused for its keys (PC_EWRONGSLOT) was sent under, when
 * newer than this server's map (a client that learnt a handover or a promotion first); 0 before
 * any. Replication asks the coordinator for the map at once. Any thread. */
uint64_t ps_dp_newer_map(ps_dp_t *dp);

/* A push from outside the data plane (the gRPC API) into t: under the data plane's fence
 * (PC_EUNAVAIL while the lease lapsed or a handover runs; counted for ps_dp_pushes_idle, then
 * its keys' slots checked: PC_EWRONGSLOT), and refused (PC_EUNSUPPORTED) while this server's
 * slots have backups: only the data plane answers a push once they hold it. Else
 * ps_table_push's result. why gets one line on failure. Any thread. */
int ps_dp_push(ps_dp_t *dp, ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
               size_t nf, ps_push_result_t *res, char *why, size_t cap);

/* Whether no push is between ps_dp_set_write_until's check and its change-log entry: after
 * ps_dp_set_write_until(dp, 0), once this is true the change logs' heads hold every push this
 * server will apply. Any thread. */
bool ps_dp_pushes_idle(ps_dp_t *dp);

/* Append the data plane's metrics in Prometheus text form (counters, connections, per-op
 * request latency histograms) to buf at len, up to cap; returns the length needed. */
size_t ps_dp_render_metrics(ps_dp_t *dp, char *buf, size_t cap, size_t len);

/* Stop accepting, answer every frame already received, flush replies, close connections and
 * join the threads; frees dp. NULL is a no-op. */
void ps_dp_stop(ps_dp_t *dp);

#endif
