"""crilab: pods the way kubelet makes them, for the lab. Debian's containerd (1.6, its CRI
plugin built in) with runc, started by PID in a host namespace of the lab with its own root,
state, socket and configuration (CRI pointed at a conflist directory and a plugin directory
of the test's); images built here, since no registry is reachable (a static ``pause`` binary
and a busybox tree with iperf3, each a one-layer docker archive imported with ``ctr -n k8s.io
images import``); and crictl (built from the Go module proxy by scripts/setup.sh into
target/tools, as cnitool is) to run pods and containers through CRI, as kubelet would.

What containerd needs here (found on this machine):
- ``restrict_oom_score_adj = true``: CRI asks for the sandbox's oom_score_adj -998 and root
  here lacks CAP_SYS_RESOURCE; without it runc fails ("can't get final child's PID from pipe").
- containerd and crictl run in the host's network namespace through ``nsenter --net`` (not
  ``ip netns exec``, which mounts a /sys of its own), in the mount namespace vnetd runs in:
  the pods' namespaces are bind mounts in /var/run/netns (``cni-UUID``) that vnetd must see to
  put a pod's veth there, and crictl's exec streams come from containerd's loopback.
- containerd 1.6 reads one conflist (the first in ``conf_dir``) and one plugin directory
  (``bin_dir``): the test's holds links to Debian's plugins (/usr/lib/cni) and vnet-cni.
- Its shims (containerd-shim-runc-v2) outlive a containerd restart by design; they run in
  the host's namespace, so the lab's cleanup of that namespace ends any left.

A recording wrapper stands in front of vnet-cni (``Containerd.calls()``): every call's
CNI_* environment and network configuration, so a test sees what containerd really passed
(CNI_ARGS with K8S_POD_*, CNI_IFNAME, runtimeConfig) and can replay a DEL exactly."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import netlab

CONTAINERD = Path(shutil.which("containerd") or "/usr/bin/containerd")
CTR = Path(shutil.which("ctr") or "/usr/bin/ctr")
RUNC = Path("/usr/sbin/runc")
CRICTL = netlab.REPO / "target" / "tools" / "crictl"
CNI_DIR = Path("/usr/lib/cni")
BUSYBOX = Path("/bin/busybox")
IPERF3 = Path(shutil.which("iperf3") or "/usr/bin/iperf3")
PAUSE_IMAGE = "localhost/vnet-pause:1"
POD_IMAGE = "localhost/vnet-busybox:1"
APPLETS = ("sh", "ping", "ip", "sleep", "cat", "nc", "ls", "echo", "true", "wget")

PAUSE_C = r"""
/* The pod sandbox's process: holds the pod's namespaces until it is told to stop. */
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def missing_tools() -> list:
    """What the CRI tests need and this machine lacks, each with where it comes from."""
    need = ((CONTAINERD, "containerd (scripts/setup.sh installs it)"),
            (CTR, "ctr (Debian's containerd)"),
            (RUNC, "runc (scripts/setup.sh installs it)"),
            (CRICTL, "crictl (scripts/setup.sh builds it from the Go module proxy)"),
            (BUSYBOX, "busybox (busybox-static)"),
            (CNI_DIR / "host-local", "host-local (containernetworking-plugins)"),
            (CNI_DIR / "portmap", "portmap (containernetworking-plugins)"),
            (CNI_DIR / "loopback", "loopback (containernetworking-plugins)"))
    out = [f"{p} is missing: {what}" for p, what in need if not p.exists()]
    if shutil.which("cc") is None:
        out.append("cc is missing (gcc builds the pause binary)")
    return out


# --- images ---------------------------------------------------------------------------------

def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
    tar.addfile(info)


