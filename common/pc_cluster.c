/* pc_cluster.c: the versioned slot -> server map (see pc_cluster.h).
 *
 * DESIGN: a map is a version, an array of server addresses and a dense owner array of PC_NSLOTS
 * uint16 entries (32 KiB), so a lookup is one load; backups are PC_MAX_BACKUPS more such arrays
 * (PC_NO_SERVER where a slot has fewer), filled from the front. Parsing validates everything
 * (syntax, ranges, overlaps, coverage, backups distinct from the primary and each other) before a
 * map exists.
 */
#include "pc_cluster.h"
#include "pc_error.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pc_cluster_map {
    uint64_t version;
    uint64_t unclean; /* slots whose rows went back so far (pc_cluster.h "Losses") */
    size_t nservers;
    char (*addrs)[PC_ADDR_MAX];
    uint16_t owner[PC_NSLOTS];
    uint16_t backup[PC_MAX_BACKUPS][PC_NSLOTS];
    uint8_t syncing[PC_MAX_BACKUPS][PC_NSLOTS]; /* 1: that backup is catching up (`~`) */
};

static void cm_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void cm_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int cm_alloc(size_t n, pc_cluster_map_t **out) {
    if (n == 0 || n > PC_MAX_SERVERS)
        return PC_EINVAL;
    pc_cluster_map_t *m = calloc(1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->addrs = calloc(n, sizeof *m->addrs);
    if (!m->addrs) {
        free(m);
        return PC_ENOMEM;
    }
    m->nservers = n;
    memset(m->backup, 0xff, sizeof m->backup);
    *out = m;
    return 0;
}

/* "host:port": printable, none of ",;=", and a port up to 65535 in decimal without a leading
 * zero (so that one server is not listed twice under two spellings: ":07000" and ":7000";
 * ":99999" was taken, and wrapped, by the clients' conversion); port 0 stands for one not
 * chosen yet (a lone server's map before it binds). */
static int valid_addr(const char *a, size_t len) {
    if (len == 0 || len >= PC_ADDR_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!isgraph((unsigned char)a[i]) || a[i] == ',' || a[i] == ';' || a[i] == '=')
            return 0;
    size_t colon = len;
    while (colon > 0 && a[colon - 1] != ':')
        colon--;
    const size_t digits = len - colon;
    if (colon < 2 || digits == 0 || digits > 5 || (a[colon] == '0' && digits > 1))
        return 0;
    unsigned port = 0;
    for (size_t i = colon; i < len; i++) {
        if (!isdigit((unsigned char)a[i]))
            return 0;
        port = port * 10 + (unsigned)(a[i] - '0');
    }
    return port <= 65535;
}

int pc_cmap_create_even(uint64_t version, size_t n, const char *const *addrs,
                        pc_cluster_map_t **out) {
    if (!addrs || !out || version == 0)
        return PC_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!addrs[i] || !valid_addr(addrs[i], strlen(addrs[i])))
            return PC_EINVAL;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(addrs[i], addrs[j]) == 0)
                return PC_EINVAL; /* a server listed twice (the text form refuses it too) */
    pc_cluster_map_t *m;
    int rc = cm_alloc(n, &m);
    if (rc)
        return rc;
    m->version = version;
    for (size_t i = 0; i < n; i++)
        snprintf(m->addrs[i], PC_ADDR_MAX, "%s", addrs[i]);
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        m->owner[s] = (uint16_t)((uint64_t)s * n / PC_NSLOTS);
    *out = m;
    return 0;
}

void pc_cmap_destroy(pc_cluster_map_t *m) {
    if (!m)
        return;
    free(m->addrs);
    free(m);
}

/* A map's next version: after its own, and within what the parser reads back (INT64_MAX). */
static bool version_next_ok(const pc_cluster_map_t *m, uint64_t new_version) {
    return new_version > m->version && new_version <= (uint64_t)INT64_MAX;
}

int pc_cmap_copy(const pc_cluster_map_t *m, pc_cluster_map_t **out) {
    pc_cluster_map_t *c;
    int rc = cm_alloc(m->nservers, &c);
    if (rc)
        return rc;
    c->version = m->version;
    c->unclean = m->unclean;
    memcpy(c->addrs, m->addrs, m->nservers * sizeof *m->addrs);
    memcpy(c->owner, m->owner, sizeof m->owner);
    memcpy(c->backup, m->backup, sizeof m->backup);
    memcpy(c->syncing, m->syncing, sizeof m->syncing);
    *out = c;
    return 0;
}

