// Native attention of moespec's verification pass: n <= 16 new queries against the whole KV cache.
//
// Shape legend
//   B     batch                 n   queries per sequence (1..16)     L   keys (cached + new) per sequence
//   Hq    query heads           Hkv key/value heads (Hq a multiple: grouped-query attention, G = Hq / Hkv)
//   D     query/key head size   Dv  value head size (MLA's differ)
//   q     [B, Hq, n, D]   strides (q_sb, q_sh, q_sn) elements, last dim contiguous, fp32 or bf16
//   k     [B, Hkv, L, D]  strides (k_sb, k_sh, k_sl), last dim contiguous, q's dtype
//   v     [B, Hkv, L, Dv] strides (v_sb, v_sh, v_sl), last dim contiguous, q's dtype
//   mask  [B, n, L] bytes (nonzero: attend), strides (m_sb, m_si, m_sj), or null: query i attends keys
//         0 .. L - n + i (causal, the new queries being the last n positions)
//   out   [B, n, Hq, Dv] contiguous, q's dtype: softmax(scale q k^T + mask) v, per head
//
// Physics. A verify pass of n tokens at depth d reads every layer's cached keys and values once: at the demo's
// depth of 512 (16 heads of 128, bf16) 4 MB per layer, ~0.13 ms at this machine's ~30 GB/s. The work per byte
// is n G multiply-adds per key element, so up to n of 16 the pass is a stream of K and V. torch's CPU flash
// attention is built for long query blocks: at n = 1 it takes ~0.9 ms for those 4 MB here. This kernel reads
// each key and value row once per (sequence, kv head) task and applies it to all G n query rows held in L1,
// accumulating in fp32: pass 1 streams K into the scores (8 query rows a key row, 8 independent FMA chains), a
// row-wise softmax, pass 2 streams V into the output (blocks of 3 rows x 32 columns in registers over all keys).
// Past a few query rows those multiply-adds, not the bytes, set the time (n = 9 at 521 keys: ~0.5 ms, hot, 16 heads
// of 128 on two cores of an AVX-512 Xeon); on a CPU with AMX a bf16 task of kAmxMinRows rows or more runs both passes
// on the tiles (amx_tiles.h): ~0.25 ms there. Tasks (one per sequence and kv head) are shared by the OpenMP threads.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"
#include "simd_common.h"

namespace {

using namespace moespec_simd;  // bf16, to_f32, to_bf16, load8, hsum
using namespace moespec_amx;   // the AMX tiles (amx_tiles.h)

constexpr int64_t kMaxQueries = 16;
constexpr int kLanes = 8;

// exp on 8 lanes (Cephes' single-precision polynomial, relative error ~2e-7 on the softmax's range x <= 0);
// -inf and anything below -87 give 0, so masked scores drop out exactly.
inline __m256 exp8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
}

inline float exp1(float x) {  // the scalar tail, through the same polynomial
    alignas(32) float lane[kLanes] = {x};
    _mm256_store_ps(lane, exp8(_mm256_load_ps(lane)));
    return lane[0];
}

// Query rows one key row is applied to at once: 8 independent FMA chains keep both FMA pipes busy (one row's single
// chain waits on the FMA's latency at every step), and each widened key vector feeds 8 FMAs.
constexpr int kScoreRows = 8;

// The eight sums of a[0..7], in order.
inline __m256 hsum8(const __m256* a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // per 128-bit half: sums of 0-3, 4-7
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// dots[i] = <qf row i, kj> for i < rows (<= kScoreRows; qf rows of D fp32, contiguous). Fewer rows keep more chains
// per row (RB x A >= 8).
template <typename T, int RB>
void score_rows(const T* kj, const float* qf, int64_t D, float* dots) {
    constexpr int A = RB >= 5 ? 1 : RB >= 3 ? 2 : 8 / RB;  // chains per row: RB x A <= 8
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + kLanes * A <= D; c += kLanes * A)
        _Pragma("GCC unroll 8") for (int a = 0; a < A; ++a) {
            const __m256 kv = load8(kj + c + a * kLanes);
            _Pragma("GCC unroll 8") for (int i = 0; i < RB; ++i)
                acc[i * A + a] = _mm256_fmadd_ps(_mm256_loadu_ps(qf + i * D + c + a * kLanes), kv, acc[i * A + a]);
        }
    for (; c + kLanes <= D; c += kLanes) {
        const __m256 kv = load8(kj + c);
        _Pragma("GCC unroll 8") for (int i = 0; i < RB; ++i)
            acc[i * A] = _mm256_fmadd_ps(_mm256_loadu_ps(qf + i * D + c), kv, acc[i * A]);
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, hsum8(acc));
    for (int i = 0; i < RB; ++i) {
        float dot = 0.0f;
        for (int a = 0; a < A; ++a) dot += sums[i * A + a];
        for (int64_t t = c; t < D; ++t) dot += qf[i * D + t] * to_f32(kj[t]);
        dots[i] = dot;
    }
}

