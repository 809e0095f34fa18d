#!/usr/bin/env bash
# End-to-end suite: aws-cli, boto3, s3fs, pyarrow and DuckDB against a real cluster and gateway.
# Expects target/release/tessera (make build). Installs e2e/requirements.txt into .venv (pip's
# cache serves repeat runs), then runs pytest. Extra arguments go to pytest (e.g. -k multipart).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# About 1 s when everything is installed; pip's cache serves wheels to a new venv.
.venv/bin/python -m pip install -q --disable-pip-version-check -r e2e/requirements.txt

export PATH="$repo/.venv/bin:$PATH"
status=0
.venv/bin/python -m pytest e2e -q "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "e2e: pytest collected no tests" >&2
fi
exit "$status"