uint64_t pc_cmap_version(const pc_cluster_map_t *m) {
    return m->version;
}
uint64_t pc_cmap_unclean(const pc_cluster_map_t *m) {
    return m->unclean;
}
void pc_cmap_unclean_at_least(pc_cluster_map_t *m, uint64_t n) {
    if (m->unclean < n)
        m->unclean = n;
}

void pc_cmap_unclean_add(pc_cluster_map_t *m, uint64_t n) {
    m->unclean = m->unclean > UINT64_MAX - n ? UINT64_MAX : m->unclean + n;
}
size_t pc_cmap_nservers(const pc_cluster_map_t *m) {
    return m->nservers;
}

const char *pc_cmap_addr(const pc_cluster_map_t *m, size_t i) {
    return i < m->nservers ? m->addrs[i] : NULL;
}

int pc_cmap_find(const pc_cluster_map_t *m, const char *addr) {
    for (size_t i = 0; i < m->nservers; i++)
        if (strcmp(m->addrs[i], addr) == 0)
            return (int)i;
    return PC_ENOTFOUND;
}

uint32_t pc_cmap_slot_owner(const pc_cluster_map_t *m, uint32_t slot) {
    return m->owner[slot & (PC_NSLOTS - 1)];
}

uint32_t pc_cmap_server_slots(const pc_cluster_map_t *m, uint32_t server) {
    uint32_t c = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        c += m->owner[s] == server;
    return c;
}

static void drop_backup(pc_cluster_map_t *m, uint32_t s, uint32_t server);

int pc_cmap_assign(pc_cluster_map_t *m, uint32_t lo, uint32_t hi, uint32_t server,
                   uint64_t new_version) {
    if (lo > hi || hi >= PC_NSLOTS || server >= m->nservers || !version_next_ok(m, new_version))
        return PC_EINVAL;
    for (uint32_t s = lo; s <= hi; s++) {
        m->owner[s] = (uint16_t)server;
        drop_backup(m, s, server); /* a primary is no backup of its own slots */
    }
    m->version = new_version;
    return 0;
}

