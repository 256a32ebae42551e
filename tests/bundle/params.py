"""Real params for the bundle's components and pipelines: what the README, the sandbox and CI
pass. Shared by the tests that check, compile and run them."""

from __future__ import annotations

PLACEMENT = {
    "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["us-east-1a"],
                            }
                        ]
                    }
                ]
            }
        }
    },
}
THREE_PROFILES = ["checkpoint-baseline", "checkpoint-throughput", "checkpoint-io2"]
REAL_PARAMS: dict[str, list[dict]] = {
    "checkpoint-training": [
        {"storage_profile": "checkpoint-baseline"},
        {
            "storage_profile": "checkpoint-throughput",
            "checkpoint_dir": "/checkpoints/throughput-resumed",
            "resume": "always",
            "upload_to": "s3://acme-ml-checkpoints/run-1",
            "model_size": "16MiB",
            "steps": 20,
            "checkpoint_every": 5,
            "checkpoint_format": "raw",
            "durability": "none",
            "async_checkpoint": True,
            "device": "cpu",
            "track": False,
            "repeat": 2,
            **PLACEMENT,
        },
        {
            "storage_profile": "checkpoint-throughput",
            "nproc_per_node": 4,
            "parallel": "fsdp",
            "checkpoint_format": "dcp",
            "io_streams": 4,
            "no_overlap": True,
            "resume": "never",
        },
    ],
    "checkpoint-training-pytorchjob": [
        {"storage_profile": "checkpoint-baseline"},
        {
            "storage_profile": "checkpoint-throughput",
            "claim": "efs-checkpoints",
            "workers": 3,
            "nproc_per_node": 8,
            "parallel": "ddp",
            "checkpoint_format": "safetensors",
            "model_size": "16MiB",
            "steps": 20,
            "checkpoint_every": 5,
            "device": "cpu",
            "track": False,
            **PLACEMENT,
        },
    ],
    "storage-profile": [
        {"target_class": "checkpoint-throughput"},
        {
            "target_class": "checkpoint-baseline",
            "settle": "kubernetes",
            "on_infeasible": "rollback",
            "timeout": 7200,
            "dry_run": True,
            "force": True,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "holder": "0123456789abcdef0123456789abcdef",
        },
    ],
    "storage-profile-plan": [
        {"profiles": ["checkpoint-baseline", "checkpoint-throughput"]},
        {
            "profiles": THREE_PROFILES,
            "return_to_first": True,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "claim": "training-checkpoints",
            "namespace": "sandbox",
        },
    ],
    "storage-profile-release": [
        {"holder": "0123456789abcdef0123456789abcdef"},
        {
            "holder": "0123456789abcdef0123456789abcdef",
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "namespace": "sandbox",
        },
    ],
    "storage-profile-renew": [
        {},
        {
            "holder": "0123456789abcdef0123456789abcdef",
            "lease_duration": 7200,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "namespace": "sandbox",
        },
    ],
    "fio-sweep": [
        {},
        {
            "size_scale": 0.01,
            "runtime": 5,
            "target": "/checkpoints/fio-smoke",
            "reference_dir": "/tmp/fio-reference",
            "spec": "checkpoint-matrix",
            "storage_profile": "checkpoint-throughput",
            "track": False,
            **PLACEMENT,
        },
    ],
    "data-workload": [
        {"storage_profile": "checkpoint-baseline"},
        {
            "storage_profile": "checkpoint-throughput",
            "workload": "materialize",
            "data_dir": "/checkpoints/datasets/imagenet-like",
            "dataset_format": "files",
            "dataset_size": "1GiB",
            "generate": False,
            "track": False,
            "repeat": 1,
            **PLACEMENT,
        },
        {"storage_profile": "checkpoint-baseline", "workload": "workspace", "files": 50},
        {"storage_profile": "checkpoint-baseline", "num_workers": 8, "compute_ms": 25.5},
    ],
    "checkpoint-compare": [
        {"pipeline": "0" * 32},
        {
            "runs": ["1" * 32, "2" * 32, "3" * 32],
            "profiles": THREE_PROFILES,
            "api_host": "http://127.0.0.1:8000",
            "project": "acme/checkpoint-storage",
            "pricing": "connections/pricing.yaml",
            "gpu_hourly": 4.5,
            "html": "/tmp/verdict.html",
            "json": "/tmp/verdict.json",
            "train_profiles": THREE_PROFILES,
            "runtime_s": [100.0, 90.5, 88.0],
            "ckpt_pause_s_median": [2.0, 1.1, 0.9],
            "ckpt_write_gbps_median": [0.12, 0.24, 0.5],
            "final_loss": [3.1, 3.1, 3.1],
            "fio_profiles": THREE_PROFILES,
            "fio_seqwrite_1m_bw_mbps": [125.0, 250.0, 1000.0],
            "max_pause_s": 2.0,
            "max_pause_share": 0.05,
            "checkpoints_per_month": 3000,
            "warmup": 1,
            "practical_floor_s": 0.1,
            "allow_resumed": True,
        },
    ],
    "checkpoint-stage": [
        {"profile": "checkpoint-baseline"},
        {
            "profile": "checkpoint-io2",
            "stage": 2,
            "repeats": 3,
            "holder": "0123456789abcdef0123456789abcdef",
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "upload_to": "s3://acme-ml-checkpoints/comparison",
            **PLACEMENT,
        },
    ],
    "checkpoint-storage-profiles": [
        {},
        {
            "profiles": THREE_PROFILES,
            "repeats": 2,
            "return_to_first": True,
            "upload_to": "s3://acme-ml-checkpoints/comparison",
            "nproc_per_node": 8,
            "parallel": "fsdp",
            "max_pause_s": 2.0,
            "max_pause_share": 0.05,
            "checkpoints_per_month": 3000,
            **PLACEMENT,
        },
    ],
}
SMALL_PIPELINE = {
    "backend": "local",
    "profiles_file": "connections/sandbox-profiles.yaml",
    "model_size": "4MiB",
    "steps": 6,
    "checkpoint_every": 2,
    "size_scale": 0.001,
    "fio_runtime": 2,
    "restore_after": True,
    "api_host": "http://127.0.0.1:8000",
}
"""The sandbox's demo of the two-profile pipeline."""
SMALL_THREE = {
    **SMALL_PIPELINE,
    "profiles": ["checkpoint-baseline", "checkpoint-throughput", "checkpoint-throttled"],
    "repeats": 2,
    "return_to_first": True,
    "upload_to": "file:///tmp/checkpoint-uploads",
    "max_pause_s": 1.0,
    "checkpoints_per_month": 720,
}
"""The three-profile pipeline, small, with repeats and the return to the first profile."""
KIND_OF_COMPONENT = {
    "checkpoint-training": ("train", {"storage_profile": "checkpoint-baseline"}),
    "storage-profile": ("switch", {"target_class": "checkpoint-throughput"}),
    "storage-profile-plan": ("hook", {"profiles": ["checkpoint-baseline"]}),
    "storage-profile-release": ("hook", {"holder": "0" * 32}),
    "storage-profile-renew": ("hook", {}),
    "fio-sweep": ("fio", {}),
    "data-workload": ("data", {"storage_profile": "checkpoint-baseline"}),
    "checkpoint-compare": ("compare", {"pipeline": "0" * 32}),
    "checkpoint-training-pytorchjob": ("pytorchjob", {"storage_profile": "checkpoint-baseline"}),
}
"""Each component → what its job is, and the least params it compiles with."""
