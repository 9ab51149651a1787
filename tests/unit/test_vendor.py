"""frontend/vendor.py: the vendored files match their pinned checksums, and the unpacking
of a registry tarball takes only what vendor.json includes."""

from __future__ import annotations

import base64
import hashlib
import http.server
import importlib.util
import io
import shutil
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vendor", ROOT / "frontend" / "vendor.py")
assert spec is not None and spec.loader is not None
vendor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vendor)


def test_every_vendored_file_matches_vendor_json():
    manifest = vendor.load()
    assert vendor.check(manifest) == []
    for name, package in manifest.items():
        assert package["version"][0].isdigit(), (name, package["version"])
        assert package["integrity"].startswith("sha512-"), name
        assert any(path.startswith("LICENSE") for path in package["files"]), name


def test_a_changed_missing_or_unlisted_file_is_reported(tmp_path):
    manifest = vendor.load()
    root = tmp_path / "vendor"
    shutil.copytree(vendor.VENDOR, root)
    changed = root / "marked" / "lib" / "marked.esm.js"
    changed.write_bytes(changed.read_bytes() + b"\n")
    (root / "dompurify" / "LICENSE").unlink()
    (root / "stray.js").write_text("alert(1)")
    assert vendor.check(manifest, root) == [
        f"marked@{manifest['marked']['version']}: lib/marked.esm.js does not match its sha256",
        f"dompurify@{manifest['dompurify']['version']}: LICENSE is missing",
        "stray.js is not in vendor.json",
    ]


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_unpack_takes_the_included_files_only_and_never_leaves_the_package():
    data = tarball(
        {
            "package/dist/lib.js": b"lib",
            "package/dist/lib.js.map": b"map",
            "package/LICENSE": b"MIT",
            "package/../../escape.js": b"no",
        }
    )
    files = vendor.unpack("lib", data, ["dist/*.js", "LICENSE"])
    assert files == {"dist/lib.js": b"lib", "LICENSE": b"MIT"}
    with pytest.raises(vendor.VendorError, match="nothing in the package matches 'fonts/"):
        vendor.unpack("lib", data, ["fonts/*.woff2"])


@pytest.fixture
def served() -> Iterator[Callable[[bytes], str]]:
    """``served(data)``: a URL on 127.0.0.1 that answers ``data``."""
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(bodies[-1])))
            self.end_headers()
            self.wfile.write(bodies[-1])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def serve(data: bytes) -> str:
        bodies.append(data)
        return f"http://127.0.0.1:{server.server_port}/package.tgz"

    yield serve
    server.shutdown()
    server.server_close()


def test_a_tarball_is_used_only_when_it_matches_its_integrity(served):
    data = tarball({"package/LICENSE": b"MIT"})
    url = served(data)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    assert vendor.verified_tarball(url, integrity) == data
    with pytest.raises(vendor.VendorError, match="does not match its integrity"):
        vendor.verified_tarball(served(data + b"tampered"), integrity)
    with pytest.raises(vendor.VendorError, match="unsupported integrity"):
        vendor.verified_tarball(url, "sha1-abc")