/* Parse an unsigned decimal at *p (advanced); PC_EPARSE if none or over `max`. */
static int parse_u64(const char **p, uint64_t max, uint64_t *out) {
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return PC_EPARSE;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        unsigned d = (unsigned)(*s - '0');
        if (v > max / 10 || (v == max / 10 && d > max % 10))
            return PC_EPARSE;
        v = v * 10 + d;
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

int pc_cmap_parse(const char *text, pc_cluster_map_t **out, char *err, size_t errlen) {
    if (!text || !out) {
        cm_err(err, errlen, "no cluster map text");
        return PC_EINVAL;
    }
    /* Exactly "version=V;[unclean=N;]servers=A,B,...;slots=RANGES", in this order. */
    const char *vs = text, *ss = strstr(text, ";servers="), *ls = strstr(text, ";slots=");
    if (strncmp(text, "version=", 8) != 0 || !ss || !ls || ls < ss) {
        cm_err(err, errlen, "cluster map: expected version=V;servers=...;slots=...");
        return PC_EPARSE;
    }
    ss += 1;
    ls += 1;
    const char *p = vs + 8;
    uint64_t version, unclean = 0;
    /* below 2^63: every change writes version + 1, which must not wrap */
    if (parse_u64(&p, (uint64_t)INT64_MAX, &version) || version == 0 || *p != ';') {
        cm_err(err, errlen, "cluster map: bad version");
        return PC_EPARSE;
    }
    if (p + 1 != ss &&
        (strncmp(p + 1, "unclean=", 8) != 0 || (p += 9, parse_u64(&p, UINT64_MAX, &unclean)) ||
         *p != ';' || p + 1 != ss)) {
        cm_err(err, errlen,
               "cluster map: bad field after the version (only unclean=N may come "
               "before servers=)");
        return PC_EPARSE;
    }
    /* Count servers. */
    p = ss + 8;
    const char *send = ls - 1; /* the ';' before slots= */
    size_t n = 1;
    for (const char *q = p; q < send; q++)
        n += *q == ',';
    if (n > PC_MAX_SERVERS) {
        cm_err(err, errlen, "cluster map: more than %u servers", PC_MAX_SERVERS);
        return PC_EPARSE;
    }
    pc_cluster_map_t *m;
    int rc = cm_alloc(n, &m);
    if (rc)
        return rc;
    m->version = version;
    m->unclean = unclean;
    for (size_t i = 0; i < n; i++) {
        const char *e = memchr(p, ',', (size_t)(send - p));
        if (!e)
            e = send;
        if (!valid_addr(p, (size_t)(e - p))) {
            cm_err(err, errlen, "cluster map: bad server address #%zu", i);
            pc_cmap_destroy(m);
            return PC_EPARSE;
        }
        memcpy(m->addrs[i], p, (size_t)(e - p));
        for (size_t j = 0; j < i; j++) {
            if (strcmp(m->addrs[j], m->addrs[i]) == 0) {
                cm_err(err, errlen, "cluster map: server %s listed twice", m->addrs[i]);
                pc_cmap_destroy(m);
                return PC_EPARSE;
            }
        }
        p = e + 1;
    }
    /* Slot ranges. */
    uint8_t *seen = calloc(PC_NSLOTS, 1);
    if (!seen) {
        pc_cmap_destroy(m);
        return PC_ENOMEM;
    }
    p = ls + 6;
    rc = 0;
    int said = 0; /* a specific message is already in err */
    while (*p) {  /* the slots field is the last one: everything up to the end is ranges */
        uint64_t lo, hi, srv;
        if (parse_u64(&p, PC_NSLOTS - 1, &lo)) {
            rc = PC_EPARSE;
            break;
        }
        hi = lo;
        if (*p == '-') {
            p++;
            if (parse_u64(&p, PC_NSLOTS - 1, &hi)) {
                rc = PC_EPARSE;
                break;
            }
        }
        if (*p != ':' || (p++, parse_u64(&p, n - 1, &srv)) || hi < lo) {
            rc = PC_EPARSE;
            break;
        }
        uint64_t bk[PC_MAX_BACKUPS];
        uint8_t mark[PC_MAX_BACKUPS];
        uint32_t nb = 0;
        while (*p == '/') {
            p++;
            if (nb == PC_MAX_BACKUPS || parse_u64(&p, n - 1, &bk[nb])) {
                cm_err(err, errlen, "cluster map: more than %u backups, or a bad one, near '%.20s'",
                       PC_MAX_BACKUPS, p);
                said = 1;
                rc = PC_EPARSE;
                break;
            }
            for (uint32_t j = 0; j <= nb && !rc; j++)
                if (bk[nb] == (j < nb ? bk[j] : srv)) {
                    cm_err(
                        err, errlen, "cluster map: server %llu is named twice for slots %llu-%llu",
                        (unsigned long long)bk[nb], (unsigned long long)lo, (unsigned long long)hi);
                    said = 1;
                    rc = PC_EPARSE;
                }
            if (rc)
                break;
            mark[nb] = *p == '~';
            p += mark[nb++];
        }
        if (rc)
            break;
        for (uint64_t s = lo; s <= hi; s++) {
            for (uint32_t j = 0; j < nb; j++) {
                m->backup[j][s] = (uint16_t)bk[j];
                m->syncing[j][s] = mark[j];
            }
            if (seen[s]) {
                cm_err(err, errlen, "cluster map: slot %llu assigned twice", (unsigned long long)s);
                said = 1;
                rc = PC_EPARSE;
                break;
            }
            seen[s] = 1;
            m->owner[s] = (uint16_t)srv;
        }
        if (rc)
            break;
        if (*p == ',' && isdigit((unsigned char)p[1]))
            p++;
        else if (*p)
            rc = PC_EPARSE; /* trailing comma, another field or garbage */
    }
    for (uint32_t s = 0; rc == 0 && s < PC_NSLOTS; s++) {
        if (!seen[s]) {
            cm_err(err, errlen, "cluster map: slot %u not assigned", s);
            said = 1;
            rc = PC_EPARSE;
        }
    }
    free(seen);
    if (rc) {
        if (!said)
            cm_err(err, errlen, "cluster map: bad slots list near '%.20s'", p);
        pc_cmap_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Whether slot sa of a and slot sb of b have the same primary and backups, in order. */
static bool roles_equal(const pc_cluster_map_t *a, uint32_t sa, const pc_cluster_map_t *b,
                        uint32_t sb) {
    if (a->owner[sa] != b->owner[sb])
        return false;
    for (uint32_t j = 0; j < PC_MAX_BACKUPS; j++)
        if (a->backup[j][sa] != b->backup[j][sb])
            return false;
    return true;
}

/* Whether slots a and b of m have the same roles and marks (one range in the text form). */
static bool same_roles(const pc_cluster_map_t *m, uint32_t a, uint32_t b) {
    for (uint32_t j = 0; j < PC_MAX_BACKUPS; j++)
        if (m->syncing[j][a] != m->syncing[j][b])
            return false;
    return roles_equal(m, a, m, b);
}

size_t pc_cmap_format(const pc_cluster_map_t *m, char *buf, size_t cap) {
    size_t len = 0;
#define CM_PUT(...)                                                                              \
    do {                                                                                         \
        int w_ = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__); \
        if (w_ > 0)                                                                              \
            len += (size_t)w_;                                                                   \
    } while (0)
    if (cap)
        buf[0] = '\0';
    CM_PUT("version=%llu;", (unsigned long long)m->version);
    if (m->unclean) /* absent while 0: the text of a map that never lost rows is unchanged */
        CM_PUT("unclean=%llu;", (unsigned long long)m->unclean);
    CM_PUT("servers=");
    for (size_t i = 0; i < m->nservers; i++)
        CM_PUT("%s%s", i ? "," : "", m->addrs[i]);
    CM_PUT(";slots=");
    for (uint32_t s = 0; s < PC_NSLOTS;) {
        uint32_t e = s;
        while (e + 1 < PC_NSLOTS && same_roles(m, e + 1, s))
            e++;
        CM_PUT("%s%u-%u:%u", s ? "," : "", s, e, m->owner[s]);
        for (uint32_t j = 0; j < PC_MAX_BACKUPS && m->backup[j][s] != PC_NO_SERVER; j++)
            CM_PUT("/%u%s", m->backup[j][s], m->syncing[j][s] ? "~" : "");
        s = e + 1;
    }
#undef CM_PUT
    return len;
}

uint32_t pc_cmap_slot_backups(const pc_cluster_map_t *m, uint32_t slot,
                              uint32_t out[PC_MAX_BACKUPS]) {
    uint32_t n = 0;
    slot &= PC_NSLOTS - 1;
    while (n < PC_MAX_BACKUPS && m->backup[n][slot] != PC_NO_SERVER) {
        out[n] = m->backup[n][slot];
        n++;
    }
    return n;
}

void pc_cmap_backed_up(const pc_cluster_map_t *m, uint32_t primary, uint32_t backup,
                       uint64_t *bits) {
    memset(bits, 0, PC_NSLOTS / 8);
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (m->owner[s] == primary && (backup == PC_NO_SERVER || pc_cmap_is_backup(m, s, backup)))
            pc_slots_add(bits, s);
}

bool pc_cmap_is_backup(const pc_cluster_map_t *m, uint32_t slot, uint32_t server) {
    slot &= PC_NSLOTS - 1;
    for (uint32_t j = 0; j < PC_MAX_BACKUPS; j++)
        if (m->backup[j][slot] == server)
            return true;
    return false;
}

bool pc_cmap_replicated(const pc_cluster_map_t *m) {
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (m->backup[0][s] != PC_NO_SERVER)
            return true;
    return false;
}

bool pc_cmap_unreplicated(const pc_cluster_map_t *m) {
    if (pc_cmap_replicated(m))
        return false;
    for (size_t i = 0; i < m->nservers; i++)
        if (!pc_cmap_has_role(m, (uint32_t)i))
            return false;
    return true;
}

int pc_cmap_set_replicas(pc_cluster_map_t *m, uint32_t r) {
    if (r > PC_MAX_BACKUPS || (r && r >= m->nservers))
        return PC_EINVAL;
    memset(m->backup, 0xff, sizeof m->backup);
    memset(m->syncing, 0, sizeof m->syncing); /* a map being built: every server starts alike */
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        for (uint32_t j = 0; j < r; j++)
            m->backup[j][s] = (uint16_t)((m->owner[s] + 1 + j) % m->nservers);
    return 0;
}

/* Remove `server` from slot s's backups, closing the gap (marks move with their backups). */
static void drop_backup(pc_cluster_map_t *m, uint32_t s, uint32_t server) {
    uint32_t w = 0;
    for (uint32_t j = 0; j < PC_MAX_BACKUPS; j++)
        if (m->backup[j][s] != server) {
            m->syncing[w][s] = m->syncing[j][s];
            m->backup[w++][s] = m->backup[j][s];
        }
    for (; w < PC_MAX_BACKUPS; w++) {
        m->backup[w][s] = PC_NO_SERVER;
        m->syncing[w][s] = 0;
    }
}

/* Where server is in slot s's backups, or PC_MAX_BACKUPS. */
static uint32_t backup_at(const pc_cluster_map_t *m, uint32_t s, uint32_t server) {
    uint32_t j = 0;
    while (j < PC_MAX_BACKUPS && m->backup[j][s] != server)
        j++;
    return j;
}

bool pc_cmap_backup_syncing(const pc_cluster_map_t *m, uint32_t slot, uint32_t server) {
    slot &= PC_NSLOTS - 1;
    const uint32_t j = backup_at(m, slot, server);
    return j < PC_MAX_BACKUPS && m->syncing[j][slot];
}

uint32_t pc_cmap_set_syncing(pc_cluster_map_t *m, uint32_t primary, uint32_t server, bool syncing) {
    uint32_t n = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        const uint32_t j = m->owner[s] == primary ? backup_at(m, s, server) : PC_MAX_BACKUPS;
        if (j < PC_MAX_BACKUPS && (bool)m->syncing[j][s] != syncing) {
            m->syncing[j][s] = syncing;
            n++;
        }
    }
    return n;
}

/* Slot s has a new primary: every backup left followed the old one, not it, so none holds what
 * the new primary acknowledges until it has copied and caught up (its data plane does not wait
 * for a backup new to it): all are marked catching up, and a promotion from one of them before
 * it clears its mark is counted unclean (it was counted clean, the pushes the new primary had
 * acknowledged meanwhile missing). */
static void mark_all_syncing(pc_cluster_map_t *m, uint32_t s) {
    for (uint32_t j = 0; j < PC_MAX_BACKUPS && m->backup[j][s] != PC_NO_SERVER; j++)
        m->syncing[j][s] = 1;
}

int pc_cmap_fail_server(pc_cluster_map_t *m, uint32_t dead, uint64_t new_version,
                        pc_cmap_failover_t *out) {
    if (dead >= m->nservers || !version_next_ok(m, new_version))
        return PC_EINVAL;
    pc_cmap_failover_t f = {0, 0, 0};
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        if (m->owner[s] != dead) {
            drop_backup(m, s, dead);
            continue;
        }
        if (m->backup[0][s] == PC_NO_SERVER) {
            f.orphaned++;
            continue;
        }
        uint32_t j = 0; /* the first in sync, else the first */
        while (j < PC_MAX_BACKUPS && m->backup[j][s] != PC_NO_SERVER && m->syncing[j][s])
            j++;
        if (j == PC_MAX_BACKUPS || m->backup[j][s] == PC_NO_SERVER) {
            j = 0;
            f.unclean++;
        }
        m->owner[s] = m->backup[j][s];
        drop_backup(m, s, m->owner[s]);
        mark_all_syncing(m, s);
        f.promoted++;
    }
    m->version = new_version;
    pc_cmap_unclean_add(m, f.unclean);
    if (out)
        *out = f;
    return 0;
}

