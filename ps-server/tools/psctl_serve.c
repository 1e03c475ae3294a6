/* psctl_serve.c: see psctl_serve.h. One function per subcommand: build the request, call,
 * print. */
#include "psctl_serve.h"
#include "psctl_exit.h"

#include "emberps.pb-c.h"
#include "pc_error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SERVING "/emberps.Serving/"

/* Call `method` of emberps.Serving; the unpacked response, or NULL with *rc set (after saying
 * why on stderr). */
static void *call(const psctl_serve_opts_t *o, const char *method, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc, int *rc) {
    char path[128], msg[512];
    snprintf(path, sizeof path, SERVING "%s", method);
    const size_t rl = protobuf_c_message_get_packed_size(req);
    uint8_t *rb = malloc(rl + 1), *resp = NULL;
    size_t len = 0;
    int st = 0, e = rb ? 0 : PC_ENOMEM;
    if (rb) {
        protobuf_c_message_pack(req, rb);
        e = psctl_request(o->c, path, rb, rl, o->timeout_ms, &resp, &len, &st, msg, sizeof msg);
    }
    free(rb);
    if (e) {
        *rc = psctl_exit_of(e);
        fprintf(stderr, "psctl: %s: status %d (%s): %s\n", path, st, pc_err_name(e),
                rb ? msg : "out of memory");
        return NULL;
    }
    void *p = protobuf_c_message_unpack(resp_desc, NULL, len, resp);
    free(resp);
    if (!p) {
        fprintf(stderr, "psctl: %s: malformed response\n", path);
        *rc = 1;
    }
    return p;
}

static void emit(cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    printf("%s\n", t);
    cJSON_free(t);
    cJSON_Delete(j);
}

static int status(const psctl_serve_opts_t *o) {
    Emberps__ServeStatusRequest q = EMBERPS__SERVE_STATUS_REQUEST__INIT;
    int rc = 0;
    Emberps__ServeStatusResponse *p =
        call(o, "ServeStatus", &q.base, &emberps__serve_status_response__descriptor, &rc);
    if (!p)
        return rc;
    if (o->json) {
        cJSON *j = cJSON_CreateObject(), *a;
        cJSON_AddStringToObject(j, "model", p->model);
        psctl_json_u64(j, "model_version", p->model_version);
        cJSON_AddBoolToObject(j, "pinned", p->pinned);
        psctl_json_u64(j, "rows", p->rows);
        psctl_json_u64(j, "predictions", p->predictions);
        psctl_json_u64(j, "swaps", p->swaps);
        psctl_json_u64(j, "refused_versions", p->refused_versions);
        cJSON_AddStringToObject(j, "last_refusal", p->last_refusal);
        psctl_json_u64(j, "map_version", p->map_version);
        psctl_json_u64(j, "relayouts", p->relayouts);
        a = cJSON_AddArrayToObject(j, "sources");
        for (size_t i = 0; i < p->n_sources; i++) {
            const Emberps__ServeSource *s = p->sources[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "server", s->server);
            cJSON_AddStringToObject(e, "state", s->state);
            psctl_json_u64(e, "position", s->position);
            psctl_json_u64(e, "head", s->head);
            psctl_json_u64(e, "lag_entries", s->lag_entries);
            cJSON_AddNumberToObject(e, "lag_ms", s->lag_ms);
            psctl_json_u64(e, "rows_applied", s->rows_applied);
            psctl_json_u64(e, "rescans", s->rescans);
            cJSON_AddStringToObject(e, "error", s->error);
            cJSON_AddItemToArray(a, e);
        }
        emit(j);
    } else {
        printf("model %s, version %" PRIu64 " (%s); %" PRIu64 " rows, %" PRIu64
               " samples scored, %" PRIu64 " swaps, %" PRIu64 " refused%s%s\n",
               p->model, p->model_version, p->pinned ? "pinned" : "live", p->rows, p->predictions,
               p->swaps, p->refused_versions, p->last_refusal[0] ? ": " : "", p->last_refusal);
        if (p->map_version)
            printf("  following the layout of the servers' map version %" PRIu64 " (%" PRIu64
                   " new layouts after map changes)\n",
                   p->map_version, p->relayouts);
        for (size_t i = 0; i < p->n_sources; i++) {
            const Emberps__ServeSource *s = p->sources[i];
            printf("  %s: %s, position %" PRIu64 " of %" PRIu64 " (lag %" PRIu64
                   " entries, %.0f ms), %" PRIu64 " rows applied, %" PRIu64 " rescans%s%s\n",
                   s->server, s->state, s->position, s->head, s->lag_entries, s->lag_ms,
                   s->rows_applied, s->rescans, s->error[0] ? "; last error: " : "", s->error);
        }
    }
    emberps__serve_status_response__free_unpacked(p, NULL);
    return 0;
}

