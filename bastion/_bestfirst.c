/*
 * Compiled best-first tree construction: the same lazy heap as bastion.bestfirst.best_first_heap
 * (pop a node, push its next sibling and its first child), node for node, in C.
 *
 * Key order (smallest first): (-score, depth, parent position, rank). Scores are computed as
 * parent score * marginal, in double precision, exactly as the Python reference does, so the
 * two produce identical trees. The module uses only the stable C API and the buffer protocol
 * (no numpy headers): inputs are C-contiguous float64 buffers, outputs are bytes objects that
 * Python wraps with numpy.frombuffer.
 *
 * build(probs, depth, k, budgets) -> (parents, depths, ranks, scores, offsets)
 *   probs:   B * depth * k doubles (request-major), rows sorted descending
 *   budgets: B int64 values, each >= 1
 *   outputs: concatenated per-request trees (int64, int64, int64, float64) and B + 1 int64
 *            offsets into them.
 *
 * forest(...), accept(...): the joint budget's merged chain and the simulator's acceptance walk
 *   over a batch of trees (see the comments above each).
 *
 * chunk(...) -> (status, n, chosen): one growth round of bastion.budget.choose_tree (see
 *   chunk_doc below): validate the priced curve, build T_budget, write its tree arrays and
 *   Â/Ĉ/Ŝ into caller-owned buffers, apply the stopping rule. Every floating-point operation
 *   is the one numpy performs in the reference path, in the same order, so the results are
 *   bit-identical; contraction into fused multiply-adds is therefore switched off.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

typedef struct {
    double score;
    int32_t depth;
    int32_t parent;
    int32_t rank;
} entry;

#if defined(__GNUC__) || defined(__clang__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#else
#define LIKELY(x) (x)
#endif

/* a precedes b in best-first order. Scores almost never tie, so the first test is predictable
   and the answer is a plain comparison the compiler can turn into a flag, not a branch. */
static inline int before(const entry *a, const entry *b) {
    if (LIKELY(a->score != b->score)) return a->score > b->score;
    if (a->depth != b->depth) return a->depth < b->depth;
    if (a->parent != b->parent) return a->parent < b->parent;
    return a->rank < b->rank;
}

static void push(entry *heap, Py_ssize_t *n, entry e) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (!before(&e, &heap[up])) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = e;
}

/* Put e at the root (replacing the top) and sift it down. */
static void replace_top(entry *heap, Py_ssize_t size, entry e) {
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size) c += before(&heap[c + 1], &heap[c]);
        if (!before(&heap[c], &e)) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = e;
}

/* One request's best-first tree, grown on from *n nodes (0: start with the root) to up to
   `budget`, the frontier kept in heap[0 .. *hn): a larger budget resumes where a smaller one
   stopped (best-first trees are nested), so growing in doublings builds every node once. The
   top of the heap is the next node; the (up to two) nodes it makes available replace it in one
   sift-down plus a push, instead of a pop and two pushes. Any correct heap pops the same
   sequence: keys are unique. */
static void grow_one(const double *p, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                     entry *heap, Py_ssize_t *hn_io, Py_ssize_t *n_io, int64_t *parents,
                     int64_t *depths, int64_t *ranks, double *scores) {
    Py_ssize_t n = *n_io, hn = *hn_io;
    if (n == 0) {
        n = 1;
        hn = 0;
        parents[0] = -1;
        depths[0] = 0;
        ranks[0] = -1;
        scores[0] = 1.0;
        if (depth > 0 && k > 0 && p[0] > 0.0) {
            entry e = {p[0], 1, 0, 0};
            push(heap, &hn, e);
        }
    }
    while (hn > 0 && n < budget) {
        entry e = heap[0];
        Py_ssize_t pos = n++;
        parents[pos] = e.parent;
        depths[pos] = e.depth;
        ranks[pos] = e.rank;
        scores[pos] = e.score;
        entry add[2];
        int m = 0;
        if (e.rank + 1 < k) { /* next sibling */
            double s = scores[e.parent] * p[(e.depth - 1) * k + e.rank + 1];
            if (s > 0.0) {
                entry sib = {s, e.depth, e.parent, e.rank + 1};
                add[m++] = sib;
            }
        }
        if (e.depth < depth) { /* first child */
            double s = e.score * p[e.depth * k];
            if (s > 0.0) {
                entry child = {s, e.depth + 1, (int32_t)pos, 0};
                add[m++] = child;
            }
        }
        if (m == 0) { /* plain pop */
            entry last = heap[--hn];
            if (hn > 0) replace_top(heap, hn, last);
        } else {
            /* the earlier of the two tends to stay near the top, the later near the bottom */
            int late = m == 2 && before(&add[0], &add[1]) ? 1 : 0;
            replace_top(heap, hn, add[m == 2 ? 1 - late : 0]);
            if (m == 2) push(heap, &hn, add[late]);
        }
    }
    *n_io = n;
    *hn_io = hn;
}

/* One request's best-first tree of up to `budget` nodes, built afresh; returns how many. */
static Py_ssize_t build_one(const double *p, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                            entry *heap, int64_t *parents, int64_t *depths, int64_t *ranks,
                            double *scores) {
    Py_ssize_t n = 0, hn = 0;
    grow_one(p, depth, k, budget, heap, &hn, &n, parents, depths, ranks, scores);
    return n;
}

/* Overflow-safe buffer checks: whether a buffer of len bytes holds exactly a*b*c elements of
   elem bytes, or at least n of them. Sizes come from Python and may be anything. */
static int holds_exactly(Py_ssize_t len, Py_ssize_t elem, Py_ssize_t a, Py_ssize_t b,
                         Py_ssize_t c) {
    if (a < 0 || b < 0 || c < 0) return 0;
    if (a == 0 || b == 0 || c == 0) return len == 0;
    Py_ssize_t max = PY_SSIZE_T_MAX / elem;
    if (a > max || b > max / a || c > max / a / b) return 0;
    return len == elem * a * b * c;
}

static int holds_at_least(Py_ssize_t len, Py_ssize_t elem, Py_ssize_t n) {
    return n >= 0 && n <= len / elem;
}

