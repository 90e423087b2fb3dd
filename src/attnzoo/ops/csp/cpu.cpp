// Fused CPU kernels for CSP eq 4, forward and backward: without masks groups of two tokens (G = 2, csp_pairs); with
// padding masks or packed rows any group size (csp_varlen, at the end of this file).
//
// Why: the PyTorch small-group path (small.py) makes about ten passes over the (B, N, C) values: a transpose
// to (B, C, N), the per-channel shift (eq 3) as slice copies, two comparisons, the bitwise swap (four
// passes) and a transpose back. Here a task is (sample, tile of kTile channels) and walks the tokens in blocks
// of kBlock, each in three steps that stay in L1/L2: (1) read the tile's columns, each channel from its own
// shifted start, into per-channel runs; (2) per pair of tokens, compare-and-swap each channel, placed by the
// reference channel's order, and note the swaps (one bit per pair and channel, for the backward); (3) write the
// block's output rows. The values cross memory once in and once out, and are checked for NaN/Inf on the way (the op's
// finiteness check, without a pass of its own). With AVX-512 (float32) a tile is one vector and
// each pair is two gathers, a compare and two row stores, with no transposition at all (see below).
// The reference channel's order (channel 0, shifted) is one byte per pair and sample, computed first.
// Tie rule as the reference (a stable sort): strict '>' on both sides, so equal values keep their order.
// Values are only moved, never computed: the output is bit-exact.

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

using at::Tensor;

namespace {

// channels per task: 16 float32 values are one 64-byte line of a token's row
constexpr int64_t kTile = 16;  // also the bits of a swap mask word (uint16)

void check_args(const Tensor& x, const Tensor& shifts, const char* name) {
  TORCH_CHECK(x.dim() == 3, name, " must be (B, N, C), got ", x.dim(), " dimensions");
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.size(1) % 2 == 0, "groups of two need an even N, got N = ", x.size(1));
  TORCH_CHECK(shifts.scalar_type() == at::kLong && shifts.dim() == 1 && shifts.size(0) == x.size(2) &&
                  shifts.is_contiguous(),
              "shifts must be a contiguous int64 (C,) tensor");
  const int64_t n = x.size(1);
  const int64_t* j = shifts.data_ptr<int64_t>();
  for (int64_t c = 0; c < shifts.size(0); ++c)
    TORCH_CHECK(j[c] >= 0 && j[c] < n, "shifts must lie in [0, N) = [0, ", n, "), got ", j[c], " at channel ", c);
}

// ref[b * K + k] = 1 where the shifted reference channel (channel 0) is descending in pair k of sample b
template <typename T>
void reference_order(const T* v, const int64_t* J, uint8_t* ref, int64_t B, int64_t N, int64_t C) {
  const int64_t K = N / 2;
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const T* vb = v + b * N * C;
      int64_t src = (N - J[0]) % N;  // u_0[m] = v[(m - J_0) mod N, 0]
      for (int64_t k = 0; k < K; ++k) {
        const T x = vb[src * C];
        src = src + 1 == N ? 0 : src + 1;
        const T y = vb[src * C];
        src = src + 1 == N ? 0 : src + 1;
        ref[b * K + k] = static_cast<uint8_t>(x > y);
      }
    }
  });
}

// Tokens per block: a block's 16 channels x kBlock values (in and out) stay in L1/L2 between the three steps.
constexpr int64_t kBlock = 512;

// lb[j][i] = x[(s0_j + i) mod N][j] for i < len: channel j's values from token s0_j on (a strided column read,
// split where it wraps around the end of the sequence)
template <typename T>
inline void gather_columns(const T* x, int64_t N, int64_t C, const int64_t* s0, int64_t tc, int64_t len, T* lb) {
  for (int64_t j = 0; j < tc; ++j) {
    const T* col = x + j;
    T* dst = lb + j * kBlock;
    int64_t s = s0[j];
    int64_t i = 0;
    while (i < len) {
      const int64_t run = std::min(len - i, N - s);
      for (int64_t r = 0; r < run; ++r) dst[i + r] = col[(s + r) * C];
      i += run;
      s = 0;
    }
  }
}

// y[(s0_j + i) mod N][j] = ob[j][i] for i < len (the inverse of gather_columns)
template <typename T>
inline void scatter_columns(const T* ob, int64_t N, int64_t C, const int64_t* s0, int64_t tc, int64_t len, T* y) {
  for (int64_t j = 0; j < tc; ++j) {
    T* col = y + j;
    const T* src = ob + j * kBlock;
    int64_t s = s0[j];
    int64_t i = 0;
    while (i < len) {
      const int64_t run = std::min(len - i, N - s);
      for (int64_t r = 0; r < run; ++r) col[(s + r) * C] = src[i + r];
      i += run;
      s = 0;
    }
  }
}

