/* pw_group.c: see pw_group.h. */
#include "pw_group.h"

#include "pc_error.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pw_coord_client.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MEMBERS 4096
#define POLL_NS     1000000000ull /* pw_group_stale asks at most this often */

struct pw_group {
    pw_group_opts_t o;
    char job[64], host[64], ns[192];
    uint64_t run;
    pw_coord_t *coord, *hb_coord; /* hb_coord: heartbeats, polls (calls bounded by lease / 4) */
    pw_coll_t *coll;
    int64_t gen;     /* -1: none yet */
    uint64_t marked; /* the tried mark this process wrote last (mark_tried; 0: none) */
    int64_t formed;  /* the newest generation this worker formed (-1: none); its members: */
    int formed_members[MAX_MEMBERS];
    int grank, gsize;
    uint64_t last_poll_ns;
    int members[MAX_MEMBERS]; /* scratch */
    /* The heartbeat thread's view of this worker (hb_mu); hb_now: beat at once. */
    pthread_t hb;
    bool hb_started, hb_stop, hb_now, hb_failing;
    bool hb_lost; /* another process took this rank over (see hold): every later call fails */
    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cv; /* CLOCK_MONOTONIC */
    const char *hb_state;
    int64_t hb_gen;
    uint64_t hb_step;
    char hb_note[200]; /* pw_group_note's, JSON-safe */
    char node[96]; /* this machine's name and pid namespace: where a holder's pid can be checked */
    char id[20];   /* this join's own mark in its heartbeats (random, hex) */
    unsigned long long start; /* when this process started (proc_start; 0: unknown) */
};

