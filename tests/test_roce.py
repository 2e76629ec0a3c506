"""RoCEv2 end to end across network namespaces: `rdaq emulate` writes each module frame as RC
RDMA WRITEs over raw frames, `rdaq receive --format roce` is the software RoCEv2 target on the
AF_XDP engine. Frames are checked bit-exact against the emulator's manifest, losses and
corruption injected on the way are recovered by the RC protocol (ICRC drop, NAK, go-back-N),
and Wireshark's dissector (tshark) and scapy's RoCE layer read the packets as RoCEv2."""
import json
import select
import shutil
import subprocess
import time

import pytest

import netns
from conftest import RDAQ as BIN, frames_in, manifest

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root to create network namespaces")

MODULE_BYTES = 1 << 20


class Pair:
    """A sender and a receiver host; the receiver's buffer map once it listens."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.hosts = netns.Hosts(["snd", "rcv"])
        self.rcv = self.hosts.addr["rcv"]

    def receive(self, frames, *extra, out=True):
        self.map = self.tmp / "map.json"
        self.summary = self.tmp / "summary.json"
        self.out = self.tmp / "roce.h5"
        args = [BIN, "receive", "--format", "roce", "--engine", "af_xdp", "--bind", self.rcv, "--frames", frames,
                "--timeout-s", 60, "--stream", "none", "--ring-mib", 64, "--buffers-out", self.map,
                "--summary-json", self.summary, *extra]
        if out:
            args += ["--out", self.out]
        self.rx = self.hosts.exec("rcv", args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(200):
            if self.map.exists() and self.map.stat().st_size > 0:
                return json.loads(self.map.read_text())
            assert self.rx.poll() is None, self.rx.stdout.read()
            time.sleep(0.05)
        raise AssertionError("the receiver wrote no buffer map")

    def emulate(self, frames, *extra):
        self.manifest = self.tmp / "manifest.csv"
        p = self.hosts.exec("snd", [BIN, "emulate", "--buffers", self.map, "--target", self.rcv, "--frames", frames,
                                    "--manifest", self.manifest, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = p.communicate(timeout=120)
        return p.returncode, out

    def finish(self):
        out, _ = self.rx.communicate(timeout=90)
        return self.rx.returncode, out, json.loads(self.summary.read_text())


@pytest.fixture
def pair(tmp_path, rdaq):
    p = Pair(tmp_path)
    yield p
    p.hosts.close()


def assert_bit_exact(pair, frames, modules):
    want = manifest(pair.manifest)
    got = frames_in(pair.out)
    assert sorted(got) == list(range(frames))
    for f, hashes in got.items():
        assert hashes == [want[(f, m)] for m in range(modules)], f"frame {f}"


def test_roce_frames_arrive_bit_exact_from_two_queue_pairs(pair):
    frames, modules = 40, 2
    m = pair.receive(frames, "--modules", modules)
    assert [q["qpn"] for q in m["roce"]] == [0x100, 0x101] and m["payload_bytes"] == 4096
    assert all(b["va"] > 0 for b in m["buffers"])
    rc, out = pair.emulate(frames, "--rate", 200)
    assert rc == 0, out
    rc, out, s = pair.finish()
    assert rc == 0, out
    assert "loss        : none" in out
    assert s["frames_complete"] == frames and s["datagrams_dropped"] == 0
    assert s["datagrams_placed"] == frames * modules * MODULE_BYTES // 4096
    # every ACK sent is counted, and so are the ones the interface would have refused
    assert s["acks_sent"] > 0 and "replies_refused" in s and "rc          : " in out
    assert_bit_exact(pair, frames, modules)


def test_roce_recovers_loss_corruption_duplicates_and_reordering(pair):
    frames = 30
    pair.receive(frames, "--roce-mtu", 2048)
    rc, out = pair.emulate(frames, "--rate", 300, "--loss", 0.003, "--corrupt", 0.002, "--duplicate", 0.003,
                           "--reorder", 0.003, "--seed", 7)
    assert rc == 0, out
    rc, out, s = pair.finish()
    assert rc == 0, out
    drops = dict(s["dropped_by_reason"])
    # corrupted packets fail the ICRC (or, hit in the IP header, do not parse), losses and
    # reordering put later packets out of sequence (NAKed), duplicates arrive behind
    assert drops.get("bad_icrc", 0) + drops.get("roce_malformed", 0) > 0, drops
    assert drops.get("out_of_sequence", 0) > 0 and drops.get("psn_duplicate", 0) > 0, drops
    assert s["nacks_sent"] > 0
    assert s["frames_complete"] == frames
    assert_bit_exact(pair, frames, 1)


def test_roce_refuses_hostile_packets_and_then_receives_bit_exact(pair):
    import sys
    from conftest import ROOT
    frames = 10
    pair.receive(frames)
    stranger = pair.hosts.exec("snd", [sys.executable, ROOT / "tests" / "roce_stranger.py", pair.map, pair.rcv, "eth0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = stranger.communicate(timeout=60)
    assert stranger.returncode == 0, out
    rc, out = pair.emulate(frames, "--rate", 200)
    assert rc == 0, out
    rc, out, s = pair.finish()
    assert rc == 0, out
    drops = dict(s["dropped_by_reason"])
    assert drops == {"unknown_qp": 1, "remote_access": 2, "invalid_request": 1, "bad_icrc": 1, "roce_malformed": 1}, drops
    assert s["frames_complete"] == frames
    assert_bit_exact(pair, frames, 1)


def test_roce_packets_decode_in_wireshark_and_their_icrc_matches_scapys(pair, tmp_path):
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    frames = 3
    m = pair.receive(frames, "--roce-mtu", 4096, "--first-frame", 5, out=False)
    cap = tmp_path / "roce.pcap"
    dump = pair.hosts.exec("snd", ["tshark", "-q", "-i", "eth0", "-w", cap, "-f", "udp port 4791"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # tshark says "Capturing on" once its capture runs (the file can exist before): only
    # then may the packets go, or the first are missed
    said = ""
    deadline = time.monotonic() + 30
    while "Capturing on" not in said and time.monotonic() < deadline:
        if select.select([dump.stderr], [], [], 0.5)[0]:
            line = dump.stderr.readline()
            if not line:
                break
            said += line
    assert "Capturing on" in said, f"tshark did not start capturing: {said}"
    time.sleep(0.2)
    rc, out = pair.emulate(frames, "--rate", 50)
    assert rc == 0, out
    rc, out, _ = pair.finish()
    assert rc == 0, out
    time.sleep(0.5)
    dump.terminate()
    dump.wait(timeout=10)
    fields = ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn", "infiniband.reth.va",
              "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.immdt", "ip.dst"]
    t = subprocess.run(["tshark", "-r", cap, "-T", "fields", "-E", "separator=;", *sum((["-e", f] for f in fields), [])],
                       capture_output=True, text=True, check=True)
    rows = [dict(zip(fields, line.split(";"))) for line in t.stdout.splitlines()]
    data = [r for r in rows if r["ip.dst"] == pair.rcv]
    acks = [r for r in rows if r["ip.dst"] != pair.rcv]
    qp = m["roce"][0]
    per_frame = MODULE_BYTES // 4096
    assert len(data) == frames * per_frame
    assert acks and all(int(r["infiniband.bth.opcode"]) == 0x11 for r in acks)
    assert all(int(r["infiniband.bth.destqp"], 0) == qp["peer_qpn"] for r in acks)
    for i, r in enumerate(data):
        f, k = 5 + i // per_frame, i % per_frame
        op = 0x06 if k == 0 else 0x09 if k == per_frame - 1 else 0x07
        assert int(r["infiniband.bth.opcode"]) == op, (i, r)
        assert int(r["infiniband.bth.destqp"], 0) == qp["qpn"]
        assert int(r["infiniband.bth.psn"]) == (qp["start_psn"] + i) & 0xFFFFFF
        if k == 0:
            buf = m["buffers"][f % len(m["buffers"])]
            assert int(r["infiniband.reth.va"], 0) == buf["va"]
            assert int(r["infiniband.reth.r_key"], 0) == buf["key"]
            assert int(r["infiniband.reth.dmalen"]) == MODULE_BYTES
        if k == per_frame - 1:
            assert int(r["infiniband.immdt"].split(",")[0], 16) == f  # listed twice, as hex bytes
    check_icrc_with_scapy(cap)


def check_icrc_with_scapy(cap):
    """Every packet's ICRC equals the one scapy's RoCE layer computes for it."""
    from scapy.all import Ether, raw, rdpcap
    from scapy.contrib.roce import BTH
    n = 0
    for p in rdpcap(str(cap)):
        e = Ether(raw(p))
        if BTH not in e:
            continue
        carried = e[BTH].icrc
        e[BTH].icrc = None
        assert Ether(raw(e))[BTH].icrc == carried
        n += 1
    assert n > 0


@pytest.mark.parametrize("mode", ["spatial", "temporal"])
def test_the_system_manager_sets_up_roce_queue_pairs(rdaq, tmp_path, mode):
    """`rdaq manage` with a detector and two receiver daemons in their own namespaces: the
    queue pair parameters go from the receivers' buffer maps into the modules' DTPs, and
    every frame arrives bit-exact on the receiver its DTP names."""
    from test_multihost import manage, start_system
    hosts = netns.Hosts(["det", "dr0", "dr1", "mgr"])
    try:
        topo, _ = start_system(hosts, rdaq, tmp_path, mode, receiver_args=("--engine", "af_xdp"), transfer="roce_mtu = 4096\n")
        out = tmp_path / "out"
        rc, log, report = manage(hosts, rdaq, topo, out, 30, 50)
        assert rc == 0, log
        assert report["frames_complete"] == 30 and report["frames_lost"] == []
        man = manifest(out / "manifest.csv")
        seen = set()
        for r, name in enumerate(("dr0", "dr1")):
            modules = [0, 1, 2, 3] if mode == "temporal" else [2 * r, 2 * r + 1]
            frames = frames_in(tmp_path / name / f"{name}_master.h5")
            for frame, hashes in frames.items():
                assert mode == "spatial" or frame % 2 == r, f"frame {frame} on {name}"
                assert hashes == [man[(frame, m)] for m in modules], f"{name} frame {frame}"
                seen.add(frame)
        assert seen == set(range(30))
    finally:
        hosts.close()


def test_roce_needs_the_af_xdp_engine_and_a_valid_mtu(rdaq):
    r = subprocess.run([BIN, "receive", "--format", "roce", "--frames", "1", "--stream", "none"], capture_output=True, text=True)
    assert r.returncode == 2 and "use the af_xdp engine" in r.stderr
    r = subprocess.run([BIN, "receive", "--format", "roce", "--engine", "af_xdp", "--roce-mtu", "1000", "--frames", "1",
                        "--stream", "none"], capture_output=True, text=True)
    assert r.returncode == 2 and "path MTU 1000" in r.stderr


def test_roce_soak_through_faults_is_bit_exact(rdaq):
    """`rdaq bench soak --roce-mtu`: small frames through the soak's faults on RoCEv2; the
    RC protocol alone recovers every frame."""
    r = subprocess.run([rdaq, "bench", "soak", "--roce-mtu", "4096", "--frames", "1000", "--baseline-frames", "0",
                        "--rate", "2000", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout)
    assert s["bit_exact"] == 1000 and s["mismatched"] == 0 and s["incomplete"] == 0
    assert s["receiver"]["nacks_sent"] > 0 and s["controller"]["resent"] > 0
    assert s["receiver"]["acks_sent"] > 0 and "replies_refused" in s["receiver"] and "roce_refused" in s["controller"]
    assert s["receiver"]["dropped"].get("out_of_sequence", 0) > 0
