/* psctl: the command line of an EmberPS server's gRPC API.
 *
 *   psctl [--server=HOST:PORT] [--token=T] [--tls-ca=CA.pem [--tls-cert=C.pem --tls-key=K.pem]]
 *         [--json] [--timeout-ms=N] COMMAND [ARGS]
 *
 * Commands: health, probe [SERVICE], map, tables, create SPEC, drop NAME, reset NAME, stats NAME,
 * lookup NAME KEY..., key, checkpoint, checkpoints, restore ID, workers JOB, reshard ...
 * (live resharding, psctl_reshard.h); plot LOG OUT (a worker's metrics log drawn,
 * psctl_plot.h; no server); serve ... (a ps-serve replica's commands, psctl_serve.h).
 * Human-readable output by default, one JSON object with --json. Exit status: 0 done; 1 the
 * server refused (its status and message on stderr);
 * 2 bad usage; 3 the server could not be reached, or no TLS session could be set up with it
 * (PC_ETLS: its certificate did not verify, or it wanted a client certificate): either way no call
 * reached the API; 4 no answer before --timeout-ms: the call may have run (a checkpoint, a
 * create), look before retrying.
 */
#include "psctl_exit.h"

#include <ctype.h>
#include "emberps.pb-c.h"
#include "emberps/psgrpc.h"
#include "health.pb-c.h"
#include "pc_settings.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_feature.h"
#include "ps_api.h"
#include "ps_coord_remote.h"
#include "ps_mapstore.h"
#include "psctl_plot.h"
#include "psctl_reshard.h"
#include "psctl_serve.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
    char server[256];
    char coordinator[1024];
    char token[256];
    bool tls;
    char tls_ca[512], tls_cert[512], tls_key[512];
    bool json, csv_value;
    int64_t timeout_ms;
    char model[128];
} opts_t;

#define T opts_t
static const pc_setting_t k_opts[] = {
    PC_SETTING_STRING(T, server, "127.0.0.1:7500", "gRPC address of the server"),
    PC_SETTING_STRING(T, coordinator, "",
                      "workers: the coordinator, a ps-server's gRPC address or "
                      "etcd://HOST:PORT[,...][/PREFIX] (\"\": --server)"),
    PC_SETTING_SECRET(T, token, "token (x-emberps-token), or the admin token"),
    PC_SETTING_BOOL(T, tls, "false", "speak TLS, verifying the server with the system's roots"),
    PC_SETTING_STRING(T, tls_ca, "", "PEM CA the server's certificate chains to (TLS on)"),
    PC_SETTING_STRING(T, tls_cert, "", "PEM client certificate (servers with tls_client_auth)"),
    PC_SETTING_STRING(T, tls_key, "", "PEM private key of --tls-cert"),
    PC_SETTING_BOOL(T, json, "false", "print one JSON object"),
    PC_SETTING_BOOL(T, csv_value, "false", "key: the value is CSV text, not Criteo hex"),
    PC_SETTING_INT(T, timeout_ms, 1, 3600000, "10000", "deadline of the call"),
    PC_SETTING_STRING(T, model, "", "serve predict: the model's name (\"\": the one served)"),
};
#undef T
#define NOPTS (sizeof k_opts / sizeof k_opts[0])