static void key_of(const pw_group_t *g, char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(buf, cap, "%s/", g->ns);
    vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* This machine's name and this process's pid namespace ("host/4026531836"): a holder's pid is
 * checked (kill) only where both match, so a worker in another container of the same host name
 * is not taken for dead by a pid that is not its. "" when either is unknown: rank holders are
 * then told apart by lease renewals. */
static void node_of(char *out, size_t cap) {
    char host[65] = "";
    struct stat st;
    if (gethostname(host, sizeof host - 1) != 0 || !host[0] || strpbrk(host, "\"\\") ||
        stat("/proc/self/ns/pid", &st) != 0)
        out[0] = '\0';
    else
        snprintf(out, cap, "%s/%llu", host, (unsigned long long)st.st_ino);
}

/* When process pid started (clock ticks after boot: /proc/PID/stat's 22nd field), which tells
 * a process from a later one given its pid; 0 when unknown. */
static unsigned long long proc_start(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* after the command name, which may hold anything */
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* A value as a NUL-terminated string. PC_ENOTFOUND, PC_ETOOBIG (longer than cap - 1). */
static int get_str(pw_coord_t *co, const char *key, char *buf, size_t cap) {
    void *v;
    size_t n;
    int rc = pw_coord_get(co, key, &v, &n);
    if (rc)
        return rc;
    if (n >= cap) {
        free(v);
        return PC_ETOOBIG;
    }
    memcpy(buf, v, n);
    buf[n] = '\0';
    free(v);
    return 0;
}

static int get_u64(pw_coord_t *co, const char *key, uint64_t *out) {
    char buf[32];
    int rc = get_str(co, key, buf, sizeof buf);
    if (rc)
        return rc;
    char *end;
    *out = strtoull(buf, &end, 10);
    return end == buf ? PC_ECORRUPT : 0;
}

static int set_str(pw_group_t *g, const char *key, const char *value) {
    return pw_coord_set(g->coord, key, value, strlen(value));
}

/* "0,1,3" -> members; the count, or PC_ECORRUPT. */
static int parse_members(const char *s, int *out) {
    int n = 0;
    while (*s) {
        char *end;
        long r = strtol(s, &end, 10);
        if (end == s || r < 0 || r >= MAX_MEMBERS || n == MAX_MEMBERS || (*end && *end != ','))
            return PC_ECORRUPT;
        out[n++] = (int)r;
        s = *end ? end + 1 : end;
    }
    return n ? n : PC_ECORRUPT;
}

static int index_of(const int *m, int n, int rank) {
    for (int i = 0; i < n; i++)
        if (m[i] == rank)
            return i;
    return -1;
}

/* The member list of generation G (in g->members). The count, PC_ENOTFOUND, or an error. */
static int members_of(pw_group_t *g, int64_t gen) {
    char key[256], *text = malloc(MAX_MEMBERS * 5 + 1);
    if (!text)
        return PC_ENOMEM;
    key_of(g, key, sizeof key, "g/%" PRId64, gen);
    int rc = get_str(g->coord, key, text, MAX_MEMBERS * 5 + 1);
    if (!rc)
        rc = parse_members(text, g->members);
    free(text);
    return rc;
}

/* The newest generation (-1: none): the hint "cur", then forward while the next one exists;
 * asked through co (g->coord, or the training thread's quick polls: g->hb_coord). */
static int newest(pw_group_t *g, pw_coord_t *co, int64_t *out) {
    char key[256];
    uint64_t cur;
    key_of(g, key, sizeof key, "cur");
    int rc = get_u64(co, key, &cur);
    int64_t gen = rc == PC_ENOTFOUND ? -1 : (int64_t)cur;
    if (rc && rc != PC_ENOTFOUND)
        return rc;
    for (;;) {
        char v[8];
        key_of(g, key, sizeof key, "g/%" PRId64, gen + 1);
        rc = get_str(co, key, v, sizeof v);
        if (rc == PC_ENOTFOUND)
            break;
        if (rc && rc != PC_ETOOBIG) /* a long member list is still there */
            return rc;
        gen++;
    }
    *out = gen;
    return 0;
}

/* Propose generation `gen` with members m[0..n) (sorted here); the first proposal stays. */
static int propose(pw_group_t *g, int64_t gen, int *m, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: member lists are short */
        for (int j = i; j > 0 && m[j - 1] > m[j]; j--) {
            int t = m[j];
            m[j] = m[j - 1];
            m[j - 1] = t;
        }
    char key[256], *text = malloc((size_t)n * 5 + 1);
    if (!text)
        return PC_ENOMEM;
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(text + len, i ? ",%d" : "%d", m[i]);
    key_of(g, key, sizeof key, "g/%" PRId64, gen);
    int rc = pw_coord_set_if_absent(g->coord, key, text, len);
    if (rc == 0)
        PC_INFO("group: proposed generation %" PRId64 ": workers %s", gen, text);
    free(text);
    if (rc == PC_EEXIST)
        rc = 0; /* another proposal won: it is read back next */
    char cur[24];
    snprintf(cur, sizeof cur, "%" PRId64, gen);
    key_of(g, key, sizeof key, "cur");
    return rc ? rc : set_str(g, key, cur);
}

/* A failed coordinator call: true (logged) once failures have lasted rejoin_timeout_ms since
 * *since (set at the first one; the caller zeroes it after a success), else a 100 ms pause
 * before the caller tries again. */
static bool coord_gave_up(pw_group_t *g, uint64_t *since, int rc) {
    if (!*since)
        *since = pc_time_mono_ns();
    if (pc_time_sec_since(*since) * 1000 > g->o.rejoin_timeout_ms) {
        PC_ERROR("group: the coordinator %s: %s", g->o.coordinator, pc_strerror(rc));
        return true;
    }
    pc_time_sleep_ms(100);
    return false;
}

/* A write's outcome rc in settle: 0 ends the trouble *since counted (a later failure waits the
 * rejoin timeout again); a failure is coord_gave_up's. */
static bool write_gave_up(pw_group_t *g, uint64_t *since, int rc) {
    if (!rc) {
        *since = 0;
        return false;
    }
    return coord_gave_up(g, since, rc);
}

/* The lease of a generation's rendezvous keys: twice the longest wait of a formation (the
 * collective or the rejoin timeout), and a minute. Only a formation reads them: after it they go,
 * so a long job's generations do not fill the coordinator (65,536 keys at most) and a later
 * process rarely meets an address of one that is gone. */
static uint32_t rdv_lease_ms(const pw_group_t *g) {
    const int64_t w =
        g->o.timeout_ms > g->o.rejoin_timeout_ms ? g->o.timeout_ms : g->o.rejoin_timeout_ms;
    const int64_t ms = 2 * w + 60000;
    return ms < (int64_t)UINT32_MAX ? (uint32_t)ms : UINT32_MAX;
}

/* Whether a call that failed with rc is to be made again: the coordinator unreachable for now
 * (PC_EUNAVAIL; PC_ETIMEDOUT too when `timeouts`: a read, or a write whose double is harmless),
 * restarting or electing, for up to rejoin_timeout_ms; the first retry is said. */
static bool coord_retry(pw_group_t *g, uint64_t *since, int rc, bool timeouts) {
    if (rc != PC_EUNAVAIL && !(timeouts && rc == PC_ETIMEDOUT))
        return false;
    if (!*since)
        PC_WARN("group: the coordinator %s: %s: trying again for up to %d ms", g->o.coordinator,
                pc_strerror(rc), g->o.rejoin_timeout_ms);
    return !coord_gave_up(g, since, rc);
}

/* Mark generation gen as tried by this rank before forming it: 0, PC_ESTATE when this rank
 * tried it before (an earlier process of the rank: its rendezvous keys there name a process
 * that is gone; the caller proposes the next generation instead), or the coordinator's error
 * (the caller retries it as its other calls). The rank's key tried/<rank> holds the newest
 * generation it tried, plus one (0 is none; one key a rank: generations are many); a mark this
 * process wrote itself (a write applied whose answer was lost, then retried) is no earlier
 * process's. */
static int mark_tried(pw_group_t *g, int64_t gen) {
    char key[256], v[24];
    pw_coll_destroy(g->coll); /* the generation before is over */
    g->coll = NULL;
    key_of(g, key, sizeof key, "tried/%d", g->o.rank);
    uint64_t tried = 0;
    int rc = get_u64(g->coord, key, &tried);
    if (rc && rc != PC_ENOTFOUND)
        return rc;
    if (rc == 0 && tried >= (uint64_t)gen + 1 && tried != g->marked) {
        PC_WARN("group: generation %" PRId64 " was tried by an earlier process of rank %d: "
                "proposing the next one",
                gen, g->o.rank);
        g->gen = gen;
        return PC_ESTATE;
    }
    g->marked = (uint64_t)gen + 1;
    snprintf(v, sizeof v, "%" PRIu64, g->marked);
    return set_str(g, key, v);
}

/* Form generation `gen` (marked tried) of members m[0..n) (this worker among them). */
static int form(pw_group_t *g, int64_t gen, const int *m, int n, int timeout_ms) {
    char prefix[256], key[256];
    key_of(g, prefix, sizeof prefix, "g/%" PRId64 "/rdv", gen);
    pw_kv_t kv = pw_coord_kv(g->coord, rdv_lease_ms(g));
    const int me = index_of(m, n, g->o.rank);
    int rc = pw_coll_create(&kv, prefix, me, n, g->host, timeout_ms, &g->coll);
    g->gen = gen; /* tried: a failed formation is not tried again */
    if (rc)
        return rc;
    g->grank = me;
    g->gsize = n;
    const bool first_formed = g->formed < 0; /* (the run's `started` mark: once a process) */
    g->formed = gen;
    memmove(g->formed_members, m, (size_t)n * sizeof *m); /* m may be g->members */
    if (me == 0) { /* the group works: the marks are tried until the coordinator gives up */
        uint64_t since = 0;
        const char *const marks[] = {"g/%" PRId64 "/formed", "started"};
        for (int i = 0; i < (first_formed ? 2 : 1); i++) {
            key_of(g, key, sizeof key, marks[i], gen);
            while ((rc = set_str(g, key, "1")))
                if (coord_gave_up(g, &since, rc))
                    return rc;
        }
    }
    PC_INFO("group: generation %" PRId64 " formed: %d worker(s), this one is %d", gen, n, me);
    return 0;
}

/* Whether some generation of this run ever formed (else the job has not started: its members
 * keep the first formation's rules, pw_group.h). A read that fails counts as started. */
static bool job_started(pw_group_t *g) {
    char key[256], v[4];
    key_of(g, key, sizeof key, "started");
    return get_str(g->coord, key, v, sizeof v) != PC_ENOTFOUND;
}

static bool formed(pw_group_t *g, int64_t gen) {
    char key[256], v[4];
    key_of(g, key, sizeof key, "g/%" PRId64 "/formed", gen);
    return get_str(g->coord, key, v, sizeof v) == 0;
}

/* Publish this worker's state (and current generation) to its heartbeats: at once, or (now
 * false: the caller just wrote it) at the next beat. */
static void hb_set(pw_group_t *g, const char *state, bool now) {
    pthread_mutex_lock(&g->hb_mu);
    g->hb_state = state;
    g->hb_gen = g->gen;
    if (now) {
        g->hb_now = true;
        pthread_cond_signal(&g->hb_cv);
    }
    pthread_mutex_unlock(&g->hb_mu);
}

/* The heartbeat's value (JSON) into v; its length. */
static size_t hb_value(const pw_group_t *g, const char *state, int64_t gen, uint64_t step,
                       const char *note, char *v, size_t cap) {
    const int n = snprintf(
        v, cap,
        "{\"rank\":%d,\"gen\":%" PRId64 ",\"step\":%" PRIu64
        ",\"state\":\"%s\",\"host\":\"%s\",\"pid\":%d,\"start\":%llu,\"node\":\"%s\""
        ",\"note\":\"%s\",\"id\":\"%s\"}",
        g->o.rank, gen, step, state, g->host, (int)getpid(), g->start, g->node, note, g->id);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* A string field of a heartbeat's value (pw_group's own JSON: no escapes) into out ("" when
 * absent); a number field as a long (-1 when absent). */
static void hb_field(const char *v, const char *name, char *out, size_t cap) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":\"", name);
    const char *p = strstr(v, pat), *end = p ? strchr(p + strlen(pat), '"') : NULL;
    const int n = end ? (int)(end - p - (ptrdiff_t)strlen(pat)) : 0;
    snprintf(out, cap, "%.*s", n, end ? p + strlen(pat) : "");
}

