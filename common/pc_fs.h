/* pc_fs.h: file-system helpers shared by the stores (checkpoints, the RocksDB tier) and the
 * worker's files (job checkpoints, published models). */
#ifndef PC_FS_H
#define PC_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* fsync a directory (or file) by path. 0 or PC_EIO. */
int pc_fs_fsync_path(const char *path);
/* fsync the directory holding path (an entry made, renamed or removed there durable). */
int pc_fs_fsync_parent(const char *path);

/* Write len bytes to path atomically: into PATH.tmp, fsynced, renamed over path, directory
 * fsynced; a crash leaves the old file or the new one. 0, PC_EINVAL (path too long),
 * PC_ENOSPC (the disk is full), PC_EIO. */
int pc_fs_write_atomic(const char *path, const void *buf, size_t len);

/* Remove a file or a directory tree; missing is fine. Does not follow symlinks. */
void pc_fs_rm_tree(const char *path);

/* Put directory `tmp` (written whole) in place as `fin`, replacing one there, and fsync their
 * parent `dir`: readers see the old directory, then the new one (exchanged in one rename, where
 * the filesystem can: else none for a moment), never a mix, and a crash leaves one of the two
 * whole at fin once pc_fs_remove_tmp_numbered or pc_fs_restore_replaced ran (the old one moved
 * aside to tmp.old goes back when fin is missing). The old one is removed (a crash may leave it at
 * tmp or tmp.old). 0, PC_ENOSPC or PC_EIO (an error after the swap: fin may already be the new one,
 * not yet durable). */
int pc_fs_replace_dir(const char *tmp, const char *fin, const char *dir);

/* A reader's repair before it looks at fin, a directory pc_fs_replace_dir replaces: when fin is
 * missing and fin.tmp.old is there (a crash between the fallback's two renames), it goes back
 * to fin (renames only: safe beside other readers, not beside a writer replacing the same fin,
 * whose second rename it would fail; leftovers stay for the writer's pc_fs_remove_tmp_numbered). 1
 * when put back, 0 when there was nothing to do, else an error. */
int pc_fs_restore_replaced(const char *fin);

/* The numbers N of dir's entries named exactly PREFIX<N> (decimal digits, any zero padding: a
 * job's step-<S>/, published dense-<S>/), ascending, into *out (malloc'ed, the caller frees
 * it; NULL when none); returns how many. 0 when dir cannot be read; on an allocation failure,
 * 0 and nothing allocated. */
size_t pc_fs_numbered(const char *dir, const char *prefix, uint64_t **out);

/* Of dir's PREFIX<N> entries (numbered as above), keep the `keep` highest N up to `latest` and
 * remove the others, those above latest too (abandoned by a rollback, or half-written by a
 * crash): each renamed to PREFIX<N>.tmp first (pc_fs_remove_tmp_numbered's), then removed. Entries
 * are named with N in 20 digits, as their writers make them. */
void pc_fs_prune_numbered(const char *dir, const char *prefix, uint64_t latest, size_t keep);

/* Remove dir's PREFIX<N>.tmp entries (N decimal digits): what a crash left half-written; and
 * PREFIX<N>.tmp.old ones (pc_fs_replace_dir's old copy moved aside), except one without a
 * PREFIX<N>, which is put back there (a crash between the fallback's two renames). */
void pc_fs_remove_tmp_numbered(const char *dir, const char *prefix);

/* Sealed text files (manifests): the text is followed by a last line "xxh3 " and the 16 hex
 * digits of the XXH3-64 of every byte before that line, then "\n" (PC_FS_SEAL_LEN bytes).
 * pc_fs_seal writes that line at text + len (cap: at least len + PC_FS_SEAL_LEN + 1; it is
 * terminated) and returns the sealed length. pc_fs_seal_check: when text[0, *len) ends with a
 * seal line, 0 and *sealed when it matches (*len then ends before it), PC_ECORRUPT when not;
 * without one (an older file, or a damaged seal line: a format that asks for a seal refuses
 * it then), 0 and !*sealed. */
#define PC_FS_SEAL_LEN (5 + 16 + 1)
size_t pc_fs_seal(char *text, size_t len, size_t cap);
int pc_fs_seal_check(const char *text, size_t *len, bool *sealed);

/* Make every directory of `path` (mode 0755), each one made fsynced into its parent (a power
 * loss keeps it). 0, PC_ENOSPC or PC_EIO. */
int pc_fs_mkdirs(const char *path);

/* Copy the regular files of directory `src` into `dst` (existing, flat: subdirectories are an
 * error). Files whose name ends in `link_suffix` (may be NULL) are hard-linked when src and dst
 * share a file system, copied otherwise. 0, PC_ENOSPC or PC_EIO. */
int pc_fs_clone_dir(const char *src, const char *dst, const char *link_suffix);

/* Hold directory dir for this process (a daemon's data: two servers writing one checkpoint
 * directory would prune and overwrite each other's): an exclusive flock on dir/LOCK (made, and
 * dir with it), which this process's pid is written into; kept until the process ends (the fd
 * is not inherited). 0 with *fd the lock's descriptor; PC_EEXIST when another process holds it
 * (its pid into *holder when it wrote one, else 0); PC_EIO (said why on the log). A killed
 * holder's lock goes with it. */
int pc_fs_lock_dir(const char *dir, int *fd, long *holder);

/* Read the whole file at path (at most max bytes) into *out, malloc'ed and NUL-terminated (the
 * caller frees it), its length in *len (may be NULL). 0, PC_ENOTFOUND (no such file), PC_ETOOBIG
 * (over max), PC_ENOMEM, PC_EIO. For small files: PEM certificates and keys. */
int pc_fs_read_all(const char *path, size_t max, char **out, size_t *len);

/* Bytes available to unprivileged users on the file system holding path; UINT64_MAX when it
 * cannot be read. */
uint64_t pc_fs_free_bytes(const char *path);

#endif
