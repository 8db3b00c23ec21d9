/* Quantised expert weights: int8 (one fp32 scale per row) and fp8 e4m3 (one fp32 scale
 * per blk x blk block), converted in registers; int4 (fp16 scales and zero points per
 * row and group) in em_int4.h, included at the end.
 *
 * GEMV (few tokens): weight bytes are widened and converted to fp32 next to the FMA, so
 * the weights stream from memory at one byte each. Activations use the plain layout
 * (no even/odd split: bytes widen in order). int8 dots are scaled by the row's scale
 * once at the end (it factors out of the sum); fp8 weights are scaled per block as they
 * are converted.
 *
 * e4m3 → fp32 exactly, without a table or a branch: the byte's 7 exponent/mantissa
 * bits moved to bits 7..13 of an fp16 (sign to bit 15) read as 2^-8 times the value —
 * normals and subnormals alike, e4m3's bias being fp16's minus 8 — and the hardware's
 * fp16 → fp32 conversion is exact (fp16 subnormals become fp32 normals: no microcode
 * assists). The block scale carries the 2^8: the exact value times the scale, rounded
 * once, as the dequantise-first reference computes it.
 * NOTE: e4m3fn's NaN bytes (0x7F, 0xFF) read as ±480; checkpoints hold none.
 *
 * GEMM (many tokens): the task's rows are dequantised into a per-thread scratch as bf16
 * with their scales folded in (the reference's fp32 weight rounded once more, to bf16:
 * the blocked path already rounds x and h so) and the bf16 blocked kernels run over whole
 * rows, the same tiles as bf16 weights (expert.c's em_gate_up_tiles / em_down_tiles). The
 * exact alternative (unscaled values, exact in bf16, a tile pass a scale block, each
 * partial sum scaled in fp32) was no faster on AMX (docs/benchmarks.md, 2026-12-04) and
 * took a path of its own; the extra rounding is 1/32 of e4m3's own.
 */
#ifndef EM_QUANT_H
#define EM_QUANT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EM_W_BF16 0
#define EM_W_INT8 1
#define EM_W_FP8 2
#define EM_W_INT4 3 /* group size in blk (em_int4.h) */
#define EM_W_MXFP4 4 /* e2m1 nibbles as int4's, an e8m0 exponent byte per 32 k (em_int4.h) */

/* Weights two to a byte (int4, mxfp4): em_int4.h's paths. */
static inline int em_nibbles(int wfmt) { return wfmt == EM_W_INT4 || wfmt == EM_W_MXFP4; }
#define EM_FP8_UNBIAS 256.0f /* the fp16 reading is 2^-8 times the value */

static inline float em_fp8_to_f32(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float f = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf((float)m, -9);
    return b & 0x80 ? -f : f;
}

/* The GEMV's walk over K in em_gemv4q_impl (the SIMD ones): one scale block after the
 * other (int8: a single block, the whole row), and within a block k steps of EM_QSTEP
 * running the statements `...`, with s0..s3 the 4 rows' block scales times 2^8 (int8:
 * 0, unused). A macro, not a function: the body's accumulators stay the caller's
 * registers, the code as if written out. Needs sc, blk, fp8 and K in scope. */
#define EM_QBLOCKS(...)                                                                                       \
    const int step = fp8 ? blk : K; /* a scale block (int8: the whole row) */                                 \
    for (int k0 = 0, kb = 0; k0 < K; k0 += step, kb++) {                                                      \
        const float s0 = fp8 ? sc[0][kb] * EM_FP8_UNBIAS : 0.0f, s1 = fp8 ? sc[1][kb] * EM_FP8_UNBIAS : 0.0f; \
        const float s2 = fp8 ? sc[2][kb] * EM_FP8_UNBIAS : 0.0f, s3 = fp8 ? sc[3][kb] * EM_FP8_UNBIAS : 0.0f; \
        const int k1 = K - k0 < step ? K : k0 + step;                                                         \
        for (int k = k0; k < k1; k += EM_QSTEP) {                                                             \
            __VA_ARGS__                                                                                       \
        }                                                                                                     \
    }

#if defined(EM_ISA_AVX512) || defined(EM_ISA_AMX)
#include <immintrin.h>
#define EM_QSTEP 16

/* 16 weights of row w from k (masked tail) → fp32; fp8 ones times `sc` (scale·2^120). */
static inline __attribute__((always_inline)) __m512 em_q16(const uint8_t *w, int k, int K, const int fp8, float sc) {
    /* NOTE: a plain load for whole steps (it folds into the widening instruction); the
     * masked load only for the tail */
    __m128i b = K - k >= 16 ? _mm_loadu_si128((const __m128i *)(w + k))
                            : _mm_maskz_loadu_epi8((__mmask16)((1u << (K - k)) - 1u), w + k);
    if (!fp8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    /* sign-extended byte << 7: the sign lands in bits 14 and 15; clear 14 */
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xBFFF));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(sc));
}

