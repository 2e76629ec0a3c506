"""A Stream V2 consumer (docs/stream.md): the messages of a series from a receiver's stream,
with each image decoded into a numpy array by rdaq's own bitshuffle decoder.

    for m in rdaq.stream.messages("tcp://RECEIVER-HOST:31001"):
        if m["type"] == "image":
            print(m["image_id"], m["image"].shape, m["user_data"]["rdaq"].get("spots"))

Needs pyzmq and cbor2 (``pip install rdaq[stream]``).
"""
import struct

import numpy as np

from ._rdaq import decompress

# RFC 8746 typed-array tags of the image dtypes rdaq sends (little-endian)
DTYPES = {69: "<u2", 77: "<i2", 78: "<i4", 85: "<f4", 70: "<u4"}
SELF_DESCRIBED = 55799
BSLZ4 = 56500


def _tag(*args):
    # keep tags as CBORTag: cbor2 5.x calls hook(decoder, tag), 6.x hook(tag, immutable)
    import cbor2
    return next(a for a in args if isinstance(a, cbor2.CBORTag))


def decode_image(tag40):
    """A tag-40 multi-dimensional array (plain, or a bslz4 chunk) as a numpy array."""
    import cbor2
    (h, w), typed = tag40.value
    if typed.tag not in DTYPES:
        raise ValueError(f"image: typed-array tag {typed.tag} is not one rdaq sends")
    dtype = np.dtype(DTYPES[typed.tag])
    inner = typed.value
    if isinstance(inner, cbor2.CBORTag) and inner.tag == BSLZ4:
        algo, elem, chunk = inner.value
        if algo != "bslz4" or elem != dtype.itemsize:
            raise ValueError(f"image: compression {algo!r} of {elem}-byte elements, expected bslz4 of {dtype.itemsize}")
        size = struct.unpack(">Q", chunk[:8])[0]
        if size != h * w * elem:
            raise ValueError(f"image: the chunk holds {size} bytes, {h}x{w} of {elem} bytes is {h * w * elem}")
        return np.frombuffer(decompress(chunk, elem), dtype).reshape(h, w)
    return np.frombuffer(inner, dtype).reshape(h, w)


def messages(endpoint, timeout_ms=30000, subscribe=False):
    """The messages of one series (dicts) until its `end`; images carry `image`, a numpy
    array. Connects a PULL socket (SUB with ``subscribe=True``); raises TimeoutError when
    nothing came for `timeout_ms`."""
    import cbor2
    import zmq
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.SUB if subscribe else zmq.PULL)
    if subscribe:
        s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    s.connect(endpoint)
    try:
        while True:
            try:
                raw = s.recv()
            except zmq.Again:
                raise TimeoutError(f"{endpoint}: no message for {timeout_ms} ms") from None
            m = cbor2.loads(raw, tag_hook=_tag)
            m = dict(m.value if isinstance(m, cbor2.CBORTag) and m.tag == SELF_DESCRIBED else m)
            if m.get("type") == "image":
                m["image"] = decode_image(m["data"]["data"])
            yield m
            if m.get("type") == "end":
                return
    finally:
        s.close(linger=0)