static PyObject *build(PyObject *self, PyObject *args) {
    Py_buffer probs, budgets;
    Py_ssize_t depth, k;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nny*", &probs, &depth, &k, &budgets)) return NULL;
    Py_ssize_t b = budgets.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *bud = (const int64_t *)budgets.buf;
    Py_ssize_t total = 0, max_budget = 1;
    if (budgets.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "budgets buffer is not a whole number of int64");
        goto done;
    }
    for (Py_ssize_t j = 0; j < b; j++) {
        if (bud[j] < 1 || bud[j] > INT32_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "every budget must be in 1 ... 2^30 - 1");
            goto done;
        }
        if (total > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) - bud[j]) {
            PyErr_NoMemory();
            goto done;
        }
        total += bud[j];
        if (bud[j] > max_budget) max_budget = bud[j];
    }
    if (!holds_exactly(probs.len, (Py_ssize_t)sizeof(double), b, depth, k)) {
        PyErr_SetString(PyExc_ValueError, "probs buffer does not match B * depth * k doubles");
        goto done;
    }
    {
        entry *heap = PyMem_Malloc(sizeof(entry) * (size_t)(2 * max_budget + 2));
        int64_t *parents = PyMem_Malloc(sizeof(int64_t) * (size_t)total);
        int64_t *dep = PyMem_Malloc(sizeof(int64_t) * (size_t)total);
        int64_t *ranks = PyMem_Malloc(sizeof(int64_t) * (size_t)total);
        double *scores = PyMem_Malloc(sizeof(double) * (size_t)total);
        int64_t *offsets = PyMem_Malloc(sizeof(int64_t) * (size_t)(b + 1));
        if (!heap || !parents || !dep || !ranks || !scores || !offsets) {
            PyErr_NoMemory();
        } else {
            Py_ssize_t at = 0;
            const double *p = (const double *)probs.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < b; j++) {
                offsets[j] = at;
                at += build_one(p + j * depth * k, depth, k, (Py_ssize_t)bud[j], heap,
                                parents + at, dep + at, ranks + at, scores + at);
            }
            offsets[b] = at;
            Py_END_ALLOW_THREADS
            result = Py_BuildValue(
                "(y#y#y#y#y#)", (char *)parents, (Py_ssize_t)(at * sizeof(int64_t)),
                (char *)dep, (Py_ssize_t)(at * sizeof(int64_t)), (char *)ranks,
                (Py_ssize_t)(at * sizeof(int64_t)), (char *)scores,
                (Py_ssize_t)(at * sizeof(double)), (char *)offsets,
                (Py_ssize_t)((b + 1) * sizeof(int64_t)));
        }
        PyMem_Free(heap);
        PyMem_Free(parents);
        PyMem_Free(dep);
        PyMem_Free(ranks);
        PyMem_Free(scores);
        PyMem_Free(offsets);
    }
done:
    PyBuffer_Release(&probs);
    PyBuffer_Release(&budgets);
    return result;
}

/* Rules of bastion.budget.choose_tree. */
#define RULE_FIRST_DECREASE 0
#define RULE_EXHAUSTIVE 1
#define RULE_BOUNDED 2

#define STATUS_BAD_CURVE (-1) /* the caller re-validates in Python to raise the named error */
#define STATUS_GROW 0
#define STATUS_STOP 1

static const char chunk_doc[] =
    "chunk(probs, token_ids, depth, k, budget, ahead, n_max, rule, root_token, verify, draft,\n"
    "      prep, dp, ar, base, a_ceiling, ints, floats) -> (status, n, chosen)\n\n"
    "One growth round of the controller. probs/token_ids: depth*k float64/int64 (C order);\n"
    "verify: >= ahead float64 (T_verify); dp = draft + prep as Python computed it; ints and\n"
    "floats: writable 4*budget int64/float64 buffers, filled as rows [parents, depths, ranks,\n"
    "tokens] and [scores, a_hat, c_hat, s_hat] for the n nodes built. status -1: the curve\n"
    "fails validation (nothing built); 0: grow; 1: stop with tree size `chosen`.";

