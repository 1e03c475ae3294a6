/* pc_tls.h: TLS for the binary data plane over memory buffers (OpenSSL), shared by the server's
 * event loops and libpsclient's I/O thread.
 *
 * The event loop owns the socket; this module owns the TLS state and the session's ciphertext
 * buffers. The socket is read into the space pc_tls_inbuf gives (then pc_tls_received);
 * plaintext comes out with pc_tls_read; plaintext to send goes through pc_tls_seal into the
 * caller's buffer, ready for the socket. The handshake runs inside pc_tls_handshake (call it
 * after each read until it returns 0); its output, and anything else the session has to send,
 * comes out with pc_tls_take (after pc_tls_pending says how many bytes). Protocol: TLS 1.2 or newer
 * (1.3 preferred); suites AES-128-GCM first, then AES-256-GCM and ChaCha20-Poly1305, the server's
 * order deciding (TLS 1.2: ECDHE AEAD suites only); a client verifies the server's chain against
 * its CA file and checks the server's name (an IPv4/IPv6 address against the certificate's IP SANs,
 * otherwise a DNS name).
 *
 * Errors are negative PC_E* codes (pc_error.h); OpenSSL's own error queue is read and cleared
 * once, here, and turned into one line that pc_tls_error / the err buffers give:
 * "TLS: certificate verify failed: unable to get local issuer certificate".
 *
 * DESIGN
 * One SSL per connection, its I/O through a BIO whose ends are the session's input buffer and
 * the caller's output buffer: ciphertext is copied once on the way in (into OpenSSL's record
 * buffer) and written once on the way out (records straight into the caller's buffer). With
 * OpenSSL's memory BIOs each byte was copied once more each way and their buffers zeroed as
 * they grew: measured on 256 KiB replies, that cost more than the encryption. Now pc_tls_seal
 * costs 72 ns of CPU per 256 bytes, of which AES-128-GCM is 60 and the record layer 12 (OpenSSL
 * 3.0 copies the plaintext into its record buffer and encrypts there; only kTLS avoids that).
 * pc_tls_read is alike (decrypt in the record buffer, one copy out). OpenSSL's error
 * queue is per thread: every function here clears it before returning, so a session's errors
 * never leak into another's on the same thread.
 *
 * Thread rule: a context is created and destroyed by one owner and shared read-only by the
 * threads that make sessions from it (OpenSSL's SSL_CTX is safe for that). A session is used by
 * one thread only (its event loop's).
 */
#ifndef PC_TLS_H
#define PC_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct pc_tls_ctx pc_tls_ctx_t;
typedef struct pc_tls pc_tls_t;

/* Client certificates a server asks for: none; request (verified against ca when sent);
 * require (a connection without one is refused in the handshake). */
typedef enum {
    PC_TLS_AUTH_NONE = 0,
    PC_TLS_AUTH_REQUEST = 1,
    PC_TLS_AUTH_REQUIRE = 2
} pc_tls_auth_t;

typedef struct pc_tls_opts {
    bool server;      /* the accepting end */
    const char *cert; /* PEM certificate chain: a server's (required), a client's (optional) */
    const char *key;  /* PEM private key of cert */
    const char *ca;   /* PEM CA bundle: a client's trust (required); a server's for client certs */
    pc_tls_auth_t client_auth; /* server only; REQUEST and REQUIRE need ca */
} pc_tls_opts_t;

/* A context from PEM files (paths borrowed for the call). PC_EINVAL for missing or inconsistent
 * settings, PC_ENOTFOUND for a file that does not exist, PC_ETLS for a file OpenSSL refuses (a
 * bad certificate, a key that does not match); the reason, naming the file, in err[0..cap). */
int pc_tls_ctx_create(const pc_tls_opts_t *o, pc_tls_ctx_t **out, char *err, size_t cap);
/* NULL is a no-op. Every session made from ctx must be freed first. */
void pc_tls_ctx_destroy(pc_tls_ctx_t *ctx);

/* A session of ctx. peer (clients): the name or address the server's certificate must carry
 * (copied; NULL or "": no name check, the chain is still verified). PC_ENOMEM, PC_EINVAL. */
int pc_tls_new(pc_tls_ctx_t *ctx, const char *peer, pc_tls_t **out);
/* NULL is a no-op. */
void pc_tls_free(pc_tls_t *t);

/* Bytes read from the socket go straight into the session: the space for the next read in
 * *buf, *cap (at least half of PC_TLS_IN_BYTES while the reader keeps up: complete records are
 * consumed by pc_tls_read); then pc_tls_received(n) with the bytes read. PC_ENOMEM. */
#define PC_TLS_IN_BYTES (64u << 10)
int pc_tls_inbuf(pc_tls_t *t, void **buf, size_t *cap);
void pc_tls_received(pc_tls_t *t, size_t n);
/* Advance the handshake: 0 once it is complete (and at every later call), PC_EAGAIN while it
 * needs more input (send pc_tls_take's output first), PC_ETLS when it failed (pc_tls_error
 * says why; send the pending output too: it may carry the alert that tells the peer). */
int pc_tls_handshake(pc_tls_t *t);
bool pc_tls_established(const pc_tls_t *t);
/* Plaintext: up to cap bytes into buf. Returns the bytes read (> 0), 0 when no whole record is
 * buffered (feed more), PC_ECLOSED when the peer closed the TLS session, PC_ETLS on an error. */
ssize_t pc_tls_read(pc_tls_t *t, void *buf, size_t cap);
/* The most ciphertext pc_tls_seal makes of len bytes of plaintext (records and their overhead). */
size_t pc_tls_sealed_max(size_t len);
/* Encrypt len bytes (the handshake complete) into out[0..cap), after the ciphertext already
 * pending, record by record straight into out. *outlen: the bytes in out. With cap >=
 * pc_tls_pending() + pc_tls_sealed_max(len) it never runs out. In place: buf may be the last
 * len bytes of out[0..cap) when that much room is in front of it (the ciphertext, written from
 * out[0] on, never overtakes the plaintext still to be read); any other overlap is PC_EINVAL.
 * PC_ESTATE, PC_ETLS, PC_ETOOBIG (cap too small). */
int pc_tls_seal(pc_tls_t *t, const void *buf, size_t len, void *out, size_t cap, size_t *outlen);
/* Ciphertext waiting to be sent, and take up to cap bytes of it into buf (returns how many). */
size_t pc_tls_pending(const pc_tls_t *t);
size_t pc_tls_take(pc_tls_t *t, void *buf, size_t cap);
/* The last failure's one-line reason ("" when none); valid until the next call on t. */
const char *pc_tls_error(const pc_tls_t *t);
/* Whether buf[0..len) (len >= 1) can start a TLS handshake record (a ClientHello). */
bool pc_tls_looks_like_hello(const void *buf, size_t len);

#endif
