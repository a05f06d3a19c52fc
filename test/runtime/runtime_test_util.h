// Plans built in code over a small synthetic model, the test gradients, and the reference the
// runtime is checked against: every rank's Encode run here with the kernels, the payloads
// summed in rank order (allreduce) or laid side by side (allgather), then Decode.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/runtime/session.h"
#include "cupcake/kernels/powersgd.h"
#include "kernels/powersgd_reference.h"
#include "kernels/scalar_reference.h"

namespace cupcake::runtime::testing {

using Grouping = std::vector<std::pair<int, int>>;  // (first_tensor, last_tensor) per group

// Runs fn(rank index) on one thread per rank.
template <typename F>
void OnEveryRank(int world, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// Session::Create is collective (the ranks agree on their plan before anything else): makes one
// session per rank of `group`, each on a thread of its own; make(r, communicator) makes rank r's
// and returns its StatusOr<std::unique_ptr<Session>>.
template <typename Make>
std::vector<StatusOr<std::unique_ptr<Session>>> CreateOnEveryRank(comm::InProcessGroup& group, int world, Make make) {
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < world; ++r) comms.push_back(group.Rank(r));
  std::vector<StatusOr<std::unique_ptr<Session>>> made;
  for (int r = 0; r < world; ++r) made.emplace_back(InternalError("not made"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] { made[static_cast<size_t>(r)] = make(r, std::move(comms[static_cast<size_t>(r)])); });
  for (auto& t : threads) t.join();
  return made;
}

inline pb::Model SmallModel(const std::string& name = "tiny", std::vector<int64_t> sizes = {37, 5, 128, 1, 64, 200}) {
  pb::Model m;
  m.set_name(name);
  for (size_t i = 0; i < sizes.size(); ++i) {
    pb::Tensor* t = m.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_numel(sizes[i]);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(10);
  }
  return m;
}

inline Grouping LayerWise(const pb::Model& m) {
  Grouping g;
  for (int i = 0; i < m.tensors_size(); ++i) g.emplace_back(i, i);
  return g;
}
inline Grouping OneGroup(const pb::Model& m) { return {{0, m.tensors_size() - 1}}; }
// What a planner might choose for SmallModel: a fused pair, a single, a fused triple.
inline Grouping Planned() { return {{0, 1}, {2, 2}, {3, 5}}; }

inline pb::Plan MakePlan(const pb::Model& model, const Grouping& grouping, const std::string& compressor, int world,
                         double ratio = 0.25) {
  const CompressorInfo* info = FindCompressor(compressor);
  pb::Plan plan;
  plan.set_format("cupcake.plan.v1");
  *plan.mutable_model()->mutable_model() = model;
  plan.mutable_model()->set_fingerprint(ModelFingerprint(model));
  plan.set_profile_fingerprint("0123456789abcdef");
  plan.set_profile_name("test");
  plan.set_world_size(world);
  plan.set_device(pb::CPU);
  pb::CompressorSpec* spec = plan.mutable_compressor();
  spec->set_name(compressor);
  spec->set_ratio(info != nullptr && info->uses_ratio ? ratio : 0);
  spec->set_memory(info != nullptr ? std::string(info->default_memory) : "none");
  spec->set_seed(42);
  for (auto [first, last] : grouping) {
    pb::Group* g = plan.add_groups();
    g->set_first_tensor(first);
    g->set_last_tensor(last);
    int64_t numel = 0;
    for (int i = first; i <= last; ++i) numel += model.tensors(i).numel();
    g->set_numel(numel);
    g->mutable_options()->set_compress(compressor != "fp32");
    g->mutable_options()->set_device(pb::CPU);
    g->mutable_options()->set_collective(info != nullptr ? info->collective : pb::ALLREDUCE);
    g->set_payload_bytes(info != nullptr ? PayloadBytes(*info, numel, ratio) : 4 * numel);
  }
  plan.mutable_predicted()->set_iteration_us(1000);
  plan.mutable_search()->set_algorithm("test");
  return plan;
}

// Small integers, so that sums in any order are exact (fp16 and fp32 allreduce over MPI).
inline float TestGradient(int rank, int iteration, int tensor, int64_t j) {
  return static_cast<float>((rank * 7 + iteration * 13 + tensor * 5 + j * 3 + (j * j) % 11) % 17 - 8);
}

// A job's gradient buffers in plan order: one vector per tensor (kSeparate), or slices of one
// flat buffer, adjacent in plan order (kFlat: how frameworks such as LibTorch keep gradients, so
// the session's groups work on them without fusion buffers). Indexing gives tensor t's span.
enum class Layout { kSeparate, kFlat };
inline const char* LayoutName(Layout layout) { return layout == Layout::kFlat ? "flat" : "separate"; }

class Gradients {
 public:
  Gradients() = default;
  Gradients(const pb::Model& m, Layout layout, float value = 0.0f) {
    int64_t total = 0;
    for (const auto& t : m.tensors()) total += t.numel();
    if (layout == Layout::kFlat) storage_.emplace_back(static_cast<size_t>(total), value);
    int64_t at = 0;
    for (const auto& t : m.tensors()) {
      const size_t n = static_cast<size_t>(t.numel());
      if (layout == Layout::kSeparate) {
        storage_.emplace_back(n, value);
        spans_.emplace_back(storage_.back().data(), n);
      } else {
        spans_.emplace_back(storage_[0].data() + at, n);
      }
      at += t.numel();
    }
  }
  // Moves keep the vectors' heap buffers, so the spans stay valid; copies would not.
  Gradients(Gradients&&) = default;
  Gradients& operator=(Gradients&&) = default;
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;