int pc_cmap_add_backup(pc_cluster_map_t *m, uint32_t server, uint32_t r, uint64_t new_version,
                       uint32_t *added) {
    if (server >= m->nservers || r > PC_MAX_BACKUPS || !version_next_ok(m, new_version))
        return PC_EINVAL;
    uint32_t na = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        if (m->owner[s] == server || pc_cmap_is_backup(m, s, server))
            continue;
        uint32_t j = 0;
        while (j < PC_MAX_BACKUPS && m->backup[j][s] != PC_NO_SERVER)
            j++;
        if (j < r) {
            m->backup[j][s] = (uint16_t)server;
            m->syncing[j][s] = 1; /* it copies the primary's rows first */
            na++;
        }
    }
    if (na)
        m->version = new_version;
    if (added)
        *added = na;
    return 0;
}

int pc_cmap_bump(pc_cluster_map_t *m, uint64_t new_version) {
    if (!version_next_ok(m, new_version))
        return PC_EINVAL;
    m->version = new_version;
    return 0;
}

/* ---- live resharding ---- */

int pc_cmap_add_server(pc_cluster_map_t *m, const char *addr, uint64_t new_version) {
    if (!addr || !valid_addr(addr, strlen(addr)) || !version_next_ok(m, new_version) ||
        m->nservers >= PC_MAX_SERVERS)
        return PC_EINVAL;
    if (pc_cmap_find(m, addr) >= 0)
        return PC_EEXIST;
    char(*a)[PC_ADDR_MAX] = realloc(m->addrs, (m->nservers + 1) * sizeof *m->addrs);
    if (!a)
        return PC_ENOMEM;
    m->addrs = a;
    snprintf(m->addrs[m->nservers++], PC_ADDR_MAX, "%s", addr);
    m->version = new_version;
    return 0;
}

