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
 * draws_pin(bank, bank_sum, pick, fall, u, log_u, law, law_max, target_u, cursor, depth, k,
 *           bank_size, block, branch_rate, fork_rate, fork_ratio_min, log_stay) -> pin
 * draws(pin, rows, probs, target, advance=False) -> None or spent (tuple of ints)
 *   draws_pin checks the stored arrays against depth, k and block and holds their buffers (the
 *   arrays stay alive and their memory in place) until the pin is freed; draws reads them
 *   through it, each step taking only its rows and outputs (a source's arrays change only when
 *   it grows, and it pins them again then; their contents may change between steps: read when
 *   called). With advance, rows are slots and each slot's row is advance()'s (below), formed
 *   here: slot * block + cursor[slot], its cursor moved on by one once the step is computed;
 *   where a listed slot's block is spent (cursor >= block) nothing is computed or changed and
 *   the spent slots are returned (the caller draws their blocks and calls again).
 *   cursor:   [n / block] int64, writable: each slot's next step in its block
 *   bank:     [2 * bank_size, k] runner-up spreads (the second half shifted for forks), ≥ 0;
 *             only the first half is read (a fork's row is its first-half row one rank down,
 *             what the second half holds: half the memory a step touches)
 *   bank_sum: [2 * bank_size] each bank row's sum
 *   pick:     [n, depth] int64 rows of the bank's first half, per stored step
 *   fall:     [n, depth] exp(-logit) of the head masses (numpy's exp): the head mass is
 *             min(1 / (1 + fall), 1 - 1e-12), as _refill_numpy computes it
 *   u:        [n, 2 * depth + 5] uniforms: the branch's 5 per step, then 2 per position
 *   log_u:    [n] log of each step's third uniform (numpy's log): the branch's length is
 *             1 + floor(log_u / log_stay), log_stay the log of its geometric stay
 *   law:      [depth, k] the target's law per rank, c_r * a_k, ≥ 0
 *   law_max:  [depth] each law row's largest
 *   target_u: [n, depth] the target's uniforms
 *   rows:     [B] int64: which of the n stored steps to compute, in the batch's order
 *   probs:    [B, depth, k] written: the marginals, each row sorted descending
 *   target:   [B, depth + 1] int64 written: the target's rank per position (k: outside the
 *             row), -1 after the last
 * Where a row's weights provably total below 1 (bank_sum and law_max bound them), its
 * cumulative sums are formed only up to the target's rank (the count is the same: they only
 * rise); elsewhere all of them, and scaled down where the total exceeds 1.
 *
 * neg_logit(top1, z, step_sd, position_sd, out) -> None: a block's negated head log-odds,
 * -((top1[d] + step_sd * z[s, 0]) + position_sd * z[s, 1 + d]) into out [steps, depth] (z:
 * [steps, depth + 1] normals, top1: [depth]), numpy's operations in numpy's order; the caller
 * takes numpy's exp of it in place (the fall above).
 */
#include "_bestfirst.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define DRAWS_MAX_K 1024 /* the widest row (the caller uses numpy beyond) */

#if defined(__GNUC__) || defined(__clang__)
/* a prefetch of every cache line of the `bytes` bytes at p */
static inline void draws_fetch(const void *p, Py_ssize_t bytes) {
    const char *c = (const char *)p, *end = c + bytes;
    for (; c < end; c += 64) __builtin_prefetch(c, 0, 1);
    if (bytes > 0) __builtin_prefetch(end - 1, 0, 1); /* the last line where p is not aligned */
}
#endif

/* p[r] = row[r] * om for r < n, two at a time (gcc leaves the loop scalar: p may alias row) */
static inline void draws_scale(double *p, const double *row, Py_ssize_t n, double om) {
    Py_ssize_t r = 0;
#if defined(__SSE2__)
    __m128d f = _mm_set1_pd(om);
    for (; r + 1 < n; r += 2) _mm_storeu_pd(p + r, _mm_mul_pd(_mm_loadu_pd(row + r), f));
#endif
    for (; r < n; r++) p[r] = row[r] * om;
}

