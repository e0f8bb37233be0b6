/*
 * The learning controller's joint budget in one call: joint(), on forest()'s merged chain.
 *
 * joint(probs, token_ids, depth, k, n_max, total, most, mass, cells, best_above, ar)
 *     -> (status, chosen, more, exhausted, ints, floats, m, order)
 *   ints, floats: the trees and the curve priced (bf_joint_buffers, _bestfirst_forest.c:
 *   int64 offsets, parents, tokens, depths, ranks; float64 scores, Â, Ĉ, Ŝ of the m + 1
 *   passes priced); None where status != 0. order: the chosen nodes' merged order (int64,
 *   the request of each in turn: learn()'s hint); b"" where status != 0
 *
 * bastion.joint.choose_joint_batch in mode "auto" (the bounded argmax) on the learning
 * controller's stepped decision curve (bastion.learned.LearnedCostModel.joint_decision_curve),
 * in one call: the chain is forest()'s merged order, regrown while the bound needs more, its
 * cost for j added nodes best_above[cells[j]].
 * probs, token_ids: B * depth * k; mass: B lattice masses (bastion.joint._lattice_mass), or
 * empty: computed here, its sums sequential (the bound's slack of 1e-9 covers the order);
 * cells: the lattice cell of every total B … B + len(cells) - 1; best_above: per cell;
 * total: the first round's added nodes; most: B * (n_max - 1).
 * status 0: done; -1: a priced cost is not finite and > 0 (the caller prices it again to
 * raise); -2: the chain outgrew the priced totals (the caller runs the Python loop). The trees
 * (roots' token -1) are each request's best-first prefix of the chosen allocation; a_hat,
 * c_hat, s_hat: the last round's chain. Sums are sequential where numpy's are pairwise (the
 * per-request built mass of the stop bound only, which carries a 1e-12 slack).
 * Speed, the doubles unchanged: a round prices only the passes the last one had not (the
 * growth resumes, so the chain's prefix, its Â, Ĉ, Ŝ, argmax and built masses carry over);
 * four lattice levels are summed side by side (each sum still in its own order); the floor
 * bound's maximum over the totals ahead is taken two at a time (SSE2; a maximum does not
 * depend on its order).
 */
#include "_bestfirst.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The floor bound's reach over the totals j in (m, last] (the ratios only where j <= high):
   the largest min(a_end + (j - m) * rate, a_far) / max(c_end, f_j) and ahead, f_j =
   above[cells[j]]; *nan_seen set where some f_j is NaN. A maximum (r > ahead keeps the
   larger, NaN never) does not depend on the order it is taken in: two totals at a time. */
static void bf_floor_ahead(const double *above, const int64_t *cells, Py_ssize_t m,
                           Py_ssize_t high, Py_ssize_t last, double a_end, double c_end,
                           double rate, double a_far, double *ahead_io, int *nan_seen) {
    double ahead = *ahead_io;
    int nan_any = 0;
    Py_ssize_t j = m + 1;
#if defined(__SSE2__)
    {
        const __m128d v_rate = _mm_set1_pd(rate), v_aend = _mm_set1_pd(a_end),
                      v_afar = _mm_set1_pd(a_far), v_cend = _mm_set1_pd(c_end),
                      v_two = _mm_set1_pd(2.0);
        __m128d v_t = _mm_set_pd(2.0, 1.0), v_ahead = _mm_setzero_pd(),
                v_nan = _mm_setzero_pd();
        for (; j + 1 <= high; j += 2) {
            __m128d f = _mm_set_pd(above[cells[j + 1]], above[cells[j]]);
            v_nan = _mm_or_pd(v_nan, _mm_cmpunord_pd(f, f));
            __m128d den = _mm_max_pd(v_cend, f); /* c_end > f ? c_end : f */
            __m128d a_up = _mm_add_pd(v_aend, _mm_mul_pd(v_t, v_rate));
            a_up = _mm_min_pd(v_afar, a_up);     /* a_up > a_far ? a_far : a_up */
            v_ahead = _mm_max_pd(_mm_div_pd(a_up, den), v_ahead); /* r > ahead ? r : ahead */
            v_t = _mm_add_pd(v_t, v_two);
        }
        double lane[2];
        _mm_storeu_pd(lane, v_ahead);
        for (int l = 0; l < 2; l++)
            if (lane[l] > ahead) ahead = lane[l];
        nan_any = _mm_movemask_pd(v_nan) != 0;
    }
#endif
    for (; j <= last; j++) {
        double f = above[cells[j]];
        if (isnan(f)) nan_any = 1;
        if (j <= high) {
            double den = c_end > f ? c_end : f;
            double a_up = a_end + (double)(j - m) * rate;
            if (a_up > a_far) a_up = a_far;
            double r = a_up / den;
            if (r > ahead) ahead = r;
        }
    }
    *ahead_io = ahead;
    if (nan_any) *nan_seen = 1;
}

