/* ps_server_main.c: the ps-server daemon.
 *
 *   build/bin/ps-server [--config=FILE] [--name=value ...]     (--help lists every setting)
 *   build/bin/ps-server --help-tables                         (the keys of a table spec)
 *
 * Settings come from one table: defaults, then the config file, then PS_SERVER_* environment
 * variables, then flags (later wins). --print-config prints the effective settings and exits.
 *
 * Start: restore the newest checkpoint of ckpt_dir (if any; restore_id names one), create the
 * tables of `tables` that do not exist, serve the data plane, the gRPC API and /metrics
 * (docs/server.md). Signals:
 * SIGTERM/SIGINT stop accepting, answer what was received, write a checkpoint (ckpt_on_exit) and
 * exit 0; SIGUSR1 writes a checkpoint now; SIGHUP reloads cluster_map_file. Every ckpt_interval_s
 * seconds a checkpoint is written; every clock_tick_s seconds the tables' clocks advance by one
 * (TTL and admission decay count ticks). Exit status: 0 after a clean stop, 1 on a runtime failure,
 * 2 on bad settings.
 */
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_settings.h"
#include "pc_stop.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"
#include "pc_time.h"
#include "ps_api.h"
#include "ps_coord.h"
#include "ps_coord_etcd.h"
#include "ps_coord_remote.h"
#include "ps_repl.h"
#include "ps_dataplane.h"
#include "ps_grpc.h"
#include "pc_metrics.h"
#include "ps_tier.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <uv.h>

typedef struct srv_cfg {
    char config[512];
    char host[64];
    int64_t port;
    int64_t io_threads;
    int64_t poll_us, dead_peer_ms, hello_timeout_ms, frame_timeout_ms;
    int64_t grpc_port;
    int64_t grpc_threads, grpc_call_wait_ms;
    int64_t metrics_port, metrics_max_connections;
    char admin_token[256];
    char cluster_map[4096];
    char cluster_map_file[512];
    int64_t server_index;
    char token[256];
    char tls_cert[512], tls_key[512], tls_ca[512];
    int tls_client_auth; /* 0 none, 1 request, 2 require (k_tls_auth) */
    bool insecure_remote;
    bool coordinator;
    char coordinator_store[1024];
    char cluster_coordinator[1024];
    int64_t replicas, lease_ms, ack_timeout_ms;
    int64_t max_body_bytes, max_batch_keys, max_reply_bytes;
    int64_t delta_log_entries;
    int64_t reply_queue_bytes, reply_queue_total_bytes, body_total_bytes;
    char tables[4096];
    char ckpt_dir[512];
    int64_t ckpt_interval_s, ckpt_keep, ckpt_full_every, restore_id;
    bool ckpt_on_exit;
    char tier_dir[512];
    int64_t tier_cache_bytes, tier_min_free_bytes;
    int64_t clock_tick_s;
    char port_file[512];
    int log_level;
    bool print_config;
} srv_cfg_t;

static const char *const k_levels[] = {"error", "warn", "info", "debug", "trace", NULL};
/* tls_client_auth, by index: 0 none, 1 request, 2 require (ps_grpc.h's PS_GRPC_AUTH_*). */
static const char *const k_tls_auth[] = {"none", "request", "require", NULL};

#define T srv_cfg_t
static const pc_setting_t k_settings[] = {
    PC_SETTING_STRING(T, config, "", "settings file (name = value lines), read before flags"),
    PC_SETTING_STRING(T, host, "127.0.0.1", "address to bind"),
    PC_SETTING_INT(T, port, 0, 65535, "7400", "data plane port (0: any free port)"),
    PC_SETTING_INT(T, io_threads, 1, 64, "2", "data plane event loops"),
    PC_SETTING_INT(T, poll_us, 0, 1000000, "0",
                   "data plane busy polling: a loop polls this long after input before it sleeps "
                   "(low latency for a core's time)"),
    PC_SETTING_INT(T, dead_peer_ms, 1000, 3600000, "60000",
                   "a data plane client that acknowledges nothing for this long (its host gone, "
                   "a cut that drops packets) loses its connection and what it held"),
    PC_SETTING_INT(T, hello_timeout_ms, 100, 3600000, "10000",
                   "with a token or TLS: a data plane connection that has not finished its TLS "
                   "handshake and said HELLO with the token within this long is closed"),
    PC_SETTING_INT(T, frame_timeout_ms, 100, 3600000, "30000",
                   "a data plane connection that sent part of a request and then nothing for this "
                   "long is closed, with the buffer the request held"),
    PC_SETTING_INT(T, grpc_port, -1, 65535, "7500", "gRPC API port (0: any free, -1: off)"),
    PC_SETTING_INT(T, grpc_threads, 1, 64, "2", "gRPC handler threads"),
    PC_SETTING_INT(T, grpc_call_wait_ms, 100, 3600000, "30000",
                   "a gRPC call's request must arrive, and its reply leave, within this; a "
                   "stalled client's call is cancelled and its handler thread freed"),
    PC_SETTING_INT(T, metrics_port, -1, 65535, "9400",
                   "Prometheus /metrics port (0: any, -1: off)"),
    PC_SETTING_INT(T, metrics_max_connections, 1, 10000, "64",
                   "most HTTP connections /metrics holds at once (more wait in the backlog)"),
    PC_SETTING_SECRET(T, admin_token, "token for CreateTable/DropTable/Checkpoint (gRPC)"),
    PC_SETTING_STRING(T, cluster_map, "", "cluster map text (empty: this server owns every slot)"),
    PC_SETTING_STRING(T, cluster_map_file, "", "file holding the cluster map (reread on SIGHUP)"),
    PC_SETTING_INT(T, server_index, -1, 1023, "-1", "index in the map (-1: find host:port)"),
    PC_SETTING_SECRET(T, token, "shared token every connection must present"),
    PC_SETTING_STRING(
        T, tls_cert, "",
        "PEM certificate chain: with tls_key, gRPC and the data plane serve TLS only"),
    PC_SETTING_STRING(T, tls_key, "", "PEM private key of tls_cert"),
    PC_SETTING_STRING(T, tls_ca, "", "PEM CA bundle that client certificates must chain to"),
    PC_SETTING_ENUM(
        T, tls_client_auth, k_tls_auth, "none",
        "client certificates: none, request (verified if sent), require (needs tls_ca)"),
    PC_SETTING_BOOL(T, insecure_remote, "false",
                    "allow a non-loopback bind without a token and without TLS"),
    PC_SETTING_BOOL(T, coordinator, "false",
                    "also serve the job's coordinator (gRPC emberps.Coordinator: rendezvous KV)"),
    PC_SETTING_STRING(T, coordinator_store, "memory",
                      "where --coordinator keeps its state: memory (this process), or "
                      "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcds:// for TLS)"),
    PC_SETTING_STRING(T, cluster_coordinator, "",
                      "replicas and failover: the coordinator holding the cluster map and the "
                      "servers' leases: etcd://HOST:PORT[,...], HOST:GRPC_PORT of a ps-server "
                      "--coordinator, or self (this server's --coordinator); empty: a fixed map"),
    PC_SETTING_INT(T, replicas, 0, 2, "1",
                   "with cluster_coordinator: backups of every slot (the servers after its "
                   "primary) in the first map published"),
    PC_SETTING_INT(T, lease_ms, 200, 600000, "2000",
                   "with cluster_coordinator: a server that has not renewed its lease for this "
                   "long is replaced by its backups"),
    PC_SETTING_INT(T, ack_timeout_ms, 1, 3600000, "10000",
                   "a push waits at most this long for its backups (then PC_ETIMEDOUT)"),
    PC_SETTING_INT(T, max_body_bytes, 1024, 2147483647, "256Mi", "largest request body"),
    PC_SETTING_INT(T, max_batch_keys, 1, 16777216, "4Mi", "most keys in one request"),
    PC_SETTING_INT(T, max_reply_bytes, 1024, 2147483647, "64Mi",
                   "largest reply (rows + found bytes) of a pull or lookup; more: PC_ETOOBIG"),
    PC_SETTING_INT(T, delta_log_entries, 0, 1099511627776, "1Mi",
                   "keys the change log of a table keeps for the delta stream, started when a "
                   "follower first asks (8 bytes each; 0: no delta stream): a follower further "
                   "behind rescans"),
    PC_SETTING_INT(T, reply_queue_bytes, 65536, 1e15, "64Mi",
                   "unsent reply bytes at which a data-plane connection stops being read"),
    PC_SETTING_INT(T, reply_queue_total_bytes, 65536, 1e15, "1Gi",
                   "unsent reply bytes of all connections at which the data plane stops reading"),
    PC_SETTING_INT(T, body_total_bytes, 65536, 1e15, "1Gi",
                   "request bodies over 64 KiB that all data-plane connections may hold at once "
                   "(one always may): a connection whose next body would pass it waits unread"),
    PC_SETTING_STRING(T, tables, "", "tables to create if missing: spec;spec (--help-tables)"),
    PC_SETTING_STRING(T, ckpt_dir, "", "checkpoint directory (empty: no checkpoints)"),
    PC_SETTING_INT(T, ckpt_interval_s, 0, 1e9, "0", "seconds between checkpoints (0: off)"),
    PC_SETTING_INT(T, ckpt_keep, 1, 1000, "3", "checkpoints to keep"),
    PC_SETTING_INT(T, restore_id, 0, 9.2e18, "0",
                   "start from this checkpoint (0: the newest; a job rollback names one, and "
                   "the newer ones are abandoned: give it for that start only, not in a "
                   "supervisor's restarts)"),
    PC_SETTING_INT(T, ckpt_full_every, 1, 256, "4", "every Nth checkpoint is full"),
    PC_SETTING_BOOL(T, ckpt_on_exit, "true", "write a checkpoint on SIGTERM/SIGINT"),
    PC_SETTING_STRING(T, tier_dir, "", "RocksDB cold tier directory (empty: no cold tables)"),
    PC_SETTING_INT(T, tier_cache_bytes, 0, 1e15, "256Mi", "cold tier block cache"),
    PC_SETTING_INT(T, tier_min_free_bytes, 0, 1e15, "1Gi", "cold tier free-space watermark"),
    PC_SETTING_INT(T, clock_tick_s, 0, 1e9, "0", "advance table clocks every N s (0: off)"),
    PC_SETTING_STRING(
        T, port_file, "",
        "once serving, write the data plane, gRPC and metrics ports here, one per line"),
    PC_SETTING_ENUM(T, log_level, k_levels, "info", "log level"),
    PC_SETTING_BOOL(T, print_config, "false", "print the effective settings and exit"),
};
#undef T
#define NSET (sizeof k_settings / sizeof k_settings[0])

