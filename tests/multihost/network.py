"""Hosts on one machine: Linux network namespaces joined by a bridge.

    net = Network("partitions")
    head, ds = net.host("head"), net.host("ds1")
    proc = head.popen(["sluice-coordinator", ...])
    net.cut(head, ds)      # silent: packets dropped, no RST, no ICMP
    net.heal()             # every cut gone
    net.limit(ds, "2gbit") # token-bucket rate limit on the link to ds
    net.delay(ds, 5)       # every packet ds sends leaves 5 ms later
    net.close()            # stops its processes by PID, deletes the namespaces

Every host is a namespace with one interface, eth0, at 10.77.0.N/24 and its
own loopback; its veth peer sits in a bridge in a namespace of its own, so
nothing outside the namespaces is addressed and nothing of the machine's
own network is touched. A cut is an nftables rule in the bridge's
namespace (family bridge, forward hook) dropping the hosts' frames both
ways, as a real partition does: the peers see nothing, their TCP
connections stay open until a timeout says otherwise. Needs root (CI runs
as root), iproute2 and nftables.

This kernel has no sch_netem, so there is no delay or loss qdisc: `limit`
is `tbf` (a rate limit), a lossy link is `Network.drop_share`, an nftables
`numgen random` rule dropping that share of the frames, and a delay is
`Network.delay`: an iptables NFQUEUE rule on a host's way out, whose
packets the `netdelay` tool (tests/multihost/netdelay.cc) holds for the
delay before letting them go.
"""
import itertools
import os
import re
import signal
import subprocess
import time

_PREFIX = "sluice-t"
_SUBNET = "10.77.0"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces():
    """Deletes namespaces a crashed run left (their creator's PID is gone)."""
    listed = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({_PREFIX}(\d+)-\S+)", listed, re.M):
        if not _pid_alive(int(name[1])):
            _ip("netns", "del", name[0], check=False)


