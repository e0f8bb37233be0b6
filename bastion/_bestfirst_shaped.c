/*
 * The shaped builders of a batch: beam(...) and eagle(...) build BeamPolicy's and EaglePolicy's
 * trees (bastion.policies) for B requests in one call, node for node what their choose()
 * builds in numpy for one request (bastion.shaped has the Python side and the reference).
 *
 * beam(probs, depth, k, width, steps) -> (parents, depths, ranks, scores, offsets)
 *   At each of `steps` positions every candidate (beam node i, rank r) scores
 *   beam_score[i] * p[r]; the `width` best in (score descending, i * k + r ascending) order
 *   are kept where their score is > 0 (numpy's stable argsort of -score, NaN last).
 * eagle(probs, depth, k, top_k, steps, total) -> the same
 *   Frontier expansion: at each of `steps` positions every frontier node's first top_k
 *   candidates with score > 0 become nodes (in (frontier index, rank) order); the top_k best
 *   of them (score descending, then order of creation) are the next frontier. Then the global
 *   rerank of bastion.policies._sorted_by_key: level by level by (-score, parent's new
 *   position, rank), then all by (-score, depth, position within the level), the best
 *   `total` - 1 kept with the root.
 *
 * probs: B * depth * k doubles (request-major); outputs: bytes as build()'s (see _bestfirst.c),
 * or, for marginals outside [0, 1] whose first bad tree the reference refuses, a negative int
 * saying why (SHAPED_* below; the caller raises the reference's error).
 * Scores are parent score * marginal, in double precision, the product numpy forms.
 */
#include "_bestfirst.h"

/* a precedes b in numpy's stable argsort of -score: larger score first, NaN last, ties by
   index */
static int score_before(double sa, Py_ssize_t ia, double sb, Py_ssize_t ib) {
    int na = sa != sa, nb = sb != sb;
    if (na || nb) return na == nb ? ia < ib : nb;
    if (sa != sb) return sa > sb;
    return ia < ib;
}

/* the first `want` of cand[0 .. m) in score_before order, into order[]; returns how many */
static Py_ssize_t top_of(const double *cand, Py_ssize_t m, Py_ssize_t want, Py_ssize_t *order) {
    Py_ssize_t got = 0;
    if (want > m) want = m;
    for (Py_ssize_t i = 0; i < m; i++) { /* insertion into a sorted prefix of length <= want */
        if (got == want && !score_before(cand[i], i, cand[order[got - 1]], order[got - 1]))
            continue;
        Py_ssize_t at = got < want ? got++ : want - 1;
        while (at > 0 && score_before(cand[i], i, cand[order[at - 1]], order[at - 1])) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = i;
    }
    return got;
}

/* What DraftTree's validation would say of a built tree, in its order: 0 (valid), SHAPED_ORDER
   (a parent after its child), SHAPED_INFINITE (a score not finite) or SHAPED_ABOVE (a node's
   score above its parent's, beyond the same slack) */
#define SHAPED_DROPPED (-1)
#define SHAPED_INFINITE (-2)
#define SHAPED_ABOVE (-3)
#define SHAPED_ORDER (-4)

static int shaped_check(Py_ssize_t n, const int64_t *par, const double *sco) {
    for (Py_ssize_t i = 1; i < n; i++)
        if (par[i] >= i) return SHAPED_ORDER;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!isfinite(sco[i]) || sco[i] < 0.0) return SHAPED_INFINITE;
    for (Py_ssize_t i = 1; i < n; i++)
        if (sco[i] > sco[par[i]] * (1 + 1e-12)) return SHAPED_ABOVE;
    return 0;
}

/* One beam tree; returns its size. cand and order hold width * k entries, bnode and bscore
   width. */