static void usage(FILE *f) {
    fprintf(f, "usage: psctl [options] COMMAND [ARGS]\n\n"
               "commands:\n"
               "  health                 server status\n"
               "  probe [SERVICE]        grpc.health.v1 Check (no token needed): exit 0 when\n"
               "                         SERVING, 1 when not, 3 or 4 without an answer\n"
               "                         (SERVICE: \"\" or\n"
               "                         emberps.ParameterServer)\n"
               "  map                    the cluster map\n"
               "  tables                 list tables\n"
               "  create SPEC            create a table (\"name=emb,dim=16,optimizer=adagrad\";\n"
               "                         name= is required, keys: ps-server --help-tables)\n"
               "  drop NAME              drop a table\n"
               "  reset NAME             empty a table and clear its owner job (on this server:\n"
               "                         run it on every server of the cluster)\n"
               "  stats NAME             table statistics\n"
               "  lookup NAME KEY...     rows of keys (read-only)\n"
               "  key FIELD VALUE        the feature key of a Criteo (hex) or, with\n"
               "                         --csv-value, CSV categorical value; its slot and\n"
               "                         which server of the map owns it\n"
               "  checkpoint             write a checkpoint now\n"
               "  checkpoints            list checkpoints\n"
               "  restore ID             go back to checkpoint ID while serving (0: the newest;\n"
               "                         the newer ones are abandoned)\n"
               "  workers JOB            the job's workers and their membership leases, from\n"
               "                         --coordinator (a server's gRPC address or an etcd URL;\n"
               "                         default --server)\n"
               "  runs                   servers with --cluster-coordinator (from --coordinator):\n"
               "                         the map's version and unclean count, and how each\n"
               "                         server's last run ended (running: it runs, or crashed)\n"
               "  reshard add ADDR       live resharding (servers with --cluster-coordinator;\n"
               "  reshard remove ADDR    --coordinator as for workers): give a new server a\n"
               "  reshard status         share of the slots, or move every role of a server\n"
               "  reshard wait [SECONDS] away; status and wait: slots still moving\n"
               "  plot LOG OUT.svg|png   draw a ps-worker --metrics-log: loss and test AUC over\n"
               "                         the samples trained on (no server involved)\n"
               "  serve status           a ps-serve replica (--server=its gRPC address): model,\n"
               "                         version, live or pinned, each source's lag\n"
               "  serve versions         the versions it can load\n"
               "  serve load STEP        pin version STEP (0: the newest)\n"
               "  serve rollback [STEP]  pin STEP, or the version before the one served\n"
               "  serve follow           back to live rows and published models\n"
               "  serve predict FILE [N] score FILE's first N lines (default 8)\n\n"
               "options:\n");
    pc_settings_help(k_opts, NOPTS, f);
    fprintf(f,
            "\nTLS: a server with --tls-cert/--tls-key serves gRPC over TLS only: give --tls-ca\n"
            "(its CA), and --tls-cert/--tls-key when it requires client certificates.\n"
            "Each option also comes from the environment as PSCTL_NAME (PSCTL_TOKEN keeps the\n"
            "token out of the process list); a flag overrides it.\n"
            "exit status: 0 done, 1 refused by the server, 2 usage, 3 unreachable or TLS\n"
            "handshake failed (no call ran), 4 no answer within --timeout-ms (the call may\n"
            "have run: look before retrying)\n");
}

static opts_t g_o;
static psg_t *g_c;

/* Call method m with a packed request; the response bytes, or NULL: after printing why (and
 * setting *exit_code), or quietly when the error is `quiet` (non-zero: an expected answer, e.g.
 * PC_ENOTFOUND for an absent key). */
static uint8_t *call_quiet(int m, const ProtobufCMessage *req, size_t *len, int *exit_code,
                           int quiet) {
    size_t rl = protobuf_c_message_get_packed_size(req);
    uint8_t *rb = malloc(rl + 1);
    protobuf_c_message_pack(req, rb);
    uint8_t *resp;
    char msg[512];
    int st;
    int rc = psctl_request(g_c, ps_api_path((ps_api_method_t)m), rb, rl, (int)g_o.timeout_ms, &resp,
                           len, &st, msg, sizeof msg);
    free(rb);
    if (rc == 0 && !resp && (resp = malloc(1))) /* an empty reply is an empty message */
        *len = 0;
    if (rc == 0 || (quiet && rc == quiet))
        return rc ? NULL : resp;
    *exit_code = psctl_exit_of(rc);
    if (g_o.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "status", st);
        cJSON_AddStringToObject(o, "code", pc_err_name(rc));
        cJSON_AddStringToObject(o, "error", msg);
        char *t = cJSON_PrintUnformatted(o);
        printf("%s\n", t);
        cJSON_free(t);
        cJSON_Delete(o);
    }
    fprintf(stderr, "psctl: %s: status %d (%s): %s\n", ps_api_path((ps_api_method_t)m), st,
            pc_err_name(rc), msg);
    return NULL;
}

static uint8_t *call(int m, const ProtobufCMessage *req, size_t *len, int *exit_code) {
    return call_quiet(m, req, len, exit_code, 0);
}

/* A reply that did not unpack (or, lookup, whose rows do not fit): said once at the end, exit
 * 1; it was taken for success with nothing printed. */
