/*
 * The controller's size choice in one call: chunk(), one growth round of
 * bastion.budget.choose_tree, and choose(), the batch-1 size choice of
 * bastion.controller.choose_size (see each one's doc string).
 */
#include "_bestfirst.h"

#include <string.h>

/* Rules of bastion.budget.choose_tree. */
#define RULE_FIRST_DECREASE 0
#define RULE_EXHAUSTIVE 1
#define RULE_BOUNDED 2

#define STATUS_BAD_CURVE (-1) /* the caller re-validates in Python to raise the named error */
#define STATUS_GROW 0
#define STATUS_STOP 1

const char bf_chunk_doc[] =
    "chunk(probs, token_ids, depth, k, budget, ahead, n_max, rule, root_token, verify, draft,\n"
    "      prep, dp, ar, base, a_ceiling, ints, floats) -> (status, n, chosen)\n\n"
    "One growth round of the controller. probs/token_ids: depth*k float64/int64 (C order);\n"
    "verify: >= ahead float64 (T_verify); dp = draft + prep as Python computed it; ints and\n"
    "floats: writable 4*budget int64/float64 buffers, filled as rows [parents, depths, ranks,\n"
    "tokens] and [scores, a_hat, c_hat, s_hat] for the n nodes built. status -1: the curve\n"
    "fails validation (nothing built); 0: grow; 1: stop with tree size `chosen`.";

/* One growth round of choose_tree on the priced curve v (see bf_chunk_doc): validates the
   curve, builds T_budget into ints/floats, applies the stopping rule. Returns the status,
   the nodes built and the size chosen; heap holds 2 * budget + 2 entries. */
int bf_size_round(const double *p, const int64_t *tid, Py_ssize_t depth, Py_ssize_t k,
                  Py_ssize_t budget, Py_ssize_t ahead, Py_ssize_t n_max, int rule,
                  int64_t root_token, const double *v, double draft, double prep, double dp,
                  double ar, double base, double a_ceiling, int64_t *ints, double *floats,
                  entry *heap, Py_ssize_t *n_out, Py_ssize_t *chosen_out) {
    /* validate_cost_curve: scalars finite (ar > 0, the others >= 0), every Ĉ(N) = dp + v
       for N <= ahead finite and > 0; and whether Ĉ is non-decreasing on that range */
    int ok = isfinite(draft) && draft >= 0 && isfinite(prep) && prep >= 0 && isfinite(ar) &&
             ar > 0;
    int monotone = 1;
    for (Py_ssize_t i = 0; ok && i < ahead; i++) {
        double c = dp + v[i];
        ok = isfinite(c) && c > 0.0;
        if (i > 0 && !(c - (dp + v[i - 1]) >= 0.0)) monotone = 0;
    }
    *n_out = *chosen_out = 0;
    if (!ok) return STATUS_BAD_CURVE;
    int64_t *parents = ints, *dep = parents + budget, *ranks = dep + budget,
            *tokens = ranks + budget;
    double *scores = floats, *a_hat = scores + budget, *c_hat = a_hat + budget,
           *s_hat = c_hat + budget;
    Py_ssize_t n = bf_build_one(p, depth, k, budget, heap, parents, dep, ranks, scores);
    /* tokens (tree_from_arrays), Â = cumsum(ρ), Ĉ, Ŝ = (A_o + Â)·L_AR / Ĉ */
    double a = 0.0;
    tokens[0] = root_token;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0) tokens[i] = tid[(dep[i] - 1) * k + ranks[i]];
        a = i > 0 ? a + scores[i] : scores[0];
        a_hat[i] = a;
        c_hat[i] = dp + v[i];
        s_hat[i] = (base + a) * ar / c_hat[i];
    }
    int done_growing = n < budget || budget >= n_max;
    int status = STATUS_GROW;
    Py_ssize_t chosen = n;
    if (rule == RULE_FIRST_DECREASE) {
        Py_ssize_t stop = 0;
        for (Py_ssize_t i = 0; i + 1 < n; i++)
            if (s_hat[i + 1] < s_hat[i]) {
                stop = i + 1;
                break;
            }
        if (stop || done_growing) {
            status = STATUS_STOP;
            chosen = stop ? stop : n;
        }
    } else {
        Py_ssize_t best = 0; /* argmax: the first maximum */
        for (Py_ssize_t i = 1; i < n; i++)
            if (s_hat[i] > s_hat[best]) best = i;
        chosen = best + 1;
        if (done_growing) {
            status = STATUS_STOP;
        } else if (monotone) {
            /* the bound of choose_tree: Â(N') ≤ min(Â(n) + (N' − n)·ρ_n, depth + 1) */
            double rho = scores[n - 1], a_n = a_hat[n - 1], bound = 0.0;
            for (Py_ssize_t j = n + 1; j <= ahead; j++) {
                double an = a_n + (double)(j - n) * rho;
                if (an > a_ceiling) an = a_ceiling;
                double q = (base + an) / (dp + v[j - 1]);
                if (q > bound) bound = q;
            }
            double a_far = a_n + (double)(n_max - n) * rho;
            if (a_ceiling < a_far) a_far = a_ceiling;
            double far = (base + a_far) / (dp + v[ahead - 1]);
            if (far > bound) bound = far;
            if (bound * ar <= s_hat[best]) status = STATUS_STOP;
        }
    }
    *n_out = n;
    *chosen_out = chosen;
    return status;
}