bool pc_cmap_slot_same(const pc_cluster_map_t *a, const pc_cluster_map_t *b, uint32_t slot) {
    slot &= PC_NSLOTS - 1;
    return roles_equal(a, slot, b, slot);
}

/* pc_cmap_set_backups, where `had` (the slot's primary before, or PC_NO_SERVER) holds every row
 * of the slot: it is in sync as a backup. */
static int set_backups(pc_cluster_map_t *m, uint32_t slot, const uint32_t *b, uint32_t n,
                       uint32_t had) {
    if (n > PC_MAX_BACKUPS)
        return PC_EINVAL;
    for (uint32_t j = 0; j < n; j++) {
        if (b[j] >= m->nservers || b[j] == m->owner[slot])
            return PC_EINVAL;
        for (uint32_t i = 0; i < j; i++)
            if (b[i] == b[j])
                return PC_EINVAL;
    }
    uint8_t mark[PC_MAX_BACKUPS] = {0};
    for (uint32_t j = 0; j < n; j++) {
        const uint32_t at = backup_at(m, slot, b[j]);
        mark[j] = at < PC_MAX_BACKUPS ? m->syncing[at][slot] : b[j] != had;
    }
    for (uint32_t j = 0; j < PC_MAX_BACKUPS; j++) {
        m->backup[j][slot] = j < n ? (uint16_t)b[j] : PC_NO_SERVER;
        m->syncing[j][slot] = mark[j];
    }
    return 0;
}