static long hb_num(const char *v, const char *name) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *p = strstr(v, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

static bool lost(pw_group_t *g) {
    pthread_mutex_lock(&g->hb_mu);
    const bool l = g->hb_lost;
    pthread_mutex_unlock(&g->hb_mu);
    return l;
}

/* Set this rank's lease key to v (n bytes) through co, fenced: only while the key holds this
 * join's heartbeat (its id) or is absent (its lease ran out while the coordinator could not be
 * reached: taken again unless another claimant was first), by a compare-and-set at the revision
 * read. A holder that stalled (stopped, cut off) past a heartbeat period and was taken over
 * meanwhile so never writes over its successor: it learns it lost the rank instead. 0, PC_EEXIST
 * (another process holds the rank now: logged, and the group is lost: pw_group_stale says so and
 * recovery fails), PC_EAGAIN (the key kept changing), or the coordinator's error. */
static int hold(pw_group_t *g, pw_coord_t *co, const char *v, size_t n) {
    if (lost(g)) /* never again: a successor's key that expired is not this process's */
        return PC_EEXIST;
    char key[256];
    key_of(g, key, sizeof key, "live/%d", g->o.rank);
    for (int tries = 0; tries < 4; tries++) {
        void *cur = NULL;
        size_t cn = 0;
        uint64_t rev = 0;
        int rc = pw_coord_get_rev(co, key, &cur, &cn, &rev);
        if (rc && rc != PC_ENOTFOUND)
            return rc;
        char id[sizeof g->id] = "", host[64] = "";
        long pid = -1;
        if (!rc) {
            hb_field(cur, "id", id, sizeof id);
            hb_field(cur, "host", host, sizeof host);
            pid = hb_num(cur, "pid");
            free(cur);
        }
        if (!rc && strcmp(id, g->id) != 0) {
            PC_ERROR("group: rank %d of job %s was taken over by another worker (pid %ld on %s) "
                     "while this one (pid %d) could not renew it: this worker leaves the job",
                     g->o.rank, g->job, pid, host[0] ? host : "?", (int)getpid());
            pthread_mutex_lock(&g->hb_mu);
            g->hb_lost = true;
            pthread_mutex_unlock(&g->hb_mu);
            return PC_EEXIST;
        }
        if (!rc && !rev) /* a coordinator older than revisions: not fenced */
            return pw_coord_set_lease(co, key, v, n, (uint32_t)g->o.lease_ms);
        rc = pw_coord_set_if(co, key, v, n, rev, (uint32_t)g->o.lease_ms);
        if (rc != PC_EEXIST)
            return rc;
        /* it changed between the read and the write: read again */
    }
    return PC_EAGAIN;
}

static void beat(pw_group_t *g, const char *state, int64_t gen, uint64_t step, const char *note) {
    char v[640];
    const size_t n = hb_value(g, state, gen, step, note, v, sizeof v);
    const int rc = hold(g, g->hb_coord, v, n);
    if (rc == PC_EEXIST) /* taken over: said by hold */
        return;
    if (rc && !g->hb_failing)
        PC_WARN("group: heartbeat to the coordinator %s failed: %s (retrying)", g->o.coordinator,
                pc_strerror(rc));
    else if (!rc && g->hb_failing)
        PC_INFO("group: heartbeats reach the coordinator again");
    g->hb_failing = rc != 0; /* this thread's alone */
}

static void *hb_main(void *arg) {
    pw_group_t *g = arg;
    const uint64_t period_ns = (uint64_t)g->o.lease_ms * 250000u; /* lease / 4 */
    pthread_mutex_lock(&g->hb_mu);
    while (!g->hb_stop && !g->hb_lost) {
        const char *state = g->hb_state;
        const int64_t gen = g->hb_gen;
        const uint64_t step = g->hb_step;
        char note[sizeof g->hb_note];
        memcpy(note, g->hb_note, sizeof note);
        g->hb_now = false;
        pthread_mutex_unlock(&g->hb_mu);
        /* the next beat a period after this one's start (it takes calls) */
        const struct timespec dl = pc_time_mono_ts(pc_time_mono_ns() + period_ns);
        beat(g, state, gen, step, note);
        pthread_mutex_lock(&g->hb_mu);
        int w = 0;
        while (!g->hb_stop && !g->hb_lost && !g->hb_now && w != ETIMEDOUT)
            w = pthread_cond_timedwait(&g->hb_cv, &g->hb_mu, &dl);
    }
    pthread_mutex_unlock(&g->hb_mu);
    return NULL;
}

/* The live lease of `rank` among the entries of "live/" (prefix length pl), or NULL. */
static const pc_kv_entry_t *lease_in(const pc_kv_entry_t *e, size_t ne, size_t pl, int rank) {
    for (size_t k = 0; k < ne; k++) {
        char *end;
        const long r = strtol(e[k].key + pl, &end, 10);
        if (!*end && end != e[k].key + pl && r == rank)
            return &e[k];
    }
    return NULL;
}

/* What a live lease's value says about its holder. */
typedef struct holder {
    char state[24], host[64], node[96], note[200], id[20];
    long pid;
    bool here;       /* on this machine, in this pid namespace (same node) */
    bool gone;       /* here, and its process no longer exists (or is this one: see holder_of) */
    bool mine;       /* this join's own heartbeat (a claim applied whose answer was lost) */
    double silent_s; /* since its last heartbeat (its lease is this worker's lease_ms) */
} holder_t;

static void holder_of(const pw_group_t *g, const pc_kv_entry_t *e, holder_t *h) {
    const char *v = e->value;
    hb_field(v, "state", h->state, sizeof h->state);
    hb_field(v, "host", h->host, sizeof h->host);
    hb_field(v, "node", h->node, sizeof h->node);
    hb_field(v, "note", h->note, sizeof h->note);
    hb_field(v, "id", h->id, sizeof h->id);
    h->pid = hb_num(v, "pid");
    h->here = h->node[0] && strcmp(h->node, g->node) == 0;
    h->mine = h->id[0] && strcmp(h->id, g->id) == 0;
    /* Gone: no such process, or one that started at another time (the pid handed out again:
     * a container restarted as pid 1, with its host name and, often, its pid namespace's
     * number; its earlier process's claim read as this very process's) */
    const long start = hb_num(v, "start");
    const unsigned long long now =
        h->here && h->pid > 0 && start > 0 ? proc_start((pid_t)h->pid) : 0;
    h->gone = h->here && h->pid > 0 && !h->mine &&
              ((kill((pid_t)h->pid, 0) != 0 && errno == ESRCH) ||
               (now && now != (unsigned long long)start));
    const long left = (long)e->lease_left_ms;
    h->silent_s = left > 0 && left < g->o.lease_ms ? (g->o.lease_ms - left) / 1000.0 : 0;
}

/* The workers of generation `gen` that registered as alive there and hold a live lease (into
 * g->members; *total gets the generation's size); unless quiet, for the others, what is known
 * is logged: the lease expired, the process is gone, the heartbeats stopped, or it is alive and
 * busy elsewhere (with what it reports, e.g. a server it waits for). */
static int alive_of(pw_group_t *g, int64_t gen, bool quiet, int *total) {
    int n = members_of(g, gen), k = 0;
    if (n < 0)
        return n;
    *total = n;
    char prefix[256];
    key_of(g, prefix, sizeof prefix, "live/");
    pc_kv_entry_t *e = NULL;
    size_t ne = 0;
    int rc = pw_coord_list(g->coord, prefix, 0, &e, &ne);
    const size_t pl = strlen(prefix);
    /* no heartbeat for two periods (a live worker beats every lease / 4) */
    const double overdue_s = g->o.lease_ms / 2000.0 + 0.2;
    for (int i = 0; i < n && !rc; i++) {
        const int r = g->members[i];
        const pc_kv_entry_t *lease = lease_in(e, ne, pl, r);
        char key[256], v[4];
        key_of(g, key, sizeof key, "g/%" PRId64 "/alive/%d", gen, r);
        const int got = get_str(g->coord, key, v, sizeof v);
        if (got && got != PC_ENOTFOUND) {
            rc = got;
            continue;
        }
        if (r == g->o.rank || (got == 0 && lease)) { /* this worker, or one in recovery */
            g->members[k++] = r;
            continue;
        }
        if (quiet)
            continue;
        holder_t h = {0};
        if (lease)
            holder_of(g, lease, &h);
        if (!lease)
            PC_WARN("group: rank %d: worker %d is lost: its membership lease expired", g->o.rank,
                    r);
        else if (h.gone)
            PC_WARN("group: rank %d: worker %d is lost: its process (pid %ld on %s) is gone",
                    g->o.rank, r, h.pid, h.node);
        else if (h.silent_s > overdue_s)
            PC_WARN("group: rank %d: worker %d is lost: no heartbeat for %.1f s (pid %ld on %s)",
                    g->o.rank, r, h.silent_s, h.pid, h.host);
        else if (h.note[0])
            PC_WARN("group: rank %d: worker %d is alive but not in recovery: it reports %s",
                    g->o.rank, r, h.note);
        else
            PC_WARN("group: rank %d: worker %d is alive but not in recovery (state %s, pid %ld on "
                    "%s)",
                    g->o.rank, r, h.state, h.pid, h.host);
    }
    pc_kv_entries_free(e, ne);
    return rc ? rc : k;
}

/* Take this rank's membership lease before the heartbeats start: PC_EEXIST (logged) when a live
 * worker holds it (two workers given one --rank). A lease left by a dead holder is taken over:
 * one that said it exited, one whose process on this machine is gone, or one not set again
 * within a heartbeat period (about lease_ms / 4: what a holder elsewhere costs a restarted
 * worker). A heartbeat shows as a new revision of the key: the lease's time left cannot tell,
 * as etcd gives it in whole seconds. */
/* Mark a dead holder's rank as taken over by this claimant (value v, n bytes): 0 for the first of
 * racing claimants (two workers given one rank that both found its holder dead), PC_EEXIST for
 * the others (and while an earlier takeover's mark lasts: a lease). */
static int take_over(pw_group_t *g, const char *v, size_t n) {
    char key[256];
    key_of(g, key, sizeof key, "takeover/%d", g->o.rank);
    return pw_coord_set_lease_if_absent(g->coord, key, v, n, (uint32_t)g->o.lease_ms);
}

static int claim_rank(pw_group_t *g) {
    char key[256], v[640], prefix[256];
    key_of(g, key, sizeof key, "live/%d", g->o.rank);
    key_of(g, prefix, sizeof prefix, "live/");
    const size_t n = hb_value(g, "joining", -1, 0, "", v, sizeof v);
    uint64_t first_rev = 0, first_ns = 0; /* the key's revision when the watch began, and when */
    const uint64_t watch_ns = ((uint64_t)g->o.lease_ms / 4 + 300) * 1000000u;
    for (;;) {
        int rc = pw_coord_set_lease_if_absent(g->coord, key, v, n, (uint32_t)g->o.lease_ms);
        if (rc != PC_EEXIST)
            return rc;
        pc_kv_entry_t *e;
        size_t ne;
        if ((rc = pw_coord_list(g->coord, key, 0, &e, &ne))) /* (this rank's, and ranks that
                                                              * start with its digits) */
            return rc;
        const pc_kv_entry_t *lease = lease_in(e, ne, strlen(prefix), g->o.rank);
        holder_t h = {0};
        uint64_t rev = 0;
        if (lease) {
            holder_of(g, lease, &h);
            rev = lease->revision;
        }
        pc_kv_entries_free(e, ne);
        if (!lease) { /* it expired meanwhile: claim again */
            pc_time_sleep_ms(10);
            continue;
        }
        if (h.mine)
            return 0; /* this join's claim landed (its answer lost, the set tried again) */
        bool dead = strcmp(h.state, "exited") == 0 || h.gone;
        const bool live_here = h.here && h.pid > 0 && !h.gone;
        if (!dead && !live_here) { /* elsewhere: renewed within a heartbeat period means alive */
            const uint64_t now = pc_time_mono_ns();
            bool renewed = false;
            if (!first_ns) {
                first_ns = now;
                first_rev = rev;
            } else {
                renewed = rev != first_rev;
            }
            if (!renewed && now - first_ns <= watch_ns) {
                pc_time_sleep_ms(50);
                continue;
            }
            dead = !renewed; /* not renewed within the watch: its holder is gone */
        }
        if (dead) { /* taken over, if this claimant is the first to mark it */
            if ((rc = take_over(g, v, n)) == 0) {
                /* the key from the dead holder's heartbeat to this one's, only if unchanged:
                 * a holder that writes again was alive (seen as such next time round) */
                rc = rev ? pw_coord_set_if(g->coord, key, v, n, rev, (uint32_t)g->o.lease_ms)
                         : pw_coord_set_lease(g->coord, key, v, n, (uint32_t)g->o.lease_ms);
                if (rc != PC_EEXIST)
                    return rc;
            } else if (rc != PC_EEXIST) {
                return rc;
            }
            first_ns = 0; /* another one did: whether its heartbeats come, watched again */
            pc_time_sleep_ms(50);
            continue;
        }
        PC_ERROR("group: rank %d is already held by a live worker of job %s (pid %ld on %s, "
                 "state %s): give every worker its own --rank",
                 g->o.rank, g->job, h.pid, h.host, h.state[0] ? h.state : "?");
        return PC_EEXIST;
    }
}

/* The coordinator forgot this worker's generation (its newest is older: a coordinator without a
 * store restarted, the job's keys gone). Written back from what this worker knows: the last
 * generation it formed (its member list, "formed", "cur") and the job's run count, each only
 * where absent, so the first survivor to get there wins and the others agree; this worker is in
 * that generation again, and the usual recovery (a lost worker waited for, then left out)
 * follows. 0 or the coordinator's error. */
static int restore(pw_group_t *g, int64_t last) {
    PC_WARN("group: rank %d: the coordinator has lost generation %" PRId64 " of job %s (its newest "
            "is %" PRId64 "; a coordinator without --coordinator-store restarted?): writing back "
            "generation %" PRId64,
            g->o.rank, g->gen, g->job, last, g->formed);
    memcpy(g->members, g->formed_members, (size_t)g->gsize * sizeof *g->members);
    char key[256], v[24];
    int rc = propose(g, g->formed, g->members, g->gsize);
    if (!rc) {
        key_of(g, key, sizeof key, "g/%" PRId64 "/formed", g->formed);
        rc = set_str(g, key, "1");
    }
    if (!rc) {
        key_of(g, key, sizeof key, "started");
        rc = set_str(g, key, "1");
    }
    if (!rc) {
        snprintf(key, sizeof key, "%s/runs", g->job);
        snprintf(v, sizeof v, "%" PRIu64, g->run);
        rc = pw_coord_set_if_absent(g->coord, key, v, strlen(v));
        rc = rc == PC_EEXIST ? 0 : rc;
    }
    if (!rc)
        g->gen = g->formed;
    return rc;
}

/* Whether another worker's heartbeat says it trains in a generation of this run (so the run is
 * under way, not new, though the coordinator lists no generation: it lost them). */
static bool run_under_way(pw_group_t *g) {
    char prefix[256];
    key_of(g, prefix, sizeof prefix, "live/");
    pc_kv_entry_t *e = NULL;
    size_t ne = 0;
    bool yes = false;
    if (pw_coord_list(g->coord, prefix, 0, &e, &ne) == 0)
        for (size_t k = 0; k < ne && !yes; k++)
            yes = hb_num(e[k].value, "rank") != g->o.rank && hb_num(e[k].value, "gen") >= 0;
    pc_kv_entries_free(e, ne);
    return yes;
}

/* Settle into a generation (see pw_group.h). first: joining at start. */
static int settle(pw_group_t *g, bool first) {
    const int rejoin = g->o.rejoin_timeout_ms;
    uint64_t deadline = pc_time_mono_ns() + (uint64_t)rejoin * 1000000ull, trouble = 0;
    uint64_t set_trouble = 0; /* since when writes fail (reads may work meanwhile) */
    uint64_t full_since = 0;  /* since when the rendezvous finds the coordinator full */
    bool registered = false;
    unsigned polls = 0;
    for (;;) {
        if (lost(g)) /* another process holds this rank now (said by hold) */
            return PC_EEXIST;
        int64_t last;
        int rc = newest(g, g->coord, &last), n = 0;
        if (!rc && last >= 0 && (n = members_of(g, last)) < 0)
            rc = n;
        if (rc) { /* the coordinator: retried up to rejoin_timeout_ms */
            if (coord_gave_up(g, &trouble, rc))
                return rc;
            continue;
        }
        trouble = 0;
        if (last < g->gen && g->formed >= 0) { /* the coordinator lost the job's state */
            if (write_gave_up(g, &set_trouble, rc = restore(g, last)))
                return rc;
            continue;
        }
        if (last < 0 && first && pc_time_mono_ns() < deadline && run_under_way(g)) {
            /* its workers write the run back within about a second (pw_group_stale) */
            pc_time_sleep_ms(100);
            continue;
        }
        if (last < 0) { /* a new run: generation 0 is everybody */
            for (int i = 0; i < g->o.world; i++)
                g->members[i] = i;
            if (write_gave_up(g, &set_trouble, rc = propose(g, 0, g->members, g->o.world)))
                return rc;
            continue;
        }
        if (last > g->gen) {
            const bool member = index_of(g->members, n, g->o.rank) >= 0;
            if (member && !formed(g, last)) {
                /* Every member was alive when it was proposed; the others notice a newer
                 * generation within about a second (pw_group_stale), then finish what they
                 * do: the formation waits for them up to the collective timeout (or the
                 * rejoin timeout when longer: they may be waiting out a server restart). The
                 * job's first formation: the collective timeout (a worker never came). */
                const bool fresh = first && !job_started(g); /* the job never formed */
                const int t =
                    (fresh && last == 0) || g->o.timeout_ms > rejoin ? g->o.timeout_ms : rejoin;
                if ((rc = mark_tried(g, last)) != PC_ESTATE &&
                    write_gave_up(g, &set_trouble, rc)) /* bounded as the other writes */
                    return rc;
                if (rc && rc != PC_ESTATE)
                    continue;
                if (!rc && (rc = form(g, last, g->members, n, t)) == 0) {
                    hb_set(g, "training", true);
                    return 0;
                }
                if (rc == PC_EFULL || rc == PC_ENOSPC || rc == PC_ETOOBIG) {
                    /* The coordinator has no room for the rendezvous. Every generation needs
                     * the same: they were formed one after another for ever. Earlier ones'
                     * keys expire (their lease), so it is waited for, up to that lease. */
                    const uint64_t now = pc_time_mono_ns();
                    if (!full_since) {
                        full_since = now;
                        PC_WARN("group: the coordinator %s has no room for generation %" PRId64
                                "'s rendezvous (%s): waiting up to %u ms",
                                g->o.coordinator, last, pc_strerror(rc), rdv_lease_ms(g));
                    } else if (now - full_since > (uint64_t)rdv_lease_ms(g) * 1000000u) {
                        PC_ERROR("group: generation %" PRId64 " cannot form: the coordinator "
                                 "%s: %s",
                                 last, g->o.coordinator, pc_strerror(rc));
                        return rc;
                    }
                    pc_time_sleep_ms(500);
                } else {
                    full_since = 0;
                }
                /* Its prefix spent (this rank tried it before), or a formation of a job that
                 * never started failed otherwise than by the timeout (a peer's key there named
                 * a process that is gone: an earlier attempt's), or timed out while a member
                 * proposed a newer one: the same members, afresh */
                int64_t now = -1;
                if (rc == PC_ESTATE ||
                    (fresh &&
                     (rc != PC_ETIMEDOUT || (newest(g, g->coord, &now) == 0 && now > last)))) {
                    if (write_gave_up(g, &set_trouble, rc = propose(g, last + 1, g->members, n)))
                        return rc;
                    continue;
                }
                if (fresh) /* the job never started: a worker never came (no shrinking) */
                    return rc;
                PC_WARN("group: generation %" PRId64 " did not form (%s); trying again", last,
                        pc_strerror(rc));
                registered = false;
                deadline = pc_time_mono_ns() + (uint64_t)rejoin * 1000000ull;
                continue;
            }
            if (!member) /* formed without this worker, or it lost the race: add it */
                g->members[n++] = g->o.rank;
            if (write_gave_up(g, &set_trouble, rc = propose(g, last + 1, g->members, n)))
                return rc;
            continue;
        }
        /* Nothing newer than this worker's generation: wait for a replacement to propose. */
        char key[256];
        if (!registered) {
            key_of(g, key, sizeof key, "g/%" PRId64 "/alive/%d", g->gen, g->o.rank);
            if (write_gave_up(g, &set_trouble, rc = set_str(g, key, "1"))) /* bounded as above */
                return rc;
            if (rc)
                continue;
            registered = true;
        }
        if (pc_time_mono_ns() < deadline) {
            /* Every member in recovery (a collective failed, nobody died: one waited out a
             * server restart longer than the collective timeout, say): the next generation at
             * once, without waiting for anyone. Asked every half second. */
            int total = 0;
            if (++polls % 10 == 0 && (n = alive_of(g, g->gen, true, &total)) == total) {
                PC_WARN("group: every worker of generation %" PRId64 " is in recovery: forming "
                        "the next one",
                        g->gen);
                if (write_gave_up(g, &set_trouble, rc = propose(g, g->gen + 1, g->members, n)))
                    return rc;
                continue;
            }
            pc_time_sleep_ms(50);
            continue;
        }
        deadline = pc_time_mono_ns() + (uint64_t)rejoin * 1000000ull;
        if (!g->o.shrink) {
            PC_WARN("group: still waiting for a lost worker to come back (generation %" PRId64 ")",
                    g->gen);
            continue;
        }
        int total = 0;
        if ((n = alive_of(g, g->gen, false, &total)) < 0) { /* tried again after another timeout */
            PC_WARN("group: cannot tell which workers are alive: %s", pc_strerror(n));
            continue;
        }
        PC_WARN("group: a worker did not come back within %d ms: going on with %d", rejoin, n);
        if (write_gave_up(g, &set_trouble, rc = propose(g, g->gen + 1, g->members, n)))
            return rc;
    }
}

int pw_group_join(const pw_group_opts_t *o, pw_group_t **out) {
    if (!o || !o->coordinator || !o->job || !o->host || o->world < 1 || o->world > MAX_MEMBERS ||
        o->rank < 0 || o->rank >= o->world || o->timeout_ms < 1 || o->rejoin_timeout_ms < 1 ||
        o->lease_ms < 100 || !out || strlen(o->job) >= 64 || strlen(o->host) >= 64 ||
        strpbrk(o->host, "\"\\")) /* the host goes into the heartbeat's JSON */
        return PC_EINVAL;
    pw_group_t *g = calloc(1, sizeof *g);
    if (!g)
        return PC_ENOMEM;
    g->o = *o;
    snprintf(g->job, sizeof g->job, "%s", o->job);
    snprintf(g->host, sizeof g->host, "%s", o->host);
    g->o.job = g->job;
    g->o.host = g->host;
    g->gen = -1;
    g->formed = -1;
    g->hb_state = "joining";
    g->hb_gen = -1;
    node_of(g->node, sizeof g->node);
    g->start = proc_start(getpid());
    uint64_t mark = 0;
    if (getrandom(&mark, sizeof mark, GRND_NONBLOCK) != (ssize_t)sizeof mark) /* (early boot) */
        mark = pc_time_mono_ns() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)g;
    snprintf(g->id, sizeof g->id, "%016" PRIx64, mark);
    pc_cond_init_mono(&g->hb_cv);
    pthread_mutex_init(&g->hb_mu, NULL);
    int rc = pw_coord_open(o->coordinator, o->sec, o->timeout_ms, &g->coord);
    if (!rc) {
        snprintf(g->ns, sizeof g->ns, "%s", g->job);
        char key[96];
        snprintf(key, sizeof key, "%s/runs", g->job);
        uint64_t since = 0;
        do
            rc = get_u64(g->coord, key, &g->run);
        while (coord_retry(g, &since, rc, true));
        if (rc == PC_ENOTFOUND)
            rc = 0, g->run = 0;
        snprintf(g->ns, sizeof g->ns, "%s/run/%" PRIu64, g->job, g->run);
    }
    /* a worker started while the coordinator restarts waits for it (not after a timeout: a
     * claim applied but unanswered would find this worker's own lease and refuse it) */
    uint64_t since = 0;
    if (!rc)
        do
            rc = claim_rank(g);
        while (coord_retry(g, &since, rc, false));
    if (!rc) /* a heartbeat stuck longer than a quarter lease is dropped, the next one sent */
        rc = pw_coord_open(o->coordinator, o->sec, o->lease_ms / 4, &g->hb_coord);
    if (!rc) {
        rc = pthread_create(&g->hb, NULL, hb_main, g) ? PC_ENOMEM : 0;
        g->hb_started = rc == 0;
    }
    if (!rc)
        rc = settle(g, true);
    if (rc) {
        PC_ERROR("group: rank %d of %d could not join job %s at %s: %s", o->rank, o->world, o->job,
                 o->coordinator, pc_strerror(rc));
        pw_group_close(g);
        return rc;
    }
    g->last_poll_ns = pc_time_mono_ns();
    *out = g;
    return 0;
}

