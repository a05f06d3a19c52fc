"""One run of bench/python/tta.sh (time to accuracy), under mpirun: trains a model data-parallel
over the MPI ranks until its held-out evaluation reaches the target or --max-steps steps, and
reports the training time it took.

  tta.py --arm ddp-fp32|ddp-fp16|ddp-powersgd --seed S [--model cnn|lstm] [flags]
  tta.py --arm cupcake --plan PLAN.pb --seed S         (or CUPCAKE_RECORD set: record the model)
  tta.py --arm gravac --plan LADDER.pb --seed S [--decisions FILE.jsonl]

--model cnn (the default; recorded as ttadigits): the handwritten digits (bench/python/digits.py);
two 3x3 convolutions (1 -> W -> 2W channels), a 2x2 max-pool, then a wide fully connected layer
(2W*16 -> --hidden) and the classifier; --width 32 --hidden 2048: 2,138,506 parameters (8.2 MiB
of float32 gradients), almost all in fc1, so the exchange, not the compute, is what a compressor
can shorten. Target: held-out accuracy at or above --target (0.95).

--model lstm (recorded as ttatext): base-files' license texts (bench/python/text.py), sequences of
--seq-len characters (32); an embedding (97 symbols -> --embed, 32), --layers LSTM layers (1) of
--hidden units (384) and a linear decoder to the 97 symbols: 682,497 parameters (2.6 MiB of
gradients; 94% in the LSTM's two weight matrices, 1536 x 32 and 1536 x 384), sized so that a step
of 8 sequences per rank costs about 250 ms of one core here, so that at 200 Mbit/s (about 110 ms
for 2.6 MiB each way) the exchange is a large part of a step. Target: the held-out cross-entropy
(nats per character, over every position of the held-out blocks) at or below --target-loss (1.8);
--target (next-character accuracy) is also accepted, one or the other. Each sequence starts from a
zero state. The averaged gradient's norm is clipped to --clip (1.0) before the step: SGD at lr 1
with norm clipping, as Zaremba et al. (2014) train their LSTM language models.

Both: SGD with momentum 0.9, batch --batch per rank; every rank starts from the weights
torch.manual_seed(S) gives and, each epoch, takes its own shard (rank r: every size-th sample
from r) of a permutation of the training samples (digits, or text blocks) seeded with (S, epoch).
Flags left out take the model's defaults (MODEL_DEFAULTS).

Timing contract: a step (batch already made; zero_grad, forward, backward, step with its
synchronization) is timed on every rank with time.perf_counter; its time is the slowest rank's
(gathered after the run, never inside it). Every --eval-every steps every rank computes the
held-out accuracy and loss of its replica (the replicas are equal in every arm), outside the
clock; rank 0's values decide, broadcast over gloo, so every rank stops at the same step. Time to
target: the sum of the step times up to the first evaluation that meets the target (accuracy at
or above --target, loss at or below --target-loss); evaluation, set-up (model, optimizer, plan
load) and the gathering are excluded. A step includes the clipping (and, for Cupcake arms, the
synchronize() before it).

Bytes sent: with --bytes-iface IFACE (the testbed's eth0: one rank per network namespace) each
rank's transmitted bytes on IFACE from /proc/net/dev, from before the first step to after the
last (gloo's and MPI's traffic together, the evaluation's one broadcast per --eval-every steps
included); without it, null (over loopback no counter separates a rank's traffic). The GraVAC arm
also reports the runtime's own count: the sum of its decisions' bytes_sent, each a window's payload
bytes on that rank (docs/ADAPTIVE.md); a last, unfinished window is not in it.

Output (rank 0): one JSON line on stdout (the run's numbers) and, with --record FILE, the same
object plus every step's time and every evaluation ([step, accuracy, held-out loss]) as JSON. torch.distributed (gloo) is
initialized in every arm: MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500).
Exit 0 after a run (reaching the target or not), 2 on bad flags, 1 on a bad data file.
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import digits
import text
from arms import DDP_ARMS, finish, percentile, wrap

MODEL_NAMES = {"cnn": "ttadigits", "lstm": "ttatext"}  # the recorded model's name, per --model
# Per --model, the defaults of the flags left unset (None in parse_args): the CNN's are what the
# harness has always run; the LSTM's are sized in the module's doc.
MODEL_DEFAULTS = {
    "cnn": {"batch": 32, "hidden": 2048, "lr": 0.02, "clip": 0, "target": 0.95},
    "lstm": {"batch": 8, "hidden": 384, "lr": 1.0, "clip": 1.0, "target_loss": 1.8},
}


class DigitsCnn(torch.nn.Module):
    """conv(1->W) relu, conv(W->2W) relu, maxpool 2, fc(2W*4*4 -> hidden) relu, fc(hidden -> 10)."""

    def __init__(self, width, hidden):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = torch.nn.Linear(2 * width * 4 * 4, hidden)
        self.fc2 = torch.nn.Linear(hidden, digits.CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Batches:
    """The training samples as tensors, and each rank's batch of a step (see the module's doc)."""

    def __init__(self, d, train, held_out, batch, seed, rank, size):
        to_x = lambda idx: torch.tensor([d.images[i] for i in idx], dtype=torch.float32).view(  # noqa: E731
            -1, 1, digits.SIDE, digits.SIDE) / digits.PIXEL_MAX
        self.x, self.y = to_x(train), torch.tensor([d.labels[i] for i in train])
        self.eval_x, self.eval_y = to_x(held_out), torch.tensor([d.labels[i] for i in held_out])
        self.batch, self.seed, self.rank, self.size = batch, seed, rank, size
        self.per_epoch = len(train) // size // batch  # whole batches of a rank's shard
        if self.per_epoch < 1:
            raise ValueError("--batch: too large; got %d, expected <= %d (%d training samples over %d ranks)"
                             % (batch, len(train) // size, len(train), size))
        self.epoch, self.shard = None, None

    def get(self, step):
        """Step 0, 1, ...: the rank's batch (x, y)."""
        epoch, b = divmod(step, self.per_epoch)
        if epoch != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
            self.epoch, self.shard = epoch, torch.randperm(len(self.y), generator=g)[self.rank::self.size]
        idx = self.shard[b * self.batch:(b + 1) * self.batch]
        return self.x[idx], self.y[idx]

    def evaluate(self, module):
        """(accuracy, mean cross-entropy loss) of module on the held-out samples."""
        with torch.no_grad():
            out = module(self.eval_x)
            return (out.argmax(1) == self.eval_y).float().mean().item(), F.cross_entropy(out, self.eval_y).item()


