"""Build the bundle that the GPU test tier carries to the H200 test machine (git-ignored ``.gpu``).

The H200 machine has Python 3.12, torch 2.11, triton 3.6, transformers 5.17 and no network, and a
call carries at most 64 MiB of the repository's working tree. The bundle holds what SGLang 0.5.23
needs there beyond the machine's image, about 50 MiB:

    .gpu/whl/        the wheels of wheels.txt (sglang 0.5.23 cp312 and what it imports there)
    .gpu/standin/    the import-only stand-in for sgl_kernel, with utils.py and scalar_type.py taken from
                     the real sglang-kernel wheel, and the tier's SGLang plugin (graph-safe MoE)
    .gpu/shims/      the CuTe-DSL module replacement
    .gpu/tree/       with --with-tree: a copy of the sources the tier runs (bench/, the hsextract
                     package with its capture-patch templates as real files, tests/support
                     with hf_reference.py), for running this tree's scripts from a checkout
                     that does not have them yet: python3 .gpu/tree/bench/gpu/run_all.py --bundle .gpu

    python3 bench/gpu/build_bundle.py [--out .gpu] [--with-tree]

Downloads happen once: pip skips wheels already in whl/, and the two kernel files are cached in
~/.cache/hsextract (the kernel wheel itself, 373 MB, is deleted after they are taken out). The
build fails if the bundle plus the repository's travelling files exceed the limit.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
KERNEL_WHEEL = "sglang-kernel==0.4.10"
KERNEL_FILES = ("sgl_kernel/utils.py", "sgl_kernel/scalar_type.py")
KERNEL_CACHE = Path.home() / ".cache" / "hsextract" / "sglang-kernel-0.4.10"
# pip matches manylinux tags exactly; sglang's wheel is manylinux_2_34, others go down to 2014/1.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 34)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
]
# The sources the tier runs, relative to the repository (copied by --with-tree).
TREE = ("bench", "files/python", "tests/support", "tests/stubs")
TREE_SKIP = ("__pycache__", "results", "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache")  # caches of lint runs
LIMIT_MIB = 64


class BundleError(RuntimeError):
    """The bundle cannot be built as asked; the message says what and how to fix it."""


def wheel_specs() -> list[str]:
    lines = (HERE / "wheels.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def dist_name(name: str) -> str:
    """A distribution's name as wheels and installed metadata compare it (PEP 503, with underscores)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def pip_download(specs: list[str], dest: Path) -> None:
    """Download the wheels of ``specs`` (no dependencies) for the GPU machine's CPython 3.12 on x86-64."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    done = subprocess.run([*cmd, *specs], capture_output=True, text=True)
    if done.returncode != 0:
        raise BundleError(f"pip download of {' '.join(specs)} failed:\n{done.stderr[-3000:]}")


def fetch_wheels(whl: Path) -> list[Path]:
    """The wheels of wheels.txt in ``whl`` (downloaded unless there), and no others."""
    whl.mkdir(parents=True, exist_ok=True)
    specs = wheel_specs()
    pip_download(specs, whl)
    wanted = {(dist_name(s.split("==")[0]), s.split("==")[1]) for s in specs}
    kept = []
    for wheel in sorted(whl.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        if (dist_name(name), version) in wanted:
            kept.append(wheel)
        else:
            wheel.unlink()  # left from an older wheels.txt: two versions of a package break the install
    if len(kept) != len(specs):
        raise BundleError(f"{len(kept)} wheels in {whl} for {len(specs)} lines of wheels.txt")
    return kept


def kernel_files() -> Path:
    """The cached directory holding the real kernel wheel's utils.py and scalar_type.py."""
    if all((KERNEL_CACHE / Path(f).name).is_file() for f in KERNEL_FILES):
        return KERNEL_CACHE
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                tmp,
                KERNEL_WHEEL,
            ],
            capture_output=True,
            text=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise BundleError(f"pip download {KERNEL_WHEEL} failed:\n{done.stderr[-3000:]}")
        KERNEL_CACHE.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            for f in KERNEL_FILES:
                (KERNEL_CACHE / Path(f).name).write_bytes(z.read(f))
    return KERNEL_CACHE


