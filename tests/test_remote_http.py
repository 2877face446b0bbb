"""Remote files over https:// and http:// (mmdp.data.files, through fsspec's HTTPFileSystem),
offline: a threaded file server on 127.0.0.1 that answers ranged requests as a store or a CDN
does (https: with a certificate made here, trusted through fsspec's configuration, as a
private CA would be). A JSON Lines file and the files it names beside it read as the same
files on disk: the rows, each image's size from its first bytes (a ranged read), its pixels,
a video's header; and the file, changed on the server, is read again."""

import datetime
import functools
import http.server
import io
import ipaddress
import json
import os
import re
import ssl
import threading
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pytest
from PIL import Image

from mmdp.data import files
from mmdp.data.images import decode_image, image_size, remote_image_size
from mmdp.data.reading.sources import load_vqa_dataset
from mmdp.data.videos import remote_video_metadata, video_metadata


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Python's file server, answering a Range request with the bytes asked for (206), and
    counting the bytes each file's answers carry (`served`, set on the server)."""

    def log_message(self, *args) -> None:
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if asked is None or not os.path.isfile(path):
            answer = super().send_head()
            if answer is not None and self.command == "GET":
                self.server.served[self.path] += os.path.getsize(path)
            return answer
        data = Path(path).read_bytes()
        start = int(asked[1])
        end = min(int(asked[2]) + 1 if asked[2] else len(data), len(data))
        if start >= len(data):
            self.send_error(416)
            return None
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self.server.served[self.path] += end - start
        self.server.ranged[self.path] += 1
        return io.BytesIO(data[start:end])


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return folder / "cert.pem", folder / "key.pem"


def photo(width: int = 400, height: int = 300) -> bytes:
    """A JPEG of grain: about 60 KB, several times the first read (files.HEADER_BYTES)."""
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.fixture(scope="module", params=["https", "http"])
def served(request, tmp_path_factory):
    """(the server's URL, its folder, the server): a JSON Lines file, two images and a clip
    beside it, served from a folder of their own over `scheme`."""
    from mmdp.data.synthetic.videos import generate_video_row

    scheme = request.param
    root = tmp_path_factory.mktemp(f"served_{scheme}")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(root / "red.png")
    (root / "photos").mkdir()
    (root / "photos" / "grain.jpg").write_bytes(photo())
    (root / "clips").mkdir()
    (root / "clips" / "moving.mp4").write_bytes(generate_video_row(0)["videos"][0]["bytes"])
    rows = [
        {
            "messages": [
                {"role": "user", "content": "<image> and <image>: which is red?"},
                {"role": "assistant", "content": "The first."},
            ],
            "images": ["red.png", "photos/grain.jpg"],
        },
        {
            "messages": [
                {"role": "user", "content": "<video> Where does it go?"},
                {"role": "assistant", "content": "Left."},
            ],
            "videos": ["clips/moving.mp4"],
        },
    ]
    (root / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(root))
    )
    server.daemon_threads = True
    server.served, server.ranged = Counter(), Counter()
    with pytest.MonkeyPatch.context() as patch:
        if scheme == "https":
            cert, key = certificate(tmp_path_factory.mktemp("tls"))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            # the client trusts the certificate: fsspec hands `ssl` to each aiohttp request
            trusted = ssl.create_default_context(cafile=str(cert))
            patch.setitem(fsspec.config.conf, "https", {"ssl": trusted})
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}", root, server
        server.shutdown()
        server.server_close()


def test_rows_and_their_files_over_http_read_as_the_same_files_on_disk(served):
    url, root, server = served
    rows = load_vqa_dataset(f"{url}/train.jsonl")
    here = load_vqa_dataset(str(root / "train.jsonl"))
    assert [i["path"] for i in rows[0]["images"]] == [f"{url}/red.png", f"{url}/photos/grain.jpg"]
    assert [t["user"] for r in rows for t in r["texts"]] == [
        t["user"] for r in here for t in r["texts"]
    ]
    # each image's size from its first bytes, in one ranged request
    remote_image_size.cache_clear()
    server.served.clear()
    sizes = files.in_flight(image_size, rows[0]["images"])
    assert sizes == [image_size(image) for image in here[0]["images"]] == [(64, 48), (400, 300)]
    grain = (root / "photos" / "grain.jpg").stat().st_size
    assert server.ranged["/photos/grain.jpg"] == 1
    assert server.served["/photos/grain.jpg"] == files.HEADER_BYTES < grain
    # building a sample decodes the whole file: the same pixels
    (remote, _), (local, _) = decode_image(rows[0]["images"][1]), decode_image(here[0]["images"][1])
    assert np.array_equal(np.asarray(remote), np.asarray(local))
    # a video's header, read a block at a time as PyAV asks
    remote_video_metadata.cache_clear()
    clip, local_clip = video_metadata(rows[1]["videos"][0]), video_metadata(here[1]["videos"][0])
    assert (clip.total_num_frames, clip.fps, clip.width, clip.height) == (
        local_clip.total_num_frames,
        local_clip.fps,
        local_clip.width,
        local_clip.height,
    )
    assert server.ranged["/clips/moving.mp4"] >= 1


def test_a_file_changed_on_the_server_is_read_again(served):
    """The rows' cache is keyed by the file's Last-Modified (an http server sends no ETag)."""
    url, root, _ = served
    data = root / "train.jsonl"
    assert load_vqa_dataset(f"{url}/train.jsonl")[0]["texts"][0]["assistant"] == "The first."
    text = data.read_text()
    data.write_text(text.replace("The first.", "The other"))  # as many bytes
    later = data.stat().st_mtime + 5
    os.utime(data, (later, later))
    try:
        assert load_vqa_dataset(f"{url}/train.jsonl")[0]["texts"][0]["assistant"] == "The other"
    finally:
        data.write_text(text)