class CharLstm(torch.nn.Module):
    """A character language model: embedding (VOCAB_SIZE -> E), an LSTM of --layers layers of
    --hidden units, a linear decoder to VOCAB_SIZE logits per position. Every sequence starts from
    a zero state (no state carried between batches)."""

    def __init__(self, embed, hidden, layers):
        super().__init__()
        self.embed = torch.nn.Embedding(text.VOCAB_SIZE, embed)
        self.lstm = torch.nn.LSTM(embed, hidden, layers, batch_first=True)
        self.decoder = torch.nn.Linear(hidden, text.VOCAB_SIZE)

    def forward(self, x):
        return self.decoder(self.lstm(self.embed(x))[0])


def sequence_loss(out, y):
    """Mean cross-entropy over every position of a batch of sequences (nats per character)."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


class TextBatches(Batches):
    """The corpus's blocks as tensors (text.split, text.pairs), each rank's batch of a step as
    Batches makes it for the digits (the same sharding of a seeded permutation per epoch), and the
    held-out evaluation: next-character accuracy and cross-entropy over every held-out position."""

    def __init__(self, corpus, seq_len, batch, seed, rank, size):
        train, held_out = text.split(corpus, seq_len)
        self.x, self.y = (torch.tensor(t) for t in text.pairs(train))
        self.eval_x, self.eval_y = (torch.tensor(t) for t in text.pairs(held_out))
        self.batch, self.seed, self.rank, self.size = batch, seed, rank, size
        self.per_epoch = len(train) // size // batch
        if self.per_epoch < 1:
            raise ValueError("--batch: too large; got %d, expected <= %d (%d training sequences over %d ranks)"
                             % (batch, len(train) // size, len(train), size))
        self.epoch, self.shard = None, None

    def evaluate(self, module):
        with torch.no_grad():
            out = module(self.eval_x)
            return (out.argmax(-1) == self.eval_y).float().mean().item(), sequence_loss(out, self.eval_y).item()


def tx_bytes(iface):
    """The bytes IFACE has transmitted in this process's network namespace (/proc/net/dev)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if counters and name.strip() == iface:
                return int(counters.split()[8])  # receive: 8 fields, then transmit bytes
    raise SystemExit("tta.py: --bytes-iface: no interface %r in /proc/net/dev" % iface)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", required=True, choices=list(DDP_ARMS) + ["cupcake", "gravac"])
    parser.add_argument("--model", choices=sorted(MODEL_NAMES), default="cnn",
                        help="cnn: the digits CNN; lstm: the character LSTM on the license texts")
    parser.add_argument("--name", help="the run's arm name in the output (default: --arm)")
    parser.add_argument("--plan", help="cupcake: a plan; gravac: a ladder (cupcake-plan search --ratios)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target", type=float,
                        help="held-out accuracy to reach (>=), in (0, 1]; the CNN's default: 0.95")
    parser.add_argument("--target-loss", type=float,
                        help="held-out cross-entropy (nats per sample or character) to reach (<=), > 0; "
                             "the LSTM's default: %g" % MODEL_DEFAULTS["lstm"]["target_loss"])
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--batch", type=int, help="per rank (cnn: 32 images; lstm: 8 sequences)")
    parser.add_argument("--width", type=int, default=32, help="cnn: the first convolution's channels")
    parser.add_argument("--hidden", type=int, help="cnn: fc1's width (2048); lstm: the LSTM's units (384)")
    parser.add_argument("--embed", type=int, default=32, help="lstm: the embedding's width")
    parser.add_argument("--layers", type=int, default=1, help="lstm: LSTM layers")
    parser.add_argument("--seq-len", type=int, default=32, help="lstm: characters per sequence")
    parser.add_argument("--lr", type=float, help="SGD's (momentum 0.9); cnn: 0.02; lstm: 1.0")
    parser.add_argument("--clip", type=float,
                        help="the averaged gradient's norm is clipped to this before each step; 0: no clipping "
                             "(cnn: 0; lstm: 1.0)")
    parser.add_argument("--bucket-mib", type=float, default=25)
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--gravac-window", type=int, default=10)
    parser.add_argument("--gravac-epsilon", type=float, default=0.7)
    parser.add_argument("--gravac-omega", type=float, default=0.01)
    parser.add_argument("--data", help="cnn: the digits file (%s); lstm: comma-separated text files (default: "
                                       "text.DEFAULT_PATHS, in %s)" % (digits.DEFAULT_PATH, text.DEFAULT_DIR))
    parser.add_argument("--bytes-iface", help="count each rank's bytes sent on this interface (testbed: eth0)")
    parser.add_argument("--record", help="rank 0 writes the run with every step's time here (JSON)")
    parser.add_argument("--decisions", help="gravac: rank 0 writes opt.decisions here (JSON lines)")
    parser.add_argument("--deadline-s", type=int, default=0,
                        help="each rank is killed (SIGALRM) after this many seconds; 0: never")
    args = parser.parse_args()
    check_args(parser, args)
    return args


