/* pc_tls.c: TLS over memory buffers (see pc_tls.h), on OpenSSL.
 *
 * DESIGN
 * OpenSSL is reached only from this file: its status (SSL_get_error, the thread's error queue,
 * the X509 verify result) is translated here into a PC_E* code and one line of text, once per
 * failure, and the queue is cleared before every return. A session is an SSL with one BIO of
 * this file's own method (made once per context) whose two ends are the session's buffers: it
 * reads ciphertext from `in` (the socket is read straight into it: pc_tls_inbuf) and writes
 * records to `sink` (the caller's buffer, during pc_tls_seal) or else to `out` (handshake,
 * alerts, taken with pc_tls_take). OpenSSL's memory BIO would copy every byte once more each
 * way and zero its buffer as it grows.
 */
#include "pc_tls.h"

#include "pc_alloc.h"
#include "pc_error.h"

#include <arpa/inet.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct pc_tls_ctx {
    SSL_CTX *ctx;
    BIO_METHOD *bio; /* the sessions' BIO (see DESIGN) */
};

struct pc_tls {
    SSL *ssl;
    bool established;
    uint8_t *in;                   /* ciphertext received: in[in_off .. in_off + in_len) unread */
    size_t in_cap, in_off, in_len; /* in_cap: PC_TLS_IN_BYTES once allocated */
    uint8_t *out;                  /* ciphertext to send outside pc_tls_seal (handshake, alerts) */
    size_t out_cap, out_len;
    uint8_t *sink; /* pc_tls_seal: records go straight to sink[sink_len .. sink_cap) */
    size_t sink_cap, sink_len;
    char err[256];
};

/* ==== errors =============================================================================== */

/* "TLS: <OpenSSL's reason>[: <the certificate check's reason>]" into buf from the thread's error
 * queue (the earliest error is the cause), or "TLS: <what>" when the queue is empty; clears the
 * queue. ssl may be NULL. */
static void err_text(SSL *ssl, const char *what, char *buf, size_t cap) {
    const unsigned long e = ERR_get_error();
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    char code[128];
    if (e && !reason) {
        ERR_error_string_n(e, code, sizeof code);
        reason = code;
    }
    int n = snprintf(buf, cap, "TLS: %s", reason ? reason : what);
    if (ssl && e && ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED && n > 0 &&
        (size_t)n < cap) {
        const long v = SSL_get_verify_result(ssl);
        if (v != X509_V_OK)
            snprintf(buf + n, cap - (size_t)n, ": %s", X509_verify_cert_error_string(v));
    }
    ERR_clear_error();
}

/* ==== the sessions' BIO =================================================================== */

/* Append n bytes to t->out (growing it). */
static int out_append(pc_tls_t *t, const void *p, size_t n) {
    if (t->out_len + n > t->out_cap) {
        size_t cap = t->out_cap ? t->out_cap : 4096;
        while (cap < t->out_len + n)
            cap *= 2;
        uint8_t *o = pc_srealloc(PC_MEM_OTHER, t->out, cap);
        if (!o)
            return PC_ENOMEM;
        t->out = o;
        t->out_cap = cap;
    }
    memcpy(t->out + t->out_len, p, n);
    t->out_len += n;
    return 0;
}

static int bio_write(BIO *b, const char *p, int n) {
    pc_tls_t *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (n <= 0)
        return 0;
    if (t->sink && (size_t)n <= t->sink_cap - t->sink_len) { /* a record of pc_tls_seal */
        memcpy(t->sink + t->sink_len, p, (size_t)n);
        t->sink_len += (size_t)n;
        return n;
    }
    return out_append(t, p, (size_t)n) ? -1 : n;
}

static int bio_read(BIO *b, char *p, int n) {
    pc_tls_t *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (t->in_len == 0) {
        BIO_set_retry_read(b); /* more is to come: not an EOF */
        return -1;
    }
    const size_t k = (size_t)n < t->in_len ? (size_t)n : t->in_len;
    memcpy(p, t->in + t->in_off, k);
    t->in_off += k;
    t->in_len -= k;
    if (!t->in_len)
        t->in_off = 0;
    return (int)k;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b) {
    BIO_set_init(b, 1);
    return 1;
}

