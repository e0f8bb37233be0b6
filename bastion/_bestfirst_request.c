/*
 * The paper's per-request rule at batch > 1 in one call: request(), each request's
 * bastion.budget.choose_tree against the batched pass as a calibrated roofline prices it, the
 * requests in order, each seeing the others' trees as already chosen (the earlier requests)
 * or as last step's (the later ones) - bastion.engine.PerRequestPolicy running
 * bastion.policies.AdaptivePolicy.choose (mode auto) on RooflineCostModel.cost_curve.
 *
 * request(probs, token_ids, depth, k, n_max, starts, sizes, expected, own, co, price, ops)
 *     -> (status, parents, depths, ranks, scores, tokens, offsets, built, budgets, diag, ar)
 *
 * probs, token_ids: B * depth * k; starts: each request's first budget; sizes, expected: the
 * requests' loads (bastion.engine.batch_loads); own: each request's bucketed context as its
 * own (an integer bucket), co: as a co-batched request's (numpy's ceil); price: four branches
 * - the masked pass's compute (the tiled pricer where the calibration pads) and memory (bare)
 * branches, then the unmasked pass's (L_AR) - each as 7 rows of `ops` columns (the constant,
 * then per feature: T, padded T, attention pairs, KV tokens, mask elements, experts), its
 * distinct non-zero operator columns first; then each branch's operator -> column map (`ops`
 * numbers, -1: a zero column) and its count of distinct columns; then 11 numbers: the FLOP
 * and byte rates, the compute and memory tiles, the calibration's alpha and beta of compute
 * then memory, gamma (0: static), whether passes have tensor parallelism's all-reduces (1: tp > 1)
 * and their seconds c0, c1 (c0 + c1 T for a pass of T tokens, added before gamma), T_draft,
 * T_aux.
 * A row of the curve is RooflineCostModel._base's calibrated branch: per operator
 * (const + features . coefficients) / rate - whole numbers below 2^53 (checked at the
 * largest row: status -3 where not), so exact in any order - summed over the operators as
 * numpy sums a row (pairwise_rows), then the calibration's max, the all-reduces and gamma.
 * Outputs: the chosen trees concatenated (tokens: the roots' -1) with B + 1 offsets; per
 * request the nodes built and the budget of its last round, its a_hat, c_hat, s_hat (built
 * entries each, concatenated in diag request after request) and L_AR. status 0: done; -1: a
 * price is not finite and > 0 (the caller's Python loop raises); -3: not exact.
 */
#include "_bestfirst.h"

#include <string.h>

#define EXACT 9007199254740992.0 /* 2^53 */
#define RULE_BOUNDED 2

/* numpy's add.reduce of a contiguous float64 array (as bf_pairwise in _bestfirst_paper.c):
   pairwise, 8 accumulators per block of at most 128 */
static inline double pairwise_block(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    double r0 = a[0], r1 = a[1], r2 = a[2], r3 = a[3], r4 = a[4], r5 = a[5], r6 = a[6],
           r7 = a[7];
    Py_ssize_t i;
    for (i = 8; i < n - (n % 8); i += 8) {
        r0 += a[i];
        r1 += a[i + 1];
        r2 += a[i + 2];
        r3 += a[i + 3];
        r4 += a[i + 4];
        r5 += a[i + 5];
        r6 += a[i + 6];
        r7 += a[i + 7];
    }
    double res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7));
    for (; i < n; i++) res += a[i];
    return res;
}

