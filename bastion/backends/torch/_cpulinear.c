/*
 * bastion.backends.torch._cpulinear: a weight-streaming matrix product for the CPU, y = x W^T.
 *
 * Why: on a CPU, PyTorch's fp32 products with a few rows (a decode step: 1 row; a verify pass:
 * 8-64 rows) pack the whole weight matrix at every call and run far below both the memory's
 * bandwidth and the cores' arithmetic (measured on the demo's target: 16 rows cost 1.8x one
 * row). A GPU streams its weights once per pass whatever the row count, which is the regime
 * speculative decoding lives in. This kernel streams each weight row once per call and
 * multiplies it against every input row while it is in registers.
 *
 * Exactness: y[m, n] is the dot product of x[m, :] and W[n, :], summed in the same order (16
 * lanes of fused multiply-adds over k, then one fixed lane reduction) whatever the number of
 * rows, the row's position in the batch or the thread that computes it: the product is batch
 * invariant, so a token's linear layers give the same bits in a one-token pass and in a
 * 64-token verify pass (attention and the rest of the model are PyTorch's). Weights may be stored as bf16
 * when every value is exactly a bf16 (the shipped pairs are stored that way): the kernel widens
 * them exactly, so the result equals the fp32 weights' result bit for bit, at half the bytes.
 *
 * linear_nt(x, w, y, M, N, K, w_bf16): addresses of C-contiguous buffers x (M x K float32),
 *   w (N x K, float32 or bf16), y (M x N float32, written); K a multiple of 16. The caller
 *   (cpu_linear.py) checks shapes, dtypes, contiguity and lifetimes; the GIL is released.
 * available() -> bool: whether this machine has the instructions (AVX-512 F and BW, or else
 *   AVX2 and FMA: a second, 8-lane kernel with its own summation order).
 *
 * Threads: OpenMP over blocks of weight rows, in the OpenMP runtime PyTorch already loaded, so
 * torch.set_num_threads governs both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_KERNEL 1
#define TGT __attribute__((target("avx512f,avx512bw")))
#define NB 4 /* weight rows per block: NB x MB accumulators stay in the 32 vector registers */
#define MB_MAX 6

#define TGT2 __attribute__((target("avx2,fma")))
#define NB2 2

/* NBK weight rows starting at n0 (nb of them real) against MB input rows, in vectors of type VEC
 * with LANES floats: one definition for both instruction sets (below). */
#define MICRO(NAME, TARGET, VEC, NBK, LANES, ZERO, LOAD, FMADD, WIDEN, REDUCE, MB)                \
    TARGET static void NAME##_##MB(const float *x, long K, const void *wv, int bf16, long n0,   \
                                   int nb, float *y, long N) {                                 \
        VEC acc[NBK][MB];                                                                      \
        for (int j = 0; j < NBK; j++)                                                          \
            for (int i = 0; i < MB; i++) acc[j][i] = ZERO();                                   \
        const float *wf = (const float *)wv;                                                   \
        const uint16_t *wh = (const uint16_t *)wv;                                             \
        for (long k = 0; k < K; k += LANES) {                                                  \
            VEC w[NBK];                                                                        \
            for (int j = 0; j < NBK; j++) {                                                    \
                long r = n0 + (j < nb ? j : 0); /* a missing row repeats a real one */         \
                if (bf16)                                                                      \
                    w[j] = WIDEN(wh + r * K + k);                                              \
                else                                                                           \
                    w[j] = LOAD(wf + r * K + k);                                               \
            }                                                                                  \
            for (int i = 0; i < MB; i++) {                                                     \
                VEC xv = LOAD(x + i * K + k);                                                  \
                for (int j = 0; j < NBK; j++) acc[j][i] = FMADD(w[j], xv, acc[j][i]);          \
            }                                                                                  \
        }                                                                                      \
        for (int j = 0; j < nb; j++)                                                           \
            for (int i = 0; i < MB; i++) y[i * N + n0 + j] = REDUCE(acc[j][i]);                \
    }

/* bf16 weights widened exactly to fp32 (a bf16 is the top half of its float) */
#define WIDEN512(p)                                                                            \
    _mm512_castsi512_ps(                                                                       \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define WIDEN256(p)                                                                            \
    _mm256_castsi256_ps(                                                                       \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))

