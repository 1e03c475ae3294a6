/* pc_fs: replacing a directory whole and pruning numbered ones.
 *
 * test_replace_never_mixed: a reader thread lists the directory while it is replaced again and
 * again by one of another file set; every listing must be one set whole (the old one was emptied
 * file by file before the rename, and a reader saw half of it). test_prune_renames: pruned
 * entries leave nothing numbered behind, and a leftover .tmp of one is taken too. */
#include "test_util.h"

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pc_fs.h"

enum { FILES = 64, ROUNDS = 60 };

static char g_dir[64], g_fin[128];
static atomic_int g_stop, g_mixed, g_lists;

/* Directory path holding FILES files named <set>-<i>. */
static void fill(const char *path, char set) {
    assert_true(strlen(path) < 200);
    assert_int_equal(mkdir(path, 0755), 0);
    for (int i = 0; i < FILES; i++) {
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/%c-%02d", path, set, i);
        FILE *fp = fopen(f, "w");
        assert_non_null(fp);
        fclose(fp);
    }
}

/* Lists g_fin until told to stop: each listing must be FILES files of one set (or no directory,
 * between a rename and the next where the filesystem cannot exchange two). */
static void *reader(void *arg) {
    (void)arg;
    while (!atomic_load(&g_stop)) {
        DIR *d = opendir(g_fin);
        if (!d)
            continue;
        int n[2] = {0, 0};
        for (struct dirent *e; (e = readdir(d));)
            if (e->d_name[0] == 'a' || e->d_name[0] == 'b')
                n[e->d_name[0] == 'b']++;
        struct stat was, now;
        const bool same =
            fstat(dirfd(d), &was) == 0 && stat(g_fin, &now) == 0 && was.st_ino == now.st_ino;
        closedir(d);
        if (!same)
            continue; /* replaced while listed: the old one, being removed after its swap */
        atomic_fetch_add(&g_lists, 1);
        if (!((n[0] == FILES && n[1] == 0) || (n[0] == 0 && n[1] == FILES)))
            atomic_fetch_add(&g_mixed, 1);
    }
    return NULL;
}

static void test_replace_never_mixed(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ember-fs-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char tmp[160];
    snprintf(g_fin, sizeof g_fin, "%s/step-%020d", g_dir, 7);
    snprintf(tmp, sizeof tmp, "%s.tmp", g_fin);
    fill(g_fin, 'a');
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, reader, NULL), 0);
    for (int r = 0; r < ROUNDS; r++) {
        fill(tmp, r % 2 ? 'a' : 'b');
        assert_int_equal(pc_fs_replace_dir(tmp, g_fin, g_dir), 0);
        assert_int_equal(access(tmp, F_OK), -1); /* the old one is gone */
    }
    atomic_store(&g_stop, 1);
    pthread_join(th, NULL);
    print_message("%d listings, %d of them mixed\n", atomic_load(&g_lists), atomic_load(&g_mixed));
    assert_int_equal(atomic_load(&g_mixed), 0);
    assert_true(atomic_load(&g_lists) > 0); /* (something was looked at) */
    /* into a place where there is none */
    char fresh[128];
    snprintf(fresh, sizeof fresh, "%s/step-%020d", g_dir, 8);
    fill(tmp, 'a');
    assert_int_equal(pc_fs_replace_dir(tmp, fresh, g_dir), 0);
    assert_int_equal(access(tmp, F_OK), -1);
    pc_fs_rm_tree(g_dir);
}

static void test_prune_renames(void **state) {
    (void)state;
    char dir[64], p[160];
    snprintf(dir, sizeof dir, "/tmp/ember-fs-XXXXXX");
    assert_non_null(mkdtemp(dir));
    for (int n = 1; n <= 6; n++) {
        snprintf(p, sizeof p, "%s/step-%020d", dir, n);
        fill(p, 'a');
    }
    snprintf(p, sizeof p, "%s/step-%020d.tmp", dir, 2); /* a crash's leftover of a prune */
    fill(p, 'b');
    pc_fs_prune_numbered(dir, "step-", 4, 2); /* keeps 3 and 4; 5 and 6 were abandoned */
    uint64_t *v;
    const size_t n = pc_fs_numbered(dir, "step-", &v);
    assert_int_equal(n, 2);
    assert_int_equal(v[0], 3);
    assert_int_equal(v[1], 4);
    free(v);
    /* pc_fs_replace_dir's fallback, crashed between its renames: 3's old copy aside with 3
     * still there (removed), 9's aside with no 9 (put back, the only whole copy) */
    snprintf(p, sizeof p, "%s/step-%020d.tmp.old", dir, 3);
    fill(p, 'b');
    snprintf(p, sizeof p, "%s/step-%020d.tmp.old", dir, 9);
    fill(p, 'b');
    pc_fs_remove_tmp_numbered(dir, "step-");
    DIR *d = opendir(dir);
    assert_non_null(d);
    int left = 0;
    for (struct dirent *e; (e = readdir(d));)
        left += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(left, 3);
    snprintf(p, sizeof p, "%s/step-%020d/b-00", dir, 9);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/step-%020d/a-00", dir, 3);
    assert_int_equal(access(p, F_OK), 0);
    pc_fs_rm_tree(dir);
}

/* A reader's repair: fin missing, its old copy aside (put back; the writer's tmp left alone);
 * again (nothing to do); fin there with a copy aside (both left). */
static void test_restore_replaced(void **state) {
    (void)state;
    char dir[64], fin[128], old[140], tmp[140], p[200];
    snprintf(dir, sizeof dir, "/tmp/ember-fs-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(fin, sizeof fin, "%s/step-%020d", dir, 7);
    snprintf(old, sizeof old, "%s.tmp.old", fin);
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    fill(old, 'a');
    fill(tmp, 'b');
    assert_int_equal(pc_fs_restore_replaced(fin), 1);
    snprintf(p, sizeof p, "%s/a-00", fin);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(access(old, F_OK), -1);
    assert_int_equal(access(tmp, F_OK), 0);
    assert_int_equal(pc_fs_restore_replaced(fin), 0);
    fill(old, 'c');
    assert_int_equal(pc_fs_restore_replaced(fin), 0);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(access(old, F_OK), 0);
    pc_fs_rm_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replace_never_mixed),
        cmocka_unit_test(test_prune_renames),
        cmocka_unit_test(test_restore_replaced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
