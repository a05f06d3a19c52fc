// Checkpointer: a snapshot of the job's state every iteration in host memory that outlives the
// training process, and optionally on disk (docs/CHECKPOINT.md; Gemini, SOSP'23, its first half).
//
// The job names its state as byte spans (parameters, optimizer state, buffers) and may attach a
// Session, whose compressor state (error-feedback memory and momentum, PowerSGD's memory and Q;
// ReadState) is this rank's own: in data parallelism everything else is the same on every rank,
// the residuals are not (PowerSGD's Q is). After each optimizer step the job calls Commit(step):
//   1. waits for the previous snapshot's copy and exchange if still running (the only wait of a
//      step);
//   2. a tiny collective (an allgather of seven int64 per rank): the ranks commit the same step,
//      agreed_step() becomes the newest step every rank has completed, and that snapshot's
//      Scope::kShared entries are checked to be the same on every rank (fingerprints its copy
//      computed), and so are replica_gaps;
//   3. with `replicate`, requests this commit's replica exchange from a thread of its own (the
//      next chunk of this rank's stream, its own state, to the ranks that keep its replicas,
//      options below; with `replica_gaps` the session's communication thread requests more, in
//      the idle gaps between its collectives);
//   4. copies the spans marked kAtCommit (and the session's state but its per-element planes)
//      into memory it owns;
//   5. starts the copy of everything into the inactive slot of this rank's POSIX shared-memory
//      segment (/dev/shm/cupcake-<name>-<rank>) on a background thread, which first reads the
//      session's per-element planes while the next step starts (Session::BeginStateRead: that
//      step's encodes wait for it group by group), then copies and checksums the snapshot
//      and flips the slot's header to valid; every `persist_every` steps it then starts a thread
//      that writes this rank's share of the slot's snapshot to `persist_dir` (its kRank entries
//      and 1/W of the kShared entries' bytes; temporary file, fsync, rename, fsync of the
//      directory), which may run into later steps: WaitForCopy does not wait for it.
// Two slots: the copy never touches the newest valid snapshot, so a process killed mid-copy
// leaves that one intact, and a torn slot is never valid (its header flips last, and restore
// checks the checksum anyway).
//
// Restore() after a restart (same world, same name, same spans registered): every rank lists the
// snapshots it holds (valid shared-memory slots whose checksum matches, then persisted shares that
// verify, and with `replicate` the replicas it keeps for others), the ranks agree on the newest
// step all of them hold (themselves in memory; or their own entries in their share or on a rank
// that keeps their replica, which then sends it, with the shared entries from a rank that holds
// that step in memory, else from every rank's share), and each rank copies its snapshot
// of that step into the registered spans (and the session's state), after checking the
// snapshot's rank, world size and every entry's name and size against the job (a snapshot
// rebuilt from a replica must also match the lost rank's own checksum). Find() and Apply()
// are its two halves, for a job that must see the snapshot's metadata (e.g. the shapes of an
// optimizer's state) before it can register the spans to restore into.
//
// Contract with the job: between Commit(step) and the next WaitForCopy() (called by the next
// Commit, or by the job before it writes its state: Python calls it before the optimizer step)
// the job must not write the spans registered kInBackground; spans written during the step
// itself (batch-norm statistics in forward) are registered kAtCommit.
//
// Ownership: owns its segment mappings, its background threads and the copies of kAtCommit spans;
// does not own the spans, the communicator or the session, which must outlive it. Segments
// outlive the process on purpose; RemoveSegment deletes one.
// Thread-safety: one thread at a time (the training loop); the copy and exchange threads are its own. Commit,
// Restore, Find and Apply are collective over the communicator passed in; Create is not.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/status.h"
#include "cupcake/runtime/session.h"

