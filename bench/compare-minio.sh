#!/usr/bin/env bash
# Tessera vs MinIO on this machine (see bench/compare_minio.py). Quick mode by default (~2-3 min
# after the one-time MinIO build); --full for longer runs. Results: bench/results/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="python3"
if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; fi
"$python" -c 'import matplotlib' 2>/dev/null || "$python" -m pip install -q matplotlib || true
exec "$python" "$root/bench/compare_minio.py" "$@"