static Py_ssize_t beam_one(const double *p, Py_ssize_t k, Py_ssize_t width, Py_ssize_t steps,
                           double *cand, Py_ssize_t *order, int64_t *bnode, double *bscore,
                           int64_t *par, int64_t *dep, int64_t *rnk, double *sco) {
    Py_ssize_t n = 1, bn = 1;
    par[0] = -1;
    dep[0] = 0;
    rnk[0] = -1;
    sco[0] = 1.0;
    bnode[0] = 0;
    bscore[0] = 1.0;
    for (Py_ssize_t d = 0; d < steps; d++) {
        const double *row = p + d * k;
        Py_ssize_t m = bn * k;
        for (Py_ssize_t i = 0; i < bn; i++)
            for (Py_ssize_t r = 0; r < k; r++) cand[i * k + r] = bscore[i] * row[r];
        Py_ssize_t got = top_of(cand, m, width, order), kept = 0;
        while (kept < got && cand[order[kept]] > 0.0) kept++; /* a sorted prefix */
        if (kept == 0) break;
        Py_ssize_t start = n;
        for (Py_ssize_t t = 0; t < kept; t++, n++) {
            Py_ssize_t idx = order[t];
            par[n] = bnode[idx / k];
            rnk[n] = idx % k;
            dep[n] = d + 1;
            sco[n] = cand[idx];
        }
        for (Py_ssize_t t = 0; t < kept; t++) {
            bnode[t] = start + t;
            bscore[t] = sco[start + t];
        }
        bn = kept;
    }
    int bad = shaped_check(n, par, sco);
    return bad ? bad : n;
}

/* a precedes b in their level's order, (-score, parent's position in its level, rank): equal
   scores compare their parents the same way (siblings differ in rank) */
static inline int eagle_before(int64_t a, int64_t b, const double *sco, const int64_t *par,
                               const int64_t *rnk) {
    for (;;) {
        if (sco[a] != sco[b]) return sco[a] > sco[b];
        if (par[a] == par[b]) return rnk[a] < rnk[b];
        a = par[a];
        b = par[b];
    }
}

/* heap[0 .. n) of nodes, its first in level order on top: sift heap[i] down */
static void sift(int64_t *heap, Py_ssize_t n, Py_ssize_t i, const double *sco,
                 const int64_t *par, const int64_t *rnk) {
    int64_t x = heap[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && eagle_before(heap[c + 1], heap[c], sco, par, rnk)) c++;
        if (!eagle_before(heap[c], x, sco, par, rnk)) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = x;
}

/* One EAGLE tree: grown into g_* (up to 1 + steps * top_k * top_k nodes), reranked into the
   outputs; returns its size, SHAPED_DROPPED when the rerank would drop a parent, or what
   shaped_check says. The global order
   (-score, depth, position within the level) is a merge of the levels' orders, each sorted by
   score first, so only its first `total` - 1 entries are formed. */
static Py_ssize_t eagle_one(const double *p, Py_ssize_t k, Py_ssize_t kk, Py_ssize_t steps,
                            Py_ssize_t total, double *cand, Py_ssize_t *order, int64_t *fnode,
                            double *fscore, int64_t *g_par, int64_t *g_dep, int64_t *g_rnk,
                            double *g_sco, int64_t *newpos, int64_t *heaps, Py_ssize_t *level,
                            int64_t *par, int64_t *dep, int64_t *rnk, double *sco) {
    Py_ssize_t n = 1, fn = 1, deepest = 0;
    g_par[0] = -1;
    g_dep[0] = 0;
    g_rnk[0] = -1;
    g_sco[0] = 1.0;
    fnode[0] = 0;
    fscore[0] = 1.0;
    level[0] = 1;
    for (Py_ssize_t d = 0; d < steps; d++) {
        const double *row = p + d * k;
        Py_ssize_t start = n;
        for (Py_ssize_t i = 0; i < fn; i++)
            for (Py_ssize_t r = 0; r < kk; r++) {
                double s = fscore[i] * row[r];
                if (s > 0.0) {
                    g_par[n] = fnode[i];
                    g_rnk[n] = r;
                    g_dep[n] = d + 1;
                    g_sco[n] = cand[n - start] = s;
                    n++;
                }
            }
        if (n == start) break;
        level[++deepest] = n;
        Py_ssize_t got = top_of(cand, n - start, kk, order);
        for (Py_ssize_t t = 0; t < got; t++) {
            fnode[t] = start + order[t];
            fscore[t] = cand[order[t]];
        }
        fn = got;
    }
    /* the kept nodes: the global order (-score, depth, position within the level) merges the
       levels' orders, each led by the score, so each level is a heap popped as needed (its
       nodes are contiguous: level lv is g_*[level[lv-1] .. level[lv])) */
    Py_ssize_t keep = total - 1 < n - 1 ? total - 1 : n - 1;
    for (Py_ssize_t lv = 1; lv <= deepest; lv++) {
        Py_ssize_t a = level[lv - 1], m = level[lv] - a;
        for (Py_ssize_t i = 0; i < m; i++) heaps[a + i] = a + i;
        for (Py_ssize_t i = m / 2 - 1; i >= 0; i--) sift(heaps + a, m, i, g_sco, g_par, g_rnk);
        order[lv] = m; /* the level's heap size */
    }
    for (Py_ssize_t i = 0; i < n; i++) newpos[i] = -1; /* final positions */
    newpos[0] = 0;
    par[0] = -1;
    dep[0] = 0;
    rnk[0] = -1;
    sco[0] = 1.0;
    for (Py_ssize_t t = 1; t <= keep; t++) {
        Py_ssize_t best = 0;
        for (Py_ssize_t lv = 1; lv <= deepest; lv++) /* the best top; a tie: the shallower */
            if (order[lv] && (best == 0 || g_sco[heaps[level[lv - 1]]] >
                                               g_sco[heaps[level[best - 1]]]))
                best = lv;
        int64_t *h = heaps + level[best - 1];
        int64_t node = h[0];
        h[0] = h[--order[best]];
        sift(h, order[best], 0, g_sco, g_par, g_rnk);
        newpos[node] = t;
        par[t] = node; /* for now */
    }
    for (Py_ssize_t t = 1; t <= keep; t++) {
        int64_t node = par[t], up = newpos[g_par[node]];
        if (up < 0) return SHAPED_DROPPED;
        par[t] = up;
        dep[t] = g_dep[node];
        rnk[t] = g_rnk[node];
        sco[t] = g_sco[node];
    }
    int bad = shaped_check(keep + 1, par, sco);
    return bad ? bad : keep + 1;
}

