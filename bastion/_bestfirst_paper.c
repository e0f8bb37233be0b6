/*
 * The paper controller's joint budget in one call: paper(), on forest()'s merged chain, its
 * cost priced here from a calibrated roofline.
 *
 * paper(probs, token_ids, depth, k, n_max, total, most, mass, contexts, price, bucket,
 *       draft_at0, draft_slope, draft_launch)
 *     -> (status, chosen, more, exhausted, ints, floats, m, L_AR)   (as joint()'s,
 *         _bestfirst_joint.c, and the L_AR priced)
 *
 * bastion.joint.choose_joint_batch in mode "auto" with the curve
 * RooflineCostModel.joint_cost_curve prices in its calibrated modes (static, ema+calib) for a
 * dense target: bastion.cost.jointcurve's joint_shapes, joint_seconds and growth_bound, the
 * stop rule's bounds and regrowth, node for node and operation for operation. The passes'
 * features (tokens, padded tokens, attention pairs, KV tokens, mask elements) are whole
 * numbers and so are the summed per-operator coefficients, so each branch's count is exact
 * whatever the order numpy's matrix-vector product adds in; a count that would reach 2^53
 * (not exact) stops the call (status -3). The numpy sums that are not exact (a request's
 * built mass, the unseen mass over the batch) are numpy's pairwise sums (bf_pairwise).
 *   mass: B lattice masses (bastion.joint._lattice_mass), or empty: computed here with
 *     numpy's sums and products in numpy's order; contexts: the B requests' contexts (int64),
 *     rounded up here to `bucket` tokens as joint_cost_curve rounds them (a context < 0 or
 *     beyond 2^52: status -3); draft_at0, draft_slope, draft_launch: the drafter pass's line
 *     for B requests (DrafterPricer.line; empty buffers: no drafter, T_draft = 0), priced at
 *     the bucketed contexts' sum as DrafterPricer.total_s prices it;
 *   price: 28 doubles: Σ f0, Σ f per feature (6) of the compute branch's pricer (tiled where
 *     the calibration pads), its FLOP rate and tile; Σ b0, Σ b (6) of the memory branch's
 *     (bare) pricer, its byte rate and tile; the calibration's α, β of compute then memory;
 *     γ (0: static mode, no factor); T_aux (T_draft added here; either not finite and
 *     >= 0: status -1); whether the growth bound applies (1.0:
 *     no coefficient or α below 0); tensor parallelism's all-reduces: whether a pass has them
 *     (1.0: tp > 1), their seconds c0 + c1 T per pass of T tokens (bastion.cost.parallel),
 *     added to the calibrated seconds before γ, c1 to the growth bound's rise per node.
 * status 0: done; -1: a price or bound is not finite and > 0 (the caller prices the chain in
 * Python, which raises); -3: a count is not exact (the caller runs the Python loop).
 */
#include "_bestfirst.h"

#define EXACT 9007199254740992.0 /* 2^53: whole numbers below it add and multiply exactly */

/* numpy's add.reduce of a contiguous float64 array: pairwise, 8 accumulators per block */
double bf_pairwise(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (i = 0; i < 8; i++) r[i] = a[i];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return bf_pairwise(a, n2) + bf_pairwise(a + n2, n - n2);
}

static double nmax(double a, double b) { return a != a || b != b ? NAN : (a >= b ? a : b); }
static double nmin(double a, double b) { return a != a || b != b ? NAN : (a <= b ? a : b); }

/* DrafterPricer.total_s's operator sum (its launch aside) at a context sum cs: with y = a + cs * s
   (2n doubles: each operator's compute seconds, then its memory seconds), Σ_i max(y_i, y_{n+i})
   as numpy's add.reduce sums it (pairwise; np.maximum's NaN); scratch holds n doubles. Shared by
   drafter_s() and paper(). */
static double drafter_sum(const double *a, const double *s, Py_ssize_t n, double cs,
                          double *scratch) {
    for (Py_ssize_t i = 0; i < n; i++)
        scratch[i] = nmax(a[i] + cs * s[i], a[n + i] + cs * s[n + i]);
    return bf_pairwise(scratch, n);
}