static PyObject *chunk(PyObject *self, PyObject *args) {
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
        !holds_exactly(probs.len, (Py_ssize_t)sizeof(double), depth, k, 1) ||
        !holds_exactly(ids.len, (Py_ssize_t)sizeof(int64_t), depth, k, 1) ||
        !holds_at_least(verify.len, (Py_ssize_t)sizeof(double), ahead) ||
        !holds_at_least(ints.len, (Py_ssize_t)sizeof(int64_t), 4 * budget) ||
        !holds_at_least(floats.len, (Py_ssize_t)sizeof(double), 4 * budget)) {
        PyErr_SetString(PyExc_ValueError, "chunk: buffer sizes or arguments do not match");
        goto done;
    }
    {
        const double *v = (const double *)verify.buf;
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
        if (!ok) {
            result = Py_BuildValue("(inn)", STATUS_BAD_CURVE, (Py_ssize_t)0, (Py_ssize_t)0);
            goto done;
        }
        int64_t *parents = (int64_t *)ints.buf, *dep = parents + budget, *ranks = dep + budget,
                *tokens = ranks + budget;
        double *scores = (double *)floats.buf, *a_hat = scores + budget, *c_hat = a_hat + budget,
               *s_hat = c_hat + budget;
        const int64_t *tid = (const int64_t *)ids.buf;
        entry *heap = PyMem_Malloc(sizeof(entry) * (size_t)(2 * budget + 2));
        if (!heap) {
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t n = build_one((const double *)probs.buf, depth, k, budget, heap, parents, dep,
                                 ranks, scores);
        PyMem_Free(heap);
        /* tokens (tree_from_arrays), Â = cumsum(ρ), Ĉ, Ŝ = (A_o + Â)·L_AR / Ĉ */
        double a = 0.0;
        tokens[0] = (int64_t)root_token;
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

/* ---------------------------------------------------------------------------------------------
 * forest(probs, depth, k, caps, total[, token_ids])
 *     -> (parents, depths, ranks, scores, offsets, order, order_scores, more[, tokens])
 *
 * The B best-first trees of one serving step grown together: one heap over every request's
 * frontier, key (-score, request, depth, parent position, rank), so the nodes are added in the
 * merged order of bastion.joint (by score, ties by request index, each request's own best-first
 * order kept: within a request the key is build()'s). Request i takes at most caps[i] nodes
 * (its root included); `total` caps the nodes added beyond the B roots.
 *   outputs: the B trees concatenated request by request, each in its own best-first order,
 *            root first (as build() returns them), B + 1 offsets; order, order_scores: for the
 *            j-th added node, its request (int64) and its score; more: 1 if some request could
 *            still grow; tokens (given token_ids, B * depth * k int64): each node's token,
 *            the roots' -1.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    double score;
    double parent_score;
    int32_t request;
    int32_t depth;
    int32_t parent;
    int32_t rank;
} fentry;

static inline int fbefore(const fentry *a, const fentry *b) {
    if (LIKELY(a->score != b->score)) return a->score > b->score;
    if (a->request != b->request) return a->request < b->request;
    if (a->depth != b->depth) return a->depth < b->depth;
    if (a->parent != b->parent) return a->parent < b->parent;
    return a->rank < b->rank;
}

static void fpush(fentry *heap, Py_ssize_t *n, fentry e) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (!fbefore(&e, &heap[up])) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = e;
}

/* Put e at the root (replacing the top) and sift it down. */
static void freplace_top(fentry *heap, Py_ssize_t size, fentry e) {
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size) c += fbefore(&heap[c + 1], &heap[c]);
        if (!fbefore(&heap[c], &e)) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = e;
}

static void fpop(fentry *heap, Py_ssize_t *n) {
    fentry last = heap[--(*n)];
    if (*n > 0) freplace_top(heap, *n, last);
}

/* The growth loop of forest(): adds up to `total` nodes beyond the B roots in merged order,
   writing the j-th added node's request, position in its tree, parent position, depth, rank and
   score into g_*[j] and each request's node count (root included) into count. Returns the
   nodes added; *more says whether some request could still grow. heap holds B + total + 1. */
static Py_ssize_t forest_grow(const double *p, Py_ssize_t b, Py_ssize_t depth, Py_ssize_t k,
                              const int64_t *cap, Py_ssize_t total, fentry *heap, int64_t *count,
                              int64_t *g_req, int64_t *g_pos, int64_t *g_par, int64_t *g_dep,
                              int64_t *g_rnk, double *g_sco, int *more) {
    Py_ssize_t hn = 0, m = 0;
    for (Py_ssize_t r = 0; r < b; r++) {
        count[r] = 1;
        const double *pr = p + r * depth * k;
        if (depth > 0 && k > 0 && cap[r] > 1 && pr[0] > 0.0) {
            fentry e = {pr[0], 1.0, (int32_t)r, 1, 0, 0};
            fpush(heap, &hn, e);
        }
    }
    while (hn > 0 && m < total) {
        fentry e = heap[0];
        Py_ssize_t r = e.request;
        if (count[r] >= cap[r]) { /* this request is full: its frontier is dropped */
            fpop(heap, &hn);
            continue;
        }
        Py_ssize_t pos = count[r]++;
        g_req[m] = r;
        g_pos[m] = pos;
        g_par[m] = e.parent;
        g_dep[m] = e.depth;
        g_rnk[m] = e.rank;
        g_sco[m] = e.score;
        m++;
        const double *pr = p + r * depth * k;
        fentry add[2];
        int n_add = 0;
        if (e.rank + 1 < k) { /* next sibling */
            double s = e.parent_score * pr[(e.depth - 1) * k + e.rank + 1];
            if (s > 0.0) {
                fentry sib = {s, e.parent_score, e.request, e.depth, e.parent, e.rank + 1};
                add[n_add++] = sib;
            }
        }
        if (e.depth < depth) { /* first child */
            double s = e.score * pr[e.depth * k];
            if (s > 0.0) {
                fentry child = {s, e.score, e.request, e.depth + 1, (int32_t)pos, 0};
                add[n_add++] = child;
            }
        }
        if (n_add == 0) {
            fpop(heap, &hn);
        } else { /* the earlier successor replaces the top (a short sift), the later is pushed */
            int late = n_add == 2 && fbefore(&add[0], &add[1]) ? 1 : 0;
            freplace_top(heap, hn, add[n_add == 2 ? 1 - late : 0]);
            if (n_add == 2) fpush(heap, &hn, add[late]);
        }
    }
    int any = 0;
    for (Py_ssize_t i = 0; i < hn && !any; i++) any = count[heap[i].request] < cap[heap[i].request];
    *more = any;
    return m;
}

/* The forest's trees as the caller returns them: each request's root, then the first
   keep[r] - 1 nodes added for it (all of them where keep is forest_grow's count), at its
   position in its own best-first order; offsets from keep. tokens (may be NULL): the roots'
   -1 and each node's token from ids [B, depth, k]. */
static void forest_scatter(Py_ssize_t b, Py_ssize_t m, const int64_t *keep, const int64_t *g_req,
                           const int64_t *g_pos, const int64_t *g_par, const int64_t *g_dep,
                           const int64_t *g_rnk, const double *g_sco, const int64_t *ids,
                           Py_ssize_t depth, Py_ssize_t k, int64_t *off, int64_t *par,
                           int64_t *dep, int64_t *rnk, double *sco, int64_t *tok) {
    off[0] = 0;
    for (Py_ssize_t r = 0; r < b; r++) {
        off[r + 1] = off[r] + keep[r];
        par[off[r]] = -1;
        dep[off[r]] = 0;
        rnk[off[r]] = -1;
        sco[off[r]] = 1.0;
        if (tok) tok[off[r]] = -1;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t r = g_req[j], pos = g_pos[j];
        if (pos >= keep[r]) continue;
        Py_ssize_t at = off[r] + pos;
        par[at] = g_par[j];
        dep[at] = g_dep[j];
        rnk[at] = g_rnk[j];
        sco[at] = g_sco[j];
        if (tok) tok[at] = ids[(r * depth + g_dep[j] - 1) * k + g_rnk[j]];
    }
}

static PyObject *forest(PyObject *self, PyObject *args) {
    Py_buffer probs, caps, ids = {0};
    Py_ssize_t depth, k, total;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nny*n|y*", &probs, &depth, &k, &caps, &total, &ids))
        return NULL;
    Py_ssize_t b = caps.len / (Py_ssize_t)sizeof(int64_t);
    const double *p = (const double *)probs.buf;
    const int64_t *cap = (const int64_t *)caps.buf;
    fentry *heap = NULL;
    int64_t *count = NULL, *g_req = NULL, *g_pos = NULL, *g_par = NULL, *g_dep = NULL,
            *g_rnk = NULL;
    double *g_sco = NULL;
    PyObject *o_par = NULL, *o_dep = NULL, *o_rnk = NULL, *o_sco = NULL, *o_off = NULL,
             *o_ord = NULL, *o_osc = NULL, *o_tok = NULL;
    if (depth < 1 || k < 1 || total < 0 || b <= 0 || caps.len % (Py_ssize_t)sizeof(int64_t) ||
        depth > INT32_MAX || k > INT32_MAX || b > INT32_MAX ||
        b > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(double) / depth / k ||
        probs.len != b * depth * k * (Py_ssize_t)sizeof(double) ||
        (ids.buf && ids.len != b * depth * k * (Py_ssize_t)sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "forest: inconsistent sizes");
        goto done;
    }
    for (Py_ssize_t r = 0; r < b; r++) {
        if (cap[r] < 1) {
            PyErr_SetString(PyExc_ValueError, "forest: every cap must be >= 1");
            goto done;
        }
    }
    /* every added node pushes at most two entries and pops one: the heap never exceeds
       B + total + 1 entries */
    if (total > (PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(fentry)) - b - 1) {
        PyErr_NoMemory();
        goto done;
    }
    heap = (fentry *)malloc((size_t)(b + total + 1) * sizeof(fentry));
    count = (int64_t *)calloc((size_t)b, sizeof(int64_t));
    g_req = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_pos = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_par = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_dep = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_rnk = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_sco = (double *)malloc((size_t)(total + 1) * sizeof(double));
    if (!heap || !count || !g_req || !g_pos || !g_par || !g_dep || !g_rnk || !g_sco) {
        PyErr_NoMemory();
        goto done;
    }
    int more = 0;
    Py_ssize_t m = forest_grow(p, b, depth, k, cap, total, heap, count, g_req, g_pos, g_par, g_dep,
                               g_rnk, g_sco, &more);
    Py_ssize_t n = b + m;
    o_par = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    o_dep = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    o_rnk = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    o_sco = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
    o_off = PyBytes_FromStringAndSize(NULL, (b + 1) * (Py_ssize_t)sizeof(int64_t));
    o_ord = PyBytes_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(int64_t));
    o_osc = PyBytes_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(double));
    if (!o_par || !o_dep || !o_rnk || !o_sco || !o_off || !o_ord || !o_osc) goto done;
    if (ids.buf) {
        o_tok = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
        if (!o_tok) goto done;
    }
    {
        int64_t *par = (int64_t *)PyBytes_AS_STRING(o_par);
        int64_t *dep = (int64_t *)PyBytes_AS_STRING(o_dep);
        int64_t *rnk = (int64_t *)PyBytes_AS_STRING(o_rnk);
        double *sco = (double *)PyBytes_AS_STRING(o_sco);
        int64_t *off = (int64_t *)PyBytes_AS_STRING(o_off);
        int64_t *ord = (int64_t *)PyBytes_AS_STRING(o_ord);
        double *osc = (double *)PyBytes_AS_STRING(o_osc);
        forest_scatter(b, m, count, g_req, g_pos, g_par, g_dep, g_rnk, g_sco,
                       ids.buf ? (const int64_t *)ids.buf : NULL, depth, k, off, par, dep, rnk,
                       sco, o_tok ? (int64_t *)PyBytes_AS_STRING(o_tok) : NULL);
        for (Py_ssize_t j = 0; j < m; j++) {
            ord[j] = g_req[j];
            osc[j] = g_sco[j];
        }
    }
    if (o_tok)
        result = Py_BuildValue("(OOOOOOOiO)", o_par, o_dep, o_rnk, o_sco, o_off, o_ord, o_osc,
                               more, o_tok);
    else
        result = Py_BuildValue("(OOOOOOOi)", o_par, o_dep, o_rnk, o_sco, o_off, o_ord, o_osc,
                               more);
