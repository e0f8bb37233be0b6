/*
 * Sums of whole numbers over a simulated step's requests, several a step, each a handful of
 * numpy calls on a few dozen requests, in one call here: the server's KV-cache block counts
 * (bastion.sim.memory.KVCache.blocks_of), the ground truth's pass sums (bastion.sim.batching),
 * a verified step's counts (commit; verify: with the acceptance walk first) and a serving
 * step's gathers and closing bookkeeping (gather, settle: below).
 *
 * blocks(tokens, add, block_tokens, sizes, floor[, sizes2, floor2]) -> int, tuple or None
 *   tokens: int64 per request (any buffer; None comes back unless it is C-contiguous int64)
 *   sizes None: the sum over requests of ceil((tokens[i] + add) / block_tokens);
 *   sizes (int64, one per request): of ceil((tokens[i] + max(sizes[i], floor)) / block_tokens).
 *   With sizes2 (int64, one per request; sizes then not None): (that sum, the same sum with
 *   sizes2 and floor2), two counts of one tokens array in one call (KVCache.blocks_two).
 * The divisions are floor divisions of the numerator plus block_tokens - 1, as Python's and
 * numpy's // are, so the count is the one the numpy expression gives (int64 arithmetic).
 *
 * sums(sizes, contexts, quantum) -> tuple or None
 *   With k_i = ceil(contexts[i] / quantum): sizes None gives (B, sum k); otherwise (B, sum s,
 *   sum s^2, sum k, sum s*k). None (the caller's numpy path then answers, or raises) unless
 *   both are C-contiguous int64 of one length, every context is in [0, 2^40], every size in
 *   [1, 2^20] and every sum, times the quantum, below 2^53: then each is a whole number a double
 *   holds exactly, so it equals numpy's float sums of the same whole numbers in any order
 *   (ceil(c / q) in doubles is exact for such c).
 */
#include "_bestfirst.h"