/* const + features . coefficients (T, padded T, pairs, KV, mask; experts 0). Exact where the
   caller checked it (exact()): whole numbers whose every partial sum stays below 2^53. */
static inline double branch(const double *co, double t, double tile, double pairs, double kv,
                            double mask) {
    double padded = tile > 0.0 ? ceil(t / tile) * tile : t;
    return co[0] + t * co[1] + padded * co[2] + pairs * co[3] + kv * co[4] + mask * co[5];
}

/* whether every pass up to these features (the largest of the chain: each feature grows with
   it, and the coefficients are whole numbers >= 0) is counted exactly */
static int exact(const double *pr, double t, double pairs, double kv) {
    double x[4] = {t, pairs, kv, pr[8] > pr[17] ? pr[8] : pr[17]};
    for (int i = 0; i < 4; i++)
        if (!(x[i] >= 0.0 && x[i] < EXACT && x[i] == floor(x[i]))) return 0;
    double padded = x[3] > 0.0 ? ceil(t / x[3]) * x[3] + x[3] : t; /* >= each padded T */
    return branch(pr, t, 0.0, pairs, kv, pairs) + padded * pr[2] < EXACT &&
           branch(pr + 9, t, 0.0, pairs, kv, pairs) + padded * pr[11] < EXACT;
}

/* a pass's calibrated (compute, memory) seconds */
static inline void seconds(const double *pr, double t, double pairs, double kv, double mask,
                           double *compute, double *memory) {
    *compute = branch(pr, t, pr[8], pairs, kv, mask) / pr[7];
    *memory = branch(pr + 9, t, pr[17], pairs, kv, mask) / pr[16];
}

/* a pass of t tokens: the calibrated device's seconds, plus tensor parallelism's all-reduces
   (pr[25] != 0: c0 + c1 t, as RooflineCostModel._base adds them), then gamma */
static double calibrated(const double *pr, double t, double compute, double memory) {
    double v = nmax(pr[18] * compute + pr[19], pr[20] * memory + pr[21]);
    if (pr[25] != 0.0) v = v + (pr[26] + pr[27] * t);
    return pr[22] != 0.0 ? pr[22] * v : v;
}

/* growth_bound at the chain's end (its seconds given): the rise of the attaining branches per
   node, at least 0; NaN where neither attains (the caller's max() of nothing raises) */
static double rise(const double *pr, double c_min, double compute, double memory) {
    if (pr[24] != 0.0) return 0.0;
    double inc[6] = {1.0, 0.0, c_min + 3.0, 1.0, c_min + 3.0, 0.0}, dc = 0.0, dm = 0.0;
    for (int i = 0; i < 5; i++) { /* whole numbers well below 2^53: exact in any order */
        dc += inc[i] * pr[1 + i];
        dm += inc[i] * pr[10 + i];
    }
    double rise_c = dc / pr[7], rise_m = dm / pr[16];
    double bc = pr[18] * compute + pr[19], bm = pr[20] * memory + pr[21], step;
    int up_c = bc >= bm, up_m = bm >= bc;
    if (up_c && up_m) {
        double a = pr[18] * rise_c, b = pr[20] * rise_m;
        step = b > a ? b : a;
    } else if (up_c) {
        step = pr[18] * rise_c;
    } else if (up_m) {
        step = pr[20] * rise_m;
    } else {
        return NAN;
    }
    if (pr[25] != 0.0) step += pr[27]; /* each node adds a token to every all-reduce */
    if (pr[22] != 0.0) step *= pr[22];
    return 0.0 > step ? 0.0 : step;
}