template <typename T>
void scores(const T* kj, const float* qf, int64_t D, int rows, float* dots) {
    switch (rows) {
        case 1: return score_rows<T, 1>(kj, qf, D, dots);
        case 2: return score_rows<T, 2>(kj, qf, D, dots);
        case 3: return score_rows<T, 3>(kj, qf, D, dots);
        case 4: return score_rows<T, 4>(kj, qf, D, dots);
        case 5: return score_rows<T, 5>(kj, qf, D, dots);
        case 6: return score_rows<T, 6>(kj, qf, D, dots);
        case 7: return score_rows<T, 7>(kj, qf, D, dots);
        default: return score_rows<T, 8>(kj, qf, D, dots);
    }
}

// Value rows' blocks: kValueRows query rows x kValueCols columns (4 vectors, a cache line of bf16 values): 12
// accumulators, and each value vector loaded feeds kValueRows FMAs where a row at a time loads and stores its sums
// at every key.
constexpr int kValueRows = 3;
constexpr int64_t kValueCols = 4 * kLanes;

// acc[i * lda + c0 + c] = sum_j p[i * L + j] v[j * v_sl + c0 + c] for i < RB and c < 8 CV.
template <typename T, int RB, int CV>
void value_block(const T* v, int64_t v_sl, int64_t L, const float* p, int64_t c0, float* acc, int64_t lda) {
    __m256 a[RB][CV];
    for (int i = 0; i < RB; ++i)
        for (int q = 0; q < CV; ++q) a[i][q] = _mm256_setzero_ps();
    for (int64_t j = 0; j < L; ++j) {
        __m256 vv[CV];
        _Pragma("GCC unroll 4") for (int q = 0; q < CV; ++q) vv[q] = load8(v + j * v_sl + c0 + q * kLanes);
        _Pragma("GCC unroll 4") for (int i = 0; i < RB; ++i) {
            const __m256 pi = _mm256_broadcast_ss(p + i * L + j);
            _Pragma("GCC unroll 4") for (int q = 0; q < CV; ++q) a[i][q] = _mm256_fmadd_ps(pi, vv[q], a[i][q]);
        }
    }
    for (int i = 0; i < RB; ++i)
        for (int q = 0; q < CV; ++q) _mm256_storeu_ps(acc + i * lda + c0 + q * kLanes, a[i][q]);
}

// value_block for 1..kValueRows rows, kValueCols columns (`wide`) or one vector of them.
template <typename T>
void values(const T* v, int64_t v_sl, int64_t L, const float* p, int64_t c0, float* acc, int64_t lda, int rows,
            bool wide) {
    static_assert(kValueRows == 3 && kValueCols == 4 * kLanes, "dispatches blocks of 1 to 3 rows, 4 or 1 vectors");
    switch (rows * 2 + wide) {
        case 2: return value_block<T, 1, 1>(v, v_sl, L, p, c0, acc, lda);
        case 3: return value_block<T, 1, 4>(v, v_sl, L, p, c0, acc, lda);
        case 4: return value_block<T, 2, 1>(v, v_sl, L, p, c0, acc, lda);
        case 5: return value_block<T, 2, 4>(v, v_sl, L, p, c0, acc, lda);
        case 6: return value_block<T, 3, 1>(v, v_sl, L, p, c0, acc, lda);
        default: return value_block<T, 3, 4>(v, v_sl, L, p, c0, acc, lda);
    }
}

struct Args {
    int64_t B, Hq, Hkv, n, L, D, Dv;
    const void *q, *k, *v;
    int64_t q_sb, q_sh, q_sn, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl;
    const uint8_t* mask;
    int64_t m_sb, m_si, m_sj;
    float scale;
    void* out;
};

// Query rows of a kv head (G n) from which a bf16 task runs on the AMX tiles where the CPU has them (amx_tiles.h):
// pass 1 multiplies 16 cached key rows, loaded in place, by the packed query rows per tdpbf16ps, pass 2 the bf16
// probabilities by the values packed in pairs of keys (rounded to bf16 before that product, as torch's CPU flash
// attention rounds them for a bf16 model: aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, qk_reduced)
constexpr int64_t kAmxMinRows = 4;

