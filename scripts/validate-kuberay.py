"""Validate deploy/kuberay/raycluster.yaml against KubeRay's RayCluster CRD, offline.

    python scripts/validate-kuberay.py PATH/TO/ray.io_rayclusters.yaml

The CRD comes from KubeRay's repository (ray-operator/config/crd/bases/); its
openAPIV3Schema for the manifest's apiVersion is checked with jsonschema (Kubernetes'
x-kubernetes-* extensions are not JSON Schema and are not checked).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jsonschema
import yaml

MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "kuberay" / "raycluster.yaml"


def main(crd_path: str) -> int:
    crd = yaml.safe_load(Path(crd_path).read_text())
    manifest = yaml.safe_load(MANIFEST.read_text())
    group, version = manifest["apiVersion"].split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == manifest["kind"]
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = served["schema"]["openAPIV3Schema"]
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(manifest), key=str)
    for error in errors:
        print(f"{'/'.join(map(str, error.absolute_path))}: {error.message}")
    print(
        f"{MANIFEST.name}: {'valid' if not errors else f'{len(errors)} errors'} "
        f"against {Path(crd_path).name} ({group}/{version})"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