void pw_group_close(pw_group_t *g) {
    if (!g)
        return;
    if (g->hb_started) {
        pthread_mutex_lock(&g->hb_mu);
        g->hb_stop = true;
        pthread_cond_signal(&g->hb_cv);
        pthread_mutex_unlock(&g->hb_mu);
        pthread_join(g->hb, NULL);
        if (!g->hb_failing && !g->hb_lost) /* shows until its lease ends */
            beat(g, "exited", g->gen, g->hb_step, "");
    }
    pthread_cond_destroy(&g->hb_cv);
    pthread_mutex_destroy(&g->hb_mu);
    pw_coll_destroy(g->coll);
    pw_coord_close(g->hb_coord);
    pw_coord_close(g->coord);
    free(g);
}

pw_coll_t *pw_group_coll(pw_group_t *g) {
    return g->coll;
}

void pw_group_rendezvous(pw_group_t *g, const char *name, pw_kv_t *kv, char *prefix, size_t cap) {
    *kv = pw_coord_kv(g->coord, rdv_lease_ms(g));
    key_of(g, prefix, cap, "g/%" PRId64 "/%s", g->gen, name);
}

const char *pw_group_run_name(const pw_group_t *g) {
    return g->ns;
}

int pw_group_rank(const pw_group_t *g) {
    return g->grank;
}