typedef struct server {
    srv_cfg_t cfg;
    uv_loop_t *loop;
    ps_catalog_t *cat;
    ps_tier_t *tier;
    ps_ckpt_t *ck;
    ps_dp_t *dp;
    ps_grpc_t *grpc;
    pc_metrics_t *metrics;
    ps_coord_store_t coord; /* --coordinator: the in-process store */
    /* With an etcd store, the gRPC API's own connection to it, each call bounded by
     * API_COORD_MS: a handler thread waits that long at most on an etcd that does not answer
     * (10 s, the store's own budget, held every thread from health checks and lookups) */
    ps_coord_store_t api_coord;
    ps_coord_store_t ccoord; /* --cluster-coordinator, when not this server's own */
    ps_repl_t *repl;
    uint64_t restored; /* the checkpoint restored at start (0: none) */
    uint64_t start_ns;
    pthread_mutex_t ckpt_mu; /* checkpoints come from the timer, signals and gRPC */
    atomic_uint_least64_t ckpt_ok, ckpt_failed, ckpt_last_ns, ckpt_last_seconds_us;
    uint32_t self;
    uv_signal_t sig_term, sig_int, sig_usr1, sig_hup;
    uv_timer_t ckpt_timer, clock_timer;
    int rc;
} server_t;

/* The start goes on: no step failed and no stop was asked. */
static bool going_on(int rc) {
    return !rc && !pc_stop_signal();
}

/* ==== settings ============================================================================= */

/* A table the checkpoint brought keeps the settings it had; where --tables says otherwise (a
 * changed learning rate, optimizer, dim), say which settings differ (silently, a changed
 * optimizer was ignored and a changed dim showed as the workers' push errors). */
static void said_kept(const ps_table_config_t *had, const ps_table_config_t *asked) {
    char a[2048], b[2048], diff[1024] = "";
    ps_table_config_format(had, a, sizeof a);
    ps_table_config_format(asked, b, sizeof b);
    size_t len = 0;
    char *sa = NULL, *sb = NULL; /* (one order of keys: ps_table_config_format's) */
    for (char *x = strtok_r(a, ",", &sa), *y = strtok_r(b, ",", &sb); x && y;
         x = strtok_r(NULL, ",", &sa), y = strtok_r(NULL, ",", &sb))
        if (strcmp(x, y) && len < sizeof diff)
            len += (size_t)snprintf(diff + len, sizeof diff - len, "%s%s (checkpoint: %s)",
                                    len ? ", " : "", y, x);
    if (len)
        PC_WARN("table %s: restored with the checkpoint's settings; --tables asks for %s: not "
                "taken (a table changes settings by ResetTable, or under a new name)",
                had->name, diff);
}

/* The table specs of --tables, each parsed; with s, the tables not restored already are created
 * (without: a check, before anything is opened). Returns 0, or the exit status (logged). */
