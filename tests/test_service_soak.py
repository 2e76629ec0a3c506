"""The service runs for weeks: its memory stays flat however many datasets it takes (the
soak of scripts/soak_service.py, short)."""
import json
import pathlib
import sys
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
import soak_service  # noqa: E402

# what the manager keeps of its events (crates/control/src/manager/board.rs)
EVENTS_KEPT_SERVICE = 4096
# Each dataset of 20 frames of 2 modules leaves 100 events in the manager's log; kept
# without bound (before) they grew its memory by about 11 KiB per dataset.
GROWTH_MIB = 0.5


def test_the_services_memory_stays_flat_over_many_datasets(rdaq, tmp_path):
    system = soak_service.System(str(rdaq), tmp_path)
    try:
        # a busy machine may lose frames: the memory is what is measured here
        rows = soak_service.soak(system, datasets=100, frames=20, every=50, period_s=0.005, lossless=False)
        page = json.loads(urllib.request.urlopen(system.url + "/events?since=0&limit=100000", timeout=10).read())
    finally:
        system.close()
    assert len(page["events"]) <= EVENTS_KEPT_SERVICE < page["next"] and page["dropped"] > 0, "a window on the latest events"
    # from the row after the event window filled (about 40 datasets) to the last
    (_, _, first), (_, _, last) = rows[0], rows[-1]
    for name in ("manager", "receiver", "detector"):
        assert last[name][1] <= first[name][1] + 2, f"{name}: open files {first[name][1]} -> {last[name][1]}"
        assert last[name][2] <= first[name][2], f"{name}: threads {first[name][2]} -> {last[name][2]}"
    grew = last["manager"][0] - first["manager"][0]
    assert grew < GROWTH_MIB, f"the manager grew {grew:.2f} MiB over {rows[-1][0] - rows[0][0]} datasets: {rows}"
