#include "cupcake/profile/kernel_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>

#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/powersgd.h"
#include "cupcake/kernels/zen.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/names.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cupcake::profile {

bool CacheFlushSupported() {
#if defined(__x86_64__) || defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

Status FakeKernelDevice::BeginTimed() {
  if (open_) return FailedPreconditionError("fake device: BeginTimed() twice without EndTimed()");
  open_ = true;
  calls += 'B';
  return Status::Ok();
}

StatusOr<double> FakeKernelDevice::EndTimed() {
  if (!open_) return FailedPreconditionError("fake device: EndTimed() without BeginTimed()");
  open_ = false;
  calls += 'T';
  if (!end_error.ok()) return end_error;
  const double us = elapsed_us_.empty() ? 0.0 : elapsed_us_[static_cast<size_t>(timed_) % elapsed_us_.size()];
  ++timed_;
  return us;
}

Status FakeKernelDevice::Synchronize() {
  ++synchronized_;
  calls += 'S';
  return Status::Ok();
}

StatusOr<void*> FakeKernelDevice::AllocatePinned(int64_t size_bytes) {
  void* p = std::malloc(static_cast<size_t>(size_bytes > 0 ? size_bytes : 1));
  if (p == nullptr)
    return InternalError("fake device: host allocation failed; got " + std::to_string(size_bytes) + " bytes");
  ++pinned_live_;
  return p;
}

void FakeKernelDevice::FreePinned(void* ptr) {
  if (ptr == nullptr) return;
  std::free(ptr);
  --pinned_live_;
}

Status FakeKernelDevice::CopyAsync(void* dst, const void* src, int64_t size_bytes) {
  std::memcpy(dst, src, static_cast<size_t>(size_bytes));
  ++copies_;
  calls += 'C';
  return Status::Ok();
}

Status FakeKernelDevice::EvictCaches() {
  if (open_) return FailedPreconditionError("fake device: EvictCaches() between BeginTimed() and EndTimed()");
  ++evictions_;
  calls += 'E';
  return Status::Ok();
}

namespace {

// The bytes a host call reads or writes, flushed before each call of a cold sweep.
using Touched = std::vector<std::span<const std::byte>>;
template <typename T>
std::span<const std::byte> BytesOf(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}
std::span<const std::byte> BytesOf(const kernels::Buffer& b) {
  return {b.as<std::byte>(), static_cast<size_t>(b.size_bytes())};
}

// ZenPoint's decode reads every rank's partition and writes the group.
Touched ZenDecodeTouched(const std::vector<std::vector<std::byte>>& partitions, const std::vector<float>& out) {
  Touched t{BytesOf(out)};
  for (const auto& p : partitions) t.push_back(BytesOf(p));
  return t;
}

// Writes back and invalidates every cache line of `touched` in every cache level, and waits
// until that is done (CacheFlushSupported() machines; elsewhere cold sweeps are refused).
void FlushFromCaches(const Touched& touched) {
  constexpr uintptr_t kLine = 64;  // the smallest line of these architectures; a larger one is flushed repeatedly
  for (std::span<const std::byte> s : touched) {
    if (s.empty()) continue;
    const uintptr_t end = reinterpret_cast<uintptr_t>(s.data()) + s.size();
    for (uintptr_t p = reinterpret_cast<uintptr_t>(s.data()) & ~(kLine - 1); p < end; p += kLine) {
#if defined(__x86_64__)
      _mm_clflush(reinterpret_cast<const void*>(p));
#elif defined(__aarch64__)
      asm volatile("dc civac, %0" : : "r"(p) : "memory");
#endif
    }
  }
#if defined(__x86_64__)
  _mm_mfence();
#elif defined(__aarch64__)
  asm volatile("dsb ish" : : : "memory");
#endif
}

// Deterministic gradients in [-1, 1) (a 64-bit LCG keyed by `seed`).
void FillGradient(std::span<float> g, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : g) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
  }
}

// Pinned host memory of a KernelDevice, freed on destruction.
class Pinned {
 public:
  static StatusOr<Pinned> Allocate(KernelDevice& device, int64_t size_bytes) {
    CUPCAKE_ASSIGN_OR_RETURN(void* p, device.AllocatePinned(size_bytes));
    return Pinned(&device, p);
  }
  Pinned(Pinned&& o) noexcept : device_(o.device_), ptr_(o.ptr_) { o.ptr_ = nullptr; }
  Pinned& operator=(Pinned&&) = delete;
  ~Pinned() {
    if (ptr_ != nullptr) device_->FreePinned(ptr_);
  }
  void* get() const { return ptr_; }

 private:
  Pinned(KernelDevice* device, void* ptr) : device_(device), ptr_(ptr) {}
  KernelDevice* device_;
  void* ptr_;
};

// Which measurements of one point are missing: the main one (wall on the CPU, event on a
// device) and the kernel-only one.
struct Want {
  bool main = false;
  bool kernel = false;
  bool any() const { return main || kernel; }
};

StatusOr<kernels::Buffer> Zeroed(kernels::Backend backend, int64_t size_bytes) {
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer b, kernels::Buffer::Allocate(backend, size_bytes));
  CUPCAKE_RETURN_IF_ERROR(b.Zero());
  return b;
}

