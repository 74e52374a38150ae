"""fairseq-train started by the launchers clusters use: torchrun (elastic or not) and Slurm's srun.

fairseq 0.12 reads a launcher's environment only when ``--distributed-world-size`` is above 1: without it (its
default on a CPU or with one GPU) every process that torchrun or srun starts trains alone, a whole run each, all
of them writing the same ``--save-dir``, and nothing says so. With it, fairseq takes the device of a torchrun
process as ``RANK`` modulo the CUDA devices (a ZeroDivisionError on a CPU, the wrong GPU past the first node)
and, under Slurm, sets the CUDA device of ``SLURM_LOCALID`` (which a CPU does not have). Its PyTorch DDP wrapper
also hands a CPU model a CUDA device index. The plugin, through two wrappers installed at import:

* refuses, in one line and before anything is written, a process that a launcher started among several while
  fairseq would train alone, naming the option to pass;
* takes the world size, the rank and the local rank (the GPU) from torchrun's environment, and Slurm's ranks
  with the init method fairseq would use (the first host of the step's node list, ``--distributed-port``) on
  CPUs and wherever a step runs several tasks per node: with ``--gpus-per-task 1`` Slurm shows each task one
  GPU, device 0, where fairseq sets the device of ``SLURM_LOCALID`` (invalid past the first task of a node);
* refuses ``torchrun --max-restarts`` on several machines sharing the agent's store (below);
* builds PyTorch's DDP (``--ddp-backend pytorch_ddp``, fairseq's default) for a CPU model without a device.

With one Slurm task per node on GPUs, fairseq's own inference runs unchanged (it starts a process per GPU).
"""
import logging
import os
import subprocess
import sys
import warnings
from collections import namedtuple

import torch
import torch.distributed as dist
from fairseq import models
from fairseq.distributed import utils as distributed_utils
from torch.distributed.constants import default_pg_timeout
from torch.distributed.rendezvous import register_rendezvous_handler

from .errors import UsageError

logger = logging.getLogger(__name__)
LauncherWorld = namedtuple("LauncherWorld", "launcher size rank local_rank")
TORCHRUN_KEYS = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


def launcher_world(environ=None):
    """The world a launcher started this process in (torchrun's, or an srun step's), or None."""
    environ = os.environ if environ is None else environ
    if all(key in environ for key in TORCHRUN_KEYS):
        return LauncherWorld("torchrun", int(environ["WORLD_SIZE"]), int(environ["RANK"]),
                             int(environ.get("LOCAL_RANK", 0)))
    if "SLURM_STEP_NUM_TASKS" in environ and "SLURM_PROCID" in environ:  # a task of an srun step
        return LauncherWorld("slurm", int(environ["SLURM_STEP_NUM_TASKS"]), int(environ["SLURM_PROCID"]),
                             int(environ.get("SLURM_LOCALID", 0)))
    return None


def _slurm_first_host(environ):
    node_list = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if not node_list:
        raise UsageError("a Slurm task without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: start it with srun")
    try:
        hosts = subprocess.check_output(["scontrol", "show", "hostnames", node_list], text=True).split()
    except (OSError, subprocess.CalledProcessError) as err:
        raise UsageError(f"Slurm's node list {node_list!r}: 'scontrol show hostnames' failed ({err})") from None
    return hosts[0]


def adopt_launcher_world(cfg, environ=None) -> bool:
    """Set ``cfg`` (fairseq's distributed_training section) from the launcher's world; False where fairseq's own
    inference is to run (no launcher, a world of one process, or Slurm on GPUs)."""
    environ = os.environ if environ is None else environ
    world = launcher_world(environ)
    if cfg.distributed_init_method is not None or cfg.tpu or world is None or world.size <= 1:
        return False
    if cfg.distributed_world_size == 1:
        port = (f" {_option('--distributed-port', 'PORT')} (the same free port on every task)"
                if world.launcher == "slurm" else "")
        raise UsageError(f"{world.launcher} started {world.size} processes, but fairseq would train alone in each (a "
                         f"whole run each, all writing the same --save-dir): pass "
                         f"{_option('--distributed-world-size', world.size)}{port}")
    cuda = torch.cuda.is_available()
    if not cuda and cfg.distributed_backend == "nccl":
        raise UsageError(f"training on CPUs in several processes needs {_option('--distributed-backend', 'gloo')} "
                         "(NCCL is for GPUs)")
    if world.launcher == "slurm":
        if cuda and world.size == _slurm_nodes(environ):  # one task per node: fairseq starts one process per GPU
            return False
        if cfg.distributed_port <= 0:
            raise UsageError(f"slurm started {world.size} processes: pass {_option('--distributed-port', 'PORT')} (the "
                             "same free port on every task) for their rendezvous")
        cfg.distributed_init_method = f"tcp://{_slurm_first_host(environ)}:{cfg.distributed_port}"
    else:
        # torchrun's agent keeps one store (and MASTER_PORT) across the restarts of --max-restarts: under plain env://
        # the restarted workers read the dead ones' gloo addresses from it and cannot connect
        restarts = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        refuse_restarts_that_cannot_meet(environ)
        cfg.distributed_init_method = f"{ATTEMPT_SCHEME}://" if restarts else "env://"
    if cfg.distributed_world_size != world.size:
        logger.info(f"--distributed-world-size {cfg.distributed_world_size}: {world.launcher} started {world.size} "
                    f"processes; training with {world.size}")
    cfg.distributed_world_size, cfg.distributed_rank = world.size, world.rank
    cfg.device_id = _device_of(world) if cuda else 0
    cfg.distributed_no_spawn = True  # the launcher started every process
    if cuda:
        torch.cuda.set_device(cfg.device_id)
    return True