/* The versions, oldest first (NULL with *rc on failure). */
static Emberps__ListVersionsResponse *versions_of(const psctl_serve_opts_t *o, int *rc) {
    Emberps__ListVersionsRequest q = EMBERPS__LIST_VERSIONS_REQUEST__INIT;
    return call(o, "ListVersions", &q.base, &emberps__list_versions_response__descriptor, rc);
}

static int versions(const psctl_serve_opts_t *o) {
    int rc = 0;
    Emberps__ListVersionsResponse *p = versions_of(o, &rc);
    if (!p)
        return rc;
    cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "versions");
    for (size_t i = 0; i < p->n_versions; i++) {
        const Emberps__ServeVersion *v = p->versions[i];
        if (o->json) {
            cJSON *e = cJSON_CreateObject();
            psctl_json_u64(e, "step", v->step);
            cJSON_AddBoolToObject(e, "loaded", v->loaded);
            psctl_json_u64(e, "created_unix_ns", v->created_unix_ns);
            cJSON_AddItemToArray(a, e);
        } else {
            printf("%" PRIu64 "%s\n", v->step, v->loaded ? "  (pinned now)" : "");
        }
    }
    if (o->json)
        emit(j);
    else
        cJSON_Delete(j);
    emberps__list_versions_response__free_unpacked(p, NULL);
    return 0;
}

static int load(const psctl_serve_opts_t *o, uint64_t step) {
    Emberps__LoadVersionRequest q = EMBERPS__LOAD_VERSION_REQUEST__INIT;
    q.step = step;
    int rc = 0;
    Emberps__LoadVersionResponse *p =
        call(o, "LoadVersion", &q.base, &emberps__load_version_response__descriptor, &rc);
    if (!p)
        return rc;
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        psctl_json_u64(j, "step", p->step);
        cJSON_AddNumberToObject(j, "seconds", p->seconds);
        emit(j);
    } else {
        printf("version %" PRIu64 " pinned (loaded in %.2f s)\n", p->step, p->seconds);
    }
    emberps__load_version_response__free_unpacked(p, NULL);
    return 0;
}

/* rollback: the version before the pinned one (or before the newest when none is pinned). */
static int rollback(const psctl_serve_opts_t *o) {
    int rc = 0;
    Emberps__ListVersionsResponse *p = versions_of(o, &rc);
    if (!p)
        return rc;
    size_t at = p->n_versions; /* the pinned one's index, or the end */
    for (size_t i = 0; i < p->n_versions; i++)
        if (p->versions[i]->loaded)
            at = i;
    if (at == p->n_versions && at > 0)
        at--; /* live: the newest version is what the live state started from */
    const uint64_t step = at > 0 ? p->versions[at - 1]->step : 0;
    emberps__list_versions_response__free_unpacked(p, NULL);
    if (!step) {
        fprintf(stderr, "psctl: serve rollback: no older version to go back to\n");
        return 1;
    }
    return load(o, step);
}