class Host:
    def __init__(self, net, name, index):
        self.net, self.name, self.index = net, name, index
        self.ns = f"{net.prefix}{name}"
        self.ip = f"{_SUBNET}.{index}"
        self.procs = []
        _ip("netns", "add", self.ns)
        _ip("link", "add", f"p-{name}", "netns", net.bridge_ns, "type", "veth", "peer", "name",
            "eth0", "netns", self.ns)
        _ip("-n", net.bridge_ns, "link", "set", f"p-{name}", "master", "br0", "up")
        _ip("-n", self.ns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "eth0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def argv(self, argv):
        return ["ip", "netns", "exec", self.ns, *argv]

    def env(self):
        """The environment of processes on this host: the machine's, with
        $SLUICE_NODE naming the host (the namespaces share one host name)."""
        return dict(os.environ, SLUICE_NODE=self.name)

    def popen(self, argv, **kwargs):
        """A process on this host (`ip netns exec` execs it: same PID);
        stopped by `Network.close` if still running."""
        kwargs.setdefault("env", self.env())
        proc = subprocess.Popen(self.argv(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv, **kwargs):
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("env", self.env())
        return subprocess.run(self.argv(argv), **kwargs)

    def fetch(self, url, timeout=5):
        """An HTTP GET from this host (a metrics page); the body, or None
        when it cannot be read."""
        got = self.run(["/usr/bin/python3", "-c",
                        "import sys, urllib.request\n"
                        "sys.stdout.write(urllib.request.urlopen(sys.argv[1], "
                        "timeout=float(sys.argv[2])).read().decode())", url, str(timeout)])
        return got.stdout if got.returncode == 0 else None

    def __repr__(self):
        return f"Host({self.name}, {self.ip})"


class Network:
    def __init__(self, name="net", bin_dir=None):
        """`bin_dir` holds the test tools (`netdelay`); needed by `delay`."""
        remove_stale_namespaces()
        self.bin_dir = bin_dir
        self.prefix = f"{_PREFIX}{os.getpid()}-{name[:8]}-"
        self.bridge_ns = f"{self.prefix}br"
        self.hosts = []
        self._index = itertools.count(1)
        self._cuts = set()
        _ip("netns", "add", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        self._nft("add table bridge faults")
        self._nft("add chain bridge faults cuts { type filter hook forward priority 0; }")

    def host(self, name):
        h = Host(self, name, next(self._index))
        self.hosts.append(h)
        return h

    def _nft(self, command):
        subprocess.run(["ip", "netns", "exec", self.bridge_ns, "nft", command], check=True,
                       capture_output=True, text=True)

    def cut(self, a, b=None):
        """Drops every frame between `a` and `b` (hosts or lists of hosts),
        both ways; without `b`, between `a` and every other host."""
        group_a = a if isinstance(a, (list, tuple)) else [a]
        if b is None:
            group_b = [h for h in self.hosts if h not in group_a]
        else:
            group_b = b if isinstance(b, (list, tuple)) else [b]
        for x in group_a:
            for y in group_b:
                for src, dst in ((x, y), (y, x)):
                    if (src.ip, dst.ip) in self._cuts:
                        continue
                    self._cuts.add((src.ip, dst.ip))
                    self._nft(f"add rule bridge faults cuts ip saddr {src.ip} "
                              f"ip daddr {dst.ip} drop")

    def drop_share(self, percent):
        """Drops `percent` % of the frames on every link, at random."""
        self._nft(f"add rule bridge faults cuts numgen random mod 100 < {int(percent)} "
                  "counter drop")

    def dropped_at_random(self):
        """Frames `drop_share` has dropped so far."""
        listed = subprocess.run(["ip", "netns", "exec", self.bridge_ns, "nft", "list", "chain",
                                 "bridge", "faults", "cuts"], check=True, capture_output=True,
                                text=True).stdout
        return sum(int(n) for n in re.findall(r"numgen random.*counter packets (\d+)", listed))

    def heal(self):
        """Removes every cut and drop rule."""
        self._nft("flush chain bridge faults cuts")
        self._cuts.clear()

    def delay(self, host, ms):
        """Delays every packet `host` sends by `ms` milliseconds (one way;
        on every host, a round trip between two of them takes 2 x `ms`
        more). `netdelay` runs on the host, holding what an iptables
        NFQUEUE rule on eth0's way out queues to it."""
        queue = host.index
        tool = subprocess.Popen(host.argv([os.path.join(self.bin_dir, "netdelay"),
                                           f"--queue={queue}", f"--delay_us={int(ms * 1000)}"]),
                                stdout=subprocess.PIPE, text=True)
        host.procs.append(tool)
        if tool.stdout.readline().strip() != "ready":
            raise RuntimeError(f"netdelay on {host.name} did not start")
        subprocess.run(host.argv(["iptables-legacy", "-A", "OUTPUT", "-o", "eth0", "-j",
                                  "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]),
                       check=True, capture_output=True, text=True)

    def delayed(self, host):
        """Packets `host` has sent through its `delay` rule so far."""
        listed = subprocess.run(host.argv(["iptables-legacy", "-L", "OUTPUT", "-v", "-n", "-x"]),
                                check=True, capture_output=True, text=True).stdout
        return sum(int(line.split()[0]) for line in listed.splitlines() if "NFQUEUE" in line)

    def delay_everywhere(self, ms):
        """`delay` on every host: each link adds `ms` each way."""
        for h in self.hosts:
            self.delay(h, ms)

    def limit(self, host, rate):
        """A token-bucket rate limit (tc's syntax: "2gbit") on the bridge's
        port to `host`: what the host receives."""
        subprocess.run(["ip", "netns", "exec", self.bridge_ns, "tc", "qdisc", "replace", "dev",
                        f"p-{host.name}", "root", "tbf", "rate", rate, "burst", "256kb",
                        "latency", "50ms"], check=True, capture_output=True, text=True)

    def close(self):
        self.heal()  # processes stop as fast as over a healthy network
        for h in self.hosts:
            for proc in h.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            for proc in h.procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for h in self.hosts:
            _ip("netns", "del", h.ns, check=False)
        _ip("netns", "del", self.bridge_ns, check=False)


def wait_for(predicate, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)  # polling with a deadline
    raise TimeoutError(f"timed out waiting for {what}")