/* One position's row: marginals p (from its bank row), the target's law w, sorted together
   where the head fell below a runner-up (numpy's stable argsort of -p), then the target's rank:
   how many of the cumulative law (scaled down to a total of 1 where above) lie below tu.
   Where the row is in order and its total weight is below 1 (bound < 1), the weights and their
   cumulative sums are formed only up to the target's rank: the sums only rise (every weight is
   >= 0), so the count below tu is where the first of them reaches it, and the values formed
   are those of the full computation below. */
static int64_t draws_one(const double *row, double h, int fork, int branch, int second, double v,
                         const double *law, double tu, Py_ssize_t k, double *p, double *w,
                         double *tmp, double bound) {
    double om = 1.0 - h;
    if (fork) { /* the bank's shifted row: its first-half row one rank down, the head's two
                   candidates ahead */
        draws_scale(p + 2, row + 1, k - 2, om);
        if (k >= 2) p[1] = h * v / (1.0 + v);
        p[0] = h / (1.0 + v);
    } else {
        draws_scale(p + 1, row + 1, k - 1, om);
        p[0] = h;
    }
    /* the head's weights: a fork's second candidate counts as a head candidate (law[0]); on a
       branch the whole head mass goes to the side the target follows */
    double w0 = p[0] * law[0], w1 = 0.0;
    if (k >= 2) w1 = p[1] * (fork ? law[0] : law[1]);
    if (branch && k >= 2) {
        double total = w0 + w1;
        w0 = second ? 0.0 : total;
        w1 = second ? total : 0.0;
    }
    int unsorted = 0;
    if (k >= 3) {
        unsorted = p[1] > p[0] || p[2] > p[1];
    } else {
        for (Py_ssize_t r = 0; r + 1 < k; r++) unsorted |= p[r + 1] > p[r];
    }
    if (!unsorted && bound < 1.0) {
        double c = w0;
        if (!(tu > c)) return 0;
        if (k < 2) return 1;
        c = c + w1;
        if (!(tu > c)) return 1;
        for (Py_ssize_t r = 2; r < k; r++) {
            c = c + p[r] * law[r];
            if (!(tu > c)) return (int64_t)r;
        }
        return (int64_t)k;
    }
    w[0] = w0;
    if (k >= 2) w[1] = w1;
    for (Py_ssize_t r = 2; r < k; r++) w[r] = p[r] * law[r];
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

/* The listed slots whose block is spent (cursor >= block) as a tuple of ints, or NULL where
   none is (*failed 0) or on an error (*failed 1: a slot out of [0, n_cur), reported with
   ``range_error``, or no memory). advance() and draws(…, advance=True) both start here: with
   a spent slot they change nothing and return these. */
static PyObject *spent_slots(const int64_t *cursor, Py_ssize_t n_cur, const int64_t *slots,
                             Py_ssize_t b, Py_ssize_t block, const char *range_error,
                             int *failed) {
    Py_ssize_t spent = 0;
    *failed = 1;
    for (Py_ssize_t i = 0; i < b; i++) {
        if (slots[i] < 0 || slots[i] >= n_cur) {
            PyErr_SetString(PyExc_ValueError, range_error);
            return NULL;
        }
        spent += cursor[slots[i]] >= block;
    }
    if (!spent) {
        *failed = 0;
        return NULL;
    }
    PyObject *result = PyTuple_New(spent);
    for (Py_ssize_t i = 0, j = 0; result != NULL && i < b; i++) {
        if (cursor[slots[i]] < block) continue;
        PyObject *v = PyLong_FromLongLong((long long)slots[i]);
        if (v == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, j++, v);
    }
    return result;
}

/* A source's pinned draws (draws_pin): its nine stored arrays' buffers, held until the capsule
   is freed, and the constants they were checked against. */
#define DRAWS_PIN "bastion._bestfirst.draws_pin"
typedef struct {
    Py_buffer bufs[10]; /* bank, bank_sum, pick, fall, u, log_u, law, law_max, target_u,
                           cursor (writable) */
    Py_ssize_t depth, k, bank_size, block;
    double branch_rate, fork_rate, ratio_min, log_stay;
} draws_pinned;

static void draws_unpin(PyObject *capsule) {
    draws_pinned *pin = (draws_pinned *)PyCapsule_GetPointer(capsule, DRAWS_PIN);
    if (pin == NULL) return;
    for (int i = 0; i < 10; i++) PyBuffer_Release(&pin->bufs[i]);
    PyMem_Free(pin);
}

PyObject *bf_draws_pin(PyObject *self, PyObject *args) {
    draws_pinned *pin = (draws_pinned *)PyMem_Calloc(1, sizeof(draws_pinned));
    if (pin == NULL) return PyErr_NoMemory();
    Py_buffer *bf = pin->bufs;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*w*nnnndddd", &bf[0], &bf[1], &bf[2], &bf[3],
                          &bf[4], &bf[5], &bf[6], &bf[7], &bf[8], &bf[9], &pin->depth, &pin->k,
                          &pin->bank_size, &pin->block, &pin->branch_rate, &pin->fork_rate,
                          &pin->ratio_min, &pin->log_stay)) {
        PyMem_Free(pin); /* (the parser releases what it took) */
        return NULL;
    }
    Py_ssize_t dsz = (Py_ssize_t)sizeof(double), isz = (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n = bf[5].len / dsz, depth = pin->depth, k = pin->k, bank_size = pin->bank_size;
    Py_ssize_t block = pin->block;
    if (n < 1 || depth < 1 || k < 1 || k > DRAWS_MAX_K || bank_size < 1 || block < 1 ||
        n % block != 0 || !bf_holds_exactly(bf[9].len, isz, n / block, 1, 1) ||
        !bf_holds_exactly(bf[0].len, dsz, 2 * bank_size, k, 1) ||
        !bf_holds_exactly(bf[1].len, dsz, 2 * bank_size, 1, 1) ||
        !bf_holds_exactly(bf[2].len, isz, n, depth, 1) ||
        !bf_holds_exactly(bf[3].len, dsz, n, depth, 1) ||
        !bf_holds_exactly(bf[4].len, dsz, n, 2 * depth + 5, 1) ||
        !bf_holds_exactly(bf[5].len, dsz, n, 1, 1) ||
        !bf_holds_exactly(bf[6].len, dsz, depth, k, 1) ||
        !bf_holds_exactly(bf[7].len, dsz, depth, 1, 1) ||
        !bf_holds_exactly(bf[8].len, dsz, n, depth, 1)) {
        PyErr_SetString(PyExc_ValueError, "draws_pin: buffers do not match depth, k and block");
        for (int i = 0; i < 10; i++) PyBuffer_Release(&bf[i]);
        PyMem_Free(pin);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(pin, DRAWS_PIN, draws_unpin);
    if (capsule == NULL) {
        for (int i = 0; i < 10; i++) PyBuffer_Release(&bf[i]);
        PyMem_Free(pin);
    }
    return capsule;
}

PyObject *bf_draws(PyObject *self, PyObject *args) {
    Py_buffer rowsb, probs, target;
    PyObject *capsule, *result = NULL;
    int advance = 0;
    int64_t *steps = NULL; /* with advance: the slots' rows, formed here */
    if (!PyArg_ParseTuple(args, "Oy*w*w*|p", &capsule, &rowsb, &probs, &target, &advance))
        return NULL;
    draws_pinned *pin = (draws_pinned *)PyCapsule_GetPointer(capsule, DRAWS_PIN);
    if (pin == NULL) goto done; /* (not a pinned capsule: its TypeError/ValueError set) */
    Py_buffer bank = pin->bufs[0], bank_sum = pin->bufs[1], pick = pin->bufs[2];
    Py_buffer fall = pin->bufs[3], u = pin->bufs[4], log_u = pin->bufs[5], law = pin->bufs[6];
    Py_buffer law_max = pin->bufs[7], tu = pin->bufs[8];
    Py_ssize_t depth = pin->depth, k = pin->k, bank_size = pin->bank_size;
    double branch_rate = pin->branch_rate, fork_rate = pin->fork_rate;
    double ratio_min = pin->ratio_min, log_stay = pin->log_stay;
    Py_ssize_t dsz = (Py_ssize_t)sizeof(double), isz = (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n = log_u.len / dsz, b = rowsb.len / isz;
    if (b < 1 || !bf_holds_exactly(rowsb.len, isz, b, 1, 1) ||
        !bf_holds_exactly(probs.len, dsz, b, depth, k) ||
        !bf_holds_exactly(target.len, isz, b, depth + 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "draws: buffers do not match rows, depth and k");
        goto done;
    }
    int64_t *cursor = (int64_t *)pin->bufs[9].buf;
    const int64_t *slots = (const int64_t *)rowsb.buf;
    if (advance) { /* advance()'s rows of the slots, or its spent slots (nothing changed) */
        Py_ssize_t n_cur = pin->bufs[9].len / isz, block = pin->block;
        int failed = 0;
        result = spent_slots(cursor, n_cur, slots, b, block, "draws: a slot out of range",
                             &failed);
        if (result != NULL || failed) goto done;
        steps = (int64_t *)malloc((size_t)b * sizeof(int64_t));
        if (steps == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < b; i++) steps[i] = slots[i] * block + cursor[slots[i]];
    }
    {
        const int64_t *pk = (const int64_t *)pick.buf;
        const int64_t *want = advance ? steps : (const int64_t *)rowsb.buf;
#if defined(__GNUC__) || defined(__clang__)
        /* First of all, every line of each step's stored draws (its pick, fall, uniforms and
           target uniforms rows and its log u), which the rest of a simulated step evicts too:
           fetched together, not one request after another */
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t s = want[i];
            if (s < 0 || s >= n) continue; /* (reported below) */
            draws_fetch(pk + s * depth, depth * isz);
            draws_fetch((const double *)fall.buf + s * depth, depth * dsz);
            draws_fetch((const double *)u.buf + s * (2 * depth + 5), (2 * depth + 5) * dsz);
            draws_fetch((const double *)tu.buf + s * depth, depth * dsz);
            __builtin_prefetch((const double *)log_u.buf + s, 0, 1);
        }
#endif
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
        const double *bk = (const double *)bank.buf, *fl = (const double *)fall.buf;
        const double *uu = (const double *)u.buf, *lu = (const double *)log_u.buf;
        const double *lw = (const double *)law.buf, *tgu = (const double *)tu.buf;
        const double *bsum = (const double *)bank_sum.buf, *lmax = (const double *)law_max.buf;
        double *out = (double *)probs.buf, w[DRAWS_MAX_K], tmp[DRAWS_MAX_K];
        int64_t *tg = (int64_t *)target.buf;
        double keep = 1.0 - ratio_min;
        /* First pass: each position's bank row (its index in the whole bank, for its sum;
           its fork and branch flags kept), and a prefetch of the first-half row it reads (every
           line of it: a row of k doubles straddles one more line than it fills where the bank
           is not aligned to lines, as numpy's allocations are not) and of its sum. The
           rows are picked at random from ~512 KB, which the rest of a simulated step evicts
           from the caches between steps: touching them all first lets the memory system fetch
           many at once instead of one per position. */
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
            /* the step's branch: from depth `start` for 1 + floor(log u / log stay) positions */
            double start = floor(us[1] * (double)depth);
            double end = start + (1.0 + floor(lu[s] / log_stay));
            int branching = us[0] < branch_rate;
            for (Py_ssize_t d = 0; d < depth; d++) {
                int branch = branching && (double)d >= start && (double)d < end;
                int fork = branch || us[5 + d] < fork_rate;
                rows[i * depth + d] = pk[s * depth + d] + (fork ? bank_size : 0);
                flags[i * depth + d] = (unsigned char)(fork | (branch << 1));
#if defined(__GNUC__) || defined(__clang__)
                const double *first = bk + pk[s * depth + d] * k;
                for (Py_ssize_t c = 0; c < k; c += 8) __builtin_prefetch(first + c, 0, 1);
                __builtin_prefetch(first + k - 1, 0, 1); /* a row's last line (rows straddle) */
                __builtin_prefetch(bsum + rows[i * depth + d], 0, 1);
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
                double h = 1.0 / (1.0 + fl[s * depth + d]); /* np.minimum(h, 1 - 1e-12) */
                h = h != h ? h : (h <= 1.0 - 1e-12 ? h : 1.0 - 1e-12);
                /* an upper bound of the row's total weight: the marginals sum to at most
                   h + (1 - h) * (the bank row's sum), each weighted by at most the law's
                   largest; the margin covers every rounding of the sums (< 1e-13 relative) */
                double bound = (h + (1.0 - h) * bsum[rows[at]]) * lmax[d] * (1.0 + 1e-9);
                tg[i * (depth + 1) + d] =
                    draws_one(bk + pk[s * depth + d] * k, h, fork, branch, second, branch ? vb : vf,
                              lw + d * k, tgu[s * depth + d], k, out + at * k, w, tmp, bound);
            }
            tg[i * (depth + 1) + depth] = -1;
        }
        free(rows);
        free(flags);
        if (advance) /* every slot moved on a step (slots are distinct: the caller's) */
            for (Py_ssize_t i = 0; i < b; i++) cursor[slots[i]] += 1;
        result = Py_None;
        Py_INCREF(result);
    }
done:
    free(steps);
    PyBuffer_Release(&rowsb);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&target);
    return result;
}