PyObject *bf_paper(PyObject *self, PyObject *args) {
    Py_buffer probs, ids, massb, ctxb, priceb, at0b, slopeb;
    Py_ssize_t depth, k, n_max, total, most, bucket;
    double launch;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nnnnny*y*y*ny*y*d", &probs, &ids, &depth, &k, &n_max,
                          &total, &most, &massb, &ctxb, &priceb, &bucket, &at0b, &slopeb,
                          &launch))
        return NULL;
    Py_ssize_t b = depth > 0 && k > 0 ? probs.len / (Py_ssize_t)sizeof(double) / depth / k : 0;
    fentry *heap = NULL;
    int64_t *count = NULL, *g_req = NULL, *g_pos = NULL, *g_par = NULL, *g_dep = NULL,
            *g_rnk = NULL, *cap = NULL, *alloc = NULL, *held = NULL, *start = NULL,
            *priced = NULL;
    double *g_sco = NULL, *a_hat = NULL, *c_hat = NULL, *s_hat = NULL, *built = NULL,
           *own = NULL, *own_mass = NULL, *pj = NULL, *c = NULL;
    if (depth < 1 || k < 1 || b < 1 || n_max < 1 || total < 0 || most < 0 || depth > INT32_MAX ||
        k > INT32_MAX || b > INT32_MAX ||
        !bf_holds_exactly(probs.len, sizeof(double), b, depth, k) ||
        !bf_holds_exactly(ids.len, sizeof(int64_t), b, depth, k) || most > b * (n_max - 1) ||
        (massb.len != 0 && massb.len != b * (Py_ssize_t)sizeof(double)) ||
        ctxb.len != b * (Py_ssize_t)sizeof(int64_t) || priceb.len != 28 * sizeof(double) ||
        bucket < 1 || at0b.len != slopeb.len || at0b.len % (2 * (Py_ssize_t)sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "paper: inconsistent sizes");
        goto done;
    }
    if (total > most) total = most;
    {
        const double *p = (const double *)probs.buf, *mass = (const double *)massb.buf;
        const double *pr = (const double *)priceb.buf;
        if (massb.len == 0) { /* _lattice_mass: (1 + Σ_d Π_{e<=d} Σ_j p[e, j]) (1 + 1e-9) */
            own_mass = malloc((size_t)(b + depth) * sizeof(double));
            if (!own_mass) {
                PyErr_NoMemory();
                goto done;
            }
            double *rows = own_mass + b;
            for (Py_ssize_t r = 0; r < b; r++) {
                for (Py_ssize_t d = 0; d < depth; d++) {
                    double level = bf_pairwise(p + (r * depth + d) * k, k);
                    rows[d] = d ? rows[d - 1] * level : level;
                }
                own_mass[r] = (1.0 + bf_pairwise(rows, depth)) * (1.0 + 1e-9);
            }
            mass = own_mass;
        }
        const int64_t *tid = (const int64_t *)ids.buf;
        size_t cap_nodes = 0;
        Py_ssize_t hn = -1; /* the forest's heap, its growth resumed round after round */
        count = calloc((size_t)b, sizeof(int64_t));
        cap = malloc((size_t)b * sizeof(int64_t));
        alloc = calloc((size_t)b, sizeof(int64_t));
        held = malloc((size_t)b * sizeof(int64_t));
        start = malloc((size_t)(b + 1) * sizeof(int64_t));
        built = malloc((size_t)b * sizeof(double));
        priced = malloc((size_t)b * sizeof(int64_t)); /* nodes per request in priced passes */
        c = malloc((size_t)b * sizeof(double));
        if (!count || !cap || !alloc || !held || !start || !built || !priced || !c) {
            PyErr_NoMemory();
            goto done;
        }
        /* the contexts rounded up to the bucket, -(-c // bucket) * bucket, whole numbers
           below 2^53 (else, or a context < 0, the Python loop: status -3 below), and their
           sum, what numpy's int64 sum gives; T_draft at that sum as DrafterPricer.total_s
           prices it (drafter_s() plus the launch; 0 without a line), T_draft + T_aux */
        int64_t context_sum = 0;
        int contexts_ok = 1;
        const int64_t *raw = (const int64_t *)ctxb.buf;
        for (Py_ssize_t r = 0; r < b; r++) {
            int64_t v = raw[r];
            if (v < 0 || v > (int64_t)(EXACT / 2) || context_sum > (int64_t)(EXACT / 2)) {
                contexts_ok = 0;
                c[r] = 0.0;
                continue;
            }
            int64_t q = (v + (int64_t)bucket - 1) / (int64_t)bucket * (int64_t)bucket;
            c[r] = (double)q;
            context_sum += q;
        }
        double draft = 0.0;
        Py_ssize_t n_ops = at0b.len / (2 * (Py_ssize_t)sizeof(double));
        if (n_ops > 0) {
            double *ops = malloc((size_t)n_ops * sizeof(double));
            if (!ops) {
                PyErr_NoMemory();
                goto done;
            }
            draft = drafter_sum((const double *)at0b.buf, (const double *)slopeb.buf, n_ops,
                                (double)context_sum, ops) +
                    launch;
            free(ops);
        }
        double prep = pr[23];
        /* joint_shapes: the roots' pairs Σ (c + 1), the smallest context */
        double pairs0 = 0.0, c_min = c[0];
        for (Py_ssize_t r = 0; r < b; r++) {
            pairs0 += c[r] + 1.0; /* whole numbers: exact in numpy's order too */
            if (c[r] < c_min) c_min = c[r];
            cap[r] = n_max;
        }
        double fixed = draft + prep, ar = 0.0, compute, memory;
        int status = 0, more = 0;
        Py_ssize_t m = 0, chosen = 0;
        if (!contexts_ok || !exact(pr, (double)b, pairs0, pairs0)) {
            status = -3;
            goto answer;
        }
        if (!(isfinite(draft) && draft >= 0.0 && isfinite(prep) && prep >= 0.0)) {
            status = -1; /* (joint_pricing's check: the Python loop prices and raises) */
            goto answer;
        }
        seconds(pr, (double)b, pairs0, pairs0, 0.0, &compute, &memory);
        ar = calibrated(pr, (double)b, compute, memory); /* L_AR: B tokens, unmasked */
        if (!(isfinite(ar) && ar > 0.0 && isfinite(fixed) && fixed >= 0.0)) {
            status = -1;
            goto answer;
        }
        /* the chain's passes are priced once: each round prices the passes it adds (the
           chain's prefix, hence its passes, is every earlier round's) */
        double pairs_run = pairs0; /* the pairs after `done` additions */
        Py_ssize_t done = -1;      /* passes 0 ... done priced (c_hat, a_hat, s_hat) */
        int mono = 1;              /* c_hat non-decreasing over them */
        for (Py_ssize_t r = 0; r < b; r++) priced[r] = 1;
        for (;;) {
            if ((size_t)total + 1 > cap_nodes) {
                cap_nodes = (size_t)total + 1;
#define GROW(ptr, n)                                          \
    do {                                                      \
        void *grown_ = realloc((ptr), (n) * sizeof(*(ptr)));  \
        if (!grown_) {                                        \
            PyErr_NoMemory();                                 \
            goto done;                                        \
        }                                                     \
        (ptr) = grown_;                                       \
    } while (0)
                GROW(heap, (size_t)b + cap_nodes);
                GROW(g_req, cap_nodes);
                GROW(g_pos, cap_nodes);
                GROW(g_par, cap_nodes);
                GROW(g_dep, cap_nodes);
                GROW(g_rnk, cap_nodes);
                GROW(g_sco, cap_nodes);
                GROW(a_hat, cap_nodes);
                GROW(c_hat, cap_nodes);
                GROW(s_hat, cap_nodes);
                GROW(own, cap_nodes);
                GROW(pj, cap_nodes);
#undef GROW
            }
            m = bf_forest_grow(p, b, depth, k, cap, total, heap, count, g_req, g_pos, g_par, g_dep,
                               g_rnk, g_sco, &more, &hn, m);
            /* the new passes' features: a node added to a request holding n raises the pairs
               by c + 2n + 1 (joint_shapes); the last pass's checked first */
            for (Py_ssize_t j = done + 1; j <= m; j++) {
                if (j > 0) {
                    Py_ssize_t r = g_req[j - 1];
                    pairs_run += c[r] + 2.0 * (double)priced[r]++ + 1.0;
                }
                pj[j] = pairs_run;
            }
            if (!exact(pr, (double)(b + m), pj[m], pairs0 + (double)m)) {
                status = -3;
                goto answer;
            }
            /* … priced as joint_seconds, checked as _chain_costs; Â, Ŝ and the best on */
            for (Py_ssize_t j = done + 1; j <= m; j++) {
                seconds(pr, (double)(b + j), pj[j], pairs0 + (double)j, pj[j], &compute, &memory);
                double verify = calibrated(pr, (double)(b + j), compute, memory);
                c_hat[j] = fixed + verify;
                if (!(isfinite(verify) && verify > 0.0 && isfinite(c_hat[j]) && c_hat[j] > 0.0)) {
                    status = -1;
                    goto answer;
                }
                if (j > 0 && !(c_hat[j] >= c_hat[j - 1])) mono = 0;
                a_hat[j] = j > 0 ? a_hat[j - 1] + g_sco[j - 1] : (double)b;
                s_hat[j] = a_hat[j] * ar / c_hat[j];
                if (s_hat[j] > s_hat[chosen]) chosen = j;
            }
            done = m;
            double growth_s = rise(pr, c_min, compute, memory); /* at the chain's end (pass m) */
            if (!(isfinite(growth_s) && growth_s >= 0.0)) {
                status = -1;
                goto answer;
            }
            if (!more) break;
            double growth = 2.0;
            int monotone = m > 0 && mono;
            if (monotone) {
                /* each request's built mass: its root, then its nodes in their order (numpy's
                   reduceat: the first element plus the pairwise sum of the rest) */
                start[0] = 0;
                for (Py_ssize_t r = 0; r < b; r++) start[r + 1] = start[r] + count[r] - 1;
                for (Py_ssize_t r = 0; r < b; r++) held[r] = start[r];
                for (Py_ssize_t j = 0; j < m; j++) own[held[g_req[j]]++] = g_sco[j];
                double rho = g_sco[m - 1];
                for (Py_ssize_t r = 0; r < b; r++) {
                    double mine = 1.0 + bf_pairwise(own + start[r], start[r + 1] - start[r]);
                    built[r] = nmin((double)(n_max - count[r]) * rho, nmax(mass[r] - mine, 0.0));
                }
                double a_end = a_hat[m], c_end = c_hat[m], s_best = s_hat[chosen];
                double a_far = (a_end + bf_pairwise(built, b)) * (1.0 + 1e-12);
                double c_needed = a_far * ar / s_best;
                if (c_needed <= c_end) break;
                if (growth_s > 0.0) { /* S(M + k) <= L min(A + k rho, A_far) / (C + k delta) */
                    double rate = rho * (1.0 + 1e-12), step = growth_s;
                    double k_star = 1.0;
                    if (rate > 0.0) {
                        k_star = (a_far - a_end) / rate;
                        if (!(k_star > 1.0)) k_star = 1.0; /* max(1.0, x) */
                    }
                    double near = (a_end + rate) / (c_end + step);
                    double reach = a_end + k_star * rate;
                    double far = (a_far < reach ? a_far : reach) / (c_end + k_star * step);
                    double best = far > near ? far : near;
                    if (best * ar <= s_best) break;
                }
                growth = bf_growth(c_hat, m, c_needed);
            }
            total = bf_regrown(total, growth, b, most); /* bastion.joint._regrown */
        }
    answer:
        if (status != 0) {
            result = Py_BuildValue("(innnOOnd)", status, (Py_ssize_t)0, (Py_ssize_t)0,
                                   (Py_ssize_t)0, Py_None, Py_None, (Py_ssize_t)0, 0.0);
            goto done;
        }
        int exhausted = !more;
        for (Py_ssize_t r = 0; r < b; r++) {
            alloc[r] = 1;
            if (count[r] >= n_max) exhausted = 0;
        }
        for (Py_ssize_t j = 0; j < chosen; j++) alloc[g_req[j]]++;
        PyObject *ints, *floats;
        if (bf_joint_buffers(b, m, chosen, alloc, g_req, g_pos, g_par, g_dep, g_rnk, g_sco, tid,
                             depth, k, a_hat, c_hat, s_hat, &ints, &floats))
            goto done;
        result = Py_BuildValue("(innnNNnd)", 0, chosen, (Py_ssize_t)more, (Py_ssize_t)exhausted,
                               ints, floats, m, ar);
    }