def check_args(parser, args):
    """Fills the model's defaults (MODEL_DEFAULTS) and the target's direction, then checks ranges;
    parser.error (exit 2) on the first bad flag."""
    recording = bool(os.environ.get("CUPCAKE_RECORD"))
    if args.arm == "cupcake" and (args.plan is None) == (not recording):
        parser.error("--arm cupcake: expected --plan PLAN.pb, or CUPCAKE_RECORD set (record mode)")
    if args.arm == "gravac" and args.plan is None:
        parser.error("--arm gravac: expected --plan LADDER.pb (cupcake-plan search --ratios ...)")
    if args.target is not None and args.target_loss is not None:
        parser.error("--target, --target-loss: expected one of them; got both")
    defaults = MODEL_DEFAULTS[args.model]
    if args.target is None and args.target_loss is None:
        args.target, args.target_loss = defaults.get("target"), defaults.get("target_loss")
    # The direction: accuracy is reached at or above its target, loss at or below.
    args.target_metric, args.target_value = ("accuracy", args.target) if args.target is not None else \
        ("loss", args.target_loss)
    for flag in ("batch", "hidden", "lr", "clip"):
        if getattr(args, flag) is None:
            setattr(args, flag, defaults[flag])
    if args.target is not None and not 0 < args.target <= 1:
        parser.error("--target: out of range; got %g, expected 0 < target <= 1" % args.target)
    if args.target_loss is not None and not args.target_loss > 0:
        parser.error("--target-loss: out of range; got %g, expected > 0" % args.target_loss)
    for flag in ("max_steps", "eval_every", "batch", "width", "hidden", "embed", "layers", "seq_len",
                 "powersgd_rank", "gravac_window"):
        if getattr(args, flag) < 1:
            parser.error("--%s: out of range; got %d, expected >= 1" % (flag.replace("_", "-"), getattr(args, flag)))
    if args.lr <= 0:
        parser.error("--lr: out of range; got %g, expected > 0" % args.lr)
    if args.clip < 0:
        parser.error("--clip: out of range; got %g, expected >= 0" % args.clip)
    if args.deadline_s < 0:
        parser.error("--deadline-s: out of range; got %d, expected >= 0" % args.deadline_s)
    args.name = args.name or args.arm


