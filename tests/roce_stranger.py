"""Sends hostile RoCEv2 packets (scapy computes their ICRC) to a RoCEv2 receiver: an unknown
queue pair, a wrong R_Key, a VA range past a buffer, a SEND, a bad ICRC, and a runt.
Usage: roce_stranger.py MAP_JSON RECEIVER_IP IFACE"""
import json
import struct
import sys

from scapy.all import IP, UDP, Ether, Raw, getmacbyip, sendp
from scapy.contrib.roce import BTH

m = json.load(open(sys.argv[1]))
dst, iface = sys.argv[2], sys.argv[3]
qp, buf = m["roce"][0], m["buffers"][0]
mac = getmacbyip(dst)


def packet(opcode, dqpn, payload, icrc=None):
    bth = BTH(opcode=opcode, dqpn=dqpn, psn=qp["start_psn"], ackreq=1, icrc=icrc)
    return Ether(dst=mac) / IP(dst=dst, flags="DF") / UDP(sport=49999, dport=4791, chksum=0) / bth / Raw(payload)


def reth(va, rkey, length):
    return struct.pack(">QII", va, rkey, length)


body = bytes(64)
pkts = [
    packet(0x0A, 0x999, reth(buf["va"], buf["key"], 64) + body),                         # unknown QP
    packet(0x0A, qp["qpn"], reth(buf["va"], buf["key"] ^ 1, 64) + body),                 # wrong R_Key
    packet(0x0A, qp["qpn"], reth(buf["va"] + buf["size"] - 8, buf["key"], 64) + body),  # past the buffer
    packet(0x04, qp["qpn"], body),                                                        # a SEND
    packet(0x0A, qp["qpn"], reth(buf["va"], buf["key"], 64) + body, icrc=0x12345678),    # bad ICRC
    Ether(dst=mac) / IP(dst=dst) / UDP(sport=49999, dport=4791) / Raw(b"runt!"),          # not RoCE
]
sendp(pkts, iface=iface, verbose=False)