PyObject *bf_neg_logit(PyObject *self, PyObject *args) {
    Py_buffer top1b, zb, outb;
    double step_sd, position_sd;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*ddw*", &top1b, &zb, &step_sd, &position_sd, &outb))
        return NULL;
    Py_ssize_t dsz = (Py_ssize_t)sizeof(double), depth = top1b.len / dsz;
    Py_ssize_t steps = depth > 0 ? zb.len / dsz / (depth + 1) : 0;
    if (depth < 1 || steps < 1 || !bf_holds_exactly(top1b.len, dsz, depth, 1, 1) ||
        !bf_holds_exactly(zb.len, dsz, steps, depth + 1, 1) ||
        !bf_holds_exactly(outb.len, dsz, steps, depth, 1)) {
        PyErr_SetString(PyExc_ValueError, "neg_logit: buffers do not match steps and depth");
        goto done;
    }
    {
        const double *top1 = (const double *)top1b.buf, *z = (const double *)zb.buf;
        double *out = (double *)outb.buf;
        for (Py_ssize_t s = 0; s < steps; s++) {
            const double *zs = z + s * (depth + 1);
            double shift = step_sd * zs[0];
            for (Py_ssize_t d = 0; d < depth; d++)
                out[s * depth + d] = -((top1[d] + shift) + position_sd * zs[1 + d]);
        }
        result = Py_None;
        Py_INCREF(result);
    }
done:
    PyBuffer_Release(&top1b);
    PyBuffer_Release(&zb);
    PyBuffer_Release(&outb);
    return result;
}