def reached(args, accuracy, loss):
    """Whether an evaluation meets the target, in its direction (accuracy >=, loss <=)."""
    return accuracy >= args.target if args.target_metric == "accuracy" else loss <= args.target_loss


def make_optimizer(args, model):
    """(model to call, optimizer) of the arm. GraVAC: cupcake.torch's adaptive controller over a
    ladder (DistributedOptimizer(..., adapt=GraVAC(...)))."""
    make = lambda m: torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9)  # noqa: E731
    adapt = None
    if args.arm == "gravac":
        import cupcake.torch
        adapt = cupcake.torch.GraVAC(window=args.gravac_window, epsilon=args.gravac_epsilon,
                                     omega=args.gravac_omega)
    arm = "cupcake" if args.arm == "gravac" else args.arm
    return wrap(arm, model, make, bucket_mib=args.bucket_mib, powersgd_rank=args.powersgd_rank, plan=args.plan,
                model_name=MODEL_NAMES[args.model], adapt=adapt)


def clip(opt, module, max_norm):
    """Clips the averaged gradient (every rank the same) to max_norm. DDP has averaged it during
    backward; Cupcake averages in opt.synchronize() (step() then does not synchronize again)."""
    if hasattr(opt, "synchronize"):
        opt.synchronize()
    torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)


def train(args, data, model, opt):
    """Steps until rank 0's held-out evaluation reaches the target or --max-steps; returns this
    rank's step times (s) and the evaluations [(step, accuracy, held-out loss)] (steps counted from
    1), rank 0's."""
    module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    loss_of = sequence_loss if args.model == "lstm" else F.cross_entropy
    times, evals = [], []
    verdict = torch.zeros(2, dtype=torch.float64)
    for step in range(1, args.max_steps + 1):
        x, y = data.get(step - 1)  # made before the clock starts: the data is not what is timed
        start = time.perf_counter()
        opt.zero_grad()
        loss_of(model(x), y).backward()
        if args.clip:
            clip(opt, module, args.clip)
        opt.step()
        times.append(time.perf_counter() - start)
        if step % args.eval_every == 0 or step == args.max_steps:
            verdict[0], verdict[1] = data.evaluate(module)
            dist.broadcast(verdict, src=0)  # rank 0's evaluation decides on every rank
            evals.append((step, verdict[0].item(), verdict[1].item()))
            if reached(args, evals[-1][1], evals[-1][2]):
                break
    return times, evals


