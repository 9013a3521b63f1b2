"""Cluster specs for parameter-server training: ``--cluster`` parsing and a loopback cluster.

Two ways to get a cluster (``--cluster`` of the trainers):

* ``local_ps:W,P`` -- :class:`LocalCluster` starts ``W`` worker and ``P``
  parameter-server processes (``tf.distribute.Server`` each, from
  :mod:`tfdp_sparse.distribute.server`) on loopback ports; the calling
  process is the chief (coordinator). ``tf.distribute.Server`` binds
  ``0.0.0.0`` and cannot be told otherwise, so :class:`LocalCluster` refuses
  to start unless the process runs in its own network namespace with only
  ``lo`` (``unshare -rn sh -c 'ip link set lo up && exec python ...'``;
  :func:`namespace_command` builds that line). Inside the namespace the
  traffic is counted exactly from ``/proc/net/dev`` and nothing can reach
  another host.
* ``TF_CONFIG`` -- join a real cluster described by the ``TF_CONFIG``
  environment variable (JSON ``{"cluster": {...}, "task": {"type": "chief",
  "index": 0}}``), parsed by :func:`parse_tf_config`.

Every process :class:`LocalCluster` starts is kept by PID and ended by that
PID in :meth:`LocalCluster.close` (also on error: use it as a context
manager), after :func:`release_cluster` has detached this process from the
tasks, so the chief goes on (evaluation, export, exit) without gRPC
"Failed to connect" errors for the tasks that ended.

Example::

    spec = parse_cluster_flag("local_ps:1,2")        # ClusterRequest(LOCAL, 1, 2)
    with LocalCluster(workers=1, servers=2) as cluster:
        resolver = cluster.resolver()                 # for ParameterServerStrategy

Reference: TensorFlow, "Parameter server training with ParameterServerStrategy"
(tensorflow.org/tutorials/distribute/parameter_server_training).
"""

from __future__ import annotations

import dataclasses
import enum
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Mapping, Optional

NAMESPACE_HINT = (
    "run the chief inside its own network namespace with only loopback up, e.g. "
    "unshare -rn sh -c 'ip link set lo up && exec python -m ...' "
    "(tfdp_sparse.distribute.cluster.namespace_command builds that line)"
)


class ClusterKind(enum.Enum):
    """Where the cluster comes from."""

    LOCAL = "local_ps"
    TF_CONFIG = "TF_CONFIG"


@dataclasses.dataclass(frozen=True)
class ClusterRequest:
    """A parsed ``--cluster`` flag (workers/servers only for ``LOCAL``)."""

    kind: ClusterKind
    workers: int = 0
    servers: int = 0


def parse_cluster_flag(value: str) -> Optional[ClusterRequest]:
    """``""``/``"none"`` -> ``None``; ``"local_ps:W,P"`` or ``"TF_CONFIG"`` -> :class:`ClusterRequest`.

    Example: ``parse_cluster_flag("local_ps:2,1")`` -> ``ClusterRequest(LOCAL, 2, 1)``.
    """
    text = (value or "").strip()
    if text in ("", "none"):
        return None
    if text == ClusterKind.TF_CONFIG.value:
        return ClusterRequest(ClusterKind.TF_CONFIG)
    prefix = ClusterKind.LOCAL.value + ":"
    if text.startswith(prefix):
        parts = text[len(prefix):].split(",")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            workers, servers = (int(p) for p in parts)
            if workers >= 1 and servers >= 1:
                return ClusterRequest(ClusterKind.LOCAL, workers, servers)
    raise ValueError(
        f"--cluster={value!r} is not understood: use 'local_ps:W,P' (W >= 1 workers, P >= 1 parameter "
        "servers on loopback), 'TF_CONFIG' (join the cluster in the TF_CONFIG environment variable) or ''"
    )


@dataclasses.dataclass(frozen=True)
class TfConfig:
    """The parts of ``TF_CONFIG`` a coordinator needs."""

    cluster: dict
    task_type: str
    task_index: int


