#!/usr/bin/env bash
# Type-check the Python client and the SGLang adapter (clients/python/ferry) with Debian's mypy
# (python3-mypy): the package is typed (py.typed), so what an engine's own type checker sees is
# checked here too. Exits non-zero naming each finding.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/clients/python"
/usr/bin/python3 -m mypy --python-version 3.10 --warn-unused-ignores --warn-redundant-casts \
  --no-error-summary -p ferry
echo "check-types: clients/python/ferry is clean"