// no shift: the tile's rows as they are, for gather_columns / scatter_columns
constexpr int64_t kNoShift[kTile] = {0};

// f(t, b, c0, tc, lb, ob, s0) for each tile t of batch row b: its tc <= kTile channels from c0. The tiles run in
// parallel, each thread with its own scratch: the blocks lb and ob (kTile x kBlock) and the shifts s0 (kTile).
template <typename T, typename F>
void for_each_tile(int64_t B, int64_t C, F&& f) {
  const int64_t tiles = (C + kTile - 1) / kTile;
  at::parallel_for(0, B * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> lb(kTile * kBlock), ob(kTile * kBlock);
    int64_t s0[kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = (t % tiles) * kTile;
      f(t, t / tiles, c0, std::min(kTile, C - c0), lb.data(), ob.data(), s0);
    }
  });
}

template <typename T>
void pairs_forward(const T* v, const int64_t* J, const uint8_t* ref, T* out, uint16_t* swap, int64_t B, int64_t N,
                   int64_t C) {
  const int64_t K = N / 2;
  for_each_tile<T>(B, C, [&](int64_t t, int64_t b, int64_t c0, int64_t tc, T* lb, T* ob, int64_t* s0) {
    const T* vb = v + b * N * C + c0;
    T* outb = out + b * N * C + c0;
    const uint8_t* rb = ref + b * K;
    for (int64_t m0 = 0; m0 < N; m0 += kBlock) {
      const int64_t len = std::min(kBlock, N - m0);
      // (1) u_c[m] = v[(m - J_c) mod N][c] for the block's tokens m (eq 3)
      for (int64_t j = 0; j < tc; ++j) s0[j] = (m0 - J[c0 + j] + N) % N;
      gather_columns(vb, N, C, s0, tc, len, lb);
      // (2) per pair: slot 0 takes the smaller value unless the reference pair is descending
      const uint8_t* r = rb + m0 / 2;
      for (int64_t j = 0; j < tc; ++j) {
        const T* u = lb + j * kBlock;
        T* o = ob + j * kBlock;
        uint16_t* sw = swap + t * K + m0 / 2;
        for (int64_t k = 0; k < len / 2; ++k) {
          const T x = u[2 * k], y = u[2 * k + 1];
          const bool s = (x > y) != static_cast<bool>(r[k]);
          o[2 * k] = s ? y : x;
          o[2 * k + 1] = s ? x : y;
          sw[k] = static_cast<uint16_t>((j ? sw[k] : 0) | (s << j));
        }
      }
      // (3) the block's output rows
      scatter_columns(ob, N, C, kNoShift, tc, len, outb + m0 * C);
    }
  });
}