PyObject *bf_joint(PyObject *self, PyObject *args) {
    Py_buffer probs, ids, massb, cellsb, aboveb;
    Py_ssize_t depth, k, n_max, total, most;
    double ar;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nnnnny*y*y*d", &probs, &ids, &depth, &k, &n_max, &total,
                          &most, &massb, &cellsb, &aboveb, &ar))
        return NULL;
    Py_ssize_t b = depth > 0 && k > 0 ? probs.len / (Py_ssize_t)sizeof(double) / depth / k : 0;
    Py_ssize_t ntot = cellsb.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t ncell = aboveb.len / (Py_ssize_t)sizeof(double);
    const int64_t *cells = (const int64_t *)cellsb.buf;
    fentry *heap = NULL;
    int64_t *count = NULL, *g_req = NULL, *g_pos = NULL, *g_par = NULL, *g_dep = NULL,
            *g_rnk = NULL, *cap = NULL, *alloc = NULL;
    double *g_sco = NULL, *a_hat = NULL, *c_hat = NULL, *s_hat = NULL, *built = NULL;
    double *own_mass = NULL;
    if (depth < 1 || k < 1 || b < 1 || n_max < 1 || total < 0 || most < 0 || depth > INT32_MAX ||
        k > INT32_MAX || b > INT32_MAX ||
        !bf_holds_exactly(probs.len, sizeof(double), b, depth, k) ||
        !bf_holds_exactly(ids.len, sizeof(int64_t), b, depth, k) || ntot < 1 || ncell < 1 ||
        most > b * (n_max - 1) ||
        (massb.len != 0 && massb.len != b * (Py_ssize_t)sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "joint: inconsistent sizes");
        goto done;
    }
    { /* branch-free: a cell outside [0, ncell) sets the sign of cell | (ncell - 1 - cell) */
        int64_t out = 0;
        for (Py_ssize_t j = 0; j < ntot; j++)
            out |= cells[j] | (int64_t)((uint64_t)ncell - 1 - (uint64_t)cells[j]);
        if (out < 0) {
            PyErr_SetString(PyExc_ValueError, "joint: a cell index is out of range");
            goto done;
        }
    }
    if (total > most) total = most;
    {
        const double *p = (const double *)probs.buf, *mass = (const double *)massb.buf;
        if (massb.len == 0) { /* bastion.joint._lattice_mass, its sums sequential */
            own_mass = malloc((size_t)b * sizeof(double));
            if (!own_mass) {
                PyErr_NoMemory();
                goto done;
            }
            for (Py_ssize_t r = 0; r < b; r++) {
                double row = 1.0, sum = 0.0;
                const double *pr = p + r * depth * k;
                Py_ssize_t d = 0;
                /* four levels' sums at once (each still in its own order, j = 0 … k - 1) */
                for (; d + 4 <= depth; d += 4) {
                    double lv[4] = {0.0, 0.0, 0.0, 0.0};
                    for (Py_ssize_t j = 0; j < k; j++)
                        for (int l = 0; l < 4; l++) lv[l] += pr[(d + l) * k + j];
                    for (int l = 0; l < 4; l++) {
                        row *= lv[l];
                        sum += row;
                    }
                }
                for (; d < depth; d++) {
                    double level = 0.0;
                    for (Py_ssize_t j = 0; j < k; j++) level += pr[d * k + j];
                    row *= level;
                    sum += row;
                }
                own_mass[r] = (1.0 + sum) * (1.0 + 1e-9);
            }
            mass = own_mass;
        }
        const double *above = (const double *)aboveb.buf;
        const int64_t *tid = (const int64_t *)ids.buf;
        /* the per-node arrays grow with the rounds (most can be 30 000 nodes where a round
         * grows a few hundred: allocating for it cost more than the round) */
        size_t cap_nodes = 0;
        Py_ssize_t hn = -1; /* the forest's heap, its growth resumed round after round */
        count = calloc((size_t)b, sizeof(int64_t));
        cap = malloc((size_t)b * sizeof(int64_t));
        alloc = calloc((size_t)b, sizeof(int64_t));
        built = malloc((size_t)b * sizeof(double));
        if (!count || !cap || !alloc || !built) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t r = 0; r < b; r++) {
            cap[r] = n_max;
            built[r] = 1.0;
        }
        int status = 0, more = 0, monotone = 1;
        Py_ssize_t m = 0, chosen = 0, priced = 0, built_upto = 0;
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
                GROW(heap, (size_t)b + cap_nodes); /* forest_grow's heap: B + total + 1 */
                GROW(g_req, cap_nodes);
                GROW(g_pos, cap_nodes);
                GROW(g_par, cap_nodes);
                GROW(g_dep, cap_nodes);
                GROW(g_rnk, cap_nodes);
                GROW(g_sco, cap_nodes);
                GROW(a_hat, cap_nodes);
                GROW(c_hat, cap_nodes);
                GROW(s_hat, cap_nodes);
