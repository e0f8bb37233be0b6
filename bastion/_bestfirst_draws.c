/*
 * The synthetic drafter's steps: draws(...) turns the random draws of the requested steps into
 * their marginals and target tokens, what bastion.sim.synthetic.SyntheticSource._refill_numpy
 * computes in numpy for a whole block (its reference), operation for operation: the same
 * products, quotients and comparisons in the same order (no fused multiply-adds, see
 * _bestfirst.h), so the arrays are identical. The cumulative sums of the target's law are added
 * in rank order; numpy forms them as a product with a triangular matrix of ones, whose sums the
 * tests check are the same. A request draws a block of steps at once (its generator's order);
 * a step's marginals are computed here when the step is drafted, for the steps drafted only
 * (a request that finishes mid-block leaves the rest of its block undrawn into marginals).
 *
 * draws(bank, pick, head, u, length, law, target_u, rows, depth, k, bank_size, branch_rate,
 *       fork_rate, fork_ratio_min, probs, target) -> None
 *   bank:     [2 * bank_size, k] runner-up spreads (the second half shifted for forks)
 *   pick:     [n, depth] int64 rows of the bank's first half, per stored step
 *   head:     [n, depth] head masses
 *   u:        [n, 2 * depth + 5] uniforms: the branch's 5 per step, then 2 per position
 *   length:   [n] branch lengths
 *   law:      [depth, k] the target's law per rank, c_r * a_k
 *   target_u: [n, depth] the target's uniforms
 *   rows:     [B] int64: which of the n stored steps to compute, in the batch's order
 *   probs:    [B, depth, k] written: the marginals, each row sorted descending
 *   target:   [B, depth + 1] int64 written: the target's rank per position (k: outside the
 *             row), -1 after the last
 */
#include "_bestfirst.h"

#define DRAWS_MAX_K 1024 /* the widest row (the caller uses numpy beyond) */

/* One position's row: marginals p (from its bank row), the target's law w, sorted together
   where the head fell below a runner-up (numpy's stable argsort of -p), then the target's rank:
   how many of the cumulative law (scaled down to a total of 1 where above) lie below tu. */
static int64_t draws_one(const double *row, double h, int fork, int branch, int second, double v,
                         const double *law, double tu, Py_ssize_t k, double *p, double *w,
                         double *tmp) {
    double om = 1.0 - h;
    for (Py_ssize_t r = 0; r < k; r++) p[r] = row[r] * om;
    if (fork) {
        if (k >= 2) p[1] = h * v / (1.0 + v);
        p[0] = h / (1.0 + v);
    } else {
        p[0] = h;
    }
    for (Py_ssize_t r = 0; r < k; r++) w[r] = p[r] * law[r];
    if (fork && k >= 2) w[1] = p[1] * law[0];
    if (branch && k >= 2) { /* the whole head mass to the side the target follows */
        double total = w[0] + w[1];
        w[0] = second ? 0.0 : total;
        w[1] = second ? total : 0.0;
    }
    int unsorted = 0;
    if (k >= 3) {
        unsorted = p[1] > p[0] || p[2] > p[1];
    } else {
        for (Py_ssize_t r = 0; r + 1 < k; r++) unsorted |= p[r + 1] > p[r];
    }
    if (unsorted) { /* stable insertion sort by p descending, w along */
        for (Py_ssize_t i = 1; i < k; i++) {
            double pi = p[i], wi = w[i];
            Py_ssize_t j = i;
            for (; j > 0 && pi > p[j - 1]; j--) {
                p[j] = p[j - 1];
                w[j] = w[j - 1];
            }
            p[j] = pi;
            w[j] = wi;
        }
    }
    double c = 0.0;
    for (Py_ssize_t r = 0; r < k; r++) {
        c = r ? c + w[r] : w[0];
        tmp[r] = c;
    }
    int64_t below = 0;
    if (!(tmp[k - 1] <= 1.0)) { /* scaled down to a total of 1: np.maximum(total, 1.0) */
        double den = tmp[k - 1];
        for (Py_ssize_t r = 0; r < k; r++) below += tu > tmp[r] / den;
    } else { /* x / 1.0 is x */
        for (Py_ssize_t r = 0; r < k; r++) below += tu > tmp[r];
    }
    return below;
}