static double pairwise(const double *a, Py_ssize_t n) {
    if (n <= 128) return pairwise_block(a, n);
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

typedef struct {
    const double *branch[4]; /* masked compute, masked memory, unmasked compute, memory */
    const int32_t *map[4];   /* operator -> distinct column (-1: zero) */
    Py_ssize_t unique[4];    /* distinct columns */
    Py_ssize_t ops;
    double rate[2], tile[2], ac, bc, am, bm, gamma;
    double comm, c0, c1; /* tensor parallelism's all-reduces (comm != 0): c0 + c1 T */
    double *q;           /* scratch of price_rows: ROWS quotients per distinct column, */
    const double **col;  /* each operator's row of them (or `zeros`), */
    double *acc;         /* 8 rows of partial sums */
} pricing;

#define ROWS 32 /* the rows price_rows prices together */
static const double zeros[ROWS];

/* pairwise() of n operators' rows at once: a[op] holds ROWS values, one per curve row, and
   out[i] is pairwise() of (a[0][i], ..., a[n - 1][i]) - the same additions in the same order,
   row by row (so any row's sum is the scalar one's) */
static void pairwise_rows(const double *const *a, Py_ssize_t n, Py_ssize_t m, double *acc,
                          double *out) {
    if (n > 128) {
        Py_ssize_t n2 = n / 2;
        n2 -= n2 % 8;
        double left[ROWS], right[ROWS];
        pairwise_rows(a, n2, m, acc, left);
        pairwise_rows(a + n2, n - n2, m, acc, right);
        for (Py_ssize_t i = 0; i < m; i++) out[i] = left[i] + right[i];
        return;
    }
    if (n < 8) {
        for (Py_ssize_t i = 0; i < m; i++) out[i] = -0.0;
        for (Py_ssize_t op = 0; op < n; op++)
            for (Py_ssize_t i = 0; i < m; i++) out[i] += a[op][i];
        return;
    }
    for (int f = 0; f < 8; f++) memcpy(acc + f * ROWS, a[f], (size_t)m * sizeof(double));
    Py_ssize_t op;
    for (op = 8; op < n - (n % 8); op += 8)
        for (int f = 0; f < 8; f++)
            for (Py_ssize_t i = 0; i < m; i++) acc[f * ROWS + i] += a[op + f][i];
    for (Py_ssize_t i = 0; i < m; i++) {
        const double *r = acc + i;
        out[i] = ((r[0] + r[ROWS]) + (r[2 * ROWS] + r[3 * ROWS])) +
                 ((r[4 * ROWS] + r[5 * ROWS]) + (r[6 * ROWS] + r[7 * ROWS]));
    }
    for (; op < n; op++)
        for (Py_ssize_t i = 0; i < m; i++) out[i] += a[op][i];
}

/* whether a pass's every operator count is below 2^53 in both branches (a whole number then:
   the features are); the counts grow with every feature, so the largest pass decides */
static int exact_pass(const pricing *pr, int masked, double t, double pairs, double kv,
                      double mask) {
    for (int b = 0; b < 2; b++) {
        const double *co = pr->branch[(masked ? 0 : 2) + b];
        double tile = pr->tile[b], x[5] = {t, tile > 0.0 ? ceil(t / tile) * tile : t, pairs,
                                           kv, mask};
        if (!(t < EXACT && pairs < EXACT && kv < EXACT && mask < EXACT)) return 0;
        for (Py_ssize_t op = 0; op < pr->unique[(masked ? 0 : 2) + b]; op++) {
            double num = co[op];
            for (int f = 0; f < 5; f++) num += x[f] * co[(f + 1) * pr->ops + op];
            if (!(num < EXACT)) return 0;
        }
    }
    return 1;
}

static int whole(double x) { return x >= 0.0 && x < EXACT && x == floor(x); }

/* the request's curve, rows [*priced, upto) priced into v (row N at v[N - 1]) */
typedef struct {
    double c, s_o, p_o, kv_o;
} situation;

/* The calibrated (and corrected) seconds of passes with N = first ... first + count - 1
   tokens of this request beside the others' into v[0 ... count - 1]: T = N + s_o tokens,
   pairs = N (c + N) + p_o attention pairs, c + N + kv_o KV tokens and (masked: the tree's
   mask over the pairs; else none) mask elements; `masked` picks the branches. Per branch the
   quotients (const + features . coefficients) / rate of its distinct operator columns (each
   numerator a whole number, so exact; each quotient the IEEE one), summed over the operators
   as numpy sums a row (pairwise_rows), then the calibration's max, the all-reduces and gamma.
   ROWS rows at a time: each operation a loop over the rows, which the compiler vectorises,
   every row's arithmetic the same as one row's alone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
/* an AVX2 build beside the baseline one, picked at load time (glibc's ifunc) where the CPU
   has it: four lanes per division instead of two and an inline ceil; the same IEEE operations
   (no fused multiply-adds: AVX2 does not bring FMA, and contraction is off), so the same bits */
__attribute__((target_clones("avx2", "default")))
#endif
static void price_rows(const pricing *pr, const situation *st, int masked, Py_ssize_t first,
                       Py_ssize_t count, double *v) {
    Py_ssize_t ops = pr->ops;
    for (Py_ssize_t r0 = 0; r0 < count; r0 += ROWS) {
        Py_ssize_t m = count - r0 < ROWS ? count - r0 : ROWS;
        double t[ROWS], pairs[ROWS], kv[ROWS], mask[ROWS], padded[ROWS], s[2][ROWS];
        for (Py_ssize_t i = 0; i < m; i++) {
            double nn = (double)(first + r0 + i);
            pairs[i] = nn * (st->c + nn) + st->p_o;
            t[i] = nn + st->s_o;
            kv[i] = st->c + nn + st->kv_o;
            mask[i] = masked ? pairs[i] : 0.0;
        }
        for (int b = 0; b < 2; b++) {
            double tile = pr->tile[b], rate = pr->rate[b];
            for (Py_ssize_t i = 0; i < m; i++)
                padded[i] = tile > 0.0 ? ceil(t[i] / tile) * tile : t[i];
            int at = (masked ? 0 : 2) + b;
            const double *co = pr->branch[at];
            const int32_t *map = pr->map[at];
            for (Py_ssize_t j = 0; j < pr->unique[at]; j++) {
                double c0 = co[j], c1 = co[ops + j], c2 = co[2 * ops + j];
                double c3 = co[3 * ops + j], c4 = co[4 * ops + j], c5 = co[5 * ops + j];
                double *q = pr->q + j * ROWS;
                for (Py_ssize_t i = 0; i < m; i++)
                    q[i] = (c0 + t[i] * c1 + padded[i] * c2 + pairs[i] * c3 + kv[i] * c4 +
                            mask[i] * c5) /
                           rate;
            }
            for (Py_ssize_t op = 0; op < ops; op++)
                pr->col[op] = map[op] >= 0 ? pr->q + map[op] * ROWS : zeros;
            pairwise_rows(pr->col, ops, m, pr->acc, s[b]);
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            double cc = pr->ac * s[0][i] + pr->bc, mm = pr->am * s[1][i] + pr->bm;
            double x = cc != cc || mm != mm ? NAN : (cc >= mm ? cc : mm); /* np.maximum */
            if (pr->comm != 0.0) x = x + (pr->c0 + pr->c1 * t[i]); /* as _base adds it */
            v[r0 + i] = pr->gamma != 0.0 ? pr->gamma * x : x;
        }
    }
}

static double row_s(const pricing *pr, const situation *st, Py_ssize_t row) {
    double x;
    price_rows(pr, st, 1, row, 1, &x);
    return x;
}

static void price_to(const pricing *pr, const situation *st, double *v, Py_ssize_t *priced,
                     Py_ssize_t upto) {
    if (upto > *priced) {
        price_rows(pr, st, 1, *priced + 1, upto - *priced, v + *priced);
        *priced = upto;
    }
}

/* One growth round of choose_tree (bf_size_round, rule bounded) where the curve is proved
   non-decreasing and positive beyond its priced rows (every count and coefficient >= 0, both
   alphas and gamma >= 0, and the first `budget` rows valid): the rows past the tree are priced
   only as far as the stop test needs them: the bound is at least its last term (the far
   one, one row) and its other terms are at most (A_o + A_top) / (T + v[n - 1]), A_top the
   most their Â reaches, so these settle the test unless the exact bound lies between (then
   the rows are priced). The same status, tree and curves as bf_size_round on the whole
   curve. */
static int lazy_round(const pricing *pr, const situation *st, const double *p,
                      const int64_t *tid, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                      Py_ssize_t ahead, Py_ssize_t n_max, double draft, double prep, double dp,
                      double ar, double base, double a_ceiling, double *v, Py_ssize_t *priced,
                      int64_t *ints, double *floats, entry *heap, Py_ssize_t *n_out,
                      Py_ssize_t *chosen_out) {
    price_to(pr, st, v, priced, budget);
    int ok = isfinite(draft) && draft >= 0 && isfinite(prep) && prep >= 0 && isfinite(ar) &&
             ar > 0;
    int monotone = 1;
    for (Py_ssize_t i = 0; ok && i < budget; i++) {
        double c = dp + v[i];
        ok = isfinite(c) && c > 0.0;
        if (i > 0 && !(c - (dp + v[i - 1]) >= 0.0)) monotone = 0;
    }
    *n_out = *chosen_out = 0;
    if (!ok) return -1;
    int64_t *parents = ints, *dep = parents + budget, *ranks = dep + budget,
            *tokens = ranks + budget;
    double *scores = floats, *a_hat = scores + budget, *c_hat = a_hat + budget,
           *s_hat = c_hat + budget;
    Py_ssize_t n = bf_build_one(p, depth, k, budget, heap, parents, dep, ranks, scores);
    double a = 0.0;
    tokens[0] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0) tokens[i] = tid[(dep[i] - 1) * k + ranks[i]];
        a = i > 0 ? a + scores[i] : scores[0];
        a_hat[i] = a;
        c_hat[i] = dp + v[i];
        s_hat[i] = (base + a) * ar / c_hat[i];
    }
    Py_ssize_t best = 0;
    for (Py_ssize_t i = 1; i < n; i++)
        if (s_hat[i] > s_hat[best]) best = i;
    *n_out = n;
    *chosen_out = best + 1;
    if (n < budget || budget >= n_max) return 1;
    if (!monotone) return 0;
    double rho = scores[n - 1], a_n = a_hat[n - 1];
    double a_far = a_n + (double)(n_max - n) * rho, a_top = a_n + (double)(ahead - n) * rho;
    if (a_ceiling < a_far) a_far = a_ceiling;
    if (a_ceiling < a_top) a_top = a_ceiling;
    double far = (base + a_far) / (dp + (ahead > *priced ? row_s(pr, st, ahead)
                                                         : v[ahead - 1]));
    if (far * ar > s_hat[best]) return 0; /* the bound is at least its last term */
    double near = (base + a_top) / (dp + v[n - 1]); /* and every other term at most this */
    if ((near > far ? near : far) * ar <= s_hat[best]) return 1;
    price_to(pr, st, v, priced, ahead);
    double bound = 0.0;
    for (Py_ssize_t j = n + 1; j <= ahead; j++) {
        double an = a_n + (double)(j - n) * rho;
        if (an > a_ceiling) an = a_ceiling;
        double q = (base + an) / (dp + v[j - 1]);
        if (q > bound) bound = q;
    }
    if (far > bound) bound = far;
    return bound * ar <= s_hat[best];
}