/* advance(cursor, slots, block) -> rows (bytes) or spent (tuple of ints)
 *
 * bastion.sim.synthetic.SyntheticSource._advance of a batch: where no listed slot's block is
 * spent (cursor >= block), every slot's row index slot * block + cursor (int64 bytes) and its
 * cursor moved on by one, in place; else nothing is changed and the spent slots are returned
 * (the caller draws their next blocks, which resets their cursors, and calls again). cursor:
 * a writable int64 buffer indexed by slot; slots: int64, each a valid index, none twice. */
PyObject *bf_advance(PyObject *self, PyObject *args) {
    Py_buffer cur, sl;
    Py_ssize_t block;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "w*y*n", &cur, &sl, &block)) return NULL;
    Py_ssize_t n_cur = cur.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t b = sl.len / (Py_ssize_t)sizeof(int64_t);
    int64_t *cursor = (int64_t *)cur.buf;
    const int64_t *slots = (const int64_t *)sl.buf;
    if (cur.len != n_cur * (Py_ssize_t)sizeof(int64_t) ||
        sl.len != b * (Py_ssize_t)sizeof(int64_t) || block < 1) {
        PyErr_SetString(PyExc_ValueError, "advance: cursor and slots must be int64, block >= 1");
        goto done;
    }
    int failed = 0;
    result = spent_slots(cursor, n_cur, slots, b, block, "advance: a slot out of range", &failed);
    if (result != NULL || failed) goto done;
    result = PyBytes_FromStringAndSize(NULL, b * (Py_ssize_t)sizeof(int64_t));
    if (!result) goto done;
    {
        int64_t *rows = (int64_t *)PyBytes_AS_STRING(result);
        for (Py_ssize_t i = 0; i < b; i++) {
            int64_t s = slots[i];
            rows[i] = s * (int64_t)block + cursor[s];
            cursor[s] += 1;
        }
    }