  std::span<float> operator[](size_t t) const { return spans_[t]; }
  size_t size() const { return spans_.size(); }
  auto begin() const { return spans_.begin(); }
  auto end() const { return spans_.end(); }

 private:
  std::vector<std::vector<float>> storage_;
  std::vector<std::span<float>> spans_;
};

// Registers every gradient of `grads` with `session`, in plan order.
inline Status RegisterAll(Session& session, const pb::Model& m, const Gradients& grads) {
  for (int i = 0; i < m.tensors_size(); ++i)
    CUPCAKE_RETURN_IF_ERROR(session.Register(m.tensors(i).name(), grads[static_cast<size_t>(i)]));
  return Status::Ok();
}

// Makes every gradient of `plan` ready, group by group. With `ckpt` (a Checkpointer, whose
// replica gaps follow the groups `paced` names), group k only once its replica_gaps_requested()
// grew after group k - 1 was made ready: the checkpointer has taken the gap after k - 1 while
// group k was not yet encoded, so that gap's network is idle (Session::AfterCollective's
// next_waiting false), as in a job whose backward outlasts its collectives.
template <typename Ckpt, typename Paced>
Status ReadyGroupByGroup(Session& session, const pb::Plan& plan, const Ckpt* ckpt, Paced paced) {
  int64_t requested = 0;  // the gaps requested before group k - 1 was made ready
  for (int k = 0; k < plan.groups_size(); ++k) {
    if (ckpt != nullptr && k > 0 && paced(k - 1))
      while (ckpt->replica_gaps_requested() == requested) std::this_thread::yield();
    if (ckpt != nullptr) requested = ckpt->replica_gaps_requested();
    for (int i = plan.groups(k).first_tensor(); i <= plan.groups(k).last_tensor(); ++i)
      CUPCAKE_RETURN_IF_ERROR(session.GradientReady(i));
  }
  return Status::Ok();
}

// `Grads`: Gradients, or a vector of per-tensor vectors.
template <typename Grads>
void FillGradients(Grads& grads, int rank, int iteration) {
  for (size_t t = 0; t < grads.size(); ++t)
    for (size_t j = 0; j < grads[t].size(); ++j)
      grads[t][j] = TestGradient(rank, iteration, static_cast<int>(t), static_cast<int64_t>(j));
}

// The seed group `group` uses on `rank`, restated from the formula documented in
// cupcake/runtime/session.h (not the runtime's GroupSeed, which session_test checks against
// hand-computed values): plan_seed + group * 0x9E3779B97F4A7C15, plus the rank for allgather
// compressors (independent rounding), the same on every rank for allreduce ones (randk).
inline uint64_t ExpectedGroupSeed(uint64_t plan_seed, int group, int rank, bool allreduce) {
  const uint64_t shared = plan_seed + static_cast<uint64_t>(group) * 0x9E3779B97F4A7C15ull;
  return allreduce ? shared : shared + static_cast<uint64_t>(rank);
}

// A zeroed buffer of `bytes` bytes on `backend`, and one holding a copy of `host`; abort on
// failure (test references only).
inline kernels::Buffer ZeroedBuffer(kernels::Backend backend, int64_t bytes) {
  auto b = kernels::Buffer::Allocate(backend, bytes);
  if (!b.ok() || !b->Zero().ok()) std::abort();
  return std::move(b).value();
}
inline kernels::Buffer StagedBuffer(kernels::Backend backend, const void* host, int64_t bytes) {
  kernels::Buffer b = ZeroedBuffer(backend, bytes);
  if (!b.CopyFromHost(host, bytes).ok()) std::abort();
  return b;
}

// The expected result of every step, computed from every rank's payloads with the kernels of
// `backend` (kCuda: the CUDA compressors, staged through device buffers; the payloads are summed
// by the test's own loops (kernels/scalar_reference.h) or laid side by side on the host, in rank
// order). The compressors themselves are checked against their definitions in the kernels'
// suite; what this checks is the runtime around them: grouping, seeds, collectives, memory.
class Reference {
 public:
  Reference(const pb::Plan& plan, int world, kernels::Backend backend = kernels::Backend::kCpu)
      : plan_(plan), world_(world), backend_(backend) {
    const pb::CompressorSpec& spec = plan.compressor();
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& pg = plan.groups(k);
      Group g;
      g.numel = pg.numel();
      for (int r = 0; r < world; ++r) {
        kernels::CompressorConfig c;
        c.name = pg.options().compress() ? spec.name() : "fp32";
        c.memory = pg.options().compress() ? spec.memory() : "none";
        c.n = pg.numel();
        c.world_size = world;
        c.ratio = spec.ratio() > 0 ? spec.ratio() : kDefaultRatio;
        c.seed = ExpectedGroupSeed(spec.seed(), k, r, FindCompressor(c.name)->collective == pb::ALLREDUCE);
        auto comp = kernels::MakeCompressor(c, backend);
        if (!comp.ok()) std::abort();
        g.state.push_back(Zeroed(4 * (*comp)->state_floats()));
        g.compressors.push_back(std::move(comp).value());
      }
      groups_.push_back(std::move(g));
    }
  }