static bool g_malformed;

static void *unpacked(void *p) {
    if (!p)
        g_malformed = true;
    return p;
}

static void emit(cJSON *o) {
    char *t = cJSON_PrintUnformatted(o);
    printf("%s\n", t);
    cJSON_free(t);
    cJSON_Delete(o);
}

/* psctl key: the key, its slot, and (from the server's map) the index of its owner. */
static int feature_key(const char *field_s, const char *value) {
    uint64_t field = 0, hex = 0;
    const size_t vl = strlen(value);
    bool ok = psctl_number(field_s, &field) && field < PC_FEATURE_FIELDS_MAX;
    /* a Criteo value as the worker reads it: 1-8 hex digits, nothing else (no sign, no 0x) */
    for (size_t i = 0; ok && !g_o.csv_value && i < vl; i++)
        ok = isxdigit((unsigned char)value[i]);
    if (ok && !g_o.csv_value) {
        hex = strtoull(value, NULL, 16);
        ok = vl >= 1 && vl <= 8;
    }
    if (!ok) {
        fprintf(stderr,
                "psctl: key FIELD VALUE: field 0..%d, value 1-8 hex digits (Criteo) or "
                "any text with --csv-value\n",
                PC_FEATURE_FIELDS_MAX - 1);
        return 2;
    }
    const uint64_t key = !g_o.csv_value ? pc_feature_key((uint32_t)field, hex)
                         : vl           ? pc_text_key((uint32_t)field, value, vl)
                                        : pc_missing_key((uint32_t)field); /* as the worker */
    int rc = 0, owner = -1;
    size_t len;
    Emberps__GetClusterMapRequest q = EMBERPS__GET_CLUSTER_MAP_REQUEST__INIT;
    Emberps__GetClusterMapResponse *p;
    /* (its failure is said on stderr only: the one JSON object printed is the key's) */
    const bool json = g_o.json;
    g_o.json = false;
    uint8_t *r = call(PS_API_GET_CLUSTER_MAP, &q.base, &len, &rc);
    g_o.json = json;
    if (r && (p = unpacked(emberps__get_cluster_map_response__unpack(NULL, len, r)))) {
        pc_cluster_map_t *m;
        if (pc_cmap_parse(p->map, &m, NULL, 0) == 0) {
            owner = (int)pc_cmap_key_owner(m, key);
            pc_cmap_destroy(m);
        }
        emberps__get_cluster_map_response__free_unpacked(p, NULL);
    }
    free(r);
    if (g_o.json) {
        cJSON *o = cJSON_CreateObject();
        char ks[24];
        snprintf(ks, sizeof ks, "%" PRIu64, key);
        cJSON_AddStringToObject(o, "key", ks);
        psctl_json_u64(o, "slot", pc_key_slot(key));
        cJSON_AddNumberToObject(o, "owner", owner);
        emit(o);
    } else {
        printf("%" PRIu64 " slot %u owner %d\n", key, pc_key_slot(key), owner);
    }
    return rc == 3 || rc == 4 ? 0 : rc; /* no answer: the key is still right, its owner -1 */
}

/* psctl probe: the standard health check of `service`; 0 when SERVING, else the exit code. */
static int probe(const char *service) {
    Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    q.service = (char *)service;
    const size_t n = grpc__health__v1__health_check_request__get_packed_size(&q);
    uint8_t *req = malloc(n + 1), *resp = NULL;
    grpc__health__v1__health_check_request__pack(&q, req);
    char msg[512];
    size_t len = 0;
    int st = 0;
    int rc = psg_request(g_c, "/grpc.health.v1.Health/Check", req, n, (int)g_o.timeout_ms, &resp,
                         &len, &st, msg, sizeof msg);
    free(req);
    Grpc__Health__V1__HealthCheckResponse *p =
        rc ? NULL : grpc__health__v1__health_check_response__unpack(NULL, len, resp);
    free(resp);
    if (!p) {
        fprintf(stderr, "psctl: grpc.health.v1.Health/Check: status %d (%s): %s\n", st,
                pc_err_name(rc ? rc : PC_EPARSE), rc ? msg : "malformed response");
        return psctl_exit_of(rc);
    }
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
        &grpc__health__v1__health_check_response__serving_status__descriptor, (int)p->status);
    const char *name = v ? v->name : "UNKNOWN";
    if (g_o.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", name);
        emit(o);
    } else {
        printf("%s\n", name);
    }
    rc = p->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? 0 : 1;
    grpc__health__v1__health_check_response__free_unpacked(p, NULL);
    return rc;
}