#define EM_QROW512(r)                                                              \
    {                                                                              \
        if ((k & 63) == 0) EM_PREFETCH(w[r] + k, pf); /* a line a prefetch */     \
        __m512 wv = em_q16(w[r], k, K, fp8, s##r);                                 \
        a##r##0 = _mm512_fmadd_ps(wv, x0, a##r##0);                                \
        if (nt > 1) a##r##1 = _mm512_fmadd_ps(wv, x1, a##r##1);                    \
        if (nt > 2) a##r##2 = _mm512_fmadd_ps(wv, x2, a##r##2);                    \
        if (nt > 3) a##r##3 = _mm512_fmadd_ps(wv, x3, a##r##3);                    \
    }

/* dots[r*nt + t] = sum_k w[r][k] * x_t[k] (fp8: w scaled per block by sc[r][k / blk]). */
static inline __attribute__((always_inline)) void em_gemv4q_impl(const uint8_t *const *w, const float *const *sc, int blk,
                                                                  const int fp8, const float *xs, int64_t xss, const int nt,
                                                                  int K, int64_t pf, float *dots) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512 a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    EM_QBLOCKS(
        /* NOTE: xs is zero-padded past K to a multiple of 32: whole loads stay in bounds. */
        __m512 x0 = _mm512_loadu_ps(xs + k), x1 = z, x2 = z, x3 = z;
        if (nt > 1) x1 = _mm512_loadu_ps(xs + xss + k);
        if (nt > 2) x2 = _mm512_loadu_ps(xs + 2 * xss + k);
        if (nt > 3) x3 = _mm512_loadu_ps(xs + 3 * xss + k);
        EM_QROW512(0) EM_QROW512(1) EM_QROW512(2) EM_QROW512(3))
    const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = _mm512_reduce_add_ps(acc[r][t]);
}

#ifndef EM_Q32
#define EM_Q32 1 /* A/B arm: 0 converts the blocked path's rows 16 values a step (the same bits) */
#endif

/* 16 weights from k (masked past K) → fp32 times the scale f: fp8 folds it into em_q16's
 * conversion, int8 multiplies after (em_q16 leaves int8 unscaled). */
static inline __attribute__((always_inline)) __m512 em_q16_scaled(const uint8_t *w, int k, int K, const int fp8, float f) {
    return fp8 ? em_q16(w, k, K, 1, f) : _mm512_mul_ps(em_q16(w, k, K, 0, 0.0f), _mm512_set1_ps(f));
}

/* n values of a row → bf16 with the scales folded in (the blocked path's rows): fp8, block
 * kb's sc[kb] (blk a multiple of 16); int8, the row's sc[0]. Each value is the reference's
 * fp32 dequantisation (one rounding) rounded once more, to bf16's nearest even. A scale
 * block at a time, 32 values a step (two conversions, one 2-to-1 rounding, no division a
 * step: ×1.5 the 16-value step's rate on the dev VM's AVX-512, the same bits), its last
 * values 16 at a time. */