/* The arguments both functions share, checked; returns 0 and sets an error when bad. */
static int shaped_args(Py_buffer *probs, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t width,
                       Py_ssize_t steps, Py_ssize_t *b) {
    if (depth < 0 || k < 1 || width < 1 || steps < 0 || steps > depth || width > 1 << 20 ||
        k > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "bad depth, k, width or steps");
        return 0;
    }
    Py_ssize_t row = depth * k * (Py_ssize_t)sizeof(double);
    *b = row ? probs->len / row : 0;
    if (!row || !bf_holds_exactly(probs->len, (Py_ssize_t)sizeof(double), *b, depth, k)) {
        PyErr_SetString(PyExc_ValueError, "probs buffer does not match B * depth * k doubles");
        return 0;
    }
    return 1;
}

static PyObject *shaped_result(Py_ssize_t at, Py_ssize_t b, int64_t *par, int64_t *dep,
                               int64_t *rnk, double *sco, int64_t *off) {
    Py_ssize_t ib = (Py_ssize_t)sizeof(int64_t), db = (Py_ssize_t)sizeof(double);
    return Py_BuildValue("(y#y#y#y#y#)", (char *)par, at * ib, (char *)dep, at * ib,
                         (char *)rnk, at * ib, (char *)sco, at * db, (char *)off, (b + 1) * ib);
}