done:
    Py_XDECREF(o_tok);
    Py_XDECREF(o_par);
    Py_XDECREF(o_dep);
    Py_XDECREF(o_rnk);
    Py_XDECREF(o_sco);
    Py_XDECREF(o_off);
    Py_XDECREF(o_ord);
    Py_XDECREF(o_osc);
    free(heap);
    free(count);
    free(g_req);
    free(g_pos);
    free(g_par);
    free(g_dep);
    free(g_rnk);
    free(g_sco);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&caps);
    if (ids.buf) PyBuffer_Release(&ids);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * joint(probs, token_ids, depth, k, n_max, total, most, mass, cells, best_above, ar)
 *     -> (status, chosen, more, exhausted, parents, depths, ranks, scores, tokens, offsets,
 *         a_hat, c_hat, s_hat)
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
 * ------------------------------------------------------------------------------------------- */
static PyObject *joint(PyObject *self, PyObject *args) {
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
        k > INT32_MAX || b > INT32_MAX || !holds_exactly(probs.len, sizeof(double), b, depth, k) ||
        !holds_exactly(ids.len, sizeof(int64_t), b, depth, k) || ntot < 1 || ncell < 1 ||
        most > b * (n_max - 1) ||
        (massb.len != 0 && massb.len != b * (Py_ssize_t)sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "joint: inconsistent sizes");
        goto done;
    }
    for (Py_ssize_t j = 0; j < ntot; j++) {
        if (cells[j] < 0 || cells[j] >= ncell) {
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
                for (Py_ssize_t d = 0; d < depth; d++) {
                    double level = 0.0;
                    for (Py_ssize_t j = 0; j < k; j++) level += p[(r * depth + d) * k + j];
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
        count = calloc((size_t)b, sizeof(int64_t));
        cap = malloc((size_t)b * sizeof(int64_t));
        alloc = calloc((size_t)b, sizeof(int64_t));
        built = malloc((size_t)b * sizeof(double));
        if (!count || !cap || !alloc || !built) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t r = 0; r < b; r++) cap[r] = n_max;
        int status = 0, more = 0;
        Py_ssize_t m = 0, chosen = 0;
        for (;;) {
            if (total > ntot - 1) { /* beyond the priced totals: the Python loop prices more */
                status = -2;
                break;
            }
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
            m = forest_grow(p, b, depth, k, cap, total, heap, count, g_req, g_pos, g_par, g_dep,
                            g_rnk, g_sco, &more);
            int bad = !(isfinite(ar) && ar > 0.0);
            for (Py_ssize_t j = 0; j <= m; j++) {
                c_hat[j] = above[cells[j]];
                if (!(isfinite(c_hat[j]) && c_hat[j] > 0.0)) bad = 1;
            }
            if (bad) {
                status = -1;
                break;
            }
            a_hat[0] = (double)b;
            for (Py_ssize_t j = 0; j < m; j++) a_hat[j + 1] = a_hat[j] + g_sco[j];
            chosen = 0;
            for (Py_ssize_t j = 0; j <= m; j++) {
                s_hat[j] = a_hat[j] * ar / c_hat[j];
                if (s_hat[j] > s_hat[chosen]) chosen = j;
            }
            if (!more) break;
            Py_ssize_t growth = 2;
            int monotone = m > 0;
            for (Py_ssize_t j = 1; j <= m && monotone; j++) monotone = c_hat[j] >= c_hat[j - 1];
            if (monotone) {
                for (Py_ssize_t r = 0; r < b; r++) built[r] = 1.0;
                for (Py_ssize_t j = 0; j < m; j++) built[g_req[j]] += g_sco[j];
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
                    double rate = rho * (1.0 + 1e-12), ahead = 0.0;
                    double a_end = a_hat[m], c_end = c_hat[m];
                    Py_ssize_t last = ntot - 1, high = last < most ? last : most;
                    int nan_seen = 0;
                    for (Py_ssize_t j = last; j > m; j--) {
                        double f = above[cells[j]];
                        if (isnan(f)) nan_seen = 1;
                        double den = c_end > f ? c_end : f;
                        if (j <= high) {
                            double a_up = a_end + (double)(j - m) * rate;
                            if (a_up > a_far) a_up = a_far;
                            double r = a_up / den;
                            if (r > ahead) ahead = r;
                        }
                        if (j == last && most > last) {
                            double r = a_far / den;
                            if (r > ahead) ahead = r;
                        }
                    }
                    if (!nan_seen && ahead * ar <= s_hat[chosen]) break;
                }
                /* bastion.joint._growth (the curve's growth_s is 0: no second bound) */
                Py_ssize_t v = m;
                if (v >= 2) {
                    double slope = (c_hat[m] - c_hat[v / 2]) / (double)(v - v / 2);
                    if (slope <= 0.0) {
                        growth = 8;
                    } else {
                        double target = (double)v + (c_needed - c_hat[m]) / slope;
                        double g = ceil(target / (double)v);
                        growth = (Py_ssize_t)(g > 8.0 ? 8.0 : (g < 2.0 ? 2.0 : g));
                    }
                }
            }
            Py_ssize_t next = growth * total > total + b ? growth * total : total + b;
            total = next < most ? next : most;
        }
        if (status != 0) {
            result = Py_BuildValue("(innnOOOOOOOOO)", status, (Py_ssize_t)0, (Py_ssize_t)0,
                                   (Py_ssize_t)0, Py_None, Py_None, Py_None, Py_None, Py_None,
                                   Py_None, Py_None, Py_None, Py_None);
            goto done;
        }
        int exhausted = !more;
        for (Py_ssize_t r = 0; r < b; r++) {
            alloc[r] = 1;
            if (count[r] >= n_max) exhausted = 0;
        }
        for (Py_ssize_t j = 0; j < chosen; j++) alloc[g_req[j]]++;
        Py_ssize_t n = b + chosen, i8 = sizeof(int64_t), f8 = sizeof(double);
        PyObject *o[6] = {PyBytes_FromStringAndSize(NULL, n * i8),
                          PyBytes_FromStringAndSize(NULL, n * i8),
                          PyBytes_FromStringAndSize(NULL, n * i8),
                          PyBytes_FromStringAndSize(NULL, n * f8),
                          PyBytes_FromStringAndSize(NULL, n * i8),
                          PyBytes_FromStringAndSize(NULL, (b + 1) * i8)};
        if (!o[0] || !o[1] || !o[2] || !o[3] || !o[4] || !o[5]) {
            for (int i = 0; i < 6; i++) Py_XDECREF(o[i]);
            goto done;
        }
        int64_t *par = (int64_t *)PyBytes_AS_STRING(o[0]), *dep = (int64_t *)PyBytes_AS_STRING(o[1]);
        int64_t *rnk = (int64_t *)PyBytes_AS_STRING(o[2]), *tok = (int64_t *)PyBytes_AS_STRING(o[4]);
        double *sco = (double *)PyBytes_AS_STRING(o[3]);
        int64_t *off = (int64_t *)PyBytes_AS_STRING(o[5]);
        /* each request's first alloc - 1 added nodes */
        forest_scatter(b, m, alloc, g_req, g_pos, g_par, g_dep, g_rnk, g_sco, tid, depth, k, off,
                       par, dep, rnk, sco, tok);
        result = Py_BuildValue("(innnNNNNNNy#y#y#)", 0, chosen, (Py_ssize_t)more,
                               (Py_ssize_t)exhausted, o[0], o[1], o[2], o[3], o[4], o[5],
                               (char *)a_hat, (m + 1) * f8, (char *)c_hat, (m + 1) * f8,
                               (char *)s_hat, (m + 1) * f8);
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

/* accept(parents, tokens, depths, offsets, target, width)
 *     -> (counts, on_path, committed, nodes)
 *   One batch of trees (concatenated, parents local to each tree, parents before children)
 *   walked against the target's tokens: target[i * width + d - 1] is request i's token at
 *   depth d, and target[i * width + min(c, width - 1)] the token after c accepted ones (the
 *   bonus). A node is on its request's accepted path iff it matches and its parent is on it
 *   (the root always is). counts: accepted draft tokens per request (int64 [B]); on_path: one
 *   byte per node (roots 0); committed: each request's accepted tokens then its bonus token,
 *   request by request (int64); nodes: the accepted nodes' indices within their trees. */
static PyObject *accept(PyObject *self, PyObject *args) {
    Py_buffer par, tok, dep, off, tgt;
    Py_ssize_t width;
    PyObject *result = NULL, *o_cnt = NULL, *o_on = NULL, *o_com = NULL, *o_nod = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*n", &par, &tok, &dep, &off, &tgt, &width)) return NULL;
    Py_ssize_t n = par.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t b = off.len / (Py_ssize_t)sizeof(int64_t) - 1;
    const int64_t *parents = (const int64_t *)par.buf, *tokens = (const int64_t *)tok.buf;
    const int64_t *depths = (const int64_t *)dep.buf, *offsets = (const int64_t *)off.buf;
    const int64_t *target = (const int64_t *)tgt.buf;
    if (b < 1 || width < 1 || tok.len != par.len || dep.len != par.len ||
        b > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) / width ||
        tgt.len != b * width * (Py_ssize_t)sizeof(int64_t) || offsets[0] != 0 ||
        offsets[b] != n) {
        PyErr_SetString(PyExc_ValueError, "accept: inconsistent sizes");
        goto done;
    }
    o_cnt = PyBytes_FromStringAndSize(NULL, b * (Py_ssize_t)sizeof(int64_t));
    o_on = PyBytes_FromStringAndSize(NULL, n);
    if (!o_cnt || !o_on) goto done;
    Py_ssize_t accepted = 0;
    {
        int64_t *counts = (int64_t *)PyBytes_AS_STRING(o_cnt);
        char *on = PyBytes_AS_STRING(o_on);
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t a = offsets[i], e = offsets[i + 1];
            int64_t c = 0;
            if (a >= e || e > n || a < 0) {
                PyErr_SetString(PyExc_ValueError, "accept: offsets must increase");
                goto done;
            }
            on[a] = 1; /* the root, while walking; cleared below */
            for (Py_ssize_t j = a + 1; j < e; j++) {
                int64_t pj = parents[j], d = depths[j];
                int ok = pj >= 0 && pj < j - a && d >= 1 && d <= width && on[a + pj] &&
                         tokens[j] == target[i * width + d - 1];
                on[j] = (char)ok;
                c += ok;
            }
            on[a] = 0;
            counts[i] = c;
            accepted += c;
        }
        o_com = PyBytes_FromStringAndSize(NULL, (accepted + b) * (Py_ssize_t)sizeof(int64_t));
        o_nod = PyBytes_FromStringAndSize(NULL, accepted * (Py_ssize_t)sizeof(int64_t));
        if (!o_com || !o_nod) goto done;
        int64_t *committed = (int64_t *)PyBytes_AS_STRING(o_com);
        int64_t *nodes = (int64_t *)PyBytes_AS_STRING(o_nod);
        Py_ssize_t t = 0, v = 0;
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t a = offsets[i], e = offsets[i + 1];
            for (Py_ssize_t j = a + 1; j < e; j++) {
                if (on[j]) {
                    committed[t++] = tokens[j];
                    nodes[v++] = j - a;
                }
            }
            int64_t c = counts[i] < width - 1 ? counts[i] : width - 1;
            committed[t++] = target[i * width + c];
        }
    }
    result = Py_BuildValue("(OOOO)", o_cnt, o_on, o_com, o_nod);
