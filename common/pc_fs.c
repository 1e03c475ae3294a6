/* pc_fs.c: see pc_fs.h. */
#include "pc_fs.h"

#include "pc_error.h"
#include "pc_hash.h"
#include "pc_log.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int errno_rc(int e) {
    return e == ENOSPC || e == EDQUOT ? PC_ENOSPC : PC_EIO;
}

int pc_fs_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return PC_EIO;
    int rc = fsync(fd) == 0 ? 0 : errno_rc(errno); /* (a delayed write back can be ENOSPC) */
    close(fd);
    return rc;
}

int pc_fs_fsync_parent(const char *path) {
    char copy[PATH_MAX];
    if ((size_t)snprintf(copy, sizeof copy, "%s", path) >= sizeof copy)
        return PC_EIO;
    return pc_fs_fsync_path(dirname(copy)); /* POSIX: "a/b/" -> "a", "b" -> ".", "/b" -> "/" */
}

int pc_fs_write_atomic(const char *path, const void *buf, size_t len) {
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return PC_EINVAL;
    FILE *f = fopen(tmp, "wb");
    int rc = f ? 0 : errno_rc(errno); /* (no inode left is ENOSPC too) */
    if (!rc && (fwrite(buf, 1, len, f) != len || fflush(f)))
        rc = errno_rc(errno);
    if (f && fclose(f) && !rc)
        rc = errno_rc(errno);
    if (!rc)
        rc = pc_fs_fsync_path(tmp);
    if (!rc && rename(tmp, path) != 0)
        rc = errno_rc(errno);
    if (rc) {
        remove(tmp);
        return rc;
    }
    return pc_fs_fsync_parent(path);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int pc_fs_restore_replaced(const char *fin) {
    char old[PATH_MAX];
    if ((size_t)snprintf(old, sizeof old, "%s.tmp.old", fin) >= sizeof old)
        return PC_EINVAL;
    if (access(fin, F_OK) == 0 || access(old, F_OK) != 0)
        return 0;
    if (rename(old, fin) != 0) /* another reader may have put it back first */
        return access(fin, F_OK) == 0 ? 0 : errno_rc(errno);
    (void)pc_fs_fsync_parent(fin);
    return 1;
}

void pc_fs_rm_tree(const char *path) {
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int pc_fs_replace_dir(const char *tmp, const char *fin, const char *dir) {
    /* rename cannot replace a directory with entries: the two are exchanged in one step, and the
     * old one, now at tmp, is removed once the exchange is durable (a crash before leaves it at
     * tmp, where the writer's leftovers are removed) */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) == 0) {
        const int rc = pc_fs_fsync_path(dir);
        if (!rc)
            pc_fs_rm_tree(tmp);
        return rc;
    }
    if (errno != ENOENT && errno != EINVAL && errno != ENOSYS)
        return errno_rc(errno);
    if (errno != ENOENT) { /* a filesystem without exchange: the old one moved aside first */
        char aside[PATH_MAX];
        if ((size_t)snprintf(aside, sizeof aside, "%s.old", tmp) >= sizeof aside)
            return PC_EIO;
        pc_fs_rm_tree(aside);
        if (rename(fin, aside) && errno != ENOENT)
            return errno_rc(errno);
        if (rename(tmp, fin)) {
            const int e = errno;
            (void)rename(aside, fin); /* the old one back */
            return errno_rc(e);
        }
        const int rc = pc_fs_fsync_path(dir);
        if (!rc) /* (else a crash may still find the new one not durable: the old one kept) */
            pc_fs_rm_tree(aside);
        return rc;
    }
    if (rename(tmp, fin)) /* none there */
        return errno_rc(errno);
    return pc_fs_fsync_path(dir);
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

size_t pc_fs_numbered(const char *dir, const char *prefix, uint64_t **out) {
    *out = NULL;
    DIR *d = dir && dir[0] ? opendir(dir) : NULL;
    if (!d)
        return 0;
    const size_t pl = strlen(prefix);
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        const char *p = e->d_name + pl;
        if (strncmp(e->d_name, prefix, pl) != 0 || !*p || strspn(p, "0123456789") != strlen(p))
            continue;
        if (n == cap) {
            uint64_t *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *nv);
            ok = nv != NULL;
            if (!ok)
                break;
            v = nv;
        }
        v[n++] = strtoull(p, NULL, 10);
    }
    closedir(d);
    if (!ok) {
        free(v);
        return 0;
    }
    if (n)
        qsort(v, n, sizeof *v, cmp_u64);
    *out = v;
    return n;
}