#undef GROW
            }
            m = bf_forest_grow(p, b, depth, k, cap, total, heap, count, g_req, g_pos, g_par, g_dep,
                               g_rnk, g_sco, &more, &hn, m);
            /* a chain grown beyond the priced totals: the Python loop prices more (the request
             * may ask for more: a lattice that holds fewer nodes ends the chain first) */
            if (m > ntot - 1) {
                status = -2;
                break;
            }
            /* the chain's first `priced` passes are the last round's (its growth resumed):
             * their Ĉ, Â, Ŝ, the argmax over them and the built masses carry over */
            int bad = !(isfinite(ar) && ar > 0.0);
            for (Py_ssize_t j = priced; j <= m; j++) {
                c_hat[j] = above[cells[j]];
                if (!(isfinite(c_hat[j]) && c_hat[j] > 0.0)) bad = 1;
            }
            if (bad) {
                status = -1;
                break;
            }
            if (priced == 0) a_hat[0] = (double)b;
            for (Py_ssize_t j = priced > 0 ? priced - 1 : 0; j < m; j++)
                a_hat[j + 1] = a_hat[j] + g_sco[j];
            for (Py_ssize_t j = priced; j <= m; j++) s_hat[j] = a_hat[j] * ar / c_hat[j];
            for (Py_ssize_t j = priced; j <= m; j++)
                if (s_hat[j] > s_hat[chosen]) chosen = j;
            for (Py_ssize_t j = priced > 0 ? priced : 1; j <= m && monotone; j++)
                monotone = c_hat[j] >= c_hat[j - 1];
            priced = m + 1;
            if (!more) break;
            double growth = 2.0;
            if (monotone && m > 0) {
                for (; built_upto < m; built_upto++) built[g_req[built_upto]] += g_sco[built_upto];
                double rho = g_sco[m - 1], unseen = 0.0;
                for (Py_ssize_t r = 0; r < b; r++) {
                    double left = mass[r] - built[r];
                    double u = (double)(n_max - count[r]) * rho;
                    left = left > 0.0 ? left : 0.0;
                    unseen += u < left ? u : left;
                }
                double a_far = (a_hat[m] + unseen) * (1.0 + 1e-12);
                double c_needed = a_far * ar / s_hat[chosen];
                if (c_needed <= c_hat[m]) break;
                /* bastion.joint._floor_bound on the decision curve, its own floor: what any
                 * longer chain prices at each total ahead */
                {
                    double ahead = 0.0;
                    int nan_seen = 0;
                    Py_ssize_t last = ntot - 1, high = last < most ? last : most;
                    if (last > m && most > last) { /* beyond the priced totals */
                        double f = above[cells[last]], den = c_hat[m] > f ? c_hat[m] : f;
                        double r = a_far / den;
                        if (r > ahead) ahead = r;
                    }
                    bf_floor_ahead(above, cells, m, high, last, a_hat[m], c_hat[m],
                                   rho * (1.0 + 1e-12), a_far, &ahead, &nan_seen);
                    if (!nan_seen && ahead * ar <= s_hat[chosen]) break;
                }
                /* (the curve's growth_s is 0: no second bound) */
                growth = bf_growth(c_hat, m, c_needed);
            }
            total = bf_regrown(total, growth, b, most); /* bastion.joint._regrown */
        }
        if (status != 0) {
            result = Py_BuildValue("(innnOOny#)", status, (Py_ssize_t)0, (Py_ssize_t)0,
                                   (Py_ssize_t)0, Py_None, Py_None, (Py_ssize_t)0, "",
                                   (Py_ssize_t)0);
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
        result = Py_BuildValue("(innnNNny#)", 0, chosen, (Py_ssize_t)more,
                               (Py_ssize_t)exhausted, ints, floats, m, (const char *)g_req,
                               chosen * (Py_ssize_t)sizeof(int64_t));
    }
