"""The chat page's third-party files, vendored from the npm registry with pinned versions.

``frontend/vendor.json`` lists each package: its pinned ``version``, the ``integrity`` of
its tarball as the registry states it (Subresource Integrity, sha512), the ``include``
patterns of the files the page uses, and the sha256 of every vendored file. The files live
under ``frontend/static/vendor/<package>/`` at their paths inside the package, so relative
references between them (KaTeX's CSS and its fonts) keep working. Nothing is fetched at
run time and nothing is built: the quick start stays Python-only and offline.

    python frontend/vendor.py check            # the vendored files match vendor.json
    python frontend/vendor.py fetch            # download the pinned versions (again)
    python frontend/vendor.py upgrade [NAME]   # move NAME (or all) to the registry's latest

``fetch`` and ``upgrade`` verify each tarball against the registry's integrity before
unpacking anything; ``upgrade`` rewrites vendor.json. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import io
import json
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "vendor.json"
VENDOR = HERE / "static" / "vendor"
REGISTRY = "https://registry.npmjs.org"
TIMEOUT = 60


class VendorError(Exception):
    """The vendored files and vendor.json disagree, or the registry sent something else."""


def sha256_of(data: bytes) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode()


def load() -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(MANIFEST.read_text())
    return manifest


def save(manifest: dict[str, Any]) -> None:
    MANIFEST.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def check(manifest: dict[str, Any], root: Path = VENDOR) -> list[str]:
    """What differs between the files under ``root`` and the manifest (empty: all match).
    Files under ``root`` that no package lists count too: nothing unaccounted for is served."""
    problems = []
    listed = set()
    for name, package in manifest.items():
        for path, digest in package["files"].items():
            file = root / name / path
            listed.add(file)
            if not file.is_file():
                problems.append(f"{name}@{package['version']}: {path} is missing")
            elif sha256_of(file.read_bytes()) != digest:
                problems.append(f"{name}@{package['version']}: {path} does not match its sha256")
    if root.is_dir():
        for file in sorted(root.rglob("*")):
            if file.is_file() and file not in listed:
                problems.append(f"{file.relative_to(root)} is not in vendor.json")
    return problems


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        body: bytes = response.read()
        return body


def registry_info(name: str, version: str) -> dict[str, Any]:
    """The registry's document for ``name@version`` (``version`` may be a tag: latest)."""
    quoted = urllib.parse.quote(name, safe="@")
    info: dict[str, Any] = json.loads(_get(f"{REGISTRY}/{quoted}/{version}"))
    return info


def verified_tarball(url: str, integrity: str) -> bytes:
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        raise VendorError(f"unsupported integrity {integrity!r}")
    data = _get(url)
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if actual != expected:
        raise VendorError(f"{url}: the tarball does not match its integrity {integrity}")
    return data


def unpack(name: str, data: bytes, include: list[str]) -> dict[str, bytes]:
    """The package's files that ``include`` matches, by their path inside the package."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            # npm tarballs hold the package under one top directory ("package/").
            path = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if not member.isfile() or ".." in Path(path).parts:
                continue
            if any(fnmatch.fnmatchcase(path, pattern) for pattern in include):
                extracted = tar.extractfile(member)
                if extracted is not None:
                    files[path] = extracted.read()
    for pattern in include:
        if not any(fnmatch.fnmatchcase(path, pattern) for path in files):
            raise VendorError(f"{name}: nothing in the package matches {pattern!r}")
    return files


def install(name: str, package: dict[str, Any], files: dict[str, bytes]) -> None:
    target = VENDOR / name
    for old in sorted(target.rglob("*"), reverse=True) if target.is_dir() else []:
        if old.is_file():
            old.unlink()
        else:
            old.rmdir()
    for path, data in files.items():
        file = target / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)
    package["files"] = {path: sha256_of(files[path]) for path in sorted(files)}


def fetch(manifest: dict[str, Any]) -> None:
    """The pinned versions again, exactly: the same tarball, the same files."""
    for name, package in manifest.items():
        info = registry_info(name, package["version"])
        if info["dist"]["integrity"] != package["integrity"]:
            raise VendorError(f"{name}@{package['version']}: the registry's integrity changed")
        data = verified_tarball(info["dist"]["tarball"], package["integrity"])
        expected = dict(package.get("files", {}))
        install(name, package, unpack(name, data, package["include"]))
        # A package just added to vendor.json has no checksums yet: they are recorded now.
        if expected and package["files"] != expected:
            raise VendorError(f"{name}@{package['version']}: files differ from vendor.json")
        print(f"{name}@{package['version']}: {len(package['files'])} files")
    save(manifest)


def upgrade(manifest: dict[str, Any], names: list[str]) -> None:
    for name in names or list(manifest):
        package = manifest[name]
        info = registry_info(name, "latest")
        integrity = info["dist"]["integrity"]
        data = verified_tarball(info["dist"]["tarball"], integrity)
        install(name, package, unpack(name, data, package["include"]))
        old = package["version"]
        package["version"], package["integrity"] = info["version"], integrity
        print(f"{name}: {old} -> {info['version']}")
    save(manifest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="the vendored files match vendor.json")
    commands.add_parser("fetch", help="download the pinned versions again")
    upgrading = commands.add_parser("upgrade", help="move packages to the latest version")
    upgrading.add_argument("names", nargs="*", help="package names (default: all)")
    args = parser.parse_args(argv)
    manifest = load()
    try:
        if args.command == "fetch":
            fetch(manifest)
        elif args.command == "upgrade":
            upgrade(manifest, args.names)
    except VendorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    problems = check(manifest)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