template <typename T>
void pairs_backward(const T* g, const int64_t* J, const uint16_t* swap, T* gv, int64_t B, int64_t N, int64_t C) {
  const int64_t K = N / 2;
  for_each_tile<T>(B, C, [&](int64_t t, int64_t b, int64_t c0, int64_t tc, T* lb, T* ob, int64_t* s0) {
    const T* gb = g + b * N * C + c0;
    T* gvb = gv + b * N * C + c0;
    for (int64_t m0 = 0; m0 < N; m0 += kBlock) {
      const int64_t len = std::min(kBlock, N - m0);
      gather_columns(gb + m0 * C, N, C, kNoShift, tc, len, lb);
      // a transposition is its own inverse: the same swaps send each pair's gradients back to its slots
      for (int64_t j = 0; j < tc; ++j) {
        const T* gu = lb + j * kBlock;
        T* o = ob + j * kBlock;
        const uint16_t* sw = swap + t * K + m0 / 2;
        for (int64_t k = 0; k < len / 2; ++k) {
          const bool s = (sw[k] >> j) & 1;
          const T x = gu[2 * k], y = gu[2 * k + 1];
          o[2 * k] = s ? y : x;
          o[2 * k + 1] = s ? x : y;
        }
      }
      // undo the shift: grad_v[(m - J_c) mod N][c] = gu_c[m]
      for (int64_t j = 0; j < tc; ++j) s0[j] = (m0 - J[c0 + j] + N) % N;
      scatter_columns(ob, N, C, s0, tc, len, gvb);
    }
  });
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// float32 with AVX-512: 16 channels are one vector, so no transposition is needed. Per pair k of a tile, the two
// shifted values of each channel (rows (2k - J_c) and (2k + 1 - J_c) mod N, a different row per lane) are
// gathered, compared and blended, and the pair's two output rows stored as they are; the backward scatters the
// swapped gradients to the same rows. Offsets are int32: used when N * C < 2^31.
constexpr bool kHaveAvx512 = true;

// element offsets (row * C + lane) of u_c[0] and u_c[1] for the tile's lanes, and the lanes' mask
inline void first_offsets(const int64_t* J, int64_t N, int64_t C, int64_t c0, int64_t tc, __m512i& off0, __m512i& off1,
                          __mmask16& lanes) {
  alignas(64) int32_t o0[16] = {0}, o1[16] = {0};
  for (int64_t j = 0; j < tc; ++j) {
    const int64_t r0 = (N - J[c0 + j]) % N, r1 = (r0 + 1) % N;
    o0[j] = static_cast<int32_t>(r0 * C + c0 + j);
    o1[j] = static_cast<int32_t>(r1 * C + c0 + j);
  }
  off0 = _mm512_load_si512(o0);
  off1 = _mm512_load_si512(o1);
  lanes = static_cast<__mmask16>((1u << tc) - 1u);
}

// Every row of a tile is first touched by its lane with the smallest shift (lane j reaches row r at pair
// (r + J_j) / 2), and the hardware prefetchers cannot follow a gather's 16 streams: the kernels prefetch that lane's
// rows kPrefetch pairs ahead, so the other lanes find them in cache.
constexpr int64_t kPrefetch = 32;

inline int64_t leading_lane(const int64_t* J, int64_t c0, int64_t tc) {
  int64_t lead = 0;
  for (int64_t j = 1; j < tc; ++j)
    if (J[c0 + j] < J[c0 + lead]) lead = j;
  return lead;
}

// prefetch rows (2k + 2 kPrefetch - J) mod N and the next of the tile's columns from c0
template <typename T>
inline void prefetch_rows(const T* base, int64_t k, int64_t J, int64_t N, int64_t C, int64_t c0) {
  int64_t r = (2 * (k + kPrefetch) - J) % N;
  r = r < 0 ? r + N : r;
  _mm_prefetch(reinterpret_cast<const char*>(base + r * C + c0), _MM_HINT_T0);
  r = r + 1 == N ? 0 : r + 1;
  _mm_prefetch(reinterpret_cast<const char*>(base + r * C + c0), _MM_HINT_T0);
}

// the offsets two rows on (pair k + 1), wrapped into [0, N * C)
inline __m512i next_pair(__m512i off, __m512i step, __m512i limit) {
  off = _mm512_add_epi32(off, step);
  return _mm512_mask_sub_epi32(off, _mm512_cmpge_epi32_mask(off, limit), off, limit);
}

// Tiles per task: a task walks kGroup adjacent tiles together, so each row it touches is kGroup adjacent cache
// lines (the prefetchers follow those, not a lone 64-byte line per row), while its lanes' rows still stay in
// L2 between the lanes that read them. Fewer when that would leave threads idle.
constexpr int64_t kGroup = 4;

inline int64_t tiles_per_task(int64_t B, int64_t tiles) {
  const int64_t threads = at::get_num_threads();
  for (int64_t w = kGroup; w > 1; w /= 2)
    if (B * ((tiles + w - 1) / w) >= threads) return w;
  return 1;
}

// Non-temporal stores when every tile is full and 64-byte aligned: the output is written once and read by a
// later op, so writing it around the caches saves the read-for-ownership of each line (a third of the traffic).
inline bool can_stream(const float* out, int64_t C) {
  return C % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0;
}

inline void store_row(float* dst, __mmask16 lanes, __m512 x, bool stream) {
  if (stream)
    _mm512_stream_ps(dst, x);
  else
    _mm512_mask_storeu_ps(dst, lanes, x);
}

// poison[b]: sum of v * 0 over sample b's values (each is gathered once): NaN iff the sample holds NaN or +-Inf
void pairs_forward_avx512(const float* v, const int64_t* J, const uint8_t* ref, float* out, uint16_t* swap,
                          float* poison, int64_t B, int64_t N, int64_t C) {
  const int64_t K = N / 2, tiles = (C + 15) / 16, W = tiles_per_task(B, tiles), groups = (tiles + W - 1) / W;
  const bool stream = can_stream(out, C);
  std::vector<float> task_poison(B * groups);
  const __m512i step = _mm512_set1_epi32(static_cast<int32_t>(2 * C));
  const __m512i limit = _mm512_set1_epi32(static_cast<int32_t>(N * C));
  at::parallel_for(0, B * groups, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / groups, cg = (t % groups) * W * 16, nw = std::min(W, tiles - (t % groups) * W);
      __m512i off0[kGroup], off1[kGroup];
      __mmask16 lanes[kGroup];
      int64_t lead_j = N;
      for (int64_t w = 0; w < nw; ++w) {
        const int64_t c0 = cg + 16 * w, tc = std::min<int64_t>(16, C - c0);
        first_offsets(J, N, C, c0, tc, off0[w], off1[w], lanes[w]);
        lead_j = std::min(lead_j, J[c0 + leading_lane(J, c0, tc)]);
      }
      const float* vb = v + b * N * C;
      float* ob = out + b * N * C + cg;
      uint16_t* sb = swap + (b * tiles + cg / 16) * K;
      const uint8_t* rb = ref + b * K;
      const __m512 zero = _mm512_setzero_ps();
      __m512 seen = zero;
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t w = 0; w < nw; ++w) prefetch_rows(vb, k, lead_j, N, C, cg + 16 * w);
        const __mmask16 rk = static_cast<__mmask16>(rb[k] ? 0xFFFF : 0);
        for (int64_t w = 0; w < kGroup; ++w) {
          if (w >= nw) break;
          const __m512 x = _mm512_mask_i32gather_ps(zero, lanes[w], off0[w], vb, 4);
          const __m512 y = _mm512_mask_i32gather_ps(zero, lanes[w], off1[w], vb, 4);
          seen = _mm512_fmadd_ps(x, zero, _mm512_fmadd_ps(y, zero, seen));
          // strict '>' (ordered): equal values keep their order, as the stable sort of the reference
          const __mmask16 s = _mm512_cmp_ps_mask(x, y, _CMP_GT_OQ) ^ rk;
          float* o = ob + 2 * k * C + 16 * w;
          store_row(o, lanes[w], _mm512_mask_blend_ps(s, x, y), stream);
          store_row(o + C, lanes[w], _mm512_mask_blend_ps(s, y, x), stream);
          sb[w * K + k] = static_cast<uint16_t>(s & lanes[w]);
          off0[w] = next_pair(off0[w], step, limit);
          off1[w] = next_pair(off1[w], step, limit);
        }
      }
      task_poison[t] = _mm512_reduce_add_ps(seen);
    }
    // non-temporal stores are weakly ordered: each worker fences its own before the parallel region ends, so
    // the rows are visible to whichever thread reads the output next
    if (stream) _mm_sfence();
  });
  for (int64_t b = 0; b < B; ++b) {
    float p = 0;
    for (int64_t i = 0; i < groups; ++i) p += task_poison[b * groups + i];
    poison[b] = p;
  }
}

