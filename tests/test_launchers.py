"""fairseq-train under torchrun and Slurm on CPUs with gloo: the launcher's ranks, both DDP backends, and never
several runs that each train alone."""
import os
import re
import subprocess

import pytest
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

import spanbert_plugin.registry  # noqa: F401  (installs the launcher wrappers)
from conftest import ROOT, bin_path, run_cli, served_script
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.core.launchers import launcher_world

TINY = ["--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch",
        "spanbert_tiny", "--tokens-per-sample", "128", "--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3",
        "--cpu", "--num-workers", "0", "--log-format", "json", "--log-interval", "1", "--disable-validation",
        "--seed", "3", "--distributed-backend", "gloo"]


def torchrun(data, save_dir, *extra, processes=2, options=TINY):
    # each worker is fairseq-train in a fork of the tests' preloaded command server (conftest.served_script)
    command = [bin_path("torchrun"), "--standalone", "--nproc-per-node", str(processes),
               served_script(bin_path("fairseq-train")), data, *options, "--save-dir", str(save_dir), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_torchrun_without_the_world_size_is_refused(monkeypatch):
    """Each process torchrun starts would train alone (fairseq's default world on a CPU is 1): refused in one line
    (fairseq-train's call_main asks before its main writes anything)."""
    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError) as raised:
        distributed_utils.infer_init_method(_distributed_cfg())
    assert str(raised.value) == ("torchrun started 2 processes, but fairseq would train alone in each (a whole run "
                                 "each, all writing the same --save-dir): pass --distributed-world-size 2")
    cfg = _distributed_cfg("--distributed-world-size", "2", "--distributed-backend", "gloo")
    distributed_utils.infer_init_method(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id,
            cfg.distributed_no_spawn) == ("env://", 2, 1, 0, True)  # no CUDA device on a CPU


def _distributed_cfg(*extra):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused", "--task", "spanbert_pretraining", "--arch", "spanbert_tiny", "--cpu", *extra])
    return convert_namespace_to_omegaconf(args).distributed_training


