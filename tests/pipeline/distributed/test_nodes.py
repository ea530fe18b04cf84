"""Stages on two machines, started the way users start them: two `torchrun` agents.

Each agent is its own "node" (`--nnodes=2 --nproc-per-node=1`, c10d rendezvous on
loopback), so each stage chooses its backend and device from its own node and the two
meet through torchrun's store. Checked: three steps train exactly as one process does
(`ReferenceTrainer`, losses and weights within 1e-6); then one node dies, its agent and its
stage killed at once, and the other node, training on, stops within seconds instead of
hanging until the group's timeout (120 s): its stage raises the broken connection, or,
when the dead node hosted the rendezvous store, its agent ends the job first.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

NODE_SCRIPT = """
import functools, json, os, sys, time
import torch, torch.nn.functional as F
import pipeline
from pipeline import ElasticPipeline, PlanOptions, ReferenceTrainer
from pipeline.local.models import mlp_stack

OUT, AGENT = sys.argv[1], sys.argv[2]
SGD = functools.partial(torch.optim.SGD, lr=0.1)

def batches(n):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(n)]

def write(name, obj):
    path = os.path.join(OUT, f"{name}-{AGENT}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)

def main(ctx):
    specs = lambda: mlp_stack([4, 8, 8, 3], dropout=0.0)
    pipe = ElasticPipeline(specs(), loss_fn=F.cross_entropy, optimizer=SGD, seed=0,
                           n_microbatches=2, planning=PlanOptions(partition=[2, 1]))
    losses = [pipe.train_step(x, y) for x, y in batches(3)]
    state = pipe.full_state_dict()
    ref = ReferenceTrainer(specs(), loss_fn=F.cross_entropy, optimizer=SGD, seed=0,
                           n_microbatches=2)
    ref_losses = [ref.train_step(x, y) for x, y in batches(3)]
    ref_state = ref.full_state_dict()
    diff = max(((state[k][n] - ref_state[k][n]).abs().max().item()
                for k in state for n in state[k]), default=None)
    write("trained", {"rank": ctx.rank, "backend": ctx.backend, "device": str(ctx.device),
                      "pid": os.getpid(),
                      "losses": losses, "reference": ref_losses, "state_diff": diff})
    x, y = batches(1)[0]
    deadline = time.time() + 60
    try:
        while time.time() < deadline:  # the test kills the other node meanwhile
            pipe.train_step(x, y)
    except Exception as error:
        write("error", {"type": type(error).__name__, "error": str(error)[:500],
                        "t": time.time()})
        os._exit(1)
    write("error", {"type": None, "t": time.time()})

if __name__ == "__main__":
    pipeline.launch(main, n_stages=2, threads_per_stage=1, timeout_s=120)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(paths: list[Path], agents: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while not all(p.exists() for p in paths):
        dead = [a.args for a in agents if a.poll() is not None]
        assert not dead and time.time() < deadline, f"agents ended or timed out: {dead}"
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_two_torchrun_agents_train_like_one_process_and_a_dead_one_is_seen(tmp_path: Path) -> None:
    script = tmp_path / "node.py"
    script.write_text(textwrap.dedent(NODE_SCRIPT))
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents: list[subprocess.Popen[bytes]] = []
    for node in range(2):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            "two-nodes",
            "--max-restarts",
            "0",
            str(script),
            str(tmp_path),
            str(node),
        ]
        with (tmp_path / f"agent{node}.log").open("wb") as log:  # the agent keeps its copy
            agents.append(
                subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )
    try:
        wait_for([tmp_path / f"trained-{a}.json" for a in range(2)], agents, 150)
        trained = [json.loads((tmp_path / f"trained-{a}.json").read_text()) for a in range(2)]
        assert sorted(t["rank"] for t in trained) == [0, 1]
        for t in trained:
            assert t["backend"] == "gloo" and t["device"] == "cpu"
            assert len(t["losses"]) == 3
            assert max(abs(a - b) for a, b in zip(t["losses"], t["reference"], strict=True)) <= 1e-6
        rank0 = next(t for t in trained if t["rank"] == 0)
        assert rank0["state_diff"] is not None and rank0["state_diff"] <= 1e-6

        killed = time.time()
        for pid in (agents[1].pid, trained[1]["pid"]):  # torchrun runs its stage in a
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # session of its own: both, at once
        assert agents[0].wait(timeout=60) != 0
        ended = time.time() - killed
        assert ended < 30, f"the other node took {ended:.1f} s to stop"
        error_file = tmp_path / "error-0.json"
        if error_file.exists():  # its stage saw it first (else its agent ended the job)
            error = json.loads(error_file.read_text())
            assert error["type"] is not None and error["t"] - killed < 30, error
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
