"""Images without a registry: the Debian base (mmdebstrap + umoci, cached), imported into the
node's containerd under its name, runs Python and fio in a pod as a non-root user."""

from __future__ import annotations

from localcluster.node import BASE_IMAGE, Node, debian_base_image
from tests.node.pods import baseline_namespace, job_pod

FIO = (
    "python3 -c 'import sys; print(\"python\", *sys.version_info[:2])'; "
    "fio --name=w --directory=/scratch --rw=write --bs=1M --size=16M --output-format=json"
    ' | python3 -c \'import json, sys; print("written", json.load(sys.stdin)'
    '["jobs"][0]["write"]["io_bytes"])\''
)


def test_the_debian_base_runs_python_and_fio_as_non_root(node: Node) -> None:
    archive = debian_base_image()
    assert debian_base_image() == archive  # cached: the second call builds nothing
    node.import_image(archive, BASE_IMAGE.rsplit(":", 1)[0])
    assert BASE_IMAGE in node.ctr("images", "ls", "--quiet").stdout.split()
    baseline_namespace(node)
    pod = job_pod("fio", FIO, image=BASE_IMAGE)
    done, log = node.run_pod(pod, timeout=180)
    assert done["status"]["phase"] == "Succeeded", (done["status"], log)
    assert log.split() == ["python", "3", "11", "written", str(16 * 2**20)], log
