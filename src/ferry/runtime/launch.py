"""What a job's launch says about its nodes, before anything starts: the command ``ferry run``
is given (torchrun's options, and its ``PET_*`` variables, which torchrun reads as defaults)
and the batch system's environment (a SLURM step of several tasks). Torch-free: the
supervisor reads it at start.

A job launched on N nodes runs one ``ferry run`` per node (``srun`` starts them, or a
PyTorchJob's pods, or an operator's shell on each machine). Each of them sees the same
command, so each derives the same job identity (``rendezvous``) and the number of nodes;
the node's own index is known where the launch fixes it (torchrun's static ``--node-rank``,
SLURM's task id), and otherwise only once torchrun's rendezvous assigned it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TORCHRUN_FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)
"""torchrun's options that take no value; every other option takes one."""
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
DEFAULT_PORTS = {"static": 29500, "c10d": 29400}
"""torchrun's ports: ``--master-port``'s default, and c10d's when the endpoint names none."""


@dataclass(frozen=True, kw_only=True)
class Nodes:
    """The job's nodes as the launch describes them."""

    count: int = 1
    """How many nodes (at most, for an elastic range) run the job, each under its own supervisor."""
    rank: int | None = None
    """This node's index, where the launch fixes it (None: torchrun's rendezvous assigns it)."""
    rendezvous: str | None = None
    """What every node of the job shares and another job does not: torchrun's rendezvous id
    and endpoint (``ID@HOST:PORT``) or its master's address (``HOST:PORT``); None if unknown."""

    @property
    def many(self) -> bool:
        return self.count > 1

    def key(self) -> str:
        """This node among the job's: ``node<rank>``, or its host name where no rank is known
        yet (its job directory and its lock in the checkpoint root are named by it)."""
        return f"node{self.rank}" if self.rank is not None else _safe(socket.gethostname())


def torchrun_options(command: Sequence[str]) -> dict[str, str] | None:
    """The launcher options of a torchrun command line (``torchrun ...``, ``python -m
    torch.distributed.run ...``), long names with ``_`` for ``-``; None for another command."""
    args = list(command)
    if not args:
        return None
    name = os.path.basename(args[0])
    if name == "torchrun":
        rest = args[1:]
    elif (
        re.fullmatch(r"python[0-9.]*", name)
        and len(args) > 2
        and args[1] == "-m"
        and args[2] in LAUNCHER_MODULES
    ):
        rest = args[3:]
    else:
        return None
    options: dict[str, str] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--" or not arg.startswith("-"):
            break  # the training script: its own arguments follow
        key, eq, value = arg.partition("=")
        if key in TORCHRUN_FLAGS:
            options[_name(key)] = "1"
        elif eq:
            options[_name(key)] = value
        elif i + 1 < len(rest):
            options[_name(key)] = rest[i + 1]
            i += 1
        i += 1
    return options


def nodes_of(command: Sequence[str], env: Mapping[str, str]) -> Nodes:
    """The job's nodes, from torchrun's options (and the ``PET_*`` variables it falls back on),
    else from a SLURM step of several tasks (one supervisor per task); one node otherwise."""
    options = torchrun_options(command)
    slurm = _slurm_task(env)
    if options is not None:
        return _torchrun_nodes(options, env, slurm)
    if slurm is not None and slurm[1] > 1:
        return Nodes(count=slurm[1], rank=slurm[0])
    return Nodes()


def _torchrun_nodes(
    options: Mapping[str, str], env: Mapping[str, str], slurm: tuple[int, int] | None
) -> Nodes:
    def get(name: str, default: str = "") -> str:
        return options.get(name) or env.get(f"PET_{name.upper()}") or default

    if get("standalone") == "1":
        return Nodes()
    count = _most_nodes(get("nnodes", "1"))
    if count <= 1:
        return Nodes()
    backend = get("rdzv_backend", "static")
    if backend == "static":
        endpoint = f"{get('master_addr', '127.0.0.1')}:{get('master_port', str(DEFAULT_PORTS['static']))}"
        rank: int | None = _int(get("node_rank", "0"))
    else:
        endpoint = get("rdzv_endpoint")
        if endpoint and ":" not in endpoint:
            endpoint += f":{DEFAULT_PORTS.get(backend, DEFAULT_PORTS['c10d'])}"
        rank = slurm[0] if slurm is not None else None  # the rendezvous assigns it otherwise
    rdzv_id = get("rdzv_id", "none")
    rendezvous = None if not endpoint else endpoint if rdzv_id == "none" else f"{rdzv_id}@{endpoint}"
    return Nodes(count=count, rank=rank, rendezvous=rendezvous)


def _slurm_task(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(this task's id, tasks) in a SLURM job step (``srun``), None outside one."""
    if not env.get("SLURM_STEP_ID"):
        return None
    task, tasks = _int(env.get("SLURM_PROCID", "")), _int(env.get("SLURM_STEP_NUM_TASKS", ""))
    if task is None or tasks is None:
        return None
    return task, tasks


def _most_nodes(value: str) -> int:
    """``--nnodes``: N, or MIN:MAX (an elastic job: at most MAX nodes)."""
    most = _int(value.rpartition(":")[2])
    return most if most is not None and most > 0 else 1


def _int(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def _name(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _safe(name: str) -> str:
    """A host name as a file name: nothing but letters, digits, ``.``, ``_`` and ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name) or "host"


def rank_exit_code(code: int) -> int:
    """The exit status of a process that committed its stop's checkpoint: ``code`` ("resume
    me"), but 0 for a rank that torchrun's agent started under ``ferry run``. torchrun takes any
    other status for a failure of its ranks (a traceback, its own restarts); ``ferry run`` reads
    the stop from the job's status and exits with ``code`` itself."""
    return 0 if under_ferry_agent() else code


def under_ferry_agent() -> bool:
    """This process is a rank that torchrun's agent started under ``ferry run``."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "FERRY_SUPERVISOR_PID" in os.environ