static int int64_view(PyObject *obj, Py_buffer *view) {
    /* 1: a C-contiguous buffer of 8-byte signed integers; 0: not one (no error set) */
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format;
    if (f != NULL && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f++;
    if (view->itemsize != 8 || f == NULL || (f[0] != 'l' && f[0] != 'q') || f[1] != '\0') {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* int64_view() of each of the n objects but those whose bit is set in skip (taken[i] says which
 * were taken); 1 if every one asked for is a C-contiguous int64 buffer, else 0 with every view
 * released. The caller releases a success's views with release_views(). */
static int int64_views(PyObject **objs, int n, unsigned skip, Py_buffer *v, int *taken) {
    for (int i = 0; i < n; i++) taken[i] = 0;
    for (int i = 0; i < n; i++) {
        if (skip >> i & 1u) continue;
        if (!int64_view(objs[i], &v[i])) {
            for (int j = 0; j < i; j++)
                if (taken[j]) PyBuffer_Release(&v[j]);
            for (int j = 0; j < n; j++) taken[j] = 0;
            return 0;
        }
        taken[i] = 1;
    }
    return 1;
}

static void release_views(Py_buffer *v, const int *taken, int n) {
    for (int i = 0; i < n; i++)
        if (taken[i]) PyBuffer_Release(&v[i]);
}

/* pool_pin(context_len, generated, output_len) -> pin or None
 *
 * A simulated pool's three count arrays (bastion.sim.backend.SimBatch: they live all run,
 * replaced only when the pool grows, and are read or written by verify() and gather() every
 * step) with their buffers taken once and held until the capsule is freed. verify() and
 * gather() take the pin as an optional last argument and use its buffer for an argument that
 * is the very object pinned (its buffer held: the object alive, its memory in place), asking
 * for the buffer as usual otherwise (a stale pin changes nothing but the cost). None where an
 * array is not C-contiguous int64. */
#define POOL_PIN "bastion._bestfirst.pool_pin"

typedef struct {
    Py_buffer v[3];
} pool_pinned;

static void pool_unpin(PyObject *capsule) {
    pool_pinned *pin = (pool_pinned *)PyCapsule_GetPointer(capsule, POOL_PIN);
    if (pin == NULL) return;
    for (int i = 0; i < 3; i++) PyBuffer_Release(&pin->v[i]);
    PyMem_Free(pin);
}

PyObject *bf_pool_pin(PyObject *self, PyObject *args) {
    PyObject *objs[3];
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    pool_pinned *pin = (pool_pinned *)PyMem_Calloc(1, sizeof(pool_pinned));
    if (pin == NULL) return PyErr_NoMemory();
    int taken[3];
    if (!int64_views(objs, 3, 0u, pin->v, taken)) {
        PyMem_Free(pin);
        Py_RETURN_NONE;
    }
    PyObject *capsule = PyCapsule_New(pin, POOL_PIN, pool_unpin);
    if (capsule == NULL) {
        release_views(pin->v, taken, 3);
        PyMem_Free(pin);
    }
    return capsule;
}

/* The pinned buffers (pin None or not a pool pin: none) put in v[i] for each of the three
 * objs[first .. first + 2] that is one of the arrays pinned; the caller skips those in
 * int64_views() (the returned mask), so taken[] stays 0 there: the pin keeps them. */
static unsigned pinned_views(PyObject *pin_obj, PyObject **objs, int first, Py_buffer *v) {
    if (pin_obj == Py_None || !PyCapsule_IsValid(pin_obj, POOL_PIN)) return 0u;
    pool_pinned *pin = (pool_pinned *)PyCapsule_GetPointer(pin_obj, POOL_PIN);
    unsigned mask = 0u;
    for (int i = first; i < first + 3; i++)
        for (int k = 0; k < 3; k++)
            if (pin->v[k].obj == objs[i]) {
                v[i] = pin->v[k];
                mask |= 1u << i;
                break;
            }
    return mask;
}

/* commit()'s updates, in place: for each of the b listed slots s with committed c (c >= 0 where
 * the caller has not checked it: checked here), ctx[s] += c and gen[s] = min(gen[s] + c, out[s]);
 * 0, changing nothing, where a slot is out of [0, n) or a count is negative or a sum would pass
 * int64. Shared by commit() and verify(). */
static int commit_counts(int64_t *ctx, int64_t *gen, const int64_t *out, Py_ssize_t n,
                         const int64_t *slots, const int64_t *made, Py_ssize_t b) {
    for (Py_ssize_t i = 0; i < b; i++) {
        int64_t s = slots[i], c = made[i];
        if (s < 0 || s >= n || c < 0 || ctx[s] > INT64_MAX - c || gen[s] > INT64_MAX - c)
            return 0;
    }
    for (Py_ssize_t i = 0; i < b; i++) {
        int64_t s = slots[i], c = made[i], g = gen[s] + c;
        ctx[s] += c;
        gen[s] = g < out[s] ? g : out[s];
    }
    return 1;
}

static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* sum over i of ceil((t[i] + max(s[i], floor)) / bt), floor division as numpy's */
static int64_t blocks_sized(const int64_t *t, const int64_t *s, Py_ssize_t n, int64_t floor,
                            int64_t bt) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t extra = s[i] > floor ? s[i] : floor;
        total += floor_div(t[i] + extra + bt - 1, bt);
    }
    return total;
}

PyObject *bf_kv_blocks(PyObject *self, PyObject *args) {
    PyObject *tokens_obj, *sizes_obj, *sizes2_obj = Py_None;
    long long add, bt, floor, floor2 = 0;
    if (!PyArg_ParseTuple(args, "OLLOL|OL", &tokens_obj, &add, &bt, &sizes_obj, &floor,
                          &sizes2_obj, &floor2))
        return NULL;
    if (bt < 1) {
        PyErr_SetString(PyExc_ValueError, "blocks: block_tokens must be >= 1");
        return NULL;
    }
    if (sizes2_obj != Py_None && sizes_obj == Py_None) {
        PyErr_SetString(PyExc_ValueError, "blocks: sizes2 needs sizes");
        return NULL;
    }
    Py_buffer tv, sv[2];
    if (!int64_view(tokens_obj, &tv)) Py_RETURN_NONE;
    const int64_t *t = (const int64_t *)tv.buf;
    Py_ssize_t n = tv.len / 8;
    int64_t total = 0, up = (int64_t)bt - 1;
    PyObject *result = NULL;
    if (sizes_obj == Py_None) {
        for (Py_ssize_t i = 0; i < n; i++) total += floor_div(t[i] + (int64_t)add + up, bt);
        result = PyLong_FromLongLong((long long)total);
    } else {
        PyObject *objs[2] = {sizes_obj, sizes2_obj};
        int taken[2];
        if (!int64_views(objs, 2, sizes2_obj == Py_None ? 2u : 0u, sv, taken)) {
            PyBuffer_Release(&tv);
            Py_RETURN_NONE;
        }
        if (sv[0].len != tv.len || (taken[1] && sv[1].len != tv.len))
            PyErr_SetString(PyExc_ValueError, "blocks: one size per request");
        else if (!taken[1])
            result = PyLong_FromLongLong(
                (long long)blocks_sized(t, (const int64_t *)sv[0].buf, n, floor, bt));
        else
            result = Py_BuildValue(
                "(LL)", (long long)blocks_sized(t, (const int64_t *)sv[0].buf, n, floor, bt),
                (long long)blocks_sized(t, (const int64_t *)sv[1].buf, n, floor2, bt));
        release_views(sv, taken, 2);
    }
    PyBuffer_Release(&tv);
    return result;
}

#define SUMS_EXACT ((int64_t)1 << 53)

PyObject *bf_sums(PyObject *self, PyObject *args) {
    PyObject *sizes_obj, *ctx_obj;
    long long quantum;
    if (!PyArg_ParseTuple(args, "OOL", &sizes_obj, &ctx_obj, &quantum)) return NULL;
    Py_buffer cv, sv;
    if (quantum < 1 || quantum > ((long long)1 << 20) || !int64_view(ctx_obj, &cv)) Py_RETURN_NONE;
    const int64_t *c = (const int64_t *)cv.buf, q = (int64_t)quantum;
    Py_ssize_t n = cv.len / 8;
    int ok = 1;
    int64_t k_sum = 0, s_sum = 0, s_sq = 0, s_k = 0;
    const int64_t *s = NULL;
    if (sizes_obj != Py_None) {
        if (!int64_view(sizes_obj, &sv)) {
            PyBuffer_Release(&cv);
            Py_RETURN_NONE;
        }
        s = (const int64_t *)sv.buf;
        ok = sv.len == cv.len;
    }
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        if (c[i] < 0 || c[i] > ((int64_t)1 << 40)) {
            ok = 0;
            break;
        }
        int64_t k = (c[i] + q - 1) / q; /* c >= 0: the floor division is C's */
        k_sum += k;
        if (s != NULL) {
            int64_t si = s[i];
            if (si < 1 || si > ((int64_t)1 << 20)) {
                ok = 0;
                break;
            }
            s_sum += si;
            s_sq += si * si;
            s_k += si * k;
            ok = s_sq < SUMS_EXACT && s_k < SUMS_EXACT / q;
        }
        ok = ok && k_sum < SUMS_EXACT / q;
    }
    if (s != NULL) PyBuffer_Release(&sv);
    PyBuffer_Release(&cv);
    if (!ok) Py_RETURN_NONE;
    if (s == NULL) return Py_BuildValue("(nL)", n, (long long)k_sum);
    return Py_BuildValue("(nLLLL)", n, (long long)s_sum, (long long)s_sq, (long long)k_sum,
                         (long long)s_k);
}