done:
    Py_XDECREF(o_cnt);
    Py_XDECREF(o_on);
    Py_XDECREF(o_com);
    Py_XDECREF(o_nod);
    PyBuffer_Release(&par);
    PyBuffer_Release(&tok);
    PyBuffer_Release(&dep);
    PyBuffer_Release(&off);
    PyBuffer_Release(&tgt);
    return result;
}

/* learn(offsets, parents, depths, ranks, scores, accepted, counts, order, raw, k,
 *       pred, real, ranks_tracked, a_decay, da, dt, weight, s_decay, lattice) -> (run, deepest)
 *   One verified tree step of B requests folded into the learning controller's two
 *   calibrations, in place (bastion.observed: AcceptanceCalibration.observe and
 *   SizeCalibration.observe — the same operations in the same order, so the results are
 *   bit-identical). The trees are concatenated (offsets, parents local to each tree); accepted
 *   holds each request's accepted nodes (indices within its tree), counts[i] of them for
 *   request i.
 *   - acceptance: every node whose parent is on its request's accepted path (the root is) was
 *     exposed; pred/real (float64, tracked depths x ranks_tracked) are multiplied by a_decay
 *     and the exposed candidates' raw probabilities / hits added per (depth - 1, min(raw rank,
 *     ranks_tracked - 1)) cell, in node order; raw is the drafter's [B, D, k] rows, order
 *     ([B, D, k] int64, or empty: identity) maps a calibrated rank to its raw rank; depths
 *     beyond the tracked ones are skipped.
 *   - sizes: the batch's merged order of its non-root nodes (rho descending, then request,
 *     then the tree's own order; at B = 1 the tree's order) ranks them 1 … N - B; da/dt/weight
 *     (float64, one bucket's row over the lattice) are multiplied by s_decay, then for every
 *     lattice point M with B <= M <= N the increments of Â (B + the first M - B merged gains
 *     summed in order) and of the realised τ (B + accepted nodes ranked <= M - B) since the
 *     previous lattice point are added (the first against B), and weight by 1. */