bool pc_cmap_roles_same(const pc_cluster_map_t *a, const pc_cluster_map_t *b) {
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (!roles_equal(a, s, b, s))
            return false;
    return true;
}

int pc_cmap_set_backups(pc_cluster_map_t *m, uint32_t slot, const uint32_t *b, uint32_t n) {
    return set_backups(m, slot & (PC_NSLOTS - 1), b, n, PC_NO_SERVER);
}

int pc_cmap_take_slot(pc_cluster_map_t *m, const pc_cluster_map_t *from, uint32_t slot) {
    slot &= PC_NSLOTS - 1;
    uint32_t b[PC_MAX_BACKUPS];
    const uint32_t n = pc_cmap_slot_backups(from, slot, b);
    if (from->owner[slot] >= m->nservers)
        return PC_EINVAL;
    const uint16_t owner = m->owner[slot];
    m->owner[slot] = from->owner[slot];
    int rc = set_backups(m, slot, b, n, owner);
    if (rc)
        m->owner[slot] = owner;
    else if (m->owner[slot] != owner) /* a handover: no backup follows the new primary yet */
        mark_all_syncing(m, slot);
    return rc;
}

bool pc_cmap_has_role(const pc_cluster_map_t *m, uint32_t server) {
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        if (m->owner[s] == server || pc_cmap_is_backup(m, s, server))
            return true;
    return false;
}

/* The most backups any slot has. */
static uint32_t backups_per_slot(const pc_cluster_map_t *m) {
    uint32_t r = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        while (r < PC_MAX_BACKUPS && m->backup[r][s] != PC_NO_SERVER)
            r++;
    return r;
}