done:
    free(own_mass);
    free(heap);
    free(count);
    free(cap);
    free(alloc);
    free(held);
    free(start);
    free(built);
    free(own);
    free(pj);
    free(c);
    free(priced);
    free(g_req);
    free(g_pos);
    free(g_par);
    free(g_dep);
    free(g_rnk);
    free(g_sco);
    free(a_hat);
    free(c_hat);
    free(s_hat);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&massb);
    PyBuffer_Release(&ctxb);
    PyBuffer_Release(&priceb);
    PyBuffer_Release(&at0b);
    PyBuffer_Release(&slopeb);
    return result;
}

/* joint_price(contexts, grow, price) -> (status, seconds)
 *
 * RooflineCostModel.joint_cost_curve's passes priced here (growth=False): the uncorrected
 * seconds joint_seconds gives, after the model's correction (gamma, as paper() applies it), of
 * the B-request batch after 0 ... m additions along `grow` (m int64 request indices) and, last,
 * L_AR's unmasked pass of the B roots: m + 2 doubles. contexts: B bucketed contexts (whole
 * numbers >= 0); price: paper()'s 28 numbers. The passes' features are joint_shapes', whole
 * numbers, so every count is exact (checked at the last pass, as paper() does). status 0:
 * done; -2: a context or request index out of range (joint_shapes raises); -3: not exact
 * (the caller prices the curve in numpy). */
