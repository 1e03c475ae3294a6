/* pw_jobckpt.c: see pw_jobckpt.h. */
#include "pw_jobckpt.h"

#include "emberps.pb-c.h"
#include "emberps/psgrpc.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_model_io.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A manifest's largest size: its numbers, every server's directory and the map */
#define MANIFEST_MAX (1u << 20)

/* psg_request_busy's word that a server is asked again (ctx: its address). */
static void said_busy(void *ctx, const char *path, int left_ms) {
    PC_WARN("job checkpoint: server %s, %s: busy with other administrative calls; asking again "
            "for up to %d ms",
            (const char *)ctx, path, left_ms);
}

/* One unary call to the server at addr: the unpacked response (free with
 * protobuf_c_message_free_unpacked) or an error, logged (but PC_EUNAVAIL when `quiet`). With
 * busy_again, a server busy with other administrative calls (an operator's psctl) is asked again
 * until timeout_ms has passed in all (a caller that asks again itself passes false). */
static int call_server(const char *addr, const psg_opts_t *sec, const char *method,
                       const ProtobufCMessage *q, const ProtobufCMessageDescriptor *rd,
                       int timeout_ms, bool quiet, bool busy_again, ProtobufCMessage **out) {
    psg_opts_t o = {0};
    if (sec)
        o = *sec;
    o.addr = addr;
    o.max_message = 1u << 20;
    psg_t *g;
    int rc = psg_create(&o, &g);
    if (rc) {
        PC_ERROR("job checkpoint: server %s: cannot create a gRPC client: %s", addr,
                 pc_strerror(rc));
        return rc;
    }
    uint8_t req[64], *resp = NULL;
    size_t rlen = 0, len = protobuf_c_message_pack(q, req); /* small requests */
    char msg[256] = "";
    int st = 0;
    rc = busy_again
             ? psg_request_busy(g, method, req, len, timeout_ms, &resp, &rlen, &st, msg, sizeof msg,
                                said_busy, (void *)addr)
             : psg_request(g, method, req, len, timeout_ms, &resp, &rlen, &st, msg, sizeof msg);
    psg_destroy(g);
    *out = rc ? NULL : protobuf_c_message_unpack(rd, NULL, rlen, resp);
    free(resp);
    if (!*out) {
        if (!quiet || rc != PC_EUNAVAIL)
            PC_ERROR("job checkpoint: server %s, %s: status %d %s", addr, method, st, msg);
        return rc ? rc : PC_ECORRUPT;
    }
    return 0;
}

/* Restore checkpoint `id` on the server at addr. One that answers UNAVAILABLE (it cannot be
 * reached, restarting after the failure that called for the rollback, or its administrative
 * calls' share of handler threads is taken) is asked again every 200 ms for up to wait_ms. */
static int restore_one(const char *addr, const psg_opts_t *sec, int timeout_ms, int wait_ms,
                       uint64_t id, ProtobufCMessage **out) {
    Emberps__RestoreRequest q = EMBERPS__RESTORE_REQUEST__INIT;
    q.id = id;
    const uint64_t t0 = pc_time_mono_ns();
    for (bool said = false;; said = true) {
        const bool last = pc_time_sec_since(t0) * 1000 >= wait_ms;
        int rc = call_server(addr, sec, "/emberps.ParameterServer/Restore", &q.base,
                             &emberps__restore_response__descriptor, timeout_ms, !last, false, out);
        if (rc != PC_EUNAVAIL || last)
            return rc;
        if (!said)
            PC_WARN("job checkpoint: server %s cannot be reached or is busy; asking again for up "
                    "to %d ms for it to restore checkpoint %llu",
                    addr, wait_ms, (unsigned long long)id);
        pc_time_sleep_ms(200);
    }
}

bool pw_jobckpt_list_ok(const char *grpc) {
    const size_t len = grpc ? strlen(grpc) : 0;
    return !len || (grpc[0] != ',' && grpc[len - 1] != ',' && !strstr(grpc, ",,"));
}

/* Server i of the comma-separated list: a restore of restore->servers[i] (restore not NULL,
 * waiting up to wait_ms for a server that cannot be reached), or a checkpoint, its id into
 * taken->servers[i]. The list is checked before any call: an empty entry ("a,,b", "a,"), or a
 * restore with another number of servers than the checkpoint has, calls none (PC_EINVAL). */