int pc_cmap_plan_add(const pc_cluster_map_t *m, uint32_t server, pc_cluster_map_t **out) {
    if (server >= m->nservers || pc_cmap_has_role(m, server))
        return PC_EINVAL;
    uint32_t *count = calloc(m->nservers, sizeof *count), k = 0;
    if (!count)
        return PC_ENOMEM;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        k += count[m->owner[s]]++ == 0;
    pc_cluster_map_t *t = NULL;
    int rc = pc_cmap_copy(m, &t);
    const uint32_t r = backups_per_slot(m);
    for (uint32_t p = 0; !rc && p < m->nservers; p++) {
        uint32_t move = count[p] / (k + 1); /* its last slots */
        for (uint32_t s = PC_NSLOTS; move && s-- > 0;) {
            if (m->owner[s] != p)
                continue;
            uint32_t b[PC_MAX_BACKUPS], old[PC_MAX_BACKUPS], n = 0;
            const uint32_t no = pc_cmap_slot_backups(m, s, old);
            if (r)
                b[n++] = p; /* the old primary holds the rows already */
            for (uint32_t j = 0; j < no && n < r; j++)
                if (old[j] != server)
                    b[n++] = old[j];
            t->owner[s] = (uint16_t)server;
            rc = pc_cmap_set_backups(t, s, b, n);
            move--;
        }
    }
    free(count);
    if (rc) {
        pc_cmap_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int pc_cmap_plan_remove(const pc_cluster_map_t *m, uint32_t server, pc_cluster_map_t **out) {
    if (server >= m->nservers)
        return PC_EINVAL;
    uint32_t *prim = calloc(m->nservers, sizeof *prim), *bk = calloc(m->nservers, sizeof *bk);
    bool *active = calloc(m->nservers, sizeof *active);
    pc_cluster_map_t *t = NULL;
    int rc = !prim || !bk || !active ? PC_ENOMEM : pc_cmap_copy(m, &t);
    uint32_t na = 0;
    for (uint32_t s = 0; !rc && s < PC_NSLOTS; s++) {
        prim[m->owner[s]]++;
        for (uint32_t j = 0; j < PC_MAX_BACKUPS && m->backup[j][s] != PC_NO_SERVER; j++)
            bk[m->backup[j][s]]++;
    }
    for (uint32_t i = 0; !rc && i < m->nservers; i++)
        if (i != server && (prim[i] || bk[i]))
            active[i] = true, na++;
    if (!rc && !na && (prim[server] || bk[server]))
        rc = PC_EINVAL; /* nowhere to go */
    const uint32_t r = backups_per_slot(m) < na ? backups_per_slot(m) : na - (na > 0);
    /* by runs of slots with the same roles, so the map stays a few ranges */
    for (uint32_t s = 0, e; !rc && s < PC_NSLOTS; s = e + 1) {
        for (e = s; e + 1 < PC_NSLOTS && same_roles(m, e + 1, s);)
            e++;
        const uint32_t len = e - s + 1;
        uint32_t old[PC_MAX_BACKUPS], b[PC_MAX_BACKUPS], n = 0, owner = m->owner[s];
        const uint32_t no = pc_cmap_slot_backups(m, s, old);
        if (owner != server && !pc_cmap_is_backup(m, s, server))
            continue;
        if (owner == server) {
            uint32_t best = PC_NO_SERVER;
            for (uint32_t i = 0; i < m->nservers; i++)
                if (active[i] && (best == PC_NO_SERVER || prim[i] < prim[best]))
                    best = i;
            owner = no ? old[0] : best;
            prim[owner] += len;
            prim[server] -= len;
        }
        for (uint32_t j = 0; j < no; j++)
            if (old[j] != server && old[j] != owner)
                b[n++] = old[j];
            else /* the removed server's place, or the promoted backup's: counted no more (the
                  * promoted one looked loaded still, and later runs passed it over) */
                bk[old[j]] -= len;
        while (n < r) { /* the least loaded server with a role that holds none of it */
            uint32_t best = PC_NO_SERVER;
            for (uint32_t i = 0; i < m->nservers; i++) {
                bool taken = !active[i] || i == owner;
                for (uint32_t j = 0; j < n; j++)
                    taken = taken || b[j] == i;
                if (!taken && (best == PC_NO_SERVER || bk[i] < bk[best]))
                    best = i;
            }
            if (best == PC_NO_SERVER)
                break;
            b[n++] = best;
            bk[best] += len;
        }
        for (uint32_t x = s; !rc && x <= e; x++) {
            t->owner[x] = (uint16_t)owner;
            rc = pc_cmap_set_backups(t, x, b, n);
        }
    }
    free(prim);
    free(bk);
    free(active);
    if (rc) {
        pc_cmap_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}
