"""Runs a meshfeed.Loader and writes what this rank received in the command line's
``--dump`` format (``DIR/rank-<r>.jsonl``: one line per step, ids and per-field CRC-32 of
each row). Options: a JSON object of Loader keyword arguments.

    python dump_job.py OPTIONS_JSON OUT_DIR EPOCHS [STOP_AFTER STATE_OUT | RESUME_STATE]
    python dump_job.py OPTIONS_JSON OUT_DIR EPOCHS signal RANK:AFTER:SIGNAL STATE_OUT
    python dump_job.py OPTIONS_JSON OUT_DIR EPOCHS preemptible

With STOP_AFTER, stops after that many batches and writes the loader's state_dict to
STATE_OUT; with RESUME_STATE, loads it first and runs to the end of the last epoch. With
``signal``, rank RANK sends itself SIGNAL after AFTER batches, and every rank asks
``loader.stop_requested()`` after each batch, as a training loop under a scheduler does:
told to stop, it prints where, writes the state (rank 0) and exits 75. ``preemptible`` is
a training job under slurm/preemptible.sbatch: it resumes from ``$MESHFEED_STATE`` where
that exists, dumps to ``OUT_DIR/run-$MESHFEED_RUN``, takes 40 ms a step, and stops as
with ``signal`` (writing the state to ``$MESHFEED_STATE``) when any rank is signalled.
"""

import json
import os
import signal
import sys
import time
import zlib

import meshfeed


def main() -> None:
    options, out, epochs = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    preemptible = sys.argv[4:] == ["preemptible"]
    signalled = (sys.argv[4] == "signal" if len(sys.argv) == 7 else False) or preemptible
    stop_after = int(sys.argv[4]) if len(sys.argv) == 6 else None
    resume = sys.argv[4] if len(sys.argv) == 5 and not preemptible else None
    sender, send_after, sig = sys.argv[5].split(":") if len(sys.argv) == 7 else ("-1", "0", "SIGTERM")
    state_out = sys.argv[6] if len(sys.argv) == 7 else None
    if preemptible:
        state_out = os.environ["MESHFEED_STATE"]
        out = os.path.join(out, f"run-{os.environ['MESHFEED_RUN']}")
        resume = state_out if os.path.exists(state_out) else None
    data = options.pop("data", None)
    loader = meshfeed.Loader(data, **options)
    if preemptible:
        loader.stop_requested()  # catch the stop signals from the start
    os.makedirs(out, exist_ok=True)
    first = 0
    if resume:
        with open(resume) as f:
            state = json.load(f)
        loader.load_state_dict(state)
        # Plain data: the loader's state equals the one it was loaded from (JSON).
        assert loader.state_dict() == state, (loader.state_dict(), state)
        first = state["epoch"]
    delivered = 0
    with open(os.path.join(out, f"rank-{loader.rank}.jsonl"), "w") as dump:
        for epoch in range(first, epochs):
            if not resume or epoch != first:
                loader.set_epoch(epoch)
            for batch in loader:
                crc = {}
                for name in sorted(batch):
                    value = batch[name]
                    rows = value if isinstance(value, list) else [row.tobytes() for row in value]
                    crc[name] = [zlib.crc32(r) for r in rows]
                line = {"epoch": batch.epoch, "step": batch.step, "ids": batch.ids.tolist(), "crc32": crc}
                dump.write(json.dumps(line, separators=(",", ":")) + "\n")
                delivered += 1
                if preemptible:
                    time.sleep(0.04)  # a training step
                if signalled:
                    if loader.rank == int(sender) and delivered == int(send_after):
                        os.kill(os.getpid(), getattr(signal, sig))
                    if loader.stop_requested():
                        print(f"rank {loader.rank} stopped at epoch {batch.epoch} step {batch.step} "
                              f"({delivered} batches)", flush=True)
                        if loader.rank == 0:
                            assert state_out is not None
                            with open(state_out + ".tmp", "w") as f:
                                json.dump(loader.state_dict(), f)
                            os.replace(state_out + ".tmp", state_out)
                        dump.close()
                        loader.close()
                        sys.exit(75)
                if stop_after is not None and delivered == stop_after:
                    state = loader.state_dict()
                    assert state == json.loads(json.dumps(state)), state
                    with open(sys.argv[5], "w") as f:
                        json.dump(state, f)
                    loader.close()
                    return
    loader.close()


if __name__ == "__main__":
    main()