PyObject *bf_joint_price(PyObject *self, PyObject *args) {
    Py_buffer ctxb, growb, priceb;
    PyObject *result = NULL;
    int64_t *held = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*", &ctxb, &growb, &priceb)) return NULL;
    Py_ssize_t b = ctxb.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t m = growb.len / (Py_ssize_t)sizeof(int64_t);
    if (b < 1 || ctxb.len != b * (Py_ssize_t)sizeof(double) ||
        growb.len != m * (Py_ssize_t)sizeof(int64_t) || priceb.len != 28 * sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "joint_price: inconsistent sizes");
        goto done;
    }
    {
        const double *c = (const double *)ctxb.buf, *pr = (const double *)priceb.buf;
        const int64_t *g = (const int64_t *)growb.buf;
        int status = 0;
        double pairs0 = 0.0;
        for (Py_ssize_t r = 0; r < b; r++) {
            if (!(c[r] >= 0.0 && c[r] < EXACT && c[r] == floor(c[r]))) status = -2;
            pairs0 += c[r] + 1.0; /* whole numbers: exact in numpy's order too */
        }
        held = malloc((size_t)b * sizeof(int64_t));
        if (!held) {
            PyErr_NoMemory();
            goto done;
        }
        double pairs = pairs0;
        for (Py_ssize_t r = 0; r < b; r++) held[r] = 1;
        for (Py_ssize_t j = 0; j < m && !status; j++) { /* the last pass's features first */
            int64_t r = g[j];
            if (r < 0 || r >= b) {
                status = -2;
                break;
            }
            pairs += c[r] + 2.0 * (double)held[r]++ + 1.0;
        }
        if (!status && !exact(pr, (double)(b + m), pairs, pairs0 + (double)m)) status = -3;
        if (status) {
            result = Py_BuildValue("(iy#)", status, "", (Py_ssize_t)0);
            goto done;
        }
        PyObject *out = PyBytes_FromStringAndSize(NULL, (m + 2) * (Py_ssize_t)sizeof(double));
        if (!out) goto done;
        double *v = (double *)PyBytes_AS_STRING(out), compute, memory;
        pairs = pairs0;
        for (Py_ssize_t r = 0; r < b; r++) held[r] = 1;
        for (Py_ssize_t j = 0; j <= m; j++) {
            if (j > 0) {
                int64_t r = g[j - 1];
                pairs += c[r] + 2.0 * (double)held[r]++ + 1.0;
            }
            seconds(pr, (double)(b + j), pairs, pairs0 + (double)j, pairs, &compute, &memory);
            v[j] = calibrated(pr, (double)(b + j), compute, memory);
        }
        seconds(pr, (double)b, pairs0, pairs0, 0.0, &compute, &memory);
        v[m + 1] = calibrated(pr, (double)b, compute, memory); /* L_AR: B tokens, unmasked */
        result = Py_BuildValue("(iN)", 0, out);
    }