@pytest.fixture
def slurm_task(tmp_path, monkeypatch):
    """Task 1 of a two-task srun step on two nodes, with Slurm's scontrol (a stand-in) on the PATH."""
    for key in [k for k in os.environ if k.startswith(("SLURM_", "WORLD_SIZE", "RANK", "MASTER_", "LOCAL_RANK"))]:
        monkeypatch.delenv(key)
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text("#!/bin/sh\n# scontrol show hostnames 'node-[a,b]'\nprintf 'node-a\\nnode-b\\n'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
    for key, value in {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node-[a,b]", "SLURM_STEP_NODELIST": "node-[a,b]",
                       "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
                       "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
                       "SLURM_STEP_ID": "0"}.items():
        monkeypatch.setenv(key, value)


def test_a_torchrun_style_world_reads_its_ranks_and_a_missing_local_rank_is_the_first_gpu():
    """torchrun's variables give the world, the rank and the local rank (the process's GPU). Without LOCAL_RANK the
    process takes its machine's first GPU, never its global rank, which past the first machine names no GPU there."""
    world = {"WORLD_SIZE": "8", "RANK": "5", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}
    assert launcher_world({**world, "LOCAL_RANK": "1"}) == ("torchrun", 8, 5, 1)
    assert launcher_world(world) == ("torchrun", 8, 5, 0)
    assert launcher_world({k: v for k, v in world.items() if k != "MASTER_PORT"}) is None


def test_a_slurm_task_gets_the_rank_world_and_rendezvous_of_its_step(slurm_task):
    assert launcher_world() == ("slurm", 2, 1, 0)
    cfg = _distributed_cfg("--distributed-world-size", "2", "--distributed-port", "12345",
                           "--distributed-backend", "gloo")
    distributed_utils.infer_init_method(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id,
            cfg.distributed_no_spawn) == ("tcp://node-a:12345", 2, 1, 0, True)


@pytest.mark.parametrize("flags, expected", [
    ([], "slurm started 2 processes, but fairseq would train alone in each (a whole run each, all writing the same "
         "--save-dir): pass --distributed-world-size 2 --distributed-port PORT (the same free port on every task)"),
    (["--distributed-world-size", "2", "--distributed-backend", "gloo"],
     "slurm started 2 processes: pass --distributed-port PORT (the same free port on every task) for their "
     "rendezvous"),
    (["--distributed-world-size", "2", "--distributed-port", "12345"],
     "training on CPUs in several processes needs --distributed-backend gloo (NCCL is for GPUs)"),
])
def test_a_slurm_task_that_would_train_alone_or_cannot_meet_the_others_is_refused(slurm_task, flags, expected):
    with pytest.raises(UsageError) as raised:
        distributed_utils.infer_init_method(_distributed_cfg(*flags))
    assert str(raised.value) == expected


@pytest.fixture
def gpu_node(slurm_task, monkeypatch):
    """The Slurm step of the docs' example on GPUs: 2 nodes x 8 tasks, this one task 9 (the second of node 1), with
    ``--gpus-per-task 1`` (Slurm shows each task its own GPU, as device 0); the CUDA calls are stand-ins."""
    import torch

    for key, value in {"SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16", "SLURM_NTASKS_PER_NODE": "8",
                       "SLURM_STEP_NUM_NODES": "2", "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}.items():
        monkeypatch.setenv(key, value)
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_a_slurm_task_per_gpu_gets_its_rank_and_the_gpu_it_sees(gpu_node, monkeypatch):
    """fairseq's own Slurm inference set the device of SLURM_LOCALID: on the tasks of a node past the first, a device
    Slurm does not show them (CUDA's invalid device ordinal) while the first tasks waited at the rendezvous."""
    import torch

    from spanbert_plugin.core.launchers import adopt_launcher_world

    cfg = _distributed_cfg("--distributed-world-size", "16", "--distributed-port", "12345")
    cfg.distributed_backend = "nccl"
    assert adopt_launcher_world(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id,
            cfg.distributed_no_spawn, gpu_node) == ("tcp://node-a:12345", 16, 9, 0, True, [0])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # without the binding a task sees the node's GPUs
    cfg = _distributed_cfg("--distributed-world-size", "16", "--distributed-port", "12345")
    cfg.distributed_backend = "nccl"
    assert adopt_launcher_world(cfg) and cfg.device_id == 1
    with pytest.raises(UsageError, match=r"^slurm started 16 processes: pass --distributed-port PORT"):
        adopt_launcher_world(_distributed_cfg("--distributed-world-size", "16"))
    # more tasks on a node than the GPUs its tasks see: one line, not two ranks sharing a GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UsageError, match=r"^slurm: local rank 5, but this process sees 2 GPU\(s\): start at most one "
                                         r"process per GPU \(--ntasks-per-node\)$"):
        monkeypatch.setenv("SLURM_LOCALID", "5")
        adopt_launcher_world(_distributed_cfg("--distributed-world-size", "16", "--distributed-port", "12345"))
    # one task per node: fairseq starts a process per GPU of it, its own inference runs
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert not adopt_launcher_world(_distributed_cfg("--distributed-world-size", "16", "--distributed-port", "12345"))


TORCHRUN_WORKER = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True",
                   "TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_RESTART_COUNT": "0"}


@pytest.mark.parametrize("change, init_method", [
    ({}, None),  # refused
    ({"TORCHELASTIC_MAX_RESTARTS": "0"}, "torchelastic-attempt://"),
    ({"GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "2"}, "torchelastic-attempt://"),  # one machine: one count
    ({"TORCHELASTIC_USE_AGENT_STORE": "False"}, "env://"),  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: a store a round
])
def test_restarts_on_several_machines_sharing_the_agents_store_are_refused(change, init_method):
    """Only the agent whose worker failed counts a restart: the other machines' workers would key the restart's
    rendezvous under another count and wait for good (seen with two agents, c10d, --max-restarts 1)."""
    from spanbert_plugin.core.launchers import adopt_launcher_world

    cfg = _distributed_cfg("--distributed-world-size", "2", "--distributed-backend", "gloo")
    environ = {**TORCHRUN_WORKER, **change}
    if init_method is None:
        with pytest.raises(UsageError) as raised:
            adopt_launcher_world(cfg, environ)
        assert str(raised.value) == (
            "torchrun --max-restarts 1 on several machines: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every "
            "machine (with the agent's shared store a restart's workers on different machines never meet; "
            "docs/distributed.md#restarts)")
    else:
        assert adopt_launcher_world(cfg, environ) and cfg.distributed_init_method == init_method


def test_outside_a_launcher_fairseqs_inference_runs(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("SLURM_", "WORLD_SIZE", "RANK", "MASTER_", "LOCAL_RANK"))]:
        monkeypatch.delenv(key)
    assert launcher_world() is None
    cfg = _distributed_cfg()
    distributed_utils.infer_init_method(cfg)
    assert cfg.distributed_init_method is None and cfg.distributed_world_size == 1


def _final_weights(save_dir):
    import torch

    return torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=True)["model"]


