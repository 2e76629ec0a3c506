"""Several hosts on one machine: network namespaces joined by veth pairs to a bridge in a
'switch' namespace. Everything (namespaces, links, addresses in 10.213.7.0/24) is created by
the test and removed at the end."""
import os
import shutil
import subprocess


def run(*args):
    subprocess.run(list(args), check=True, capture_output=True, text=True)


def available():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"rqprobe{os.getpid() % 100000}"
    try:
        run("ip", "netns", "add", name)
        run("ip", "netns", "del", name)
        return True
    except subprocess.CalledProcessError:
        return False


class Hosts:
    """hosts['dr0'] is the address of host dr0; exec() runs a command inside it."""

    def __init__(self, names):
        self.tag = f"rq{os.getpid() % 100000}"
        self.namespaces = []
        self.procs = []
        self.addr = {}
        self.sw = self._ns("sw")
        run("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.sw, "link", "set", "br0", "mtu", "9000", "up")
        for i, name in enumerate(names):
            ns = self._ns(name)
            a, b = f"{self.tag}a{i}", f"{self.tag}b{i}"
            run("ip", "link", "add", a, "address", self._mac(i), "type", "veth", "peer", "name", b)
            run("ip", "link", "set", a, "netns", ns)
            run("ip", "link", "set", b, "netns", self.sw)
            run("ip", "-n", ns, "link", "set", a, "name", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "mtu", "9000", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", self.sw, "link", "set", b, "mtu", "9000", "master", "br0", "up")
            addr = f"10.213.7.{i + 1}"
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            self.addr[name] = addr
        self._neighbours(names)

    @staticmethod
    def _mac(i):
        return f"02:72:64:71:07:{i + 1:02x}"

    def _neighbours(self, names):
        """Permanent neighbour entries: without them a burst's first datagrams wait for ARP,
        and on a busy machine the kernel's small queue of unresolved packets drops them."""
        for name in names:
            for j, other in enumerate(names):
                if other != name:
                    run("ip", "-n", f"{self.tag}{name}", "neigh", "replace", self.addr[other],
                        "lladdr", self._mac(j), "dev", "eth0", "nud", "permanent")

    def _ns(self, name):
        ns = f"{self.tag}{name}"
        run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        return ns

    def exec(self, name, args, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", f"{self.tag}{name}"] + [str(a) for a in args], **kw)
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