  // The averaged gradients (per tensor) after step `iteration`, every rank having filled its
  // buffers with FillGradients(rank, iteration).
  std::vector<std::vector<float>> Step(int iteration) {
    const pb::Model& m = plan_.model().model();
    std::vector<std::vector<float>> out(static_cast<size_t>(m.tensors_size()));
    for (int k = 0; k < plan_.groups_size(); ++k) {
      const pb::Group& pg = plan_.groups(k);
      Group& g = groups_[static_cast<size_t>(k)];
      const kernels::CompressorLayout& layout = g.compressors[0]->layout();
      const size_t pb = static_cast<size_t>(layout.payload_bytes);
      std::vector<std::byte> all(pb * static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r) {
        std::vector<float> flat;
        for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t)
          for (int64_t j = 0; j < m.tensors(t).numel(); ++j) flat.push_back(TestGradient(r, iteration, t, j));
        kernels::Buffer in = Staged(flat.data(), 4 * g.numel), payload = Zeroed(static_cast<int64_t>(pb));
        kernels::Buffer& state = g.state[static_cast<size_t>(r)];
        if (!g.compressors[static_cast<size_t>(r)]
                 ->Encode({in.as<float>(), flat.size()},
                          {state.as<float>(), static_cast<size_t>(state.size_bytes() / 4)},
                          static_cast<uint64_t>(iteration), {payload.as<std::byte>(), pb})
                 .ok() ||
            !kernels::Synchronize(backend_).ok() ||
            !payload.CopyToHost(all.data() + pb * static_cast<size_t>(r), static_cast<int64_t>(pb)).ok())
          std::abort();
      }
      std::vector<std::byte> input;
      if (layout.allreduce) {
        std::vector<std::vector<std::byte>> per_rank;
        for (int r = 0; r < world_; ++r)
          per_rank.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(pb * static_cast<size_t>(r)),
                                all.begin() + static_cast<std::ptrdiff_t>(pb * static_cast<size_t>(r + 1)));
        input = layout.kind == kernels::CompressorKind::kFp16 ? kernels::reference::SumHalves(per_rank)
                                                              : kernels::reference::SumFloats(per_rank);
      } else {
        input = all;
      }
      std::vector<float> decoded(static_cast<size_t>(g.numel));
      kernels::Buffer in = Staged(input.data(), static_cast<int64_t>(input.size())), dec = Zeroed(4 * g.numel);
      if (!g.compressors[0]
               ->Decode({in.as<std::byte>(), input.size()}, {dec.as<float>(), decoded.size()},
                        static_cast<uint64_t>(iteration))
               .ok() ||
          !kernels::Synchronize(backend_).ok() || !dec.CopyToHost(decoded.data(), 4 * g.numel).ok())
        std::abort();
      size_t at = 0;
      for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t) {
        const size_t n = static_cast<size_t>(m.tensors(t).numel());
        out[static_cast<size_t>(t)].assign(decoded.begin() + static_cast<std::ptrdiff_t>(at),
                                           decoded.begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
      }
    }
    return out;
  }

 private:
  struct Group {
    int64_t numel = 0;
    std::vector<std::unique_ptr<kernels::Compressor>> compressors;  // one per rank
    std::vector<kernels::Buffer> state;  // one per rank
  };
  kernels::Buffer Zeroed(int64_t bytes) const { return ZeroedBuffer(backend_, bytes); }
  kernels::Buffer Staged(const void* host, int64_t bytes) const { return StagedBuffer(backend_, host, bytes); }

  pb::Plan plan_;
  int world_;
  kernels::Backend backend_;
  std::vector<Group> groups_;
};