def _losses(output):
    import json

    return [float(json.loads(line[line.index("{"):])["loss"]) for line in output.splitlines()
            if "| train_inner |" in line]


def _losses_by_update(output):
    import json

    records = [json.loads(line[line.index("{"):]) for line in output.splitlines() if "| train_inner |" in line]
    return {int(record["num_updates"]): float(record["loss"]) for record in records}


# measured here with both backends: the same losses and bit-identical weights after 3 updates (largest difference
# 0.0: two ranks' gradients summed in the order one process accumulates them); the bound leaves room for another
# machine's all-reduce to sum in another order (float32 rounding, ~1e-7 per update)
WEIGHT_TOLERANCE = 1e-5


SAME = ["--max-update", "3", "--dropout", "0", "--attention-dropout", "0", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def one_process(spm_data, tmp_path_factory):
    """One process with --update-freq 2: (its output, its save dir)."""
    save_dir = tmp_path_factory.mktemp("one_process")
    alone = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--save-dir", str(save_dir), "--update-freq", "2",
                     *SAME])
    return alone.stdout + alone.stderr, save_dir


@pytest.mark.parametrize("ddp_backend", ["legacy_ddp", "pytorch_ddp"])
def test_two_processes_train_the_model_one_process_trains_with_update_freq_two(spm_data, one_process, tmp_path,
                                                                                ddp_backend):
    """fairseq deals the epoch's batches to the ranks in turn (b0 b2 … / b1 b3 …) and one process with
    --update-freq 2 takes them in pairs (b0 b1, b2 b3, …): the same batches per update, so the same model."""
    alone_output, alone_dir = one_process
    two = torchrun(spm_data, tmp_path / "two", "--distributed-world-size", "2", "--ddp-backend", ddp_backend, *SAME)
    output = two.stdout + two.stderr
    assert two.returncode == 0, output[-3000:]
    assert ("distributed init (rank 0): torchelastic-attempt://" in output
            and "distributed init (rank 1): torchelastic-attempt://" in output)
    # one run: rank 0 logs each update once, with both ranks' sentences (2 x --batch-size 4)
    records = [line for line in output.splitlines() if "| train_inner |" in line]
    assert len(records) == 3 and all('"bsz": "8"' in line for line in records), records
    assert _losses(output) == _losses(alone_output)
    one, both = _final_weights(alone_dir), _final_weights(tmp_path / "two")
    assert one.keys() == both.keys()
    difference = max(float((one[k].float() - both[k].float()).abs().max()) for k in one)
    assert difference < WEIGHT_TOLERANCE, difference



@pytest.mark.parametrize("regulariser", [[], ["--ad-drop-p", "0.3", "--ad-drop-q", "1", "--ad-drop-every-epoch"]],
                         ids=["plain", "ad_drop"])
def test_fine_tuning_under_torchrun_trains_the_model_of_one_process(spm_data, corpus_files, tmp_path, regulariser):
    """A fine-tuning task (sentence classification) under torchrun with fairseq's default DDP backend: two
    processes train the losses and weights of one process with --update-freq 2, as pre-training does above; so
    with AD-DROP, whose attribution pass runs the DDP-wrapped model a second time (--ad-drop-q 1 drops every
    candidate: no random draw that ranks and one process would make differently)."""
    from test_classification import TINY_CLS, _corpus_examples, _write_jsonl

    from spanbert_plugin.cli.prepare_classification import main as prepare_main

    _write_jsonl(tmp_path / "train.jsonl", _corpus_examples(corpus_files[0], 64))
    cls = str(tmp_path / "cls")
    assert prepare_main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "train.jsonl"),
                         "--tokenizer-from", spm_data, "--destdir", cls, "--text-columns", "text", "--label-column",
                         "label", "--max-seq-length", "48"]) == 0
    options = [*TINY_CLS, "--batch-size", "4", "--lr", "1e-3", "--log-interval", "1", "--disable-validation",
               "--pooler-dropout", "0", "--distributed-backend", "gloo", *regulariser, *SAME]
    alone = run_cli([bin_path("fairseq-train"), cls, *options, "--save-dir", str(tmp_path / "one"), "--update-freq", "2"])
    two = torchrun(cls, tmp_path / "two", "--distributed-world-size", "2", options=options)
    output = two.stdout + two.stderr
    assert two.returncode == 0, output[-3000:]
    assert len(_losses(output)) == 3 and _losses(output) == _losses(alone.stdout + alone.stderr)
    if regulariser:  # AD-DROP dropped attention entries at every update
        assert '"ad_drop_rate"' in output and '"ad_drop_rate": "0"' not in output
    one, both = _final_weights(tmp_path / "one"), _final_weights(tmp_path / "two")
    assert one.keys() == both.keys()
    assert max(float((one[k].float() - both[k].float()).abs().max()) for k in one) < WEIGHT_TOLERANCE


