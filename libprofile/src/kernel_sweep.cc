#include "cupcake/profile/kernel_sweep.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile {
namespace {

// Deterministic gradients in [-1, 1) (a 64-bit LCG keyed by `seed`).
void FillGradient(std::span<float> g, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : g) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
  }
}

// The median of `iters` timed calls of `fn` after `warmup` untimed ones.
template <typename Fn>
StatusOr<double> Time(Clock& clock, int warmup, int iters, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) CUPCAKE_RETURN_IF_ERROR(fn(i));
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    double t0 = clock.NowUs();
    Status s = fn(warmup + i);
    double t1 = clock.NowUs();
    CUPCAKE_RETURN_IF_ERROR(s);
    us.push_back(t1 - t0);
  }
  return Median(std::move(us));
}

class Sweep {
 public:
  Sweep(const KernelSweepOptions& o, Clock& clock, ProfileSink& sink, const ProgressFn& progress)
      : o_(o), clock_(clock), sink_(sink), progress_(progress) {}

  // Whether the point must be measured; counts it as done (skipped) otherwise.
  StatusOr<bool> Wanted(const pb::Curve& key, int64_t size) {
    if (o_.force) return true;
    std::string k = CurveKey(key);
    auto it = present_.find(k);
    if (it == present_.end()) {
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, sink_.PointSizes(key));
      it = present_.emplace(k, std::set<int64_t>(sizes.begin(), sizes.end())).first;
    }
    if (!it->second.contains(size)) return true;
    ++report_.skipped;
    Done();
    return false;
  }

  Status Store(const pb::Curve& key, int64_t size, double us) {
    pb::Curve c = key;
    c.set_method("wall");
    c.set_warmup(o_.warmup);
    c.set_iters(o_.iters);
    CUPCAKE_RETURN_IF_ERROR(sink_.AddPoint(c, size, us, o_.force));
    ++report_.measured;
    report_.points.push_back({CurveKey(key), size, us, 0});
    Done();
    return Status::Ok();
  }

  void Done() {
    ++done_;
    if (progress_) progress_(done_, total_);
  }

  Status Run() {
    std::vector<std::string> names = o_.compressors;
    if (names.empty())
      for (std::string_view n : CompressorNames()) names.emplace_back(n);
    total_ = static_cast<int64_t>((names.size() * 2 + 2) * o_.elements.size());
    const kernels::Backend backend = kernels::Backend::kCpu;
    for (const std::string& name : names) {
      pb::Curve enc, dec;
      enc.set_kind(pb::ENCODE);
      enc.set_compressor(name);
      enc.set_device(o_.device);
      dec = enc;
      dec.set_kind(pb::DECODE);
      for (int64_t n : o_.elements) {
        CUPCAKE_ASSIGN_OR_RETURN(bool want_enc, Wanted(enc, n));
        CUPCAKE_ASSIGN_OR_RETURN(bool want_dec, Wanted(dec, n));
        if (!want_enc && !want_dec) continue;
        kernels::CompressorConfig config;
        config.name = name;
        config.n = n;
        config.world_size = o_.world_size;
        config.ratio = o_.ratio;
        CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Compressor> comp, kernels::MakeCompressor(config, backend));
        std::vector<float> grad(static_cast<size_t>(n)), out(static_cast<size_t>(n));
        std::vector<float> state(static_cast<size_t>(comp->state_floats()));
        std::vector<std::byte> payload(static_cast<size_t>(comp->payload_bytes()));
        FillGradient(grad, 1);
        if (want_enc) {
          CUPCAKE_ASSIGN_OR_RETURN(double us, Time(clock_, o_.warmup, o_.iters, [&](int i) {
            return comp->Encode(grad, state, static_cast<uint64_t>(i), payload);
          }));
          CUPCAKE_RETURN_IF_ERROR(Store(enc, n, us));
        }
        if (want_dec) {
          // The decode input: W payloads of W ranks' gradients side by side (allgather), or
          // one buffer standing for the reduced one (allreduce).
          const int ranks = comp->layout().allreduce ? 1 : o_.world_size;
          std::vector<std::byte> input(static_cast<size_t>(comp->decode_input_bytes()));
          for (int r = 0; r < ranks; ++r) {
            FillGradient(grad, 100 + static_cast<uint64_t>(r));
            std::fill(state.begin(), state.end(), 0.0f);
            std::span<std::byte> slot(input.data() + static_cast<size_t>(r) * payload.size(), payload.size());
            CUPCAKE_RETURN_IF_ERROR(comp->Encode(grad, state, 0, slot));
          }
          CUPCAKE_ASSIGN_OR_RETURN(double us, Time(clock_, o_.warmup, o_.iters, [&](int) {
            return comp->Decode(input, out, 0);
          }));
          CUPCAKE_RETURN_IF_ERROR(Store(dec, n, us));
        }
      }
    }
    // Copies: pack a group's gradient into the fusion buffer, unpack it back (4n bytes).
    for (pb::CopyOp op : {pb::PACK, pb::UNPACK}) {
      pb::Curve key;
      key.set_kind(pb::COPY);
      key.set_copy_op(op);
      key.set_device(o_.device);
      for (int64_t n : o_.elements) {
        const int64_t bytes = 4 * n;
        CUPCAKE_ASSIGN_OR_RETURN(bool want, Wanted(key, bytes));
        if (!want) continue;
        std::vector<float> tensor(static_cast<size_t>(n)), fusion(static_cast<size_t>(n));
        FillGradient(tensor, 7);
        float* dst = op == pb::PACK ? fusion.data() : tensor.data();
        const float* src = op == pb::PACK ? tensor.data() : fusion.data();
        CUPCAKE_ASSIGN_OR_RETURN(double us, Time(clock_, o_.warmup, o_.iters, [&](int) {
          std::memcpy(dst, src, static_cast<size_t>(bytes));
          return Status::Ok();
        }));
        CUPCAKE_RETURN_IF_ERROR(Store(key, bytes, us));
      }
    }
    return Status::Ok();
  }

  SweepReport& report() { return report_; }

 private:
  const KernelSweepOptions& o_;
  Clock& clock_;
  ProfileSink& sink_;
  const ProgressFn& progress_;
  std::map<std::string, std::set<int64_t>> present_;
  SweepReport report_;
  int64_t done_ = 0;
  int64_t total_ = 0;
};

}  // namespace