static int each_server(const char *grpc, const psg_opts_t *sec, int timeout_ms, int wait_ms,
                       const pw_jobckpt_t *restore, pw_jobckpt_t *taken) {
    size_t naddr = grpc && *grpc ? 1 : 0;
    for (const char *p = grpc; p && *p; p++)
        naddr += *p == ',';
    if (naddr == 0 || !pw_jobckpt_list_ok(grpc) || (restore && naddr != restore->nservers))
        return PC_EINVAL;
    if (naddr > PW_JOBCKPT_MAX_SERVERS)
        return PC_ETOOBIG;
    char *list = strdup(grpc), *save = NULL;
    if (!list)
        return PC_ENOMEM;
    int rc = 0;
    size_t i = 0;
    for (char *a = strtok_r(list, ",", &save); a && !rc; a = strtok_r(NULL, ",", &save), i++) {
        ProtobufCMessage *p;
        if (restore) {
            rc = restore_one(a, sec, timeout_ms, wait_ms, restore->servers[i], &p);
        } else { /* one call (a busy server asked again within it): the members wait for rank 0
                  * a bounded time (pw__job_checkpoint) */
            Emberps__CheckpointRequest q = EMBERPS__CHECKPOINT_REQUEST__INIT;
            rc =
                call_server(a, sec, "/emberps.ParameterServer/Checkpoint", &q.base,
                            &emberps__checkpoint_response__descriptor, timeout_ms, false, true, &p);
            if (!rc) {
                const Emberps__CheckpointResponse *r = (const Emberps__CheckpointResponse *)p;
                taken->servers[i] = r->id;
                if (r->dir && r->dir[0] && pw_jobckpt_server_dir_set(taken, i, r->dir))
                    PC_WARN("job checkpoint: server %s: its directory is not kept (too long, "
                            "or a newline in it): %.200s",
                            a, r->dir);
                if (!r->id) { /* (a manifest naming it could never be read) */
                    PC_ERROR("job checkpoint: server %s answered without a checkpoint id", a);
                    protobuf_c_message_free_unpacked(p, NULL);
                    rc = PC_ECORRUPT;
                    break;
                }
            }
        }
        if (!rc)
            protobuf_c_message_free_unpacked(p, NULL);
    }
    free(list);
    if (!rc && i != naddr)
        rc = PC_EINVAL; /* an empty entry ("a,,b") */
    if (!rc && !restore)
        taken->nservers = i;
    return rc;
}

/* ---- server directories ---- */

const char *pw_jobckpt_server_dir(const pw_jobckpt_t *ck, size_t i) {
    return i < PW_JOBCKPT_MAX_SERVERS && ck->dir_off[i] ? ck->dirs + ck->dir_off[i] : "";
}

int pw_jobckpt_server_dir_set(pw_jobckpt_t *ck, size_t i, const char *path) {
    if (!ck || !path || i >= PW_JOBCKPT_MAX_SERVERS || strchr(path, '\n'))
        return PC_EINVAL;
    const size_t len = strlen(path);
    if (len >= PW_JOBCKPT_DIR_MAX)
        return PC_EINVAL;
    if (len == 0) {
        ck->dir_off[i] = 0;
        return 0;
    }
    const size_t at = ck->dirs_used ? ck->dirs_used : 1; /* offset 0 means none */
    if (at + len + 1 > sizeof ck->dirs)
        return PC_ETOOBIG;
    memcpy(ck->dirs + at, path, len + 1);
    ck->dir_off[i] = (uint32_t)at;
    ck->dirs_used = at + len + 1;
    return 0;
}

/* ---- servers ---- */

int pw_jobckpt_servers(const char *grpc, const psg_opts_t *sec, int timeout_ms, pw_jobckpt_t *ck) {
    return each_server(grpc, sec, timeout_ms, 0, NULL, ck);
}

int pw_jobckpt_restore_servers(const char *grpc, const psg_opts_t *sec, int timeout_ms, int wait_ms,
                               const pw_jobckpt_t *ck) {
    return each_server(grpc, sec, timeout_ms, wait_ms, ck, NULL);
}