int pw_group_size(const pw_group_t *g) {
    return g->gsize;
}

uint64_t pw_group_gen(const pw_group_t *g) {
    return (uint64_t)g->gen;
}

int pw_group_recover(pw_group_t *g) {
    pw_coll_destroy(g->coll); /* broken or stale: its peers are gone or moving on */
    g->coll = NULL;
    /* This process may have stalled past a heartbeat period and been replaced: whether it still
     * holds its rank is asked now, before it joins a generation as that rank (its heartbeat
     * thread may not have beaten since it resumed). */
    char v[640];
    pthread_mutex_lock(&g->hb_mu);
    const size_t n = hb_value(g, "recovering", g->gen, g->hb_step, g->hb_note, v, sizeof v);
    pthread_mutex_unlock(&g->hb_mu);
    const int held = hold(g, g->coord, v, n);
    int rc = held == PC_EEXIST ? PC_EEXIST : 0;
    if (!rc) {
        hb_set(g, "recovering", held != 0); /* (written by hold unless it failed) */
        rc = settle(g, false);
    }
    g->last_poll_ns = pc_time_mono_ns();
    return rc;
}

int pw_group_reform(pw_group_t *g) {
    const int n = members_of(g, g->gen);
    return n < 0 ? n : propose(g, g->gen + 1, g->members, n);
}

