"""Run transformers' own common model tests against cramming's classes, as a contributor of an in-library model
would: `python scripts/hf_common_tests.py [pytest arguments]`.

The tests (`ModelTesterMixin` and `ConfigTester`, tests/test_modeling_common.py and friends) are not installed
with transformers and not copied into this project: the source distribution of the installed transformers version
is fetched from PyPI (`pip download --no-binary`) once, into <cache>/transformers-tests/<version>/, and pytest runs
scripts/hf_common_tester.py (our BERT-style model tester) beside its `tests` package. The distribution leaves out
three helper modules the mixins import; they are written there as what they are for these runs: mixins with no
tests of their own (generation's and the exporters', whose tests are not in the distribution either) and the
common config keywords ConfigTester sets. Exit code: pytest's (2 when the distribution cannot be fetched).
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Modules test_modeling_common / test_configuration_common import that the source distribution does not ship.
MISSING = {
    "exporters/test_export.py": "class ExportTesterMixin:  # its tests are not in the source distribution\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:  # its tests are not in the source distribution\n"
                                "    pass\n",
    "utils/test_configuration_utils.py": (
        "# Keywords every PretrainedConfig takes, each set away from its default.\n"
        "config_common_kwargs = {'return_dict': False, 'output_hidden_states': True, 'output_attentions': True,\n"
        "                        'dtype': 'float16', 'chunk_size_feed_forward': 5, 'architectures': ['BertModel'],\n"
        "                        'id2label': {0: 'label'}, 'label2id': {'label': '0'},\n"
        "                        'problem_type': 'regression'}\n"),
}


def cache_root() -> Path:
    return Path(os.environ.get("CRAMMING_CACHE", Path.home() / ".cache" / "cramming")).expanduser()


def fetch_tests(version: str, root: Path) -> Path:
    """<root>/transformers-tests/<version>/ holding the distribution's tests/ package (fetched once)."""
    folder = root / "transformers-tests" / version
    if (folder / "tests" / "test_modeling_common.py").is_file():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                               f"transformers=={version}", "-d", tmp], capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("transformers-*.tar.gz"))
        if done.returncode or not archives:
            raise RuntimeError(f"could not fetch transformers {version}'s source distribution from PyPI: "
                               f"{(done.stderr.strip().splitlines() or ['no archive'])[-1]}")
        staging = Path(tmp) / "staging"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if m.isfile() and "/tests/" in m.name]
            archive.extractall(staging, members=members, filter="data")
        tests = next(staging.glob("*/tests"))
        for name, text in MISSING.items():
            path = tests / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        for package in [tests, *(p for p in tests.rglob("*") if p.is_dir())]:
            (package / "__init__.py").touch()
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(folder / "tests", ignore_errors=True)
        shutil.move(str(tests), folder / "tests")
    return folder


def main(argv: list[str]) -> int:
    import transformers

    try:
        folder = fetch_tests(transformers.__version__, cache_root())
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    shutil.copyfile(HERE / "hf_common_tester.py", folder / "test_crammed_common.py")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(folder),
                           str(folder / "test_crammed_common.py"), *argv], cwd=folder, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
