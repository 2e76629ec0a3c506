"""rdaq as a facility installs it, tested from the packages and not from the source tree.

The Debian package (scripts/deb.sh): its files, its control data, lintian, its systemd units
(`systemd-analyze verify`), and the package unpacked into a scratch root (`dpkg -x`): the
binary runs, the system of /etc/rdaq runs from the units' own command lines, and C and CMake
projects build against the unpacked librdaq and receive frames with it. The wheel
(scripts/wheel.sh): its tag, installed into a fresh venv outside the tree, and used there."""
import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile

import h5py
import hdf5plugin  # noqa: F401
import pytest
from rdaq.control import Service

from conftest import ROOT, built
from test_c_api import MODULE_BYTES, receive_with_emulator
from test_readme_daemons import wait_up

VERSION = re.search(r'^version = "(.*)"$', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
ABI = VERSION.rsplit(".", 1)[0]
UNITS = ["rdaq-receiver@.service", "rdaq-manager.service", "rdaq-emulator.service"]
ETC = ["emulator.env", "manager.env", "receiver-dr0.env", "receiver-dr0.toml", "topology.toml"]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}: {r.stdout}{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def deb():
    return built("deb", timeout=1500)


@pytest.fixture(scope="module")
def root(deb, tmp_path_factory):
    """The package unpacked, as dpkg would install it, into a scratch root."""
    root = tmp_path_factory.mktemp("root")
    run(["dpkg", "-x", str(deb), str(root)])
    return root


@pytest.fixture(scope="module")
def wheel():
    return built("wheel", timeout=1500)


def test_the_package_holds_what_a_facility_needs(deb, root):
    listing = run(["dpkg-deb", "-c", str(deb)])
    files = {line.split()[5].removeprefix("./").rstrip("/") for line in listing.splitlines()}
    for want in ["usr/bin/rdaq", "usr/share/man/man1/rdaq.1.gz", "usr/share/man/man1/rdaq-receive.1.gz", "usr/share/man/man1/rdaq-manage.1.gz", f"usr/lib/librdaq.so.{VERSION}", f"usr/lib/librdaq.so.{ABI}", "usr/lib/librdaq.so", "usr/lib/librdaq.a",
                 "usr/include/rdaq.h", "usr/lib/pkgconfig/rdaq.pc", "usr/lib/cmake/rdaq/rdaqConfig.cmake",
                 "usr/lib/cmake/rdaq/rdaqConfigVersion.cmake", "usr/lib/sysusers.d/rdaq.conf",
                 "usr/share/doc/rdaq/copyright", "usr/share/doc/rdaq/changelog.gz", "usr/share/doc/rdaq/changelog.Debian.gz",
                 "usr/share/doc/rdaq/README.md", "usr/share/doc/rdaq/install.md", "usr/share/doc/rdaq/examples/rdaq.example.toml",
                 *(f"usr/lib/systemd/system/{u}" for u in UNITS), *(f"etc/rdaq/{e}" for e in ETC)]:
        assert want in files, f"{want} is not in the package"
    assert {f.split("/")[0] for f in files if f} == {"etc", "usr"}
    # the links a linker and the loader follow, and the library's own name for itself
    assert os.readlink(root / "usr/lib/librdaq.so") == f"librdaq.so.{ABI}"
    assert os.readlink(root / f"usr/lib/librdaq.so.{ABI}") == f"librdaq.so.{VERSION}"
    assert f"(SONAME)             Library soname: [librdaq.so.{ABI}]" in run(["readelf", "-d", str(root / f"usr/lib/librdaq.so.{VERSION}")])
    for binary in ["usr/bin/rdaq", f"usr/lib/librdaq.so.{VERSION}"]:
        assert ".debug_info" not in run(["readelf", "-S", "-W", str(root / binary)]), f"{binary} is not stripped"
    assert os.access(root / "usr/bin/rdaq", os.X_OK)


def test_the_control_data_names_version_dependencies_conffiles_and_the_library(deb, tmp_path):
    fields = dict(re.findall(r"^(\w[\w-]*): (.*)$", run(["dpkg-deb", "-f", str(deb)]), re.M))
    assert fields["Package"] == "rdaq" and fields["Version"] == f"{VERSION}-1" and fields["Architecture"] == "amd64"
    # the packaging's changelog names the version it packs (dpkg-deb takes Version from Cargo.toml)
    assert (ROOT / "packaging/debian/changelog").read_text().startswith(f"rdaq ({VERSION}-1) unstable;")
    # computed by dpkg-shlibdeps from what the binary and librdaq link
    assert "libhdf5-103-1" in fields["Depends"] and "libc6" in fields["Depends"]
    run(["dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN")])
    conffiles = (tmp_path / "DEBIAN" / "conffiles").read_text().split()
    assert sorted(conffiles) == sorted(f"/etc/rdaq/{e}" for e in ETC)
    assert (tmp_path / "DEBIAN" / "shlibs").read_text().strip() == f"librdaq {ABI} rdaq (>= {VERSION})"
    assert (tmp_path / "DEBIAN" / "triggers").read_text().splitlines()[-1] == "activate-noawait ldconfig"
    postinst = (tmp_path / "DEBIAN" / "postinst").read_text()
    # the system user is made; units are registered, none enabled or started by the package
    assert "systemd-sysusers" in postinst and "rdaq.conf" in postinst
    for unit in ["rdaq-manager.service", "rdaq-emulator.service"]:
        # dh_installsystemd's --no-enable snippet: enabled again only where the admin had it
        assert f"if deb-systemd-helper debian-installed {unit}; then" in postinst
    assert "deb-systemd-invoke start" not in postinst