static int table_specs(const srv_cfg_t *cfg, server_t *s) {
    char specs[sizeof cfg->tables];
    snprintf(specs, sizeof specs, "%s", cfg->tables);
    char *save = NULL;
    for (char *spec = strtok_r(specs, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        ps_table_config_t c;
        char err[512];
        if (ps_catalog_spec_parse(spec, &c, err, sizeof err)) {
            PC_ERROR("--tables: %s", err);
            return 2;
        }
        if (!s)
            continue;
        ps_table_t *t;
        if (ps_catalog_acquire(s->cat, c.name, &t) == 0) { /* restored already: kept as it is */
            said_kept(ps_table_config(t), &c);
            ps_catalog_release(s->cat, t);
            continue;
        }
        int rc = ps_catalog_add(s->cat, &c);
        if (rc == PC_ETOOBIG)
            PC_ERROR("table %s: a server holds %d tables at most", c.name, PS_CATALOG_TABLES_MAX);
        else if (rc)
            PC_ERROR("table %s: %s", c.name, pc_strerror(rc));
        if (rc)
            return 1;
        PC_INFO("created table %s (dim %lld)", c.name, (long long)c.dim);
    }
    return 0;
}

static int load_settings(srv_cfg_t *c, int argc, char **argv) {
    char err[512];
    if (pc_settings_defaults(k_settings, NSET, c))
        return 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ps-server [--name=value ...]\n"
                   "       ps-server --help-tables      the keys of a table spec (--tables)\n\n");
            pc_settings_help(k_settings, NSET, stdout);
            exit(0);
        }
        if (strcmp(argv[i], "--help-tables") == 0 || strcmp(argv[i], "--help_tables") == 0) {
            size_t n;
            const pc_setting_t *tab = ps_table_settings(&n);
            printf("A table spec is key=value items separated by ',' (specs in --tables by ';'):\n"
                   "  ps-server --tables=\"name=emb,dim=16;name=ads,dim=64,optimizer=adam\"\n"
                   "  psctl create \"name=ads,dim=64,optimizer=adam,lr=0.001\"  (gRPC "
                   "CreateTable)\n"
                   "name= is required; every other key has the default shown.\n\n");
            for (size_t k = 0; k < n; k++) {
                if (strcmp(tab[k].name, "name") == 0) /* the engine's default is not served */
                    printf("  %-32s %s (required)\n", "name=<str>", tab[k].help);
                else
                    pc_settings_help_list(&tab[k], 1, stdout);
            }
            exit(0);
        }
    }
    /* The config file first (a --config flag or PS_SERVER_CONFIG names it), then environment,
     * then flags. */
    srv_cfg_t pre = *c;
    int argi = 1;
    if (pc_settings_load_env(k_settings, NSET, &pre, "PS_SERVER_", err, sizeof err) ||
        pc_settings_parse_args(k_settings, NSET, &pre, argc, argv, &argi, err, sizeof err)) {
        fprintf(stderr, "ps-server: %s\n", err);
        return 2;
    }
    if (argi < argc) {
        fprintf(stderr, "ps-server: unknown argument '%s' (see --help)\n", argv[argi]);
        return 2;
    }
    if (pre.config[0] && pc_settings_load_file(k_settings, NSET, c, pre.config, err, sizeof err)) {
        fprintf(stderr, "ps-server: %s\n", err);
        return 2;
    }
    if (pc_settings_load_env(k_settings, NSET, c, "PS_SERVER_", err, sizeof err)) {
        fprintf(stderr, "ps-server: %s\n", err);
        return 2;
    }
    argi = 1;
    if (pc_settings_parse_args(k_settings, NSET, c, argc, argv, &argi, err, sizeof err)) {
        fprintf(stderr, "ps-server: %s\n", err);
        return 2;
    }
    if (c->restore_id && !c->ckpt_dir[0]) { /* it would start empty, believing it restored */
        fprintf(stderr, "ps-server: --restore-id needs --ckpt-dir (where checkpoint %lld is)\n",
                (long long)c->restore_id);
        return 2;
    }
    if (!c->port && c->server_index < 0 && (c->cluster_map[0] || c->cluster_map_file[0])) {
        fprintf(stderr, "ps-server: --port=0 (any free port) with a cluster map: the map cannot "
                        "name this server; give its port or --server-index\n");
        return 2;
    }
    /* Settings wrong in themselves are refused here, before the tier and the checkpoint
     * directory are opened and a restore runs (minutes): found after it, the server had also
     * replaced its tier's files and served for a while. */
    if (c->coordinator && strcmp(c->coordinator_store, "memory") &&
        !ps_coord_is_etcd(c->coordinator_store)) {
        fprintf(stderr,
                "ps-server: coordinator_store: '%s' is neither memory nor "
                "etcd://HOST:PORT[,...][/PREFIX]\n",
                c->coordinator_store);
        return 2;
    }
    if (!strcmp(c->cluster_coordinator, "self") && !c->coordinator) {
        fprintf(stderr, "ps-server: cluster_coordinator=self needs --coordinator\n");
        return 2;
    }
    return table_specs(c, NULL);
}

static bool tls_on(const srv_cfg_t *c) {
    return c->tls_cert[0] && c->tls_key[0];
}

/* The security settings (ps_grpc_security_check: they cover the data plane too). Returns 0 or
 * the exit status 2, having said why on stderr. */
static int check_security(const srv_cfg_t *c) {
    char why[256];
    if (ps_grpc_security_check(c->host, c->token, c->tls_cert, c->tls_key, c->tls_ca,
                               c->tls_client_auth, c->insecure_remote, why, sizeof why)) {
        fprintf(stderr, "ps-server: %s\n", why);
        return 2;
    }
    return 0;
}

/* A gRPC API call's budget on an etcd store (the workers' heartbeats and rendezvous ask again). */
#define API_COORD_MS 2000

/* The store of --coordinator's service: this process's memory, or an etcd cluster (etcds://: TLS
 * with this server's CA, certificate and key as the client's), with a second connection for the
 * API (api). Logged on failure. */
static int open_coord_store(const srv_cfg_t *c, ps_coord_store_t *out, ps_coord_store_t *api) {
    if (!strcmp(c->coordinator_store, "memory")) /* else etcd (load_settings checked) */
        return ps_coord_store_memory(out);
    const psg_opts_t sec = {.tls_ca = c->tls_ca, .tls_cert = c->tls_cert, .tls_key = c->tls_key};
    int rc = ps_coord_store_etcd(c->coordinator_store, &sec, 10000, out);
    if (!rc && (rc = ps_coord_store_etcd(c->coordinator_store, &sec, API_COORD_MS, api))) {
        out->destroy(out->ctx);
        out->ctx = NULL;
    }
    if (!rc)
        PC_INFO("coordinator: state kept in etcd at %s", c->coordinator_store);
    return rc;
}

