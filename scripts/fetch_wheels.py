"""Fetch, as wheels in .whl/, what a GPU machine without internet lacks for scripts/gpu_checks.sh.

Run it on a machine with internet, in the checkout, with .venv's python; then copy the checkout, .whl/ included,
to the GPU machine (docs/benchmarks.md, *GPU checks*). gpu_checks.sh installs the wheels there with pip's
--no-index, for that machine's python3 alone.

The GPU machine's python3 is taken to be CPython 3.12 on manylinux x86-64 that already has torch with CUDA, triton,
transformers, tokenizers, safetensors, numpy, scipy, scikit-learn, pyarrow, pandas, fsspec, huggingface_hub,
xxhash, pyyaml, packaging, psutil, py-cpuinfo, msgpack, ninja, einops, tqdm and filelock (the GPU machine we test
on has these); the packages below are the rest. The pre-flight of gpu_checks.sh names, in one line, anything that
is still missing there. Versions are pinned to what this .venv holds, so the GPU machine runs what the tests ran.
datasets comes along for eval and local structured files, with dill and multiprocess; pyarrow (about 45 MiB) stays
behind: the GPU checks use data=sanity, which needs no datasets at all.
deepspeed and antlr4-python3-runtime are sdists on PyPI, so their wheels are built here (pure Python: DeepSpeed
compiles its ops at run time). It prints each wheel and the size of what to copy: .whl/ and the checkout's files.

    python scripts/fetch_wheels.py        # in the activated .venv: a minute or two; replaces .whl/
"""

import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
BINARY = ["hydra-core", "omegaconf", "datasets", "dill", "multiprocess", "hjson", "pydantic", "pydantic-core",
          "annotated-types", "typing-inspection", "typing-extensions",  # pydantic needs typing-extensions>=4.16
          "torchao"]  # impl.precision=fp8's float8 training (the fp8 extra): an abi3 wheel that requires no torch
SDIST = ["antlr4-python3-runtime", "deepspeed"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def pinned(name: str) -> str:
    return f"{name}=={importlib.metadata.version(name)}"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def tree_bytes() -> int:
    """The checkout's own files (tracked, and untracked but not ignored): what to copy besides .whl/ and .glue/."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sum((REPO / p).stat().st_size for p in listed if p and (REPO / p).is_file())


def main() -> int:
    shutil.rmtree(WHEELS, ignore_errors=True)  # one version of each: two would stop the install there
    WHEELS.mkdir()
    targets = [a for p in PLATFORMS for a in ("--platform", p)]
    pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
        *targets, "-d", str(WHEELS), *map(pinned, BINARY))
    with tempfile.TemporaryDirectory() as build:  # no isolation: deepspeed's setup.py imports torch
        pip("wheel", "-q", "--no-deps", "--no-build-isolation", "--no-binary=:all:", "-w", build, *map(pinned, SDIST))
        for wheel in Path(build).glob("*.whl"):
            if not wheel.name.endswith("-none-any.whl"):
                print(f"error: {wheel.name} is not pure Python; it would not load on CPython 3.12", file=sys.stderr)
                return 1
            shutil.move(str(wheel), WHEELS / wheel.name)
    wheels = sorted(WHEELS.glob("*.whl"))
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels in {WHEELS}, {size:.1f} MiB; with the checkout's files "
          f"{size + tree_bytes() / 2**20:.1f} MiB to copy to the GPU machine (.venv/ stays here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