PyObject *bf_draws(PyObject *self, PyObject *args) {
    Py_buffer bank, pick, head, u, length, law, tu, rowsb, probs, target;
    Py_ssize_t depth, k, bank_size;
    double branch_rate, fork_rate, ratio_min;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*nnndddw*w*", &bank, &pick, &head, &u, &length,
                          &law, &tu, &rowsb, &depth, &k, &bank_size, &branch_rate, &fork_rate,
                          &ratio_min, &probs, &target))
        return NULL;
    Py_ssize_t dsz = (Py_ssize_t)sizeof(double), isz = (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n = length.len / dsz, b = rowsb.len / isz;
    if (n < 1 || b < 1 || depth < 1 || k < 1 || k > DRAWS_MAX_K || bank_size < 1 ||
        !bf_holds_exactly(bank.len, dsz, 2 * bank_size, k, 1) ||
        !bf_holds_exactly(pick.len, isz, n, depth, 1) ||
        !bf_holds_exactly(head.len, dsz, n, depth, 1) ||
        !bf_holds_exactly(u.len, dsz, n, 2 * depth + 5, 1) ||
        !bf_holds_exactly(length.len, dsz, n, 1, 1) ||
        !bf_holds_exactly(law.len, dsz, depth, k, 1) ||
        !bf_holds_exactly(tu.len, dsz, n, depth, 1) ||
        !bf_holds_exactly(rowsb.len, isz, b, 1, 1) ||
        !bf_holds_exactly(probs.len, dsz, b, depth, k) ||
        !bf_holds_exactly(target.len, isz, b, depth + 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "draws: buffers do not match rows, depth and k");
        goto done;
    }
    {
        const int64_t *pk = (const int64_t *)pick.buf, *want = (const int64_t *)rowsb.buf;
        for (Py_ssize_t i = 0; i < b; i++) {
            if (want[i] < 0 || want[i] >= n) {
                PyErr_SetString(PyExc_ValueError, "draws: a step out of range");
                goto done;
            }
            for (Py_ssize_t d = 0; d < depth; d++) {
                int64_t row = pk[want[i] * depth + d];
                if (row < 0 || row >= bank_size) {
                    PyErr_SetString(PyExc_ValueError, "draws: a bank row out of range");
                    goto done;
                }
            }
        }
        const double *bk = (const double *)bank.buf, *hd = (const double *)head.buf;
        const double *uu = (const double *)u.buf, *len = (const double *)length.buf;
        const double *lw = (const double *)law.buf, *tgu = (const double *)tu.buf;
        double *out = (double *)probs.buf, w[DRAWS_MAX_K], tmp[DRAWS_MAX_K];
        int64_t *tg = (int64_t *)target.buf;
        double keep = 1.0 - ratio_min;
        /* First pass: each position's bank row (its fork and branch flags kept), and a
           prefetch of it. The rows are picked at random from a bank of ~1 MB, which the rest of
           a simulated step evicts from the caches between steps: touching them all first lets
           the memory system fetch many at once instead of one per position. */
        int64_t *rows = (int64_t *)malloc((size_t)(b * depth) * sizeof(int64_t));
        unsigned char *flags = (unsigned char *)malloc((size_t)(b * depth));
        if (rows == NULL || flags == NULL) {
            free(rows);
            free(flags);
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t s = want[i];
            const double *us = uu + s * (2 * depth + 5);
            /* the step's branch: from depth `start` for `len` positions */
            double start = floor(us[1] * (double)depth), end = start + len[s];
            int branching = us[0] < branch_rate;
            for (Py_ssize_t d = 0; d < depth; d++) {
                int branch = branching && (double)d >= start && (double)d < end;
                int fork = branch || us[5 + d] < fork_rate;
                rows[i * depth + d] = (pk[s * depth + d] + (fork ? bank_size : 0)) * k;
                flags[i * depth + d] = (unsigned char)(fork | (branch << 1));
#if defined(__GNUC__) || defined(__clang__)
                for (Py_ssize_t c = 0; c < k; c += 8)
                    __builtin_prefetch(bk + rows[i * depth + d] + c, 0, 1);
#endif
            }
        }
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t s = want[i];
            const double *us = uu + s * (2 * depth + 5);
            /* the target on the branch's second side with probability v / (1 + v) */
            double vb = ratio_min + keep * us[3];
            int second = us[4] < vb / (1.0 + vb);
            for (Py_ssize_t d = 0; d < depth; d++) {
                Py_ssize_t at = i * depth + d;
                int fork = flags[at] & 1, branch = flags[at] >> 1;
                double vf = ratio_min + keep * us[5 + depth + d];
                tg[i * (depth + 1) + d] = draws_one(bk + rows[at], hd[s * depth + d], fork, branch,
                                                    second, branch ? vb : vf, lw + d * k,
                                                    tgu[s * depth + d], k, out + at * k, w, tmp);
            }
            tg[i * (depth + 1) + depth] = -1;
        }
        free(rows);
        free(flags);
        result = Py_None;
        Py_INCREF(result);
    }
done:
    PyBuffer_Release(&bank);
    PyBuffer_Release(&pick);
    PyBuffer_Release(&head);
    PyBuffer_Release(&u);
    PyBuffer_Release(&length);
    PyBuffer_Release(&law);
    PyBuffer_Release(&tu);
    PyBuffer_Release(&rowsb);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&target);
    return result;
}