// One sweep. On the CPU `clock_` times each call (method "wall"); on a device, `device_`'s
// events (method "event") and, when present, `activity_` the kernel-only time (method
// "kernel", into `kernel_sink_`).
class Sweep {
 public:
  Sweep(const KernelSweepOptions& o, Clock* clock, KernelDevice* device, ActivitySource* activity, ProfileSink& sink,
        ProfileSink* kernel_sink, const ProgressFn& progress, comm::Communicator* peers = nullptr)
      : o_(o),
        clock_(clock),
        device_(device),
        activity_(activity),
        sink_(sink),
        kernel_sink_(kernel_sink),
        progress_(progress),
        peers_(peers) {}

  KernelSweepReport& report() { return report_; }

  Status Run() {
    std::vector<std::string> names = o_.compressors;
    if (names.empty()) {
      for (std::string_view n : CompressorNames()) names.emplace_back(n);
      if ((device_ == nullptr || device_->cuda()) && o_.world_size >= 2) names.emplace_back(kZenCurveName);
    }
    std::vector<pb::CopyOp> copies{pb::PACK, pb::UNPACK};
    if (device_ != nullptr) copies.insert(copies.end(), {pb::H2D, pb::D2H});
    int64_t curves = static_cast<int64_t>(copies.size());
    for (const std::string& name : names)
      curves += (name == kNonzeroCurveName ? 1 : 2) * static_cast<int64_t>(RatiosOf(name).size());
    total_ = curves * static_cast<int64_t>(o_.elements.size());
    const kernels::Backend backend =
        device_ != nullptr && device_->cuda() ? kernels::Backend::kCuda : kernels::Backend::kCpu;

    for (const std::string& name : names) {
      for (std::optional<double> ratio : RatiosOf(name)) {
        pb::Curve enc, dec;
        enc.set_kind(pb::ENCODE);
        enc.set_compressor(name);
        enc.set_device(o_.device);
        if (ratio) enc.set_ratio(*ratio);
        dec = enc;
        dec.set_kind(pb::DECODE);
        for (int64_t n : o_.elements) {
          if (name == kPowerSgdName) {  // its points are keyed by their work, not n
            CUPCAKE_RETURN_IF_ERROR(PowerSgdPoint(enc, dec, n, backend));
            continue;
          }
          CUPCAKE_ASSIGN_OR_RETURN(Want want_enc, Wanted(enc, n));
          if (name == kNonzeroCurveName) {  // an encode curve only
            if (want_enc.any()) CUPCAKE_RETURN_IF_ERROR(NonzeroPoint(enc, want_enc, n, *ratio));
            continue;
          }
          CUPCAKE_ASSIGN_OR_RETURN(Want want_dec, Wanted(dec, n));
          if (!want_enc.any() && !want_dec.any()) continue;
          if (name == kZenCurveName) {
            CUPCAKE_RETURN_IF_ERROR(ZenPoint(enc, want_enc, dec, want_dec, n, *ratio));
          } else {
            CUPCAKE_RETURN_IF_ERROR(
                CompressorPoint(enc, want_enc, dec, want_dec, n, ratio.value_or(kDefaultRatio), backend));
          }
        }
      }
    }

    // Copies of 4n bytes: pack a group's gradient into the fusion buffer, unpack it back; on a
    // device also host (pinned) to device and back.
    for (pb::CopyOp op : copies) {
      pb::Curve key;
      key.set_kind(pb::COPY);
      key.set_copy_op(op);
      key.set_device(o_.device);
      for (int64_t n : o_.elements) {
        const int64_t bytes = 4 * n;
        CUPCAKE_ASSIGN_OR_RETURN(Want want, Wanted(key, bytes));
        if (!want.any()) continue;
        std::vector<float> host(static_cast<size_t>(n));
        FillGradient(host, 7);
        CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer tensor, Zeroed(backend, bytes));
        CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer fusion, Zeroed(backend, bytes));
        CUPCAKE_RETURN_IF_ERROR(tensor.CopyFromHost(host.data(), bytes));
        std::optional<Pinned> pinned;
        if (op == pb::H2D || op == pb::D2H) {
          CUPCAKE_ASSIGN_OR_RETURN(Pinned p, Pinned::Allocate(*device_, bytes));
          std::memcpy(p.get(), host.data(), static_cast<size_t>(bytes));
          pinned.emplace(std::move(p));
        }
        void* dst = nullptr;
        const void* src = nullptr;
        switch (op) {
          case pb::PACK: dst = fusion.data(), src = tensor.data(); break;
          case pb::UNPACK: dst = tensor.data(), src = fusion.data(); break;
          case pb::H2D: dst = tensor.data(), src = pinned->get(); break;
          default: dst = pinned->get(), src = tensor.data(); break;  // D2H
        }
        CUPCAKE_RETURN_IF_ERROR(Measure(key, bytes, want, [&](int) {
          if (device_ != nullptr) return device_->CopyAsync(dst, src, bytes);
          std::memcpy(dst, src, static_cast<size_t>(bytes));
          return Status::Ok();
        }, {BytesOf(tensor), BytesOf(fusion)}));
      }
    }
    return Status::Ok();
  }

 private:
  // The ratios a name's curves are measured at: each of the sweep's for topk, randk, dgc and zen;
  // none (one curve without a ratio) for the others.
  std::vector<std::optional<double>> RatiosOf(const std::string& name) const {
    const CompressorInfo* info = FindCompressor(name);
    if (name == kPowerSgdName || (name != kZenCurveName && name != kNonzeroCurveName && !info->uses_ratio))
      return {std::nullopt};
    return {o_.ratios.begin(), o_.ratios.end()};
  }

  // One size of a compressor's encode and decode curves.
  Status CompressorPoint(const pb::Curve& enc, Want want_enc, const pb::Curve& dec, Want want_dec, int64_t n,
                         double ratio, kernels::Backend backend) {
    void* stream = device_ != nullptr ? device_->stream() : nullptr;
    kernels::CompressorConfig config;
    config.name = enc.compressor();
    config.n = n;
    config.world_size = o_.world_size;
    config.ratio = ratio;
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Compressor> comp, kernels::MakeCompressor(config, backend));
    const auto floats = static_cast<size_t>(n);
    std::vector<float> host(floats);
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer grad, Zeroed(backend, 4 * n));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer out, Zeroed(backend, 4 * n));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer state, Zeroed(backend, 4 * comp->state_floats()));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer payload, Zeroed(backend, comp->payload_bytes()));
    std::span<const float> grad_span(grad.as<float>(), floats);
    std::span<float> state_span(state.as<float>(), static_cast<size_t>(comp->state_floats()));
    std::span<std::byte> payload_span(payload.as<std::byte>(), static_cast<size_t>(comp->payload_bytes()));
    FillGradient(host, 1);
    CUPCAKE_RETURN_IF_ERROR(grad.CopyFromHost(host.data(), 4 * n));
    if (want_enc.any()) {
      CUPCAKE_RETURN_IF_ERROR(Measure(enc, n, want_enc, [&](int i) {
        return comp->Encode(grad_span, state_span, static_cast<uint64_t>(i), payload_span, stream);
      }, {BytesOf(grad), BytesOf(state), BytesOf(payload)}));
    }
    if (!want_dec.any()) return Status::Ok();
    // The decode input: W payloads of W ranks' gradients side by side (allgather), or one
    // buffer standing for the reduced one (allreduce), encoded on the same backend.
    const int ranks = comp->layout().allreduce ? 1 : o_.world_size;
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer input, Zeroed(backend, comp->decode_input_bytes()));
    for (int r = 0; r < ranks; ++r) {
      FillGradient(host, 100 + static_cast<uint64_t>(r));
      CUPCAKE_RETURN_IF_ERROR(grad.CopyFromHost(host.data(), 4 * n));
      CUPCAKE_RETURN_IF_ERROR(state.Zero());
      std::span<std::byte> slot(input.as<std::byte>() + static_cast<size_t>(r) * payload_span.size(),
                                payload_span.size());
      CUPCAKE_RETURN_IF_ERROR(comp->Encode(grad_span, state_span, 0, slot, stream));
      // The next rank's gradient overwrites `grad`: let this encode finish reading it.
      if (device_ != nullptr) CUPCAKE_RETURN_IF_ERROR(device_->Synchronize());
    }
    std::span<const std::byte> input_span(input.as<std::byte>(), static_cast<size_t>(input.size_bytes()));
    std::span<float> out_span(out.as<float>(), floats);
    return Measure(dec, n, want_dec, [&](int) { return comp->Decode(input_span, out_span, 0, stream); },
                   {BytesOf(input), BytesOf(out)});
  }

  // One size of PowerSGD's curves: the codec of one rows x cols matrix (rows = floor(sqrt(n)))
  // at the sweep's rank, its points keyed by that step's work (LowRankSizes::work): the encode
  // (EncodeP), and the decode of a summed P and Q. The middle step (ComputeQ) is one more
  // product of the encode's size; the planner prices it with the encode curve.
  Status PowerSgdPoint(const pb::Curve& enc, const pb::Curve& dec, int64_t n, kernels::Backend backend) {
    void* stream = device_ != nullptr ? device_->stream() : nullptr;
    kernels::powersgd::Config config;
    const auto rows = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
    config.shapes = {{rows, n / rows}};
    config.rank = o_.rank;
    config.world_size = o_.world_size;
    const int64_t work = PowerSgdSizes(config.shapes, std::vector<int64_t>{rows * (n / rows)}, o_.rank, false).work;
    CUPCAKE_ASSIGN_OR_RETURN(Want want_enc, Wanted(enc, work));
    CUPCAKE_ASSIGN_OR_RETURN(Want want_dec, Wanted(dec, work));
    if (!want_enc.any() && !want_dec.any()) return Status::Ok();
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<kernels::powersgd::Codec> codec,
                             kernels::powersgd::MakeCodec(config, backend));
    const kernels::powersgd::Layout& l = codec->layout();
    std::vector<float> host(static_cast<size_t>(l.n));
    FillGradient(host, 1);
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer grad, Zeroed(backend, 4 * l.n));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer out, Zeroed(backend, 4 * l.n));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer state, Zeroed(backend, 4 * l.state_floats()));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer first, Zeroed(backend, 4 * l.first_floats()));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer second, Zeroed(backend, 4 * l.second_floats()));
    CUPCAKE_RETURN_IF_ERROR(grad.CopyFromHost(host.data(), 4 * l.n));
    auto floats = [](const kernels::Buffer& b) {
      return std::span<float>(b.as<float>(), static_cast<size_t>(b.size_bytes() / 4));
    };
    CUPCAKE_RETURN_IF_ERROR(codec->InitState(floats(state), stream));
    // One untimed step, so that the decode reads a P and a Q of a real step.
    CUPCAKE_RETURN_IF_ERROR(codec->EncodeP(floats(grad), floats(state), floats(first), stream));
    CUPCAKE_RETURN_IF_ERROR(codec->ComputeQ(floats(first), floats(state), floats(second), stream));
    if (want_enc.any()) {
      CUPCAKE_RETURN_IF_ERROR(Measure(
          enc, work, want_enc, [&](int) { return codec->EncodeP(floats(grad), floats(state), floats(first), stream); },
          {BytesOf(grad), BytesOf(state), BytesOf(first)}));
    }
    if (!want_dec.any()) return Status::Ok();
    return Measure(
        dec, work, want_dec,
        [&](int) { return codec->Decode(floats(first), floats(second), floats(state), floats(out), stream); },
        {BytesOf(first), BytesOf(second), BytesOf(state), BytesOf(out)});
  }

  // One size of Zen's curves, as rank 0 of W ranks does it in comm::ZenAllreduce and the
  // runtime's decode (on a CUDA device: ZenAllreduceDevice's steps, ZenDevicePoint): each
  // rank's input is the topk payload of its own gradient (k = ratio n indices, independent
  // across ranks); the exchanges are replaced by their results, built untimed on the host.
  // encode: rank 0's pairs split by owner, the pairs it owns merged and summed, its partition
  // encoded. decode: the other owners' partitions decoded, all W merged, and the sums divided
  // by W into the zeroed group.
  Status ZenPoint(const pb::Curve& enc, Want want_enc, const pb::Curve& dec, Want want_dec, int64_t n, double ratio) {
    namespace zen = kernels::zen;
    constexpr uint32_t kSeed = 0x5eed;
    const int w = o_.world_size;
    const int64_t k = SelectedCount(n, ratio);
    kernels::CompressorConfig config;
    config.name = "topk";
    config.n = n;
    config.world_size = w;
    config.ratio = ratio;
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Compressor> topk,
                             kernels::MakeCompressor(config, kernels::Backend::kCpu));
    std::vector<float> grad(static_cast<size_t>(n)), state(static_cast<size_t>(topk->state_floats()));
    std::vector<std::vector<std::byte>> payloads(static_cast<size_t>(w));
    std::vector<zen::Partitioned> split(static_cast<size_t>(w));
    for (int r = 0; r < w; ++r) {
      auto& payload = payloads[static_cast<size_t>(r)];
      payload.resize(static_cast<size_t>(topk->payload_bytes()));
      FillGradient(grad, 100 + static_cast<uint64_t>(r));
      std::fill(state.begin(), state.end(), 0.0f);
      CUPCAKE_RETURN_IF_ERROR(topk->Encode(grad, state, 0, payload, nullptr));
      CUPCAKE_ASSIGN_OR_RETURN(zen::SparseView view, zen::TopkPayloadView(payload, k));
      split[static_cast<size_t>(r)] = zen::PartitionByOwner(view, w, kSeed);
    }
    // What each owner receives (the pairs every rank sends it, in rank order), and its partition.
    std::vector<std::vector<std::byte>> partitions(static_cast<size_t>(w));
    std::vector<zen::Pair> received0;
    for (int owner = 0; owner < w; ++owner) {
      std::vector<zen::Pair> received;
      for (const zen::Partitioned& from : split) {
        int64_t begin = 0;
        for (int j = 0; j < owner; ++j) begin += from.counts[static_cast<size_t>(j)];
        const auto first = from.pairs.begin() + begin;
        received.insert(received.end(), first, first + from.counts[static_cast<size_t>(owner)]);
      }
      zen::EncodePartition(zen::MergeSum(received).view(), owner, n, w, kSeed, partitions[static_cast<size_t>(owner)]);
      if (owner == 0) received0 = std::move(received);
    }
    if (device_ != nullptr) {
      return ZenDevicePoint(enc, want_enc, dec, want_dec, n, k, payloads[0], received0, partitions);
    }
    CUPCAKE_ASSIGN_OR_RETURN(zen::SparseView input0, zen::TopkPayloadView(payloads[0], k));
    if (want_enc.any()) {
      std::vector<std::byte> encoded;
      CUPCAKE_RETURN_IF_ERROR(Measure(enc, n, want_enc, [&](int) {
        const zen::Partitioned mine = zen::PartitionByOwner(input0, w, kSeed);
        const zen::Sparse sum = zen::MergeSum(received0);
        zen::EncodePartition(sum.view(), 0, n, w, kSeed, encoded);
        return mine.pairs.size() == static_cast<size_t>(k) ? Status::Ok()
                                                           : InternalError("zen: the partition lost pairs");
      }, {BytesOf(payloads[0]), BytesOf(received0), BytesOf(encoded)}));
    }
    if (!want_dec.any()) return Status::Ok();
    std::vector<float> out(static_cast<size_t>(n));
    CUPCAKE_ASSIGN_OR_RETURN(zen::Sparse own, zen::DecodePartition(partitions[0], 0, n, w, kSeed));
    return Measure(dec, n, want_dec, [&](int) -> Status {
      std::vector<zen::Sparse> parts(static_cast<size_t>(w));
      parts[0] = own;
      for (int r = 1; r < w; ++r) {
        CUPCAKE_ASSIGN_OR_RETURN(parts[static_cast<size_t>(r)],
                                 zen::DecodePartition(partitions[static_cast<size_t>(r)], r, n, w, kSeed));
      }
      const zen::Sparse all = zen::MergePartitions(parts);
      return zen::ScatterDense(all.view(), 1.0f / static_cast<float>(w), out);
    }, ZenDecodeTouched(partitions, out));
  }

  // One size of the non-zero scan (the zen_sparse scheme's encode, host memory): a gradient of n
  // floats with SelectedCount(n, ratio) non-zeros at scattered positions, collected into pairs
  // whose vectors keep their capacity between calls, as the runtime's group does.
  Status NonzeroPoint(const pb::Curve& enc, Want want, int64_t n, double ratio) {
    const int64_t k = SelectedCount(n, ratio);
    std::vector<float> grad(static_cast<size_t>(n), 0.0f), values(static_cast<size_t>(k));
    FillGradient(values, 11);
    const int64_t stride = n / k;  // >= 1; position j * stride + (j * 7919 mod stride)
    for (int64_t j = 0; j < k; ++j) {
      const float v = values[static_cast<size_t>(j)];
      grad[static_cast<size_t>(j * stride + (j * 7919) % stride)] = v != 0.0f ? v : 1.0f;
    }
    kernels::zen::Sparse pairs;
    pairs.indices.reserve(static_cast<size_t>(k));
    pairs.values.reserve(static_cast<size_t>(k));
    return Measure(enc, n, want, [&](int) {
      kernels::zen::CollectNonzeros(grad, pairs);
      return pairs.indices.size() == static_cast<size_t>(k) ? Status::Ok()
                                                            : InternalError("nonzero: the scan lost entries");
    }, {BytesOf(grad), BytesOf(pairs.indices), BytesOf(pairs.values)});
  }

  // ZenPoint's steps on the device, on its stream (the waits inside them included, as the
  // runtime has them): the payload, the received pairs and the partitions uploaded untimed.
  Status ZenDevicePoint(const pb::Curve& enc, Want want_enc, const pb::Curve& dec, Want want_dec, int64_t n, int64_t k,
                        const std::vector<std::byte>& payload0, const std::vector<kernels::zen::Pair>& received0,
                        const std::vector<std::vector<std::byte>>& partitions) {
    namespace zen = kernels::zen;
    constexpr uint32_t kSeed = 0x5eed;
    const int w = o_.world_size;
    void* stream = device_->stream();
    if (zen_steps_ == nullptr) {
      CUPCAKE_ASSIGN_OR_RETURN(zen_steps_, zen::DeviceSteps::Create());
    }
    auto upload = [](const void* host, int64_t bytes) -> StatusOr<kernels::Buffer> {
      CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer b, Zeroed(kernels::Backend::kCuda, std::max<int64_t>(bytes, 4)));
      if (bytes > 0) {
        CUPCAKE_RETURN_IF_ERROR(b.CopyFromHost(host, bytes));
      }
      return b;
    };
    if (want_enc.any()) {
      CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer payload, upload(payload0.data(), static_cast<int64_t>(payload0.size())));
      const int64_t received_bytes = static_cast<int64_t>(received0.size() * sizeof(zen::Pair));
      CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer received, upload(received0.data(), received_bytes));
      CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer encoded, Zeroed(kernels::Backend::kCuda, partitions[0].size()));
      const auto* values = payload.as<float>();
      const auto* indices = reinterpret_cast<const uint32_t*>(payload.as<std::byte>() + 4 * k);
      auto encode = [&](int) -> Status {
        CUPCAKE_RETURN_IF_ERROR(zen_steps_->Partition(indices, values, k, n, w, kSeed, "zen profile", stream).status());
        CUPCAKE_RETURN_IF_ERROR(
            zen_steps_->MergeSum(received.as<zen::Pair>(), static_cast<int64_t>(received0.size()), stream).status());
        return zen_steps_->EncodeMerged(0, n, w, kSeed, encoded.as<std::byte>(), stream);
      };
      CUPCAKE_RETURN_IF_ERROR(Measure(enc, n, want_enc, encode));
    }
    if (!want_dec.any()) return Status::Ok();
    std::vector<std::byte> all;
    for (const auto& part : partitions) all.insert(all.end(), part.begin(), part.end());
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer blocks, upload(all.data(), static_cast<int64_t>(all.size())));
    CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer out, Zeroed(kernels::Backend::kCuda, 4 * n));
    std::vector<zen::DevicePartition> parts;
    int64_t offset = 0;
    for (int r = 0; r < w; ++r) {
      const auto bytes = static_cast<int64_t>(partitions[static_cast<size_t>(r)].size());
      parts.push_back({blocks.as<std::byte>() + offset, bytes, r});
      offset += bytes;
    }
    return Measure(dec, n, want_dec, [&](int) -> Status {
      CUPCAKE_RETURN_IF_ERROR(zen_steps_->Zero(out.data(), 4 * n, stream));
      return zen_steps_->Decode(parts, n, w, kSeed, static_cast<float>(w), out.as<float>(), stream).status();
    });
  }

  bool KernelOn() const { return activity_ != nullptr && kernel_sink_ != nullptr && report_.activity_error.empty(); }

  static std::string Where(const pb::Curve& key, int64_t size) { return CurveKey(key) + " at " + std::to_string(size); }

  StatusOr<bool> Has(ProfileSink& sink, std::map<std::string, std::set<int64_t>>& cache, const pb::Curve& key,
                     int64_t size) {
    std::string k = CurveKey(key);
    auto it = cache.find(k);
    if (it == cache.end()) {
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, sink.PointSizes(key));
      it = cache.emplace(k, std::set<int64_t>(sizes.begin(), sizes.end())).first;
    }
    return it->second.contains(size);
  }

  // What of the point must be measured. With peers, rank 0's sink decides for every rank, so
  // that all of them measure the same points in the same order.
  StatusOr<Want> Wanted(const pb::Curve& key, int64_t size) {
    CUPCAKE_ASSIGN_OR_RETURN(Want w, WantedHere(key, size));
    if (peers_ == nullptr) return w;
    uint8_t bits = static_cast<uint8_t>((w.main ? 1 : 0) | (w.kernel ? 2 : 0));
    CUPCAKE_RETURN_IF_ERROR(peers_->Broadcast(&bits, 1, 0));
    return Want{(bits & 1) != 0, (bits & 2) != 0};
  }

  // What of the point this sink lacks; a point with nothing to measure counts as done.
  StatusOr<Want> WantedHere(const pb::Curve& key, int64_t size) {
    Want w;
    if (o_.force) {
      w.main = true;
      w.kernel = KernelOn();
      return w;
    }
    CUPCAKE_ASSIGN_OR_RETURN(bool has_main, Has(sink_, present_, key, size));
    w.main = !has_main;
    if (!w.main) ++report_.event.skipped;
    if (KernelOn()) {
      CUPCAKE_ASSIGN_OR_RETURN(bool has_kernel, Has(*kernel_sink_, kernel_present_, key, size));
      w.kernel = !has_kernel;
      if (!w.kernel) ++report_.kernel.skipped;
    }
    if (!w.any()) Done();
    return w;
  }

  // Times `fn(i)` (launch call i) for the point's missing measurements, stores them, counts
  // the point done. `touched`: on the host, the buffers every call reads and writes, as they are before
  // the first call (KernelSweepOptions::cold).
  template <typename Fn>
  Status Measure(const pb::Curve& key, int64_t size, Want want, Fn&& fn, const Touched& touched = {}) {
    if (want.main) {
      StatusOr<double> us = device_ != nullptr ? TimeEvents(fn) : TimeWall(fn, touched);
      if (!us.ok()) return us.status().WithPrefix(Where(key, size));
      CUPCAKE_RETURN_IF_ERROR(Store(sink_, report_.event, key, size, *us, device_ != nullptr ? "event" : "wall"));
    }
    if (want.kernel && KernelOn()) {
      StatusOr<std::optional<double>> us = TimeKernels(key, size, !want.main, fn);
      if (!us.ok()) return us.status().WithPrefix(Where(key, size));
      if (us->has_value()) CUPCAKE_RETURN_IF_ERROR(Store(*kernel_sink_, report_.kernel, key, size, **us, "kernel"));
    }
    Done();
    return Status::Ok();
  }

  // The median of `iters` calls after `warmup` untimed ones, each bracketed by the clock, each
  // after `touched` was flushed when the sweep is cold. With peers: every rank starts the point
  // after a barrier, and the slowest rank's median is kept.
  template <typename Fn>
  StatusOr<double> TimeWall(Fn& fn, const Touched& touched) {
    if (peers_ != nullptr) CUPCAKE_RETURN_IF_ERROR(peers_->Barrier());
    for (int i = 0; i < o_.warmup; ++i) {
      if (o_.cold) FlushFromCaches(touched);
      CUPCAKE_RETURN_IF_ERROR(fn(i));
    }
    std::vector<double> us;
    us.reserve(static_cast<size_t>(o_.iters));
    for (int i = 0; i < o_.iters; ++i) {
      if (o_.cold) FlushFromCaches(touched);
      double t0 = clock_->NowUs();
      Status s = fn(o_.warmup + i);
      double t1 = clock_->NowUs();
      CUPCAKE_RETURN_IF_ERROR(s);
      us.push_back(t1 - t0);
    }
    double median = Median(std::move(us));
    if (peers_ != nullptr)
      CUPCAKE_RETURN_IF_ERROR(peers_->Allreduce(&median, &median, 1, comm::DataType::kFloat64, comm::ReduceOp::kMax));
    return median;
  }

  // Cold sweeps: evicts the device's caches before a call, and waits for the eviction, so that
  // it is done before a timed window opens (an event window would otherwise start behind it with
  // the call's launches already queued, hiding their launch gaps; an activity window would
  // collect its memset).
  Status EvictBeforeCall() {
    if (!o_.cold) return Status::Ok();
    CUPCAKE_RETURN_IF_ERROR(device_->EvictCaches());
    return device_->Synchronize();
  }

  // The `warmup` untimed calls, each after the eviction when cold.
  template <typename Fn>
  Status WarmUp(Fn& fn) {
    for (int i = 0; i < o_.warmup; ++i) {
      CUPCAKE_RETURN_IF_ERROR(EvictBeforeCall());
      CUPCAKE_RETURN_IF_ERROR(fn(i));
    }
    return Status::Ok();
  }

  // The median of `iters` calls after `warmup` untimed ones, each between the device's start
  // and stop events (EndTimed waits for the stop event, so calls do not overlap), each after
  // the caches were evicted when cold (outside the window).
  template <typename Fn>
  StatusOr<double> TimeEvents(Fn& fn) {
    CUPCAKE_RETURN_IF_ERROR(WarmUp(fn));
    CUPCAKE_RETURN_IF_ERROR(device_->Synchronize());
    std::vector<double> us;
    us.reserve(static_cast<size_t>(o_.iters));
    for (int i = 0; i < o_.iters; ++i) {
      CUPCAKE_RETURN_IF_ERROR(EvictBeforeCall());
      CUPCAKE_RETURN_IF_ERROR(device_->BeginTimed());
      Status s = fn(o_.warmup + i);
      if (!s.ok()) {
        (void)device_->Synchronize();
        return s;
      }
      CUPCAKE_ASSIGN_OR_RETURN(double t, device_->EndTimed());
      us.push_back(t);
    }
    return Median(std::move(us));
  }

  // The median kernel-only time of `iters` calls (after `warmup` untimed ones when the event
  // pass did not warm up), each between activity Start() and Flush() after Synchronize(), each
  // after the caches were evicted when cold. The eviction is queued and waited for before
  // Start() enables collection: CUPTI records an activity only while its kind is enabled, so
  // the eviction's memset, launched and completed before, is not among the records whose busy
  // time is summed.
  // nullopt, with the reason recorded, when the activity source fails (activity_error: no more
  // kernel-only points) or delivers nothing for a call (kernel_problems: this point only).
  template <typename Fn>
  StatusOr<std::optional<double>> TimeKernels(const pb::Curve& key, int64_t size, bool warm_up, Fn& fn) {
    if (warm_up) CUPCAKE_RETURN_IF_ERROR(WarmUp(fn));
    CUPCAKE_RETURN_IF_ERROR(device_->Synchronize());
    std::vector<double> us;
    us.reserve(static_cast<size_t>(o_.iters));
    for (int i = 0; i < o_.iters; ++i) {
      CUPCAKE_RETURN_IF_ERROR(EvictBeforeCall());
      Status started = activity_->Start();
      if (!started.ok()) {
        report_.activity_error = Where(key, size) + ": " + started.message();
        return std::optional<double>();
      }
      Status call = fn(o_.warmup + i);
      Status synced = call.ok() ? device_->Synchronize() : Status::Ok();
      StatusOr<std::vector<KernelActivity>> records = activity_->Flush();  // also stops collecting
      CUPCAKE_RETURN_IF_ERROR(call);
      CUPCAKE_RETURN_IF_ERROR(synced);
      if (!records.ok()) {
        report_.activity_error = Where(key, size) + ": " + records.status().message();
        return std::optional<double>();
      }
      if (records->empty()) {
        report_.kernel_problems.push_back(Where(key, size) + ": no kernel, memcpy or memset record for timed call " +
                                          std::to_string(i) + "; kernel-only point not stored");
        return std::optional<double>();
      }
      StatusOr<double> busy = KernelBusyUs(*records);
      if (!busy.ok()) {
        report_.activity_error = Where(key, size) + ": " + busy.status().message();
        return std::optional<double>();
      }
      us.push_back(*busy);
    }
    return std::optional<double>(Median(std::move(us)));
  }

  Status Store(ProfileSink& sink, SweepReport& report, const pb::Curve& key, int64_t size, double us,
               const char* method) {
    pb::Curve c = key;
    c.set_method(method);
    c.set_warmup(o_.warmup);
    c.set_iters(o_.iters);
    CUPCAKE_RETURN_IF_ERROR(sink.AddPoint(c, size, us, o_.force));
    ++report.measured;
    report.points.push_back({CurveKey(key), size, us, 0});
    return Status::Ok();
  }

  void Done() {
    ++done_;
    if (progress_) progress_(done_, total_);
  }

  const KernelSweepOptions& o_;
  Clock* clock_;
  KernelDevice* device_;
  ActivitySource* activity_;
  ProfileSink& sink_;
  ProfileSink* kernel_sink_;
  const ProgressFn& progress_;
  comm::Communicator* peers_;  // the ranks sweeping in step with this one, or nullptr
  std::unique_ptr<kernels::zen::DeviceSteps> zen_steps_;  // Zen's curves on a CUDA device
  std::map<std::string, std::set<int64_t>> present_, kernel_present_;
  KernelSweepReport report_;
  int64_t done_ = 0;
  int64_t total_ = 0;
};

}  // namespace