PyObject *bf_beam(PyObject *self, PyObject *args) {
    Py_buffer probs;
    Py_ssize_t depth, k, width, steps, b;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnn", &probs, &depth, &k, &width, &steps)) return NULL;
    if (shaped_args(&probs, depth, k, width, steps, &b)) {
        Py_ssize_t per = 1 + width * steps;
        double *cand = PyMem_Malloc(sizeof(double) * (size_t)(width * k));
        Py_ssize_t *order = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(width + 1));
        int64_t *bnode = PyMem_Malloc(sizeof(int64_t) * (size_t)width);
        double *bscore = PyMem_Malloc(sizeof(double) * (size_t)width);
        int64_t *par = PyMem_Malloc(sizeof(int64_t) * (size_t)(b * per));
        int64_t *dep = PyMem_Malloc(sizeof(int64_t) * (size_t)(b * per));
        int64_t *rnk = PyMem_Malloc(sizeof(int64_t) * (size_t)(b * per));
        double *sco = PyMem_Malloc(sizeof(double) * (size_t)(b * per));
        int64_t *off = PyMem_Malloc(sizeof(int64_t) * (size_t)(b + 1));
        if (!cand || !order || !bnode || !bscore || !par || !dep || !rnk || !sco || !off) {
            PyErr_NoMemory();
        } else {
            const double *p = (const double *)probs.buf;
            Py_ssize_t at = 0, got = 0;
            for (Py_ssize_t j = 0; j < b && got >= 0; j++) {
                off[j] = at;
                got = beam_one(p + j * depth * k, k, width, steps, cand, order, bnode, bscore,
                               par + at, dep + at, rnk + at, sco + at);
                at += got;
            }
            off[b] = at;
            result = got < 0 ? PyLong_FromSsize_t(got)
                             : shaped_result(at, b, par, dep, rnk, sco, off);
        }
        PyMem_Free(cand);
        PyMem_Free(order);
        PyMem_Free(bnode);
        PyMem_Free(bscore);
        PyMem_Free(par);
        PyMem_Free(dep);
        PyMem_Free(rnk);
        PyMem_Free(sco);
        PyMem_Free(off);
    }
    PyBuffer_Release(&probs);
    return result;
}

PyObject *bf_eagle(PyObject *self, PyObject *args) {
    Py_buffer probs;
    Py_ssize_t depth, k, top_k, steps, total, b;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnnn", &probs, &depth, &k, &top_k, &steps, &total))
        return NULL;
    if (shaped_args(&probs, depth, k, top_k, steps, &b) && total < 1) {
        PyErr_SetString(PyExc_ValueError, "total must be >= 1");
    } else if (!PyErr_Occurred()) {
        Py_ssize_t kk = top_k < k ? top_k : k;
        Py_ssize_t grown = 1 + steps * kk * kk, keep = total < grown ? total : grown;
        double *cand = PyMem_Malloc(sizeof(double) * (size_t)(kk * kk));
        Py_ssize_t *order = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(kk + steps + 2));
        int64_t *fnode = PyMem_Malloc(sizeof(int64_t) * (size_t)kk);
        double *fscore = PyMem_Malloc(sizeof(double) * (size_t)kk);
        int64_t *g_int = PyMem_Malloc(sizeof(int64_t) * (size_t)(5 * grown));
        double *g_sco = PyMem_Malloc(sizeof(double) * (size_t)grown);
        Py_ssize_t *level = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(steps + 2));
        int64_t *par = PyMem_Malloc(sizeof(int64_t) * (size_t)(b * keep));
        int64_t *dep = PyMem_Malloc(sizeof(int64_t) * (size_t)(b * keep));
        int64_t *rnk = PyMem_Malloc(sizeof(int64_t) * (size_t)(b * keep));
        double *sco = PyMem_Malloc(sizeof(double) * (size_t)(b * keep));
        int64_t *off = PyMem_Malloc(sizeof(int64_t) * (size_t)(b + 1));
        if (!cand || !order || !fnode || !fscore || !g_int || !g_sco || !level || !par ||
            !dep || !rnk || !sco || !off) {
            PyErr_NoMemory();
        } else {
            const double *p = (const double *)probs.buf;
            Py_ssize_t at = 0, got = 0;
            for (Py_ssize_t j = 0; j < b && got >= 0; j++) {
                off[j] = at;
                got = eagle_one(p + j * depth * k, k, kk, steps, total, cand, order, fnode,
                                fscore, g_int, g_int + grown, g_int + 2 * grown, g_sco,
                                g_int + 3 * grown, g_int + 4 * grown, level, par + at, dep + at,
                                rnk + at, sco + at);
                at += got;
            }
            off[b] = at;
            result = got < 0 ? PyLong_FromSsize_t(got)
                             : shaped_result(at, b, par, dep, rnk, sco, off);
        }
        PyMem_Free(cand);
        PyMem_Free(order);
        PyMem_Free(fnode);
        PyMem_Free(fscore);
        PyMem_Free(g_int);
        PyMem_Free(g_sco);
        PyMem_Free(level);
        PyMem_Free(par);
        PyMem_Free(dep);
        PyMem_Free(rnk);
        PyMem_Free(sco);
        PyMem_Free(off);
    }
    PyBuffer_Release(&probs);
    return result;
}