/* a growable buffer of n elements of `size` bytes */
static int reserve(void **buf, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return 1;
    size_t want = *cap ? *cap : 64;
    while (want < n) want *= 2;
    void *grown = realloc(*buf, want * size);
    if (!grown) return 0;
    *buf = grown;
    *cap = want;
    return 1;
}

PyObject *bf_request(PyObject *self, PyObject *args) {
    Py_buffer probs, ids, startb, sizeb, expb, ownb, cob, priceb;
    Py_ssize_t depth, k, n_max, ops;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nnny*y*y*y*y*y*n", &probs, &ids, &depth, &k, &n_max,
                          &startb, &sizeb, &expb, &ownb, &cob, &priceb, &ops))
        return NULL;
    Py_ssize_t b = depth > 0 && k > 0 ? probs.len / (Py_ssize_t)sizeof(double) / depth / k : 0;
    Py_ssize_t f8 = sizeof(double), i8 = sizeof(int64_t);
    void *v = NULL, *tmp = NULL, *ints = NULL, *floats = NULL, *heap = NULL;
    void *o_int[4] = {NULL, NULL, NULL, NULL}, *o_sco = NULL, *o_diag = NULL;
    size_t cap_v = 0, cap_t = 0, cap_i = 0, cap_f = 0, cap_h = 0, cap_o = 0, cap_d = 0;
    size_t cap_o1 = 0, cap_o2 = 0, cap_o3 = 0, cap_s = 0;
    int64_t *offsets = NULL, *built = NULL, *budgets = NULL, *sizes = NULL;
    double *expected = NULL, *ars = NULL, *rows_q = NULL;
    const double **rows_col = NULL;
    if (depth < 1 || k < 1 || b < 2 || n_max < 1 || n_max > INT32_MAX / 4 || ops < 1 ||
        !bf_holds_exactly(probs.len, f8, b, depth, k) ||
        !bf_holds_exactly(ids.len, i8, b, depth, k) || startb.len != b * i8 ||
        sizeb.len != b * i8 || expb.len != b * f8 || ownb.len != b * f8 || cob.len != b * f8 ||
        priceb.len != (32 * ops + 18) * f8) {
        PyErr_SetString(PyExc_ValueError, "request: inconsistent sizes");
        goto done;
    }
    offsets = malloc((size_t)(b + 1) * sizeof(int64_t));
    built = malloc((size_t)b * sizeof(int64_t));
    budgets = malloc((size_t)b * sizeof(int64_t));
    sizes = malloc((size_t)b * sizeof(int64_t));
    expected = malloc((size_t)b * sizeof(double));
    ars = malloc((size_t)b * sizeof(double));
    if (!offsets || !built || !budgets || !sizes || !expected || !ars ||
        !reserve(&tmp, &cap_t, (size_t)(4 * ops), sizeof(int32_t))) {
        PyErr_NoMemory();
        goto done;
    }
    {
        const double *p = (const double *)probs.buf, *own = (const double *)ownb.buf;
        const double *co = (const double *)cob.buf, *pc = (const double *)priceb.buf;
        const int64_t *tid = (const int64_t *)ids.buf, *starts = (const int64_t *)startb.buf;
        const double *maps = pc + 28 * ops, *counts = maps + 4 * ops, *sc = counts + 4;
        int32_t *imap = (int32_t *)tmp; /* the four branches' operator -> column maps */
        pricing pr = {{pc, pc + 7 * ops, pc + 14 * ops, pc + 21 * ops},
                      {imap, imap + ops, imap + 2 * ops, imap + 3 * ops},
                      {(Py_ssize_t)counts[0], (Py_ssize_t)counts[1], (Py_ssize_t)counts[2],
                       (Py_ssize_t)counts[3]},
                      ops,
                      {sc[0], sc[1]},
                      {sc[2], sc[3]},
                      sc[4], sc[5], sc[6], sc[7], sc[8], sc[9], sc[10], sc[11],
                      NULL, NULL, NULL};
        rows_q = malloc((size_t)(ops + 8) * ROWS * sizeof(double));
        rows_col = malloc((size_t)ops * sizeof(double *));
        if (!rows_q || !rows_col) {
            PyErr_NoMemory();
            goto done;
        }
        pr.q = rows_q;
        pr.acc = rows_q + ops * ROWS;
        pr.col = rows_col;
        for (int f = 0; f < 4; f++) {
            if (pr.unique[f] < 0 || pr.unique[f] > ops) {
                PyErr_SetString(PyExc_ValueError, "request: bad column counts");
                goto done;
            }
            for (Py_ssize_t op = 0; op < ops; op++) {
                double m = maps[f * ops + op];
                if (!(m >= -1.0 && m < (double)pr.unique[f] && m == floor(m))) {
                    PyErr_SetString(PyExc_ValueError, "request: bad operator map");
                    goto done;
                }
                imap[f * ops + op] = (int32_t)m;
            }
        }
        double draft = sc[12], prep = sc[13], dp = draft + prep, a_ceiling = depth + 1.0;
        /* the curve never falls and stays positive beyond its priced rows (see lazy_round) */
        int proof = pr.ac >= 0.0 && pr.am >= 0.0 && pr.gamma >= 0.0 && pr.rate[0] > 0.0 &&
                    pr.rate[1] > 0.0 && (pr.comm == 0.0 || (pr.c0 >= 0.0 && pr.c1 >= 0.0));
        int status = 0, exact = 1;
        memcpy(sizes, sizeb.buf, (size_t)b * sizeof(int64_t));
        memcpy(expected, expb.buf, (size_t)b * sizeof(double));
        for (Py_ssize_t i = 0; i < b; i++)
            if (!whole(own[i]) || !whole(co[i]) || sizes[i] < 1 || starts[i] < 1) exact = 0;
        Py_ssize_t at = 0, at_diag = 0;
        offsets[0] = 0;
        for (Py_ssize_t j = 0; j < b && exact && !status; j++) {
            /* the co-batched loads (RooflineCostModel._shape: whole numbers) and their Â in
               order (StepLoad.co_batched_tokens) */
            double s_o = 0.0, p_o = 0.0, kv_o = 0.0, base = 0.0, c = own[j];
            for (Py_ssize_t i = 0; i < b; i++) {
                if (i == j) continue;
                double si = (double)sizes[i];
                s_o += si;
                p_o += si * (co[i] + si);
                kv_o += co[i] + si;
                base += expected[i];
            }
            situation here = {c, s_o, p_o, kv_o};
            exact = exact_pass(&pr, 0, 1.0 + s_o, 1.0 * (c + 1.0) + p_o, c + 1.0 + kv_o, 0.0);
            double ar; /* L_AR: the unmasked pass of the request's root alone beside the others */
            price_rows(&pr, &here, 0, 1, 1, &ar);
            if (!(isfinite(ar) && ar > 0.0)) status = -1;
            Py_ssize_t budget = starts[j] < n_max ? starts[j] : n_max, priced = 0, n = 0;
            Py_ssize_t chosen = 0;
            while (exact && !status) {
                Py_ssize_t ahead = 2 * budget < n_max ? 2 * budget : n_max;
                if (!reserve(&v, &cap_v, (size_t)ahead, sizeof(double)) ||
                    !reserve(&ints, &cap_i, (size_t)(4 * budget), sizeof(int64_t)) ||
                    !reserve(&floats, &cap_f, (size_t)(4 * budget), sizeof(double)) ||
                    !reserve(&heap, &cap_h, (size_t)(2 * budget + 2), sizeof(entry))) {
                    PyErr_NoMemory();
                    goto done;
                }
                double top = (double)ahead, top_pairs = top * (c + top) + p_o;
                if (ahead > priced && !exact_pass(&pr, 1, top + s_o, top_pairs, c + top + kv_o,
                                                  top_pairs)) {
                    exact = 0;
                    break;
                }
                int st;
                if (proof) {
                    st = lazy_round(&pr, &here, p + j * depth * k, tid + j * depth * k, depth, k,
                                    budget, ahead, n_max, draft, prep, dp, ar, base, a_ceiling,
                                    (double *)v, &priced, (int64_t *)ints, (double *)floats,
                                    (entry *)heap, &n, &chosen);
                } else {
                    price_to(&pr, &here, (double *)v, &priced, ahead);
                    st = bf_size_round(p + j * depth * k, tid + j * depth * k, depth, k, budget,
                                       ahead, n_max, RULE_BOUNDED, -1, (const double *)v, draft,
                                       prep, dp, ar, base, a_ceiling, (int64_t *)ints,
                                       (double *)floats, (entry *)heap, &n, &chosen);
                }
                if (st < 0) status = -1;
                if (st != 0) break;
                budget = 2 * budget < n_max ? 2 * budget : n_max;
            }
            if (!exact) status = -3;
            if (status) break;
            /* the chosen tree and the round's curves, out; this request's load updated */
            int64_t *in = (int64_t *)ints;
            double *fl = (double *)floats;
            if (!reserve(&o_int[0], &cap_o, (size_t)(at + chosen), sizeof(int64_t)) ||
                !reserve(&o_int[1], &cap_o1, (size_t)(at + chosen), sizeof(int64_t)) ||
                !reserve(&o_int[2], &cap_o2, (size_t)(at + chosen), sizeof(int64_t)) ||
                !reserve(&o_int[3], &cap_o3, (size_t)(at + chosen), sizeof(int64_t)) ||
                !reserve(&o_sco, &cap_s, (size_t)(at + chosen), sizeof(double)) ||
                !reserve(&o_diag, &cap_d, (size_t)(at_diag + 3 * n), sizeof(double))) {
                PyErr_NoMemory();
                goto done;
            }
            for (int f = 0; f < 4; f++) /* parents, depths, ranks, tokens */
                memcpy((int64_t *)o_int[f] + at, in + f * budget, (size_t)chosen * sizeof(int64_t));
            memcpy((double *)o_sco + at, fl, (size_t)chosen * sizeof(double));
            for (int f = 0; f < 3; f++) /* a_hat, c_hat, s_hat */
                memcpy((double *)o_diag + at_diag + f * n, fl + (f + 1) * budget,
                       (size_t)n * sizeof(double));
            sizes[j] = chosen;
            expected[j] = pairwise(fl, chosen); /* float(tree.scores.sum()) */
            built[j] = n;
            budgets[j] = budget;
            ars[j] = ar;
            at += chosen;
            at_diag += 3 * n;
            offsets[j + 1] = at;
        }
        if (status) {
            result = Py_BuildValue("(iOOOOOOOOOO)", status, Py_None, Py_None, Py_None, Py_None,
                                   Py_None, Py_None, Py_None, Py_None, Py_None, Py_None);
            goto done;
        }
        result = Py_BuildValue(
            "(iy#y#y#y#y#y#y#y#y#y#)", 0, (char *)o_int[0], at * i8, (char *)o_int[1], at * i8,
            (char *)o_int[2], at * i8, (char *)o_sco, at * f8, (char *)o_int[3], at * i8,
            (char *)offsets, (b + 1) * i8, (char *)built, b * i8, (char *)budgets, b * i8,
            (char *)o_diag, at_diag * f8, (char *)ars, b * f8);
    }
done:
    free(rows_q);
    free((void *)rows_col);
    free(v);
    free(tmp);
    free(ints);
    free(floats);
    free(heap);
    for (int f = 0; f < 4; f++) free(o_int[f]);
    free(o_sco);
    free(o_diag);
    free(offsets);
    free(built);
    free(budgets);
    free(sizes);
    free(expected);
    free(ars);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&startb);
    PyBuffer_Release(&sizeb);
    PyBuffer_Release(&expb);
    PyBuffer_Release(&ownb);
    PyBuffer_Release(&cob);
    PyBuffer_Release(&priceb);
    return result;
}