// Per-thread buffers, reused across a thread's tasks.
struct Scratch {
    std::vector<float> qf, s, acc, total, sums;
    std::vector<bf16> qp, pb, vp;
    std::vector<const bf16*> rows;
};

// One task: sequence b, kv head g, its G query heads x n queries = R rows.
template <typename T>
void task(const Args& A, int64_t b, int64_t g, Scratch& w) {
    const int64_t G = A.Hq / A.Hkv, n = A.n, L = A.L, D = A.D, Dv = A.Dv, R = G * n;
    const T* q = static_cast<const T*>(A.q) + b * A.q_sb;
    const T* k = static_cast<const T*>(A.k) + b * A.k_sb + g * A.k_sh;
    const T* v = static_cast<const T*>(A.v) + b * A.v_sb + g * A.v_sh;
    bool tiles = false;
    if constexpr (std::is_same_v<T, bf16>)
        tiles = R >= kAmxMinRows && D % kAmxCols == 0 && Dv % kAmxCols == 0 && amx_ready();
    const int64_t R16 = (R + kAmxRows - 1) / kAmxRows * kAmxRows, L32 = (L + kAmxCols - 1) / kAmxCols * kAmxCols;
    // the tiles' dot products are of the unscaled q (scale after); the vector path scales q up front
    const float pre = tiles ? 1.0f : A.scale, post = tiles ? A.scale : 1.0f;
    std::vector<float>& qf = w.qf;
    std::vector<float>& s = w.s;
    std::vector<float>& acc = w.acc;
    s.resize(R * L);
    acc.resize(R16 * Dv);  // every entry of the first R rows written by pass 2
    auto query = [&](int64_t r) { return q + (g * G + r / n) * A.q_sh + r % n * A.q_sn; };  // row r = h n + i
    // Pass 1: scores s[r][j] = scale q_r . k_j, -inf where masked; each key row read once for all R rows: on the tiles
    // the whole 16-row tiles of keys, the rest in blocks of up to kScoreRows query rows (scores) on q in fp32.
    int64_t first = 0;  // the first key the vector path scores
    if constexpr (std::is_same_v<T, bf16>)
        if (tiles) {
            w.rows.resize(R);
            for (int64_t r = 0; r < R; ++r) w.rows[r] = query(r);
            w.qp.resize(R16 * D);
            w.sums.resize(4 * kAmxRows * kAmxTokens);
            amx_pack(w.rows.data(), R, D, w.qp.data());
            first = amx_rows(k, D, A.k_sl, 0, L, w.qp.data(), R, s.data(), L, w.sums.data());
        }
    const float ninf = -std::numeric_limits<float>::infinity();
    auto attends = [&](int64_t r, int64_t j) {
        const int64_t qi = r % n;
        return A.mask ? A.mask[b * A.m_sb + qi * A.m_si + j * A.m_sj] != 0 : j <= L - n + qi;
    };
    for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < first; ++j) s[r * L + j] = attends(r, j) ? s[r * L + j] * post : ninf;
    if (first < L) {
        qf.resize(R * D);
        for (int64_t r = 0; r < R; ++r)
            for (int64_t c = 0; c < D; ++c) qf[r * D + c] = to_f32(query(r)[c]) * pre;
    }
    for (int64_t j = first; j < L; ++j) {
        const T* kj = k + j * A.k_sl;
        for (int64_t r0 = 0; r0 < R; r0 += kScoreRows) {
            float dots[kScoreRows];
            const int rows = static_cast<int>(std::min<int64_t>(kScoreRows, R - r0));
            scores(kj, qf.data() + r0 * D, D, rows, dots);
            for (int i = 0; i < rows; ++i) s[(r0 + i) * L + j] = attends(r0 + i, j) ? dots[i] * post : ninf;
        }
    }
    // Softmax per row: p = exp(s - max), the sum kept for the end; a row with no key attended gives zeros.
    std::vector<float>& total = w.total;
    total.resize(R);
    const int64_t L8 = L - L % kLanes;
    for (int64_t r = 0; r < R; ++r) {
        float* sr = s.data() + r * L;
        float top = ninf;
        for (int64_t j = 0; j < L; ++j) top = std::max(top, sr[j]);
        if (top == ninf) {
            for (int64_t j = 0; j < L; ++j) sr[j] = 0.0f;
            total[r] = 0.0f;
            continue;
        }
        const __m256 m8 = _mm256_set1_ps(top);
        __m256 sum8 = _mm256_setzero_ps();
        for (int64_t j = 0; j < L8; j += kLanes) {
            __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), m8));
            _mm256_storeu_ps(sr + j, p);
            sum8 = _mm256_add_ps(sum8, p);
        }
        float sum = hsum(sum8);
        for (int64_t j = L8; j < L; ++j) {
            sr[j] = exp1(sr[j] - top);
            sum += sr[j];
        }
        total[r] = sum;
    }
    // Pass 2: acc[r] = sum_j p[r][j] v_j. On the tiles: p rounded to bf16 into [R16, L32] (zero past R and L), the
    // values packed in pairs of keys. Else in blocks of up to kValueRows rows x kValueCols columns held in registers
    // over all L keys (the value rows stay in L2 between the blocks); the last Dv % 8 columns one at a time.
    if constexpr (std::is_same_v<T, bf16>)
        if (tiles) {
            w.pb.assign(R16 * L32, 0);
            for (int64_t r = 0; r < R; ++r)
                for (int64_t j = 0; j < L; ++j) w.pb[r * L32 + j] = to_bf16(s[r * L + j]);
            w.vp.resize(L32 * Dv);
            amx_pack_pairs(v, A.v_sl, L, Dv, w.vp.data());
            amx_values(w.pb.data(), L32, R, L, w.vp.data(), Dv, acc.data());
        }
    const int64_t V8 = Dv - Dv % kLanes;
    for (int64_t r0 = 0; r0 < R && !tiles; r0 += kValueRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kValueRows, R - r0));
        int64_t c0 = 0;
        for (; c0 + kValueCols <= V8; c0 += kValueCols) values(v, A.v_sl, L, s.data() + r0 * L, c0, acc.data() + r0 * Dv, Dv, rows, true);
        for (; c0 < V8; c0 += kLanes) values(v, A.v_sl, L, s.data() + r0 * L, c0, acc.data() + r0 * Dv, Dv, rows, false);
        for (int64_t r = r0; r < r0 + rows; ++r)
            for (int64_t c = V8; c < Dv; ++c) {
                float y = 0.0f;
                for (int64_t j = 0; j < L; ++j) y += s[r * L + j] * to_f32(v[j * A.v_sl + c]);
                acc[r * Dv + c] = y;
            }
    }
    T* out = static_cast<T*>(A.out);
    for (int64_t h = 0; h < G; ++h)
        for (int64_t i = 0; i < n; ++i) {
            const int64_t r = h * n + i;
            const float inv = total[r] > 0.0f ? 1.0f / total[r] : 0.0f;
            T* o = out + ((b * n + i) * A.Hq + g * G + h) * Dv;
            for (int64_t c = 0; c < Dv; ++c) {
                const float y = acc[r * Dv + c] * inv;
                if constexpr (std::is_same_v<T, float>) o[c] = y; else o[c] = to_bf16(y);
            }
        }
}