// Scratch buffers up to this size stay with their worker thread between calls.
constexpr int64_t kKeepScratch = int64_t{16} << 20;

// The calling worker's (n, 16) float buffer, 64-byte aligned rows, uninitialised. Kept between calls (up to
// kKeepScratch bytes, else a one-off in `temp`): a fresh megabyte per call, whether from the workers' glibc arenas
// (which grew by one every call) or from the main heap, fragmented the heap into a cycle of trimming and
// page-faulting the outputs back in.
float* worker_scratch(int64_t n, std::unique_ptr<__m512[]>& temp) {
  if (n * static_cast<int64_t>(sizeof(__m512)) > kKeepScratch) {
    temp.reset(new __m512[n]);
    return reinterpret_cast<float*>(temp.get());
  }
  thread_local std::unique_ptr<__m512[]> kept;
  thread_local int64_t kept_n = 0;
  if (kept_n < n) {
    kept.reset(new __m512[n]);
    kept_n = n;
  }
  return reinterpret_cast<float*>(kept.get());
}

// Backward in two passes per tile, with no scatter (AMD's are slow): (1) per pair, send the two gradients back to
// their slots (a transposition is its own inverse) into a (N, 16) buffer, contiguous loads and stores; (2) undo
// the shift: gradient row s of v, lane c, is buffer row (s + J_c) mod N (one gather per row; the buffer is
// compact, so the lanes' rows stay in L2).
void pairs_backward_avx512(const float* g, const int64_t* J, const uint16_t* swap, float* gv, int64_t B, int64_t N,
                           int64_t C) {
  const int64_t K = N / 2, tiles = (C + 15) / 16;
  const bool stream = can_stream(gv, C);
  const __m512i one = _mm512_set1_epi32(1), n_vec = _mm512_set1_epi32(static_cast<int32_t>(N));
  at::parallel_for(0, B * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<__m512[]> temp;
    float* u = worker_scratch(N, temp);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, c0 = (t % tiles) * 16, tc = std::min<int64_t>(16, C - c0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << tc) - 1u);
      const float* gb = g + b * N * C + c0;
      const uint16_t* sb = swap + t * K;
      for (int64_t k = 0; k < K; ++k) {
        const __m512 x = _mm512_maskz_loadu_ps(lanes, gb + 2 * k * C);
        const __m512 y = _mm512_maskz_loadu_ps(lanes, gb + (2 * k + 1) * C);
        const __mmask16 s = static_cast<__mmask16>(sb[k]);
        _mm512_store_ps(u + 2 * k * 16, _mm512_mask_blend_ps(s, x, y));
        _mm512_store_ps(u + (2 * k + 1) * 16, _mm512_mask_blend_ps(s, y, x));
      }
      alignas(64) int32_t m0[16] = {0};
      for (int64_t j = 0; j < tc; ++j) m0[j] = static_cast<int32_t>(J[c0 + j]);  // row 0 of v went to J_c
      __m512i m = _mm512_load_si512(m0);
      const __m512i cols = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      float* gvb = gv + b * N * C + c0;
      for (int64_t row = 0; row < N; ++row) {
        const __m512i off = _mm512_add_epi32(_mm512_slli_epi32(m, 4), cols);
        store_row(gvb + row * C, lanes, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, off, u, 4), stream);
        m = _mm512_add_epi32(m, one);
        m = _mm512_mask_sub_epi32(m, _mm512_cmpge_epi32_mask(m, n_vec), m, n_vec);
      }
    }
    if (stream) _mm_sfence();  // each worker fences its own non-temporal stores (see the forward)
  });
}
#else
constexpr bool kHaveAvx512 = false;
void pairs_forward_avx512(const float*, const int64_t*, const uint8_t*, float*, uint16_t*, float*, int64_t, int64_t,
                          int64_t) {}
