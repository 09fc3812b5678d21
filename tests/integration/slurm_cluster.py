"""A real single-node SLURM cluster on loopback, from Debian's ``slurm-wlm`` and ``munge``.

``munged`` runs as the ``munge`` user with its key and socket in a temporary folder;
``slurmctld`` and ``slurmd`` run as root in the foreground (no systemd) from a
``slurm.conf`` written there too, with their own free ports and state folders, so that
nothing on the machine is touched. Client commands find the cluster through the
``SLURM_CONF`` variable in ``SlurmCluster.env``.

``slurm_cluster(nodes=2)`` starts two ``slurmd`` on this machine, one per node (each with its
own ``-N`` name, port, spool and log; all at 127.0.0.1): SLURM 22.05.8 from Debian runs them
side by side, so that ``srun -N2`` starts one task on each, as on two machines.

A requeued job runs again ~``CRED_EXPIRE`` + 1 s after its requeue (see the comments in
``SLURM_CONF``). The fixture skips, with the reason, when not root or when the packages are
missing (``make system-deps`` installs them). ``FERRY_KEEP_SLURM=1`` keeps the cluster's
folder (logs, state) after the tests, to look at.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ferry.runtime.procs import stop_process

NODE = "ferrynode"
START_TIMEOUT = 30.0
CRED_EXPIRE = 5
"""Seconds a requeued job waits before it runs again (SLURM's minimum is a few seconds)."""
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")

SLURM_CONF = """\
# Written by ferry's test fixture: one node, everything under {base}.
ClusterName=ferrytest
SlurmctldHost={host}(127.0.0.1)
MailProg=/bin/true
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long SLURM holds a requeued job (its BeginTime: cred_expire + 1 s; 120 s by
# default). 5 s keeps the tests short without forcing StartTime=now, which worked here too
# (22.05.8: "reissued job credential"; docs/schedulers.md has what was tried).
AuthInfo=socket={munge_socket}{cred_expire}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/linear
SchedulerType=sched/builtin
# sched_interval=1: the requeued job starts as soon as its BeginTime comes, not at the next
# minute's scheduling pass.
SchedulerParameters=sched_interval=1
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmdParameters=config_overrides
{nodes}PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
NODE_LINE = "NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node}{port} CPUs=1 State=UNKNOWN\n"


def node_names(nodes: int) -> list[str]:
    """One node: ``ferrynode``; more: ``ferrynode1``, ``ferrynode2``, ..."""
    return [NODE] if nodes == 1 else [f"{NODE}{i + 1}" for i in range(nodes)]


def cluster_conf(base: Path, nodes: int, cred_expire: int | None) -> str:
    """slurm.conf for ``nodes`` slurmd on this machine: each node of several has its own port,
    spool folder, pid and log file (``%n``: the node's name)."""
    names = node_names(nodes)
    conf = SLURM_CONF.format(
        base=base,
        host=socket.gethostname().split(".")[0],
        ctld_port=_free_port(),
        slurmd_port=_free_port(),
        munge_socket=base / "munge" / "munge.socket",
        cred_expire="" if cred_expire is None else f",cred_expire={cred_expire}",
        nodes="".join(
            NODE_LINE.format(node=n, port="" if nodes == 1 else f" Port={_free_port()}") for n in names
        ),
        names=",".join(names),
    )
    if nodes > 1:
        for key, name in (
            ("SlurmdSpoolDir", "spool"),
            ("SlurmdPidFile", "slurmd.pid"),
            ("SlurmdLogFile", "slurmd.log"),
        ):
            conf = conf.replace(f"{key}={base}/{name}", f"{key}={base}/%n-{name}")
    return conf


@dataclass(frozen=True)
class SlurmCluster:
    base: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(
        self, *args: str, check: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> str:
        """A SLURM client command against this cluster (in ``env``, ours by default); its stdout."""
        env = {**(os.environ if env is None else env), **self.env}
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30, cwd=cwd)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict of its Key=Value fields."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id)
        fields: dict[str, str] = {}
        for item in out.split():
            key, eq, value = item.partition("=")
            if eq and key not in fields:
                fields[key] = value
        return fields


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the SLURM tests start slurmctld/slurmd/munged and need root (CI runs them as root)"
    absent = [d for d in DAEMONS if shutil.which(d, path=os.environ.get("PATH", "") + ":/usr/sbin") is None]
    if absent:
        return f"the SLURM tests need {', '.join(absent)}: apt-get install slurm-wlm munge (make system-deps)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "the SLURM tests need the munge user, which Debian's munge package creates"
    return None


def _which(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin")
    assert found is not None
    return found


def _wait(
    what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]], logs: list[Path]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if ready():
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.1)
    tails = "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}" for log in logs if log.exists())
    raise RuntimeError(f"{what} did not come up; logs:\n{tails}")