def copy_standin(out: Path, with_kernel_files: bool = True) -> None:
    shutil.rmtree(out / "standin", ignore_errors=True)
    shutil.copytree(HERE / "standin", out / "standin", ignore=shutil.ignore_patterns(*TREE_SKIP))
    for f in kernel_files().iterdir() if with_kernel_files else ():
        shutil.copy(f, out / "standin" / "sgl_kernel" / f.name)
    shutil.rmtree(out / "shims", ignore_errors=True)
    shutil.copytree(HERE / "shims", out / "shims", ignore=shutil.ignore_patterns(*TREE_SKIP))


def copy_tree(out: Path) -> Path:
    """Copy the tier's sources (links resolved to real files) to ``out/tree``; check the copy."""
    tree = out / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    for rel in TREE:
        src, dst = REPO / rel, tree / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=False, ignore=shutil.ignore_patterns(*TREE_SKIP))
        else:
            shutil.copy(src, dst)
    check_tree(tree)
    return tree


def check_tree(tree: Path) -> None:
    """Every file of the repository's hsextract package is in the copy, and the capture-patch
    templates are real files (a link would travel as a link and point nowhere)."""
    listed = subprocess.run(
        ["git", "ls-files", "files/python/hsextract"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = []
    for rel in listed:
        src = REPO / rel
        files = [p.relative_to(REPO) for p in src.rglob("*") if p.is_file()] if src.is_dir() else [Path(rel)]
        missing += [str(f) for f in files if not (tree / f).is_file() or (tree / f).is_symlink()]
    templates = tree / "files/python/hsextract/data/capture_patch"
    if templates.is_symlink() or not (templates / "model.py.j2").is_file():
        missing.append(str(templates / "model.py.j2"))
    if missing:
        raise BundleError(f"the bundle's copy of the package lacks {missing}")


def size_of(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def travelling_bytes(repo: Path) -> int:
    """Bytes of a repository's tracked and untracked-but-not-ignored files (what a device call sends)."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True, check=True
    ).stdout.split(b"\0")
    return size_of([repo / n.decode() for n in names if n])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".gpu", help="bundle directory (git-ignored in its repository)")
    ap.add_argument("--with-tree", action="store_true", help="also copy the tier's sources to OUT/tree")
    ap.add_argument(
        "--offline",
        action="store_true",
        help="download nothing (no wheels, no kernel files): checks the rest of the build",
    )
    ap.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    wheels = [] if args.offline else fetch_wheels(out / "whl")
    copy_standin(out, with_kernel_files=not args.offline)
    if args.with_tree:
        copy_tree(out)
    elif (out / "tree").exists():
        shutil.rmtree(out / "tree")
    bundle = size_of(list(out.rglob("*")))
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=out.parent, capture_output=True, text=True)
    tree = travelling_bytes(Path(top.stdout.strip())) if top.returncode == 0 else 0
    summary = {
        "bundle": str(out),
        "wheels": len(wheels),
        "bundle_mib": round(bundle / 2**20, 1),
        "repository_mib": round(tree / 2**20, 1),
        "total_mib": round((bundle + tree) / 2**20, 1),
        "limit_mib": args.limit_mib,
        "tree": args.with_tree,
    }
    print(json.dumps(summary))
    if (bundle + tree) / 2**20 > args.limit_mib:
        raise BundleError(
            f"bundle {summary['bundle_mib']} MiB + repository {summary['repository_mib']} MiB is over "
            f"the {args.limit_mib} MiB a device call carries"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BundleError as exc:
        print(f"build_bundle: {exc}", file=sys.stderr)
        sys.exit(1)