// Naturally sparse gradients (zen_sparse): SmallModel with tensors 2 and 5 recorded at density
// 0.1 and tensor 3 at 0.01. Their gradients: tensors 2 and 5 keep about a tenth of their entries
// (a different tenth on each rank and iteration; index 0 and the last always), tensor 3 is zero
// on every rank, the others dense; non-zero values are small non-zero integers, so any sum is
// exact.
inline pb::Model SparseModel() {
  pb::Model model = SmallModel();
  model.mutable_tensors(2)->set_density(0.1);
  model.mutable_tensors(3)->set_density(0.01);
  model.mutable_tensors(5)->set_density(0.1);
  return model;
}
inline float SparseTestGradient(int rank, int iteration, int tensor, int64_t j, int64_t n) {
  if (tensor == 3) return 0.0f;
  const bool sparse = tensor == 2 || tensor == 5;
  const bool kept = j == 0 || j == n - 1 || (j * 31 + rank * 7 + iteration * 3 + tensor) % 10 == 0;
  if (sparse && !kept) return 0.0f;
  const float v = TestGradient(rank, iteration, tensor, j);
  return v != 0.0f ? v : 1.0f;
}
template <typename Grads>
void FillSparseGradients(Grads& grads, int rank, int iteration) {
  for (size_t t = 0; t < grads.size(); ++t)
    for (size_t j = 0; j < grads[t].size(); ++j)
      grads[t][j] = SparseTestGradient(rank, iteration, static_cast<int>(t), static_cast<int64_t>(j),
                                       static_cast<int64_t>(grads[t].size()));
}
// The mean over `world` ranks of their sparse gradients: the sum (exact) divided by W.
inline std::vector<std::vector<float>> SparseMean(const pb::Model& model, int world, int iteration) {
  std::vector<std::vector<float>> want;
  for (int t = 0; t < model.tensors_size(); ++t) {
    const int64_t n = model.tensors(t).numel();
    std::vector<float>& w = want.emplace_back(static_cast<size_t>(n), 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += SparseTestGradient(r, iteration, t, j, n);
      w[static_cast<size_t>(j)] = sum / static_cast<float>(world);
    }
  }
  return want;
}