namespace cupcake::runtime {

class NetworkGate;

// One idle network gap of an iteration of the session's plan and the replica chunk sent in it
// (cupcake-plan show --format json: replica_schedule.gaps[i].after_group and .chunk_bytes).
struct ReplicaGap {
  // -1: the gap before the first collective, which Commit's exchange uses; k >= 0: the gap after
  // group k's collective (before group k + 1's, or the iteration's end after the last group).
  int after_group = -1;
  int64_t bytes = 0;  // the most sent in it; 0: nothing. >= 0.
};

struct CheckpointOptions {
  // Names the segments (/dev/shm/cupcake-<name>-<rank>) and files (<name>-<rank>-<step>.ckpt):
  // letters, digits, '.', '_' and '-', at most 100 characters. A restarted job passes the same.
  std::string name = "job";
  // Where persisted snapshots go, each rank's share of them (<name>-<rank>-<step>.ckpt: its kRank
  // entries and 1/W of the kShared entries' bytes; a restore needs every rank's share of a step,
  // or a rank holding it in memory, and the world size that wrote them: files of another world
  // size fail it); empty: none. Must exist. At its first Find or Commit each rank removes the
  // temporaries a killed persist of its own left there (<name>-<rank>-<step>.ckpt.tmp.<pid>
  // whose <pid> is neither this process nor a live process on this host); a live writer's are
  // left alone.
  std::string persist_dir;
  // Persist every this many steps (step % persist_every == 0); 0: never.
  int persist_every = 0;
  // Gemini's replicas: the job's hosts (comm::DiscoverTopology) in groups of
  // `replica_group_hosts` that back each other up; each rank streams its own state (its snapshot
  // without the Scope::kShared entries: the kRank entries, the session's among them, with the
  // snapshot's directory, metadata and checksum) to a rank on each other host of its group (on
  // one host: to the next ranks), which keeps it in /dev/shm/cupcake-<name>-<holder>-replica-<rank>
  // (two slots); a restore on a rank whose host lost its memory rebuilds its snapshot from there
  // and another rank's shared entries of the same step (docs/CHECKPOINT.md, "Replicas").
  // A stream freezes the rank's newest complete snapshot into
  // /dev/shm/cupcake-<name>-<rank>-outgoing (two slots; a restore candidate like the own
  // segment's, and where a lost rank's shared entries come from) and sends its replica in chunks:
  // one per Commit, right after the Commit's agreement, in the network's idle gap between the
  // iteration's last collective and the next iteration's first, and with `replica_gaps` one in
  // each listed gap between the session's collectives.
  // A replica is complete (a restore candidate) once its last chunk arrived and its checksum
  // matches the sender's; then, when every rank's stream has ended, the next Commit starts new
  // ones, all ranks on the same step. Needs at least 2 ranks; every rank passes the same values.
  bool replicate = false;
  // The bytes per chunk (cupcake-plan show --profile prints the chunk that fits the plan's idle
  // gap after Commit); 0: the whole replica in one chunk. >= 0. With replica_gaps: only while a
  // plan other than theirs is active.
  int64_t replica_chunk_bytes = 0;
  // The gaps of the attached session's plan that carry chunks, in increasing after_group, one
  // entry per gap (with `replicate`; needs AttachSession before the first Commit). They are
  // the plan's that is active at AttachSession (each after_group < its groups, else
  // AttachSession fails naming the entry): while that plan is active, Commit sends the chunk of
  // gap -1 (none without such an entry) in place of replica_chunk_bytes, and the session's
  // communication thread hands each listed gap after a group to the exchange thread
  // (Session::SetAfterCollective), which sends that gap's chunk; while another plan is active
  // (SwitchPlan, GraVAC, a restore's), only Commit sends, replica_chunk_bytes. A gap in which
  // some rank's next collective already waits (Session::AfterCollective's next_waiting) carries
  // nothing on any rank (replica_gaps_skipped), and then rests: its next 1, 3, 7 or 15 requests
  // (after 1, 2, 3, 4 or more such exchanges in a row) make no exchange. Every rank passes the
  // same gaps (Commit checks).
  // Empty: replica_chunk_bytes at every Commit.
  std::vector<ReplicaGap> replica_gaps;
  // The most Commits a replica stream may take (with `replicate`): the stream of step s sends all
  // it has left in Commit(s + replica_max_commits)'s exchange, whatever the chunks and gaps, so a
  // job that runs behind its plan (its gaps carrying nothing) still completes a replica every that
  // many steps, at the price of that exchange's time on the network. 0: no bound; 1: the whole
  // replica at each stream's first Commit. >= 0.
  int replica_max_commits = 0;
  // Gemini's m: hosts per group, >= 2; a group survives m - 1 lost hosts.
  int replica_group_hosts = 2;
  // Shared with the communicator of the job's Session (GateCommunicator), so that the session's
  // collectives wait while a chunk is on the network and chunks never overlap them; nullptr:
  // chunks are not coordinated with the session.
  std::shared_ptr<NetworkGate> gate;
  // A persist writes its file in pieces of at most this many bytes, each written and synced to
  // storage (fdatasync) as a transfer of `gate` that begins only when the session has no
  // collective in flight or waiting (NetworkGate::BeginTransferWhenIdle): persist traffic to
  // storage behind the job's network then takes only the idle time between the collectives, and
  // a collective waits at most one piece. Needs persist_every and a gate. 0: the whole file in one
  // write, beside the collectives. >= 0.
  int64_t persist_chunk_bytes = 0;
};

// NetworkGate: one rank's network shared by its training collectives and its checkpoint
// transfers (Gemini's traffic scheduling, docs/CHECKPOINT.md). A transfer (a replica exchange:
// the chunks' sizes, then the chunks) begins without waiting when the session has no collective
// in flight: in Commit (the job commits after Synchronize), or with replica_gaps on the session's
// communication thread right after a group's collective; it ends on the exchange thread. A
// collective entering the gate waits until the transfers in flight, if any, have ended.
// Transfers are collectives of their own among the ranks' checkpointers, requested at the same
// points on every rank (a Commit, the end of the same group's collective) and run in that order,
// so no rank's transfer waits for a training collective and the two cannot deadlock.
// A persist's piece (persist_chunk_bytes) is a transfer of this rank alone: it begins only when
// no collective is in flight or waiting to enter (BeginTransferWhenIdle), so it takes only the
// idle time between collectives and a collective that arrives meanwhile waits at most one piece.
// Thread-safety: every member from any thread.
class NetworkGate {
 public:
  void BeginTransfer();
  // Waits until no collective is in flight or waiting to enter, then as BeginTransfer.
  void BeginTransferWhenIdle();
  void EndTransfer();
  void EnterCollective();
  void LeaveCollective();
  // In order: transfers begun by BeginTransfer (replica exchanges); transfers begun by
  // BeginTransferWhenIdle (persist pieces); collectives that entered the gate; collectives that
  // waited for a transfer of either kind; BeginTransfer's transfers begun while a collective was in
  // flight (0 when the session's communicator is gated and commits follow its Synchronize).
  int64_t transfers() const;
  int64_t idle_transfers() const;
  int64_t collectives() const;
  int64_t collectives_waited() const;
  int64_t transfers_during_collectives() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  int transfers_in_flight_ = 0, collectives_in_flight_ = 0, collectives_waiting_ = 0;
  int64_t transfers_ = 0, idle_transfers_ = 0, collectives_ = 0, waited_ = 0, overlapping_ = 0;
};

// `inner` (host memory) behind `gate`: each collective (and each communicator Split off it)
// enters the gate first and leaves it when it returns. For the Session's communicator:
// Session::Create(plan, GateCommunicator(gate, std::move(comm))). Abort passes straight through.
std::unique_ptr<comm::Communicator> GateCommunicator(std::shared_ptr<NetworkGate> gate,
                                                     std::unique_ptr<comm::Communicator> inner);

// When a span is copied: kInBackground during the next iteration (the job leaves it alone until
// WaitForCopy), kAtCommit inside Commit (for memory the next iteration writes before its
// optimizer step).
enum class Capture { kInBackground, kAtCommit };

// Whose a span is: kRank, this rank's own; kShared, the same bytes on every rank at every commit
// (data parallelism: parameters and optimizer state). Replicas carry only the kRank entries (the
// session's among them, AttachSession); a rank whose host lost its memory takes the kShared ones
// from another rank's snapshot of the same step. Entries registered kShared that differ between
// ranks fail the next Commit on every rank, naming the first such entry (Commit), and, should a
// snapshot escape that check, the restore that rebuilds it (the rebuilt snapshot must match the
// lost rank's own checksum): never a silent mix.
enum class Scope { kRank, kShared };

// What a restore found: the newest step every rank holds (0: none, a fresh job), this rank's
// metadata of it, where it came from, and the snapshots refused on the way (one line each, e.g.
// a torn or corrupt slot: `/dev/shm/cupcake-job-0: slots[1].checksum: does not match the
// contents; got 0x..., expected 0x... (stored)`).
struct RestorePoint {
  int64_t step = 0;
  std::string metadata;
  std::string source;  // the segment or file
  std::vector<std::string> refused;
  // The snapshot's entries, in order: name and size in bytes.
  std::vector<std::pair<std::string, int64_t>> entries;
};

class Checkpointer {
 public:
  // Local (no collective): checks the options; the segment is opened at the first Commit or Find.
  // `communicator` (not owned) is used for the agreements; host memory, any backend.
  static StatusOr<std::unique_ptr<Checkpointer>> Create(const CheckpointOptions& options,
                                                        comm::Communicator* communicator);
  // Waits for the copy in progress (its error, if any, is dropped: nobody is left to report to).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Registers the next entry: `name` (unique) and its memory, which must stay valid while
  // registered. Between commits; Clear() drops every entry (to register them anew when the job's
  // memory moved). A restore matches entries by position, name and size.
  Status Add(const std::string& name, std::span<std::byte> bytes, Capture capture = Capture::kInBackground,
             Scope scope = Scope::kRank);
  Status AddFloats(const std::string& name, std::span<float> values, Capture capture = Capture::kInBackground,
                   Scope scope = Scope::kRank);
  void Clear();
  // Snapshots include `session`'s state, captured at commit, as entries in this order:
  // "session.plan" (with several plans: the active one and, with GraVAC, its controller's state;
  // ReadControlState) and "session.gravac" (with GraVAC: this rank's part of the current window),
  // "session.error_feedback" and "session.momentum" (ReadState, per element),
  // "session.powersgd.padding" (batched PowerSGD groups' memory beyond their elements, which
  // session.error_feedback holds) and "session.powersgd.q" (each only when not empty), and
  // "session.iteration". A restore writes them back in that order (WriteControlState,
  // WriteState, SetIteration: random choices and GraVAC's decisions then continue as in the lost
  // run). They are kRank, except a plane no plan of the session keeps (Session::KeepsState:
  // zeros on every rank), PowerSGD's padding and Q and the plan (each the same on every rank),
  // which are kShared. Attach after the session's last AddPlan and EnableGravac (they change the sizes).
  // Not owned; nullptr detaches.
  Status AttachSession(Session* session);