def _device_of(world) -> int:
    """The GPU of a process: its local rank, or the one GPU a Slurm task bound to its own (``--gpus-per-task 1``)
    sees; never a GPU another process of the machine has."""
    visible = torch.cuda.device_count()
    if world.local_rank < visible:
        return world.local_rank
    if world.launcher == "slurm" and visible == 1:
        return 0
    per_node = "--ntasks-per-node" if world.launcher == "slurm" else "--nproc-per-node"
    raise UsageError(f"{world.launcher}: local rank {world.local_rank}, but this process sees {visible} GPU(s): start "
                     f"at most one process per GPU ({per_node})")


def _option(flag: str, value) -> str:
    """A distributed-training option as the running command takes it: ``--flag value``, or under
    fairseq-hydra-train ``distributed_training.flag=value``."""
    hydra_config = sys.modules.get("hydra.core.hydra_config")
    if hydra_config is not None and hydra_config.HydraConfig.initialized():
        return f"distributed_training.{flag.lstrip('-').replace('-', '_')}={value}"
    return f"{flag} {value}"


def _slurm_nodes(environ) -> int:
    return int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or 1)


def refuse_restarts_that_cannot_meet(environ) -> None:
    """``torchrun --max-restarts`` on several machines whose workers share the agent's store: only the agent whose
    worker failed counts the restart (``TORCHELASTIC_RESTART_COUNT``); the others restart for the group's change
    with the old count, so the machines' workers would wait under different prefixes of the store, for good.
    Without the shared store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) every restart gets a store of its own."""
    restarts = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    machines_share_the_store = (environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
                                and int(environ.get("GROUP_WORLD_SIZE", "1")) > 1)  # agents, one per machine
    if restarts > 0 and machines_share_the_store:
        raise UsageError(f"torchrun --max-restarts {restarts} on several machines: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                         "on every machine (with the agent's shared store a restart's workers on different machines "
                         "never meet; docs/distributed.md#restarts)")


def _cpu_ddp(args, model, process_group, device):
    """PyTorch's DDP of a CPU model (fairseq's passes it a CUDA device index), behind fairseq's proxy."""
    from fairseq.distributed import ModuleProxyWrapper

    with warnings.catch_warnings():  # torch >= 2.13 renames broadcast_buffers; fairseq's option keeps its meaning
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
        wrapped = torch.nn.parallel.DistributedDataParallel(
            module=model.to(device), device_ids=None, output_device=None, broadcast_buffers=args.broadcast_buffers,
            bucket_cap_mb=args.bucket_cap_mb, process_group=process_group,
            find_unused_parameters=args.find_unused_parameters, gradient_as_bucket_view=args.gradient_as_bucket_view)
    return ModuleProxyWrapper(wrapped)


ATTEMPT_SCHEME = "torchelastic-attempt"


def _attempt_rendezvous(url, timeout=default_pg_timeout, **kwargs):
    """env:// through torchrun's agent store, with the keys of each restart under a prefix of their own (torch's
    env:// handler reuses the agent's store as it is: the addresses the killed attempt's workers left in it stay)."""
    environ = os.environ
    rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timeout)
    yield dist.PrefixStore(f"/spanbert/attempt_{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store), rank, \
        world_size
    raise RuntimeError(f"{ATTEMPT_SCHEME}:// cannot rendezvous again; torchrun restarts the workers instead")


def install() -> None:
    """Wrap fairseq's ``infer_init_method`` and ``DistributedFairseqModel`` once; register the rendezvous of
    torchrun's restarts."""
    infer = distributed_utils.infer_init_method
    if getattr(infer, "spanbert", False):
        return
    register_rendezvous_handler(ATTEMPT_SCHEME, _attempt_rendezvous)

    def infer_init_method(cfg, force_distributed=False):
        if adopt_launcher_world(cfg):
            return
        try:
            infer(cfg, force_distributed)
        except AssertionError as err:  # fairseq's own spawning asserts one GPU per process
            if "available devices" not in str(err):
                raise
            raise UsageError(f"--distributed-world-size {cfg.distributed_world_size}: {err}; start one process per "
                             "rank with torchrun or Slurm (docs/distributed.md), or give each process "
                             "--distributed-init-method, --distributed-rank and --distributed-no-spawn") from None

    infer_init_method.spanbert = True
    distributed_utils.infer_init_method = infer_init_method

    wrap = models.DistributedFairseqModel

    def DistributedFairseqModel(args, model, process_group, device):  # noqa: N802 - fairseq's name
        if torch.device(device).type == "cpu" and not args.tpu and args.ddp_backend in ("c10d", "pytorch_ddp"):
            return _cpu_ddp(args, model, process_group, device)
        return wrap(args, model, process_group, device)

    models.DistributedFairseqModel = DistributedFairseqModel