void pairs_backward_avx512(const float*, const int64_t*, const uint16_t*, float*, int64_t, int64_t, int64_t) {}
#endif

// the AVX-512 path takes float32 whose element offsets fit in int32
bool use_avx512(const Tensor& x) {
  return kHaveAvx512 && x.scalar_type() == at::kFloat && x.size(1) * x.size(2) < (int64_t{1} << 31);
}

// per sample, sum of v * 0 in float: NaN iff v holds NaN or +-Inf (the portable path's finiteness check)
template <typename T>
void portable_poison(const T* v, int64_t B, int64_t NC, float* poison) {
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float p = 0;
      for (int64_t i = 0; i < NC; ++i) p += static_cast<float>(v[b * NC + i]) * 0.0f;
      poison[b] = p;
    }
  });
}

std::vector<Tensor> csp_pairs(const Tensor& v, const Tensor& shifts) {
  check_args(v, shifts, "v");
  const int64_t B = v.size(0), N = v.size(1), C = v.size(2);
  Tensor out = at::empty_like(v);
  // bit j of word [b, t, k]: channel 16 t + j of pair k swapped; tile-major, so threads write disjoint lines
  Tensor swap = at::empty({B, (C + 15) / 16, N / 2}, v.options().dtype(at::kShort));
  Tensor ref = at::empty({B, N / 2}, v.options().dtype(at::kByte));
  Tensor poison = at::zeros({B}, v.options().dtype(at::kFloat));
  if (v.numel() == 0) return {out, swap, poison};
  uint16_t* bits = reinterpret_cast<uint16_t*>(swap.data_ptr<int16_t>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.scalar_type(), "csp_pairs", [&] {
    const int64_t* J = shifts.data_ptr<int64_t>();
    reference_order<scalar_t>(v.data_ptr<scalar_t>(), J, ref.data_ptr<uint8_t>(), B, N, C);
    if (use_avx512(v)) {
      pairs_forward_avx512(v.data_ptr<float>(), J, ref.data_ptr<uint8_t>(), out.data_ptr<float>(), bits,
                           poison.data_ptr<float>(), B, N, C);
    } else {
      pairs_forward<scalar_t>(v.data_ptr<scalar_t>(), J, ref.data_ptr<uint8_t>(), out.data_ptr<scalar_t>(), bits, B,
                              N, C);
      portable_poison<scalar_t>(v.data_ptr<scalar_t>(), B, N * C, poison.data_ptr<float>());
    }
  });
  return {out, swap, poison};
}

Tensor csp_pairs_bwd(const Tensor& grad, const Tensor& shifts, const Tensor& swap) {
  check_args(grad, shifts, "grad");
  const int64_t B = grad.size(0), N = grad.size(1), C = grad.size(2);
  TORCH_CHECK(swap.scalar_type() == at::kShort && swap.is_contiguous() && swap.dim() == 3 && swap.size(0) == B &&
                  swap.size(1) == (C + 15) / 16 && swap.size(2) == N / 2,
              "swap must be the forward's contiguous int16 (B, ceil(C / 16), N / 2) bit masks");
  Tensor gv = at::empty_like(grad);
  if (grad.numel() == 0) return gv;
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(swap.data_ptr<int16_t>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "csp_pairs_bwd", [&] {
    if (use_avx512(grad)) {
      pairs_backward_avx512(grad.data_ptr<float>(), shifts.data_ptr<int64_t>(), bits, gv.data_ptr<float>(), B, N, C);
    } else {
      pairs_backward<scalar_t>(grad.data_ptr<scalar_t>(), shifts.data_ptr<int64_t>(), bits, gv.data_ptr<scalar_t>(), B,
                               N, C);
    }
  });
  return gv;
}