void pw_group_note(pw_group_t *g, const char *note) {
    pthread_mutex_lock(&g->hb_mu);
    size_t n = 0;
    for (; note && note[n] && n + 1 < sizeof g->hb_note; n++) /* JSON-safe, one line */
        g->hb_note[n] = note[n] == '"' ? '\'' : note[n] == '\\' || note[n] < 0x20 ? ' ' : note[n];
    g->hb_note[n] = '\0';
    g->hb_now = true;
    pthread_cond_signal(&g->hb_cv);
    pthread_mutex_unlock(&g->hb_mu);
}

void pw_group_progress(pw_group_t *g, uint64_t step) {
    pthread_mutex_lock(&g->hb_mu);
    g->hb_step = step;
    pthread_mutex_unlock(&g->hb_mu);
}

bool pw_group_stale(pw_group_t *g) {
    if (lost(g)) /* recovery says so */
        return true;
    const uint64_t now = pc_time_mono_ns();
    if (now - g->last_poll_ns < POLL_NS)
        return false;
    g->last_poll_ns = now;
    int64_t last; /* a quick poll (bounded by a quarter lease): the training thread waits for it */
    if (newest(g, g->hb_coord, &last) != 0)
        return false;
    if (last < g->gen && g->formed == g->gen) /* the coordinator lost the job's state */
        restore(g, last);
    return last > g->gen;
}