// `plan` with every group on `scheme_name` (docs/MODEL.md, v2) and `devices_per_node`: the
// fields ValidatePlan checks (the collective and payload of the scheme's payload step, steps).
inline pb::Plan WithScheme(pb::Plan plan, const std::string& scheme_name, int devices_per_node) {
  const SchemeInfo* s = FindScheme(scheme_name);
  const CompressorInfo* info = FindCompressor(plan.compressor().name());
  if (s == nullptr || info == nullptr) std::abort();
  plan.set_devices_per_node(devices_per_node);
  for (pb::Group& g : *plan.mutable_groups()) {
    const LowRankSizes low_rank =
        s->codec == Codec::kLowRank ? PowerSgdGroupSizes(plan.model().model(), g.first_tensor(), g.last_tensor(),
                                                         plan.compressor().rank(), s->batched)
                                    : LowRankSizes{};
    ApplyScheme(*s, *info, g.options().device(),
                SchemeRatio(*s, plan.compressor().ratio(), plan.model().model(), g.first_tensor(), g.last_tensor()),
                plan.compressor().zen_union(), {plan.world_size(), devices_per_node}, g, &low_rank);
  }
  return plan;
}

// PowerSGD (the powersgd schemes): SmallModel's sizes with shapes recorded, but tensor 3 (a
// tensor recorded before shapes: a vector). At rank 2 tensors 0 ([16, 12]), 2 ([8, 3, 3]) and
// 5 ([20, 10]) are compressed, 1, 3 and 4 ([8, 8]: 32 x 2 >= 64) go as fp32.
inline pb::Model ShapedModel() {
  pb::Model model = SmallModel("shaped", {192, 5, 72, 1, 64, 200});
  const std::vector<std::vector<int64_t>> shapes = {{16, 12}, {5}, {8, 3, 3}, {}, {8, 8}, {20, 10}};
  for (int t = 0; t < model.tensors_size(); ++t)
    for (int64_t d : shapes[static_cast<size_t>(t)]) model.mutable_tensors(t)->add_shape(d);
  return model;
}
inline pb::Plan PowerSgdPlan(const pb::Model& model, const Grouping& grouping, int world, const std::string& scheme,
                             int rank = 2) {
  pb::Plan plan = MakePlan(model, grouping, "fp32", world);
  plan.mutable_compressor()->set_rank(rank);
  return WithScheme(plan, scheme, 1);
}

// The PowerSGD groups of `plan` restated (kernels/powersgd_reference.h, in double), every rank
// filling its buffers with FillGradients(rank, iteration); Q starts from the codec's seeded
// draw for the group's shared seed (ExpectedGroupSeed). The result is the same on every rank.
class PowerSgdReference {
 public:
  PowerSgdReference(const pb::Plan& plan, int world) : plan_(plan), world_(world) {
    const pb::Model& m = plan.model().model();
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& pg = plan.groups(k);
      const SchemeInfo& s = *FindScheme(pg.options().scheme());
      kernels::powersgd::Config c;
      for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t) {
        const pb::Tensor& tensor = m.tensors(t);
        c.shapes.push_back(tensor.shape().empty() ? std::vector<int64_t>{tensor.numel()}
                                                  : std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()));
      }
      c.rank = plan.compressor().rank();
      c.batched = s.batched;
      c.world_size = world;
      c.seed = ExpectedGroupSeed(plan.compressor().seed(), k, 0, true);
      const kernels::powersgd::Layout layout = kernels::powersgd::ResolveLayout(c).value();
      const std::vector<float> q0 = kernels::powersgd::InitialQ(layout);
      Group g;
      g.plan = kernels::reference::powersgd::Plan(c.shapes, c.rank, c.batched, c.min_compression_rate);
      kernels::reference::powersgd::Rank r;
      r.e.assign(static_cast<size_t>(g.plan.padded), 0.0);
      for (const auto& rm : g.plan.matrices)
        for (const kernels::powersgd::Matrix& cm : layout.matrices)
          if (cm.offset == rm.offset) r.q.emplace_back(q0.begin() + cm.q_offset, q0.begin() + cm.q_offset + cm.cols * cm.rank);
      g.ranks.assign(static_cast<size_t>(world), r);
      groups_.push_back(std::move(g));
    }
  }

  // Every tensor's mean approximation after step `iteration`.
  std::vector<std::vector<double>> Step(int iteration) {
    const pb::Model& m = plan_.model().model();
    std::vector<std::vector<double>> out;
    for (int k = 0; k < plan_.groups_size(); ++k) {
      const pb::Group& pg = plan_.groups(k);
      std::vector<std::vector<float>> grads(static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r)
        for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t)
          for (int64_t j = 0; j < m.tensors(t).numel(); ++j)
            grads[static_cast<size_t>(r)].push_back(TestGradient(r, iteration, t, j));
      Group& g = groups_[static_cast<size_t>(k)];
      const std::vector<double> mean = kernels::reference::powersgd::Step(g.plan, g.ranks, grads);
      int64_t at = 0;
      for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t) {
        out.emplace_back(mean.begin() + at, mean.begin() + at + m.tensors(t).numel());
        at += m.tensors(t).numel();
      }
    }
    return out;
  }

 private:
  struct Group {
    kernels::reference::powersgd::Group plan;
    std::vector<kernels::reference::powersgd::Rank> ranks;
  };
  pb::Plan plan_;
  int world_;
  std::vector<Group> groups_;
};

