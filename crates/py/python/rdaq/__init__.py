"""rdaq from Python: receive detector frames as numpy arrays without a copy, and drive the
emulated JUNGFRAU detector (docs/api.md).

    import numpy as np, rdaq
    with rdaq.Receiver(modules=1, frames=10) as rx:
        rdaq.Emulator(rx.buffer_map, frames=10).start()
        for frame in rx:
            with frame:
                print(frame.number, frame.status, np.asarray(frame).mean())

A frame holds its slot of the receiver's ring until it is released (``frame.release()``,
the end of a ``with frame:`` block, or Python freeing it). Arrays over a frame read the slot
in place; releasing is refused while one exists, and a released frame's pixels raise
``FrameReleased``.
"""
from . import control, stream
from ._rdaq import (Acquisition, Converter, Emulator, Frame, FrameReleased, Pedestal, ProcessedFrame, Receiver, compress, decompress,
                    find_spots, radius_map, run_converter, run_finder)

__all__ = ["Receiver", "Frame", "FrameReleased", "Acquisition", "ProcessedFrame", "Emulator", "Converter", "convert", "Pedestal", "find_spots",
           "compress", "decompress", "radius_map", "run_converter", "run_finder", "control", "stream"]


def convert(raw, pedestal, gain, mask=None, invalid_gain="error"):
    """keV (float32) from raw JUNGFRAU words (uint16, (rows, cols)) with a calibration of
    float32 (3, rows, cols) pedestals and gains; for many frames, make a Converter once."""
    return Converter(pedestal, gain, mask, invalid_gain).to_kev(raw)