done:
    free(held);
    PyBuffer_Release(&ctxb);
    PyBuffer_Release(&growb);
    PyBuffer_Release(&priceb);
    return result;
}

/* drafter_s(at0, slope, context_sum) -> float: drafter_sum() of the drafter's line (above). */
PyObject *bf_drafter_s(PyObject *self, PyObject *args) {
    Py_buffer at0b, slopeb;
    double cs;
    PyObject *result = NULL;
    double *y = NULL;
    if (!PyArg_ParseTuple(args, "y*y*d", &at0b, &slopeb, &cs)) return NULL;
    Py_ssize_t m = at0b.len / (Py_ssize_t)sizeof(double), n = m / 2;
    if (at0b.len != m * (Py_ssize_t)sizeof(double) || slopeb.len != at0b.len || m != 2 * n) {
        PyErr_SetString(PyExc_ValueError, "drafter_s: at0 and slope must be 2n float64 each");
        goto done;
    }
    y = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!y) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyFloat_FromDouble(
        drafter_sum((const double *)at0b.buf, (const double *)slopeb.buf, n, cs, y));
done:
    free(y);
    PyBuffer_Release(&at0b);
    PyBuffer_Release(&slopeb);
    return result;
}

/* pass_sums(y, phi, attention, lm) -> (total, attention_total, lm_seconds)
 *
 * The simulated GPU's price of one target pass after its feature product (bastion.sim.
 * pass_pricing._price_one): with y the pass's 2n operator seconds (compute, then memory; numpy's
 * product of its features and the per-operator matrix), per_op_i = max(y_i, y_{n+i}) (np.maximum's
 * NaN) times phi_i (the kernel-aware GEMM step factors of its token count; empty: none), and
 *   total = Σ_i per_op_i as numpy's add.reduce sums (pairwise),
 *   attention_total = Σ_i per_op_i * attention_i, which numpy forms as a matrix product: the
 *     caller passes only a 0/1 vector with at most two ones, whose sum is the same rounded
 *     value in every order (each product is exact and adding zeros changes nothing),
 *   lm_seconds = per_op_lm. */