def test_two_machines_under_torchrun_train_the_model_of_one_process_through_a_restart(spm_data, one_process, tmp_path):
    """Two torchrun agents, one per "machine" (--nnodes 2 --node-rank R, a c10d rendezvous on this machine), one
    process each, --max-restarts 1 with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 as docs/distributed.md says: rank 0's
    worker kills itself as update 3 begins, both machines start their workers again, they meet and resume from
    checkpoint_last.pt, and end with the run of one process with --update-freq 2 (same losses, same weights)."""
    import socket

    marker = tmp_path / "killed.txt"
    # A free port for the rendezvous, kept bound (SO_REUSEADDR, not listening) until the agents end: no other
    # process can bind it, nor take it as a connection's local port, while the store's server (SO_REUSEADDR too)
    # still can.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        agents = []
        try:
            for rank in (0, 1):
                agents.append(subprocess.Popen(
                    [bin_path("torchrun"), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-machines",
                     "--max-restarts", "1",
                     served_script(os.path.join(ROOT, "tests", "fairseq_train_killed_once.py")), str(marker), "2",
                     spm_data, *TINY, "--save-dir", str(tmp_path / "two"), "--distributed-world-size", "2",
                     "--ddp-backend", "legacy_ddp", "--save-interval-updates", "1", *SAME],
                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            outputs = [agent.communicate(timeout=300)[0] for agent in agents]
        finally:  # a timeout (or a failed start) leaves no agent behind
            for agent in agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
    output = "".join(outputs)
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    assert marker.read_text().startswith("killed at update 2")
    assert re.search(r"Loaded checkpoint \S+ \(epoch 1 @ 2 updates\)", output)  # the restarted workers resumed
    alone_output, alone_dir = one_process
    # rank 0 logs, and may run on the other machine after the restart: the losses by update
    assert _losses_by_update(output) == _losses_by_update(alone_output)
    one, both = _final_weights(alone_dir), _final_weights(tmp_path / "two")
    assert max(float((one[k].float() - both[k].float()).abs().max()) for k in one) < WEIGHT_TOLERANCE


def test_an_elastic_restart_resumes_to_the_model_of_an_uninterrupted_run(spm_data, one_process, tmp_path):
    """torchrun --max-restarts 1: a worker kills itself (SIGKILL) as update 3 begins, the agent restarts both, they
    meet again (each restart's rendezvous keys apart from the dead workers') and fairseq resumes from
    checkpoint_last.pt (saved every update): the losses and final weights of the run that was never stopped."""
    marker = tmp_path / "killed.txt"
    command = [bin_path("torchrun"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
               served_script(os.path.join(ROOT, "tests", "fairseq_train_killed_once.py")), str(marker), "2", spm_data, *TINY,
               "--save-dir", str(tmp_path / "two"), "--distributed-world-size", "2", "--save-interval-updates", "1",
               *SAME]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert marker.read_text().startswith("killed at update 2")
    assert marker.read_text().strip().endswith("rank 0")
    assert re.search(r"Loaded checkpoint \S+ \(epoch 1 @ 2 updates\)", output)  # the restarted workers resumed
    alone_output, alone_dir = one_process
    assert _losses(output) == _losses(alone_output)
    one, both = _final_weights(alone_dir), _final_weights(tmp_path / "two")
    assert max(float((one[k].float() - both[k].float()).abs().max()) for k in one) < WEIGHT_TOLERANCE


def test_fairseq_hydra_train_under_torchrun_trains_one_run_of_two_ranks(spm_data, tmp_path):
    """fairseq-hydra-train sets up the distributed world before it imports common.user_dir: the plugin's launcher
    handling comes in through hydra_plugins/ instead (torchrun's world on CPUs was fairseq's ZeroDivisionError, and
    without the world size two runs each trained alone). New processes, not forks of the tests' command server,
    which has the plugin loaded already."""
    recipe = [bin_path("fairseq-hydra-train"), "--config-dir", "configs/pretrain", "--config-name", "tiny_cpu",
              f"task.data={spm_data}", f"checkpoint.save_dir={tmp_path / 'two'}", "optimization.max_update=2",
              "dataset.batch_size=4", "common.log_interval=1", "common.log_format=json",
              "distributed_training.distributed_backend=gloo"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    run = subprocess.run([bin_path("torchrun"), "--standalone", "--nproc-per-node", "2", *recipe,
                          "distributed_training.distributed_world_size=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "distributed init (rank 1): torchelastic-attempt://" in output
    assert [record["bsz"] for record in _train_records(output)] == ["8", "8"]  # one run of 2 ranks x 4 blocks
    import sys

    for command in (recipe, [sys.executable, "-m", "fairseq_cli.hydra_train", *recipe[1:]]):  # the module run too
        alone = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env=dict(env, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                                        MASTER_PORT="29500"))
        assert alone.returncode == 1 and alone.stderr.splitlines()[-1] == (
            "error: torchrun started 2 processes, but fairseq would train alone in each (a whole run each, all "
            "writing the same --save-dir): pass distributed_training.distributed_world_size=2"), alone.stderr[-2000:]


def _train_records(output):
    import json

    return [json.loads(line[line.index("{"):]) for line in output.splitlines() if "[train_inner]" in line]


def test_a_world_larger_than_the_gpus_without_a_launcher_is_one_line(monkeypatch):
    """fairseq spawns one process per GPU itself and asserts there are enough: named in one line with the ways to
    start the ranks instead (no GPU here)."""
    import torch

    if torch.cuda.device_count():
        pytest.skip("with GPUs fairseq spawns one process per GPU itself")
    for key in [k for k in os.environ if k.startswith(("SLURM_", "WORLD_SIZE", "RANK", "MASTER_", "LOCAL_RANK"))]:
        monkeypatch.delenv(key)
    with pytest.raises(UsageError, match=r"^--distributed-world-size 2: world size is 2 but have 0 available devices; "
                                         r"start one process per rank with torchrun"):
        distributed_utils.infer_init_method(_distributed_cfg("--distributed-world-size", "2"))


def test_pre_training_without_the_sbo_under_pytorch_ddp(spm_data, tmp_path):
    """--sbo-weight 0 (the ablation) under fairseq's default DDP backend: the unused SBO head is left out of training,
    so DDP does not wait for its gradients at the second update (which stopped the run before); the checkpoint keeps
    the head."""
    two = torchrun(spm_data, tmp_path / "two", "--distributed-world-size", "2", "--ddp-backend", "pytorch_ddp",
                   "--sbo-weight", "0", *SAME)
    output = two.stdout + two.stderr
    assert two.returncode == 0, output[-3000:]
    assert len(_losses(output)) == 3
    weights = _final_weights(tmp_path / "two")
    assert "sbo_head.dense1.weight" in weights  # kept in the checkpoint, as fine-tuning keeps the pre-training heads


def test_a_slurm_task_without_a_node_list_is_refused(slurm_task, monkeypatch):
    """A task an sbatch script started itself (no srun step): there is no node list to find the first host in."""
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    cfg = _distributed_cfg("--distributed-world-size", "2", "--distributed-port", "12345", "--distributed-backend", "gloo")
    with pytest.raises(UsageError) as raised:
        distributed_utils.infer_init_method(cfg)
    assert str(raised.value) == "a Slurm task without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: start it with srun"


@pytest.mark.parametrize("scontrol, reason", [
    ("#!/bin/sh\nexit 3\n", "returned non-zero exit status 3"),
    (None, "No such file or directory"),
], ids=["fails", "missing"])
def test_a_node_list_scontrol_cannot_expand_is_one_line(slurm_task, tmp_path, monkeypatch, scontrol, reason):
    if scontrol is None:
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no scontrol anywhere
    else:
        (tmp_path / "bin" / "scontrol").write_text(scontrol)
    cfg = _distributed_cfg("--distributed-world-size", "2", "--distributed-port", "12345", "--distributed-backend", "gloo")
    with pytest.raises(UsageError) as raised:
        distributed_utils.infer_init_method(cfg)
    message = str(raised.value)
    assert message.startswith("Slurm's node list 'node-[a,b]': 'scontrol show hostnames' failed (") and reason in message
    assert "\n" not in message


def test_a_world_size_other_than_the_launchers_trains_with_the_launchers(monkeypatch, caplog):
    import logging

    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    cfg = _distributed_cfg("--distributed-world-size", "4", "--distributed-backend", "gloo")
    with caplog.at_level(logging.INFO, logger="spanbert_plugin.core.launchers"):
        distributed_utils.infer_init_method(cfg)
    assert (cfg.distributed_world_size, cfg.distributed_rank) == (2, 1)
    assert "--distributed-world-size 4: torchrun started 2 processes; training with 2" in caplog.messages