int pw_group_offset_save(pw_group_t *g, uint64_t step, uint64_t lines) {
    if (lost(g)) /* the successor's position is its own */
        return PC_EEXIST;
    return pw_group_offset_set(g, g->o.rank, step, lines);
}

int pw_group_offset_set(pw_group_t *g, int rank, uint64_t step, uint64_t lines) {
    char key[256], v[48];
    key_of(g, key, sizeof key, "off/%d", rank);
    snprintf(v, sizeof v, "%" PRIu64 " %" PRIu64, step, lines);
    return pw_coord_set(g->hb_coord, key, v, strlen(v)); /* bounded as the heartbeats */
}

int pw_group_offset_load(pw_group_t *g, int rank, uint64_t *step, uint64_t *lines) {
    char key[256], v[48];
    key_of(g, key, sizeof key, "off/%d", rank);
    int rc = get_str(g->coord, key, v, sizeof v);
    if (rc)
        return rc;
    return sscanf(v, "%" SCNu64 " %" SCNu64, step, lines) == 2 ? 0 : PC_ECORRUPT;
}

int pw_group_finish(pw_group_t *g) {
    char key[96], v[24];
    snprintf(key, sizeof key, "%s/runs", g->job);
    snprintf(v, sizeof v, "%" PRIu64, g->run + 1);
    return set_str(g, key, v);
}