PyObject *bf_chunk(PyObject *self, PyObject *args) {
    Py_buffer probs, ids, verify, ints, floats;
    Py_ssize_t depth, k, budget, ahead, n_max;
    int rule;
    long long root_token;
    double draft, prep, dp, ar, base, a_ceiling;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nnnnniLy*ddddddw*w*", &probs, &ids, &depth, &k, &budget,
                          &ahead, &n_max, &rule, &root_token, &verify, &draft, &prep, &dp, &ar,
                          &base, &a_ceiling, &ints, &floats))
        return NULL;
    if (depth < 1 || k < 1 || budget < 1 || budget > INT32_MAX / 2 || ahead < budget ||
        n_max < ahead || rule < RULE_FIRST_DECREASE || rule > RULE_BOUNDED ||
        !bf_holds_exactly(probs.len, (Py_ssize_t)sizeof(double), depth, k, 1) ||
        !bf_holds_exactly(ids.len, (Py_ssize_t)sizeof(int64_t), depth, k, 1) ||
        !bf_holds_at_least(verify.len, (Py_ssize_t)sizeof(double), ahead) ||
        !bf_holds_at_least(ints.len, (Py_ssize_t)sizeof(int64_t), 4 * budget) ||
        !bf_holds_at_least(floats.len, (Py_ssize_t)sizeof(double), 4 * budget)) {
        PyErr_SetString(PyExc_ValueError, "chunk: buffer sizes or arguments do not match");
        goto done;
    }
    {
        entry *heap = PyMem_Malloc(sizeof(entry) * (size_t)(2 * budget + 2));
        if (!heap) {
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t n = 0, chosen = 0;
        int status = bf_size_round(
            (const double *)probs.buf, (const int64_t *)ids.buf, depth, k, budget, ahead, n_max,
            rule, (int64_t)root_token, (const double *)verify.buf, draft, prep, dp, ar, base,
            a_ceiling, (int64_t *)ints.buf, (double *)floats.buf, heap, &n, &chosen);
        PyMem_Free(heap);
        result = Py_BuildValue("(inn)", status, n, chosen);
    }
done:
    PyBuffer_Release(&probs);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&verify);
    PyBuffer_Release(&ints);
    PyBuffer_Release(&floats);
    return result;
}

