"""Install ladder's requirements on a machine that has PyTorch but no network.

Compute nodes and GPU boxes are often cut off from the package index. On a machine that
has ladder installed (``make setup``) and an index, ``download`` gathers a wheel of every
distribution ladder needs beyond torch, at the versions installed here (the versions the
tests ran with), built for the target's Python and platform. Copy the folder over, then
``install`` there puts in what that interpreter lacks and keeps what it has::

    .venv/bin/python scripts/offline_wheels.py download wheels/ --python-version 3.12 [--extra dev]
    # on the offline machine, in the checkout:
    python3 scripts/offline_wheels.py install wheels/ --target /tmp/ladder-site
    export PYTHONPATH=/tmp/ladder-site

``install`` needs nothing but the standard library and pip, as it runs before any of
ladder's requirements are there.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# The target keeps its own torch, and with it everything torch requires.
TARGET_PROVIDES = ("torch",)
# pip matches a manylinux tag exactly: the tags an x86-64 Linux wheel of the last years carries.
LINUX_X86_64 = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it: lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_environment(python_version: str) -> dict[str, str]:
    """The environment markers of a Linux x86-64 CPython of ``python_version`` (PEP 508)."""
    from packaging.markers import default_environment

    environment: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    environment.update(
        python_version=python_version,
        python_full_version=f"{python_version}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return environment


def requirement_closure(
    roots: list[str], *, python_version: str, stop: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Every distribution ``roots`` need on the target, each with the pin to fetch it by.

    Walks the installed distributions' ``Requires-Dist`` with markers evaluated for the
    target's Python (extras only where a requirement asks for them), never into a name in
    ``stop``. A requirement installed here is pinned to its installed version; one that is
    not (a marker true only on the target) keeps its specifier.
    """
    from packaging.requirements import Requirement

    environment = marker_environment(python_version)
    pins: dict[str, str] = {}
    pending: list[tuple[str, frozenset[str], str]] = [
        (parsed.name, frozenset(parsed.extras), parsed.name) for parsed in map(Requirement, roots)
    ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, extras, fallback = pending.pop()
        key = (canonical(name), extras)
        if key in seen or key[0] in stop:
            continue
        seen.add(key)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pins[canonical(name)] = fallback
            continue
        pins[canonical(name)] = f"{canonical(name)}=={distribution.version}"
        for line in distribution.requires or []:
            requirement = Requirement(line)
            wanted = {""} | set(extras)
            if requirement.marker is not None and not any(
                requirement.marker.evaluate({**environment, "extra": extra}) for extra in wanted
            ):
                continue
            pending.append((requirement.name, frozenset(requirement.extras), str(requirement)))
    return pins


def wheels_needed(roots: list[str], *, python_version: str, skip: list[str]) -> dict[str, str]:
    """``roots``' closure (requirements, extras allowed: ``ladder[dev]``) less what the target
    brings (torch's own closure) and ``skip``'s."""
    from packaging.requirements import Requirement

    stop = frozenset(canonical(name) for name in (*TARGET_PROVIDES, *skip))
    needed = requirement_closure(roots, python_version=python_version, stop=stop)
    provided = requirement_closure(list(TARGET_PROVIDES), python_version=python_version)
    dropped = set(provided) | {canonical(Requirement(root).name) for root in roots}
    return {name: pin for name, pin in sorted(needed.items()) if name not in dropped}


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def download(
    folder: Path, pins: dict[str, str], *, python_version: str, platforms: tuple[str, ...]
) -> list[str]:
    """Fetch each pin's wheel for the target into ``folder``; return the pins that failed.

    A binary wheel for the target's Python and platforms where the index has one; else pip
    builds one here, kept only if it is pure Python (``-none-any``), which runs anywhere.
    """
    folder.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", python_version, "--implementation", "cp"]
    target += [arg for tag in platforms for arg in ("--platform", tag)]
    failed = []
    for pin in pins.values():
        fetched = _pip("download", "--no-deps", "--only-binary=:all:", *target, "-d", str(folder), pin)
        if fetched.returncode == 0:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            built = _pip("wheel", "--no-deps", "-w", scratch, pin)
            wheels = list(Path(scratch).glob("*.whl"))
            if built.returncode == 0 and wheels and wheels[0].name.endswith("-none-any.whl"):
                wheels[0].rename(folder / wheels[0].name)
                continue
        failed.append(pin)
        print(f"{pin}: no wheel for Python {python_version} on {platforms[0]}:", file=sys.stderr)
        print((fetched.stderr or built.stderr).strip().splitlines()[-1], file=sys.stderr)
    return failed


def wheel_distribution(wheel: Path) -> tuple[str, str]:
    """A wheel file's distribution name and version, from its name (PEP 427)."""
    name, version = wheel.name.split("-")[:2]
    return canonical(name), version


def install(folder: Path, *, target: Path | None) -> int:
    """Install the wheels in ``folder`` whose distribution this interpreter lacks."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        print(
            f"install: {folder} holds no wheels; make them with `offline_wheels.py download`", file=sys.stderr
        )
        return 2
    missing = []
    for wheel in wheels:
        name, version = wheel_distribution(wheel)
        try:
            present = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(wheel)
            continue
        note = "" if present == version else f" (the folder's is {version})"
        print(f"keeping the installed {name} {present}{note}")
    if not missing:
        print("install: nothing missing")
        return 0
    where = ["--target", str(target)] if target else []
    args = ["install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", *where]
    result = subprocess.run([sys.executable, "-m", "pip", *args, *map(str, missing)])
    if result.returncode == 0:
        print(f"install: installed {len(missing)} of {len(wheels)}: " + ", ".join(w.name for w in missing))
        if target:
            print(f"install: now `export PYTHONPATH={target}` before running ladder")
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    """The command line: ``download`` where the index is, ``install`` where it is not."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("download", help="gather the wheels, on a machine with ladder and an index")
    fetch.add_argument("folder", type=Path)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    fetch.add_argument("--python-version", default=here, help=f"the target's Python, X.Y (default {here})")
    fetch.add_argument("--platform", action="append", help="a wheel platform tag (default: x86-64 manylinux)")
    fetch.add_argument(
        "--skip", action="append", default=[], help="a distribution not to fetch, e.g. wandb with logger=none"
    )
    fetch.add_argument(
        "--extra", action="append", default=[], help="one of ladder's extras too, e.g. dev (the tests' tools)"
    )
    put = commands.add_parser("install", help="install what this interpreter lacks, on the target")
    put.add_argument("folder", type=Path)
    put.add_argument("--target", type=Path, help="a folder to install into (then put it on PYTHONPATH)")
    args = parser.parse_args(argv)

    if args.command == "install":
        return install(args.folder, target=args.target)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version {args.python_version!r}: give X.Y, e.g. 3.12")
    if platform.machine() != "x86_64" and not args.platform:
        parser.error(f"this machine is {platform.machine()}: name the target's wheel tags with --platform")
    try:
        root = f"ladder[{','.join(args.extra)}]" if args.extra else "ladder"
        pins = wheels_needed([root], python_version=args.python_version, skip=args.skip)
    except metadata.PackageNotFoundError:
        parser.error("ladder is not installed in this interpreter: run `make setup`, then .venv/bin/python")
    failed = download(
        args.folder, pins, python_version=args.python_version, platforms=tuple(args.platform or LINUX_X86_64)
    )
    size = sum(wheel.stat().st_size for wheel in args.folder.glob("*.whl")) / 1e6
    print(f"download: {len(pins) - len(failed)} of {len(pins)} wheels in {args.folder} ({size:.1f} MB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
