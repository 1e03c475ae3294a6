/* pc_tls.c: TLS over memory buffers (see pc_tls.h), on OpenSSL.
 *
 * DESIGN
 * OpenSSL is reached only from this file: its status (SSL_get_error, the thread's error queue,
 * the X509 verify result) is translated here into a PC_E* code and one line of text, once per
 * failure, and the queue is cleared before every return. Sessions hold an SSL and its two memory
 * BIOs (SSL_set_bio gives the SSL their ownership: SSL_free frees them).
 */
#include "pc_tls.h"

#include "pc_alloc.h"
#include "pc_error.h"

#include <arpa/inet.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct pc_tls_ctx {
    SSL_CTX *ctx;
};

struct pc_tls {
    SSL *ssl;
    BIO *rb, *wb; /* ciphertext in, ciphertext out (owned by ssl) */
    bool established;
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

/* ==== contexts ============================================================================= */

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
    const char *file = NULL;
    /* AES-128-GCM first: as safe for this use and the fastest with AES-NI */
    if (!t->ctx || !SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION) ||
        !SSL_CTX_set_ciphersuites(t->ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                          "TLS_CHACHA20_POLY1305_SHA256")) {
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
    if (!rc && o->server) {
        SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION);
        SSL_CTX_set_num_tickets(t->ctx, 0); /* no resumption: connections are long-lived */
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
    t->rb = BIO_new(BIO_s_mem());
    t->wb = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->rb || !t->wb) {
        BIO_free(t->rb);
        BIO_free(t->wb);
        SSL_free(t->ssl);
        pc_sfree(t);
        ERR_clear_error();
        return PC_ENOMEM;
    }
    BIO_set_mem_eof_return(t->rb, -1); /* an empty read BIO means "more to come", not EOF */
    SSL_set_bio(t->ssl, t->rb, t->wb);
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
    pc_sfree(t);
}

int pc_tls_feed(pc_tls_t *t, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        const int n = (int)(len < INT_MAX ? len : INT_MAX);
        if (BIO_write(t->rb, p, n) != n) {
            ERR_clear_error();
            return PC_ENOMEM;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
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

int pc_tls_write(pc_tls_t *t, const void *buf, size_t len) {
    if (!t->established)
        return PC_ESTATE;
    const char *p = buf;
    while (len) {
        const int n = (int)(len < (1u << 30) ? len : (1u << 30));
        const int r = SSL_write(t->ssl, p, n);
        if (r <= 0) {
            err_text(t->ssl, "write failed", t->err, sizeof t->err);
            return PC_ETLS;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

size_t pc_tls_pending(const pc_tls_t *t) {
    return BIO_ctrl_pending(t->wb);
}

size_t pc_tls_take(pc_tls_t *t, void *buf, size_t cap) {
    const int r = BIO_read(t->wb, buf, (int)(cap < INT_MAX ? cap : INT_MAX));
    ERR_clear_error();
    return r > 0 ? (size_t)r : 0;
}

const char *pc_tls_error(const pc_tls_t *t) {
    return t->err;
}

bool pc_tls_looks_like_hello(const void *buf, size_t len) {
    const unsigned char *b = buf;
    /* A handshake record (22) of TLS major version 3. */
    return len >= 1 && b[0] == 22 && (len < 2 || b[1] == 3);
}
