// CPU reference implementation of every compressor and memory. Single-threaded; the hot
// loops are written for the auto-vectorizer (fixed-width inner loops over 8 or 16 lanes,
// selects instead of branches, no calls) and checked with -fopt-info-vec (docs/KERNELS.md).
// This is the portable baseline; a compressor made for Isa::kAvx2 runs the elementwise
// compressors through the byte-identical AVX2 + F16C loops of avx2_loops.cc (cpu_loops.h).
//
// Encode, for every compressor:
//   1. memory: none: x = g; residual: e += g, x = e (in place); dgc: u = 0.9 u + g, v += u, x = v.
//      signum then keeps its momentum m = 0.9 m + 0.1 x and compresses x = m.
//   2. compress x into the payload; `sent` is what the payload stands for in gradient units.
//   3. residual: e = (g + e) - sent; dgc: u = v = 0 where sent. Non-finite inputs leave 0.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../backends.h"
#include "../common.h"
#include "cpu_loops.h"

namespace cupcake::kernels {
namespace {

using detail::Abs;
using detail::FloatBits;
using detail::IsFinite;
using detail::MagnitudeKey;

using u8 = unsigned char;
constexpr int64_t kBlock = 4096;  // elements per float-accumulated block before a double sum

inline void StoreU16(u8* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline uint16_t LoadU16(const u8* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void StoreI32(u8* p, int32_t v) { std::memcpy(p, &v, 4); }
inline int32_t LoadI32(const u8* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void StoreF(u8* p, float v) { std::memcpy(p, &v, 4); }
inline float LoadF(const u8* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// Sums of f(x[i]) over [0, n): 16 float lanes per 4096-element block, blocks summed in double.
template <typename F>
double BlockedSum(const float* x, int64_t n, F f) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    float acc[16] = {};
    int64_t i = b;
    for (; i + 16 <= end; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += f(x[i + j]);
    float tail = 0.0f;
    for (; i < end; ++i) tail += f(x[i]);
    double s = tail;
    for (int j = 0; j < 16; ++j) s += acc[j];
    total += s;
  }
  return total;
}

inline float FiniteSquare(float v) { return IsFinite(v) ? v * v : 0.0f; }
inline float FiniteAbs(float v) { return IsFinite(v) ? Abs(v) : 0.0f; }

float FiniteMaxAbs(const float* x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) {
      const float a = FiniteAbs(x[i + j]);
      acc[j] = acc[j] > a ? acc[j] : a;
    }
  float m = 0.0f;
  for (; i < n; ++i) m = std::max(m, FiniteAbs(x[i]));
  for (int j = 0; j < 16; ++j) m = std::max(m, acc[j]);
  return m;
}

class CpuCompressor final : public Compressor {
 public:
  CpuCompressor(const CompressorLayout& l, cpu::Isa isa) : Compressor(l, Backend::kCpu), isa_(isa) {
    const auto& L = layout();
    if (L.kind == CompressorKind::kTopk || L.kind == CompressorKind::kDgc) hist_.resize(4 * 2048);
    if (L.kind == CompressorKind::kDgc) {
      sample_size_ = std::min<int64_t>(L.n, std::max<int64_t>(4096, L.n / 100));
      // Sample rank whose key should leave ~1.25 k candidates; room for 2x that.
      sample_rank_ = std::min<int64_t>(sample_size_, (L.k * sample_size_ * 5 / 4 + L.n - 1) / L.n + 4);
      cand_capacity_ = std::min<int64_t>(L.n, 2 * ((sample_rank_ * L.n) / sample_size_) + 1024);
      sample_.resize(static_cast<size_t>(sample_size_));
      cand_key_.resize(static_cast<size_t>(cand_capacity_));
      cand_idx_.resize(static_cast<size_t>(cand_capacity_));
      cand_tmp_.resize(static_cast<size_t>(cand_capacity_));
    }
    if (L.kind == CompressorKind::kRandk) randk_idx_.resize(static_cast<size_t>(L.k));
  }

 private:
  Status EncodeImpl(const float* grad, float* state, uint64_t iteration, std::byte* payload_b, void*) override {
    const auto& L = layout();
    const int64_t n = L.n;
    u8* payload = reinterpret_cast<u8*>(payload_b);
    if (isa_ != cpu::Isa::kBaseline && EncodeAvx2(grad, state, iteration, payload)) return Status::Ok();
    // Step 1: memory.
    const float* x = grad;
    float* resid = nullptr;  // e, holding g + e_old, for residual memory
    float* dgc_u = nullptr;
    float* dgc_v = nullptr;
    float* tail_state = state;
    if (L.memory == MemoryKind::kResidual) {
      resid = state;
      for (int64_t i = 0; i < n; ++i) resid[i] += grad[i];
      x = resid;
      tail_state = state + n;
    } else if (L.memory == MemoryKind::kDgc) {
      dgc_u = state;
      dgc_v = state + n;
      const float m = detail::kDgcMomentum;
      for (int64_t i = 0; i < n; ++i) {
        dgc_u[i] = m * dgc_u[i] + grad[i];
        dgc_v[i] += dgc_u[i];
      }
      x = dgc_v;
      tail_state = state + 2 * n;
    }
    if (L.kind == CompressorKind::kSignum) {
      float* mom = tail_state;
      const float beta = detail::kSignumMomentum, one_minus = 1.0f - detail::kSignumMomentum;
      for (int64_t i = 0; i < n; ++i) {
        const float m = beta * mom[i] + one_minus * x[i];
        mom[i] = IsFinite(m) ? m : 0.0f;  // a non-finite input must not stick in the momentum
      }
      x = mom;
    }

    // Steps 2 and 3.
    switch (L.kind) {
      case CompressorKind::kFp32: EncodeFp32(x, resid, payload); break;
      case CompressorKind::kFp16: EncodeFp16(x, resid, payload); break;
      case CompressorKind::kTopk: {
        uint32_t t, need_eq;
        RadixThreshold(x, n, L.k, &t, &need_eq);
        SelectByIndex(x, n, t, need_eq, resid, dgc_u, dgc_v, payload);
        break;
      }
      case CompressorKind::kDgc: EncodeDgc(x, resid, dgc_u, dgc_v, payload); break;
      case CompressorKind::kRandk: EncodeRandk(x, iteration, resid, dgc_u, dgc_v, payload); break;
      case CompressorKind::kQsgd: EncodeQsgd(x, iteration, resid, payload); break;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
      case CompressorKind::kSignum: EncodeSign(x, resid, payload); break;
      case CompressorKind::kTerngrad: EncodeTerngrad(x, iteration, resid, payload); break;
      case CompressorKind::kOnebit: EncodeOnebit(x, resid, payload); break;
    }
    return Status::Ok();
  }

  Status DecodeImpl(const std::byte* payloads_b, float* out, uint64_t iteration, void*) override {
    const auto& L = layout();
    const u8* p = reinterpret_cast<const u8*>(payloads_b);
    const int64_t n = L.n;
    const int W = L.world_size;
    const float wf = static_cast<float>(W);
    if (isa_ != cpu::Isa::kBaseline && DecodeAvx2(p, out)) return Status::Ok();
    switch (L.kind) {
      case CompressorKind::kFp32:
        for (int64_t i = 0; i < n; ++i) out[i] = LoadF(p + 4 * i) / wf;
        return Status::Ok();
      case CompressorKind::kFp16:
        for (int64_t i = 0; i < n; ++i) out[i] = detail::HalfToFloat(LoadU16(p + 2 * i));
        return Status::Ok();
      case CompressorKind::kRandk: {
        FillRandkIndices(iteration);
        std::fill(out, out + n, 0.0f);
        for (int64_t j = 0; j < L.k; ++j) out[randk_idx_[j]] = LoadF(p + 4 * j) / wf;
        return Status::Ok();
      }
      case CompressorKind::kTopk:
      case CompressorKind::kDgc: return DecodeSparse(p, out);
      case CompressorKind::kQsgd:
        // Blocks of kBlock elements, all ranks per block, so `out` stays in L1.
        for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
          const int64_t end = std::min(n, b0 + kBlock);
          for (int r = 0; r < W; ++r) {
            const u8* pr = p + r * L.payload_bytes;
            const float f = LoadF(pr + n) / (detail::kQsgdLevels * wf);
            const float nan = std::numeric_limits<float>::quiet_NaN();
            if (r == 0) {
              for (int64_t i = b0; i < end; ++i) {
                const int8_t q = static_cast<int8_t>(pr[i]);
                out[i] = q == -128 ? nan : static_cast<float>(q) * f;
              }
            } else {
              for (int64_t i = b0; i < end; ++i) {
                const int8_t q = static_cast<int8_t>(pr[i]);
                out[i] += q == -128 ? nan : static_cast<float>(q) * f;
              }
            }
          }
        }
        return Status::Ok();
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
      case CompressorKind::kSignum:
      case CompressorKind::kOnebit:
        for (int64_t b0 = 0; b0 < n; b0 += kBlock) {  // kBlock is a multiple of 8
          const int64_t len = std::min(kBlock, n - b0);
          for (int r = 0; r < W; ++r) {
            const u8* pr = p + r * L.payload_bytes;
            const int64_t nb = (n + 7) / 8;
            float pos, neg;
            if (L.kind == CompressorKind::kOnebit) {
              pos = LoadF(pr + nb) / wf;
              neg = LoadF(pr + nb + 4) / wf;
            } else {
              pos = LoadF(pr + nb) / wf;
              neg = -pos;
            }
            if (r == 0)
              UnpackBits<true>(pr + b0 / 8, len, pos, neg, out + b0);
            else
              UnpackBits<false>(pr + b0 / 8, len, pos, neg, out + b0);
          }
        }
        return Status::Ok();
      case CompressorKind::kTerngrad:
        for (int64_t b0 = 0; b0 < n; b0 += kBlock) {  // kBlock is a multiple of 4
          const int64_t len = std::min(kBlock, n - b0);
          for (int r = 0; r < W; ++r) {
            const u8* pr = p + r * L.payload_bytes;
            const float s = LoadF(pr + (n + 3) / 4) / wf;
            if (r == 0)
              UnpackTernary<true>(pr + b0 / 4, len, s, out + b0);
            else
              UnpackTernary<false>(pr + b0 / 4, len, s, out + b0);
          }
        }
        return Status::Ok();
    }
    return Status::Ok();
  }

  // The AVX2 (and AVX-512) variants of the elementwise compressors (memory none or residual; the state
  // layout is e[n] then signum's m[n]). False: not covered, run the baseline.
  bool EncodeAvx2(const float* grad, float* state, uint64_t iteration, u8* payload) {
    const auto& L = layout();
    if (L.memory == MemoryKind::kDgc) return false;
    float* resid = L.memory == MemoryKind::kResidual ? state : nullptr;
    float* tail_state = resid ? state + L.n : state;
    switch (L.kind) {
      case CompressorKind::kFp16: cpu::avx2::EncodeFp16(grad, resid, L.n, L.world_size, payload); return true;
      case CompressorKind::kQsgd:
        cpu::avx2::EncodeQsgd(grad, resid, L.n, detail::StreamKey(L.seed, iteration), payload,
                              isa_ == cpu::Isa::kAvx512);
        return true;
      case CompressorKind::kTerngrad:
        cpu::avx2::EncodeTerngrad(grad, resid, L.n, detail::StreamKey(L.seed, iteration), payload,
                                  isa_ == cpu::Isa::kAvx512);
        return true;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd: cpu::avx2::EncodeSign(grad, resid, nullptr, L.n, payload); return true;
      case CompressorKind::kSignum: cpu::avx2::EncodeSign(grad, resid, tail_state, L.n, payload); return true;
      case CompressorKind::kOnebit: cpu::avx2::EncodeOnebit(grad, resid, L.n, payload); return true;
      default: return false;
    }
  }

  bool DecodeAvx2(const u8* p, float* out) {
    const auto& L = layout();
    switch (L.kind) {
      case CompressorKind::kFp16: cpu::avx2::DecodeFp16(p, out, L.n); return true;
      case CompressorKind::kQsgd: cpu::avx2::DecodeQsgd(p, L.payload_bytes, L.world_size, L.n, out); return true;
      case CompressorKind::kTerngrad:
        cpu::avx2::DecodeTerngrad(p, L.payload_bytes, L.world_size, L.n, out);
        return true;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
      case CompressorKind::kSignum:
      case CompressorKind::kOnebit:
        cpu::avx2::DecodeSign(p, L.payload_bytes, L.world_size, L.kind == CompressorKind::kOnebit, L.n, out);
        return true;
      default: return false;
    }
  }

  // ---- dense ----
  void EncodeFp32(const float* x, float* resid, u8* payload) {
    std::memcpy(payload, x, static_cast<size_t>(layout().n) * 4);
    if (resid) std::fill(resid, resid + layout().n, 0.0f);  // lossless: nothing left behind
  }

  void EncodeFp16(const float* x, float* resid, u8* payload) {
    const int64_t n = layout().n;
    const float wf = static_cast<float>(layout().world_size);
    const float inv_w = 1.0f / wf;
    if (!resid) {
      for (int64_t i = 0; i < n; ++i) StoreU16(payload + 2 * i, detail::FloatToHalf(x[i] * inv_w));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = detail::FloatToHalf(x[i] * inv_w);
      StoreU16(payload + 2 * i, h);
      const float sent = detail::HalfToFloat(h) * wf;
      const float e = resid[i] - sent;
      resid[i] = IsFinite(e) ? e : 0.0f;
    }
  }

  void EncodeQsgd(const float* x, uint64_t iteration, float* resid, u8* payload) {
    const int64_t n = layout().n;
    // 1. norm over the finite entries.
    const float norm = static_cast<float>(std::sqrt(BlockedSum(x, n, FiniteSquare)));
    const float scale = norm > 0.0f ? detail::kQsgdLevels / norm : 0.0f;
    const float unit = norm / detail::kQsgdLevels;
    const uint64_t key = detail::StreamKey(layout().seed, iteration);
    // 2. level = floor(|x| s / norm) + Bernoulli(fraction); unbiased.
    for (int64_t i = 0; i < n; ++i) {
      const float r = detail::QsgdQuantizeOne(x[i], scale, unit, key, static_cast<uint32_t>(i), payload + i);
      if (resid) resid[i] = r;
    }
    StoreF(payload + n, norm);
  }

  // Sign bits of x (1 = negative), packed 8 per byte, LSB first.
  static void PackSigns(const float* x, int64_t n, u8* bits) {
    const int64_t full = n / 8;
    for (int64_t b = 0; b < full; ++b) {
      uint32_t byte = 0;
      for (int j = 0; j < 8; ++j) byte |= static_cast<uint32_t>(x[8 * b + j] < 0.0f) << j;
      bits[b] = static_cast<u8>(byte);
    }
    if (n % 8) {
      uint32_t byte = 0;
      for (int64_t i = full * 8; i < n; ++i) byte |= static_cast<uint32_t>(x[i] < 0.0f) << (i - full * 8);
      bits[full] = static_cast<u8>(byte);
    }
  }

  // resid[i] = x[i] - (x[i] < 0 ? neg : pos), 0 where x[i] is not finite.
  static void SignResidual(const float* x, int64_t n, float pos, float neg, float* resid) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float e = v - (v < 0.0f ? neg : pos);
      resid[i] = IsFinite(v) ? e : 0.0f;
    }
  }