const char bf_choose_doc[] =
    "choose(probs, token_ids, depth, k, start, sizes, gain, cycles, ar_s)\n"
    "    -> (ints, floats, best, built, cap)\n\n"
    "The batch-1 size choice of bastion.controller.choose_size in one call. probs/token_ids:\n"
    "depth*k float64/int64 (C order, rows sorted descending); sizes: the m candidate sizes\n"
    "(int64, ascending, sizes[0] == 1); gain, cycles: m float64 (gain ratio and learned cycle\n"
    "per candidate); ar_s: the AR cycle. Grows the best-first tree from min(start, sizes[m-1])\n"
    "nodes, doubling while the best candidate lies in the upper half of what was built, exactly\n"
    "as the Python loop does (same floating-point operations in the same order). Returns, for\n"
    "the n nodes built: ints (bytes, int64) = parents, depths, ranks, tokens (root token -1),\n"
    "n each, then the chosen tree's offsets [0, sizes[best]]; floats (bytes, float64) =\n"
    "scores (n), the Â-credited expectation and Ŝ of the built candidates (built each) and the\n"
    "chain's Â less its root cut at every depth, cumsum(cumprod(probs[:, 0])) (depth); the best\n"
    "candidate's index, how many candidates were built and the candidates that exist (fewer\n"
    "than m when the lattice ran out of nodes with rho > 0).";