def report(args, size, model, times, evals, sent, decisions):
    """Rank 0's result object (see the module's doc); times: every step's slowest-rank time (s)."""
    params = sum(p.numel() for p in model.parameters())
    ms = [t * 1e3 for t in times]
    hits = [s for s, a, l in evals if reached(args, a, l)]
    to_target = hits[0] if hits else None
    result = {
        "name": args.name, "arm": args.arm, "model": args.model, "seed": args.seed, "status": "ok", "plan": args.plan,
        "ranks": size, "batch_per_rank": args.batch, "params": params, "gradient_mib": round(params * 4 / 2**20, 2),
        "lr": args.lr, "clip": args.clip,
        "target": args.target_value, "target_metric": args.target_metric,
        "eval_every": args.eval_every, "max_steps": args.max_steps,
        "reached": to_target is not None, "steps_to_target": to_target,
        "time_to_target_s": round(sum(times[:to_target]), 4) if to_target else None,
        "steps": len(times), "train_s": round(sum(times), 4), "final_accuracy": round(evals[-1][1], 4),
        "best_accuracy": round(max(a for _, a, _ in evals), 4), "final_loss": round(evals[-1][2], 4),
        "best_loss": round(min(l for _, _, l in evals), 4),
        "step_median_ms": round(statistics.median(ms), 2), "step_p10_ms": round(percentile(ms, 0.1), 2),
        "step_p90_ms": round(percentile(ms, 0.9), 2),
        "bytes_sent_per_rank": sent, "bytes_source": ("%s tx_bytes" % args.bytes_iface) if sent else None,
    }
    if args.model == "lstm":
        result.update(seq_len=args.seq_len, embed=args.embed, hidden=args.hidden, layers=args.layers)
    if decisions is not None:
        result["runtime_bytes_sent"] = sum(int(d.get("bytes_sent") or 0) for d in decisions)
        result["decisions"] = len(decisions)
        # The rung in force after the last window (next_ratio; ratio where a decision lacks it).
        result["final_ratio"] = decisions[-1].get("next_ratio", decisions[-1].get("ratio")) if decisions else None
    return result


def load_data(args, rank, size):
    """(batches, None), or (None, exit status) after printing the problem: 1 for an unusable data
    file, 2 for a batch the data cannot fill."""
    try:
        if args.model == "lstm":
            corpus = text.load(args.data.split(",") if args.data else text.DEFAULT_PATHS)
            return TextBatches(corpus, args.seq_len, args.batch, args.seed, rank, size), None
        d = digits.load(args.data or digits.DEFAULT_PATH)
        train_idx, held_out = digits.split(d)
        return Batches(d, train_idx, held_out, args.batch, args.seed, rank, size), None
    except (digits.DigitsError, text.TextError) as e:
        print("tta.py: --data: %s" % e, file=sys.stderr)
        return None, 1
    except ValueError as e:
        print("tta.py: %s" % e, file=sys.stderr)
        return None, 2


def make_model(args):
    if args.model == "lstm":
        return CharLstm(args.embed, args.hidden, args.layers)
    return DigitsCnn(args.width, args.hidden)


def main():
    args = parse_args()
    # A deadline the rank enforces on itself: SIGALRM's default action ends the process even when
    # it is stuck in C (a collective, a shutdown join), and mpirun then ends the job. A timeout
    # around mpirun alone left the ranks running on once mpirun was killed.
    signal.alarm(args.deadline_s)
    rank, size = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")), int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    data, status = load_data(args, rank, size)  # before gloo: a bad file ends every rank alike
    if data is None:
        return status

    torch.set_num_threads(1)  # the ranks share the cores
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model, opt = make_optimizer(args, make_model(args))

    sent_before = tx_bytes(args.bytes_iface) if args.bytes_iface else None
    times, evals = train(args, data, model, opt)
    sent = None
    if args.bytes_iface:
        per_rank = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(per_rank, torch.tensor([tx_bytes(args.bytes_iface) - sent_before]))
        sent = [int(t.item()) for t in per_rank]
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # each step: the slowest rank's time
    decisions = [dict(x) for x in opt.decisions] if args.arm == "gravac" else None
    if rank == 0:
        result = report(args, size, model, slowest.tolist(), evals, sent, decisions)
        print(json.dumps(result), flush=True)
        if args.record:
            full = dict(result, step_ms=[round(t * 1e3, 3) for t in slowest.tolist()], evals=evals)
            with open(args.record, "w") as f:
                json.dump(full, f)
        if args.decisions and decisions is not None:
            with open(args.decisions, "w") as f:
                for x in decisions:
                    f.write(json.dumps(x, default=float) + "\n")
    finish(args.arm, opt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