def docker_archive(out: Path, tag: str, layer: bytes, entrypoint: list, cmd: list = ()) -> Path:
    """A one-layer image as a docker archive (what ``docker save`` writes and ``ctr images
    import`` reads): the layer, the image config naming its digest, the manifest."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": list(cmd) or None, "Env": ["PATH=/bin:/usr/bin"],
                   "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "vnetlab/crilab.py"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(out, "w") as t:
        _add_file(t, "layer.tar", layer, 0o644)
        _add_file(t, config_name, config, 0o644)
        _add_file(t, "manifest.json", manifest, 0o644)
    return out


def _layer(build) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        build(t)
    return buf.getvalue()


def pause_image(workdir: Path) -> Path:
    """The sandbox image: a static binary that waits in pause() and exits on SIGTERM/SIGINT."""
    src, binary = workdir / "pause.c", workdir / "pause"
    src.write_text(PAUSE_C)
    netlab.sh("cc", "-static", "-Os", "-o", binary, src, timeout=120)

    def build(t):
        _add_file(t, "pause", binary.read_bytes())
    return docker_archive(workdir / "pause.tar", PAUSE_IMAGE, _layer(build), ["/pause"])


def _libraries(binary: Path) -> list:
    """The shared libraries ``ldd`` lists for a binary, and its loader."""
    out = netlab.sh("ldd", binary).stdout
    return sorted({Path(m) for m in re.findall(r"(/\S+\.so[.\d]*)", out)})


def pod_image(workdir: Path) -> Path:
    """The pods' image: static busybox with its applets, and iperf3 with its libraries."""
    def build(t):
        for d in ("bin", "tmp", "etc", "lib", "lib64", "usr", "usr/bin", "proc", "sys", "dev"):
            _add_dir(t, d)
        _add_file(t, "bin/busybox", BUSYBOX.read_bytes())
        for a in APPLETS:
            _add_link(t, f"bin/{a}", "busybox")
        _add_file(t, "usr/bin/iperf3", IPERF3.read_bytes())
        dirs = {"lib", "lib64", "usr", "usr/bin"}
        for lib in _libraries(IPERF3):
            rel = str(lib.resolve().relative_to("/"))
            for parent in reversed(Path(rel).parents[:-1]):
                if str(parent) not in dirs:
                    dirs.add(str(parent))
                    _add_dir(t, str(parent))
            _add_file(t, rel, lib.resolve().read_bytes())
            name = str(lib.relative_to("/"))
            if name != rel:
                for parent in reversed(Path(name).parents[:-1]):
                    if str(parent) not in dirs:
                        dirs.add(str(parent))
                        _add_dir(t, str(parent))
                _add_link(t, name, "/" + rel)
        _add_file(t, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", 0o644)
        _add_file(t, "etc/group", b"root:x:0:\n", 0o644)
    return docker_archive(workdir / "busybox.tar", POD_IMAGE, _layer(build), [], ["sh"])


# --- containerd -----------------------------------------------------------------------------

WRAPPER = """#!/bin/sh
# Records the call containerd makes (its CNI_* environment, the network configuration on
# stdin), runs the real plugin with them, and records its answer and exit status.
n="{log}/$(date +%s%N)-$$"
env | grep '^CNI_' > "$n.env"
cat > "$n.in"
{real} < "$n.in" > "$n.out"
rc=$?
echo "$rc" > "$n.rc"
cat "$n.out"
exit "$rc"
"""


@dataclass
class CniCall:
    """One call of vnet-cni as containerd made it, and how it ended (``rc`` None while it
    runs)."""
    env: dict
    config: dict
    rc: Optional[int]
    output: str

    @property
    def command(self) -> str:
        return self.env.get("CNI_COMMAND", "")

    @property
    def args(self) -> dict:
        return dict(kv.split("=", 1) for kv in self.env.get("CNI_ARGS", "").split(";") if "=" in kv)


class Containerd:
    """containerd in ``host``'s network namespace (the host's mounts), everything of its own
    under ``dir``; CRI's CNI from ``conf_dir`` and ``bin_dir``."""

    def __init__(self, lab: netlab.Lab, host: netlab.Host, dir: Path, conf_dir: Path, vnet_cni: Path):
        self.lab, self.host, self.dir, self.conf_dir = lab, host, dir, conf_dir
        dir.mkdir(parents=True, exist_ok=True)
        self.sock = dir / "c.sock"
        self.bin_dir = dir / "bin"
        self.call_log = dir / "cni-calls"
        self.bin_dir.mkdir()
        self.call_log.mkdir()
        for p in CNI_DIR.iterdir():
            os.symlink(p, self.bin_dir / p.name)
        wrapper = self.bin_dir / "vnet-cni"
        wrapper.write_text(WRAPPER.format(log=self.call_log, real=vnet_cni))
        wrapper.chmod(0o755)
        self.config = dir / "config.toml"
        self.config.write_text(f"""version = 2
root = "{dir / 'root'}"
state = "{dir / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.sock}"

[ttrpc]
  address = "{self.sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir / 'opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{dir / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{self.bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
""")
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        self.pods: dict[str, "Pod"] = {}

    # -- the daemon --
    def start(self, timeout: float = 30) -> float:
        """Starts containerd; returns the seconds until CRI answered."""
        self.starts += 1
        log = open(self.dir / f"containerd-{self.starts}.log", "wb")
        t0 = time.monotonic()
        self.proc = self.host.popen(CONTAINERD, "--config", self.config, host_mounts=True,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def ready():
            if self.proc.poll() is not None:
                raise netlab.LabError(f"containerd exited (rc={self.proc.returncode}):\n{self.log()[-3000:]}")
            return self.crictl("info", check=False, timeout=10).returncode == 0
        netlab.wait_until(ready, timeout, 0.1, what=f"containerd's CRI in {self.host.name}")
        return time.monotonic() - t0

    def stop(self, sig=signal.SIGTERM) -> Optional[int]:
        if self.proc is None:
            return None
        rc = netlab.stop_pid(self.proc, sig, timeout=15)
        self.proc = None
        return rc

    def log(self) -> str:
        return "\n".join((self.dir / f"containerd-{i}.log").read_text(errors="replace")
                         for i in range(1, self.starts + 1) if (self.dir / f"containerd-{i}.log").exists())

    def _nsenter(self) -> list:
        return ["nsenter", f"--net=/run/netns/{self.host.name}"]

    def ctr(self, *args, check=True, timeout=60) -> subprocess.CompletedProcess:
        return netlab.sh(*self._nsenter(), CTR, "--address", self.sock, "-n", "k8s.io", *args,
                         check=check, timeout=timeout)

    def crictl_argv(self, *args) -> list:
        return [*self._nsenter(), CRICTL, "--runtime-endpoint", f"unix://{self.sock}",
                "--image-endpoint", f"unix://{self.sock}", "--timeout", "60s", *map(str, args)]

    def crictl(self, *args, check=True, timeout=90) -> subprocess.CompletedProcess:
        r = netlab.sh(*self.crictl_argv(*args), check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise netlab.LabError(f"crictl {' '.join(map(str, args))} on {self.host.role}: rc={r.returncode}\n"
                                  f"{r.stdout}\n{r.stderr}")
        return r

    def import_image(self, tar: Path) -> None:
        self.ctr("images", "import", tar)

    # -- pods --
    def runp(self, name: str, port_mappings: list = (), annotations: Optional[dict] = None) -> "Pod":
        """``crictl runp`` (RunPodSandbox: the pause container, its namespace, the CNI ADD),
        then ``crictl create`` + ``crictl start`` of a container of the pod image in it."""
        d = self.dir / "pods" / name
        d.mkdir(parents=True)
        sandbox = {"metadata": {"name": name, "namespace": "vnet-test", "uid": f"uid-{name}", "attempt": 1},
                   "hostname": name, "log_directory": str(d),
                   "linux": {"security_context": {"namespace_options": {"network": 0}}}}
        if port_mappings:
            sandbox["port_mappings"] = list(port_mappings)
        if annotations:
            sandbox["annotations"] = annotations
        container = {"metadata": {"name": "main"}, "image": {"image": POD_IMAGE},
                     "command": ["sleep", "3600"], "log_path": "main.log", "linux": {}}
        (d / "pod.json").write_text(json.dumps(sandbox))
        (d / "container.json").write_text(json.dumps(container))
        pod_id = self.crictl("runp", d / "pod.json").stdout.strip()
        pod = Pod(self, name, pod_id, d)
        self.pods[name] = pod
        self.lab.adopt_netns(pod.netns)
        pod.container = self.crictl("create", pod_id, d / "container.json", d / "pod.json").stdout.strip()
        self.crictl("start", pod.container)
        return pod

    def inspectp(self, pod_id: str) -> dict:
        return json.loads(self.crictl("inspectp", "-o", "json", pod_id).stdout)

    def pod_ids(self) -> list:
        return self.crictl("pods", "-q").stdout.split()

    def remove(self, pod: "Pod") -> None:
        """``crictl stopp`` (StopPodSandbox: the CNI DEL) and ``crictl rmp``."""
        self.crictl("stopp", pod.id)
        self.crictl("rmp", pod.id)
        self.pods.pop(pod.name, None)

    def calls(self, command: Optional[str] = None, container_id: Optional[str] = None) -> list:
        """vnet-cni's calls so far, oldest first (optionally one command, one sandbox)."""
        out = []
        for env in sorted(self.call_log.glob("*.env"), key=lambda p: int(p.name.split("-")[0])):
            try:
                e = dict(l.split("=", 1) for l in env.read_text().splitlines() if "=" in l)
                c = json.loads(env.with_suffix(".in").read_text() or "{}")
                rc_file, out_file = env.with_suffix(".rc"), env.with_suffix(".out")
                rc = int(rc_file.read_text()) if rc_file.exists() else None
                output = out_file.read_text() if out_file.exists() else ""
            except (OSError, ValueError):
                continue
            call = CniCall(e, c, rc, output)
            if command and call.command != command:
                continue
            if container_id and e.get("CNI_CONTAINERID") != container_id:
                continue
            out.append(call)
        return out

    def replay(self, call: CniCall, real: Path, **env) -> subprocess.CompletedProcess:
        """Runs the plugin ``real`` again as containerd called it in ``call`` (its
        environment, with ``env``'s changes, and its configuration), in the host's
        namespace: a runtime retrying a DEL."""
        e = dict(call.env, **env)
        return netlab.sh(*self._nsenter(), "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                         *[f"{k}={v}" for k, v in e.items()], real, check=False, timeout=60,
                         input=json.dumps(call.config))

    def mounts(self) -> list:
        with open("/proc/self/mountinfo") as f:
            return [l.split()[4] for l in f if l.split()[4].startswith(str(self.dir))]

    def cleanup(self) -> None:
        """Every pod removed through CRI (their DELs run), containerd stopped, anything it
        left mounted unmounted. The shims and pod processes that remain are in namespaces the
        lab owns (the host's, the adopted pod namespaces) and end with them."""
        if self.proc is not None and self.proc.poll() is None:
            for pid in self.pod_ids() if self.crictl("info", check=False).returncode == 0 else []:
                self.crictl("stopp", pid, check=False)
                self.crictl("rmp", "-f", pid, check=False)
            self.stop()
        for m in sorted(self.mounts(), key=len, reverse=True):
            netlab.sh("umount", "-l", m, check=False)


class Pod:
    """A pod made through CRI: its sandbox id, its container, its network namespace."""

    def __init__(self, ctd: Containerd, name: str, pod_id: str, dir: Path):
        self.ctd, self.name, self.id, self.dir = ctd, name, pod_id, dir
        self.container: Optional[str] = None
        info = ctd.inspectp(pod_id)
        self.status = info["status"]
        self.ip = self.status["network"]["ip"]
        spaces = info["info"]["runtimeSpec"]["linux"]["namespaces"]
        path = next(n["path"] for n in spaces if n["type"] == "network")
        self.netns_path = path
        self.netns = Path(path).name

    def __repr__(self):
        return f"<Pod {self.name} {self.ip} {self.id[:12]}>"

    def exec(self, *cmd, check=True, timeout=60) -> subprocess.CompletedProcess:
        """``crictl exec`` in the pod's container (its image's tools: busybox, iperf3)."""
        r = self.ctd.crictl("exec", self.container, *cmd, check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise netlab.LabError(f"crictl exec {self.name} {' '.join(map(str, cmd))}: rc={r.returncode}\n"
                                  f"{r.stdout}\n{r.stderr}")
        return r

    def popen_exec(self, *cmd, **kw) -> subprocess.Popen:
        """``crictl exec`` in the background (stopped by PID by the lab at the latest)."""
        p = subprocess.Popen(self.ctd.crictl_argv("exec", self.container, *cmd), **kw)
        self.ctd.lab._procs.append(p)
        return p

    def ns(self) -> "PodNetns":
        return PodNetns(self.ctd.lab, self.netns)


class PodNetns:
    """A pod's network namespace seen from the host, for the lab's tools that take a
    namespace (``Pinger``, ``Lab.ping``): they run the host's own ping there."""

    def __init__(self, lab: netlab.Lab, name: str):
        self.lab, self.name = lab, name

    def exec(self, *args, check=True, timeout=30, input=None) -> subprocess.CompletedProcess:
        return netlab.sh("ip", "netns", "exec", self.name, *args, check=check, timeout=timeout, input=input)

    def popen(self, *args, **kw) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", self.name, *map(str, args)], **kw)
        self.lab._procs.append(p)
        return p


def k8s_cgroups() -> set:
    """The cgroup directories runc makes for CRI's pods (``k8s.io`` under each hierarchy)."""
    return set(Path("/sys/fs/cgroup").glob("*/k8s.io"))


def remove_empty_cgroups(made: set) -> None:
    """Removes the cgroup directories in ``made`` (and their children) that hold no process;
    a directory still in use stays (rmdir refuses it)."""
    for top in made:
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(str(p)), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


class Cgroups:
    """cgroups of the lab's own for processes the test runs outside containerd (a cnitool
    container's iperf3), shaped as runc places a pod's container (a group of its own under a
    common parent in each hierarchy the CPU, memory, pids and blkio controllers use, and the
    unified one): so a comparison with pods is not one between the root cgroup's many
    entities and a container's one."""

    HIERARCHIES = ("cpu", "cpuacct", "memory", "pids", "blkio", "unified")

    def __init__(self, lab: netlab.Lab):
        self.top = f"vnetlab-{lab.id}"
        self.made: list[Path] = []

    def make(self, name: str) -> list:
        """Creates group ``name``; returns the files a process writes its PID to to join it."""
        procs = []
        for h in self.HIERARCHIES:
            base = Path("/sys/fs/cgroup") / h
            if not base.is_dir():
                continue
            for d in (base / self.top, base / self.top / name):
                if not d.exists():
                    d.mkdir()
                    self.made.append(d)
            procs.append(base / self.top / name / "cgroup.procs")
        return procs

    def wrap(self, name: str, *argv) -> list:
        """``argv`` run in group ``name`` (a shell joins it, then execs the command)."""
        files = " ".join(str(f) for f in self.make(name))
        return ["sh", "-c", f'for f in {files}; do echo $$ > "$f"; done; exec "$@"', "sh", *map(str, argv)]

    def remove(self) -> None:
        for d in sorted(self.made, key=lambda p: len(str(p)), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        self.made.clear()