// Sequences of a padded batch or packed row, any group size: every sequence is CSP eq 4 alone on its real
// tokens. Slot i of sequence t (its i-th real token) is row tok(t, i) of its batch row: start_t + i for a run of
// side-by-side tokens (order empty), else order[b, start_t + i] (masks with holes: the row's tokens listed by
// sequence, then position). Channel c reads u_c[p] = v[tok((p - J_c) mod L), c] (eq 3 within the sequence), then
// each group of G = L / groups slots (G = 1 with groups = 0: shifting only) places channel c's r-th smallest at the
// slot of the reference channel's r-th smallest (stable: ties keep slot order, as the reference's stable sorts).
// Values are only moved: the output is bit-exact. src[b, i, c] is the row the value at (b, i, c) came from, -1 at
// padding (the backward sends each gradient there); padding rows of the output are zero.
//
// Two passes, both parallel and without a loop over sequences in Python: (1) per sequence, the reference channel's
// sorted slots of every group (rank, int32 (B, N), indexed by slot) and which rows are real; (2) per (sequence,
// tile of kTile channels), block by block of whole groups: gather each channel's shifted values of the block into a
// (kTile, slots) buffer, order each group of each channel (compare-and-swap for G = 2, insertion sort up to 16, a
// stable sort beyond) and write the values and their sources.

struct SeqView {
  int64_t start, len, G;
  const int64_t* order;  // nullptr: the sequence is the run of rows start .. start + len - 1
  int64_t row(int64_t i) const { return order ? order[start + i] : start + i; }
};

inline SeqView seq_view(const int64_t* seg, const int64_t* order, int64_t t, int64_t b, int64_t N, int64_t groups) {
  const int64_t start = seg[2 * t], len = seg[2 * t + 1];
  return {start, len, len == 0 ? 0 : (groups > 0 ? len / groups : 1), order ? order + b * N : nullptr};
}

// idx[0 .. G) = 0 .. G-1 stably sorted by u[idx]
template <typename T>
inline void stable_order(const T* u, int64_t G, int32_t* idx) {
  using acc = at::opmath_type<T>;
  if (G == 2) {  // branch-free: on random values a branch here is mispredicted half the time
    const int32_t s = static_cast<acc>(u[0]) > static_cast<acc>(u[1]);
    idx[0] = s;
    idx[1] = 1 - s;
    return;
  }
  for (int64_t i = 0; i < G; ++i) idx[i] = static_cast<int32_t>(i);
  if (G <= 16) {  // insertion sort: stable, and no buffer to allocate per group
    for (int64_t i = 1; i < G; ++i) {
      const int32_t x = idx[i];
      int64_t k = i;
      for (; k > 0 && static_cast<acc>(u[idx[k - 1]]) > static_cast<acc>(u[x]); --k) idx[k] = idx[k - 1];
      idx[k] = x;
    }
  } else {
    std::stable_sort(idx, idx + G, [u](int32_t a, int32_t b) { return static_cast<acc>(u[a]) < static_cast<acc>(u[b]); });
  }
}

template <typename T>
void varlen_reference(const T* v, const int64_t* seg, const int64_t* order, const int64_t* J, int32_t* rank,
                      uint8_t* real, int64_t B, int64_t S, int64_t N, int64_t C, int64_t groups) {
  at::parallel_for(0, B * S, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> u;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / S;
      const SeqView sq = seq_view(seg, order, t, b, N, groups);
      if (sq.len == 0) continue;
      const T* vb = v + b * N * C;
      int32_t* rk = rank + b * N + sq.start;
      u.resize(sq.G);
      const int64_t J0 = J[t * C];
      for (int64_t g0 = 0; g0 < sq.len; g0 += sq.G) {
        for (int64_t i = 0; i < sq.G; ++i) {
          const int64_t q = g0 + i - J0;
          u[i] = vb[sq.row(q < 0 ? q + sq.len : q) * C];
        }
        stable_order(u.data(), sq.G, rk + g0);
      }
      for (int64_t i = 0; i < sq.len; ++i) real[b * N + sq.row(i)] = 1;
    }
  });
}

