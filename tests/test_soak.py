"""The CI variant of `rdaq bench soak`: 20,000 small frames through the emulator's injected
loss (in bursts), reordering, duplication and corruption, at the rates of the full soak.
Every frame must arrive bit-exact against the manifest, and every injected fault must be
accounted for by the receiver."""
import json
import subprocess


def test_soak_short_variant_is_bit_exact(rdaq):
    out = subprocess.run(
        [str(rdaq), "bench", "soak", "--frames", "20000", "--baseline-frames", "0", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout)
    assert r["bit_exact"] == r["frames"] == r["sent"] == 20000
    assert r["mismatched"] == r["incomplete"] == r["missing"] == 0
    inj, rx, tx = r["injected"], r["receiver"], r["controller"]
    # the faults happened, and were repaired by retransmission from the sender's history
    assert inj["dropped"] > 50 and inj["reordered"] > 500
    # (a resend may be lost too and sent again, so the counts need not match one to one)
    assert rx["placed_retransmitted"] > 0.9 * inj["dropped"] and tx["history_misses"] == 0
    assert rx["frames_recovered"] > 0 and rx["frames_given_up"] == 0
    assert rx["nacks_sent"] == tx["nacks"] and tx["resent"] > 0
    # every corrupted datagram was caught by its checksum, none placed
    assert rx["dropped"].get("bad_checksum", 0) == inj["corrupted"]
    assert rx["placed"] == 20000 * 8
    assert rx["kernel_drops"] == 0
