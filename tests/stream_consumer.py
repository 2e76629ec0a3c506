"""A Stream V2 consumer as a beamline scientist would write one: pyzmq + cbor2, images
decompressed with the bitshuffle package. Used by the tests, and an example (docs/stream.md)."""
import struct

import bitshuffle
import cbor2
import numpy as np
import zmq

DTYPES = {64: np.uint8, 69: np.uint16, 70: np.uint32, 77: np.int16, 78: np.int32, 85: np.float32}


def decode_array(tag40):
    """A tag 40 multi-dimensional array (plain or bslz4-compressed typed array) as numpy."""
    (h, w), typed = tag40.value
    dtype = np.dtype(DTYPES[typed.tag]).newbyteorder("<")
    inner = typed.value
    if isinstance(inner, cbor2.CBORTag) and inner.tag == 56500:
        algo, elem, blob = inner.value
        assert algo == "bslz4" and elem == dtype.itemsize
        size, block = struct.unpack(">QI", blob[:12])
        assert size == h * w * elem
        out = bitshuffle.decompress_lz4(np.frombuffer(blob[12:], np.uint8), (h, w), dtype, block // elem)
        return out
    return np.frombuffer(inner, dtype).reshape(h, w)


def tag_hook(*args):
    # keep every tag as a CBORTag: cbor2 5.x calls hook(decoder, tag), 6.x hook(tag, immutable)
    return next(a for a in args if isinstance(a, cbor2.CBORTag))


def decode(msg):
    return cbor2.loads(msg, tag_hook=tag_hook)


def receive(endpoint, until_end=True, timeout_ms=30000, socket=zmq.PULL):
    """Messages of one series (dicts; the self-described tag removed) until `end`."""
    ctx = zmq.Context.instance()
    s = ctx.socket(socket)
    if socket == zmq.SUB:
        s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    out = []
    try:
        while True:
            m = decode(s.recv())
            m = m.value if isinstance(m, cbor2.CBORTag) and m.tag == 55799 else m
            out.append(m)
            if until_end and m["type"] == "end":
                return out
    except zmq.Again:
        return out
    finally:
        s.close(linger=0)