def _start_munge(base: Path) -> subprocess.Popen[bytes]:
    munge = pwd.getpwnam("munge")
    mdir = base / "munge"
    mdir.mkdir(mode=0o700)
    key = mdir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for p in (mdir, key):
        os.chown(p, munge.pw_uid, munge.pw_gid)
    sock = mdir / "munge.socket"
    log = mdir / "munged.log"
    proc = subprocess.Popen(
        [
            _which("munged"),
            "--foreground",
            "--force",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--pid-file={mdir / 'munged.pid'}",
            f"--log-file={log}",
            f"--seed-file={mdir / 'munged.seed'}",
        ],
        user=munge.pw_uid,
        group=munge.pw_gid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=(mdir / "munged.err").open("wb"),
    )
    _wait("munged", sock.exists, [proc], [log, mdir / "munged.err"])
    return proc


@contextlib.contextmanager
def slurm_cluster(cred_expire: int | None = CRED_EXPIRE, nodes: int = 1) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and one slurmd per node; stop them (and any job left) on the way
    out. ``cred_expire``: AuthInfo's, in seconds; None leaves SLURM's default (120 s)."""
    base = Path(tempfile.mkdtemp(prefix="ferry-slurm-"))
    base.chmod(0o755)  # munged, as user munge, must reach its folder inside
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start_munge(base))
        (base / "state").mkdir()
        (base / "spool").mkdir()
        for name in node_names(nodes) if nodes > 1 else []:
            (base / f"{name}-spool").mkdir()
        conf = base / "slurm.conf"
        conf.write_text(cluster_conf(base, nodes, cred_expire))
        cluster = SlurmCluster(base=base, conf=conf)
        env = {**os.environ, **cluster.env}
        daemons = [[_which("slurmctld"), "-D", "-i", "-f", str(conf)]]
        daemons += [[_which("slurmd"), "-D", "-N", name, "-f", str(conf)] for name in node_names(nodes)]
        for argv in daemons:
            name = Path(argv[0]).name + (f"-{argv[3]}" if nodes > 1 and argv[2] == "-N" else "")
            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=(base / f"{name}.out").open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

        def idle() -> bool:
            out = cluster.run("sinfo", "--noheader", "--format=%t", check=False)
            return out.strip() == "idle"

        logs = [base / "slurmctld.log", base / "slurmctld.out", *base.glob("*slurmd*")]
        _wait("the SLURM cluster (every node idle)", idle, procs, logs)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(
                ["scancel", "--full", "--state=RUNNING"],
                env={**os.environ, "SLURM_CONF": str(base / "slurm.conf")},
                capture_output=True,
                timeout=10,
            )
        for proc in reversed(procs):
            stop_process(proc)
        if not os.environ.get("FERRY_KEEP_SLURM"):
            shutil.rmtree(base, ignore_errors=True)


def require_slurm() -> None:
    """Skip the test, saying why, where no cluster can be started here."""
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    require_slurm()
    started = time.monotonic()
    with slurm_cluster() as cluster:
        print(f"\nslurm cluster up in {time.monotonic() - started:.1f} s")  # shown with -s / -rA
        yield cluster