/* The kernel for CPUs with AVX2 and FMA but no AVX-512: 8 lanes, 16 vector registers, so 2
 * weight rows per block (2 x 6 accumulators, 2 weights and an input row in registers). Its
 * summation order (8 lanes over k, then a fixed lane reduction) differs from the AVX-512
 * kernel's, so results differ between such machines; on one machine it is batch invariant. */
TGT2 static inline float reduce8(__m256 v) { /* ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define MICRO512(MB)                                                                           \
    MICRO(micro, TGT, __m512, NB, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_fmadd_ps,     \
          WIDEN512, _mm512_reduce_add_ps, MB)
#define MICRO256(MB)                                                                           \
    MICRO(micro2, TGT2, __m256, NB2, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps,   \
          WIDEN256, reduce8, MB)
MICRO512(1)
MICRO512(2)
MICRO512(3)
MICRO512(4)
MICRO512(5)
MICRO512(6)
MICRO256(1)
MICRO256(2)
MICRO256(3)
MICRO256(4)
MICRO256(5)
MICRO256(6)

typedef void (*micro_fn)(const float *, long, const void *, int, long, int, float *, long);
static const micro_fn MICROS[MB_MAX + 1] = {0, micro_1, micro_2, micro_3, micro_4, micro_5, micro_6};
static const micro_fn MICROS2[MB_MAX + 1] = {0,        micro2_1, micro2_2, micro2_3,
                                             micro2_4, micro2_5, micro2_6};

/* 2: AVX-512 F and BW, 1: AVX2 and FMA, 0: neither; asked of the CPU once (with the GIL held) */
static int isa_level(void) {
    static int level = -1;
    if (level < 0) {
        __builtin_cpu_init();
        level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 2
                : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")       ? 1
                                                                                         : 0;
    }
    return level;
}

static void linear_nt_run(const float *x, const void *w, float *y, long M, long N, long K,
                          int bf16, int wide) {
    const micro_fn *micros = wide ? MICROS : MICROS2;
    const long nbk = wide ? NB : NB2;
    long blocks = (N + nbk - 1) / nbk;
#pragma omp parallel for schedule(static)
    for (long b = 0; b < blocks; b++) {
        long n0 = b * nbk;
        int nb = (int)(N - n0 < nbk ? N - n0 : nbk);
        for (long m0 = 0; m0 < M; m0 += MB_MAX) {
            long mb = M - m0 < MB_MAX ? M - m0 : MB_MAX;
            micros[mb](x + m0 * K, K, w, bf16, n0, nb, y + m0 * N, N);
        }
    }
}

static int machine_has_kernel(void) { return isa_level() > 0; }
#else
#define HAVE_KERNEL 0
#endif

static PyObject *cl_available(PyObject *self, PyObject *unused) {
#if HAVE_KERNEL
    return PyBool_FromLong(machine_has_kernel());
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *cl_linear_nt(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "linear_nt takes 7 arguments (x, w, y, M, N, K, w_bf16)");
        return NULL;
    }
    void *ptr[3];
    long dims[4];
    for (int i = 0; i < 3; i++) {
        ptr[i] = PyLong_AsVoidPtr(args[i]);
        if (ptr[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null buffer address");
            return NULL;
        }
    }
    for (int i = 0; i < 4; i++) {
        dims[i] = PyLong_AsLong(args[3 + i]);
        if (dims[i] == -1 && PyErr_Occurred()) return NULL;
    }
    long M = dims[0], N = dims[1], K = dims[2];
    if (M < 1 || N < 1 || K < 16 || K % 16 != 0) {
        PyErr_SetString(PyExc_ValueError, "linear_nt needs M, N >= 1 and K a positive multiple of 16");
        return NULL;
    }
#if HAVE_KERNEL
    const int level = isa_level();
    if (level == 0) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU lacks AVX-512 and AVX2 (check available() first)");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    linear_nt_run((const float *)ptr[0], ptr[1], (float *)ptr[2], M, N, K, dims[3] != 0, level == 2);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "built without the x86-64 kernel (check available() first)");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"available", cl_available, METH_NOARGS, "Whether this machine has the kernel's instructions."},
    {"linear_nt", (PyCFunction)(void (*)(void))cl_linear_nt, METH_FASTCALL,
     "y = x W^T on C-contiguous buffers (see the module comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpulinear",
                                    "A weight-streaming, batch-invariant CPU matrix product.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__cpulinear(void) { return PyModule_Create(&module); }