template <typename T>
void run(const Args& A, int threads) {
    const int64_t tasks = A.B * A.Hkv;
#pragma omp parallel num_threads(threads)
    {
        Scratch w;  // per thread, reused across its tasks
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) task<T>(A, t / A.Hkv, t % A.Hkv, w);
    }
}

}  // namespace

extern "C" {

// Bumped whenever the signature of an exported function changes (the loader checks it).
int moespec_attention_abi_version() { return 1; }

// 0 on success; 1 bad dtype code, 2 bad sizes (see the legend), 3 a null pointer.
int moespec_attention(int dtype, int64_t B, int64_t Hq, int64_t Hkv, int64_t n, int64_t L, int64_t D, int64_t Dv,
                      const void* q, int64_t q_sb, int64_t q_sh, int64_t q_sn,
                      const void* k, int64_t k_sb, int64_t k_sh, int64_t k_sl,
                      const void* v, int64_t v_sb, int64_t v_sh, int64_t v_sl,
                      const uint8_t* mask, int64_t m_sb, int64_t m_si, int64_t m_sj,
                      float scale, void* out, int threads) {
    if (dtype != 0 && dtype != 1) return 1;
    if (B < 1 || Hkv < 1 || Hq < Hkv || Hq % Hkv || n < 1 || n > kMaxQueries || L < 1 || D < 1 || Dv < 1)
        return 2;
    if (!q || !k || !v || !out) return 3;
    const Args A{B, Hq, Hkv, n, L, D, Dv, q, k, v, q_sb, q_sh, q_sn, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl,
                 mask, m_sb, m_si, m_sj, scale, out};
    threads = threads < 1 ? 1 : threads;
    if (dtype == 0) run<float>(A, threads); else run<bf16>(A, threads);
    return 0;
}

}  // extern "C"