StatusOr<SweepReport> SweepKernels(const KernelSweepOptions& options, Clock& clock, ProfileSink& sink,
                                   const ProgressFn& progress) {
  std::string problems;
  auto add = [&](const std::string& line) { problems += (problems.empty() ? "" : "\n") + line; };
  if (options.elements.empty()) add("elements: empty size range; got no sizes, expected at least one");
  for (size_t i = 0; i < options.elements.size(); ++i) {
    if (options.elements[i] < 1 || options.elements[i] > (int64_t{1} << 30))
      add("elements[" + std::to_string(i) + "]: out of range; got " + std::to_string(options.elements[i]) +
          ", expected 1 <= n <= 2^30");
    else if (i > 0 && options.elements[i] <= options.elements[i - 1])
      add("elements[" + std::to_string(i) + "]: not ascending; got " + std::to_string(options.elements[i]) +
          " after " + std::to_string(options.elements[i - 1]) + ", expected increasing sizes");
  }
  if (options.world_size < 1 || options.world_size > 65536)
    add("world_size: out of range; got " + std::to_string(options.world_size) + ", expected 1 <= W <= 65536");
  if (options.warmup < 0) add("warmup: out of range; got " + std::to_string(options.warmup) + ", expected >= 0");
  if (options.iters < 1) add("iters: out of range; got " + std::to_string(options.iters) + ", expected >= 1");
  for (const std::string& name : options.compressors)
    if (FindCompressor(name) == nullptr) add(UnknownCompressorError("compressors", name).message());
  if (!problems.empty()) return InvalidArgumentError(problems);
  if (options.device == pb::GPU) {
    CUPCAKE_RETURN_IF_ERROR(kernels::BackendAvailable(kernels::Backend::kCuda).WithPrefix("device gpu"));
    return FailedPreconditionError(
        "device gpu: GPU kernel sweeps (CUDA events, CUPTI kernel time, d2h/h2d copies) are not implemented yet; "
        "got --device gpu, expected --device cpu");
  }
  if (options.device != pb::CPU)
    return InvalidArgumentError("device: unknown; got " + std::string(Name(options.device)) + ", expected cpu or gpu");
  Sweep sweep(options, clock, sink, progress);
  CUPCAKE_RETURN_IF_ERROR(sweep.Run());
  return std::move(sweep.report());
}

}  // namespace cupcake::profile