/* Replicas and failover (ps_repl.h) on --cluster-coordinator. Returns 0 or 1 (logged). */
static int start_repl(server_t *s, const pc_cluster_map_t *map) {
    const srv_cfg_t *c = &s->cfg;
    const ps_coord_store_t *store = &s->coord;
    if (strcmp(c->cluster_coordinator, "self")) { /* self: --coordinator's (load_settings) */
        /* its keys are under PS_COORD_CLUSTER_PREFIX: the admin token, when one is set */
        const psg_opts_t sec = {.token = c->admin_token[0] ? c->admin_token : c->token,
                                .tls_ca = c->tls_ca,
                                .tls_cert = c->tls_cert,
                                .tls_key = c->tls_key};
        int rc = ps_coord_store_open(c->cluster_coordinator, &sec, 5000, &s->ccoord);
        if (rc) {
            PC_ERROR("cluster_coordinator %s: %s", c->cluster_coordinator, pc_strerror(rc));
            return 1;
        }
        store = &s->ccoord;
    }
    ps_repl_opts_t ro = {.self = s->self,
                         .replicas = (uint32_t)c->replicas,
                         .lease_ms = (uint32_t)c->lease_ms,
                         .restored = s->restored,
                         .restore_chosen = c->restore_id != 0,
                         .token = c->token,
                         .tls_ca = tls_on(c) ? c->tls_ca : NULL,
                         .tls_cert = c->tls_cert,
                         .tls_key = c->tls_key,
                         .stopped = pc_stop_signal};
    int rc = ps_repl_start(store, s->cat, s->dp, map, &ro, &s->repl);
    if (rc == PC_ECANCELED)
        PC_INFO("replication: start given up: a stop was asked");
    else if (rc)
        PC_ERROR("replication: %s", pc_strerror(rc));
    else
        PC_INFO("replication: cluster map and leases in %s, %lld backups per slot, lease %lld ms",
                c->cluster_coordinator, (long long)c->replicas, (long long)c->lease_ms);
    return rc ? 1 : 0;
}

/* This server's index in map m: --server-index, else where m lists host:port (port 0: the first,
 * a lone server's map before it binds); -1 when m does not list it. `addr` gets host:port. */
static int self_index(const srv_cfg_t *c, int port, const pc_cluster_map_t *m,
                      char addr[PC_ADDR_MAX]) {
    snprintf(addr, PC_ADDR_MAX, "%s:%d", c->host, port);
    if (c->server_index >= 0)
        return (int)c->server_index;
    return port ? pc_cmap_find(m, addr) : 0;
}

/* Read the map text from the setting or the file (whole: a map of 1024 servers is long). */
static int read_map(const srv_cfg_t *c, int port, pc_cluster_map_t **out) {
    char *text = NULL, lone[PC_ADDR_MAX + 64], err[256];
    int rc = 0;
    if (c->cluster_map_file[0]) {
        size_t n = 0;
        rc = pc_fs_read_all(c->cluster_map_file, 1u << 20, &text, &n);
        if (rc || n == 0) {
            PC_ERROR("cluster_map_file %s: %s", c->cluster_map_file,
                     rc ? pc_strerror(rc) : "empty");
            free(text);
            /* empty (rewritten in place) or unreadable now: PC_EIO, a start that may work later;
             * absent or too large: a setting's error */
            return rc == PC_ENOTFOUND || rc == PC_ETOOBIG ? PC_EINVAL : PC_EIO;
        }
        text[strcspn(text, "\r\n")] = '\0';
    } else if (!c->cluster_map[0]) { /* a lone server's */
        snprintf(lone, sizeof lone, "version=1;servers=%s:%d;slots=0-16383:0", c->host, port);
    }
    rc = pc_cmap_parse(text                ? text
                       : c->cluster_map[0] ? c->cluster_map
                                           : lone,
                       out, err, sizeof err);
    free(text);
    if (rc)
        PC_ERROR("cluster map: %s", err);
    return rc;
}

/* ==== runtime ============================================================================== */

/* Write a checkpoint (serialized: the checkpointer is single-owner). */
static int checkpoint_locked(server_t *s, ps_ckpt_result_t *r) {
    pthread_mutex_lock(&s->ckpt_mu);
    int rc = ps_ckpt_write(s->ck, r);
    pthread_mutex_unlock(&s->ckpt_mu);
    if (rc) {
        atomic_fetch_add(&s->ckpt_failed, 1);
    } else {
        atomic_fetch_add(&s->ckpt_ok, 1);
        atomic_store(&s->ckpt_last_ns, pc_time_mono_ns());
        atomic_store(&s->ckpt_last_seconds_us, (uint64_t)(r->seconds * 1e6));
    }
    return rc;
}

/* One table's name and stats, for /metrics. */
typedef struct table_stat {
    char name[PS_TABLE_NAME_MAX];
    ps_table_stats_t st;
} table_stat_t;

typedef struct table_stats {
    table_stat_t *v;
    size_t n, cap;
} table_stats_t;

static int collect_stats(void *ctx, ps_table_t *t) {
    table_stats_t *x = ctx;
    if (x->n == x->cap) {
        const size_t ncap = x->cap ? 2 * x->cap : 16;
        table_stat_t *v = realloc(x->v, ncap * sizeof *v);
        if (!v)
            return PC_ENOMEM; /* the tables so far are shown */
        x->v = v;
        x->cap = ncap;
    }
    snprintf(x->v[x->n].name, sizeof x->v[x->n].name, "%s", ps_table_config(t)->name);
    ps_table_stats(t, &x->v[x->n].st);
    x->n++;
    return 0;
}