/* commit(context_len, generated, output_len, slots, committed) -> bool
 *
 * A verified step's bookkeeping (bastion.sim.backend.SimBatch.verify_batch), in place: for each
 * listed slot s with committed c, context_len[s] += c and generated[s] = min(generated[s] + c,
 * output_len[s]) — numpy's fancy-indexed updates for distinct slots (the caller's: one slot a
 * request). False, changing nothing, unless all five are C-contiguous int64, the first three
 * of one length (the first two writable), slots and committed of one length, every slot in
 * range and no sum beyond int64: the caller's numpy path then runs. */
PyObject *bf_commit(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4]))
        return NULL;
    Py_buffer v[5];
    int taken[5];
    int ok = int64_views(objs, 5, 0u, v, taken);
    if (ok && (v[0].readonly || v[1].readonly || v[1].len != v[0].len || v[2].len != v[0].len ||
               v[4].len != v[3].len))
        ok = 0;
    if (ok)
        ok = commit_counts((int64_t *)v[0].buf, (int64_t *)v[1].buf, (const int64_t *)v[2].buf,
                           v[0].len / 8, (const int64_t *)v[3].buf, (const int64_t *)v[4].buf,
                           v[3].len / 8);
    release_views(v, taken, 5);
    return PyBool_FromLong(ok);
}