def kept_lintian_warnings():
    """The warnings docs/install.md explains, by tag."""
    section = (ROOT / "docs" / "install.md").read_text().split("### Lintian's warnings", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M))


def test_lintian_finds_no_errors_and_only_the_warnings_the_docs_explain(deb):
    r = subprocess.run(["lintian", "--no-tag-display-limit", str(deb)], capture_output=True, text=True, timeout=600)
    tags = re.findall(r"^([EWIXO]): rdaq: ([a-z0-9-]+)", r.stdout, re.M)
    assert not [t for level, t in tags if level == "E"], r.stdout
    warnings = {t for level, t in tags if level == "W"}
    kept = kept_lintian_warnings()
    assert kept and warnings <= kept, f"lintian warnings docs/install.md does not explain: {warnings - kept}\n{r.stdout}"
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def systemd_root(root, tmp_path_factory):
    """The unpacked package beside this host's own units, which the package's refer to
    (network-online.target, multi-user.target) and systemd-analyze loads."""
    units = root / "usr/lib/systemd/system"
    run(["cp", "-an", "/usr/lib/systemd/system/.", str(units)])
    return root


def test_the_units_pass_systemd_analyze_verify_and_are_hardened(systemd_root):
    units = [systemd_root / "usr/lib/systemd/system" / u.replace("@.", "@dr0.") for u in UNITS]
    r = subprocess.run(["systemd-analyze", "verify", f"--root={systemd_root}", *map(str, units)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    for unit in units:
        out = run(["systemd-analyze", "security", "--offline=yes", f"--root={systemd_root}", str(unit)], timeout=120)
        exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
        # systemd's scale: 0 (locked down) to 10 (unprotected); below 3.0 it calls "OK"
        assert exposure < 3.0, out
    receiver = configparser.ConfigParser(interpolation=None, strict=False)
    receiver.read(systemd_root / "usr/lib/systemd/system" / UNITS[0])
    caps = set(receiver["Service"]["AmbientCapabilities"].split())
    assert caps == {"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_BPF", "CAP_IPC_LOCK"} == set(receiver["Service"]["CapabilityBoundingSet"].split())
    assert receiver["Service"]["User"] == "rdaq" and receiver["Service"]["NoNewPrivileges"] == "yes"


def test_the_unpacked_binary_names_its_version_and_runs_an_acquisition(root, tmp_path):
    rdaq = root / "usr/bin/rdaq"
    out = run([str(rdaq), "--version"])
    assert re.fullmatch(rf"rdaq {re.escape(VERSION)} \([0-9a-f]{{12}}(-dirty)?\)\n", out), out
    (tmp_path / "run.toml").write_text('[output]\nname = "pkg"\n')
    run([str(rdaq), "run", "--config", "run.toml", "--frames", "20", "--rate", "100", "--out", str(tmp_path), "--stream", "none", "--preview", "none",
         "--summary-json", "summary.json"], cwd=tmp_path, timeout=300)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["frames_complete"] == 20 and summary["frames_written"] > 0
    with h5py.File(tmp_path / "pkg_master.h5", "r") as f:
        # the hits, as the veto keeps them
        assert f["entry/data/data"].shape[0] == summary["frames_written"]


def exec_start(root, unit, instance, data):
    """A unit's ExecStart as systemd runs it: its environment file read, %i, ${VAR} and $VAR
    replaced; then moved into the scratch root (/usr/bin, /etc/rdaq) and data directory."""
    text = (root / "usr/lib/systemd/system" / unit).read_text().replace("%i", instance)
    env_file = re.search(r"^EnvironmentFile=(.*)$", text, re.M).group(1)
    env = dict(line.split("=", 1) for line in (root / env_file.lstrip("/")).read_text().splitlines() if line and not line.startswith("#"))
    words = []
    for word in shlex.split(re.search(r"^ExecStart=(.*)$", text, re.M).group(1)):
        if word.startswith("${"):
            words.append(env[word[2:-1]])
        elif word.startswith("$"):
            words += env[word[1:]].split()
        else:
            words.append(word.replace("/usr/bin/", f"{root}/usr/bin/").replace("/etc/rdaq", f"{root}/etc/rdaq").replace("/var/lib/rdaq", str(data)))
    return words


def test_the_shipped_system_runs_a_dataset_from_the_units_command_lines(root, tmp_path):
    """/etc/rdaq as shipped: the emulator, receiver dr0 and the manager's acquisition service,
    each started with its unit's command line, take a dataset armed and triggered over the
    API, and write it under the data root."""
    data = tmp_path / "data"
    data.mkdir()
    procs = []
    try:
        for unit, instance in [("rdaq-emulator.service", ""), ("rdaq-receiver@.service", "dr0"), ("rdaq-manager.service", "")]:
            argv = exec_start(root, unit, instance, data)
            procs.append(subprocess.Popen(argv, cwd=data, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            url = argv[argv.index("--serve") + 1]
            wait_up(f"http://{url}/{'acquisition' if 'manage' in argv else 'status'}", procs[-1], timeout=60)
        service = Service(f"http://{url}")
        service.arm(frames_per_trigger=10, prefix="pkg", directory="first", process=False)
        service.trigger()
        done = service.wait("idle", timeout=120)
        assert done["dataset"]["master"] == str(data / "first" / "pkg_master.h5"), done
        with h5py.File(data / "first" / "pkg_master.h5", "r") as f:
            assert f["entry/data/data"].shape[0] == 10
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def pkg_config(root, *args):
    env = {**os.environ, "PKG_CONFIG_SYSROOT_DIR": str(root), "PKG_CONFIG_LIBDIR": str(root / "usr/lib/pkgconfig")}
    return run(["pkg-config", *args, "rdaq"], env=env).split()


def check_receives(program, root, tmp_path):
    """The program, against the unpacked library, receives the emulator's frames bit-exact."""
    frames, modules = 8, 2
    args = [str(program), str(frames), str(modules), str(tmp_path / "map.json"), str(tmp_path / "frames.bin")]
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/lib")}
    out, manifest = receive_with_emulator(root / "usr/bin/rdaq", args, tmp_path / "map.json", frames, modules, tmp_path, env=env)
    assert f"OK {frames} frames, 0 failures" in out
    assert len(manifest) == frames * modules
    assert (tmp_path / "frames.bin").stat().st_size == frames * (8 + modules * MODULE_BYTES)


def test_a_c_program_builds_with_pkg_config_and_receives_with_the_packaged_library(root, tmp_path):
    assert pkg_config(root, "--modversion") == [VERSION]
    cflags, libs = pkg_config(root, "--cflags"), pkg_config(root, "--libs")
    assert cflags == [f"-I{root}/usr/include"] and libs == [f"-L{root}/usr/lib", "-lrdaq"]
    program = tmp_path / "receive"
    run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", *cflags, str(ROOT / "tests/c/receive.c"), "-o", str(program), *libs])
    # the program asks the loader for the versioned name, which the package's link provides
    assert f"Shared library: [librdaq.so.{ABI}]" in run(["readelf", "-d", str(program)])
    check_receives(program, root, tmp_path)


def test_a_cmake_project_finds_the_packaged_library_and_links_it_shared_and_static(root, tmp_path):
    build = tmp_path / "build"
    run(["cmake", "-S", str(ROOT / "tests/c/cmake"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={root}/usr", f"-DRDAQ_VERSION={ABI}",
         "-DCMAKE_BUILD_TYPE=Release"], timeout=120)
    run(["cmake", "--build", str(build), "-j", "2"], timeout=600)
    for program in ["receive_shared", "receive_static"]:
        (tmp_path / program).mkdir()
        check_receives(build / program, root, tmp_path / program)
    assert "librdaq" not in run(["readelf", "-d", str(build / "receive_static")])
    # find_package(rdaq X.Y) takes this major.minor only
    other = f"{int(ABI.split('.')[0])}.{int(ABI.split('.')[1]) + 1}"
    r = subprocess.run(["cmake", "-S", str(ROOT / "tests/c/cmake"), "-B", str(tmp_path / "other"), f"-DCMAKE_PREFIX_PATH={root}/usr",
                        f"-DRDAQ_VERSION={other}"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and f'compatible\n  with requested version "{other}"' in r.stderr and f"rdaqConfig.cmake, version: {VERSION}" in r.stderr, r.stderr


def test_the_wheel_is_abi3_manylinux_and_works_in_a_fresh_venv_outside_the_tree(wheel, tmp_path):
    assert wheel.name == f"rdaq-{VERSION}-cp311-abi3-manylinux_2_28_x86_64.whl"
    shown = run([sys.executable, "-m", "auditwheel", "show", str(wheel)])
    assert 'is consistent with the\nfollowing platform tag: "manylinux_2_28_x86_64"' in shown, shown
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"rdaq-{VERSION}.dist-info/METADATA").decode()
        libs = [n for n in z.namelist() if ".so" in n]
    assert "Requires-Python: >=3.11" in meta
    for extra in ["stream", "bluesky", "fastcs"]:
        assert f"Provides-Extra: {extra}" in meta
    # HDF5 and ZeroMQ are linked in: the extension is the only shared object
    assert libs == ["rdaq/_rdaq.abi3.so"], libs
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin/pip"), "install", "-q", str(wheel)], timeout=600)
    (tmp_path / "run.toml").write_text('[stream]\nendpoint = "none"\npreview = "none"\n[output]\nname = "w"\n')
    code = f"""
import numpy as np, rdaq
assert rdaq.__file__.startswith({str(venv)!r}), rdaq.__file__
n = 0
with rdaq.Acquisition(config="run.toml", frames=6, rate_hz=50, out=".") as acq:
    for frame in acq:
        assert np.asarray(frame).shape == acq.shape
        frame.release()
        n += 1
print(n, acq.summary["frames_written"])
"""
    out = run([str(venv / "bin/python"), "-c", code], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, timeout=300)
    frames, written = map(int, out.split())
    assert frames == written > 0
    with h5py.File(tmp_path / "w_master.h5", "r") as f:
        assert f["entry/data/data"].shape[0] == written
