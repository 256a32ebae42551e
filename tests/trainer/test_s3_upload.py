"""The upload stage over the real S3 wire protocol: s3fs (the image's `upload` extra)
against moto's S3 server on 127.0.0.1, driven through the trainer's CLI as the component
runs it. The endpoint comes from the standard ``AWS_ENDPOINT_URL_S3`` variable, as it would
for an S3-compatible store on a cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.trainer.helpers import run_trainer
from trainer.ckpt import store
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer

pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

TINY = [
    "--steps", "4", "--checkpoint-every", "2", "--model-size", "256KiB", "--batch-size", "2",
    "--seq-len", "16", "--device", "cpu", "--no-track",
]  # fmt: skip
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3(monkeypatch) -> Iterator[tuple[dict[str, str], object]]:
    """A moto S3 server on loopback with one bucket; yields the env and a boto3 client."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}", "NO_PROXY": host}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket="checkpoints")
        yield env, client
    finally:
        server.stop()


def test_upload_to_s3_is_timed_in_the_timeline(tmp_path, s3):
    env, client = s3
    ckpt, summary_path = tmp_path / "ckpt", tmp_path / "summary.json"
    proc = run_trainer(
        "--checkpoint-dir", str(ckpt), *TINY, "--keep", "5",
        "--upload-to", "s3://checkpoints/team/run-1", "--summary-json", str(summary_path),
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(summary_path.read_text())
    for record in summary["checkpoints"]:
        assert record["upload_s"] > 0 and record["upload_gbps"] > 0
        assert record["total_s"] >= record["upload_s"]
    assert summary["stages"]["upload_s"]["median"] > 0
    assert "upload step-00000004:" in proc.stdout  # the bytes done

    keys = {
        obj["Key"]
        for obj in client.list_objects_v2(Bucket="checkpoints", Prefix="team/run-1/")["Contents"]
    }
    assert keys == {
        f"team/run-1/step-{s:08d}/{name}" for s in (2, 4) for name in ("state.ckpt", store.MANIFEST)
    }
    remote = client.get_object(Bucket="checkpoints", Key="team/run-1/step-00000004/state.ckpt")
    assert remote["Body"].read() == (ckpt / "step-00000004" / "state.ckpt").read_bytes()


def test_a_bucket_error_is_exit_5_and_keeps_the_local_checkpoint(tmp_path, s3):
    env, client = s3
    ckpt = tmp_path / "ckpt"
    proc = run_trainer(
        "--checkpoint-dir", str(ckpt), *TINY, "--upload-to", "s3://no-such-bucket/run-1", env=env
    )
    assert proc.returncode == 5, proc.stderr
    assert "trainer: error: upload of step-00000002" in proc.stderr
    assert "no-such-bucket" in proc.stderr
    # Not retried, and no bucket was created on the way.
    assert proc.stderr.count("try 1 failed") == 0
    assert "no-such-bucket" not in {b["Name"] for b in client.list_buckets()["Buckets"]}
    (ref,) = store.list_checkpoints(ckpt)
    assert ref.step == 2
    store.read_verified(LocalFS(), ref.path, AlignedBuffer())