// Slots per block of varlen_forward: whole groups of at least this many slots, so that each channel's shifted
// values are read as one run of rows (a strided stream the prefetchers follow) rather than a row or two per group.
constexpr int64_t kSlots = 256;

template <typename T>
void varlen_forward(const T* v, const int64_t* seg, const int64_t* order, const int64_t* J, const int32_t* rank,
                    T* out, int32_t* src, int64_t B, int64_t S, int64_t N, int64_t C, int64_t groups) {
  const int64_t tiles = (C + kTile - 1) / kTile;
  at::parallel_for(0, B * S * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> u;
    std::vector<int32_t> from, idx;
    std::vector<int64_t> dst;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t t = task / tiles, b = t / S, c0 = (task % tiles) * kTile, tc = std::min(kTile, C - c0);
      const SeqView sq = seq_view(seg, order, t, b, N, groups);
      if (sq.len == 0) continue;
      const int64_t G = sq.G, L = sq.len, per = std::max<int64_t>(1, kSlots / G) * G;
      const T* vb = v + b * N * C;
      T* ob = out + b * N * C;
      int32_t* sb = src + b * N * C;
      const int32_t* rk = rank + b * N + sq.start;
      const int64_t* Js = J + t * C + c0;
      u.resize(kTile * per);
      from.resize(kTile * per);
      idx.resize(G);
      dst.resize(per);
      for (int64_t s0 = 0; s0 < L; s0 += per) {
        const int64_t len = std::min(per, L - s0);  // whole groups: L and per are multiples of G
        // channel j's shifted values of the block: slot s0 + i from row tok((s0 + i - J) mod L)
        for (int64_t j = 0; j < tc; ++j) {
          const T* col = vb + c0 + j;
          T* uj = u.data() + j * per;
          int32_t* fj = from.data() + j * per;
          int64_t q = s0 - Js[j];
          q = q < 0 ? q + L : q;
          for (int64_t i = 0; i < len; ++i) {
            const int64_t row = sq.row(q);
            uj[i] = col[row * C];
            fj[i] = static_cast<int32_t>(row);
            q = q + 1 == L ? 0 : q + 1;
          }
        }
        for (int64_t i = 0; i < len; ++i) dst[i] = sq.row(s0 + i) * C + c0;
        for (int64_t j = 0; j < tc; ++j) {
          const T* uj = u.data() + j * per;
          const int32_t* fj = from.data() + j * per;
          for (int64_t g0 = 0; g0 < len; g0 += G) {
            stable_order(uj + g0, G, idx.data());
            const int32_t* rg = rk + s0 + g0;  // the reference's r-th smallest slot of the group
            for (int64_t r = 0; r < G; ++r) {
              const int64_t d = dst[g0 + rg[r]] + j;
              ob[d] = uj[g0 + idx[r]];
              sb[d] = fj[g0 + idx[r]];
            }
          }
        }
      }
    }
  });
}

void check_varlen(const Tensor& x, const Tensor& seg, const Tensor& order, const Tensor& J, int64_t groups,
                  const char* name) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), name, " must be a contiguous (B, N, C) tensor");
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  TORCH_CHECK(N < (int64_t{1} << 31), "N must be below 2^31 (int32 sources), got ", N);
  TORCH_CHECK(groups >= 0, "groups must be positive, or 0 for groups of one token, got ", groups);
  TORCH_CHECK(seg.scalar_type() == at::kLong && seg.dim() == 3 && seg.size(0) == B && seg.size(2) == 2 &&
                  seg.is_contiguous(),
              "seg must be a contiguous int64 (B, S, 2) tensor of (start, length)");
  const int64_t S = seg.size(1);
  TORCH_CHECK(J.scalar_type() == at::kLong && J.dim() == 3 && J.size(0) == B && J.size(1) == S && J.size(2) == C &&
                  J.is_contiguous(),
              "shifts must be a contiguous int64 (B, S, C) tensor");
  const bool listed = order.numel() > 0;
  TORCH_CHECK(!listed || (order.scalar_type() == at::kLong && order.dim() == 2 && order.size(0) == B &&
                          order.size(1) == N && order.is_contiguous()),
              "order must be empty (runs) or a contiguous int64 (B, N) tensor of token rows");
  const int64_t* sg = seg.data_ptr<int64_t>();
  const int64_t* j = J.data_ptr<int64_t>();
  const int64_t* o = listed ? order.data_ptr<int64_t>() : nullptr;
  for (int64_t t = 0; t < B * S; ++t) {
    const int64_t start = sg[2 * t], len = sg[2 * t + 1];
    TORCH_CHECK(len >= 0 && start >= 0 && start + len <= N, "sequence ", t, " must lie inside its row of N = ", N,
                " slots, got start ", start, ", length ", len);
    TORCH_CHECK(groups == 0 || len % groups == 0, "sequence ", t, " of length ", len, " cannot be split into groups = ",
                groups, " equal groups");
    for (int64_t c = 0; c < C && len > 0; ++c)
      TORCH_CHECK(j[t * C + c] >= 0 && j[t * C + c] < len, "shifts must lie in [0, length) = [0, ", len, "), got ",
                  j[t * C + c], " for sequence ", t, ", channel ", c);
  }
  for (int64_t i = 0; o && i < B * N; ++i)
    TORCH_CHECK(o[i] >= 0 && o[i] < N, "order must hold token rows in [0, N) = [0, ", N, "), got ", o[i]);
}