Status ValidateKernelSweepOptions(const KernelSweepOptions& options, bool zen_device) {
  std::string problems;
  auto add = [&](const std::string& line) { problems += (problems.empty() ? "" : "\n") + line; };
  if (options.elements.empty()) add("elements: empty size range; got no sizes, expected at least one");
  for (size_t i = 0; i < options.elements.size(); ++i) {
    if (options.elements[i] < 1 || options.elements[i] > (int64_t{1} << 30))
      add("elements[" + std::to_string(i) + "]: out of range; got " + std::to_string(options.elements[i]) +
          ", expected 1 <= n <= 2^30");
    else if (i > 0 && options.elements[i] <= options.elements[i - 1])
      add("elements[" + std::to_string(i) + "]: not ascending; got " + std::to_string(options.elements[i]) + " after " +
          std::to_string(options.elements[i - 1]) + ", expected increasing sizes");
  }
  if (options.world_size < 1 || options.world_size > 65536)
    add("world_size: out of range; got " + std::to_string(options.world_size) + ", expected 1 <= W <= 65536");
  if (options.warmup < 0) add("warmup: out of range; got " + std::to_string(options.warmup) + ", expected >= 0");
  if (options.iters < 1) add("iters: out of range; got " + std::to_string(options.iters) + ", expected >= 1");
  for (const std::string& name : options.compressors) {
    if (name == kNonzeroCurveName) {
      if (options.device != pb::CPU)
        add("compressors: nonzero (the zen_sparse scheme's scan) runs on the cpu only; got device " +
            std::string(Name(options.device)));
    } else if (name == kPowerSgdName) {
      if (options.rank < 1 || options.rank > kMaxPowerSgdRank)
        add("rank: out of range; got " + std::to_string(options.rank) + ", expected 1 <= rank <= " +
            std::to_string(kMaxPowerSgdRank) + " (powersgd's curves)");
    } else if (name == kZenCurveName) {
      if (!zen_device)
        add("compressors: zen runs on the cpu or a CUDA device; got device " + std::string(Name(options.device)) +
            " without CUDA");
      if (options.world_size < 2)
        add("compressors: zen needs several ranks; got W = " + std::to_string(options.world_size) +
            ", expected W >= 2 (--world-size, or a DB with a cluster)");
    } else if (FindCompressor(name) == nullptr) {
      add(UnknownCompressorError("compressors", name).message());
    }
  }
  if (options.cold && options.device == pb::CPU && !CacheFlushSupported())
    add("cold: this CPU architecture has no cache flush here (x86-64 and AArch64 have); expected cold = false");
  if (options.ratios.empty()) add("ratios: empty; got no ratio, expected at least one");
  for (size_t i = 0; i < options.ratios.size(); ++i) {
    const std::string what = "ratios[" + std::to_string(i) + "]";
    if (Status s = ValidateRatio(what, options.ratios[i]); !s.ok())
      add(s.message());
    else if (i > 0 && options.ratios[i] <= options.ratios[i - 1])
      add(what + ": not ascending; got " + FormatDouble(options.ratios[i]) + " after " +
          FormatDouble(options.ratios[i - 1]) + ", expected increasing ratios");
  }
  if (!problems.empty()) return InvalidArgumentError(problems);
  return Status::Ok();
}