  template <bool kFirst>
  static void UnpackBits(const u8* bits, int64_t n, float pos, float neg, float* out) {
    const int64_t full = n / 8;
    for (int64_t b = 0; b < full; ++b) {
      const uint32_t byte = bits[b];
      for (int j = 0; j < 8; ++j) {
        const float v = (byte >> j) & 1u ? neg : pos;
        if (kFirst)
          out[8 * b + j] = v;
        else
          out[8 * b + j] += v;
      }
    }
    for (int64_t i = full * 8; i < n; ++i) {
      const float v = (bits[full] >> (i - full * 8)) & 1u ? neg : pos;
      if (kFirst)
        out[i] = v;
      else
        out[i] += v;
    }
  }

  void EncodeSign(const float* x, float* resid, u8* payload) {
    const int64_t n = layout().n;
    const float scale = static_cast<float>(BlockedSum(x, n, FiniteAbs) / static_cast<double>(n));
    PackSigns(x, n, payload);
    StoreF(payload + (n + 7) / 8, scale);
    if (resid) {
      if (layout().kind == CompressorKind::kSignum) {
        // Residual against the signum input: e = (g + e_old) - sent, sent from the momentum.
        const float* m = resid + n;  // momentum follows the residual in the state
        for (int64_t i = 0; i < n; ++i) {
          const float e = resid[i] - (m[i] < 0.0f ? -scale : scale);
          resid[i] = IsFinite(e) ? e : 0.0f;
        }
      } else {
        SignResidual(x, n, scale, -scale, resid);
      }
    }
  }