/* ---- metrics ---- */
static size_t render_metrics(void *ctx, char *buf, size_t cap) {
    server_t *s = ctx;
    const uint64_t now = pc_time_mono_ns();
    size_t len = pc_prom_appendf(
        buf, cap, 0, "# TYPE emberps_uptime_seconds gauge\nemberps_uptime_seconds %.3f\n",
        (double)(now - s->start_ns) * 1e-9);
    len = ps_dp_render_metrics(s->dp, buf, cap, len);
    if (s->repl)
        len = ps_repl_render_metrics(s->repl, buf, cap, len);
    if (s->grpc)
        len = ps_grpc_render_metrics(s->grpc, buf, cap, len);
    if (s->ck) {
        uint64_t last = atomic_load(&s->ckpt_last_ns);
        len = pc_prom_appendf(
            buf, cap, len,
            "# TYPE emberps_checkpoints_total counter\nemberps_checkpoints_total %llu\n"
            "# TYPE emberps_checkpoint_failures_total counter\n"
            "emberps_checkpoint_failures_total %llu\n"
            "# TYPE emberps_checkpoint_age_seconds gauge\n"
            "emberps_checkpoint_age_seconds %.3f\n"
            "# TYPE emberps_checkpoint_last_duration_seconds gauge\n"
            "emberps_checkpoint_last_duration_seconds %.6f\n",
            (unsigned long long)atomic_load(&s->ckpt_ok),
            (unsigned long long)atomic_load(&s->ckpt_failed),
            last ? (double)(now - last) * 1e-9 : -1.0,
            (double)atomic_load(&s->ckpt_last_seconds_us) * 1e-6);
    }
    if (s->tier) {
        ps_tier_stats_t t;
        ps_tier_stats(s->tier, &t);
        len = pc_prom_appendf(buf, cap, len,
                              "# TYPE emberps_tier_free_bytes gauge\nemberps_tier_free_bytes %llu\n"
                              "# TYPE emberps_tier_writable gauge\nemberps_tier_writable %d\n"
                              "# TYPE emberps_tier_rows gauge\nemberps_tier_rows %llu\n"
                              "# TYPE emberps_tier_sst_bytes gauge\nemberps_tier_sst_bytes %llu\n"
                              "# TYPE emberps_tier_writes_refused_total counter\n"
                              "emberps_tier_writes_refused_total %llu\n",
                              (unsigned long long)t.free_bytes, t.writable ? 1 : 0,
                              (unsigned long long)t.rows_estimate, (unsigned long long)t.sst_bytes,
                              (unsigned long long)t.writes_refused);
    }
    table_stats_t ts = {0}; /* every table (ps_catalog_each: no cap on their number) */
    (void)ps_catalog_each(s->cat, collect_stats, &ts);
    const size_t n = ts.n;
    static const char *const kinds[] = {"gauge", "counter"};
    static const struct {
        const char *name;
        int kind;
    } m[] = {{"emberps_table_rows", 0},
             {"emberps_table_bytes", 0},
             {"emberps_table_rows_pulled_total", 1},
             {"emberps_table_rows_pushed_total", 1},
             {"emberps_table_rows_looked_up_total", 1},
             {"emberps_table_evicted_total", 1},
             {"emberps_table_admit_pending_total", 1},
             {"emberps_table_admit_dropped_total", 1},
             {"emberps_table_nonfinite_skipped_total", 1},
             {"emberps_table_spilled_total", 1},
             {"emberps_table_cold_reads_total", 1}};
    /* Each table's stats once (they read-lock every shard), then printed metric by metric. */
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
        len = pc_prom_appendf(buf, cap, len, "# TYPE %s %s\n", m[k].name, kinds[m[k].kind]);
        for (size_t i = 0; i < n; i++) {
            const ps_table_stats_t st = ts.v[i].st;
            const char *nm = ts.v[i].name;
            switch (k) {
                case 0:
                    len = pc_prom_appendf(buf, cap, len, "%s{table=\"%s\"} %llu\n", m[k].name, nm,
                                          (unsigned long long)st.rows);
                    break;
                case 1:
                    len = pc_prom_appendf(buf, cap, len,
                                          "%s{table=\"%s\",kind=\"weights\"} %llu\n"
                                          "%s{table=\"%s\",kind=\"state\"} %llu\n"
                                          "%s{table=\"%s\",kind=\"overhead\"} %llu\n",
                                          m[k].name, nm, (unsigned long long)st.bytes_weights,
                                          m[k].name, nm, (unsigned long long)st.bytes_state,
                                          m[k].name, nm,
                                          (unsigned long long)(st.bytes_keys + st.bytes_meta +
                                                               st.bytes_index + st.bytes_sketch));
                    break;
                default: {
                    const uint64_t v[] = {0,
                                          0,
                                          st.pulled,
                                          st.pushed,
                                          st.looked_up,
                                          st.evicted_capacity + st.evicted_ttl,
                                          st.admit_pending,
                                          st.admit_dropped,
                                          st.nonfinite_skipped,
                                          st.spilled,
                                          st.cold_reads};
                    len = pc_prom_appendf(buf, cap, len, "%s{table=\"%s\"} %llu\n", m[k].name, nm,
                                          (unsigned long long)v[k]);
                }
            }
        }
    }
    free(ts.v);
    return len;
}

/* The checkpoint's id, 0 when none was written. */
static uint64_t checkpoint_now(server_t *s, const char *why) {
    if (!s->ck)
        return 0;
    ps_ckpt_result_t r;
    int rc = checkpoint_locked(s, &r);
    if (rc)
        PC_ERROR("checkpoint (%s) failed: %s", why, pc_strerror(rc));
    else
        PC_INFO("checkpoint %llu (%s): %llu rows, %.1f MB in %.2f s", (unsigned long long)r.id, why,
                (unsigned long long)r.rows, (double)r.bytes / 1e6, r.seconds);
    return rc ? 0 : r.id;
}

/* ---- hooks of the gRPC API ---- */
/* The gRPC service's call: the API's handlers over env. */
static void api_call(void *env, int method, const uint8_t *req, size_t len, bool admin,
                     ps_api_reply_t *out) {
    ps_api_call(env, method, req, len, admin, out);
}

static bool api_owns(void *ctx, const uint64_t *keys, size_t n) {
    server_t *s = ctx;
    return ps_dp_owns(s->dp, keys, n);
}

static int api_push(void *ctx, ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
                    size_t nf, ps_push_result_t *res, char *why, size_t cap) {
    server_t *s = ctx;
    return ps_dp_push(s->dp, t, keys, n, grads, nf, res, why, cap);
}

static char *api_map(void *ctx, uint64_t *version) {
    server_t *s = ctx;
    return ps_dp_map_text(s->dp, version);
}

static int api_checkpoint(void *ctx, ps_ckpt_result_t *r) {
    return checkpoint_locked(ctx, r);
}

/* Restore: RAM tables only (a cold tier's database is replaced only into an empty catalog). */
static int api_restore(void *ctx, uint64_t id, uint64_t *restored) {
    server_t *s = ctx;
    if (s->tier) {
        PC_WARN("restore while serving refused: this server has a cold tier (use --restore-id)");
        return PC_EUNSUPPORTED;
    }
    pthread_mutex_lock(&s->ckpt_mu);
    int rc = ps_ckpt_rollback(s->ck, id, restored);
    pthread_mutex_unlock(&s->ckpt_mu);
    if (rc)
        PC_ERROR("restore of checkpoint %llu failed: %s", (unsigned long long)id, pc_strerror(rc));
    else
        PC_WARN("restored checkpoint %llu while serving (a job rollback)",
                (unsigned long long)*restored);
    return rc;
}

static void on_ckpt_timer(uv_timer_t *t) {
    checkpoint_now(t->data, "periodic");
}

static int advance_one(void *ctx, ps_table_t *t) {
    (void)ctx;
    (void)ps_table_advance_clock(t, ps_table_clock(t) + 1);
    return 0;
}

/* Every table's clock one tick on (ps_catalog_each: the 257th table's too). */
static void on_clock_timer(uv_timer_t *t) {
    server_t *s = t->data;
    (void)ps_catalog_each(s->cat, advance_one, NULL);
}

/* Seconds since *t, which moves to now: one step of a stop. */
static double step_s(uint64_t *t) {
    const uint64_t now = pc_time_mono_ns();
    const double d = (double)(now - *t) * 1e-9;
    *t = now;
    return d;
}

/* The checkpoint of a stop (`why` names it in the log), when ckpt_on_exit: its id (0: none).
 * *rc becomes 1 when it was asked for and failed: the pushes since the last one are gone. */
static uint64_t exit_checkpoint(server_t *s, const char *why, int *rc) {
    const uint64_t last = s->cfg.ckpt_on_exit ? checkpoint_now(s, why) : 0;
    if (s->cfg.ckpt_on_exit && s->ck && !last)
        *rc = 1;
    return last;
}