  // Collective (every rank, the same step, steps increasing, >= 1): see the header comment.
  // The first Commit of a Checkpointer that did not restore starts a new history: this rank's
  // snapshots of the same name (segment slots and persisted files, another run's) are dropped.
  // Returns an error of the previous background copy (or persist) if it failed; the snapshot is
  // then not taken. So, on every rank, when the kShared entries of the snapshot every rank
  // completed last (the previous Commit's) differ between the ranks: FailedPrecondition naming
  // the first such entry and that step (`<segment>: entries[3]: registered Scope::kShared
  // ('fc.weight'), but its bytes differ between the ranks at step 7; got fingerprint 0x... on
  // rank 0, 0x... on rank 1, expected the same bytes on every rank (...); the snapshot of step 7
  // is dropped on every rank`). That snapshot is dropped (slot and file): agreed_step() never
  // reaches it and no restore takes it. The last snapshot before the job ends or crashes is
  // never checked (no later Commit).
  Status Commit(int64_t step, std::string_view metadata = {});
  // Waits for the background copy (not for a persist still writing its file, nor for the queued
  // replica exchanges, which read only their own copy; Commit waits for those); its error, or a
  // persist's or an exchange's that has ended, if any.
  Status WaitForCopy();
  // Waits for the background copy, the persist in progress and the queued replica exchanges;
  // their errors, if any.
  Status WaitForPersist();
  // The newest step every rank had completed at the last Commit or restore (0: none yet).
  int64_t agreed_step() const;
  // The newest step this rank has completed in its memory (its valid slot).
  int64_t local_step() const;
  // The newest step whose persisted share this process has written (0: none yet). A persist runs
  // on a thread of its own after its step's copy and may end during a later step; the copy two
  // commits later waits for it, and a later Commit or WaitForCopy returns its error.
  int64_t persisted_step() const;
  // With `replicate`: the newest step whose replica of this rank's own entries this process has
  // sent in full to its holders (0: none yet). Each holder checks it on arrival (a failed check
  // fails that holder's exchange). How stale a restore of this rank from its peers would be.
  int64_t replicated_step() const;
  // With replica_gaps: the gaps after a group that carried no chunk because some rank's next
  // collective was already waiting there (its step behind the plan's timeline) or the gap was
  // resting after that (replica_gaps), so far. Their bytes go in later gaps: the replica takes
  // more iterations.
  int64_t replica_gaps_skipped() const;
  // With replica_gaps: the gaps after a group whose collective has ended while their plan was
  // active, from the first Commit on, so far; each then made an exchange or none (skipped, or
  // every stream had ended).
  int64_t replica_gaps_requested() const;

