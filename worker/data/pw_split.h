/* pw_split.h: a time-ordered train/test split of a delimited text file (MovieLens ratings and
 * the like: `ps-datagen --split`).
 *
 * Rows are ordered by the number in column `col` (0-based; a timestamp), stably (equal values
 * keep file order); the first (1 - test_fraction) of them go to train_out, the rest to test_out.
 * A header line (header = true) is copied to both. The file is read whole into memory.
 *
 * Errors: PC_EIO (with the path logged), PC_EPARSE (a row without a number in `col`: its line
 * logged; nothing is written), PC_EINVAL (fraction outside (0, 1), col < 0), PC_ENOMEM.
 *
 * Thread rule: no shared state.
 */
#ifndef PW_SPLIT_H
#define PW_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

int pw_split_by_column(const char *in, char sep, bool header, int col, double test_fraction,
                       const char *train_out, const char *test_out, uint64_t *ntrain,
                       uint64_t *ntest);

#endif