static void on_stop_signal(uv_signal_t *h, int sig) {
    server_t *s = h->data;
    PC_INFO("signal %d: stopping", sig);
    const uint64_t t0 = pc_time_mono_ns();
    uint64_t t = t0;
    double took[6]; /* what each step took: a slow stop says where it waited */
    pc_metrics_stop(s->metrics);
    s->metrics = NULL;
    ps_grpc_set_serving(s->grpc, false); /* probes see NOT_SERVING, API calls are refused */
    if (s->cfg.port_file[0]) /* its ports stop serving: a script waiting for it must not read it */
        (void)remove(s->cfg.port_file);
    took[0] = step_s(&t);
    ps_repl_end_t end;
    ps_repl_stop(s->repl, &end); /* its lease runs out: the backups take over */
    s->repl = NULL;
    took[1] = step_s(&t);
    ps_dp_stop(s->dp); /* no more requests; those received are answered */
    s->dp = NULL;
    took[2] = step_s(&t);
    const uint64_t last = exit_checkpoint(s, "exit", &s->rc);
    took[3] = step_s(&t);
    ps_repl_record_end(&end, true, last); /* the next start knows what rows this run ended with */
    took[4] = step_s(&t);
    ps_grpc_stop(s->grpc); /* calls in flight are cancelled */
    s->grpc = NULL;
    took[5] = step_s(&t);
    if (pc_time_sec_since(t0) > 2)
        PC_WARN("stopping took %.1f s: metrics and serving %.2f, replication %.2f, data plane "
                "%.2f, exit checkpoint %.2f, run record %.2f, gRPC %.2f",
                pc_time_sec_since(t0), took[0], took[1], took[2], took[3], took[4], took[5]);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_usr1, NULL);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    /* libuv's handlers gone (their default actions back): another stop signal is noted, a
     * reload or checkpoint signal ignored, not a kill during the teardown */
    pc_stop_catch();
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    uv_close((uv_handle_t *)&s->ckpt_timer, NULL);
    uv_close((uv_handle_t *)&s->clock_timer, NULL);
}

static void on_usr1(uv_signal_t *h, int sig) {
    (void)sig;
    checkpoint_now(h->data, "SIGUSR1");
}

/* A map file reloaded without replication is this server's map at once: it must be newer than
 * the one it follows (clients adopt only newer ones: with an older or equal version they would
 * keep sending moved slots here, refused until their deadlines) and still name this server at
 * its index. (With replication the controller numbers it.) */
static bool map_follows(server_t *s, const pc_cluster_map_t *m) {
    uint64_t now = 0;
    free(ps_dp_map_text(s->dp, &now));
    char addr[PC_ADDR_MAX];
    const int self = self_index(&s->cfg, ps_dp_port(s->dp), m, addr);
    if (pc_cmap_version(m) <= now) {
        PC_ERROR("cluster map file %s: version %llu is not newer than the map followed (%llu): "
                 "not taken (raise version=)",
                 s->cfg.cluster_map_file, (unsigned long long)pc_cmap_version(m),
                 (unsigned long long)now);
        return false;
    }
    if (s->self >= pc_cmap_nservers(m) || self != (int)s->self) {
        PC_ERROR("cluster map file %s: server %u is not %s there: not taken (servers keep their "
                 "places in the list)",
                 s->cfg.cluster_map_file, s->self, addr);
        return false;
    }
    return true;
}

static void on_hup(uv_signal_t *h, int sig) {
    (void)sig;
    server_t *s = h->data;
    pc_cluster_map_t *m;
    if (!s->cfg.cluster_map_file[0])
        return;
    if (s->repl) { /* a file's map would change roles without a handover's cut: pushes lost */
        PC_ERROR("cluster map file %s: not reloaded: with --cluster-coordinator the map is the "
                 "servers' (failovers, resharding); move slots with psctl reshard",
                 s->cfg.cluster_map_file);
        return;
    }
    if (read_map(&s->cfg, (int)s->cfg.port, &m))
        return;
    if (!map_follows(s, m)) {
        pc_cmap_destroy(m);
        return;
    }
    int rc = ps_dp_set_map(s->dp, m);
    PC_INFO("cluster map reloaded: version %llu (%s)", (unsigned long long)pc_cmap_version(m),
            rc ? pc_strerror(rc) : "ok");
    pc_cmap_destroy(m);
}

/* path resolved as the file system would (links, "..", relative paths) into out, also when its
 * last components do not exist yet: the deepest existing ancestor resolved, the rest appended. */
static bool resolve_path(const char *path, char out[PATH_MAX]) {
    char head[PATH_MAX], tail[PATH_MAX] = "";
    if (snprintf(head, sizeof head, "%s%s", path[0] == '/' ? "" : "./", path) >= (int)sizeof head)
        return false;
    while (!realpath(head, out)) {
        char *slash = strrchr(head, '/');
        if (errno != ENOENT || !slash)
            return false;
        char t[PATH_MAX];
        if (snprintf(t, sizeof t, "%s%s", slash, tail) >= (int)sizeof t)
            return false;
        memcpy(tail, t, strlen(t) + 1);
        slash[slash == head] = '\0'; /* ("/" kept: it exists, as "." does) */
    }
    const size_t lo = strlen(out), skip = lo && out[lo - 1] == '/' && tail[0] == '/'; /* "/" */
    if (lo + strlen(tail + skip) >= PATH_MAX)
        return false;
    strcat(out, tail + skip);
    return true;
}