int pw_jobckpt_write(const char *dir, const pw_jobckpt_t *ck, const float *state, size_t n,
                     const pw_model_t *model, const pw_model_card_t *card, int keep) {
    if (!dir || !dir[0] || !ck || keep < 1 || !model != !card)
        return PC_EINVAL;
    /* The step's directory is made whole aside (step-S.tmp) and renamed into place: a step
     * written again (a rollback reached S again) never shows a mix of two writes to serving,
     * which takes the highest step with a manifest, model and card. */
    char fin[4096], sdir[4100], path[4200];
    snprintf(fin, sizeof fin, "%s/step-%020" PRIu64, dir, ck->step);
    snprintf(sdir, sizeof sdir, "%s.tmp", fin);
    pc_fs_remove_tmp_numbered(dir, "step-"); /* a crash's leftovers, of any step */
    int rc = pc_fs_mkdirs(sdir);
    snprintf(path, sizeof path, "%s/dense.state", sdir);
    if (!rc)
        rc = pw_state_save(path, state, n);
    snprintf(path, sizeof path, "%s/model", sdir);
    if (!rc && model)
        rc = pw_model_save(model, path);
    snprintf(path, sizeof path, "%s/card", sdir);
    if (!rc && card)
        rc = pw_model_card_write(path, card);
    const size_t cap = 64 + 24 * (ck->nservers + ck->nranks) + 32 * ck->nservers + ck->dirs_used +
                       strnlen(ck->map, sizeof ck->map) + sizeof ck->run + PC_FS_SEAL_LEN;
    char *m = malloc(cap);
    if (!rc && !m)
        rc = PC_ENOMEM;
    if (!rc) {
        size_t len = (size_t)snprintf(m, cap, "emberps-job-checkpoint 2\nstep %" PRIu64 "\nservers",
                                      ck->step);
        for (size_t i = 0; i < ck->nservers; i++)
            len += (size_t)snprintf(m + len, cap - len, " %" PRIu64, ck->servers[i]);
        len += (size_t)snprintf(m + len, cap - len, "\npositions");
        for (size_t i = 0; i < ck->nranks; i++)
            len += (size_t)snprintf(m + len, cap - len, " %" PRIu64, ck->positions[i]);
        len += (size_t)snprintf(m + len, cap - len, "\n");
        for (size_t i = 0; i < ck->nservers; i++)
            if (ck->dir_off[i])
                len += (size_t)snprintf(m + len, cap - len, "server-dir %zu %s\n", i,
                                        pw_jobckpt_server_dir(ck, i));
        const size_t rl = strnlen(ck->run, sizeof ck->run);
        if (rl && rl < sizeof ck->run && !memchr(ck->run, '\n', rl))
            len += (size_t)snprintf(m + len, cap - len, "run %s\n", ck->run);
        if (ck->map[0] && !memchr(ck->map, '\n', strnlen(ck->map, sizeof ck->map)))
            len += (size_t)snprintf(m + len, cap - len, "map %.*s\n", (int)sizeof ck->map, ck->map);
        len = pc_fs_seal(m, len, cap); /* a flipped digit of a server's id is refused */
        snprintf(path, sizeof path, "%s/manifest", sdir);
        rc = pc_fs_write_atomic(path, m, len);
    }
    free(m);
    if (!rc)
        rc = pc_fs_replace_dir(sdir, fin, dir); /* the same step written before: replaced */
    if (rc)
        pc_fs_rm_tree(sdir);
    if (!rc) {
        char latest[32];
        const int len = snprintf(latest, sizeof latest, "%" PRIu64 "\n", ck->step);
        snprintf(path, sizeof path, "%s/LATEST", dir);
        rc = pc_fs_write_atomic(path, latest, (size_t)len);
    }
    if (!rc)
        pc_fs_prune_numbered(dir, "step-", ck->step, (size_t)keep); /* and later ones */
    return rc;
}

void pw_jobckpt_abandon_after(const char *dir, uint64_t step) {
    pc_fs_prune_numbered(dir, "step-", step, SIZE_MAX); /* every older one kept */
}

/* Parse "word N N N ..." (decimal digits only) into out (at most cap numbers). */
static int numbers(const char *line, const char *word, uint64_t *out, size_t cap, size_t *n) {
    const size_t wl = strlen(word);
    if (strncmp(line, word, wl) != 0)
        return PC_ECORRUPT;
    const char *p = line + wl;
    *n = 0;
    while (*p == ' ') {
        char *end;
        errno = 0;
        const uint64_t v = strtoull(p + 1, &end, 10);
        if (p[1] < '0' || p[1] > '9' || errno || *n == cap) /* "-1", "+1", " 1", overflow */
            return PC_ECORRUPT;
        out[(*n)++] = v;
        p = end;
    }
    return *p == '\n' || *p == '\0' ? 0 : PC_ECORRUPT;
}

/* "server-dir I PATH\n" into ck (I below ck->nservers, each once). */
static int server_dir_line(const char *line, pw_jobckpt_t *ck) {
    if (strncmp(line, "server-dir ", 11) != 0)
        return PC_ECORRUPT;
    char *end;
    const char *p = line + 11;
    const unsigned long long i = strtoull(p, &end, 10);
    if (end == p || *p < '0' || *p > '9' || *end != ' ' || i >= ck->nservers || ck->dir_off[i])
        return PC_ECORRUPT;
    char path[PW_JOBCKPT_DIR_MAX];
    const size_t len = strcspn(end + 1, "\n");
    if (len == 0 || len >= sizeof path || end[1 + len] != '\n')
        return PC_ECORRUPT;
    memcpy(path, end + 1, len);
    path[len] = '\0';
    const int rc = pw_jobckpt_server_dir_set(ck, (size_t)i, path);
    return rc == PC_ETOOBIG ? rc : rc ? PC_ECORRUPT : 0;
}