  void EncodeOnebit(const float* x, float* resid, u8* payload) {
    const int64_t n = layout().n;
    double pos_sum = 0, neg_sum = 0;
    double neg_count = 0, finite_count = 0;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t end = std::min(n, b + kBlock);
      float ps[8] = {}, ns[8] = {}, nc[8] = {}, fc[8] = {};
      int64_t i = b;
      for (; i + 8 <= end; i += 8)
        for (int j = 0; j < 8; ++j) {
          const float v = x[i + j];
          const bool f = IsFinite(v);
          const bool neg = v < 0.0f;
          ps[j] += f && !neg ? v : 0.0f;
          ns[j] += f && neg ? v : 0.0f;
          nc[j] += f && neg ? 1.0f : 0.0f;
          fc[j] += f ? 1.0f : 0.0f;
        }
      for (; i < end; ++i) {
        const float v = x[i];
        const bool f = IsFinite(v);
        pos_sum += f && v >= 0.0f ? v : 0.0f;
        neg_sum += f && v < 0.0f ? v : 0.0f;
        neg_count += f && v < 0.0f ? 1.0 : 0.0;
        finite_count += f ? 1.0 : 0.0;
      }
      for (int j = 0; j < 8; ++j) {
        pos_sum += ps[j];
        neg_sum += ns[j];
        neg_count += nc[j];
        finite_count += fc[j];
      }
    }
    const double pos_count = finite_count - neg_count;
    const float pos = pos_count > 0 ? static_cast<float>(pos_sum / pos_count) : 0.0f;
    const float neg = neg_count > 0 ? static_cast<float>(neg_sum / neg_count) : 0.0f;
    PackSigns(x, n, payload);
    StoreF(payload + (n + 7) / 8, pos);
    StoreF(payload + (n + 7) / 8 + 4, neg);
    if (resid) SignResidual(x, n, pos, neg, resid);
  }