done:
    PyBuffer_Release(&cur);
    PyBuffer_Release(&sl);
    return result;
}

/* seed_words(entropy, n) -> bytes
 *
 * The first n 32-bit words of numpy's SeedSequence(entropy).generate_state(n, np.uint32) for an
 * entropy given as its 32-bit words (uint32 bytes, as SeedSequence assembles them: each integer
 * little-endian, 0 as one word), no spawn key, the default pool of 4 words: the pool's hash
 * mix, then the output hash (O'Neill's seed_seq_fe design). A simulated request's generator
 * is seeded this way many times a run; numpy's own object costs several microseconds. The
 * tests compare the words (and the PCG64 states made from them) with numpy's. */
#define SEED_POOL 4
#define SEED_INIT_A 0x43b0d7e5u
#define SEED_MULT_A 0x931e8875u
#define SEED_INIT_B 0x8b51f9ddu
#define SEED_MULT_B 0x58f38dedu
#define SEED_MIX_L 0xca01f9ddu
#define SEED_MIX_R 0x4973f715u
#define SEED_XSHIFT 16

static uint32_t seed_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SEED_MULT_A;
    value *= *hash_const;
    return value ^ (value >> SEED_XSHIFT);
}

static uint32_t seed_mix(uint32_t x, uint32_t y) {
    uint32_t r = SEED_MIX_L * x - SEED_MIX_R * y;
    return r ^ (r >> SEED_XSHIFT);
}