void pc_fs_prune_numbered(const char *dir, const char *prefix, uint64_t latest, size_t keep) {
    uint64_t *v;
    const size_t n = pc_fs_numbered(dir, prefix, &v);
    size_t newer = 0; /* kept so far, from the highest down */
    for (size_t i = n; i > 0; i--) {
        if (v[i - 1] <= latest && newer < keep) {
            newer++;
            continue;
        }
        /* renamed first: a crash while removing leaves no numbered entry with part of its
         * files, but a leftover that pc_fs_remove_tmp_numbered takes */
        char path[PATH_MAX], gone[PATH_MAX + 8];
        snprintf(path, sizeof path, "%s/%s%020llu", dir, prefix, (unsigned long long)v[i - 1]);
        snprintf(gone, sizeof gone, "%s.tmp", path);
        pc_fs_rm_tree(gone);
        pc_fs_rm_tree(rename(path, gone) ? path : gone);
    }
    (void)pc_fs_fsync_path(dir);
    free(v);
}

void pc_fs_remove_tmp_numbered(const char *dir, const char *prefix) {
    DIR *d = dir && dir[0] ? opendir(dir) : NULL;
    if (!d)
        return;
    const size_t pl = strlen(prefix);
    char path[PATH_MAX];
    for (struct dirent *e; (e = readdir(d));) {
        const char *p = e->d_name + pl;
        const size_t digits = strncmp(e->d_name, prefix, pl) ? 0 : strspn(p, "0123456789");
        const bool tmp = digits && strcmp(p + digits, ".tmp") == 0,
                   old = digits && strcmp(p + digits, ".tmp.old") == 0;
        if ((!tmp && !old) ||
            (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            continue;
        if (old) { /* pc_fs_replace_dir's old copy, moved aside: back when it had no successor
                    * (kept when it could not go back) */
            char fin[PATH_MAX];
            snprintf(fin, sizeof fin, "%.*s", (int)(strlen(path) - strlen(".tmp.old")), path);
            if (pc_fs_restore_replaced(fin) != 0)
                continue;
        }
        pc_fs_rm_tree(path);
    }
    closedir(d);
}

size_t pc_fs_seal(char *text, size_t len, size_t cap) {
    assert(cap >= len + PC_FS_SEAL_LEN + 1);
    snprintf(text + len, cap - len, "xxh3 %016" PRIx64 "\n", pc_hash64(text, len, 0));
    return len + PC_FS_SEAL_LEN;
}

int pc_fs_seal_check(const char *text, size_t *len, bool *sealed) {
    *sealed = false;
    if (*len < PC_FS_SEAL_LEN)
        return 0;
    const char *line = text + *len - PC_FS_SEAL_LEN;
    if (memcmp(line, "xxh3 ", 5) != 0 || text[*len - 1] != '\n')
        return 0;
    char want[24];
    snprintf(want, sizeof want, "%016" PRIx64, pc_hash64(text, (size_t)(line - text), 0));
    if (memcmp(line + 5, want, 16) != 0)
        return PC_ECORRUPT;
    *len = (size_t)(line - text);
    *sealed = true;
    return 0;
}

int pc_fs_mkdirs(const char *path) {
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return PC_EINVAL;
    memcpy(buf, path, n + 1);
    size_t parent = 0; /* where the component being made starts after its parent's '/' */
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) == 0) { /* made: its entry in the parent is made durable too */
            char up[PATH_MAX];
            if (parent)
                snprintf(up, sizeof up, "%.*s", (int)parent, buf);
            else
                snprintf(up, sizeof up, "%s", buf[0] == '/' ? "/" : ".");
            if (pc_fs_fsync_path(up)) {
                PC_ERROR("mkdir %s: cannot fsync %s", buf, up);
                return PC_EIO;
            }
        } else if (errno != EEXIST) {
            int e = errno;
            PC_ERROR("mkdir %s: %s", buf, strerror(e));
            return errno_rc(e);
        }
        buf[i] = c;
        parent = i;
    }
    return 0;
}