/* The value of key at the coordinator (a NUL-terminated copy in out, cut to cap - 1; "" when
 * absent: not an error here). 0 or the exit code, after printing why. */
static int kv_value(ps_coord_store_t *st, const char *where, const char *key, char *out,
                    size_t cap) {
    void *v = NULL;
    size_t len = 0;
    out[0] = '\0';
    int rc = st->get(st->ctx, key, &v, &len);
    if (rc == PC_ENOTFOUND)
        return 0;
    if (rc) {
        fprintf(stderr, "psctl: coordinator %s: %s: %s\n", where, key, pc_strerror(rc));
        return psctl_exit_of(rc);
    }
    snprintf(out, cap, "%.*s", (int)len, (const char *)v);
    free(v);
    return 0;
}

/* `workers JOB`: the key layout of worker/comm/pw_group.h ("<job>/runs", "<job>/run/<k>/cur",
 * ".../g/<G>" and ".../live/<rank>" holding each worker's heartbeat, a JSON object), read from
 * the coordinator: --coordinator (a ps-server's gRPC address or an etcd URL), else --server. */
/* The coordinator's store: --coordinator, else --server (*where). psctl's exit status. */
static int open_coordinator(const psg_opts_t *sec, ps_coord_store_t *st, const char **where) {
    *where = g_o.coordinator[0] ? g_o.coordinator : g_o.server;
    int rc = ps_coord_store_open(*where, sec, (int)g_o.timeout_ms, st);
    if (rc)
        fprintf(stderr, "psctl: coordinator %s: %s\n", *where, pc_strerror(rc));
    return rc ? 2 : 0;
}

static int workers(const char *job, const psg_opts_t *sec) {
    const char *where;
    ps_coord_store_t st;
    int rc = open_coordinator(sec, &st, &where);
    if (rc)
        return rc;
    char key[400], runs[32], cur[32], members[4096 * 5 + 1] = ""; /* pw_group's MAX_MEMBERS */
    snprintf(key, sizeof key, "%s/runs", job);
    rc = kv_value(&st, where, key, runs, sizeof runs);
    const unsigned long long run = strtoull(runs, NULL, 10);
    snprintf(key, sizeof key, "%s/run/%llu/cur", job, run);
    if (!rc)
        rc = kv_value(&st, where, key, cur, sizeof cur);
    if (!rc && cur[0]) {
        snprintf(key, sizeof key, "%s/run/%llu/g/%s", job, run, cur);
        rc = kv_value(&st, where, key, members, sizeof members);
    }
    snprintf(key, sizeof key, "%s/run/%llu/live/", job, run);
    pc_kv_entry_t *e = NULL;
    size_t n = 0;
    bool truncated;
    if (!rc && (rc = st.list(st.ctx, key, PS_COORD_LIST_MAX, &e, &n, &truncated))) {
        fprintf(stderr, "psctl: coordinator %s: %s: %s\n", where, key, pc_strerror(rc));
        rc = psctl_exit_of(rc);
    }
    st.destroy(st.ctx);
    if (rc)
        return rc;
    cJSON *o = cJSON_CreateObject(), *a = NULL;
    cJSON_AddStringToObject(o, "job", job);
    psctl_json_u64(o, "run", run);
    if (cur[0])
        psctl_json_u64(o, "generation", strtoull(cur, NULL, 10));
    cJSON_AddStringToObject(o, "members", members);
    a = cJSON_AddArrayToObject(o, "workers");
    if (!g_o.json)
        printf("job %s, run %llu, generation %s: workers %s\n%-5s %-11s %5s %10s %9s  %s\n", job,
               run, cur[0] ? cur : "-", members[0] ? members : "-", "rank", "state", "gen", "step",
               "lease", "host (pid)");
    for (size_t i = 0; i < n; i++) {
        cJSON *w = cJSON_ParseWithLength((const char *)e[i].value, e[i].len);
        if (!w || !cJSON_IsObject(w)) {
            cJSON_Delete(w);
            continue; /* not a heartbeat of this layout */
        }
        psctl_json_u64(w, "lease_left_ms", e[i].lease_left_ms);
        if (!g_o.json) {
            const cJSON *st = cJSON_GetObjectItem(w, "state"), *h = cJSON_GetObjectItem(w, "host");
            printf("%-5.0f %-11s %5.0f %10.0f %7.1f s  %s (%.0f)\n",
                   cJSON_GetNumberValue(cJSON_GetObjectItem(w, "rank")),
                   cJSON_IsString(st) ? st->valuestring : "?",
                   cJSON_GetNumberValue(cJSON_GetObjectItem(w, "gen")),
                   cJSON_GetNumberValue(cJSON_GetObjectItem(w, "step")), e[i].lease_left_ms / 1e3,
                   cJSON_IsString(h) ? h->valuestring : "?",
                   cJSON_GetNumberValue(cJSON_GetObjectItem(w, "pid")));
        }
        cJSON_AddItemToArray(a, w);
    }
    if (g_o.json)
        emit(o);
    else
        cJSON_Delete(o);
    pc_kv_entries_free(e, n);
    return 0;
}