int pw_jobckpt_read(const char *dir, uint64_t step, pw_jobckpt_t *ck, float *state, size_t n) {
    if (!dir || !ck || (!state && n))
        return PC_EINVAL;
    char path[4200];
    snprintf(path, sizeof path, "%s/step-%020" PRIu64 "/manifest", dir, step);
    char *text = NULL;
    size_t tlen = 0;
    bool sealed = false;
    int rc = pc_fs_read_all(path, MANIFEST_MAX, &text, &tlen);
    if (rc)
        return rc == PC_ETOOBIG ? PC_ECORRUPT : rc;
    FILE *f = pc_fs_seal_check(text, &tlen, &sealed) ? NULL : fmemopen(text, tlen, "r");
    if (!f) {
        free(text);
        return PC_ECORRUPT; /* (an empty manifest, or a seal that does not match) */
    }
    memset(ck->dir_off, 0, sizeof ck->dir_off);
    ck->dirs_used = 0;
    const size_t cap = 64 + 24 * (PW_JOBCKPT_MAX_SERVERS + PW_JOBCKPT_MAX_RANKS);
    char *line = malloc(cap);
    rc = line ? 0 : PC_ENOMEM;
    size_t k;
    if (!rc) /* version 2 is sealed; version 1 (older) is read without one */
        rc = fgets(line, (int)cap, f) &&
                     ((sealed && strcmp(line, "emberps-job-checkpoint 2\n") == 0) ||
                      strcmp(line, "emberps-job-checkpoint 1\n") == 0)
                 ? 0
                 : PC_ECORRUPT;
    if (!rc)
        rc = fgets(line, (int)cap, f) ? numbers(line, "step", &ck->step, 1, &k) : PC_ECORRUPT;
    if (!rc && (k != 1 || ck->step != step))
        rc = PC_ECORRUPT;
    if (!rc)
        rc = fgets(line, (int)cap, f)
                 ? numbers(line, "servers", ck->servers, PW_JOBCKPT_MAX_SERVERS, &ck->nservers)
                 : PC_ECORRUPT;
    for (size_t i = 0; !rc && i < ck->nservers; i++)
        if (!ck->servers[i]) /* a server's Restore of id 0 takes its newest: not this cut */
            rc = PC_ECORRUPT;
    if (!rc)
        rc = fgets(line, (int)cap, f)
                 ? numbers(line, "positions", ck->positions, PW_JOBCKPT_MAX_RANKS, &ck->nranks)
                 : PC_ECORRUPT;
    ck->map[0] = ck->run[0] = '\0';
    while (!rc && fgets(line, (int)cap, f)) { /* the servers' directories, the run, the map */
        const size_t ml = strcspn(line, "\n");
        if (ck->map[0]) /* nothing after the map */
            rc = PC_ECORRUPT;
        else if (strncmp(line, "run ", 4) == 0)
            rc = !ck->run[0] && ml > 4 && ml - 4 < sizeof ck->run && line[ml] == '\n'
                     ? (snprintf(ck->run, sizeof ck->run, "%.*s", (int)(ml - 4), line + 4), 0)
                     : PC_ECORRUPT;
        else if (strncmp(line, "map ", 4) == 0)
            rc = ml > 4 && ml - 4 < sizeof ck->map && line[ml] == '\n'
                     ? (snprintf(ck->map, sizeof ck->map, "%.*s", (int)(ml - 4), line + 4), 0)
                     : PC_ECORRUPT;
        else
            rc = server_dir_line(line, ck);
    }
    fclose(f);
    free(text);
    free(line);
    snprintf(path, sizeof path, "%s/step-%020" PRIu64 "/dense.state", dir, step);
    if (!rc && state && (rc = pw_state_load(path, state, n)) == PC_ENOTFOUND)
        rc = PC_ECORRUPT;
    return rc;
}

int pw_jobckpt_read_latest(const char *dir, pw_jobckpt_t *ck, float *state, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/LATEST", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? PC_ENOTFOUND : PC_EIO;
    uint64_t step;
    const int ok = fscanf(f, "%" SCNu64, &step) == 1;
    fclose(f);
    if (!ok)
        return PC_ECORRUPT;
    /* a rewrite of that step (a fresh run in the same directory) crashed between the renames of
     * pc_fs_replace_dir's fallback: its old copy back in place (resume failed on every try) */
    snprintf(path, sizeof path, "%s/step-%020" PRIu64, dir, step);
    (void)pc_fs_restore_replaced(path);
    const int rc = pw_jobckpt_read(dir, step, ck, state, n);
    return rc == PC_ENOTFOUND ? PC_ECORRUPT : rc; /* LATEST is written last: its step is there */
}
