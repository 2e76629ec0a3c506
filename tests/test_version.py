"""`rdaq --version` names the version and the commit the binary was built from."""
import pathlib
import re
import subprocess
import tomllib

ROOT = pathlib.Path(__file__).parent.parent


def test_version_names_the_package_version_and_the_commit(rdaq):
    out = subprocess.run([rdaq, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    version = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    m = re.fullmatch(r"rdaq (\S+) \(([0-9a-f]{12}(?:-dirty)?|unknown commit)\)", out)
    assert m, out
    assert m[1] == version
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        # `make test` builds before it tests, so the binary is this checkout's
        assert m[2].removesuffix("-dirty") == head.stdout.strip(), out
