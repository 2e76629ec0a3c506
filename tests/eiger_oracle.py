"""An independent numpy decoder of EIGER packets, written from the capture README
(tests/data/sls-eiger-virtual/README.md), not from rdaq's code: the test oracle of EIGER
ingest and assembly."""
import struct

import numpy as np

HDR = struct.Struct("<QIIQQHHHHIHBB")  # frameNumber ... detType, version
PORT_W, PORT_H = 512, 256


def header(p):
    f = HDR.unpack_from(p)
    return {"frame": f[0], "packet": f[2], "row": f[6], "column": f[7], "det_type": f[11]}


def unpack(data, dr):
    """A port image's bytes (packets concatenated in packet order) as pixel values."""
    b = np.frombuffer(data, np.uint8)
    if dr == 4:  # two pixels per byte, the high nibble first (the sls client's order)
        return np.stack([b >> 4, b & 0x0F], axis=1).reshape(-1)
    if dr == 8:
        return b.copy()
    if dr == 12:  # p0 = b0 | (b1 & 0xF) << 8, p1 = (b1 >> 4) | b2 << 4
        t = b.reshape(-1, 3).astype(np.uint16)
        p0 = t[:, 0] | (t[:, 1] & 0x0F) << 8
        p1 = (t[:, 1] >> 4) | t[:, 2] << 4
        return np.stack([p0, p1], axis=1).reshape(-1)
    return np.frombuffer(data, {16: "<u2", 32: "<u4"}[dr]).copy()


def port_images(payloads, dr):
    """{frame: {(row, column): 256 x 512 port image}} from the datagrams of any ports."""
    parts = {}
    for p in payloads:
        h = header(p)
        parts.setdefault(h["frame"], {}).setdefault((h["row"], h["column"]), {})[h["packet"]] = p[48:]
    out = {}
    for frame, ports in parts.items():
        out[frame] = {rc: unpack(b"".join(pk[k] for k in sorted(pk)), dr).reshape(PORT_H, PORT_W) for rc, pk in ports.items()}
    return out


def module_image(ports, flip_bottom=True, dtype=np.uint16, module_cols=1, rows=1, gap=(8, 36)):
    """The detector image: port (row, column) at x = column * 512, y = row * 256 of its module,
    bottom half-modules (odd port rows) flipped; modules `gap` pixels apart."""
    mw, mh = 1024, 512
    img = np.full((rows * mh + (rows - 1) * gap[1], module_cols * mw + (module_cols - 1) * gap[0]), np.iinfo(dtype).max, dtype)
    for (r, c), im in ports.items():
        m_r, m_c = r // 2, c // 2
        y0 = m_r * (mh + gap[1]) + (r % 2) * PORT_H
        x0 = m_c * (mw + gap[0]) + (c % 2) * PORT_W
        img[y0:y0 + PORT_H, x0:x0 + PORT_W] = im[::-1] if (flip_bottom and r % 2 == 1) else im
    return img


def with_gap_pixels(module):
    """A 512 x 1024 module image with 2-pixel gaps between its 256 x 256 chips (514 x 1030),
    each chip-edge pixel's count halved with its gap neighbour (integer halving), columns
    first, then rows (corner gap pixels get a quarter)."""
    dt = module.dtype
    v = module.astype(np.int64)
    out = np.zeros((514, 1030), np.int64)
    for cr in range(2):
        for cc in range(4):
            out[cr * 258:cr * 258 + 256, cc * 258:cc * 258 + 256] = v[cr * 256:(cr + 1) * 256, cc * 256:(cc + 1) * 256]
    for k in range(1, 4):
        left, right = k * 258 - 3, k * 258
        for edge, g in ((left, left + 1), (right, right - 1)):
            h = out[:, edge] // 2
            rows = np.r_[0:256, 258:514]
            out[rows, edge] = h[rows]
            out[rows, g] = h[rows]
    for edge, g in ((255, 256), (258, 257)):
        h = out[edge, :] // 2
        out[edge, :] = h
        out[g, :] = h
    return out.astype(dt)