static int follow(const psctl_serve_opts_t *o) {
    Emberps__FollowRequest q = EMBERPS__FOLLOW_REQUEST__INIT;
    int rc = 0;
    Emberps__FollowResponse *p =
        call(o, "Follow", &q.base, &emberps__follow_response__descriptor, &rc);
    if (!p)
        return rc;
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        psctl_json_u64(j, "model_version", p->model_version);
        emit(j);
    } else {
        printf("following (model version %" PRIu64 ")\n", p->model_version);
    }
    emberps__follow_response__free_unpacked(p, NULL);
    return 0;
}

/* Score the first n lines of path. */
static int predict(const psctl_serve_opts_t *o, const char *path, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "psctl: serve predict: %s: %s\n", path, strerror(errno));
        return 1;
    }
    char **lines = calloc(n, sizeof *lines);
    size_t got = 0, cap = 0;
    char *line = NULL;
    ssize_t ll;
    while (lines && got < n && (ll = getline(&line, &cap, f)) >= 0) {
        while (ll > 0 && (line[ll - 1] == '\n' || line[ll - 1] == '\r'))
            line[--ll] = '\0';
        if (ll > 0 && !(lines[got++] = strdup(line)))
            break;
    }
    free(line);
    fclose(f);
    int rc = 0;
    if (!lines || !got) {
        fprintf(stderr, "psctl: serve predict: %s: no lines\n", path);
        rc = 1;
    }
    Emberps__PredictRequest q = EMBERPS__PREDICT_REQUEST__INIT;
    q.model = (char *)(o->model ? o->model : "");
    q.n_lines = got;
    q.lines = lines;
    Emberps__PredictResponse *p =
        rc ? NULL : call(o, "Predict", &q.base, &emberps__predict_response__descriptor, &rc);
    if (p) {
        cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "scores"), *w;
        for (size_t i = 0; i < p->n_scores; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(p->scores[i]));
        psctl_json_u64(j, "model_version", p->model_version);
        cJSON_AddBoolToObject(j, "pinned", p->pinned);
        w = cJSON_AddArrayToObject(j, "sparse_positions");
        for (size_t i = 0; i < p->n_sparse_positions; i++)
            cJSON_AddItemToArray(w, cJSON_CreateNumber((double)p->sparse_positions[i]));
        if (o->json) {
            emit(j);
        } else {
            cJSON_Delete(j);
            for (size_t i = 0; i < p->n_scores; i++)
                printf("%.9g\n", p->scores[i]);
            printf("model version %" PRIu64 " (%s), sparse positions", p->model_version,
                   p->pinned ? "pinned" : "live");
            for (size_t i = 0; i < p->n_sparse_positions; i++)
                printf(" %" PRIu64, p->sparse_positions[i]);
            printf("\n");
        }
        emberps__predict_response__free_unpacked(p, NULL);
    }
    for (size_t i = 0; lines && i < got; i++)
        free(lines[i]);
    free(lines);
    return rc;
}

int psctl_serve(const psctl_serve_opts_t *o, int nargs, char **args) {
    const char *sub = nargs ? args[0] : "";
    uint64_t v = 0;
    if (!strcmp(sub, "status") && nargs == 1)
        return status(o);
    if (!strcmp(sub, "versions") && nargs == 1)
        return versions(o);
    if (!strcmp(sub, "load") && nargs == 2 && psctl_number(args[1], &v))
        return load(o, v);
    if (!strcmp(sub, "rollback") && nargs == 1)
        return rollback(o);
    if (!strcmp(sub, "rollback") && nargs == 2 && psctl_number(args[1], &v))
        return load(o, v);
    if (!strcmp(sub, "follow") && nargs == 1)
        return follow(o);
    if (!strcmp(sub, "predict") && (nargs == 2 || (nargs == 3 && psctl_number(args[2], &v) && v)))
        return predict(o, args[1], nargs == 3 ? (size_t)v : 8);
    fprintf(stderr, "psctl: serve: status | versions | load STEP | rollback [STEP] | follow | "
                    "predict FILE [N]\n");
    return 2;
}
