"""The check both replay tests make of a model recorded from a replay (test_train_replay.sh,
test/testbed/replay_test.sh): the model file's tensors, names and sizes in order, and each
gradient ready no sooner than the replayed backward times, scaled by the compute scale, say."""


def recorded_problems(given, got, scale, where):
    """([problem, ...], replayed backward us, recorded backward us) for the model file `given` and
    the recorded model `got`; each problem starts with `where`."""
    if [(t["name"], t["numel"]) for t in got["tensors"]] != [(t["name"], t["numel"]) for t in given["tensors"]]:
        return [f"{where}: the recorded tensors (names, sizes) are not the model file's"], 0.0, 0.0
    want = have = 0.0
    for i, (a, b) in enumerate(zip(given["tensors"], got["tensors"])):
        want += a["backward_us"] * scale
        have += b["backward_us"]
        if have < want - 0.01:
            return [f"{where}: tensors[{i}] ready at {have:.2f} us from backward's start; expected at least {want:.2f}"], \
                want, have
    return [], want, have