/* verify(parents, tokens, depths, offsets, target, context_len, generated, output_len, slots)
 *     -> (lengths, committed, nodes) or None
 *
 * The simulated verifier's step (bastion.sim.backend.SimBatch.verify_batch) in one call:
 * accept()'s walk of B trees (offsets: B + 1 of them) against target (B rows of width tokens,
 * width = its length / B) and its lengths, committed tokens and accepted nodes (accept()'s last
 * three outputs, as bytes), then commit()'s updates of the three count arrays with the lengths.
 * None, changing nothing, unless all nine are C-contiguous int64, the first three of one
 * length, target of B rows, slots of B, and commit() would take the lengths (its conditions):
 * the caller's separate accept() and commit() then run on its converted arrays. Trees whose
 * offsets do not increase within the nodes raise accept()'s ValueError, changing nothing. */
PyObject *bf_verify(PyObject *self, PyObject *args) {
    PyObject *objs[9], *o_len = NULL, *o_com = NULL, *o_nod = NULL, *result = NULL;
    PyObject *pin = Py_None;
    char stack_on[4096], *on = NULL; /* one byte a node: on the stack up to 4096 nodes */
    if (!PyArg_ParseTuple(args, "OOOOOOOOO|O", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6], &objs[7], &objs[8], &pin))
        return NULL;
    Py_buffer v[9];
    int taken[9];
    int ok = int64_views(objs, 9, pinned_views(pin, objs, 5, v), v, taken);
    Py_ssize_t n = ok ? v[0].len / 8 : 0, b = ok ? v[3].len / 8 - 1 : 0;
    Py_ssize_t width = b > 0 ? v[4].len / 8 / b : 0, slots_n = ok ? v[5].len / 8 : 0;
    const int64_t *offsets = ok ? (const int64_t *)v[3].buf : NULL;
    if (ok && (b < 1 || width < 1 || v[1].len != v[0].len || v[2].len != v[0].len ||
               v[4].len != b * width * 8 || v[8].len != b * 8 || v[5].readonly ||
               v[6].readonly || v[6].len != v[5].len || v[7].len != v[5].len))
        ok = 0;
    if (ok && (offsets[0] != 0 || offsets[b] != n)) ok = 0; /* accept()'s size error: numpy's */
    if (ok) {
        const int64_t *slots = (const int64_t *)v[8].buf;
        for (Py_ssize_t i = 0; i < b && ok; i++) /* commit()'s slot check, before the walk */
            if (slots[i] < 0 || slots[i] >= slots_n) ok = 0;
        if (ok) {
            on = n <= (Py_ssize_t)sizeof(stack_on) ? stack_on : (char *)PyMem_Malloc((size_t)n);
            o_len = PyBytes_FromStringAndSize(NULL, b * 8);
            if (on == NULL || o_len == NULL) {
                if (on == NULL) PyErr_NoMemory();
                goto done;
            }
            int64_t *lengths = (int64_t *)PyBytes_AS_STRING(o_len);
            Py_ssize_t accepted =
                bf_accept_walk((const int64_t *)v[0].buf, (const int64_t *)v[1].buf,
                               (const int64_t *)v[2].buf, offsets, (const int64_t *)v[4].buf, b,
                               n, width, on, NULL, lengths);
            if (accepted < 0) goto done;
            o_com = PyBytes_FromStringAndSize(NULL, (accepted + b) * 8);
            o_nod = PyBytes_FromStringAndSize(NULL, accepted * 8);
            if (o_com == NULL || o_nod == NULL) goto done;
            bf_accept_emit((const int64_t *)v[1].buf, offsets, (const int64_t *)v[4].buf, b,
                           width, on, lengths, (int64_t *)PyBytes_AS_STRING(o_com),
                           (int64_t *)PyBytes_AS_STRING(o_nod));
            /* commit()'s updates with the lengths (declined, changing nothing, on overflow) */
            if (commit_counts((int64_t *)v[5].buf, (int64_t *)v[6].buf,
                              (const int64_t *)v[7].buf, slots_n, slots, lengths, b)) {
                result = Py_BuildValue("(OOO)", o_len, o_com, o_nod);
                goto done;
            }
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (on != stack_on) PyMem_Free(on);
    Py_XDECREF(o_len);
    Py_XDECREF(o_com);
    Py_XDECREF(o_nod);
    release_views(v, taken, 9);
    return result;
}

/* gather(context_len, output_len, generated, slots, contexts, wanted, left, look, bt,
 *        prev_size, ids, last) -> int
 *
 * A serving step's per-request inputs (bastion.sim.serving's server, batch > 1), written into
 * the caller's arrays: contexts[i] = context_len[s], wanted[i] = output_len[s] - generated[s]
 * for s = slots[i]; left (None: skipped) left[i] = ((-look - contexts[i]) mod bt) + look, the
 * modulo a floor modulo (numpy's and Python's %: in [0, bt) for bt > 0); last (None: skipped,
 * prev_size and ids then ignored) last[i] = prev_size[ids[i]]. Returns the step's lookahead
 * block count, sum over i of ceil((contexts[i] + look) / bt) (KVCache.blocks_of(contexts,
 * look): the server's next count, here while the contexts are at hand, saving it a call and
 * a buffer request of contexts). The same whole numbers the numpy expressions give. -1,
 * writing nothing, unless every array is C-contiguous int64, the four outputs writable and as
 * long as slots (and ids), every slot and id in range, every context in [0, 2^62) and look in
 * [0, 2^61), bt in [1, 2^61), every count in (-2^62, 2^62), the block count below 2^63: the
 * caller's numpy path then runs. */
PyObject *bf_gather(PyObject *self, PyObject *args) {
    PyObject *objs[11], *pin = Py_None;
    long long look, bt;
    if (!PyArg_ParseTuple(args, "OOOOOOOLLOOO|O", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6], &look, &bt, &objs[7], &objs[8],
                          &objs[9], &pin))
        return NULL;
    /* objs: 0 context_len, 1 output_len, 2 generated, 3 slots, 4 contexts, 5 wanted, 6 left,
       7 prev_size, 8 ids, 9 last (6, and 7–9 together, may be None) */
    int with_left = objs[6] != Py_None, with_last = objs[9] != Py_None;
    Py_buffer v[10];
    int taken[10] = {0}; /* (none taken where the first checks fail) */
    unsigned skip = (with_left ? 0u : 1u << 6) | (with_last ? 0u : 7u << 7);
    int ok = bt >= 1 && bt < ((long long)1 << 61) && look >= 0 &&
             look < ((long long)1 << 61) &&
             int64_views(objs, 10, skip | pinned_views(pin, objs, 0, v), v, taken);
    int64_t blocks = 0; /* (each numerator below 2^62 + 2^62: no overflow before the sum's) */
    Py_ssize_t n = ok ? v[0].len / 8 : 0, b = ok ? v[3].len / 8 : 0;
    const int64_t lim = (int64_t)1 << 62;
    if (ok)
        ok = v[1].len == v[0].len && v[2].len == v[0].len && v[4].len == v[3].len &&
             v[5].len == v[3].len && !v[4].readonly && !v[5].readonly &&
             (!with_left || (v[6].len == v[3].len && !v[6].readonly)) &&
             (!with_last || (v[8].len == v[3].len && v[9].len == v[3].len && !v[9].readonly));
    if (ok) {
        const int64_t *ctx = (const int64_t *)v[0].buf, *out = (const int64_t *)v[1].buf;
        const int64_t *gen = (const int64_t *)v[2].buf, *slots = (const int64_t *)v[3].buf;
        Py_ssize_t m = with_last ? v[7].len / 8 : 0;
        const int64_t *ids = with_last ? (const int64_t *)v[8].buf : NULL;
        for (Py_ssize_t i = 0; i < b && ok; i++) {
            int64_t s = slots[i];
            ok = s >= 0 && s < n && ctx[s] >= 0 && ctx[s] < lim && out[s] > -lim &&
                 out[s] < lim && gen[s] > -lim && gen[s] < lim &&
                 (!with_last || (ids[i] >= 0 && ids[i] < m));
        }
        for (Py_ssize_t i = 0; i < b && ok; i++) /* contexts >= 0: C's / is a floor here */
            ok = !__builtin_add_overflow(blocks, (ctx[slots[i]] + look + bt - 1) / bt, &blocks);
        if (ok) {
            int64_t *contexts = (int64_t *)v[4].buf, *wanted = (int64_t *)v[5].buf;
            for (Py_ssize_t i = 0; i < b; i++) {
                int64_t s = slots[i];
                contexts[i] = ctx[s];
                wanted[i] = out[s] - gen[s];
            }
            if (with_left) {
                int64_t *left = (int64_t *)v[6].buf;
                for (Py_ssize_t i = 0; i < b; i++) {
                    int64_t r = (-(int64_t)look - contexts[i]) % (int64_t)bt;
                    left[i] = (r < 0 ? r + (int64_t)bt : r) + (int64_t)look;
                }
            }
            if (with_last) {
                const int64_t *prev = (const int64_t *)v[7].buf;
                int64_t *last = (int64_t *)v[9].buf;
                for (Py_ssize_t i = 0; i < b; i++) last[i] = prev[ids[i]];
            }
        }
    }
    release_views(v, taken, 10);
    return PyLong_FromLongLong(ok ? (long long)blocks : -1);
}

