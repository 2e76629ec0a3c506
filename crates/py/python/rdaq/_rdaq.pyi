"""Type stubs of the extension module (crates/py/src)."""
import os
from types import TracebackType
from typing import Iterator, Optional

import numpy as np
import numpy.typing as npt

class FrameReleased(RuntimeError):
    """The frame was released: its slot belongs to the receiver again."""

class Frame:
    """One frame: all modules' raw 16-bit words, (modules * 512, 1024), in the receiver's slot."""
    @property
    def number(self) -> int: ...
    @property
    def status(self) -> str:
        """"complete", "incomplete" (kept, missing pixels marked) or "discarded"."""
    @property
    def complete(self) -> bool: ...
    @property
    def released(self) -> bool: ...
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def missing_mask(self) -> npt.NDArray[np.bool_]:
        """True where the datagram carrying the pixel never arrived."""
    @property
    def array(self) -> npt.NDArray[np.uint16]:
        """The image, read-only, over the slot (no copy)."""
    def release(self) -> None:
        """Gives the slot back; BufferError while arrays over it exist."""
    def __enter__(self) -> "Frame": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Receiver:
    """A receiver of rdaq datagrams with its ring of frame slots; iterate for frames."""
    def __init__(self, modules: int = 1, bind: str = "127.0.0.1", port: int = 0, slots: int = 16,
                 frames: Optional[int] = None, frame_timeout_ms: int = 500, policy: str = "keep",
                 engine: str = "recvmmsg") -> None: ...
    @property
    def buffer_map(self) -> str:
        """The buffer map (JSON) the senders need."""
    @property
    def ports(self) -> list[int]: ...
    @property
    def ring(self) -> tuple[int, int]:
        """(start, end) addresses of the ring's slots in this process."""
    def counters(self) -> dict: ...
    def next_frame(self, timeout: Optional[float] = None) -> Optional[Frame]: ...
    def __iter__(self) -> Iterator[Frame]: ...
    def __next__(self) -> Frame: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Receiver": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...

class Acquisition:
    """An acquisition configured as `rdaq run` / `rdaq receive` (a TOML `config`, keywords over
    it): of the emulated detector, or with `source` (what a detector outside the process sends:
    {"format": "sls", "interfaces": 2, "read_rows": 256}, {"detector": "eiger", ...}) of the
    packets coming to `ports`. Iterate for the processed frames as they are written."""
    def __init__(self, config: Optional[str] = None, frames: Optional[int] = None, modules: Optional[int] = None,
                 rate_hz: Optional[float] = None, out: Optional[str] = None, overwrite: bool = False,
                 source: Optional[dict] = None) -> None: ...
    @property
    def ports(self) -> list[int]:
        """The data ports a `source` sends to (empty for the emulated detector)."""
    @property
    def summary(self) -> Optional[dict]:
        """The summary (as --summary-json writes it), once iteration ended."""
    @property
    def shape(self) -> tuple[int, int]: ...
    def stop(self) -> None: ...
    def __iter__(self) -> Iterator["ProcessedFrame"]: ...
    def __next__(self) -> "ProcessedFrame": ...
    def __enter__(self) -> "Acquisition": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...

class ProcessedFrame:
    """One processed, written frame: its pixels as the files hold them, in the graph's buffer."""
    @property
    def number(self) -> int: ...
    @property
    def hit(self) -> bool: ...
    @property
    def spots(self) -> list[tuple[float, float, float, int]]:
        """(x, y, intensity in photons, pixels) of each spot found, x along the columns."""
    @property
    def array(self) -> npt.NDArray:
        """The pixels, read-only, over the graph's buffer (no copy)."""
    def __array__(self, dtype: Optional[object] = None, copy: Optional[bool] = None) -> npt.NDArray: ...
    def release(self) -> None:
        """Gives the buffer back to the graph; BufferError while arrays over it exist."""
    def __enter__(self) -> "ProcessedFrame": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Emulator:
    """Emulated JUNGFRAU modules sending to a receiver's buffers."""
    def __init__(self, buffer_map: str, frames: int = 10, rate: float = 100.0, seed: int = 1,
                 target: str = "127.0.0.1", pool: int = 0, loss: float = 0.0, retransmit: bool = True) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self) -> list[tuple[int, int, int]]:
        """The manifest: (frame, module, xxh3-64 of the raw module frame)."""
    def run(self) -> list[tuple[int, int, int]]: ...

class Converter:
    """JUNGFRAU raw words to keV with one calibration (aare-exact)."""
    def __init__(self, pedestal: npt.NDArray[np.float32], gain: npt.NDArray[np.float32],
                 mask: Optional[npt.NDArray[np.uint32]] = None, invalid_gain: str = "error") -> None: ...
    def to_kev(self, raw: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]: ...

class Pedestal:
    """Pedestal tracking of dark frames over a running window (aare's method)."""
    def __init__(self, rows: int, cols: int, window: int = 128, stage: int = 0) -> None: ...
    def push(self, raw: npt.NDArray[np.uint16]) -> None: ...
    @property
    def frames(self) -> int: ...
    def mean(self) -> npt.NDArray[np.float32]: ...
    def rms(self) -> npt.NDArray[np.float32]: ...

def find_spots(image: npt.NDArray[np.float32], threshold: float, snr: float = 3.0, box_half: int = 15,
               min_pixels: int = 4, max_pixels: int = 200) -> npt.NDArray[np.float32]:
    """Spots as rows of (x, y, intensity, pixels)."""

def run_finder(path: str | os.PathLike[str]) -> dict[str, float | int] | None:
    """The local finder's settings of the processed run that wrote the rdaq master `path`, as
    find_spots' keyword arguments (the threshold in the unit of the file's image); None for a
    file rdaq did not process."""

def compress(array: npt.NDArray, codec: str = "lz4", zstd_level: int = 3) -> bytes:
    """One bitshuffle chunk (HDF5 filter 32008's format) of the array's bytes."""

def decompress(chunk: bytes, elem_size: int, codec: str = "lz4") -> bytes:
    """The bytes of a bitshuffle chunk of `elem_size`-byte elements."""

def radius_map(width: int, height: int, cx: float, cy: float) -> npt.NDArray[np.float32]:
    """peakfinder8's radius map, computed in float64 and rounded to float32 once."""