static inline void em_q_to_bf16(const uint8_t *w, int n, const int fp8, const float *sc, int blk, uint16_t *out) {
    const int step = fp8 ? blk : n; /* a scale block (int8: the whole row) */
    for (int k0 = 0, kb = 0; k0 < n; k0 += step, kb++) {
        const float f = fp8 ? sc[kb] * EM_FP8_UNBIAS : sc[0];
        const int k1 = n - k0 < step ? n : k0 + step;
        int k = k0;
        for (; EM_Q32 && k + 32 <= k1; k += 32) {
            __m512 lo = em_q16_scaled(w, k, k1, fp8, f), hi = em_q16_scaled(w, k + 16, k1, fp8, f);
            _mm512_storeu_si512(out + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
        for (; k < k1; k += 16) {
            __m512 v = em_q16_scaled(w, k, k1, fp8, f);
            __mmask16 m = k1 - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k1 - k)) - 1u);
            _mm256_mask_storeu_epi16(out + k, m, (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
}

#elif defined(EM_ISA_AVX2)
#include <immintrin.h>
#define EM_QSTEP 8

static inline __attribute__((always_inline)) __m256 em_q8(const uint8_t *w, int k, int K, const int fp8, float sc) {
    __m128i b;
    if (K - k >= 8) {
        b = _mm_loadl_epi64((const __m128i *)(w + k));
    } else { /* tail: no masked byte loads in AVX2 */
        uint8_t buf[16] = {0};
        memcpy(buf, w + k, (size_t)(K - k));
        b = _mm_loadl_epi64((const __m128i *)buf);
    }
    if (!fp8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xBFFF));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(sc));
}

#define EM_QROW256(r)                                                              \
    {                                                                              \
        EM_PREFETCH(w[r] + k, pf);                                                 \
        __m256 wv = em_q8(w[r], k, K, fp8, s##r);                                  \
        a##r##0 = _mm256_fmadd_ps(wv, x0, a##r##0);                                \
        if (nt > 1) a##r##1 = _mm256_fmadd_ps(wv, x1, a##r##1);                    \
    }

static inline __attribute__((always_inline)) void em_gemv4q_impl(const uint8_t *const *w, const float *const *sc, int blk,
                                                                  const int fp8, const float *xs, int64_t xss, const int nt,
                                                                  int K, int64_t pf, float *dots) {
    const __m256 z = _mm256_setzero_ps();
    __m256 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
    EM_QBLOCKS(
        __m256 x0 = _mm256_loadu_ps(xs + k), x1 = z;
        if (nt > 1) x1 = _mm256_loadu_ps(xs + xss + k);
        EM_QROW256(0) EM_QROW256(1) EM_QROW256(2) EM_QROW256(3))
    const __m256 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = em_hsum256(acc[r][t]);
}

#else /* portable C */
#define EM_QSTEP 1

static inline __attribute__((always_inline)) void em_gemv4q_impl(const uint8_t *const *w, const float *const *sc, int blk,
                                                                  const int fp8, const float *xs, int64_t xss, const int nt,
                                                                  int K, int64_t pf, float *dots) {
    float acc[4][EM_NT] = {{0}};
    (void)pf;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < 4; r++) {
            float wk = fp8 ? em_fp8_to_f32(w[r][k]) * sc[r][k / blk] : (float)(int8_t)w[r][k];
            for (int t = 0; t < nt; t++) acc[r][t] += wk * xs[t * xss + k];
        }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = acc[r][t];
}
#endif

/* Constant token counts and format: the accumulators stay in registers, no branches. */
#define EM_GEMV4Q(name, fp8, nt)                                                                                  \
    static void name(const uint8_t *const *w, const float *const *sc, int blk, const float *xs, int64_t s, int K, \
                     int64_t pf, float *d) {                                                                      \
        em_gemv4q_impl(w, sc, blk, fp8, xs, s, nt, K, pf, d);                                                     \
    }
EM_GEMV4Q(em_gemv4q_i1, 0, 1)
EM_GEMV4Q(em_gemv4q_i2, 0, 2)
EM_GEMV4Q(em_gemv4q_f1, 1, 1)
EM_GEMV4Q(em_gemv4q_f2, 1, 2)
#if EM_NT >= 4
EM_GEMV4Q(em_gemv4q_i3, 0, 3)
EM_GEMV4Q(em_gemv4q_i4, 0, 4)
EM_GEMV4Q(em_gemv4q_f3, 1, 3)
EM_GEMV4Q(em_gemv4q_f4, 1, 4)
#endif

static void em_gemv4q(const uint8_t *const *w, const float *const *sc, int blk, int fp8, const float *xs, int64_t xss,
                      int nt, int K, int64_t pf, float *dots) {
    switch (nt * 2 + fp8) {
    case 2: em_gemv4q_i1(w, sc, blk, xs, xss, K, pf, dots); break;
    case 3: em_gemv4q_f1(w, sc, blk, xs, xss, K, pf, dots); break;
    case 4: em_gemv4q_i2(w, sc, blk, xs, xss, K, pf, dots); break;
    case 5: em_gemv4q_f2(w, sc, blk, xs, xss, K, pf, dots); break;
#if EM_NT >= 4
    case 6: em_gemv4q_i3(w, sc, blk, xs, xss, K, pf, dots); break;
    case 7: em_gemv4q_f3(w, sc, blk, xs, xss, K, pf, dots); break;
    case 8: em_gemv4q_i4(w, sc, blk, xs, xss, K, pf, dots); break;
    default: em_gemv4q_f4(w, sc, blk, xs, xss, K, pf, dots); break;
#endif
    }
}

/* A per-thread buffer for dequantised bf16 rows (GEMM path), grown as needed. */
static __thread uint16_t *em_scratch_buf;
static __thread size_t em_scratch_len;

static inline uint16_t *em_scratch(size_t n) {
    if (n > em_scratch_len) {
        free(em_scratch_buf);
        em_scratch_buf = (uint16_t *)aligned_alloc(64, (n * 2 + 63) / 64 * 64);
        em_scratch_len = em_scratch_buf ? n : 0;
    }
    return em_scratch_buf;
}

#include "em_int4.h"

#endif