/* settle(prev_size, ids, sizes, committed, wanted) -> int
 *
 * A served step's closing bookkeeping (the server, batch > 1): prev_size[ids[i]] = sizes[i]
 * (prev_size None: skipped, sizes ignored) and the count of requests with committed[i] >=
 * wanted[i] (what reached its output), returned; -1, writing nothing, unless every array is
 * C-contiguous int64 of the batch's length (prev_size writable, any length, every id in its
 * range): the caller's numpy path then runs. Distinct ids (one a request): numpy's
 * fancy-indexed assignment. */
PyObject *bf_settle(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4]))
        return NULL;
    int with_prev = objs[0] != Py_None;
    Py_buffer v[5];
    int taken[5];
    int ok = int64_views(objs, 5, with_prev ? 0u : 5u, v, taken); /* prev_size and sizes */
    Py_ssize_t b = ok ? v[1].len / 8 : 0;
    if (ok)
        ok = v[3].len == v[1].len && v[4].len == v[1].len &&
             (!with_prev || (v[2].len == v[1].len && !v[0].readonly));
    long long done = -1;
    if (ok) {
        const int64_t *ids = (const int64_t *)v[1].buf, *committed = (const int64_t *)v[3].buf;
        const int64_t *wanted = (const int64_t *)v[4].buf;
        if (with_prev) {
            Py_ssize_t m = v[0].len / 8;
            for (Py_ssize_t i = 0; i < b && ok; i++) ok = ids[i] >= 0 && ids[i] < m;
            if (ok) {
                int64_t *prev = (int64_t *)v[0].buf;
                const int64_t *sizes = (const int64_t *)v[2].buf;
                for (Py_ssize_t i = 0; i < b; i++) prev[ids[i]] = sizes[i];
            }
        }
        if (ok) {
            done = 0;
            for (Py_ssize_t i = 0; i < b; i++) done += committed[i] >= wanted[i];
        }
    }
    release_views(v, taken, 5);
    return PyLong_FromLongLong(done);
}

/* mean_floor(values) -> int | None
 *
 * floor(sum(values) / n) of a non-empty C-contiguous int64 buffer (a step's contexts), the
 * whole number Python's sum(values.tolist()) // n gives; None where values is not such a
 * buffer or the sum leaves int64 (the caller then sums on Python ints). */
PyObject *bf_mean_floor(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (!int64_view(arg, &v)) Py_RETURN_NONE;
    Py_ssize_t n = v.len / 8;
    const int64_t *x = (const int64_t *)v.buf;
    int64_t s = 0;
    int ok = n > 0;
    for (Py_ssize_t i = 0; i < n && ok; i++) ok = !__builtin_add_overflow(s, x[i], &s);
    PyBuffer_Release(&v);
    if (!ok) Py_RETURN_NONE;
    int64_t q = s / (int64_t)n; /* C truncates; Python's // floors */
    if (s % (int64_t)n != 0 && s < 0) q -= 1;
    return PyLong_FromLongLong(q);
}
