"""The SDK installs from its path under its own distribution name, and no install line in the
repository names the PyPI package `kennel`, which is someone else's."""

import re
import shutil
import subprocess
import sys

from conftest import REPO, SDK_DIR

DISTRIBUTION = "kennel-sdk"


def _plain(requirement: str) -> str:
    """A requirement as setuptools of any version writes it, without its spaces, brackets and
    quotes: `a (==1) ; extra == 'x'` and `a==1; extra == "x"` are both `a==1;extra==x`."""
    return re.sub(r"[\s()'\"]", "", requirement)


def test_the_sdk_installs_from_its_path_as_kennel_sdk(tmp_path):
    # A copy, so that the build leaves nothing in the repository.
    src = tmp_path / "src"
    shutil.copytree(SDK_DIR, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info",
                                                                 "build"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--disable-pip-version-check", "--root-user-action=ignore",
                    "--target",
                    str(target), str(src)], check=True)
    infos = list(target.glob("*.dist-info"))
    assert [i.name for i in infos] == ["kennel_sdk-0.1.0.dist-info"], infos
    metadata = (infos[0] / "METADATA").read_text()
    assert f"Name: {DISTRIBUTION}\n" in metadata
    extras = set(re.findall(r"^Provides-Extra: (.+)$", metadata, re.M))
    pinned = {f.stem for f in (SDK_DIR / "requirements").glob("*.txt")}
    assert extras == pinned | {"test"}, "an extra per requirements/EXTRA.txt, spelled as it"
    for extra in pinned:
        wanted = [line for line in (SDK_DIR / "requirements" / f"{extra}.txt").read_text().split()
                  if not line.startswith("#")]
        got = [_plain(r) for r in re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)]
        assert sorted(r for r in got if r.endswith(f";extra=={extra}")) == sorted(
            f"{r};extra=={extra}" for r in wanted
        ), f"pyproject.toml's {extra} is not requirements/{extra}.txt"
    assert (target / "kennel" / "__init__.py").is_file(), "the import name is kennel"


def test_no_install_line_names_the_strangers_package():
    wrong = re.compile(r"pip install ['\"]?kennel(\[|['\"\s]|$)", re.M)
    files = [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("sdk/*/README.md"),
             *REPO.glob("sdk/python/**/*.py"), *REPO.glob("sdk/python/**/*.md"),
             SDK_DIR / "pyproject.toml"]
    found = [f"{f.relative_to(REPO)}: {m.group(0)}" for f in files
             for m in wrong.finditer(f.read_text())]
    assert found == [], f"install lines that fetch PyPI's `kennel`, not this SDK: {found}"