/* ==== contexts ============================================================================= */

/* The suites offered and, on a server, chosen, in this order. AES-128-GCM first: as safe for
 * this use and the cheapest per byte with AES-NI (here 60 ns per 256-byte row against 64 for
 * AES-256-GCM and more for ChaCha20-Poly1305, which stays for clients without AES
 * instructions). TLS 1.2: forward-secret AEAD suites only, the same order. */
#define SUITES_TLS13 "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define SUITES_TLS12                                                                           \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:" \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

/* A PEM file the context needs: PC_ENOTFOUND (with err) when it cannot be read. */
static int need_file(const char *what, const char *path, char *err, size_t cap) {
    if (access(path, R_OK) == 0)
        return 0;
    snprintf(err, cap, "TLS: cannot read the %s %s: %m", what, path);
    return PC_ENOTFOUND;
}

int pc_tls_ctx_create(const pc_tls_opts_t *o, pc_tls_ctx_t **out, char *err, size_t cap) {
    char dummy[8];
    if (!err)
        err = dummy, cap = sizeof dummy;
    err[0] = '\0';
    if (!o || !out)
        return PC_EINVAL;
    const bool cert = o->cert && o->cert[0], key = o->key && o->key[0], ca = o->ca && o->ca[0];
    if (cert != key || (o->server && !cert) || (!o->server && !ca) ||
        (o->server && o->client_auth != PC_TLS_AUTH_NONE && !ca) ||
        (unsigned)o->client_auth > PC_TLS_AUTH_REQUIRE) {
        snprintf(err, cap, "TLS: %s",
                 cert != key          ? "a certificate and its key go together"
                 : o->server && !cert ? "a server needs a certificate and its key"
                 : !o->server && !ca  ? "a client needs the CA file its servers' certificates "
                                        "chain to"
                                      : "client certificates need a CA file");
        return PC_EINVAL;
    }
    int rc = 0;
    if ((cert && ((rc = need_file("certificate", o->cert, err, cap)) ||
                  (rc = need_file("key", o->key, err, cap)))) ||
        (ca && (rc = need_file("CA file", o->ca, err, cap))))
        return rc;
    pc_tls_ctx_t *t = pc_scalloc(PC_MEM_OTHER, 1, sizeof *t);
    if (!t)
        return PC_ENOMEM;
    t->ctx = SSL_CTX_new(o->server ? TLS_server_method() : TLS_client_method());
    /* A type without an index of BIO_get_new_index: those run out after 127 in a process (one
     * per context: a program that reconnects would) and nothing looks this BIO up by type. */
    t->bio = BIO_meth_new(BIO_TYPE_SOURCE_SINK, "emberps");
    if (t->bio &&
        (!BIO_meth_set_write(t->bio, bio_write) || !BIO_meth_set_read(t->bio, bio_read) ||
         !BIO_meth_set_ctrl(t->bio, bio_ctrl) || !BIO_meth_set_create(t->bio, bio_create)))
        rc = PC_ENOMEM;
    const char *file = NULL;
    if (rc || !t->bio || !t->ctx || !SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION) ||
        !SSL_CTX_set_ciphersuites(t->ctx, SUITES_TLS13) ||
        !SSL_CTX_set_cipher_list(t->ctx, SUITES_TLS12)) {
        rc = PC_ENOMEM;
    } else if (cert && SSL_CTX_use_certificate_chain_file(t->ctx, o->cert) != 1) {
        file = o->cert;
    } else if (cert && (SSL_CTX_use_PrivateKey_file(t->ctx, o->key, SSL_FILETYPE_PEM) != 1 ||
                        SSL_CTX_check_private_key(t->ctx) != 1)) {
        file = o->key;
    } else if (ca && SSL_CTX_load_verify_locations(t->ctx, o->ca, NULL) != 1) {
        file = o->ca;
    }
    if (file) {
        char why[200];
        err_text(NULL, "cannot load", why, sizeof why);
        snprintf(err, cap, "%s (%s)", why, file);
        rc = PC_ETLS;
    }
    if (!rc) /* (TLS 1.2: a peer's renegotiation is refused on both sides) */
        SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION);
    if (!rc && o->server) {
        /* the server's order decides: AES-128-GCM even for a client that lists AES-256 first */
        SSL_CTX_set_options(t->ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
        /* No resumption (connections are long-lived): no TLS 1.3 tickets, no TLS 1.2 tickets,
         * no session cache. A TLS 1.2 client offering its last session again failed every such
         * handshake when client certificates were asked (no session id context: OpenSSL's
         * SESSION_ID_CONTEXT_UNINITIALIZED), and was resumed otherwise. The context is set too,
         * so that an offered session is only ever declined. */
        SSL_CTX_set_num_tickets(t->ctx, 0);
        SSL_CTX_set_options(t->ctx, SSL_OP_NO_TICKET);
        SSL_CTX_set_session_cache_mode(t->ctx, SSL_SESS_CACHE_OFF);
        static const unsigned char sid_ctx[] = "emberps";
        SSL_CTX_set_session_id_context(t->ctx, sid_ctx, sizeof sid_ctx - 1);
        int mode = SSL_VERIFY_NONE;
        if (o->client_auth != PC_TLS_AUTH_NONE) {
            mode = SSL_VERIFY_PEER;
            if (o->client_auth == PC_TLS_AUTH_REQUIRE)
                mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
            STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->ca);
            if (names)
                SSL_CTX_set_client_CA_list(t->ctx, names);
        }
        SSL_CTX_set_verify(t->ctx, mode, NULL);
    } else if (!rc) {
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    }
    ERR_clear_error();
    if (rc) {
        pc_tls_ctx_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void pc_tls_ctx_destroy(pc_tls_ctx_t *ctx) {
    if (!ctx)
        return;
    SSL_CTX_free(ctx->ctx);
    BIO_meth_free(ctx->bio);
    pc_sfree(ctx);
}

/* ==== sessions ============================================================================= */

int pc_tls_new(pc_tls_ctx_t *ctx, const char *peer, pc_tls_t **out) {
    if (!ctx || !out)
        return PC_EINVAL;
    pc_tls_t *t = pc_scalloc(PC_MEM_OTHER, 1, sizeof *t);
    if (!t)
        return PC_ENOMEM;
    t->ssl = SSL_new(ctx->ctx);
    BIO *b = BIO_new(ctx->bio);
    if (!t->ssl || !b) {
        BIO_free(b);
        SSL_free(t->ssl);
        pc_sfree(t);
        ERR_clear_error();
        return PC_ENOMEM;
    }
    BIO_set_data(b, t);
    SSL_set_bio(t->ssl, b, b); /* one BIO both ways; the SSL owns it */
    int rc = 0;
    if (SSL_is_server(t->ssl)) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        unsigned char ip[16];
        if (peer && peer[0]) {
            const bool is_ip =
                inet_pton(AF_INET, peer, ip) == 1 || inet_pton(AF_INET6, peer, ip) == 1;
            if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), peer) != 1
                      : SSL_set1_host(t->ssl, peer) != 1 ||
                            SSL_set_tlsext_host_name(t->ssl, peer) != 1)
                rc = PC_EINVAL;
        }
    }
    ERR_clear_error();
    if (rc) {
        pc_tls_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void pc_tls_free(pc_tls_t *t) {
    if (!t)
        return;
    SSL_free(t->ssl);
    pc_sfree(t->in);
    pc_sfree(t->out);
    pc_sfree(t);
}

int pc_tls_inbuf(pc_tls_t *t, void **buf, size_t *cap) {
    if (!t->in && !(t->in = pc_smalloc(PC_MEM_OTHER, PC_TLS_IN_BYTES)))
        return PC_ENOMEM;
    t->in_cap = PC_TLS_IN_BYTES;
    if (t->in_off && t->in_off + t->in_len > t->in_cap / 2) { /* the unread part to the front */
        memmove(t->in, t->in + t->in_off, t->in_len);
        t->in_off = 0;
    }
    *buf = t->in + t->in_off + t->in_len;
    *cap = t->in_cap - t->in_off - t->in_len;
    return 0;
}

void pc_tls_received(pc_tls_t *t, size_t n) {
    t->in_len += n;
}

int pc_tls_handshake(pc_tls_t *t) {
    if (t->established)
        return 0;
    const int r = SSL_do_handshake(t->ssl);
    if (r == 1) {
        t->established = true;
        return 0;
    }
    const int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        ERR_clear_error();
        return PC_EAGAIN;
    }
    err_text(t->ssl, "the handshake failed", t->err, sizeof t->err);
    return PC_ETLS;
}