typedef struct {
    double score;
    Py_ssize_t request, within, node;
} merged;

static int merged_before(const void *pa, const void *pb) {
    const merged *a = (const merged *)pa, *b = (const merged *)pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->request != b->request) return a->request < b->request ? -1 : 1;
    return (a->within > b->within) - (a->within < b->within);
}

static PyObject *learn(PyObject *self, PyObject *args) {
    Py_buffer off, par, dep, rnk, sco, acc, cnt, ord, raw, prd, rea, da, dt, wt, lat;
    Py_ssize_t k, ranks_tr;
    double a_decay, s_decay;
    PyObject *result = NULL;
    char *on = NULL, *on_rank = NULL;
    double *tmp = NULL, *gains = NULL;
    Py_ssize_t *rank = NULL, *path = NULL;
    merged *items = NULL;
    PyObject *o_run = NULL, *o_deep = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*nw*w*ndw*w*w*dy*", &off, &par, &dep, &rnk,
                          &sco, &acc, &cnt, &ord, &raw, &k, &prd, &rea, &ranks_tr, &a_decay, &da,
                          &dt, &wt, &s_decay, &lat))
        return NULL;
    Py_ssize_t b = off.len / (Py_ssize_t)sizeof(int64_t) - 1;
    Py_ssize_t n = par.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t na = acc.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t rows = k > 0 ? raw.len / (Py_ssize_t)sizeof(double) / k : 0; /* B x drafted depth */
    Py_ssize_t draw = b > 0 ? rows / b : 0;
    Py_ssize_t cells = prd.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t nl = lat.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *offsets = (const int64_t *)off.buf, *parents = (const int64_t *)par.buf;
    const int64_t *depths = (const int64_t *)dep.buf, *ranks = (const int64_t *)rnk.buf;
    const int64_t *accepted = (const int64_t *)acc.buf, *counts = (const int64_t *)cnt.buf;
    const int64_t *order = ord.len ? (const int64_t *)ord.buf : NULL;
    const int64_t *lattice = (const int64_t *)lat.buf;
    const double *scores = (const double *)sco.buf, *probs = (const double *)raw.buf;
    double *pred = (double *)prd.buf, *real = (double *)rea.buf;
    double *sda = (double *)da.buf, *sdt = (double *)dt.buf, *swt = (double *)wt.buf;
    if (b < 1 || n < b || k < 1 || ranks_tr < 1 || dep.len != par.len || rnk.len != par.len ||
        sco.len != n * (Py_ssize_t)sizeof(double) || cnt.len != b * (Py_ssize_t)sizeof(int64_t) ||
        rows % b != 0 || raw.len != rows * k * (Py_ssize_t)sizeof(double) ||
        (ord.len && ord.len != rows * k * (Py_ssize_t)sizeof(int64_t)) || rea.len != prd.len ||
        cells % ranks_tr != 0 || da.len != nl * (Py_ssize_t)sizeof(double) ||
        dt.len != da.len || wt.len != da.len || offsets[0] != 0 || offsets[b] != n) {
        PyErr_SetString(PyExc_ValueError, "learn: inconsistent sizes");
        goto done;
    }
    on = (char *)calloc((size_t)n, 1);
    tmp = (double *)calloc((size_t)(2 * cells + 1), sizeof(double));
    gains = (double *)malloc((size_t)(n + 1) * sizeof(double));
    rank = (Py_ssize_t *)malloc((size_t)n * sizeof(Py_ssize_t));
    path = (Py_ssize_t *)malloc((size_t)(na + 1) * sizeof(Py_ssize_t));
    if (!on || !tmp || !gains || !rank || !path) {
        PyErr_NoMemory();
        goto done;
    }
    {
        Py_ssize_t t = 0;
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t a = offsets[i], e = offsets[i + 1];
            if (a >= e || e > n || counts[i] < 0 || t + counts[i] > na) {
                PyErr_SetString(PyExc_ValueError, "learn: offsets or counts out of range");
                goto done;
            }
            on[a] = 1;
            for (int64_t c = 0; c < counts[i]; c++, t++) {
                if (accepted[t] < 1 || accepted[t] >= e - a) {
                    PyErr_SetString(PyExc_ValueError, "learn: accepted node out of range");
                    goto done;
                }
                on[a + accepted[t]] = 1;
            }
        }
        if (t != na) {
            PyErr_SetString(PyExc_ValueError, "learn: counts do not add up to the accepted nodes");
            goto done;
        }
    }
    /* acceptance: Σ p and Σ hit per cell over the exposed nodes, in node order (bincount) */
    Py_ssize_t tracked = cells / ranks_tr;
    for (Py_ssize_t i = 0; i < b; i++) {
        Py_ssize_t a = offsets[i], e = offsets[i + 1];
        for (Py_ssize_t j = a + 1; j < e; j++) {
            int64_t pj = parents[j], d = depths[j] - 1, r = ranks[j];
            if (pj < 0 || pj >= j - a || d < 0 || d >= draw || r < 0 || r >= k) {
                PyErr_SetString(PyExc_ValueError, "learn: not a tree of these marginals");
                goto done;
            }
            if (!on[a + pj]) continue;
            Py_ssize_t row = (i * draw + d) * k;
            if (order) r = order[row + r];
            double p = probs[row + r];
            if (d >= tracked) continue;
            Py_ssize_t c = (Py_ssize_t)d * ranks_tr + (r < ranks_tr - 1 ? r : ranks_tr - 1);
            tmp[c] += p;
            tmp[cells + c] += on[j] ? 1.0 : 0.0;
        }
    }
    for (Py_ssize_t c = 0; c < cells; c++) {
        pred[c] *= a_decay;
        real[c] *= a_decay;
    }
    for (Py_ssize_t c = 0; c < cells; c++) {
        pred[c] += tmp[c];
        real[c] += tmp[cells + c];
    }
    /* the chain's shadow: each request's leading rank-0 run and its tree's depth */
    o_run = PyBytes_FromStringAndSize(NULL, b * (Py_ssize_t)sizeof(int64_t));
    o_deep = PyBytes_FromStringAndSize(NULL, b * (Py_ssize_t)sizeof(int64_t));
    if (!o_run || !o_deep) goto done;
    {
        int64_t *run = (int64_t *)PyBytes_AS_STRING(o_run);
        int64_t *deep = (int64_t *)PyBytes_AS_STRING(o_deep);
        Py_ssize_t t = 0;
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t a = offsets[i];
            int64_t lead = 0, most = 0;
            int open = 1;
            for (int64_t c = 0; c < counts[i]; c++, t++) {
                open = open && ranks[a + accepted[t]] == 0;
                lead += open;
            }
            for (Py_ssize_t j = a; j < offsets[i + 1]; j++)
                if (depths[j] > most) most = depths[j];
            run[i] = lead;
            deep[i] = most;
        }
    }
    if (nl == 0) goto shadow;
    /* sizes: the merged order's gains and each accepted node's rank in it */
    Py_ssize_t m_all = n - b;
    if (b == 1) {
        for (Py_ssize_t j = 1; j < n; j++) {
            gains[j - 1] = scores[j];
            rank[j] = j;
        }
    } else {
        items = (merged *)malloc((size_t)(m_all + 1) * sizeof(merged));
        if (!items) {
            PyErr_NoMemory();
            goto done;
        }
        int ordered = 1; /* each tree's non-root scores non-increasing (best-first order) */
        for (Py_ssize_t i = 0; i < b && ordered; i++)
            for (Py_ssize_t j = offsets[i] + 2; j < offsets[i + 1]; j++)
                if (!(scores[j] <= scores[j - 1])) ordered = 0;
        if (ordered) { /* then merging the B runs gives the sort's order, in O(N log B) */
            merged *heads = (merged *)malloc((size_t)b * sizeof(merged));
            if (!heads) {
                PyErr_NoMemory();
                goto done;
            }
            Py_ssize_t h = 0;
            for (Py_ssize_t i = 0; i < b; i++) {
                if (offsets[i] + 1 >= offsets[i + 1]) continue;
                merged e = {scores[offsets[i] + 1], i, 1, offsets[i] + 1};
                Py_ssize_t at = h++; /* sift up */
                while (at > 0 && merged_before(&e, &heads[(at - 1) / 2]) < 0) {
                    heads[at] = heads[(at - 1) / 2];
                    at = (at - 1) / 2;
                }
                heads[at] = e;
            }
            for (Py_ssize_t t = 0; t < m_all; t++) {
                merged top = heads[0];
                items[t] = top;
                merged e;
                if (top.node + 1 < offsets[top.request + 1]) {
                    e = (merged){scores[top.node + 1], top.request, top.within + 1, top.node + 1};
                } else {
                    e = heads[--h];
                }
                Py_ssize_t at = 0; /* sift down */
                for (;;) {
                    Py_ssize_t c = 2 * at + 1;
                    if (c >= h) break;
                    if (c + 1 < h && merged_before(&heads[c + 1], &heads[c]) < 0) c++;
                    if (merged_before(&heads[c], &e) >= 0) break;
                    heads[at] = heads[c];
                    at = c;
                }
                if (h > 0) heads[at] = e;
            }
            free(heads);
        } else {
            Py_ssize_t t = 0;
            for (Py_ssize_t i = 0; i < b; i++)
                for (Py_ssize_t j = offsets[i] + 1; j < offsets[i + 1]; j++)
                    items[t++] = (merged){scores[j], i, j - offsets[i], j};
            qsort(items, (size_t)m_all, sizeof(merged), merged_before);
        }
        for (Py_ssize_t t2 = 0; t2 < m_all; t2++) {
            gains[t2] = items[t2].score;
            rank[items[t2].node] = t2 + 1;
        }
    }
    Py_ssize_t np_ = 0;
    for (Py_ssize_t i = 0; i < b; i++)
        for (Py_ssize_t j = offsets[i] + 1; j < offsets[i + 1]; j++)
            if (on[j]) path[np_++] = rank[j];
    for (Py_ssize_t c = 0; c < nl; c++) {
        sda[c] *= s_decay;
        sdt[c] *= s_decay;
        swt[c] *= s_decay;
    }
    {
        double sum = 0.0, prev_a = (double)b, prev_t = (double)b;
        Py_ssize_t summed = 0, ranked = 0, hits = 0;
        /* accepted nodes per merged rank 1 … N - B (each rank holds one node) */
        on_rank = (char *)calloc((size_t)(m_all + 1), 1);
        if (!on_rank) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t q = 0; q < np_; q++) on_rank[path[q]] = 1;
        for (Py_ssize_t c = 0; c < nl && lattice[c] <= n; c++) {
            if (lattice[c] < b) continue;
            Py_ssize_t m = (Py_ssize_t)lattice[c] - b;
            while (summed < m) sum += gains[summed++];
            double at = (double)b + sum;
            while (ranked < m) hits += on_rank[++ranked];
            double tau = (double)(b + hits);
            sda[c] += at - prev_a;
            sdt[c] += tau - prev_t;
            swt[c] += 1.0;
            prev_a = at;
            prev_t = tau;
        }
    }