PyObject *bf_choose(PyObject *self, PyObject *args) {
    Py_buffer probs, ids, sizes, gain, cycles;
    Py_ssize_t depth, k, start;
    double ar_s;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*nnny*y*y*d", &probs, &ids, &depth, &k, &start, &sizes,
                          &gain, &cycles, &ar_s))
        return NULL;
    Py_ssize_t m = sizes.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *sz = (const int64_t *)sizes.buf;
    entry *heap = NULL;
    int64_t *parents = NULL, *dep = NULL, *ranks = NULL, *tokens = NULL;
    double *scores = NULL, *expected = NULL, *s_hat = NULL, *chain = NULL;
    if (!bf_holds_exactly(probs.len, (Py_ssize_t)sizeof(double), 1, depth, k) ||
        !bf_holds_exactly(ids.len, (Py_ssize_t)sizeof(int64_t), 1, depth, k)) {
        PyErr_SetString(PyExc_ValueError, "probs/token_ids do not hold depth * k values");
        goto done;
    }
    if (m < 1 || sizes.len % (Py_ssize_t)sizeof(int64_t) ||
        !bf_holds_exactly(gain.len, (Py_ssize_t)sizeof(double), m, 1, 1) ||
        !bf_holds_exactly(cycles.len, (Py_ssize_t)sizeof(double), m, 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "sizes, gain and cycles must hold m >= 1 values each");
        goto done;
    }
    if (sz[0] != 1 || sz[m - 1] > INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "sizes must start at 1 and stay below 2^30");
        goto done;
    }
    for (Py_ssize_t j = 1; j < m; j++) {
        if (sz[j] <= sz[j - 1]) {
            PyErr_SetString(PyExc_ValueError, "sizes must be strictly ascending");
            goto done;
        }
    }
    {
        Py_ssize_t cap = (Py_ssize_t)sz[m - 1], mc = m;
        Py_ssize_t budget = start < 1 ? 1 : start;
        if (budget > cap) budget = cap;
        size_t most = (size_t)cap;
        heap = PyMem_Malloc(sizeof(entry) * (2 * most + 2));
        parents = PyMem_Malloc(sizeof(int64_t) * most);
        dep = PyMem_Malloc(sizeof(int64_t) * most);
        ranks = PyMem_Malloc(sizeof(int64_t) * most);
        tokens = PyMem_Malloc(sizeof(int64_t) * most);
        scores = PyMem_Malloc(sizeof(double) * most);
        expected = PyMem_Malloc(sizeof(double) * (size_t)m);
        s_hat = PyMem_Malloc(sizeof(double) * (size_t)m);
        if (!heap || !parents || !dep || !ranks || !tokens || !scores || !expected || !s_hat) {
            PyErr_NoMemory();
            goto done;
        }
        const double *p = (const double *)probs.buf;
        const double *h = (const double *)gain.buf, *cyc = (const double *)cycles.buf;
        Py_ssize_t n = 0, hn = 0, kb = 0, best = 0;
        for (;;) {
            bf_grow_one(p, depth, k, budget, heap, &hn, &n, parents, dep, ranks, scores);
            kb = 0; /* candidates built: sizes <= n */
            while (kb < mc && sz[kb] <= n) kb++;
            if (n < budget) { /* every node with rho > 0 is built: no larger size exists */
                mc = kb;
                cap = (Py_ssize_t)sz[kb - 1];
            }
            /* a_hat = cumsum(scores); expected = 1 + cumsum(h * diff(a_hat[sizes - 1], 1)) */
            double a = 0.0, prev = 1.0, acc = 0.0;
            Py_ssize_t at = 0;
            best = 0;
            int nan_seen = 0;
            for (Py_ssize_t j = 0; j < kb; j++) {
                while (at < (Py_ssize_t)sz[j]) a += scores[at++];
                acc += h[j] * (a - prev);
                prev = a;
                expected[j] = 1.0 + acc;
                s_hat[j] = expected[j] * ar_s / cyc[j];
                if (!nan_seen && (isnan(s_hat[j]) || s_hat[j] > s_hat[best])) best = j;
                if (isnan(s_hat[j]) && !nan_seen) nan_seen = 1;
            }
            if (n < budget || budget >= cap || 2 * sz[best] <= n) break;
            budget = 2 * budget < cap ? 2 * budget : cap;
        }
        tokens[0] = -1;
        const int64_t *tid = (const int64_t *)ids.buf;
        for (Py_ssize_t i = 1; i < n; i++) tokens[i] = tid[(dep[i] - 1) * k + ranks[i]];
        /* the chain's Â less its root, cut at every depth: numpy's cumsum(cumprod(top-1)) */
        chain = PyMem_Malloc(sizeof(double) * (size_t)(depth > 0 ? depth : 1));
        if (!chain) {
            PyErr_NoMemory();
            goto done;
        }
        double prod = 1.0, cum = 0.0;
        for (Py_ssize_t d = 0; d < depth; d++) {
            prod = d ? prod * p[d * k] : p[0];
            cum = d ? cum + prod : prod;
            chain[d] = cum;
        }
        Py_ssize_t i8 = (Py_ssize_t)sizeof(int64_t), f8 = (Py_ssize_t)sizeof(double);
        PyObject *o_int = PyBytes_FromStringAndSize(NULL, (4 * n + 2) * i8);
        PyObject *o_flt = PyBytes_FromStringAndSize(NULL, (n + 2 * kb + depth) * f8);
        if (!o_int || !o_flt) {
            Py_XDECREF(o_int);
            Py_XDECREF(o_flt);
            goto done;
        }
        int64_t *ib = (int64_t *)PyBytes_AS_STRING(o_int);
        double *fb = (double *)PyBytes_AS_STRING(o_flt);
        memcpy(ib, parents, (size_t)(n * i8));
        memcpy(ib + n, dep, (size_t)(n * i8));
        memcpy(ib + 2 * n, ranks, (size_t)(n * i8));
        memcpy(ib + 3 * n, tokens, (size_t)(n * i8));
        ib[4 * n] = 0;
        ib[4 * n + 1] = sz[best];
        memcpy(fb, scores, (size_t)(n * f8));
        memcpy(fb + n, expected, (size_t)(kb * f8));
        memcpy(fb + n + kb, s_hat, (size_t)(kb * f8));
        memcpy(fb + n + 2 * kb, chain, (size_t)(depth * f8));
        result = Py_BuildValue("(NNnnn)", o_int, o_flt, best, kb, mc);
    }
done:
    PyMem_Free(heap);
    PyMem_Free(parents);
    PyMem_Free(dep);
    PyMem_Free(ranks);
    PyMem_Free(tokens);
    PyMem_Free(scores);
    PyMem_Free(expected);
    PyMem_Free(s_hat);
    PyMem_Free(chain);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&gain);
    PyBuffer_Release(&cycles);
    return result;
}