/* The first n words of the seed sequence of the m entropy words e (see seed_words). */
static void seed_generate(const uint32_t *e, Py_ssize_t m, uint32_t *out, Py_ssize_t n) {
    uint32_t pool[SEED_POOL], h = SEED_INIT_A;
    for (int i = 0; i < SEED_POOL; i++) pool[i] = seed_hashmix(i < m ? e[i] : 0u, &h);
    for (int src = 0; src < SEED_POOL; src++)
        for (int dst = 0; dst < SEED_POOL; dst++)
            if (src != dst) pool[dst] = seed_mix(pool[dst], seed_hashmix(pool[src], &h));
    for (Py_ssize_t src = SEED_POOL; src < m; src++)
        for (int dst = 0; dst < SEED_POOL; dst++)
            pool[dst] = seed_mix(pool[dst], seed_hashmix(e[src], &h));
    uint32_t hb = SEED_INIT_B;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = pool[i % SEED_POOL] ^ hb;
        hb *= SEED_MULT_B;
        v *= hb;
        out[i] = v ^ (v >> SEED_XSHIFT);
    }
}

PyObject *bf_seed_words(PyObject *self, PyObject *args) {
    Py_buffer ent;
    Py_ssize_t n;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*n", &ent, &n)) return NULL;
    Py_ssize_t m = ent.len / (Py_ssize_t)sizeof(uint32_t);
    if (ent.len != m * (Py_ssize_t)sizeof(uint32_t) || n < 0) {
        PyErr_SetString(PyExc_ValueError, "seed_words: entropy must be uint32 words, n >= 0");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint32_t));
    if (result)
        seed_generate((const uint32_t *)ent.buf, m, (uint32_t *)PyBytes_AS_STRING(result), n);