StatusOr<SweepReport> SweepKernels(const KernelSweepOptions& options, Clock& clock, ProfileSink& sink,
                                   const ProgressFn& progress, comm::Communicator* peers) {
  CUPCAKE_RETURN_IF_ERROR(ValidateKernelSweepOptions(options, /*zen_device=*/true));
  if (options.device != pb::CPU)
    return InvalidArgumentError("device: not a host sweep; got " + std::string(Name(options.device)) +
                                ", expected cpu (a gpu sweep runs on a KernelDevice: SweepKernelsOnDevice)");
  Sweep sweep(options, &clock, nullptr, nullptr, sink, nullptr, progress, peers);
  CUPCAKE_RETURN_IF_ERROR(sweep.Run());
  return std::move(sweep.report().event);
}

StatusOr<KernelSweepReport> SweepKernelsOnDevice(const KernelSweepOptions& options, KernelDevice& device,
                                                 ActivitySource* activity, ProfileSink& sink, ProfileSink* kernel_sink,
                                                 const ProgressFn& progress) {
  CUPCAKE_RETURN_IF_ERROR(ValidateKernelSweepOptions(options, device.cuda()));
  if (options.device != pb::GPU)
    return InvalidArgumentError("device: not a device sweep; got " + std::string(Name(options.device)) +
                                ", expected gpu (a cpu sweep runs on a clock: SweepKernels)");
  Sweep sweep(options, nullptr, &device, activity, sink, kernel_sink, progress);
  CUPCAKE_RETURN_IF_ERROR(sweep.Run());
  return std::move(sweep.report());
}

}  // namespace cupcake::profile
