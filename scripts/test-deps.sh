#!/usr/bin/env bash
# Installs what the test suite needs and the machine lacks (docs/testing.md):
# Debian packages, PyPI and npm packages, tansu, the apalis workloads. Idempotent:
# each part is skipped when it is already there. The parts run side by side, in
# three lanes (apt then npm then the Python venv; pip; cargo builds), each with its
# time and, on failure, its log. A second run waits for one already running (a
# lock), so `.ci/run` can start it early in the background and `scripts/test.sh`
# still call it.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p target
exec 9>target/.test-deps.lock
flock 9

LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
export DEBIAN_FRONTEND=noninteractive

# Debian packages, in one apt-get call; then what needs them (node, python3-venv).
lane_system() {
  local missing=()
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
  # Headless Chromium for the page tests (tests/pages.rs).
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  # The listener's test certificates (tests/listener.rs).
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    missing+=(nodejs npm)
  fi
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing ${missing[*]} (Debian packages)..."
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi

  # The npm packages of tests/libraries.rs and tests/preset_pgboss.rs: real
  # pg-transactional-outbox, graphile-worker and pg-boss writing their own tables, at
  # the exact versions of tests/libraries/package-lock.json (again when it changes).
  if [ ! -d tests/libraries/node_modules ] \
    || [ tests/libraries/package-lock.json -nt tests/libraries/node_modules/.package-lock.json ]; then
    echo "Installing the npm packages of tests/libraries (npm ci)..."
    npm ci --prefix tests/libraries --no-audit --no-fund
  fi

  # procrastinate and pgqueuer (PyPI) for tests/preset_python.rs, rstream for
  # tests/rabbitmq.rs: a venv at the exact versions of
  # tests/libraries/python/requirements.txt (again when that file changes).
  local req=tests/libraries/python/requirements.txt venv=tests/libraries/python/.venv
  if ! cmp -s "$req" "$venv/requirements.installed"; then
    echo "Installing the Python packages of tests/libraries/python (pip, into $venv)..."
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$venv/requirements.installed"
  fi
}

# kubernetes-validate (PyPI; bundles its schemas, works offline) for the manifest tests.
lane_pip() {
  if ! command -v kubernetes-validate >/dev/null 2>&1 && ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
    echo "Installing kubernetes-validate (PyPI)..."
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore 'kubernetes-validate==1.37.0'
  fi
}

# Rust programs the tests run: tansu (a Kafka-protocol broker, about 8 minutes the
# first time) and the apalis workloads of tests/preset_apalis.rs.
lane_cargo() {
  local tansu="${TANSU:-$HOME/.cargo/bin/tansu}"
  if [ ! -x "$tansu" ]; then
    echo "Installing tansu 0.6.0 (cargo install, once)..."
    cargo install tansu --version 0.6.0 --locked --features dynostore
  fi
  # apalis-postgres and apalis-mysql from crates.io at the versions of their own
  # Cargo.lock files (two projects: the crates need two semver-compatible versions of
  # apalis-core), built into one target directory of their own. Cargo rebuilds only
  # what changed: about 2 minutes on 2 cores the first time, under a second after.
  for crate in postgres mysql; do
    cargo build --quiet --locked --manifest-path "tests/libraries/apalis/$crate/Cargo.toml" \
      --target-dir tests/libraries/apalis/target
  done
}

started=$(date +%s)
pids=()
for lane in system pip cargo; do
  ( t0=$(date +%s); "lane_$lane"; echo "lane $lane: $(( $(date +%s) - t0 )) s" ) >"$LOGS/$lane.log" 2>&1 &
  pids+=("$!")
done
failed=0
i=0
for lane in system pip cargo; do
  if wait "${pids[$i]}"; then
    grep -v '^lane ' "$LOGS/$lane.log" || true
  else
    echo "error: installing the test dependencies ($lane) failed:" >&2
    cat "$LOGS/$lane.log" >&2
    failed=1
  fi
  i=$((i + 1))
done
[ $failed = 0 ] || exit 1
echo "test dependencies ready ($(( $(date +%s) - started )) s: $(cat "$LOGS"/*.log | grep '^lane ' | tr '\n' ' '))"