done:
    PyBuffer_Release(&ent);
    return result;
}

/* seed_state(entropy) -> (state, inc) or None
 *
 * The PCG64 state numpy's default_rng(list(entropy)) starts in, as two Python ints (the
 * 128-bit LCG state and increment), for a tuple or list of at most SEED_MAX_ENTRIES ints each
 * in [0, 2**64): the words SeedSequence assembles from them (each int little-endian, 0 as one
 * word), the first 8 words seed_words gives, and numpy's PCG64 seeding of them (four 64-bit
 * words from 32-bit pairs, little-endian: the first two the initial state, the last two the
 * stream; state 0, one step, add, one step). None for any other entropy, or where the compiler
 * has no 128-bit integers: bastion.sim.seeding then forms the same on Python ints. */
#define SEED_MAX_ENTRIES 16
#if defined(__SIZEOF_INT128__)
static PyObject *seed_u128(unsigned __int128 x) { /* a Python int of x */
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(x >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)x);
    PyObject *shift = PyLong_FromLong(64), *up = NULL, *both = NULL;
    if (hi && lo && shift) up = PyNumber_Lshift(hi, shift);
    if (up) both = PyNumber_Or(up, lo);
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(shift);
    Py_XDECREF(up);
    return both;
}
#endif

PyObject *bf_seed_state(PyObject *self, PyObject *entropy) {
#if defined(__SIZEOF_INT128__)
    if (!PyTuple_Check(entropy) && !PyList_Check(entropy)) Py_RETURN_NONE;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(entropy), m = 0;
    if (count > SEED_MAX_ENTRIES) Py_RETURN_NONE;
    PyObject **items = PySequence_Fast_ITEMS(entropy);
    uint32_t e[2 * SEED_MAX_ENTRIES], w[8];
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyLong_CheckExact(items[i])) Py_RETURN_NONE;
        unsigned long long v = PyLong_AsUnsignedLongLong(items[i]);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) { /* negative or >= 2**64 */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        e[m++] = (uint32_t)v;
        if (v >> 32) e[m++] = (uint32_t)(v >> 32);
    }
    seed_generate(e, m, w, 8);
    uint64_t q[4];
    for (int i = 0; i < 4; i++) q[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    const unsigned __int128 mult =
        ((unsigned __int128)0x2360ED051FC65DA4ull << 64) | 0x4385DF649FCCF645ull;
    unsigned __int128 inc = ((((unsigned __int128)q[2] << 64) | q[3]) << 1) | 1u;
    unsigned __int128 state = ((((unsigned __int128)q[0] << 64) | q[1]) + inc) * mult + inc;
    PyObject *s = seed_u128(state), *i = s ? seed_u128(inc) : NULL;
    if (!s || !i) {
        Py_XDECREF(s);
        return NULL;
    }
    return Py_BuildValue("(NN)", s, i);
#else
    Py_RETURN_NONE;
#endif
}