// Within float rounding of the double restatement: |got - want| <= 1e-4 (1 + |want|).
template <typename Grads>
std::string FirstFarFrom(const Grads& got, const std::vector<std::vector<double>>& want) {
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t j = 0; j < want[t].size(); ++j)
      if (!(std::fabs(got[t][j] - want[t][j]) <= 1e-4 * (1 + std::fabs(want[t][j]))))
        return "tensor " + std::to_string(t) + " element " + std::to_string(j) + ": got " + std::to_string(got[t][j]) +
               ", expected " + std::to_string(want[t][j]);
  return "";
}

// The hierarchical schemes restated for the tests (docs/MODEL.md, v2), every rank having filled
// its buffers with FillGradients(rank, iteration): ranks r on node r / d; per node the sum of its
// ranks' group, zero-padded to d x m elements (m = ceil(n / d)); rank (node i, local l) encodes
// shard l of node i's sum with its own compressor of the codec (m elements, world = nodes, the
// plan's memory for the plan's compressor, seeds as the runtime's); the nodes' payloads are
// summed (allreduce codecs) or joined in node order, decoded (the mean over the nodes), and the
// shards joined in local order; the mean over all ranks is that / d (fp32: the sums / W).
// The codec's kernels run on `backend`.
class HierarchicalReference {
 public:
  HierarchicalReference(const pb::Plan& plan, int world, int devices_per_node,
                        kernels::Backend backend = kernels::Backend::kCpu)
      : plan_(plan), world_(world), d_(devices_per_node), backend_(backend) {
    const pb::CompressorSpec& spec = plan.compressor();
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& pg = plan.groups(k);
      const SchemeInfo* s = FindScheme(pg.options().scheme());
      const CompressorInfo& codec = CodecCompressor(*s, *FindCompressor(spec.name()));
      Group g;
      g.numel = pg.numel();
      g.shard = (g.numel + d_ - 1) / d_;
      g.codec = std::string(codec.name);
      if (g.codec != "fp32") {
        for (int r = 0; r < world; ++r) {
          kernels::CompressorConfig c;
          c.name = g.codec;
          c.memory = s->codec == Codec::kCompressor ? spec.memory() : "none";
          c.n = g.shard;
          c.world_size = world / d_;
          c.ratio = spec.ratio() > 0 ? spec.ratio() : kDefaultRatio;
          c.seed = ExpectedGroupSeed(spec.seed(), k, r, codec.collective == pb::ALLREDUCE);
          auto comp = kernels::MakeCompressor(c, backend);
          if (!comp.ok()) std::abort();
          g.state.push_back(ZeroedBuffer(backend, 4 * (*comp)->state_floats()));
          g.compressors.push_back(std::move(comp).value());
        }
      }
      groups_.push_back(std::move(g));
    }
  }

  std::vector<std::vector<float>> Step(int iteration) {
    const pb::Model& m = plan_.model().model();
    std::vector<std::vector<float>> out(static_cast<size_t>(m.tensors_size()));
    const int nodes = world_ / d_;
    for (int k = 0; k < plan_.groups_size(); ++k) {
      const pb::Group& pg = plan_.groups(k);
      Group& g = groups_[static_cast<size_t>(k)];
      const size_t shard = static_cast<size_t>(g.shard);
      std::vector<std::vector<float>> node_sum(static_cast<size_t>(nodes), std::vector<float>(shard * d_, 0.0f));
      for (int r = 0; r < world_; ++r) {
        size_t at = 0;
        for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t)
          for (int64_t j = 0; j < m.tensors(t).numel(); ++j)
            node_sum[static_cast<size_t>(r / d_)][at++] += TestGradient(r, iteration, t, j);
      }
      std::vector<float> joined(shard * d_, 0.0f);
      for (int l = 0; l < d_; ++l) {
        float* into = joined.data() + shard * static_cast<size_t>(l);
        if (g.codec == "fp32") {
          for (int i = 0; i < nodes; ++i)
            for (size_t j = 0; j < shard; ++j) into[j] += node_sum[static_cast<size_t>(i)][shard * l + j];
          continue;
        }
        const kernels::CompressorLayout& layout = g.compressors[0]->layout();
        const size_t pb = static_cast<size_t>(layout.payload_bytes);
        std::vector<std::vector<std::byte>> payloads;
        for (int i = 0; i < nodes; ++i) {
          const int r = i * d_ + l;
          std::vector<float> in(
              node_sum[static_cast<size_t>(i)].begin() + static_cast<std::ptrdiff_t>(shard * l),
              node_sum[static_cast<size_t>(i)].begin() + static_cast<std::ptrdiff_t>(shard * (l + 1)));
          std::vector<std::byte> payload(pb);
          kernels::Buffer in_buffer = StagedBuffer(backend_, in.data(), 4 * g.shard);
          kernels::Buffer payload_buffer = ZeroedBuffer(backend_, static_cast<int64_t>(pb));
          kernels::Buffer& state = g.state[static_cast<size_t>(r)];
          if (!g.compressors[static_cast<size_t>(r)]
                   ->Encode({in_buffer.as<float>(), in.size()},
                            {state.as<float>(), static_cast<size_t>(state.size_bytes() / 4)},
                            static_cast<uint64_t>(iteration), {payload_buffer.as<std::byte>(), pb})
                   .ok() ||
              !kernels::Synchronize(backend_).ok() ||
              !payload_buffer.CopyToHost(payload.data(), static_cast<int64_t>(pb)).ok())
            std::abort();
          payloads.push_back(std::move(payload));
        }
        std::vector<std::byte> input;
        if (layout.allreduce) {
          input = layout.kind == kernels::CompressorKind::kFp16 ? kernels::reference::SumHalves(payloads)
                                                                : kernels::reference::SumFloats(payloads);
        } else {
          for (const auto& p : payloads) input.insert(input.end(), p.begin(), p.end());
        }
        kernels::Buffer input_buffer = StagedBuffer(backend_, input.data(), static_cast<int64_t>(input.size()));
        kernels::Buffer decoded = ZeroedBuffer(backend_, 4 * g.shard);
        if (!g.compressors[static_cast<size_t>(l)]
                 ->Decode({input_buffer.as<std::byte>(), input.size()}, {decoded.as<float>(), shard},
                          static_cast<uint64_t>(iteration))
                 .ok() ||
            !kernels::Synchronize(backend_).ok() || !decoded.CopyToHost(into, 4 * g.shard).ok())
          std::abort();
      }
      const float divisor = static_cast<float>(g.codec == "fp32" ? world_ : d_);
      size_t at = 0;
      for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t) {
        for (int64_t j = 0; j < m.tensors(t).numel(); ++j)
          out[static_cast<size_t>(t)].push_back(joined[at++] / divisor);
      }
    }
    return out;
  }

 private:
  struct Group {
    int64_t numel = 0, shard = 0;
    std::string codec;
    std::vector<std::unique_ptr<kernels::Compressor>> compressors;  // one per rank
    std::vector<kernels::Buffer> state;  // one per rank
  };
  pb::Plan plan_;
  int world_, d_;
  kernels::Backend backend_;
  std::vector<Group> groups_;
};

// Bitwise equality of floats (NaN-safe), reporting the first difference.
template <typename Grads>
std::string FirstDifference(const Grads& got, const std::vector<std::vector<float>>& want) {
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t j = 0; j < want[t].size(); ++j)
      if (std::memcmp(&got[t][j], &want[t][j], sizeof(float)) != 0)
        return "tensor " + std::to_string(t) + " element " + std::to_string(j) + ": got " + std::to_string(got[t][j]) +
               ", expected " + std::to_string(want[t][j]);
  return "";
}

}  // namespace cupcake::runtime::testing