static int copy_file(const char *src, const char *dst) {
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return PC_EIO;
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        int e = errno;
        close(in);
        return errno_rc(e);
    }
    char buf[1 << 16];
    int rc = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? PC_EIO : 0;
            break;
        }
        for (ssize_t off = 0; off < r && !rc;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0)
                rc = errno_rc(errno);
            else
                off += w;
        }
        if (rc)
            break;
    }
    if (close(out) != 0 && !rc)
        rc = PC_EIO;
    close(in);
    return rc;
}

int pc_fs_clone_dir(const char *src, const char *dst, const char *link_suffix) {
    DIR *d = opendir(src);
    if (!d) {
        PC_ERROR("clone %s: %s", src, strerror(errno));
        return PC_EIO;
    }
    const size_t sl = link_suffix ? strlen(link_suffix) : 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char from[PATH_MAX], to[PATH_MAX];
        if ((size_t)snprintf(from, sizeof from, "%s/%s", src, e->d_name) >= sizeof from ||
            (size_t)snprintf(to, sizeof to, "%s/%s", dst, e->d_name) >= sizeof to) {
            rc = PC_EINVAL;
            break;
        }
        struct stat st;
        if (lstat(from, &st) != 0 || !S_ISREG(st.st_mode)) {
            PC_ERROR("clone %s: %s is not a regular file", src, e->d_name);
            rc = PC_EIO;
            break;
        }
        const size_t nl = strlen(e->d_name);
        if (sl && nl >= sl && strcmp(e->d_name + nl - sl, link_suffix) == 0 && link(from, to) == 0)
            continue;
        rc = copy_file(from, to);
    }
    closedir(d);
    return rc;
}

uint64_t pc_fs_free_bytes(const char *path) {
    struct statvfs v;
    if (statvfs(path, &v) != 0)
        return UINT64_MAX;
    return (uint64_t)v.f_bavail * v.f_frsize;
}

int pc_fs_read_all(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    if (len)
        *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? PC_ENOTFOUND : PC_EIO;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return PC_EIO;
    }
    if ((uint64_t)st.st_size > max) {
        fclose(f);
        return PC_ETOOBIG;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return PC_ENOMEM;
    }
    const size_t n = fread(buf, 1, (size_t)st.st_size, f);
    const bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) {
        free(buf);
        return PC_EIO;
    }
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int pc_fs_lock_dir(const char *dir, int *fd, long *holder) {
    *fd = -1;
    *holder = 0;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/LOCK", dir) >= (int)sizeof path)
        return PC_EINVAL;
    int rc = pc_fs_mkdirs(dir);
    if (rc)
        return rc;
    const int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0) {
        PC_ERROR("%s: %s", path, strerror(errno));
        return PC_EIO;
    }
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char buf[32] = "";
        const ssize_t n = pread(f, buf, sizeof buf - 1, 0);
        close(f);
        if (e != EWOULDBLOCK) {
            PC_ERROR("%s: flock: %s", path, strerror(e));
            return PC_EIO;
        }
        *holder = n > 0 ? strtol(buf, NULL, 10) : 0;
        return PC_EEXIST;
    }
    char pid[32];
    const int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(f, 0) != 0 || pwrite(f, pid, (size_t)len, 0) != len) /* (only a hint) */
        PC_WARN("%s: cannot write this process's pid: %s", path, strerror(errno));
    *fd = f;
    return 0;
}