bool pc_tls_established(const pc_tls_t *t) {
    return t->established;
}

ssize_t pc_tls_read(pc_tls_t *t, void *buf, size_t cap) {
    const int r = SSL_read(t->ssl, buf, (int)(cap < INT_MAX ? cap : INT_MAX));
    if (r > 0)
        return r;
    const int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        ERR_clear_error();
        return 0;
    }
    if (e == SSL_ERROR_ZERO_RETURN) {
        ERR_clear_error();
        snprintf(t->err, sizeof t->err, "TLS: the peer closed the session");
        return PC_ECLOSED;
    }
    err_text(t->ssl, "read failed", t->err, sizeof t->err);
    return PC_ETLS;
}

/* Plaintext bytes per record (TLS's maximum) and a bound on a record's overhead (header,
 * explicit nonce, tag, TLS 1.3's content type: 29 bytes at most for the AEAD suites offered). */
#define RECORD          16384u
#define RECORD_OVERHEAD 64u

size_t pc_tls_sealed_max(size_t len) {
    return len + (len / RECORD + 1) * RECORD_OVERHEAD;
}

int pc_tls_seal(pc_tls_t *t, const void *buf, size_t len, void *out, size_t cap, size_t *outlen) {
    if (!t->established)
        return PC_ESTATE;
    const uint8_t *in = buf, *o = out;
    if (in >= o && in < o + cap && /* in place: the plaintext at the end, room in front */
        (in + len != o + cap || cap - len < t->out_len + pc_tls_sealed_max(len) - len))
        return PC_EINVAL;
    if (in < o && in + len > o) /* the plaintext runs into out: written over before it is read */
        return PC_EINVAL;
    if (t->out_len > cap)
        return PC_ETOOBIG;
    size_t have = pc_tls_take(t, out, cap); /* what was pending first, in order */
    t->sink = out;
    t->sink_cap = cap;
    t->sink_len = have;
    const char *p = buf;
    int rc = 0;
    for (size_t off = 0; off < len;) {
        const int piece = (int)(len - off < (1u << 30) ? len - off : (1u << 30));
        const int r = SSL_write(t->ssl, p + off, piece);
        if (r <= 0) {
            err_text(t->ssl, "write failed", t->err, sizeof t->err);
            rc = PC_ETLS;
            break;
        }
        off += (size_t)r;
    }
    have = t->sink_len;
    t->sink = NULL;
    if (!rc && t->out_len) /* records that did not fit (never within pc_tls_sealed_max) */
        rc = t->out_len <= cap - have ? 0 : PC_ETOOBIG;
    if (!rc)
        have += pc_tls_take(t, (uint8_t *)out + have, cap - have);
    *outlen = have;
    return rc;
}

size_t pc_tls_pending(const pc_tls_t *t) {
    return t->out_len;
}

size_t pc_tls_take(pc_tls_t *t, void *buf, size_t cap) {
    const size_t n = t->out_len < cap ? t->out_len : cap;
    memcpy(buf, t->out, n);
    memmove(t->out, t->out + n, t->out_len - n);
    t->out_len -= n;
    return n;
}

const char *pc_tls_error(const pc_tls_t *t) {
    return t->err;
}

bool pc_tls_looks_like_hello(const void *buf, size_t len) {
    const unsigned char *b = buf;
    /* A handshake record (22) of TLS major version 3. */
    return len >= 1 && b[0] == 22 && (len < 2 || b[1] == 3);
}