done:
    free(own_mass);
    free(heap);
    free(count);
    free(cap);
    free(alloc);
    free(built);
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
    PyBuffer_Release(&cellsb);
    PyBuffer_Release(&aboveb);
    return result;
}

/* floor(lo, hi, w, ratios, counts, factors, noise, window, b, top, n_cells, lattice) -> bytes
 *
 * The learning controller's stepped decision floor (bastion.learned_curves
 * DecisionCurves._joint_deciding, rebuilt whenever the learned table or the size calibration
 * refreshes): per lattice cell i < n_cells, the decision's factor of its lattice point,
 * ratio * (1 + noise / sqrt(min(max(count, 1), window))) / factor, times the even-spread prior
 * at that point (at `top` where the point lies beyond it; +inf where it lies below B), then
 * the cheapest from each cell on. numpy's operations in numpy's order, so the n_cells doubles
 * are numpy's (np.minimum's NaN included). lo, hi, w: the even-spread prior at totals B ...
 * (at least top) as bastion.learned_prior.Lerp holds it, (1 - w) * lo + w * hi, formed at the
 * lattice points only; ratios, counts, factors: per lattice cell (at least n_cells); lattice:
 * the lattice points.
 */
PyObject *bf_floor(PyObject *self, PyObject *args) {
    Py_buffer lob, hib, ratiob, countb, factorb, latticeb;
    double w, noise;
    Py_ssize_t window, b, top, n;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*dy*y*y*dnnnny*", &lob, &hib, &w, &ratiob, &countb, &factorb,
                          &noise, &window, &b, &top, &n, &latticeb))
        return NULL;
    Py_ssize_t f8 = (Py_ssize_t)sizeof(double), i8 = (Py_ssize_t)sizeof(int64_t);
    if (n < 1 || b < 1 || window < 1 || top < b || lob.len / f8 < top - b + 1 ||
        hib.len / f8 < top - b + 1 || ratiob.len / f8 < n || countb.len / i8 < n ||
        factorb.len / f8 < n || latticeb.len / i8 < n) {
        PyErr_SetString(PyExc_ValueError, "floor: inconsistent sizes");
        goto done;
    }
    {
        const double *lo = (const double *)lob.buf, *hi = (const double *)hib.buf;
        const double *ratio = (const double *)ratiob.buf, lo_w = 1.0 - w;
        const double *factor = (const double *)factorb.buf;
        const int64_t *count = (const int64_t *)countb.buf, *point = (const int64_t *)latticeb.buf;
        PyObject *out = PyBytes_FromStringAndSize(NULL, n * f8);
        if (!out) goto done;
        double *best = (double *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t reach = point[i] < top ? point[i] : top;
            if (reach < b) {
                best[i] = INFINITY;
                continue;
            }
            int64_t seen = count[i] > 1 ? count[i] : 1;
            double pessimism = 1.0 + noise / sqrt((double)(seen < window ? seen : window));
            double unit = ratio[i] * pessimism / factor[i];
            /* the even-spread prior at reach: its anchors interpolated, as Lerp forms it */
            best[i] = (lo_w * lo[reach - b] + w * hi[reach - b]) * unit;
        }
        for (Py_ssize_t i = n - 2; i >= 0; i--) { /* np.minimum.accumulate, from the end */
            double a = best[i + 1], x = best[i];
            best[i] = a != a || x != x ? NAN : (x <= a ? x : a);
        }
        result = out;
    }
done:
    PyBuffer_Release(&lob);
    PyBuffer_Release(&hib);
    PyBuffer_Release(&ratiob);
    PyBuffer_Release(&countb);
    PyBuffer_Release(&factorb);
    PyBuffer_Release(&latticeb);
    return result;
}