shadow:
    result = PyTuple_Pack(2, o_run, o_deep);
done:
    Py_XDECREF(o_run);
    Py_XDECREF(o_deep);
    free(on);
    free(on_rank);
    free(tmp);
    free(gains);
    free(rank);
    free(path);
    free(items);
    PyBuffer_Release(&off);
    PyBuffer_Release(&par);
    PyBuffer_Release(&dep);
    PyBuffer_Release(&rnk);
    PyBuffer_Release(&sco);
    PyBuffer_Release(&acc);
    PyBuffer_Release(&cnt);
    PyBuffer_Release(&ord);
    PyBuffer_Release(&raw);
    PyBuffer_Release(&prd);
    PyBuffer_Release(&rea);
    PyBuffer_Release(&da);
    PyBuffer_Release(&dt);
    PyBuffer_Release(&wt);
    PyBuffer_Release(&lat);
    return result;
}

/* calibrate(probs, ids, g, rows, k) -> (q, ids_sorted, order) or (q, None, None)
 *   The learning controller's calibrated marginals (bastion.observed.AcceptanceCalibration):
 *   q = min(p * g, 1) for every candidate of every row (rows = B * D request-major rows of k,
 *   g one [D, k] factor matrix shared by the requests), each row then sorted descending with
 *   ties in their original order (numpy's stable argsort of -q). When every row is still
 *   sorted, only q comes back (the order is the identity and the ids are unchanged). */