PyObject *bf_pass_sums(PyObject *self, PyObject *args) {
    Py_buffer yb, phib, attb;
    Py_ssize_t lm;
    PyObject *result = NULL;
    double *per_op = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*n", &yb, &phib, &attb, &lm)) return NULL;
    Py_ssize_t dsz = (Py_ssize_t)sizeof(double), m = yb.len / dsz, n = m / 2;
    if (yb.len != m * dsz || m != 2 * n || n < 1 || attb.len != n * dsz ||
        (phib.len != 0 && phib.len != n * dsz) || lm < 0 || lm >= n) {
        PyErr_SetString(PyExc_ValueError,
                        "pass_sums: y must be 2n float64, phi empty or n, attention n, lm < n");
        goto done;
    }
    per_op = malloc((size_t)n * sizeof(double));
    if (!per_op) {
        PyErr_NoMemory();
        goto done;
    }
    {
        const double *y = (const double *)yb.buf, *att = (const double *)attb.buf;
        const double *phi = phib.len ? (const double *)phib.buf : NULL;
        double attention = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) {
            double v = nmax(y[i], y[n + i]);
            if (phi) v = v * phi[i];
            per_op[i] = v;
            attention = i ? attention + v * att[i] : v * att[i];
        }
        result = Py_BuildValue("ddd", bf_pairwise(per_op, n), attention, per_op[lm]);
    }
done:
    free(per_op);
    PyBuffer_Release(&yb);
    PyBuffer_Release(&phib);
    PyBuffer_Release(&attb);
    return result;
}
