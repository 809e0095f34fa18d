#!/usr/bin/env python3
"""Images per second of a PyTorch DataLoader: tessera.torch (smart client, batched zero-copy
reads) vs boto3 against an S3 endpoint (the Tessera gateway, or MinIO).

Each "image" is one object of --size bytes; a sample is its bytes (no decoding, so the loader's
I/O path is what is measured). Both loaders use the same DataLoader settings (batch size,
workers, shuffle); boto3 fetches one object per get_object call, as a typical S3 dataset does.

    # objects once per target (--populate), then measure
    bench/python_loader.py --config tessera-data/cluster.toml --bucket bench-loader --populate
    bench/python_loader.py --config tessera-data/cluster.toml --bucket bench-loader \\
        --s3-endpoint http://127.0.0.1:9000 --s3-bucket bench-loader --populate
    bench/python_loader.py --config tessera-data/cluster.toml --bucket bench-loader \\
        --s3-endpoint http://127.0.0.1:9000 --s3-bucket bench-loader --json

S3 credentials come from --s3-access-key/--s3-secret-key or AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY (TESSERA_ACCESS_KEY / TESSERA_SECRET_KEY for the gateway). Needs the
tessera package (python/run-tests.sh builds it into .venv), torch and boto3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import tessera
import tessera.torch as tt


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "kb": 1000, "mb": 1000**2, "b": 1}
    lower = text.strip().lower()
    for suffix, factor in units.items():
        if lower.endswith(suffix):
            return int(float(lower[: -len(suffix)]) * factor)
    return int(lower)


def key_of(prefix: str, i: int) -> str:
    return f"{prefix}{i:06}.bin"


def body(i: int, size: int) -> bytes:
    seed = i.to_bytes(8, "little")
    return (seed * (size // 8 + 1))[:size]


class S3Dataset(Dataset):
    """The usual boto3 map-style dataset: one get_object per sample; one client per worker."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str, keys: list[str]):
        self.endpoint, self.access_key, self.secret_key = endpoint, access_key, secret_key
        self.bucket, self.keys = bucket, keys
        self._client = None
        self._pid = None

    def client(self):
        if self._client is None or self._pid != os.getpid():
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key, region_name="us-east-1",
                config=Config(max_pool_connections=64, retries={"max_attempts": 2}),
            )
            self._pid = os.getpid()
        return self._client

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int):
        key = self.keys[index]
        return key, self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_client"] = None
        return state


def collate(batch):
    return batch


def run_loader(dataset, args) -> dict:
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        collate_fn=collate, persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers else None)
    samples = 0
    nbytes = 0
    best = None
    runs = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        count = 0
        for batch in loader:
            for _, data in batch:
                count += 1
                nbytes += len(data)
                if args.verify and data != body(int(_.rsplit("/", 1)[1][:6]), args.size):
                    raise SystemExit(f"wrong bytes for {_}")
        elapsed = time.perf_counter() - start
        samples += count
        runs.append(count / elapsed)
        best = max(best or 0.0, count / elapsed)
    return {"images_per_s_per_epoch": [round(r, 1) for r in runs], "images_per_s_best": round(best, 1),
            "mib_per_s_best": round(best * args.size / (1 << 20), 1), "samples": samples}


def populate_tessera(client: tessera.Client, args, keys: list[str]) -> None:
    client.make_bucket(args.bucket)
    for i, key in enumerate(keys):
        client.put(args.bucket, key, body(i, args.size))


def populate_s3(dataset: S3Dataset, args) -> None:
    s3 = dataset.client()
    try:
        s3.create_bucket(Bucket=dataset.bucket)
    except Exception as e:  # already there (BucketAlreadyOwnedByYou), or a real error below
        if "BucketAlreadyOwnedByYou" not in str(e) and "BucketAlreadyExists" not in str(e):
            raise
    for i, key in enumerate(dataset.keys):
        s3.put_object(Bucket=dataset.bucket, Key=key, Body=body(i, args.size))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.environ.get("TESSERA_CONFIG"), help="cluster.toml or node HOST:PORT (default TESSERA_CONFIG)")
    p.add_argument("--bucket", default="bench-loader", help="Tessera bucket (smart client)")
    p.add_argument("--prefix", default="img/")
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--size", type=parse_size, default=100 << 10, help="bytes per object (default 100KiB)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2, help="epochs per loader; the best is reported")
    p.add_argument("--populate", action="store_true", help="write the objects first")
    p.add_argument("--verify", action="store_true", help="check every sample's bytes")
    p.add_argument("--s3-endpoint", help="S3 endpoint URL for the boto3 baseline (omit to skip it)")
    p.add_argument("--s3-bucket", default="bench-loader")
    p.add_argument("--s3-access-key", default=os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("TESSERA_ACCESS_KEY"))
    p.add_argument("--s3-secret-key", default=os.environ.get("AWS_SECRET_ACCESS_KEY") or os.environ.get("TESSERA_SECRET_KEY"))
    p.add_argument("--skip-tessera", action="store_true", help="only the boto3 baseline")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()

    keys = [key_of(args.prefix, i) for i in range(args.objects)]
    results: dict = {"objects": args.objects, "size": args.size, "batch_size": args.batch_size,
                     "workers": args.workers, "torch": torch.__version__}

    if not args.skip_tessera:
        client = tessera.connect(args.config)
        if args.populate:
            populate_tessera(client, args, keys)
        dataset = tt.MapDataset(client, args.bucket, keys=keys)
        results["tessera"] = run_loader(dataset, args)
    if args.s3_endpoint:
        if not (args.s3_access_key and args.s3_secret_key):
            p.error("the boto3 baseline needs --s3-access-key and --s3-secret-key (or AWS_* variables)")
        dataset = S3Dataset(args.s3_endpoint, args.s3_access_key, args.s3_secret_key, args.s3_bucket, keys)
        if args.populate:
            populate_s3(dataset, args)
        results["boto3"] = run_loader(dataset, args) | {"endpoint": args.s3_endpoint}
    if "tessera" in results and "boto3" in results:
        results["ratio_tessera_over_boto3"] = round(
            results["tessera"]["images_per_s_best"] / results["boto3"]["images_per_s_best"], 2)

    if args.json:
        print(json.dumps(results))
    else:
        print(f"{args.objects} objects x {args.size} B, batch {args.batch_size}, {args.workers} workers")
        for name in ("tessera", "boto3"):
            if name in results:
                r = results[name]
                print(f"  {name:8} {r['images_per_s_best']:>10.1f} images/s  {r['mib_per_s_best']:>8.1f} MiB/s  (epochs: {r['images_per_s_per_epoch']})")
        if "ratio_tessera_over_boto3" in results:
            print(f"  tessera / boto3: {results['ratio_tessera_over_boto3']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