static PyObject *calibrate(PyObject *self, PyObject *args) {
    Py_buffer pb, ib, gb;
    Py_ssize_t rows, k;
    PyObject *result = NULL, *o_q = NULL, *o_ids = NULL, *o_ord = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*nn", &pb, &ib, &gb, &rows, &k)) return NULL;
    Py_ssize_t cells = pb.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t gcells = gb.len / (Py_ssize_t)sizeof(double);
    if (rows < 1 || k < 1 || rows > PY_SSIZE_T_MAX / k || cells != rows * k ||
        ib.len != cells * (Py_ssize_t)sizeof(int64_t) || gcells < k || gcells % k != 0 ||
        rows % (gcells / k) != 0) {
        PyErr_SetString(PyExc_ValueError, "calibrate: inconsistent sizes");
        goto done;
    }
    {
        const double *p = (const double *)pb.buf, *g = (const double *)gb.buf;
        const int64_t *ids = (const int64_t *)ib.buf;
        Py_ssize_t grows = gcells / k; /* the factor matrix repeats every D rows */
        o_q = PyBytes_FromStringAndSize(NULL, cells * (Py_ssize_t)sizeof(double));
        if (!o_q) goto done;
        double *q = (double *)PyBytes_AS_STRING(o_q);
        int sorted = 1;
        for (Py_ssize_t r = 0, gr = 0; r < rows; r++) { /* no division in the inner loop */
            const double *pr = p + r * k, *g_row = g + gr * k;
            double *qr = q + r * k;
            for (Py_ssize_t j = 0; j < k; j++) {
                double v = pr[j] * g_row[j];
                qr[j] = v < 1.0 ? v : 1.0;
                if (j && qr[j - 1] < qr[j]) sorted = 0;
            }
            if (++gr == grows) gr = 0;
        }
        if (sorted) {
            result = Py_BuildValue("(OOO)", o_q, Py_None, Py_None);
            goto done;
        }
        o_ids = PyBytes_FromStringAndSize(NULL, cells * (Py_ssize_t)sizeof(int64_t));
        o_ord = PyBytes_FromStringAndSize(NULL, cells * (Py_ssize_t)sizeof(int64_t));
        if (!o_ids || !o_ord) goto done;
        int64_t *out_ids = (int64_t *)PyBytes_AS_STRING(o_ids);
        int64_t *order = (int64_t *)PyBytes_AS_STRING(o_ord);
        for (Py_ssize_t r = 0; r < rows; r++) {
            double *qr = q + r * k;
            int64_t *o = order + r * k;
            for (Py_ssize_t j = 0; j < k; j++) { /* insertion sort: stable, descending */
                double v = qr[j];
                Py_ssize_t i = j;
                while (i > 0 && qr[i - 1] < v) {
                    qr[i] = qr[i - 1];
                    o[i] = o[i - 1];
                    i--;
                }
                qr[i] = v;
                o[i] = j;
            }
            for (Py_ssize_t j = 0; j < k; j++) out_ids[r * k + j] = ids[r * k + o[j]];
        }
        result = Py_BuildValue("(OOO)", o_q, o_ids, o_ord);
    }
done:
    Py_XDECREF(o_q);
    Py_XDECREF(o_ids);
    Py_XDECREF(o_ord);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&gb);
    return result;
}

static const char choose_doc[] =
    "choose(probs, token_ids, depth, k, start, sizes, gain, cycles, ar_s)\n"
    "    -> (parents, depths, ranks, scores, tokens, best, built, cap, expected, s_hat, chain)\n\n"
    "The batch-1 size choice of bastion.controller.choose_size in one call. probs/token_ids:\n"
    "depth*k float64/int64 (C order, rows sorted descending); sizes: the m candidate sizes\n"
    "(int64, ascending, sizes[0] == 1); gain, cycles: m float64 (gain ratio and learned cycle\n"
    "per candidate); ar_s: the AR cycle. Grows the best-first tree from min(start, sizes[m-1])\n"
    "nodes, doubling while the best candidate lies in the upper half of what was built, exactly\n"
    "as the Python loop does (same floating-point operations in the same order). Returns the\n"
    "tree arrays of every node built (bytes: int64 x3, float64, int64 tokens, root token -1),\n"
    "the best candidate's index, how many candidates were built, the candidates that exist\n"
    "(fewer than m when the lattice ran out of nodes with rho > 0) and Â-credited expectation\n"
    "and Ŝ of the built candidates (bytes, float64), and the chain's Â less its root cut at\n"
    "every depth, cumsum(cumprod(probs[:, 0])) (bytes, depth float64).";

static PyObject *choose(PyObject *self, PyObject *args) {
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
    if (!holds_exactly(probs.len, (Py_ssize_t)sizeof(double), 1, depth, k) ||
        !holds_exactly(ids.len, (Py_ssize_t)sizeof(int64_t), 1, depth, k)) {
        PyErr_SetString(PyExc_ValueError, "probs/token_ids do not hold depth * k values");
        goto done;
    }
    if (m < 1 || sizes.len % (Py_ssize_t)sizeof(int64_t) ||
        !holds_exactly(gain.len, (Py_ssize_t)sizeof(double), m, 1, 1) ||
        !holds_exactly(cycles.len, (Py_ssize_t)sizeof(double), m, 1, 1)) {
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
            grow_one(p, depth, k, budget, heap, &hn, &n, parents, dep, ranks, scores);
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
        result = Py_BuildValue("(y#y#y#y#y#nnny#y#y#)", (char *)parents, n * i8, (char *)dep,
                               n * i8, (char *)ranks, n * i8, (char *)scores, n * f8,
                               (char *)tokens, n * i8, best, kb, mc, (char *)expected, kb * f8,
                               (char *)s_hat, kb * f8, (char *)chain, depth * f8);
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

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "Best-first trees for B requests (see module comment)."},
    {"choose", choose, METH_VARARGS, choose_doc},
    {"chunk", chunk, METH_VARARGS, chunk_doc},
    {"forest", forest, METH_VARARGS, "B best-first trees grown together in merged order."},
    {"joint", joint, METH_VARARGS, "The learning controller's joint budget (see above)."},
    {"accept", accept, METH_VARARGS, "Accepted paths of a batch of trees against targets."},
    {"calibrate", calibrate, METH_VARARGS, "Calibrated marginals, rows re-sorted (see above)."},
    {"learn", learn, METH_VARARGS, "A tree step folded into both calibrations, in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bestfirst", "Compiled best-first tree construction.", -1, methods,
};

PyMODINIT_FUNC PyInit__bestfirst(void) { return PyModule_Create(&module); }