  void EncodeTerngrad(const float* x, uint64_t iteration, float* resid, u8* payload) {
    const int64_t n = layout().n;
    const float mx = FiniteMaxAbs(x, n);
    const float inv = mx > 0.0f ? 1.0f / mx : 0.0f;
    const uint64_t key = detail::StreamKey(layout().seed, iteration);
    auto code = [&](int64_t i) { return detail::TerngradCode(x[i], inv, key, static_cast<uint32_t>(i)); };
    const int64_t full = n / 4;
    for (int64_t b = 0; b < full; ++b) {
      uint32_t byte = 0;
      for (int j = 0; j < 4; ++j) byte |= code(4 * b + j) << (2 * j);
      payload[b] = static_cast<u8>(byte);
    }
    if (n % 4) {
      uint32_t byte = 0;
      for (int64_t i = full * 4; i < n; ++i) byte |= code(i) << (2 * (i - full * 4));
      payload[full] = static_cast<u8>(byte);
    }
    StoreF(payload + (n + 3) / 4, mx);
    if (resid) {
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t c = (payload[i / 4] >> (2 * (i % 4))) & 3u;
        const float sent = c == 1u ? mx : (c == 2u ? -mx : 0.0f);
        resid[i] = c == 3u ? 0.0f : x[i] - sent;
      }
    }
  }

  template <bool kFirst>
  static void UnpackTernary(const u8* codes, int64_t n, float s, float* out) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto value = [&](uint32_t c) { return c == 0u ? 0.0f : c == 1u ? s : c == 2u ? -s : nan; };
    const int64_t full = n / 4;
    for (int64_t b = 0; b < full; ++b) {
      const uint32_t byte = codes[b];
      for (int j = 0; j < 4; ++j) {
        const float v = value((byte >> (2 * j)) & 3u);
        if (kFirst)
          out[4 * b + j] = v;
        else
          out[4 * b + j] += v;
      }
    }
    for (int64_t i = full * 4; i < n; ++i) {
      const float v = value((codes[full] >> (2 * (i - full * 4))) & 3u);
      if (kFirst)
        out[i] = v;
      else
        out[i] += v;
    }
  }

  // ---- sparse ----
  // Radix selection of the k-th largest MagnitudeKey: three histogram passes over 11, 10
  // and 10 key bits, each restricted to the keys that share the digits chosen so far.
  // Output: *threshold = that key, *need_eq = how many entries equal to it belong to the
  // top k (the lowest indices among them).
  void RadixThreshold(const float* x, int64_t n, int64_t k, uint32_t* threshold, uint32_t* need_eq) {
    static constexpr int kShift[3] = {20, 10, 0};
    static constexpr uint32_t kBins[3] = {2048, 1024, 1024};
    uint32_t prefix = 0, prefix_mask = 0;
    int64_t remaining = k;
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = kShift[pass];
      const uint32_t bins = kBins[pass];
      std::fill(hist_.begin(), hist_.end(), 0u);
      uint32_t* h = hist_.data();
      if (pass == 0) {
        // Four interleaved sub-histograms break the store-to-load chains on repeated bins.
        int64_t i = 0;
        for (; i + 4 <= n; i += 4)
          for (int j = 0; j < 4; ++j) ++h[j * 2048 + (MagnitudeKey(x[i + j]) >> 20)];
        for (; i < n; ++i) ++h[MagnitudeKey(x[i]) >> 20];
        for (uint32_t b = 0; b < 2048; ++b) h[b] += h[2048 + b] + h[4096 + b] + h[6144 + b];
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t key = MagnitudeKey(x[i]);
          if ((key & prefix_mask) == prefix) ++h[(key >> shift) & (bins - 1)];
        }
      }
      int64_t above = 0;
      uint32_t d = bins - 1;
      for (;; --d) {
        if (above + h[d] >= remaining || d == 0) break;
        above += h[d];
      }
      remaining -= above;
      prefix |= d << shift;
      prefix_mask |= (bins - 1) << shift;
    }
    *threshold = prefix;
    *need_eq = static_cast<uint32_t>(remaining);
  }

  // Writes the entries with key > t, plus the first need_eq with key == t, in index order;
  // clears the memory where sent.
  void SelectByIndex(const float* x, int64_t n, uint32_t t, uint32_t need_eq, float* resid, float* u, float* v,
                     u8* payload) {
    const int64_t k = layout().k;
    u8* vals = payload;
    u8* idxs = payload + 4 * k;
    int64_t j = 0;
    uint32_t eq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = MagnitudeKey(x[i]);
      if (key < t) continue;
      if (key == t) {
        if (eq >= need_eq) continue;
        ++eq;
      }
      Emit(x, i, j++, vals, idxs, resid, u, v);
    }
  }

  static void Emit(const float* x, int64_t i, int64_t j, u8* vals, u8* idxs, float* resid, float* u, float* v) {
    StoreF(vals + 4 * j, x[i]);
    StoreI32(idxs + 4 * j, static_cast<int32_t>(i));
    if (resid) resid[i] = 0.0f;
    if (u) {
      u[i] = 0.0f;
      v[i] = 0.0f;
    }
  }

  // DGC (Lin et al., "Deep Gradient Compression", ICLR 2018), exact-k variant:
  //   1. sample every (n/m)-th key (m = max(4096, n/100), at most n);
  //   2. threshold = the sample key of rank ~1.25 k m / n (nth_element), so ~1.25 k entries pass;
  //   3. gather the entries whose key >= threshold (index order), up to a capacity;
  //   4. exact top k among the candidates (nth_element on their keys, ties to the lowest index).
  // When the candidates are fewer than k or overflow the capacity, fall back to the radix
  // selection over all n. Either way the result equals topk's.
  void EncodeDgc(const float* x, float* resid, float* u, float* v, u8* payload) {
    const auto& L = layout();
    const int64_t n = L.n, k = L.k, m = sample_size_;
    for (int64_t s = 0; s < m; ++s) sample_[s] = MagnitudeKey(x[(s * n) / m]);
    std::nth_element(sample_.begin(), sample_.begin() + (sample_rank_ - 1), sample_.end(), std::greater<>());
    const uint32_t thr = sample_[sample_rank_ - 1];
    int64_t c = 0;
    bool overflow = false;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = MagnitudeKey(x[i]);
      if (key >= thr) {
        if (c == cand_capacity_) {
          overflow = true;
          break;
        }
        cand_key_[c] = key;
        cand_idx_[c] = static_cast<uint32_t>(i);
        ++c;
      }
    }
    if (overflow || c < k) {
      uint32_t t, need_eq;
      RadixThreshold(x, n, k, &t, &need_eq);
      SelectByIndex(x, n, t, need_eq, resid, u, v, payload);
      return;
    }
    std::copy(cand_key_.begin(), cand_key_.begin() + c, cand_tmp_.begin());
    std::nth_element(cand_tmp_.begin(), cand_tmp_.begin() + (k - 1), cand_tmp_.begin() + c, std::greater<>());
    const uint32_t t = cand_tmp_[k - 1];
    int64_t above = 0;
    for (int64_t j = 0; j < c; ++j) above += cand_key_[j] > t;
    const int64_t need_eq = k - above;
    u8* vals = payload;
    u8* idxs = payload + 4 * k;
    int64_t out = 0, eq = 0;
    for (int64_t j = 0; j < c; ++j) {
      const uint32_t key = cand_key_[j];
      if (key < t) continue;
      if (key == t) {
        if (eq >= need_eq) continue;
        ++eq;
      }
      Emit(x, cand_idx_[j], out++, vals, idxs, resid, u, v);
    }
  }

  void FillRandkIndices(uint64_t iteration) {
    const auto& L = layout();
    const uint32_t n = static_cast<uint32_t>(L.n);
    const detail::Feistel f = detail::MakeFeistel(L.seed, iteration, n);
    for (int64_t j = 0; j < L.k; ++j) randk_idx_[j] = detail::FeistelPermute(f, n, static_cast<uint32_t>(j));
  }

  void EncodeRandk(const float* x, uint64_t iteration, float* resid, float* u, float* v, u8* payload) {
    FillRandkIndices(iteration);
    for (int64_t j = 0; j < layout().k; ++j) {
      const uint32_t i = randk_idx_[j];
      StoreF(payload + 4 * j, x[i]);
      if (resid) resid[i] = 0.0f;
      if (u) {
        u[i] = 0.0f;
        v[i] = 0.0f;
      }
    }
    // A non-finite entry that was not drawn must not stay in the memory forever.
    const int64_t n = layout().n;
    if (resid)
      for (int64_t i = 0; i < n; ++i) resid[i] = IsFinite(resid[i]) ? resid[i] : 0.0f;
  }

  Status DecodeSparse(const u8* p, float* out) {
    const auto& L = layout();
    const int64_t n = L.n, k = L.k;
    // Validate every index first so that a bad payload leaves `out` untouched.
    for (int r = 0; r < L.world_size; ++r) {
      const u8* idxs = p + r * L.payload_bytes + 4 * k;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t i = LoadI32(idxs + 4 * j);
        if (i < 0 || i >= n) {
          return InvalidArgumentError(L.name + " decode: payload " + std::to_string(r) + ": index " +
                                      std::to_string(j) + ": out of range; got " + std::to_string(i) +
                                      ", expected 0 <= index < " + std::to_string(n));
        }
      }
    }
    std::fill(out, out + n, 0.0f);
    for (int r = 0; r < L.world_size; ++r) {
      const u8* pr = p + r * L.payload_bytes;
      for (int64_t j = 0; j < k; ++j) out[LoadI32(pr + 4 * k + 4 * j)] += LoadF(pr + 4 * j);
    }
    const float wf = static_cast<float>(L.world_size);
    if (L.world_size > 1)
      for (int64_t i = 0; i < n; ++i) out[i] /= wf;
    return Status::Ok();
  }

  std::vector<uint32_t> hist_;
  int64_t sample_size_ = 0, sample_rank_ = 0, cand_capacity_ = 0;
  std::vector<uint32_t> sample_, cand_key_, cand_idx_, cand_tmp_;
  std::vector<uint32_t> randk_idx_;
  cpu::Isa isa_;
};

}  // namespace

std::unique_ptr<Compressor> MakeCpuCompressor(const CompressorLayout& layout) {
  return std::make_unique<CpuCompressor>(layout, cpu::BestIsa());
}

namespace cpu {
std::unique_ptr<Compressor> MakeCpuCompressor(const CompressorLayout& layout, Isa isa) {
  return std::make_unique<CpuCompressor>(layout, isa);
}
}  // namespace cpu

}  // namespace cupcake::kernels