std::vector<Tensor> csp_varlen(const Tensor& v, const Tensor& seg, const Tensor& order, const Tensor& shifts,
                               int64_t groups) {
  check_varlen(v, seg, order, shifts, groups, "v");
  const int64_t B = v.size(0), N = v.size(1), C = v.size(2), S = seg.size(1);
  Tensor out = at::empty(v.sizes(), v.options());
  Tensor src = at::empty(v.sizes(), v.options().dtype(at::kInt));
  Tensor rank = at::empty({B, N}, v.options().dtype(at::kInt));
  Tensor real = at::zeros({B, N}, v.options().dtype(at::kByte));
  const int64_t* o = order.numel() ? order.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.scalar_type(), "csp_varlen", [&] {
    varlen_reference<scalar_t>(v.data_ptr<scalar_t>(), seg.data_ptr<int64_t>(), o, shifts.data_ptr<int64_t>(),
                               rank.data_ptr<int32_t>(), real.data_ptr<uint8_t>(), B, S, N, C, groups);
    varlen_forward<scalar_t>(v.data_ptr<scalar_t>(), seg.data_ptr<int64_t>(), o, shifts.data_ptr<int64_t>(),
                             rank.data_ptr<int32_t>(), out.data_ptr<scalar_t>(), src.data_ptr<int32_t>(), B, S, N, C,
                             groups);
    // padding rows, which no sequence wrote: zero output, no source
    scalar_t* ob = out.data_ptr<scalar_t>();
    int32_t* sb = src.data_ptr<int32_t>();
    const uint8_t* rl = real.data_ptr<uint8_t>();
    at::parallel_for(0, B * N, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (rl[r]) continue;
        std::fill(ob + r * C, ob + (r + 1) * C, scalar_t(0));
        std::fill(sb + r * C, sb + (r + 1) * C, int32_t{-1});
      }
    });
  });
  return {out, src};
}

// grad_v[b, src[b, i, c], c] = grad[b, i, c]: a permutation of each sequence's rows per channel, so the writes are
// disjoint; padding (src -1) sends nothing and its gradient is zero
Tensor csp_varlen_bwd(const Tensor& grad, const Tensor& src) {
  TORCH_CHECK(grad.dim() == 3 && grad.is_contiguous(), "grad must be a contiguous (B, N, C) tensor");
  TORCH_CHECK(src.scalar_type() == at::kInt && src.sizes() == grad.sizes() && src.is_contiguous(),
              "src must be the forward's contiguous int32 (B, N, C) source rows");
  const int64_t B = grad.size(0), N = grad.size(1), C = grad.size(2);
  Tensor gv = at::zeros(grad.sizes(), grad.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "csp_varlen_bwd", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    const int32_t* sb = src.data_ptr<int32_t>();
    scalar_t* out = gv.data_ptr<scalar_t>();
    at::parallel_for(0, B * N, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t base = (r / N) * N * C;
        for (int64_t c = 0; c < C; ++c) {
          const int32_t s = sb[r * C + c];
          if (s >= 0) out[base + s * C + c] = g[r * C + c];
        }
      }
    });
  });
  return gv;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnzoo_cpu, m) {
  m.def("csp_pairs(Tensor v, Tensor shifts) -> Tensor[]");
  m.def("csp_pairs_bwd(Tensor grad, Tensor shifts, Tensor swap) -> Tensor");
  m.def("csp_varlen(Tensor v, Tensor seg, Tensor order, Tensor shifts, int groups) -> Tensor[]");
  m.def("csp_varlen_bwd(Tensor grad, Tensor src) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnzoo_cpu, CPU, m) {
  m.impl("csp_pairs", &csp_pairs);
  m.impl("csp_pairs_bwd", &csp_pairs_bwd);
  m.impl("csp_varlen", &csp_varlen);
  m.impl("csp_varlen_bwd", &csp_varlen_bwd);
}