def parse_tf_config(text: str) -> TfConfig:
    """Parses and checks a ``TF_CONFIG`` JSON string for parameter-server training.

    Needs ``cluster`` with non-empty ``worker`` and ``ps`` lists of
    ``host:port`` and a ``task`` of type ``chief``, ``worker`` or ``ps``.

    Example::

        parse_tf_config('{"cluster": {"worker": ["a:1"], "ps": ["b:2"], "chief": ["c:3"]},'
                        ' "task": {"type": "chief", "index": 0}}').task_type   # "chief"
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON ({err}): {text[:200]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
        raise ValueError(f"TF_CONFIG needs a 'cluster' object, got {text[:200]!r}")
    cluster = data["cluster"]
    for job in ("worker", "ps"):
        addresses = cluster.get(job)
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(f"TF_CONFIG cluster needs a non-empty {job!r} list of host:port, got {addresses!r}")
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"TF_CONFIG {job} address {address!r} is not host:port")
    task = data.get("task") or {}
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in ("chief", "worker", "ps"):
        raise ValueError(f"TF_CONFIG task type must be 'chief', 'worker' or 'ps', got {task_type!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(cluster.get(task_type, [])):
        raise ValueError(f"TF_CONFIG task index {index!r} is not an index of cluster[{task_type!r}]")
    return TfConfig(cluster=cluster, task_type=task_type, task_index=index)


def loopback_only() -> bool:
    """True when this process's network namespace has no interface but ``lo``."""
    with open("/proc/net/dev") as f:
        names = [line.split(":")[0].strip() for line in f.readlines()[2:]]
    return names == ["lo"]


def require_loopback_only() -> None:
    """Raises ``RuntimeError`` unless this process runs in a loopback-only namespace."""
    if not loopback_only():
        raise RuntimeError(
            "refusing to start tf.distribute servers: they bind 0.0.0.0 and this network namespace has "
            f"interfaces besides lo; {NAMESPACE_HINT}"
        )