/* Whether directories a and b are one, or one lies inside the other (resolve_path). */
static bool dirs_nested(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    if (!resolve_path(a, ra) || !resolve_path(b, rb))
        return false; /* (the tier's and the checkpoints' own opens say what is wrong) */
    const size_t la = strlen(ra), lb = strlen(rb), l = la < lb ? la : lb;
    const char *longer = la < lb ? rb : ra;
    return !strncmp(ra, rb, l) && (la == lb || longer[l] == '/' || l == 1 /* "/" */);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    /* The stop signals are caught from the first step: one arriving while the server starts
     * ends the start at its next step, as a stop (exit checkpoint included when pushes were
     * taken). The default action killed it with acknowledged pushes unsaved; and as a
     * container's pid 1, whose default-action signals the kernel drops, a stop sent during a
     * restore (minutes) was lost: the server went on to serve until SIGKILL. One held for the
     * loop waited out a start retrying an unreachable coordinator (up to 20 quarter leases). */
    pc_stop_catch();
    /* a reload or a checkpoint asked for while a restore runs (minutes) is not a kill: the
     * default action of both; their handlers are installed once the tables are there */
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    server_t s = {0};
    s.start_ns = pc_time_mono_ns();
    pthread_mutex_init(&s.ckpt_mu, NULL);
    int rc = load_settings(&s.cfg, argc, argv);
    if (rc)
        return rc;
    if (s.cfg.print_config) {
        pc_settings_dump(k_settings, NSET, &s.cfg, stdout);
        return 0;
    }
    if ((rc = check_security(&s.cfg)))
        return rc;
    /* Its checkpoint directory is this server's alone: a second server on it (started twice by
     * mistake, or a restart while the old process still runs) would prune and overwrite its
     * checkpoints. Before anything else is touched (the port file is the first server's). */
    int ckpt_lock = -1; /* (held until the process ends) */
    long holder = 0;
    if (s.cfg.ckpt_dir[0] && (rc = pc_fs_lock_dir(s.cfg.ckpt_dir, &ckpt_lock, &holder))) {
        if (rc == PC_EEXIST)
            fprintf(stderr,
                    "ps-server: checkpoint directory %s is in use by another ps-server (pid "
                    "%ld): two servers must not share one\n",
                    s.cfg.ckpt_dir, holder);
        else
            fprintf(stderr, "ps-server: checkpoint directory %s: %s\n", s.cfg.ckpt_dir,
                    pc_strerror(rc));
        return 1; /* (a restart racing the old process' exit: systemd tries again) */
    }
    if (s.cfg.tier_dir[0] && s.cfg.ckpt_dir[0] && dirs_nested(s.cfg.tier_dir, s.cfg.ckpt_dir)) {
        fprintf(stderr,
                "ps-server: tier_dir %s and ckpt_dir %s overlap: the tier's directory is emptied "
                "at every start, and must not hold the checkpoints (nor be inside them)\n",
                s.cfg.tier_dir, s.cfg.ckpt_dir);
        return 2;
    }
    if (s.cfg.port_file[0]) /* an earlier run's (killed): written again once this one serves */
        (void)remove(s.cfg.port_file);
    pc_cluster_map_t *map = NULL;
    /* The map (and our index) first: logs carry the shard id. */
    if ((rc = read_map(&s.cfg, (int)s.cfg.port, &map)))
        return rc == PC_EIO ? 1 : 2; /* a file that cannot be read now (a restart may): not a
                                      * setting's error, which systemd does not restart */
    char addr[PC_ADDR_MAX];
    const int self = self_index(&s.cfg, (int)s.cfg.port, map, addr);
    if (self < 0) {
        fprintf(stderr, "ps-server: %s is not in the cluster map (set --server-index)\n", addr);
        return 2;
    }
    if ((size_t)self >= pc_cmap_nservers(map)) {
        fprintf(stderr, "ps-server: server_index %d: the map has %zu servers\n", self,
                pc_cmap_nservers(map));
        return 2;
    }
    char ident[64];
    snprintf(ident, sizeof ident, "ps-server[shard %d]", self);
    pc_log_init(NULL, (pc_log_level_t)s.cfg.log_level, ident);

    rc = ps_catalog_create(&s.cat) ? 1 : 0;
    if (!rc)
        ps_catalog_set_changelog(s.cat, (size_t)s.cfg.delta_log_entries);
    if (!rc && s.cfg.tier_dir[0]) {
        ps_tier_opts_t to = {.dir = s.cfg.tier_dir,
                             .cache_bytes = (uint64_t)s.cfg.tier_cache_bytes,
                             .min_free_bytes = (uint64_t)s.cfg.tier_min_free_bytes};
        if ((rc = ps_tier_open(&to, &s.tier)))
            PC_ERROR("tier %s: %s", s.cfg.tier_dir, pc_strerror(rc));
        else
            ps_tier_bind_catalog(s.tier, s.cat);
        rc = rc ? 1 : 0;
    }
    if (!rc && s.cfg.ckpt_dir[0]) {
        ps_ckpt_opts_t co = {.dir = s.cfg.ckpt_dir,
                             .keep = (uint32_t)s.cfg.ckpt_keep,
                             .full_every = (uint32_t)s.cfg.ckpt_full_every,
                             .tier = s.tier};
        uint64_t id = 0;
        if (ps_ckpt_create(s.cat, &co, &s.ck)) {
            rc = 1;
        } else {
            int r = ps_ckpt_rollback(s.ck, (uint64_t)s.cfg.restore_id, &id);
            s.restored = r == 0 ? id : 0;
            if (r == 0)
                PC_INFO("restored checkpoint %llu", (unsigned long long)id);
            else if (r == PC_ECORRUPT && !s.cfg.restore_id) {
                PC_ERROR("restore from %s failed: no checkpoint there verifies (the warnings "
                         "above say why); the server does not start empty over them: restore "
                         "the files, or move the directory aside to start anew",
                         s.cfg.ckpt_dir);
                rc = 1;
            } else if (r != PC_ENOTFOUND || s.cfg.restore_id) {
                PC_ERROR("restore from %s failed: %s", s.cfg.ckpt_dir, pc_strerror(r));
                rc = 1;
            } else {
                PC_WARN("no checkpoint in %s: the tables start empty", s.cfg.ckpt_dir);
            }
        }
    } else if (!rc && s.cfg.ckpt_interval_s > 0) { /* (it checkpointed nothing, silently) */
        PC_WARN("--ckpt-interval-s=%lld without --ckpt-dir: no checkpoints are written",
                (long long)s.cfg.ckpt_interval_s);
    }
    if (!rc)
        rc = table_specs(&s.cfg, &s);
    s.loop = uv_default_loop();
    uv_signal_init(s.loop, &s.sig_term);
    uv_signal_init(s.loop, &s.sig_int);
    uv_signal_init(s.loop, &s.sig_usr1);
    uv_signal_init(s.loop, &s.sig_hup);
    s.sig_term.data = s.sig_int.data = s.sig_usr1.data = s.sig_hup.data = &s;
    uv_signal_start(&s.sig_usr1, on_usr1, SIGUSR1);
    uv_signal_start(&s.sig_hup, on_hup, SIGHUP);
    ps_dp_opts_t dpo = {.host = s.cfg.host,
                        .port = (int)s.cfg.port,
                        .threads = (int)s.cfg.io_threads,
                        .token = s.cfg.token,
                        .tls_cert = s.cfg.tls_cert,
                        .tls_key = s.cfg.tls_key,
                        .tls_ca = s.cfg.tls_ca,
                        .tls_client_auth = s.cfg.tls_client_auth,
                        .lim = {(uint32_t)s.cfg.max_body_bytes, (uint32_t)s.cfg.max_batch_keys,
                                (uint32_t)s.cfg.max_reply_bytes},
                        .self = (uint32_t)self,
                        .reply_queue = (uint64_t)s.cfg.reply_queue_bytes,
                        .reply_queue_total = (uint64_t)s.cfg.reply_queue_total_bytes,
                        .ack_timeout_ms = (uint64_t)s.cfg.ack_timeout_ms,
                        .fenced = s.cfg.cluster_coordinator[0] != '\0',
                        .poll_us = (uint32_t)s.cfg.poll_us,
                        .dead_peer_ms = (uint32_t)s.cfg.dead_peer_ms,
                        .hello_ms = (uint32_t)s.cfg.hello_timeout_ms,
                        .frame_ms = (uint32_t)s.cfg.frame_timeout_ms,
                        .body_total = (uint64_t)s.cfg.body_total_bytes};
    if (going_on(rc) && (rc = ps_dp_start(s.cat, map, &dpo, &s.dp)))
        rc = 1;
    if (going_on(rc) && s.cfg.port == 0 && !s.cfg.cluster_map[0] && !s.cfg.cluster_map_file[0]) {
        /* A lone server on a free port: its map names the port it got. */
        s.cfg.port = ps_dp_port(s.dp);
        pc_cmap_destroy(map);
        if (read_map(&s.cfg, (int)s.cfg.port, &map) == 0)
            ps_dp_set_map(s.dp, map);
    }
    s.self = (uint32_t)self;
    if (going_on(rc) && s.cfg.coordinator && open_coord_store(&s.cfg, &s.coord, &s.api_coord))
        rc = 1;
    if (going_on(rc) && s.cfg.cluster_coordinator[0])
        rc = start_repl(&s, map);
    pc_cmap_destroy(map);
    ps_api_env_t env = {.cat = s.cat,
                        .max_keys = (uint32_t)s.cfg.max_batch_keys,
                        /* a gRPC reply is also one message: max_body_bytes bounds it too */
                        .max_reply = ps_api_max_reply((uint64_t)s.cfg.max_reply_bytes,
                                                      (uint64_t)s.cfg.max_body_bytes),
                        .ckpt_dir = s.cfg.ckpt_dir[0] ? s.cfg.ckpt_dir : NULL,
                        .shard = (uint32_t)self,
                        .start_ns = pc_time_mono_ns(),
                        .ctx = &s,
                        .owns = api_owns,
                        .push = api_push,
                        .map_text = api_map,
                        .checkpoint = s.ck ? api_checkpoint : NULL,
                        .restore = s.ck ? api_restore : NULL,
                        .coord = s.api_coord.ctx ? &s.api_coord
                                 : s.coord.ctx   ? &s.coord
                                                 : NULL};
    if (going_on(rc) && s.cfg.grpc_port >= 0) {
        char addr[128];
        snprintf(addr, sizeof addr, "%s:%d", s.cfg.host, (int)s.cfg.grpc_port);
        ps_grpc_opts_t go = {.addr = addr,
                             .threads = (int)s.cfg.grpc_threads,
                             .call_wait_ms = (uint32_t)s.cfg.grpc_call_wait_ms,
                             .token = s.cfg.token,
                             .admin_token = s.cfg.admin_token,
                             .max_message = (uint32_t)s.cfg.max_body_bytes,
                             .tls_cert = tls_on(&s.cfg) ? s.cfg.tls_cert : NULL,
                             .tls_key = s.cfg.tls_key,
                             .tls_ca = s.cfg.tls_ca,
                             .tls_client_auth = (ps_grpc_auth_t)s.cfg.tls_client_auth};
        static const char *const k_names[] = {"emberps.ParameterServer", "emberps.Coordinator",
                                              NULL};
        static const char *const k_names_plain[] = {"emberps.ParameterServer", NULL};
        ps_grpc_service_t svc = {.names = env.coord ? k_names : k_names_plain,
                                 .method = ps_api_method,
                                 .is_admin = ps_api_is_admin,
                                 .call = api_call,
                                 .ctx = &env};
        if (ps_grpc_start(&svc, &go, &s.grpc))
            rc = 1;
    }
    if (going_on(rc) && s.cfg.metrics_port >= 0 &&
        pc_metrics_start(s.cfg.host, (int)s.cfg.metrics_port,
                         (unsigned)s.cfg.metrics_max_connections, render_metrics, &s, &s.metrics))
        rc = 1;
    const int stop_sig = pc_stop_signal();
    if (rc || stop_sig) {
        pc_metrics_stop(s.metrics);
        ps_grpc_stop(s.grpc);
        ps_repl_end_t end;
        ps_repl_stop(s.repl, &end);
        ps_dp_stats_t ds = {0}; /* the data plane serves from its start: pushes it took before */
        if (s.dp)               /* a later step failed are written, as at a stop */
            ps_dp_stats(s.dp, &ds);
        ps_dp_stop(s.dp);
        int stop_rc = 0;
        const uint64_t last =
            ds.rows_pushed
                ? exit_checkpoint(&s, stop_sig ? "exit" : "a failed start, after pushes", &stop_rc)
                : 0;
        /* stopped after its lease took pushes: ended as a stop does (its rows in `last`) */
        ps_repl_record_end(&end, stop_sig && end.took_pushes, last);
        ps_ckpt_destroy(s.ck);
        ps_catalog_destroy(s.cat);
        ps_tier_close(s.tier);
        if (s.coord.ctx)
            s.coord.destroy(s.coord.ctx);
        if (s.api_coord.ctx)
            s.api_coord.destroy(s.api_coord.ctx);
        if (s.ccoord.ctx)
            s.ccoord.destroy(s.ccoord.ctx);
        if (stop_sig) { /* exits as a stop does: 1 when taken pushes could not be saved */
            PC_INFO("signal %d during the start: stopped", stop_sig);
            return stop_rc;
        }
        return rc;
    }
    ps_grpc_set_serving(s.grpc, true); /* tables restored, every listener up (before the port
                                          file: whoever reads it may call at once) */
    if (s.cfg.port_file[0]) {
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp", s.cfg.port_file);
        FILE *f = fopen(tmp, "w");
        bool ok = f != NULL; /* data plane, gRPC and metrics ports, one per line (0 when off) */
        if (f) {
            ok = fprintf(f, "%d\n%d\n%d\n", ps_dp_port(s.dp), s.grpc ? ps_grpc_port(s.grpc) : 0,
                         s.metrics ? pc_metrics_port(s.metrics) : 0) > 0;
            ok = fclose(f) == 0 && ok;
        }
        if (!ok || rename(tmp, s.cfg.port_file) != 0) /* whoever waits for it would time out */
            PC_ERROR("port file %s: %s (the server serves; scripts waiting for the file will not "
                     "see it)",
                     s.cfg.port_file, strerror(errno));
    }
    PC_INFO("serving on %s:%d (data plane), gRPC %d", s.cfg.host, ps_dp_port(s.dp),
            s.grpc ? ps_grpc_port(s.grpc) : -1);

    uv_timer_init(s.loop, &s.ckpt_timer);
    uv_timer_init(s.loop, &s.clock_timer);
    s.ckpt_timer.data = s.clock_timer.data = &s;
    if (s.ck && s.cfg.ckpt_interval_s > 0)
        uv_timer_start(&s.ckpt_timer, on_ckpt_timer, (uint64_t)s.cfg.ckpt_interval_s * 1000,
                       (uint64_t)s.cfg.ckpt_interval_s * 1000);
    if (s.cfg.clock_tick_s > 0)
        uv_timer_start(&s.clock_timer, on_clock_timer, (uint64_t)s.cfg.clock_tick_s * 1000,
                       (uint64_t)s.cfg.clock_tick_s * 1000);
    /* the loop's handlers from now on; a stop that came since the check above is re-raised
     * into them (the usual stop, in the loop) */
    uv_signal_start(&s.sig_term, on_stop_signal, SIGTERM);
    uv_signal_start(&s.sig_int, on_stop_signal, SIGINT);
    if (pc_stop_signal())
        raise(pc_stop_signal());
    uv_run(s.loop, UV_RUN_DEFAULT);
    uv_loop_close(s.loop);
    ps_ckpt_destroy(s.ck);
    ps_catalog_destroy(s.cat);
    ps_tier_close(s.tier);
    if (s.coord.ctx)
        s.coord.destroy(s.coord.ctx);
    if (s.api_coord.ctx)
        s.api_coord.destroy(s.api_coord.ctx);
    if (s.ccoord.ctx)
        s.ccoord.destroy(s.ccoord.ctx);
    PC_INFO("stopped");
    return s.rc;
}
