/*
 * The verified step's kernels: the acceptance walk accept() and the calibrations' update
 * learn() (see the comment above each; the calibrated marginals calibrate() are in
 * _bestfirst_calibrate.c).
 */
#include "_bestfirst.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <string.h>

/* The acceptance walk, shared by accept() below and verify() (_bestfirst_kv.c), over B trees
 * of n nodes (concatenated, parents local to each tree) against target rows of width tokens.
 * bf_accept_walk marks on[j] (one byte per node, roots 0) for every node on its request's
 * accepted path, writes each request's accepted draft tokens to counts (unless NULL) and the
 * committed tokens, those + 1, to lengths, and returns their total (the accepted nodes), or -1
 * with a ValueError set where the offsets do not increase within [0, n]. bf_accept_emit then
 * writes each request's accepted tokens then its bonus token to committed and the accepted
 * nodes' indices within their trees to nodes. */
Py_ssize_t bf_accept_walk(const int64_t *parents, const int64_t *tokens, const int64_t *depths,
                          const int64_t *offsets, const int64_t *target, Py_ssize_t b,
                          Py_ssize_t n, Py_ssize_t width, char *on, int64_t *counts,
                          int64_t *lengths) {
    Py_ssize_t accepted = 0;
    for (Py_ssize_t i = 0; i < b; i++) {
        Py_ssize_t a = offsets[i], e = offsets[i + 1];
        int64_t c = 0;
        if (a >= e || e > n || a < 0) {
            PyErr_SetString(PyExc_ValueError, "accept: offsets must increase");
            return -1;
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
        if (counts != NULL) counts[i] = c;
        lengths[i] = c + 1;
        accepted += c;
    }
    return accepted;
}

void bf_accept_emit(const int64_t *tokens, const int64_t *offsets, const int64_t *target,
                    Py_ssize_t b, Py_ssize_t width, const char *on, const int64_t *lengths,
                    int64_t *committed, int64_t *nodes) {
    Py_ssize_t t = 0, v = 0;
    for (Py_ssize_t i = 0; i < b; i++) {
        Py_ssize_t a = offsets[i], e = offsets[i + 1];
        for (Py_ssize_t j = a + 1; j < e; j++) {
            if (on[j]) {
                committed[t++] = tokens[j];
                nodes[v++] = j - a;
            }
        }
        int64_t c = lengths[i] - 1 < width - 1 ? lengths[i] - 1 : width - 1;
        committed[t++] = target[i * width + c];
    }
}

/* accept(parents, tokens, depths, offsets, target, width)
 *     -> (counts, on_path, committed, nodes, lengths)
 *   One batch of trees (concatenated, parents local to each tree, parents before children)
 *   walked against the target's tokens: target[i * width + d - 1] is request i's token at
 *   depth d, and target[i * width + min(c, width - 1)] the token after c accepted ones (the
 *   bonus). A node is on its request's accepted path iff it matches and its parent is on it
 *   (the root always is). counts: accepted draft tokens per request (int64 [B]); on_path: one
 *   byte per node (roots 0); committed: each request's accepted tokens then its bonus token,
 *   request by request (int64); nodes: the accepted nodes' indices within their trees;
 *   lengths: each request's committed tokens, counts + 1 (int64 [B]). */
PyObject *bf_accept(PyObject *self, PyObject *args) {
    Py_buffer par, tok, dep, off, tgt;
    Py_ssize_t width;
    PyObject *result = NULL, *o_cnt = NULL, *o_on = NULL, *o_com = NULL, *o_nod = NULL;
    PyObject *o_len = NULL;
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
    o_len = PyBytes_FromStringAndSize(NULL, b * (Py_ssize_t)sizeof(int64_t));
    o_on = PyBytes_FromStringAndSize(NULL, n);
    if (!o_cnt || !o_len || !o_on) goto done;
    {
        int64_t *counts = (int64_t *)PyBytes_AS_STRING(o_cnt);
        int64_t *lengths = (int64_t *)PyBytes_AS_STRING(o_len);
        char *on = PyBytes_AS_STRING(o_on);
        Py_ssize_t accepted =
            bf_accept_walk(parents, tokens, depths, offsets, target, b, n, width, on, counts,
                           lengths);
        if (accepted < 0) goto done;
        o_com = PyBytes_FromStringAndSize(NULL, (accepted + b) * (Py_ssize_t)sizeof(int64_t));
        o_nod = PyBytes_FromStringAndSize(NULL, accepted * (Py_ssize_t)sizeof(int64_t));
        if (!o_com || !o_nod) goto done;
        bf_accept_emit(tokens, offsets, target, b, width, on, lengths,
                       (int64_t *)PyBytes_AS_STRING(o_com), (int64_t *)PyBytes_AS_STRING(o_nod));
    }
    result = Py_BuildValue("(OOOOO)", o_cnt, o_on, o_com, o_nod, o_len);
done:
    Py_XDECREF(o_cnt);
    Py_XDECREF(o_len);
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

/* learn(offsets, parents, depths, ranks, scores, accepted, committed, order, raw, k,
 *       pred, real, ranks_tracked, a_decay, da, dt, weight, s_decay, lattice[, hint])
 *     -> (run, deepest), or None
 *   None, having changed nothing, where one of the eight arrays (offsets … committed, raw) is
 *   not a C-contiguous buffer of its type (int64; scores and raw float64): the caller converts
 *   them and calls again (the controller's own arrays are, so its hot path converts nothing).
 *   One verified tree step of B requests folded into the learning controller's two
 *   calibrations, in place (bastion.observed: AcceptanceCalibration.observe and
 *   SizeCalibration.observe — the same operations in the same order, so the results are
 *   bit-identical). The trees are concatenated (offsets, parents local to each tree); accepted
 *   holds each request's accepted nodes (indices within its tree), committed[i] - 1 of them
 *   for request i (its committed tokens less the bonus token).
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
 *     previous lattice point are added (the first against B), and weight by 1.
 *   - hint (int64, optional): the merged order as forest() gives it, the request of each
 *     added node in turn; taken only where it is that order exactly (each request's nodes in
 *     their tree's order, every item strictly before the next by the merge's key, all nodes
 *     once: checked in one pass), else ignored and the runs merged (a heap of B heads). */
typedef struct {
    double score;
    Py_ssize_t request, within, node;
} merged;

#define LEARN_STACK 2048 /* learn()'s scratch on the stack, in doubles (16 KiB) */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
static inline int merged_cmp(const merged *a, const merged *b) {
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->request != b->request) return a->request < b->request ? -1 : 1;
    return (a->within > b->within) - (a->within < b->within);
}

/* merged_cmp for qsort (the merge of best-first runs below calls merged_cmp inline) */
static int merged_before(const void *pa, const void *pb) {
    return merged_cmp((const merged *)pa, (const merged *)pb);
}

/* learn()'s merged order from its hint (see above): 1 with gains (the merged scores) and rank
   (each node's merged rank, 1 …) filled, 0 where the hint is not the merged order exactly
   (rank and gains then hold partial values the merge overwrites). */
static int learn_hinted(const int64_t *offsets, const double *scores, Py_ssize_t b,
                        Py_ssize_t m_all, const Py_buffer *hint, double *gains, Py_ssize_t *rank,
                        int64_t *taken) {
    if (hint->len != m_all * (Py_ssize_t)sizeof(int64_t) || m_all < 1) return 0;
    const int64_t *req = (const int64_t *)hint->buf;
    memset(taken, 0, (size_t)b * sizeof(int64_t));
    int ok = 1;
    merged prev = {0.0, 0, 0, 0};
    for (Py_ssize_t t = 0; t < m_all && ok; t++) {
        int64_t i = req[t];
        if (i < 0 || i >= b) {
            ok = 0;
            break;
        }
        Py_ssize_t node = offsets[i] + 1 + taken[i];
        if (node >= offsets[i + 1]) {
            ok = 0;
            break;
        }
        merged item = {scores[node], (Py_ssize_t)i, 1 + taken[i], node};
        taken[i]++;
        /* strictly after the previous item by the merge's key (a NaN score fails: merge) */
        ok = t == 0 || merged_cmp(&prev, &item) < 0;
        prev = item;
        gains[t] = item.score;
        rank[node] = t + 1;
    }
    /* all m_all taken, none past its tree's end: every node exactly once */
    return ok;
}

/* learn()'s view of one of its arrays: 1 where obj is a C-contiguous buffer of 8-byte items of
   the kind ('i': signed integers, 'd': doubles) in native order; 0, no error set, else */
static int learn_view(PyObject *obj, Py_buffer *view, char kind) {
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format;
    if (f != NULL && (f[0] == '=' || f[0] == '@' || (PY_LITTLE_ENDIAN && f[0] == '<'))) f++;
    int ok = view->itemsize == 8 && f != NULL && f[0] != '\0' && f[1] == '\0' &&
             (kind == 'd' ? f[0] == 'd' : f[0] == 'l' || f[0] == 'q');
    if (!ok) PyBuffer_Release(view);
    return ok;
}

PyObject *bf_learn(PyObject *self, PyObject *args) {
    Py_buffer off, par, dep, rnk, sco, acc, cnt, ord, raw, prd, rea, da, dt, wt, lat;
    Py_buffer hnt = {0};
    Py_ssize_t k, ranks_tr;
    double a_decay, s_decay;
    PyObject *result = NULL;
    char *on = NULL, *on_rank = NULL;
    double *tmp = NULL, *gains = NULL, *heap_scratch = NULL;
    double stack_scratch[LEARN_STACK]; /* the scratch below where it fits (most calls) */
    Py_ssize_t *rank = NULL;
    int64_t *taken = NULL;
    merged *items = NULL;
    PyObject *o_run = NULL, *o_deep = NULL;
    PyObject *arrays[8]; /* offsets … committed, raw: taken below (learn_view) */
    Py_buffer *views[8] = {&off, &par, &dep, &rnk, &sco, &acc, &cnt, &raw};
    if (!PyArg_ParseTuple(args, "OOOOOOOy*Onw*w*ndw*w*w*dy*|y*", &arrays[0], &arrays[1],
                          &arrays[2], &arrays[3], &arrays[4], &arrays[5], &arrays[6], &ord,
                          &arrays[7], &k, &prd, &rea, &ranks_tr, &a_decay, &da, &dt, &wt,
                          &s_decay, &lat, &hnt))
        return NULL;
    {
        int taken = 0;
        while (taken < 8 && learn_view(arrays[taken], views[taken], "iiiidiid"[taken])) taken++;
        if (taken < 8) { /* not the kernel's layout: None, nothing changed (see above) */
            while (taken > 0) PyBuffer_Release(views[--taken]);
            Py_buffer *held[7] = {&ord, &prd, &rea, &da, &dt, &wt, &lat};
            for (int i = 0; i < 7; i++) PyBuffer_Release(held[i]);
            if (hnt.obj) PyBuffer_Release(&hnt);
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t b = off.len / (Py_ssize_t)sizeof(int64_t) - 1;
    Py_ssize_t n = par.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t na = acc.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t rows = k > 0 ? raw.len / (Py_ssize_t)sizeof(double) / k : 0; /* B x drafted depth */
    Py_ssize_t draw = b > 0 ? rows / b : 0;
    Py_ssize_t cells = prd.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t nl = lat.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *offsets = (const int64_t *)off.buf, *parents = (const int64_t *)par.buf;
    const int64_t *depths = (const int64_t *)dep.buf, *ranks = (const int64_t *)rnk.buf;
    const int64_t *accepted = (const int64_t *)acc.buf, *committed = (const int64_t *)cnt.buf;
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
    /* the acceptance sums touch only the depths both tracked and drafted (used cells; the
       others add 0.0); one scratch block, on the stack where it fits, zeroed where read */
    Py_ssize_t tracked = cells / ranks_tr;
    Py_ssize_t used = (tracked < draw ? tracked : draw) * ranks_tr;
    {
        Py_ssize_t words = 2 * used + (n + 1) + n + b + (2 * n + 1 + 7) / 8;
        double *scratch = stack_scratch;
        if (words > LEARN_STACK) {
            scratch = heap_scratch = (double *)malloc((size_t)words * sizeof(double));
            if (!scratch) {
                PyErr_NoMemory();
                goto done;
            }
        }
        tmp = scratch;
        gains = tmp + 2 * used;
        rank = (Py_ssize_t *)(gains + n + 1);
        taken = (int64_t *)(rank + n);
        on = (char *)(taken + b);
        on_rank = on + n; /* m_all + 1 = n - b + 1 bytes */
        memset(tmp, 0, (size_t)(2 * used) * sizeof(double));
        memset(on, 0, (size_t)n);
    }
    {
        Py_ssize_t t = 0;
        for (Py_ssize_t i = 0; i < b; i++) {
            Py_ssize_t a = offsets[i], e = offsets[i + 1];
            if (a >= e || e > n || committed[i] < 1 || committed[i] - 1 > na - t) {
                PyErr_SetString(PyExc_ValueError,
                                "learn: offsets or committed counts out of range");
                goto done;
            }
            on[a] = 1;
            for (int64_t c = 1; c < committed[i]; c++, t++) {
                if (accepted[t] < 1 || accepted[t] >= e - a) {
                    PyErr_SetString(PyExc_ValueError, "learn: accepted node out of range");
                    goto done;
                }
                on[a + accepted[t]] = 1;
            }
        }
        if (t != na) {
            PyErr_SetString(PyExc_ValueError,
                            "learn: committed counts do not add up to the accepted nodes");
            goto done;
        }
    }
    /* acceptance: Σ p and Σ hit per cell over the exposed nodes, in node order (bincount) */
    for (Py_ssize_t i = 0; i < b; i++) {
        Py_ssize_t a = offsets[i], e = offsets[i + 1];
        for (Py_ssize_t j = a + 1; j < e; j++) {
            if (j + PREFETCH_AHEAD < e) { /* the rows a few nodes on: their reads then hit */
                Py_ssize_t ahead = (i * draw + depths[j + PREFETCH_AHEAD] - 1) * k;
                if (ahead >= 0 && ahead < rows * k) {
                    PREFETCH(probs + ahead);
                    if (order) PREFETCH(order + ahead);
                }
            }
            int64_t pj = parents[j], d = depths[j] - 1, r = ranks[j];
            if ((uint64_t)pj >= (uint64_t)(j - a) || (uint64_t)d >= (uint64_t)draw ||
                (uint64_t)r >= (uint64_t)k) {
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
            tmp[used + c] += on[j] ? 1.0 : 0.0;
        }
    }
    /* pred = pred * a_decay + Σ p, real likewise (each cell on its own: numpy's two passes) */
    {
        Py_ssize_t c = 0;
#if defined(__SSE2__)
        __m128d f = _mm_set1_pd(a_decay);
        for (; c + 1 < used; c += 2) {
            _mm_storeu_pd(pred + c, _mm_add_pd(_mm_mul_pd(_mm_loadu_pd(pred + c), f),
                                               _mm_loadu_pd(tmp + c)));
            _mm_storeu_pd(real + c, _mm_add_pd(_mm_mul_pd(_mm_loadu_pd(real + c), f),
                                               _mm_loadu_pd(tmp + used + c)));
        }
#endif
        for (; c < used; c++) {
            pred[c] = pred[c] * a_decay + tmp[c];
            real[c] = real[c] * a_decay + tmp[used + c];
        }
#if defined(__SSE2__)
        __m128d z = _mm_setzero_pd();
        for (; c + 1 < cells; c += 2) {
            _mm_storeu_pd(pred + c, _mm_add_pd(_mm_mul_pd(_mm_loadu_pd(pred + c), f), z));
            _mm_storeu_pd(real + c, _mm_add_pd(_mm_mul_pd(_mm_loadu_pd(real + c), f), z));
        }
#endif
        for (; c < cells; c++) { /* + 0.0 as the sum of no node: -0.0 becomes 0.0 */
            pred[c] = pred[c] * a_decay + 0.0;
            real[c] = real[c] * a_decay + 0.0;
        }
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
            for (int64_t c = 1; c < committed[i]; c++, t++) {
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
    } else if (!learn_hinted(offsets, scores, b, m_all, &hnt, gains, rank, taken)) {
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
                while (at > 0 && merged_cmp(&e, &heads[(at - 1) / 2]) < 0) {
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
                    if (c + 1 < h && merged_cmp(&heads[c + 1], &heads[c]) < 0) c++;
                    if (merged_cmp(&heads[c], &e) >= 0) break;
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
    for (Py_ssize_t c = 0; c < nl; c++) {
        sda[c] *= s_decay;
        sdt[c] *= s_decay;
        swt[c] *= s_decay;
    }
    {
        double sum = 0.0, prev_a = (double)b, prev_t = (double)b;
        Py_ssize_t summed = 0, ranked = 0, hits = 0;
        /* accepted nodes per merged rank 1 … N - B (each rank holds one node) */
        memset(on_rank, 0, (size_t)(m_all + 1));
        for (Py_ssize_t i = 0; i < b; i++)
            for (Py_ssize_t j = offsets[i] + 1; j < offsets[i + 1]; j++)
                if (on[j]) on_rank[rank[j]] = 1;
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
    free(heap_scratch);
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
    if (hnt.obj) PyBuffer_Release(&hnt);
    return result;
}

/* gains(da, dt, weight, prior_weight) -> h
 *   SizeCalibration.gain_ratios of one bucket's row (float64, n cells each): per cell, with
 *   w' = weight where weight > 1e-9 (seen) else 1 and prior = prior_weight * da / w',
 *   h = (dt + prior) / max(da + prior, 1e-12) where da + prior > 1e-12, else 1; a cell never
 *   seen takes the ratio of the nearest seen cell below (1 if none; all 1 if none is seen).
 *   The same operations in the same order as numpy's, so bit-identical (float64 bytes, n). */
PyObject *bf_gains(PyObject *self, PyObject *args) {
    Py_buffer da, dt, wt;
    double pw;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*d", &da, &dt, &wt, &pw)) return NULL;
    Py_ssize_t n = da.len / (Py_ssize_t)sizeof(double);
    if (da.len != n * (Py_ssize_t)sizeof(double) || dt.len != da.len || wt.len != da.len) {
        PyErr_SetString(PyExc_ValueError, "gains: da, dt and weight must be n float64 each");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
    if (!result) goto done;
    {
        const double *a = (const double *)da.buf, *t = (const double *)dt.buf;
        const double *w = (const double *)wt.buf;
        double *h = (double *)PyBytes_AS_STRING(result);
        Py_ssize_t last = -1; /* the last seen cell so far */
        for (Py_ssize_t i = 0; i < n; i++) {
            int seen = w[i] > 1e-9;
            double prior = pw * a[i] / (seen ? w[i] : 1.0);
            double s = a[i] + prior;
            double den = (s >= 1e-12 || s != s) ? s : 1e-12; /* np.maximum: NaN propagates */
            double v = s > 1e-12 ? (t[i] + prior) / den : 1.0;
            if (seen) {
                h[i] = v;
                /* the unseen cells since the last seen one take its ratio (its raw h) */
                last = i;
            } else {
                h[i] = last >= 0 ? h[last] : 1.0;
            }
        }
        if (last < 0)
            for (Py_ssize_t i = 0; i < n; i++) h[i] = 1.0;
    }
done:
    PyBuffer_Release(&da);
    PyBuffer_Release(&dt);
    PyBuffer_Release(&wt);
    return result;
}

/* size_factors(da, weight, h, batch) -> factors
 *   SizeCalibration.factors of one bucket's row (float64, n cells each) given its gain ratios
 *   h: gain = da / weight where weight > 1e-9 (seen) else 0; factor = (B + cumsum(gain * h)) /
 *   (B + cumsum(gain)) where seen, else 1 (numpy's operations in numpy's order: float64 bytes). */
PyObject *bf_size_factors(PyObject *self, PyObject *args) {
    Py_buffer da, wt, hb;
    Py_ssize_t batch;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*n", &da, &wt, &hb, &batch)) return NULL;
    Py_ssize_t n = da.len / (Py_ssize_t)sizeof(double);
    if (da.len != n * (Py_ssize_t)sizeof(double) || wt.len != da.len || hb.len != da.len) {
        PyErr_SetString(PyExc_ValueError, "size_factors: da, weight and h must be n float64 each");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
    if (!result) goto done;
    {
        const double *a = (const double *)da.buf, *w = (const double *)wt.buf;
        const double *h = (const double *)hb.buf;
        double *f = (double *)PyBytes_AS_STRING(result), b = (double)batch, tau = 0.0, got = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int seen = w[i] > 1e-9;
            double gain = seen ? a[i] / w[i] : 0.0;
            double x = gain * h[i];
            tau = i ? tau + x : x; /* np.cumsum: the first element, then each added in turn */
            got = i ? got + gain : gain;
            f[i] = seen ? (b + tau) / (b + got) : 1.0;
        }
    }
done:
    PyBuffer_Release(&da);
    PyBuffer_Release(&wt);
    PyBuffer_Release(&hb);
    return result;
}

/* medians(ring, count, window, cells, median)
 *   The cycle table's cell medians (bastion.cycles.CycleTable._medians), in place: for each
 *   flat cell index c in `cells` (int64), median[c] = the median of ring[c, :min(count[c],
 *   window)] as small_median takes it (sorted; the middle one, or 0.5 * the middle two's sum).
 *   ring: float64 [cells_total, window] (C order); count: int64 [cells_total]; median: float64
 *   [cells_total], writable. */
PyObject *bf_medians(PyObject *self, PyObject *args) {
    Py_buffer rb, cb, idx, mb;
    Py_ssize_t window;
    PyObject *result = NULL;
    double *v = NULL;
    if (!PyArg_ParseTuple(args, "y*y*ny*w*", &rb, &cb, &window, &idx, &mb)) return NULL;
    Py_ssize_t n = cb.len / (Py_ssize_t)sizeof(int64_t), m = idx.len / (Py_ssize_t)sizeof(int64_t);
    if (window < 1 || cb.len != n * (Py_ssize_t)sizeof(int64_t) ||
        rb.len != n * window * (Py_ssize_t)sizeof(double) ||
        mb.len != n * (Py_ssize_t)sizeof(double) || idx.len != m * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "medians: inconsistent sizes");
        goto done;
    }
    v = malloc((size_t)window * sizeof(double));
    if (!v) {
        PyErr_NoMemory();
        goto done;
    }
    {
        const double *ring = (const double *)rb.buf;
        const int64_t *count = (const int64_t *)cb.buf, *cells = (const int64_t *)idx.buf;
        double *median = (double *)mb.buf;
        for (Py_ssize_t i = 0; i < m; i++) {
            int64_t c = cells[i];
            if (c < 0 || c >= n || count[c] < 1) {
                PyErr_SetString(PyExc_ValueError, "medians: a cell out of range or never seen");
                goto done;
            }
            Py_ssize_t seen = count[c] < window ? (Py_ssize_t)count[c] : window;
            for (Py_ssize_t j = 0; j < seen; j++) { /* insertion sort: a few values */
                double x = ring[c * window + j];
                Py_ssize_t at = j;
                while (at > 0 && v[at - 1] > x) {
                    v[at] = v[at - 1];
                    at--;
                }
                v[at] = x;
            }
            Py_ssize_t half = seen / 2;
            median[c] = seen % 2 ? v[half] : 0.5 * (v[half - 1] + v[half]);
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    free(v);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&idx);
    PyBuffer_Release(&mb);
    return result;
}

/* fill_row(row) -> bytes or None
 *   A cycle-table row's gaps filled as bastion.cycles.CycleTable._fill fills them with
 *   np.interp (numpy's arr_interp, operation for operation): None where no cell is finite;
 *   else each cell i's value — its own where finite, the first finite value before the first,
 *   the last one after the last, and between finite cells x0 < i < x1 slope * (i - x0) + f0,
 *   slope = (f1 - f0) / (x1 - x0) (numpy's fallbacks where that is NaN). row: float64 [n]. */
PyObject *bf_fill_row(PyObject *self, PyObject *args) {
    Py_buffer rb;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*", &rb)) return NULL;
    Py_ssize_t n = rb.len / (Py_ssize_t)sizeof(double);
    if (rb.len != n * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "fill_row: row must be float64");
        goto done;
    }
    {
        const double *row = (const double *)rb.buf;
        Py_ssize_t first = -1, last = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (isfinite(row[i])) {
                if (first < 0) first = i;
                last = i;
            }
        }
        if (first < 0) {
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        result = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
        if (!result) goto done;
        double *out = (double *)PyBytes_AS_STRING(result);
        Py_ssize_t lo = first; /* the finite cell at or before i */
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i <= first) {
                out[i] = row[first]; /* before the first: np.interp's left; at it: its own */
                continue;
            }
            if (i >= last) {
                out[i] = row[last]; /* at the last: its own; after it: np.interp's right */
                continue;
            }
            if (isfinite(row[i])) {
                lo = i;
                out[i] = row[i];
                continue;
            }
            Py_ssize_t hi = i + 1;
            while (!isfinite(row[hi])) hi++;
            double x0 = (double)lo, x1 = (double)hi, f0 = row[lo], f1 = row[hi];
            double slope = (f1 - f0) / (x1 - x0), x = (double)i;
            double v = slope * (x - x0) + f0;
            if (v != v) { /* numpy: the other end's line, then the equal values' own */
                v = slope * (x - x1) + f1;
                if (v != v && f0 == f1) v = f0;
            }
            out[i] = v;
        }
    }
done:
    PyBuffer_Release(&rb);
    return result;
}

/* finite_median(row) -> float or None
 *   The median of a cycle-table row's finite cells as bastion.cycles.small_median takes it
 *   (sorted; the middle one, or 0.5 * the middle two's sum): None where none is finite. The
 *   values are positive ratios, so qsort's order of equal values cannot show. row: float64 [n]. */
static int double_before(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

PyObject *bf_finite_median(PyObject *self, PyObject *args) {
    Py_buffer rb;
    PyObject *result = NULL;
    double *v = NULL;
    if (!PyArg_ParseTuple(args, "y*", &rb)) return NULL;
    Py_ssize_t n = rb.len / (Py_ssize_t)sizeof(double), m = 0;
    if (rb.len != n * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "finite_median: row must be float64");
        goto done;
    }
    v = malloc((size_t)(n ? n : 1) * sizeof(double));
    if (!v) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (isfinite(((const double *)rb.buf)[i])) v[m++] = ((const double *)rb.buf)[i];
    if (!m) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    qsort(v, (size_t)m, sizeof(double), double_before);
    result = PyFloat_FromDouble(m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]));
done:
    free(v);
    PyBuffer_Release(&rb);
    return result;
}