def namespace_command(argv: list) -> list:
    """``argv`` wrapped to run in a new user+network namespace with only ``lo`` up.

    Example: ``namespace_command(["python", "-m", "benchmarks.parameter_server"])``.
    """
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    return ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {quoted}"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    """``workers`` worker and ``servers`` parameter-server processes on loopback; this process is chief.

    Args:
      workers: number of worker tasks (>= 1).
      servers: number of parameter-server tasks (>= 1).
      startup_timeout: seconds to wait for every server to report ready.
      log_dir: if set, each task's stderr goes to ``<log_dir>/<job>_<index>.log``.
    """

    def __init__(self, workers: int, servers: int, startup_timeout: float = 120.0, log_dir: Optional[str] = None):
        if workers < 1 or servers < 1:
            raise ValueError(f"LocalCluster needs >= 1 worker and server, got workers={workers}, servers={servers}")
        require_loopback_only()
        self.spec = {
            "chief": [f"127.0.0.1:{_free_port()}"],
            "worker": [f"127.0.0.1:{_free_port()}" for _ in range(workers)],
            "ps": [f"127.0.0.1:{_free_port()}" for _ in range(servers)],
        }
        self.processes: dict = {}  # (job, index) -> Popen
        self.log_dir = log_dir
        try:
            for job in ("ps", "worker"):
                for index in range(len(self.spec[job])):
                    self.start_task(job, index)
            self._wait_ready(startup_timeout)
        except BaseException:
            self.close()
            raise

    def start_task(self, job: str, index: int) -> int:
        """Starts (or restarts) one server task; returns its PID."""
        cmd = [sys.executable, "-m", "tfdp_sparse.distribute.server", json.dumps(self.spec), job, str(index)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        if self.log_dir is None:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        else:
            with open(os.path.join(self.log_dir, f"{job}_{index}.log"), "ab") as log:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
        self.processes[(job, index)] = proc
        return proc.pid

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for (job, index), proc in self.processes.items():
            line = proc.stdout.readline().decode().strip()
            if line != "ready" or time.monotonic() > deadline:
                raise RuntimeError(f"{job}:{index} (pid {proc.pid}) did not start: got {line!r}")

    @property
    def pids(self) -> dict:
        """``{(job, index): pid}`` of every task started (alive or not)."""
        return {key: proc.pid for key, proc in self.processes.items()}

    def address(self, job: str, index: int) -> str:
        return self.spec[job][index]

    def kill_task(self, job: str, index: int) -> None:
        """Ends one task by its PID (SIGKILL) and waits for it."""
        proc = self.processes[(job, index)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def resolver(self):
        """A ``SimpleClusterResolver`` for the chief (this process)."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.spec), task_type="chief", task_id=0, rpc_layer="grpc"
        )

    def close(self) -> None:
        """Ends every started process by its PID and reaps it, after :func:`release_cluster` (no gRPC noise).

        Workers end before parameter servers (they talk to the servers).
        """
        try:
            release_cluster(self.spec)
        finally:  # the processes end whatever happens
            self._end_processes()

    def _end_processes(self) -> None:
        ordered = sorted(self.processes.items(), key=lambda item: item[0][0] != "worker")
        for _, proc in ordered:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        for _, proc in ordered:
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def release_cluster(spec: Mapping[str, list]) -> None:
    """Lets this process (the chief) go on without the tasks of ``spec``; call it before they end.

    A chief connected to a cluster registers every ``tf.function`` it traces
    on every task and removes it from every task when the function is
    freed. Once the tasks are gone each of those calls fails with gRPC
    "Failed to connect ... Connection refused" error lines: hundreds at
    interpreter exit, thousands when the chief goes on evaluating and
    exporting after a cluster run. So, while every task still answers:

    1. unreachable functions and remote handles are freed (``gc.collect()``);
    2. the eager context is narrowed to this process's own job
       (``update_server_def``), so later functions stay local.

    Variables still held on the tasks become unusable, as they would anyway
    once the tasks end. A no-op when this process is not connected to
    ``spec`` (TensorFlow not imported, or another cluster).

    Example::

        release_cluster(cluster.spec)    # what LocalCluster.close() does before killing the tasks
    """
    if "tensorflow" not in sys.modules:
        return  # nothing was ever connected
    gc.collect()
    from tensorflow.python.eager import context  # no public API narrows a connected cluster in place

    ctx = context.context_safe()
    server_def = None if ctx is None else ctx.get_server_def()
    if server_def is None or not set(spec.get("ps", [])) <= _addresses(server_def):
        return
    local = type(server_def)()
    local.CopyFrom(server_def)
    own = [job for job in local.cluster.job if job.name == local.job_name]
    del local.cluster.job[:]
    local.cluster.job.extend(own)
    local.ClearField("cluster_device_filters")  # fixed at connection time: TF warns on any in an update
    ctx.update_server_def(local)


def _addresses(server_def) -> set:
    """Every ``host:port`` of a ``ServerDef``'s cluster."""
    return {address for job in server_def.cluster.job for address in job.tasks.values()}


def tf_config_resolver(environ: Mapping[str, str] = os.environ):
    """A ``TFConfigClusterResolver`` after checking ``TF_CONFIG`` with :func:`parse_tf_config`."""
    if "TF_CONFIG" not in environ:
        raise ValueError("--cluster=TF_CONFIG needs the TF_CONFIG environment variable (JSON cluster and task)")
    config = parse_tf_config(environ["TF_CONFIG"])
    if config.task_type != "chief":
        raise ValueError(
            f"this process is TF_CONFIG task {config.task_type}:{config.task_index}; the trainer runs on the "
            "chief only (start workers and servers with python -m tfdp_sparse.distribute.server)"
        )
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def cluster_roles(cluster: LocalCluster) -> dict:
    """``{pid: role}`` of a local cluster's tasks, this process as ``"chief"`` (for byte counting)."""
    roles = {pid: job for (job, _), pid in cluster.pids.items()}
    roles[os.getpid()] = "chief"
    return roles