  // Collective: Find() then Apply(). Returns the step restored (0: nothing to restore, the spans
  // are untouched).
  StatusOr<RestorePoint> Restore();
  // Collective: agrees on the newest step every rank holds and loads this rank's copy of it
  // (verified). FailedPrecondition when some rank holds snapshots but no step is held by all,
  // naming what each rank holds.
  StatusOr<RestorePoint> Find();
  // Collective, after a Find that found a step: copies the loaded snapshot into the registered
  // entries (and the attached session's state). Every mismatch between the snapshot and the job
  // is reported together (`<segment>: entries[2].size_bytes: does not match the job; got 400,
  // expected 40 ('fc.bias')`); when any rank fails every rank fails. Snapshots newer than the
  // restored step (a rank got further before the crash) are invalidated, so they can never be
  // mixed with the resumed run's. A job that could not prepare its entries passes its error as
  // `job_status`: the other ranks then fail too, instead of waiting for this one. A snapshot Find
  // found but could not load (a replica that arrived changed, persisted shares that do not fit;
  // its metadata is then empty) fails with that error, before `job_status`.
  Status Apply(const Status& job_status = Status::Ok());

  // The shared-memory name of rank `rank`'s segment ("/cupcake-<name>-<rank>") and its path
  // under /dev/shm on Linux.
  static std::string SegmentName(const std::string& name, int rank);
  // The prefix of the segments in which rank `rank` keeps other ranks' snapshots (replicate).
  static std::string ReplicaSegmentName(const std::string& name, int rank);
  // The segment in which rank `rank` keeps rank `source`'s snapshots: the prefix, "-<source>".
  static std::string ReplicaOfSegmentName(const std::string& name, int rank, int source);
  // The segment in which rank `rank` keeps the snapshots it streams to its successor (replicate).
  static std::string OutgoingSegmentName(const std::string& name, int rank);
  // Deletes rank `rank`'s segments, its own, its outgoing and its replicas (shm_unlink); Ok when
  // there are none.
  static Status RemoveSegment(const std::string& name, int rank);

  class Impl;

 private:
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cupcake::runtime