/* `runs`: the newest map's version and unclean count, and each server's run record
 * (ps_mapstore.h), from the coordinator: --coordinator, else --server. */
static int runs(const psg_opts_t *sec) {
    const char *where;
    ps_coord_store_t st;
    int rc = open_coordinator(sec, &st, &where);
    if (rc)
        return rc;
    pc_cluster_map_t *m = NULL;
    pc_kv_entry_t *e = NULL;
    size_t n = 0;
    if ((rc = ps_mapstore_newest(&st, 0, 1, &m)) || (rc = ps_mapstore_runs(&st, &e, &n)))
        fprintf(stderr, "psctl: coordinator %s: %s\n", where, pc_strerror(rc));
    st.destroy(st.ctx);
    if (rc) {
        pc_cmap_destroy(m);
        return psctl_exit_of(rc);
    }
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "runs");
    psctl_json_u64(o, "map_version", m ? pc_cmap_version(m) : 0);
    psctl_json_u64(o, "unclean", m ? pc_cmap_unclean(m) : 0);
    if (!g_o.json)
        printf("map version %llu, unclean slots %llu\n%-24s %s\n",
               (unsigned long long)(m ? pc_cmap_version(m) : 0),
               (unsigned long long)(m ? pc_cmap_unclean(m) : 0), "server", "last run");
    for (size_t i = 0; i < n; i++) {
        const char *rec = e[i].value ? (const char *)e[i].value : "";
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "server", e[i].key);
        cJSON_AddStringToObject(r, "record", rec);
        cJSON_AddItemToArray(a, r);
        if (!g_o.json)
            printf("%-24s %s\n", e[i].key, rec);
    }
    if (g_o.json)
        emit(o);
    else
        cJSON_Delete(o);
    pc_kv_entries_free(e, n);
    pc_cmap_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    char err[256];
    pc_settings_defaults(k_opts, NOPTS, &g_o);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    int argi = 1;
    if (pc_settings_load_env(k_opts, NOPTS, &g_o, "PSCTL_", err, sizeof err) ||
        pc_settings_parse_args(k_opts, NOPTS, &g_o, argc, argv, &argi, err, sizeof err)) {
        fprintf(stderr, "psctl: %s\n", err);
        return 2;
    }
    if (argi >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[argi++];
    const int nargs = argc - argi;
    char **args = argv + argi;
    if (!strcmp(cmd, "plot")) { /* a worker's metrics log: no server involved */
        if (nargs == 2)
            return psctl_plot(args[0], args[1]);
        usage(stderr);
        return 2;
    }
    const psg_opts_t po = {.addr = g_o.server,
                           .token = g_o.token,
                           .max_message = 256u << 20,
                           .tls = g_o.tls,
                           .tls_ca = g_o.tls_ca,
                           .tls_cert = g_o.tls_cert,
                           .tls_key = g_o.tls_key};
    int crc = psg_create(&po, &g_c);
    if (crc) {
        fprintf(stderr,
                "psctl: cannot create a client for %s: %s (--tls-ca %s, --tls-cert %s, "
                "--tls-key %s; certificate and key go together; a token is at most 255 "
                "printable ASCII characters)\n",
                g_o.server, pc_strerror(crc), g_o.tls_ca[0] ? g_o.tls_ca : "-",
                g_o.tls_cert[0] ? g_o.tls_cert : "-", g_o.tls_key[0] ? g_o.tls_key : "-");
        return 2;
    }
    int rc = 0;
    size_t len;
    uint8_t *r = NULL;
    if (!strcmp(cmd, "health") && nargs == 0) {
        Emberps__HealthRequest q = EMBERPS__HEALTH_REQUEST__INIT;
        Emberps__HealthResponse *p;
        if ((r = call(PS_API_HEALTH, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__health_response__unpack(NULL, len, r)))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "status", p->status);
                psctl_json_u64(o, "shard", p->shard);
                psctl_json_u64(o, "uptime_s", p->uptime_s);
                psctl_json_u64(o, "tables", p->tables);
                emit(o);
            } else {
                printf("status: %s\nshard: %u\nuptime: %" PRIu64 " s\ntables: %" PRIu64 "\n",
                       p->status, p->shard, p->uptime_s, p->tables);
            }
            emberps__health_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "map") && nargs == 0) {
        Emberps__GetClusterMapRequest q = EMBERPS__GET_CLUSTER_MAP_REQUEST__INIT;
        Emberps__GetClusterMapResponse *p;
        if ((r = call(PS_API_GET_CLUSTER_MAP, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__get_cluster_map_response__unpack(NULL, len, r)))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "map", p->map);
                psctl_json_u64(o, "version", p->version);
                psctl_json_u64(o, "self", p->self);
                emit(o);
            } else {
                printf("%s\n(this server: index %u)\n", p->map, p->self);
            }
            emberps__get_cluster_map_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "tables") && nargs == 0) {
        Emberps__ListTablesRequest q = EMBERPS__LIST_TABLES_REQUEST__INIT;
        Emberps__ListTablesResponse *p;
        if ((r = call(PS_API_LIST_TABLES, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__list_tables_response__unpack(NULL, len, r)))) {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tables");
            for (size_t i = 0; i < p->n_tables; i++) {
                if (g_o.json)
                    cJSON_AddItemToArray(a, cJSON_CreateString(p->tables[i]));
                else
                    printf("%s\n", p->tables[i]);
            }
            if (g_o.json)
                emit(o);
            else
                cJSON_Delete(o);
            emberps__list_tables_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "create") && nargs == 1) {
        Emberps__CreateTableRequest q = EMBERPS__CREATE_TABLE_REQUEST__INIT;
        q.spec = args[0];
        Emberps__CreateTableResponse *p;
        if ((r = call(PS_API_CREATE_TABLE, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__create_table_response__unpack(NULL, len, r)))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "config", p->config);
                emit(o);
            } else {
                printf("created: %s\n", p->config);
            }
            emberps__create_table_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "drop") && nargs == 1) {
        Emberps__DropTableRequest q = EMBERPS__DROP_TABLE_REQUEST__INIT;
        q.table = args[0];
        if ((r = call(PS_API_DROP_TABLE, &q.base, &len, &rc))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "dropped", args[0]);
                emit(o);
            } else {
                printf("dropped %s\n", args[0]);
            }
        }
    } else if (!strcmp(cmd, "reset") && nargs == 1) {
        Emberps__ResetTableRequest q = EMBERPS__RESET_TABLE_REQUEST__INIT;
        q.table = args[0];
        Emberps__ResetTableResponse *p;
        if ((r = call(PS_API_RESET_TABLE, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__reset_table_response__unpack(NULL, len, r)))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "reset", args[0]);
                cJSON_AddStringToObject(o, "previous_owner", p->previous_owner);
                psctl_json_u64(o, "rows", p->rows);
                emit(o);
            } else {
                printf("reset %s (%" PRIu64 " rows, owner '%s')\n", args[0], p->rows,
                       p->previous_owner);
            }
            emberps__reset_table_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "stats") && nargs == 1) {
        Emberps__TableStatsRequest q = EMBERPS__TABLE_STATS_REQUEST__INIT;
        q.table = args[0];
        Emberps__TableStatsResponse *p;
        if ((r = call(PS_API_TABLE_STATS, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__table_stats_response__unpack(NULL, len, r)))) {
            const struct {
                const char *k;
                uint64_t v;
            } f[] = {{"rows", p->rows},
                     {"bytes_weights", p->bytes_weights},
                     {"bytes_state", p->bytes_state},
                     {"bytes_overhead", p->bytes_overhead},
                     {"pulled", p->pulled},
                     {"pushed", p->pushed},
                     {"looked_up", p->looked_up},
                     {"evicted", p->evicted},
                     {"nonfinite_skipped", p->nonfinite_skipped},
                     {"admit_pending", p->admit_pending},
                     {"spilled", p->spilled},
                     {"cold_reads", p->cold_reads},
                     {"version", p->version}};
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "config", p->config);
            cJSON_AddStringToObject(o, "owner", p->owner);
            if (!g_o.json)
                printf("config: %s\nowner: %s\n", p->config, p->owner[0] ? p->owner : "(none)");
            for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
                psctl_json_u64(o, f[i].k, f[i].v);
                if (!g_o.json)
                    printf("%s: %" PRIu64 "\n", f[i].k, f[i].v);
            }
            if (g_o.json)
                emit(o);
            else
                cJSON_Delete(o);
            emberps__table_stats_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "key") && nargs == 2) {
        rc = feature_key(args[0], args[1]);
    } else if (!strcmp(cmd, "lookup") && nargs >= 2) {
        Emberps__LookupRequest q = EMBERPS__LOOKUP_REQUEST__INIT;
        q.table = args[0];
        q.n_keys = (size_t)nargs - 1;
        q.keys = calloc(q.n_keys, sizeof *q.keys);
        for (size_t i = 0; i < q.n_keys; i++) {
            if (!psctl_number(args[1 + i], &q.keys[i])) {
                fprintf(stderr, "psctl: '%s' is not a key (unsigned 64-bit decimal)\n",
                        args[1 + i]);
                free(q.keys);
                psg_destroy(g_c);
                return 2;
            }
        }
        Emberps__LookupResponse *p;
        if ((r = call(PS_API_LOOKUP, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__lookup_response__unpack(NULL, len, r)))) {
            const float *rows = NULL;
            float *copy = malloc(p->rows.len + 1);
            if (copy && p->rows.len == q.n_keys * p->dim * sizeof(float)) {
                memcpy(copy, p->rows.data, p->rows.len);
                rows = copy;
            } else if (copy) {
                g_malformed = true;
            }
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "rows");
            for (size_t i = 0; rows && i < q.n_keys; i++) {
                const bool found = i < p->found.len && p->found.data[i];
                if (g_o.json) {
                    cJSON *e = cJSON_CreateObject();
                    cJSON_AddStringToObject(e, "key", args[1 + i]);
                    cJSON_AddBoolToObject(e, "found", found);
                    cJSON *v = cJSON_AddArrayToObject(e, "values");
                    for (uint32_t d = 0; d < p->dim; d++)
                        cJSON_AddItemToArray(v, cJSON_CreateNumber(rows[i * p->dim + d]));
                    cJSON_AddItemToArray(a, e);
                } else {
                    printf("%s%s:", args[1 + i], found ? "" : " (not found)");
                    for (uint32_t d = 0; d < p->dim; d++)
                        printf(" %.6g", rows[i * p->dim + d]);
                    printf("\n");
                }
            }
            if (g_o.json)
                emit(o);
            else
                cJSON_Delete(o);
            free(copy);
            emberps__lookup_response__free_unpacked(p, NULL);
        }
        free(q.keys);
    } else if (!strcmp(cmd, "checkpoint") && nargs == 0) {
        Emberps__CheckpointRequest q = EMBERPS__CHECKPOINT_REQUEST__INIT;
        Emberps__CheckpointResponse *p;
        if ((r = call(PS_API_CHECKPOINT, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__checkpoint_response__unpack(NULL, len, r)))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                psctl_json_u64(o, "id", p->id);
                cJSON_AddBoolToObject(o, "incremental", p->incremental);
                psctl_json_u64(o, "rows", p->rows);
                psctl_json_u64(o, "bytes", p->bytes);
                cJSON_AddNumberToObject(o, "seconds", p->seconds);
                emit(o);
            } else {
                printf("checkpoint %" PRIu64 " (%s): %" PRIu64 " rows, %" PRIu64 " bytes, %.2f s\n",
                       p->id, p->incremental ? "incremental" : "full", p->rows, p->bytes,
                       p->seconds);
            }
            emberps__checkpoint_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "checkpoints") && nargs == 0) {
        Emberps__ListCheckpointsRequest q = EMBERPS__LIST_CHECKPOINTS_REQUEST__INIT;
        Emberps__ListCheckpointsResponse *p;
        if ((r = call(PS_API_LIST_CHECKPOINTS, &q.base, &len, &rc)) &&
            (p = unpacked(emberps__list_checkpoints_response__unpack(NULL, len, r)))) {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "checkpoints");
            for (size_t i = 0; i < p->n_checkpoints; i++) {
                const Emberps__CheckpointInfo *c = p->checkpoints[i];
                if (g_o.json) {
                    cJSON *e = cJSON_CreateObject();
                    psctl_json_u64(e, "id", c->id);
                    psctl_json_u64(e, "parent", c->parent);
                    cJSON_AddBoolToObject(e, "incremental", c->incremental);
                    psctl_json_u64(e, "rows", c->rows);
                    psctl_json_u64(e, "bytes", c->bytes);
                    psctl_json_u64(e, "created_unix_ns", c->created_unix_ns);
                    cJSON_AddItemToArray(a, e);
                } else {
                    printf("%" PRIu64 "  %-11s parent %" PRIu64 "  %" PRIu64 " rows  %" PRIu64
                           " bytes\n",
                           c->id, c->incremental ? "incremental" : "full", c->parent, c->rows,
                           c->bytes);
                }
            }
            if (g_o.json)
                emit(o);
            else
                cJSON_Delete(o);
            emberps__list_checkpoints_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "restore") && nargs == 1) {
        Emberps__RestoreRequest q = EMBERPS__RESTORE_REQUEST__INIT;
        Emberps__RestoreResponse *p = NULL;
        if (!psctl_number(args[0], &q.id)) {
            fprintf(stderr, "psctl: restore: not a checkpoint id: %s\n", args[0]);
            rc = 2;
        } else if ((r = call(PS_API_RESTORE, &q.base, &len, &rc)) &&
                   (p = unpacked(emberps__restore_response__unpack(NULL, len, r)))) {
            if (g_o.json) {
                cJSON *o = cJSON_CreateObject();
                psctl_json_u64(o, "restored", p->id);
                cJSON_AddNumberToObject(o, "seconds", p->seconds);
                emit(o);
            } else {
                printf("restored checkpoint %" PRIu64 " in %.2f s\n", p->id, p->seconds);
            }
            emberps__restore_response__free_unpacked(p, NULL);
        }
    } else if (!strcmp(cmd, "probe") && nargs <= 1) {
        rc = probe(nargs ? args[0] : "");
    } else if (!strcmp(cmd, "workers") && nargs == 1) {
        rc = workers(args[0], &po);
    } else if (!strcmp(cmd, "runs") && nargs == 0) {
        rc = runs(&po);
    } else if (!strcmp(cmd, "reshard")) {
        psctl_reshard_opts_t ro = {.coordinator = g_o.coordinator[0] ? g_o.coordinator : g_o.server,
                                   .sec = &po,
                                   .timeout_ms = (int)g_o.timeout_ms,
                                   .json = g_o.json};
        rc = psctl_reshard(&ro, nargs, args);
    } else if (!strcmp(cmd, "serve")) {
        psctl_serve_opts_t so = {
            .c = g_c, .json = g_o.json, .timeout_ms = (int)g_o.timeout_ms, .model = g_o.model};
        rc = psctl_serve(&so, nargs, args);
    } else {
        fprintf(stderr, "psctl: unknown command or wrong arguments: %s\n", cmd);
        usage(stderr);
        rc = 2;
    }
    free(r);
    psg_destroy(g_c);
    if (g_malformed && !rc) {
        fprintf(stderr, "psctl: %s: malformed response\n", cmd);
        rc = 1;
    }
    return rc;
}
